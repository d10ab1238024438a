"""An example tensortune plugin (used by tests/test_custom_ops.py): the op
`example.ops:SoftCap` (y = cap * tanh(x / cap), the logit soft-capping of Gemma-2)
with its shape function, NumPy reference and fusion kind, and a template of its own.

Load it with `tune --plugin tests/softcap_plugin.py`, `tune-run --plugin ...` or
`runtime.load(model, plugins=["tests/softcap_plugin.py"])`.
"""
from __future__ import annotations

import numpy as np

from ir.custom import register_op, same_shape
from ir.workload import Workload
from schedules import Config, ConfigSpace, Knob, Lowered, Template, register_template
from schedules.launch import Call, In, Launch, Out, Scalar
from schedules.loopnest import UNROLLED, Assign, For, Function, LoopModule, Param, thread_share

DOMAIN = "example.ops"


def softcap_ref(node, xs):
    cap = np.float32(node.attrs.get("cap", 30.0))
    return [(cap * np.tanh(xs[0] / cap)).astype(xs[0].dtype)]


# opaque: no built-in template covers it, so only the template below can compile it
register_op("SoftCap", kind="opaque", infer=same_shape, ref=softcap_ref, domain=DOMAIN, flops_per_elem=10)


class SoftCapTemplate(Template):
    """One flat loop, `unroll` elements per iteration (code-shape knob); blocks of `B`
    elements per work item and threading are run-time knobs. Copy t of T (its last two
    parameters) runs its contiguous share of the blocks: the backend runs T copies of it."""

    name = "softcap"
    version = 1

    def matches(self, wl: Workload) -> bool:
        return len(wl.ops) == 1 and wl.ops[0]["op"] == "SoftCap" and wl.inputs[0]["dtype"] == "float32"

    def space(self, wl: Workload) -> ConfigSpace:
        return ConfigSpace([Knob("unroll", (1, 4)), Knob("parallel", (True, False), code_shape=False),
                            Knob("B", (256, 4096), code_shape=False)])

    def default_config(self, wl: Workload) -> Config:
        return self.space(wl).validate({"unroll": 4, "parallel": False, "B": 4096})

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        cap = float(wl.ops[0]["attrs"].get("cap", 30.0))
        u = cfg["unroll"]

        def elem(i: str):
            return Assign(f"y[{i}]", f"np.float32({cap!r}) * math.tanh(x[{i}] * np.float32({1 / cap!r}))")

        body = (thread_share("blk", "(n + B - 1) // B", body=(
            Assign("lo", "blk * B"), Assign("hi", "min(n, lo + B)"),
            For("i0", "lo", f"lo + ((hi - lo) // {u}) * {u}", step=str(u), body=(
                For("r", "0", str(u), (elem("i0 + r"),), UNROLLED),)),
            For("i", f"lo + ((hi - lo) // {u}) * {u}", "hi", (elem("i"),)),
        )),)
        params = (Param("x", "float32[::1]"), Param("y", "float32[::1]"), Param("n", "int64"), Param("B", "int64"),
                  Param("t", "int64"), Param("T", "int64"))
        module = LoopModule((Function("softcap", params, body),), doc=f"softcap cap={cap} unroll={u}",
                            meta={"template": f"softcap v{self.version}"})
        n = int(np.prod(wl.output_shape))
        # the launch, as data: one call of `softcap` over ceil(n / B) blocks (work items)
        call = Call("softcap", (In(0, (n,), "float32"), Out((n,)), Scalar(n), Scalar(cfg["B"])),
                    items=-(-n // cfg["B"]), parallel=cfg["parallel"])
        return Lowered(module, Launch((call,)))


register_template(SoftCapTemplate())

"""MaxPool / AveragePool on the GPU, NCHW 2-D: the workloads of the CPU `pool` template (its
`matches`, window geometry and average divisors are imported). GlobalAverage/MaxPool are
reductions there, and so here (the reduce templates).

One thread computes `opt` outputs of one output row, at ow = j + r*Q (Q threads per row):
neighbouring threads read and write neighbouring pixels (coalesced). Window taps outside the
image are skipped by bounds checks (max starts at -inf; an average multiplies by the
per-pixel 1/count table the CPU template builds, which knows count_include_pad and
ceil_mode). Kernel size, strides and dilations are code constants, sizes run-time.
Knobs: threads per block, outputs per thread, whether the window loops are written out.
"""
from __future__ import annotations

import numpy as np

from ir.workload import Workload
from schedules import gpu
from schedules.launch import Call, In, Launch, Out, Scalar, Table
from schedules.loopnest import UNROLLED, Assign, For, Function, If, LoopModule, Param
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.templates.pool import PoolTemplate, _geo, _inverse_counts
from schedules.template import Lowered, Template

_CPU = PoolTemplate()


def _problem(wl: Workload) -> dict:
    node, (SH, SW), (DH, DW), pads, (OH, OW), _ = _geo(wl)
    N, C, H, W = (int(d) for d in wl.inputs[0]["shape"])
    KH, KW = node.attrs["kernel_shape"]
    return {"node": node, "max": node.op == "MaxPool", "P": N * C, "H": H, "W": W, "OH": OH, "OW": OW,
            "KH": KH, "KW": KW, "SH": SH, "SW": SW, "DH": DH, "DW": DW, "PT": pads[0], "PL": pads[1]}


class CudaPoolTemplate(Template):
    name = "cuda_pool"
    kind = "cuda"
    version = 1

    def matches(self, wl: Workload) -> bool:
        return _CPU.matches(wl)

    def space(self, wl: Workload) -> ConfigSpace:
        return ConfigSpace([Knob("threads", (64, 128, 256, 512)), Knob("opt", (1, 2, 4)), Knob("unroll", (True, False))],
                           constraint=gpu.constraint(self, wl))

    def default_config(self, wl: Workload) -> Config:
        return self.space(wl).validate({"threads": 256, "opt": 1, "unroll": True})

    def resources(self, wl: Workload, cfg) -> gpu.Resources:
        p = _problem(wl)
        rows = p["P"] * p["OH"] * -(-p["OW"] // cfg["opt"])
        outs = p["P"] * p["OH"] * p["OW"]
        return gpu.Resources(cfg["threads"], gpu.blocks_for(rows, cfg["threads"]), 0, 20 + 2 * cfg["opt"],
                             4 * (p["P"] * p["H"] * p["W"] + outs), outs * p["KH"] * p["KW"])

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        p = _problem(wl)
        threads, opt = cfg["threads"], cfg["opt"]
        fn = _pool(p, threads, opt, cfg["unroll"])
        module = LoopModule((fn,), doc=f"cuda pool: {p['node'].op} {p['KH']}x{p['KW']} stride {p['SH']}x{p['SW']} "
                            f"threads={threads} opt={opt} unroll={cfg['unroll']}",
                            meta={"template": f"{self.name} v{self.version}"})
        inv = np.ones((1, 1), np.float32) if p["max"] else _inverse_counts(p["node"], (p["H"], p["W"]),
                                                                            (p["KH"], p["KW"]))
        rows = p["P"] * p["OH"] * -(-p["OW"] // opt)
        step = Call("pool", (In(0, (p["P"], p["H"], p["W"]), "float32"), Table("inv"), Out((p["P"], p["OH"], p["OW"])),
                             *(Scalar(p[k]) for k in ("P", "H", "W", "OH", "OW", "PT", "PL"))),
                    grid=(gpu.blocks_for(rows, threads),), block=(threads,))
        return Lowered(module, Launch((step,), tables={"inv": inv}))


def _pool(p: dict, threads: int, opt: int, unroll: bool) -> Function:
    kind = UNROLLED if unroll else "serial"
    is_max = p["max"]
    init = "np.float32(-np.inf)" if is_max else "np.float32(0.0)"

    def tap(r: int) -> tuple:
        acc = (Assign(f"a{r}", f"max(a{r}, x[pl, ih, iw])") if is_max else Assign(f"a{r}", "x[pl, ih, iw]", "+"))
        return (Assign("iw", f"(j + {r} * Q) * {p['SW']} - PL + kw * {p['DW']}"),
                If("iw >= 0 and iw < W", (acc,)))
    window = For("kh", "0", str(p["KH"]), (
        Assign("ih", f"oh * {p['SH']} - PT + kh * {p['DH']}"),
        If("ih >= 0 and ih < H", (For("kw", "0", str(p["KW"]), tuple(s for r in range(opt) for s in tap(r)), kind),)),
    ), kind)
    store = tuple(s for r in range(opt) for s in (
        Assign("ow", f"j + {r} * Q"),
        If("ow < OW", (Assign("out[pl, oh, ow]", f"a{r}" if is_max else f"a{r} * inv[oh, ow]"),))))
    body = (
        Assign("gid", f"int64(cuda.blockIdx.x) * {threads} + cuda.threadIdx.x"),
        Assign("Q", f"(OW + {opt - 1}) // {opt}"),
        If("gid < P * OH * Q", (
            Assign("j", "gid % Q"), Assign("rest", "gid // Q"), Assign("oh", "rest % OH"), Assign("pl", "rest // OH"),
            *(Assign(f"a{r}", init) for r in range(opt)),
            window,
            *store,
        )),
    )
    params = (Param("x", "float32[:, :, ::1]"), Param("inv", "float32[:, ::1]"), Param("out", "float32[:, :, ::1]")) + \
        tuple(Param(n, "int64") for n in ("P", "H", "W", "OH", "OW", "PT", "PL"))
    return Function("pool", params, body)


register_template(CudaPoolTemplate())

"""Workloads built directly (no ONNX) for the template tests, and a checker vs the NumPy reference."""
from __future__ import annotations

import numpy as np

from codegen import compile_kernel
from ir.workload import Workload, stored_by_value


def make_wl(ops, inputs, arrays=None, sym=None) -> Workload:
    """ops: [(op, [refs], attrs)]; inputs: [(shape, dtype, const)]. The output shape comes from
    running the reference on `arrays` (or random float inputs)."""
    ins = [{"shape": list(s), "sym": list(sym[k]) if sym and sym[k] else list(s), "dtype": d, "const": c}
           for k, (s, d, c) in enumerate(inputs)]
    for k, (spec, a) in enumerate(zip(ins, arrays if arrays is not None else [])):   # as make_workload stores them
        a = np.asarray(a)
        readers = [(o, p) for o, refs, _ in ops for p, r in enumerate(refs) if r == f"i{k}"]
        if spec["const"] and stored_by_value(a, readers):
            spec["value"] = a.tolist()
    ins = tuple(ins)
    ops = tuple({"op": o, "in": list(i), "attrs": dict(a)} for o, i, a in ops)
    wl = Workload(ops, ins, (), "float32")
    arrays = arrays if arrays is not None else wl.random_inputs(0)
    out = wl.reference(arrays)
    return Workload(ops, ins, tuple(out.shape), str(out.dtype))


def check(template, wl, cfg, arrays=None, seed=0):
    """The tuner's own correctness check (`tuner.measure.jobs.check`, rule in `ir.accuracy`):
    on `arrays`, or on the check input sets drawn with `seed`."""
    from ir import accuracy
    from tuner.measure import jobs
    kernel = compile_kernel(template, wl, cfg)
    sets = [(arrays, accuracy.reference(wl, arrays))] if arrays is not None else jobs.reference_sets(wl, seed)
    wrong = jobs.check(kernel, wl, sets, accuracy.workload_reduction(wl))
    assert wrong is None, f"{template.name} {cfg}: {wrong}"
    return kernel


def precompile(template_name: str, pairs) -> None:
    """Compile (workload, config) pairs in parallel worker processes (into the session's kernel
    cache), so that tests then only load them."""
    from tuner.measure import LocalBuilder, MeasureInput
    builder = LocalBuilder(timeout=600)
    try:
        results = builder.build([MeasureInput(wl, template_name, cfg) for wl, cfg in pairs])
    finally:
        builder.close()
    assert all(r.status == "ok" for r in results), [r.error for r in results if r.status != "ok"]


def conv_wl(n, c, h, w, oc, k=3, s=1, p=1, d=1, g=1, bias=True, epi=()):
    """Conv (+ bias) with an epilogue: "relu", "res" (residual input), "chan" (per-channel scale input),
    "hardswish", "clip" (Clip with scalar bound inputs, as ReLU6 is exported)."""
    ops = [("Conv", ["i0", "i1"] + (["i2"] if bias else []),
            {"strides": [s, s], "pads": [p] * 4, "dilations": [d, d], "group": g, "kernel_shape": [k, k]})]
    ins = [((n, c, h, w), "float32", False), ((oc, c // g, k, k), "float32", True)] + ([((oc,), "float32", True)] if bias else [])
    oh, ow = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
    for e in epi:
        last = f"t{len(ops) - 1}"
        if e == "relu":
            ops.append(("Relu", [last], {}))
        elif e == "res":
            ins.append(((n, oc, oh, ow), "float32", False))
            ops.append(("Add", [last, f"i{len(ins) - 1}"], {}))
        elif e == "chan":
            ins.append(((1, oc, 1, 1), "float32", True))
            ops.append(("Mul", [last, f"i{len(ins) - 1}"], {}))
        elif e == "hardswish":
            ops.append(("HardSwish", [last], {}))
        elif e == "clip":   # ReLU6 as exporters write it: Clip with its bounds as scalar inputs
            ins += [((), "float32", True), ((), "float32", True)]
            ops.append(("Clip", [last, f"i{len(ins) - 2}", f"i{len(ins) - 1}"], {}))
    return make_wl(ops, ins)

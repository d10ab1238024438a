"""Workloads built directly (no ONNX) for the template tests, and a checker vs the NumPy reference."""
from __future__ import annotations

import numpy as np

from codegen import compile_kernel
from ir.workload import Workload


def make_wl(ops, inputs, arrays=None, sym=None) -> Workload:
    """ops: [(op, [refs], attrs)]; inputs: [(shape, dtype, const)]. The output shape comes from
    running the reference on `arrays` (or random float inputs)."""
    ins = tuple({"shape": list(s), "sym": list(sym[k]) if sym and sym[k] else list(s), "dtype": d, "const": c}
                for k, (s, d, c) in enumerate(inputs))
    ops = tuple({"op": o, "in": list(i), "attrs": dict(a)} for o, i, a in ops)
    wl = Workload(ops, ins, (), "float32")
    arrays = arrays if arrays is not None else wl.random_inputs(0)
    out = wl.reference(arrays)
    return Workload(ops, ins, tuple(out.shape), str(out.dtype))


def check(template, wl, cfg, arrays=None, seed=0, rtol=1e-4):
    kernel = compile_kernel(template, wl, cfg)
    arrays = arrays if arrays is not None else wl.random_inputs(seed)
    consts = [a if spec["const"] else None for a, spec in zip(arrays, wl.inputs)]
    got = kernel.bind(consts)(arrays)
    want = wl.reference(arrays)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(1.0, float(np.abs(want).max()) if want.size else 1.0))
    return kernel

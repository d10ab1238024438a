"""The code that runs inside worker processes: build a candidate, or check and time it."""
from __future__ import annotations

import os
import signal
import time

import numpy as np

from codegen import compile_kernel
from ir.workload import Workload
from schedules import get_template

_REFERENCE: dict[str, tuple] = {}  # workload key -> (inputs, expected output), per worker process


def _kernel(req: dict):
    wl = Workload.from_json(req["workload"])
    template = get_template(req["template"])
    cfg = template.space(wl).validate(req["config"])
    return wl, compile_kernel(template, wl, cfg)


def build_job(req: dict) -> dict:
    """Compile (into the on-disk cache) so that the runner only loads."""
    _, k = _kernel(req)
    return {"compile_s": k.compiled.compile_s, "path": str(k.compiled.path)}


def _fault(kind: str) -> None:
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        time.sleep(10**6)


def _expected(wl: Workload):
    if wl.key not in _REFERENCE:
        arrays = wl.random_inputs(seed=int(wl.key[:8], 16) % 2**31)
        _REFERENCE.clear()  # one workload at a time keeps worker memory small
        _REFERENCE[wl.key] = (arrays, wl.reference(arrays))
    return _REFERENCE[wl.key]


def run_job(req: dict) -> dict:
    """Check the candidate against the NumPy reference, then time it.

    Timing: one warm-up call, then `repeat` repeats of `number` calls each, where
    `number` grows until one repeat lasts at least `min_repeat_ms`.
    """
    _fault(req.get("fault", ""))
    wl, k = _kernel(req)
    arrays, expected = _expected(wl)
    consts = [a if spec["const"] else None for a, spec in zip(arrays, wl.inputs)]
    run = k.bind(consts)
    out = np.empty(wl.output_shape, dtype=wl.output_dtype)
    run(arrays, out)
    if req.get("check", True):
        scale = max(1.0, float(np.abs(expected).max()) if expected.size else 1.0)
        if out.shape != expected.shape or not np.allclose(out, expected, rtol=1e-4, atol=1e-4 * scale):
            err = float(np.nanmax(np.abs(out - expected))) if out.shape == expected.shape else float("nan")
            return {"wrong": f"max abs error {err:.3g} vs NumPy reference (scale {scale:.3g})",
                    "compile_s": k.compiled.compile_s}
    number, min_s = 1, req.get("min_repeat_ms", 20) / 1000.0
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            run(arrays, out)
        dt = time.perf_counter() - t0
        if dt >= min_s or number >= 1 << 20:
            break
        number = max(number * 2, int(number * min_s / max(dt, 1e-9) * 1.1))
    lat = []
    for _ in range(req.get("repeat", 5)):
        t0 = time.perf_counter()
        for _ in range(number):
            run(arrays, out)
        lat.append((time.perf_counter() - t0) / number)
    return {"latencies": lat, "compile_s": k.compiled.compile_s}

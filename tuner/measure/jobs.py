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
    return {"compile_s": k.compiled.compile_s, "path": str(k.compiled.path), "cached": k.compiled.cached}


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


_FLUSH: dict[int, np.ndarray] = {}


def flush_caches(nbytes: int = 64 << 20) -> None:
    """Evict the data caches by writing a buffer larger than L2 + L3, so a repeat
    starts cold (as a kernel does after other layers ran)."""
    buf = _FLUSH.get(nbytes)
    if buf is None:
        buf = _FLUSH[nbytes] = np.zeros(nbytes // 8, np.float64)
    buf += 1.0


def timed(run, arrays, out, number: int | None, repeat: int, min_repeat_ms: float, flush: bool) -> tuple[list, int]:
    """(seconds per call of each repeat, number). `number` None: grow it until one
    repeat lasts `min_repeat_ms`. With `flush`, caches are flushed before every repeat
    (outside the timed region)."""
    if number is None:
        number, min_s = 1, min_repeat_ms / 1000.0
        while True:
            t0 = time.perf_counter()
            for _ in range(number):
                run(arrays, out)
            dt = time.perf_counter() - t0
            if dt >= min_s or number >= 1 << 20:
                break
            number = max(number * 2, int(number * min_s / max(dt, 1e-9) * 1.1))
    lat = []
    for _ in range(repeat):
        if flush:
            flush_caches()
        t0 = time.perf_counter()
        for _ in range(number):
            run(arrays, out)
        lat.append((time.perf_counter() - t0) / number)
    return lat, number


def run_job(req: dict) -> dict:
    """Check the candidate against the NumPy reference, then time it: one warm-up call
    (the check), then `repeat` repeats of `number` calls each (see `timed`)."""
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
    lat, number = timed(run, arrays, out, req.get("number"), req.get("repeat", 5), req.get("min_repeat_ms", 20),
                        bool(req.get("flush_cache", False)))
    return {"latencies": lat, "number": number, "compile_s": k.compiled.compile_s}

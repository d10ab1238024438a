"""The code that runs inside worker processes: compile a loop module, or check and time
a built kernel. Each request carries the tuner's `ir.settings.Settings`: the worker
builds its backend from them, never from the environment it inherited."""
from __future__ import annotations

import os
import signal
import time

import numpy as np

from codegen import get_backend
from codegen.backend import Backend, aligned, aligned_empty
from ir import accuracy, settings
from ir.workload import Workload

# workload key -> ([(inputs, expected output) per check input set], reduction length), per worker process
_REFERENCE: dict[str, tuple] = {}


def _backend(req: dict):
    """The backend the tuner asked for, with its settings (the process default here); the
    plugins those settings name load first (one may register that backend)."""
    s = settings.Settings.from_json(req["settings"]) if "settings" in req else settings.current()
    settings.use(s)
    if s.plugins:
        from ir.custom import load_plugins
        load_plugins(list(s.plugins))
    return get_backend(s.backend, s)


def build_job(req: dict):
    """Compile `req["module"]` (a lowered template's loop module): the artifact goes back
    to the builder, which makes it the kernel of every candidate with the same source."""
    return _backend(req).compile(req["module"])


def _fault(kind: str) -> None:
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "sigkill":   # as Ray kills an exiting actor's children, or the OOM killer does
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        time.sleep(10**6)


def reference_sets(wl: Workload, seed: int) -> list:
    """[(inputs, expected output)] for each check input set (`ir.accuracy.check_inputs`)."""
    return [(arrays, accuracy.reference(wl, arrays)) for arrays in accuracy.check_inputs(wl, seed)]


def _expected(wl: Workload):
    """(reference sets, reduction length), cached per workload; the first set is the timed one."""
    if wl.key not in _REFERENCE:
        _REFERENCE.clear()  # one workload at a time keeps worker memory small
        _REFERENCE[wl.key] = (reference_sets(wl, int(wl.key[:8], 16) % 2**31), accuracy.workload_reduction(wl))
    return _REFERENCE[wl.key]


def _consts(wl: Workload, arrays: list) -> list:
    return [a if spec["const"] else None for a, spec in zip(arrays, wl.inputs)]


def _on_device(wl: Workload, arrays: list, backend) -> list:
    """The non-constant inputs in the backend's memory, uploaded once (not on every timed call);
    constants are the bound kernel's own copies. On the CPU: the arrays, each at a cache line
    as the deployed model's buffers are (`codegen.backend.aligned`)."""
    if not backend.device:
        return [aligned(a) for a in arrays]
    return [a if spec["const"] else backend.asarray(a, a.dtype) for a, spec in zip(arrays, wl.inputs)]


def _sentinel(out: np.ndarray) -> None:
    """Fill the output with values no kernel computes, so elements it never writes are seen."""
    if out.dtype.kind == "f":
        out.fill(np.nan)
    elif out.dtype.kind in "iu":
        out.fill(np.iinfo(out.dtype).min)


def check(k, wl: Workload, sets: list, reduction: int, first=None, backend=None) -> str | None:
    """None if the kernel matches the reference on every input set, else why not.
    `first`: the kernel already bound to the first set's constants."""
    backend = backend or get_backend()
    for n, (arrays, expected) in enumerate(sets):
        host = aligned_empty(wl.output_shape, wl.output_dtype)
        _sentinel(host)
        out = backend.asarray(host, host.dtype)   # the array itself on the CPU; a device copy on a GPU
        run = first if n == 0 and first is not None else k.bind(_consts(wl, arrays), backend)
        with backend.fp_mode():   # as the deployed model runs it
            run(_on_device(wl, arrays, backend), out)
        c = accuracy.compare(backend.to_host(out), expected, reduction)
        if not c.ok:
            which = "uniform [-1, 1)" if n == 0 else "wide (negative and large values)"
            return c.message(f"input set {n + 1} of {len(sets)} ({which}), reduction length {reduction}") + \
                " vs NumPy reference"
    return None


_FLUSH: dict[int, np.ndarray] = {}


def flush_caches(nbytes: int = 64 << 20) -> None:
    """Evict the data caches by writing a buffer larger than L2 + L3, so a repeat
    starts cold (as a kernel does after other layers ran)."""
    buf = _FLUSH.get(nbytes)
    if buf is None:
        buf = _FLUSH[nbytes] = np.zeros(nbytes // 8, np.float64)
    buf += 1.0


class ThreadClock:
    """`Backend.time`'s loop with the calling thread's CPU clock around each repeat instead of
    the wall clock. A CPU kernel on one thread computes in the calling thread (`parallel_for`
    runs it there; a BLAS step runs on the settings' threads, `blas_on_threads`), so its CPU
    time is its run time without the time the process was preempted: on the shared 2-core
    machine, with the tuner's own compiles beside the runner, candidates timed by the wall
    clock over 20 ms repeats measured 2-3x the time the same kernels took as steps of the
    deployed model (BERT-small elementwise and reduce kernels: 23.6 vs 7.0 us, 23.3 vs 5.0
    us), which made the in-model check reject them and the estimate wrong. The thread's
    clock, not the process's: thread pools keep spinning after a call (OpenBLAS's ~100 ms
    after the NumPy reference check, measured), and the process clock charged that to the
    candidate timed next."""

    def __init__(self, backend):
        self.backend = backend

    def synchronize(self) -> None:
        self.backend.synchronize()

    def repeat_seconds(self, run, number: int) -> float:
        t0 = time.thread_time()
        for _ in range(number):
            run()
        return time.thread_time() - t0

    def time(self, run, number: int | None, repeat: int, min_repeat_ms: float, flush=None) -> tuple[list, int]:
        """`Backend.time` (the same growth of `number` and repeats) on this clock."""
        return Backend.time(self, run, number, repeat, min_repeat_ms, flush)


def timed(run, arrays, out, number: int | None, repeat: int, min_repeat_ms: float, flush: bool,
          backend=None) -> tuple[list, int]:
    """(seconds per call of each repeat, number), timed by the backend (`Backend.time`: it
    knows how to wait for its device), on the CPU at one thread by the calling thread's CPU
    clock (`ThreadClock`). `number` None: grow it until one repeat lasts `min_repeat_ms`. With
    `flush`, caches are flushed before every repeat (outside the timing)."""
    backend = backend or get_backend()
    flusher = (backend.flush if backend.device else flush_caches) if flush else None
    clock = ThreadClock(backend) if not backend.device and backend.settings.num_threads == 1 else backend
    with backend.fp_mode():   # as the deployed model runs it: denormals cost ~100 cycles each otherwise
        return clock.time(lambda: run(arrays, out), number, repeat, min_repeat_ms, flusher)


def _as_deployed(run, arrays, out):
    """`run` as a model's program calls it: its launch planned once on these buffers
    (`BoundKernel.plan`), every argument fixed, one Python call per step. Called as `run(arrays,
    out)` each call also fills its inputs and output, and on 2 threads packs the native
    argument block of each split step again: a stem's pad + conv on 2 threads took 25-70 us more a
    call than deployed (121 -> 147 and 123 -> 196 us, Zen 3, 2026-12-07), which on small kernels
    outweighs the differences tune ranks."""
    calls = run.plan(arrays, out).fill(arrays, out)

    def deployed(_arrays, _out):
        for step, args in calls:
            step(*args)
    return deployed


def run_job(req: dict) -> dict:
    """Check the built kernel against the NumPy reference on every check input set
    (`ir.accuracy`), then time it on the first: one warm-up call, then `repeat`
    repeats of `number` calls each (see `timed`). The reply names the target it ran on."""
    _fault(req.get("fault", ""))
    backend = _backend(req)
    k = req["kernel"]
    wl = k.workload
    target = backend.target().describe()
    sets, reduction = _expected(wl)
    arrays = sets[0][0]
    run = k.bind(_consts(wl, arrays), backend)
    if req.get("check", True):
        wrong = check(k, wl, sets, reduction, first=run, backend=backend)
        if wrong:
            return {"wrong": wrong, "compile_s": k.artifact.compile_s, "target": target}
    out = backend.empty(wl.output_shape, wl.output_dtype)
    arrays = _on_device(wl, arrays, backend)
    if not backend.device:
        run = _as_deployed(run, arrays, out)
    with backend.fp_mode():
        run(arrays, out)   # warm-up
    lat, number = timed(run, arrays, out, req.get("number"), req.get("repeat", 5), req.get("min_repeat_ms", 20),
                        bool(req.get("flush_cache", False)), backend)
    return {"latencies": lat, "number": number, "compile_s": k.artifact.compile_s, "target": target}

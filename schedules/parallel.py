"""Run T copies of a nogil kernel on threads: copy t handles work items t, t+T, ...

Generated kernels are serial numba functions with `nogil=True`; this is how they
use several cores. Numba's `parallel=True` would compile each candidate about
3x slower (measured: 5 s -> 15 s for a dense register tile), and compile time
is the tuner's main cost.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def num_threads() -> int:
    env = os.environ.get("TENSORTUNE_NUM_THREADS")
    if env:
        return max(1, int(env))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, num_threads() - 1), thread_name_prefix="tensortune")
        return _pool


def parallel_for(fn, args: tuple, threads: int, items: int | None = None) -> None:
    """fn(*args, t, T) for t in range(T); the calling thread runs t = 0.

    T is `threads`, cut to `items` (the work items the kernel strides over) when
    given: waking a thread for no work costs more than a small kernel runs."""
    if items is not None:
        threads = min(threads, items)
    if threads <= 1:
        fn(*args, 0, 1)
        return
    futures = [_get_pool().submit(fn, *args, t, threads) for t in range(1, threads)]
    fn(*args, 0, threads)
    for f in futures:
        f.result()

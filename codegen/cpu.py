"""The `cpu` backend: loop modules rendered to Python, compiled by numba.

Kernels are serial `nogil` numba functions; `call` runs T copies of one on
threads, copy t handling work items t, t+T, ... (`parallel_for`). Numba's
`parallel=True` would compile each candidate about 3x slower (measured: 5 s ->
15 s for a dense register tile), and compile time is the tuner's main cost.

An artifact is the rendered source plus numba's cache files for it (index and
machine code) and the source file's timestamp, which numba's index checks:
written into another process's (or machine's) private kernel cache, numba loads
the machine code instead of compiling. On a CPU that differs, numba's index has
no entry for it and compiles: correct, only slower.
"""
from __future__ import annotations

import os
import platform
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from codegen import build as _build
from codegen.backend import Artifact, Backend
from codegen.cache_safety import cache_files

from codegen.target import Target
from schedules.loopnest import LoopModule


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=None)
def _host() -> dict:
    import llvmlite
    import llvmlite.binding as ll
    import numba
    feats = ll.get_host_cpu_features()
    simd = ",".join(sorted(k for k, v in feats.items() if v and any(s in k for s in ("avx", "fma", "sse4", "neon", "sve"))))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cpu_name": ll.get_host_cpu_name(), "features": simd, "cores": int(cores or 1),
            "numba": numba.__version__, "llvmlite": llvmlite.__version__}


class _Threads:
    """One pool per process, grown on demand: the calling thread runs copy 0."""
    lock = threading.Lock()
    pool: ThreadPoolExecutor | None = None
    size = 0

    @classmethod
    def get(cls, workers: int) -> ThreadPoolExecutor:
        with cls.lock:
            if cls.pool is None or cls.size < workers:
                if cls.pool is not None:
                    cls.pool.shutdown(wait=False)
                cls.pool, cls.size = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tensortune"), workers
            return cls.pool


def parallel_for(fn, args: tuple, threads: int, items: int | None = None) -> None:
    """fn(*args, t, T) for t in range(T); the calling thread runs t = 0.

    T is `threads`, cut to `items` (the work items the kernel strides over) when
    given: waking a thread for no work costs more than a small kernel runs."""
    if items is not None:
        threads = min(threads, items)
    if threads <= 1:
        fn(*args, 0, 1)
        return
    pool = _Threads.get(threads - 1)
    futures = [pool.submit(fn, *args, t, threads) for t in range(1, threads)]
    fn(*args, 0, threads)
    for f in futures:
        f.result()


class CpuBackend(Backend):
    name = "cpu"

    def target(self) -> Target:
        return Target.make("cpu", threads=self.settings.num_threads, **_host())

    def render(self, module: LoopModule) -> str:
        return _build.source_for(module, self.target())[0]

    def compile(self, module: LoopModule) -> Artifact:
        target = self.target()
        src, key = _build.source_for(module, target)
        names = tuple(f.name for f in module.functions)
        cm = _build.load_source(src, key, list(names), self.settings)
        ndir = _build.numba_dir(cm.path)
        files = {f.name: f.read_bytes() for f in cache_files(ndir, cm.path.stem)}
        return Artifact("cpu", key, target.key, src, names, files, cm.compile_s, cm.cached,
                        meta={"source_mtime_ns": os.stat(cm.path).st_mtime_ns})

    def load(self, artifact: Artifact) -> dict:
        _build.install_artifact(artifact, self.settings)
        return _build.load_source(artifact.source, artifact.key, list(artifact.functions), self.settings).functions

    def call(self, fn, args: list, items: int, parallel: bool, grid=(), block=()) -> None:
        parallel_for(fn, tuple(args), self.settings.num_threads if parallel else 1, items)

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
import queue
import threading
from functools import lru_cache

from codegen import build as _build
from codegen.backend import Artifact, Backend
from codegen.cache_safety import cache_files, verified, write_manifest

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


MIN_WORK_PER_THREAD = 1 << 19   # work units (FLOPs + bytes, `codegen.kernel.work_estimate`) per thread


class _Workers:
    """Threads 1, 2, ... of `parallel_for`, started on first need and kept: each waits on
    its own queue (a `SimpleQueue` handoff wakes a thread in about half the time a
    `ThreadPoolExecutor` future takes, measured here), the calling thread runs copy 0."""
    lock = threading.Lock()
    queues: list = []

    @classmethod
    def get(cls, workers: int) -> list:
        if len(cls.queues) < workers:
            with cls.lock:
                while len(cls.queues) < workers:
                    q = queue.SimpleQueue()
                    threading.Thread(target=cls._serve, args=(q,), daemon=True,
                                     name=f"tensortune-{len(cls.queues) + 1}").start()
                    cls.queues.append(q)
        return cls.queues

    @staticmethod
    def _serve(q: queue.SimpleQueue) -> None:
        while True:
            fn, args, done = q.get()
            try:
                fn(*args)
                done.put(None)
            except BaseException as e:   # handed to the caller, which raises it
                done.put(e)


def threads_for(threads: int, items: int | None, work: int | None) -> int:
    """How many threads run a kernel: at most `threads`, no more than its work `items`, and
    one per `MIN_WORK_PER_THREAD` of its work: waking a thread costs tens of microseconds
    (more on shared cores), more than a tiny kernel runs."""
    if items is not None:
        threads = min(threads, items)
    if work is not None:
        threads = min(threads, max(1, work // MIN_WORK_PER_THREAD))
    return max(1, threads)


def parallel_for(fn, args: tuple, threads: int, items: int | None = None, work: int | None = None) -> None:
    """fn(*args, t, T) for t in range(T); the calling thread runs t = 0.

    T is `threads`, cut by `threads_for` to the work items the kernel strides over and
    to its size (`work`) when given."""
    threads = threads_for(threads, items, work)
    if threads <= 1:
        fn(*args, 0, 1)
        return
    queues, done = _Workers.get(threads - 1), queue.SimpleQueue()
    for t in range(1, threads):
        queues[t - 1].put((fn, (*args, t, threads), done))
    try:
        fn(*args, 0, threads)
    finally:
        errors = [e for e in (done.get() for _ in range(1, threads)) if e is not None]
    if errors:
        raise errors[0]


class _Spread:
    """A kernel run on T > 1 threads: `_Spread(fn, T)(*args)` is `parallel_for(fn, args, T)`."""
    __slots__ = ("fn", "threads")

    def __init__(self, fn, threads: int):
        self.fn, self.threads = fn, threads

    def __call__(self, *args) -> None:
        parallel_for(self.fn, args, self.threads)


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
        if not cm.path.exists():   # loaded earlier in this process from another cache: this one gets the source
            _build._write_atomic(cm.path, src)
        ndir = _build.numba_dir(cm.path)
        files = {f.name: f.read_bytes() for f in cache_files(ndir, cm.path.stem)}
        return Artifact("cpu", key, target.key, src, names, files, cm.compile_s, cm.cached,
                        meta={"source_mtime_ns": os.stat(cm.path).st_mtime_ns})

    def has_cached(self, module: LoopModule) -> bool:
        """Whether this process or the kernel cache already holds `module`'s machine code, so
        `compile` only loads it (tens of milliseconds instead of seconds)."""
        src, key = _build.source_for(module, self.target())
        if f"tensortune_kernel_{key}" in _build.sys.modules:
            return True
        path = _build.cache_dir(self.settings) / f"k_{key}.py"
        return path.exists() and path.read_text() == src and verified(_build.numba_dir(path), path.stem)

    def load(self, artifact: Artifact) -> dict:
        path = _build.cache_dir(self.settings) / f"k_{artifact.key}.py"
        name = f"tensortune_kernel_{artifact.key}"
        if name not in _build.sys.modules and artifact.files:
            self._install(artifact, path)
        return _build.load_source(artifact.source, artifact.key, list(artifact.functions), self.settings).functions

    def _install(self, artifact: Artifact, path) -> None:
        """Put the artifact's numba cache files beside its source, unless exactly they are there."""
        ndir = _build.numba_dir(path)
        have = {f.name: f.read_bytes() for f in cache_files(ndir, path.stem)} if verified(ndir, path.stem) else {}
        if have == artifact.files and path.exists() and path.read_text() == artifact.source:
            return
        if not path.exists() or path.read_text() != artifact.source:
            _build._write_atomic(path, artifact.source)
        ns = artifact.meta.get("source_mtime_ns")
        if ns:
            os.utime(path, ns=(ns, ns))   # numba's index is valid only for this timestamp
        for fname, data in artifact.files.items():
            tmp = ndir / f".tmp_{fname}"
            tmp.write_bytes(data)
            os.replace(tmp, ndir / fname)
        write_manifest(ndir, path.stem)

    def call(self, fn, args: list, items: int, parallel: bool, grid=(), block=()) -> None:
        parallel_for(fn, tuple(args), self.settings.num_threads if parallel else 1, items)

    def launcher(self, items: int, parallel: bool, grid=(), block=(), work: int | None = None):
        """How a bound kernel's plan runs one `Call` step, decided once: fn -> (run, trailing
        args). On one thread that is the kernel function itself with (t, T) = (0, 1)."""
        threads = threads_for(self.settings.num_threads if parallel else 1, items, work)

        def make(fn):
            return (fn, (0, 1)) if threads <= 1 else (_Spread(fn, threads), ())
        return make

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


# A float loop LLVM vectorizes as widely as the target machine prefers: the probe of `_vector_width`.
_PROBE_IR = r"""
define void @axpy(ptr noalias nocapture %x, ptr noalias nocapture %y, float %a) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%n, %loop]
  %px = getelementptr inbounds float, ptr %x, i64 %i
  %py = getelementptr inbounds float, ptr %y, i64 %i
  %vx = load float, ptr %px
  %vy = load float, ptr %py
  %m = fmul fast float %vx, %a
  %s = fadd fast float %m, %vy
  store float %s, ptr %py
  %n = add nuw nsw i64 %i, 1
  %c = icmp eq i64 %n, 4096
  br i1 %c, label %done, label %loop
done:
  ret void
}
"""


def _use_wide_vectors() -> None:
    """Let LLVM emit 512-bit vectors on AVX-512 hosts.

    LLVM's models of most AVX-512 Intel CPUs (skylake-avx512 ... sapphirerapids) carry the
    `prefer-256-bit` tuning flag: the SLP and loop vectorizers then stop at 256 bits, half
    the FMA width, and a register tile sized for 16-float vectors cannot reach the peak.
    numba builds one LLVM target machine per process from `numba.config.CPU_FEATURES`, so
    this is a property of the process (and of its target, `_host`), not a per-kernel knob;
    it must be set before numba compiles or loads anything, hence at import of this backend.
    Left alone when the user chose features (NUMBA_CPU_FEATURES) or asked for LLVM's
    default with TENSORTUNE_PREFER_256=1."""
    import numba
    from numba.core.codegen import get_host_cpu_features
    if numba.config.CPU_FEATURES is not None or os.environ.get("TENSORTUNE_PREFER_256", "") == "1":
        return
    features = get_host_cpu_features()
    if "+avx512f" in features.split(","):
        numba.config.CPU_FEATURES = features + ",-prefer-256-bit"


_use_wide_vectors()


def _vector_width(cpu_name: str, features: str) -> tuple[int, int]:
    """(bits of the float vectors LLVM emits, vector registers) for numba's target machine.

    The width is probed, not looked up: a tiny float loop compiled for this CPU model and
    feature string, widest register named in its assembly. Only AVX-512 needs the probe
    (the CPU model's `prefer-256-bit` tuning decides between 256 and 512 bits)."""
    on = {f[1:] for f in features.split(",") if f.startswith("+")}
    if "avx512f" in on:
        import llvmlite.binding as ll
        ll.initialize_native_target()
        ll.initialize_native_asmprinter()
        tm = ll.Target.from_default_triple().create_target_machine(cpu=cpu_name, features=features, opt=3)
        mod = ll.parse_assembly(_PROBE_IR)
        pto = ll.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = pto.slp_vectorization = True
        pb = ll.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        asm = tm.emit_assembly(mod)
        return (512 if "zmm" in asm else 256), 32
    if "avx" in on:
        return 256, 16
    return 128, (32 if "neon" in on or platform.machine() in ("arm64", "aarch64") else 16)


@lru_cache(maxsize=None)
def _host() -> dict:
    import llvmlite
    import llvmlite.binding as ll
    import numba
    from numba.core.registry import cpu_target
    feats = ll.get_host_cpu_features()
    simd = ",".join(sorted(k for k, v in feats.items() if v and any(s in k for s in ("avx", "fma", "sse4", "neon", "sve"))))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # what numba's target machine was really built with (set before its first compile, see above)
    _triple, cpu_name, tm_features = cpu_target.target_context.codegen().magic_tuple()
    bits, regs = _vector_width(cpu_name, tm_features)
    return {"cpu": _cpu_model(), "cpu_name": ll.get_host_cpu_name(), "features": simd, "cores": int(cores or 1),
            "numba": numba.__version__, "llvmlite": llvmlite.__version__,
            "vector_bits": bits, "vector_registers": regs}


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

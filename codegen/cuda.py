"""The `cuda` backend: loop modules rendered to numba-cuda kernels (`pip install .[cuda]`).

A GPU template's loop module holds kernels (functions launched on a grid of blocks,
reading `cuda.blockIdx`/`cuda.threadIdx` in their expressions) and device functions
(`Function.device`). Rendering differs from the CPU in three places only: the header
imports `numba.cuda`, kernels get `@cuda.jit("void(...)")` with their explicit
signature (eager compile, cached on disk by numba-cuda as PTX/cubin next to the
source, exactly as the CPU backend's machine code), and an `Alloc` becomes
`cuda.local.array` or `cuda.shared.array` by its scope. A `Call` step launches
`fn[grid, block](*args)`.

Memory: `empty` and `asarray` give device arrays; `to_host` copies back. The executor
uploads each model input once per call and copies each output back once; constants
(weights) are uploaded once, when a kernel is bound.

The target is the device as timings see it: name, compute capability, SM count and
the per-block/per-SM limits that decide which configs can launch at all. Without a
device, `Settings.cuda_arch` (TENSORTUNE_CUDA_ARCH) declares a compute capability and
the limits come from the CUDA programming guide's table for it; numba-cuda's
simulator (NUMBA_ENABLE_CUDASIM=1) runs kernels on the CPU, slowly, for tests.
"""
from __future__ import annotations

import os

import numpy as np

from codegen import build as _build
from codegen.backend import Artifact, Backend, BackendError
from codegen.cache_safety import cache_files
from codegen.source import render
from codegen.target import Target
from schedules.loopnest import Alloc, Function, LoopModule

HEADER = "import math\nimport numpy as np\nfrom numba import cuda, float32, float64, int32, int64\n"

# Per compute capability (major, minor): (threads per SM, blocks per SM, shared bytes per SM,
# registers per SM). Shared memory per block is 48 KiB for static `cuda.shared.array`
# allocations on every architecture; registers per thread at most 255; 1024 threads per block.
_ARCH = {
    (5, 0): (2048, 32, 64 << 10, 65536), (5, 2): (2048, 32, 96 << 10, 65536), (6, 0): (2048, 32, 64 << 10, 65536),
    (6, 1): (2048, 32, 96 << 10, 65536), (7, 0): (2048, 32, 96 << 10, 65536), (7, 5): (1024, 16, 64 << 10, 65536),
    (8, 0): (2048, 32, 164 << 10, 65536), (8, 6): (1536, 16, 100 << 10, 65536), (8, 9): (1536, 24, 100 << 10, 65536),
    (9, 0): (2048, 32, 228 << 10, 65536), (10, 0): (2048, 32, 228 << 10, 65536), (12, 0): (1536, 32, 100 << 10, 65536),
}
STATIC_SHARED_PER_BLOCK = 48 << 10


class CudaError(BackendError):
    """No CUDA device here (and no simulator or declared architecture), or a CUDA call failed."""


def simulator() -> bool:
    """numba-cuda's simulator is on (NUMBA_ENABLE_CUDASIM=1, read by numba at import)."""
    from numba import config
    return bool(getattr(config, "ENABLE_CUDASIM", 0))


def _cuda():
    try:
        from numba import cuda
    except ImportError as e:  # numba-cuda is an extra
        raise CudaError(f"the cuda backend needs numba-cuda (pip install '.[cuda]'): {e}") from None
    return cuda


def parse_arch(text: str) -> tuple[int, int]:
    try:
        major, minor = (int(x) for x in str(text).strip().split("."))
    except ValueError:
        raise CudaError(f"a CUDA compute capability looks like '8.0', got {text!r}") from None
    if (major, minor) not in _ARCH:
        raise CudaError(f"compute capability {text} is not one tensortune knows "
                        f"({', '.join(f'{a}.{b}' for a, b in sorted(_ARCH))})")
    return major, minor


def declared_props(arch: tuple[int, int], name: str) -> dict:
    """The target properties of a device of compute capability `arch` from the table."""
    threads_sm, blocks_sm, shared_sm, regs_sm = _ARCH[arch]
    return {"name": name, "cc": f"{arch[0]}.{arch[1]}", "sm_count": 0, "warp": 32, "max_threads_per_block": 1024,
            "shared_per_block": STATIC_SHARED_PER_BLOCK, "regs_per_block": 65536, "regs_per_thread": 255,
            "threads_per_sm": threads_sm, "blocks_per_sm": blocks_sm, "shared_per_sm": shared_sm, "regs_per_sm": regs_sm}


def _device_props(cuda) -> dict:
    dev = cuda.get_current_device()
    arch = tuple(dev.compute_capability)
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    p = declared_props(arch if arch in _ARCH else min(_ARCH, key=lambda a: abs(a[0] * 10 + a[1] - arch[0] * 10 - arch[1])),
                       name)
    p["cc"] = f"{arch[0]}.{arch[1]}"
    for prop, attr in (("sm_count", "MULTIPROCESSOR_COUNT"), ("max_threads_per_block", "MAX_THREADS_PER_BLOCK"),
                       ("regs_per_block", "MAX_REGISTERS_PER_BLOCK"), ("threads_per_sm", "MAX_THREADS_PER_MULTI_PROCESSOR"),
                       ("shared_per_sm", "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
                       ("regs_per_sm", "MAX_REGISTERS_PER_MULTIPROCESSOR"), ("warp", "WARP_SIZE")):
        try:
            p[prop] = int(getattr(dev, attr))
        except Exception:  # an attribute this driver does not report: the table's value stays
            pass
    try:
        p["driver"] = ".".join(str(v) for v in cuda.cudadrv.driver.driver.get_version())
    except Exception:
        pass
    return p


def _decorator(fn: Function) -> str:
    if fn.device:
        return "@cuda.jit(device=True, inline=True, fastmath=True)"
    sig = "void(" + ", ".join(p.type for p in fn.params) + ")"
    fm = "True" if fn.fastmath else "False"
    return f'@cuda.jit("{sig}", fastmath={fm}, cache=True)'


def _alloc(s: Alloc) -> str:
    shape = "(" + ", ".join(s.shape) + ",)"
    where = "shared" if s.scope == "shared" else "local"
    return f"cuda.{where}.array({shape}, dtype=np.{s.dtype})"


def is_device_array(a) -> bool:
    return hasattr(a, "copy_to_host")


class CudaBackend(Backend):
    name = "cuda"
    template_kind = "cuda"
    device = True

    def __init__(self, settings=None):
        super().__init__(settings)
        self._target: Target | None = None

    def target(self) -> Target:
        if self._target is None:
            self._target = self._make_target()
        return self._target

    def _make_target(self) -> Target:
        import numba
        arch_text = getattr(self.settings, "cuda_arch", "")
        cuda = _cuda()
        try:
            from numba_cuda import __version__ as nc_version
        except Exception:
            nc_version = "?"
        common = {"numba": numba.__version__, "numba_cuda": nc_version}
        if simulator():
            arch = parse_arch(arch_text or "8.0")
            return Target.make("cuda", simulator=True, **declared_props(arch, "numba-cuda simulator"), **common)
        if cuda.is_available():
            return Target.make("cuda", simulator=False, **_device_props(cuda), **common)
        if arch_text:
            arch = parse_arch(arch_text)
            return Target.make("cuda", simulator=False, **declared_props(arch, f"declared sm_{arch[0]}{arch[1]}"),
                               **common)
        raise CudaError("no CUDA device is available here (numba-cuda found none); declare one with "
                        "TENSORTUNE_CUDA_ARCH=8.0 to build without running, or set NUMBA_ENABLE_CUDASIM=1 "
                        "for numba-cuda's simulator")

    # -- code ----------------------------------------------------------------------
    def render(self, module: LoopModule) -> str:
        t = self.target()
        banner = (f"generated by tensortune codegen -- {module.meta.get('template', '?')}\n"
                  f"target {t.key}: {t.name} (sm {t.cc}), numba-cuda {t.numba_cuda}")
        return render(module, banner, header=HEADER, decorator=_decorator, alloc=_alloc)

    def compile(self, module: LoopModule) -> Artifact:
        import hashlib
        target = self.target()
        src = self.render(module)
        key = hashlib.sha256(src.encode()).hexdigest()[:24]
        names = tuple(f.name for f in module.functions if not f.device)
        cm = _build.load_source(src, key, list(names), self.settings)
        ndir = _build.numba_dir(cm.path)
        files = {f.name: f.read_bytes() for f in cache_files(ndir, cm.path.stem)}
        return Artifact("cuda", key, target.key, src, names, files, cm.compile_s, cm.cached,
                        meta={"source_mtime_ns": os.stat(cm.path).st_mtime_ns})

    def load(self, artifact: Artifact) -> dict:
        if artifact.backend != self.name:
            raise BackendError(f"an artifact of backend '{artifact.backend}' cannot run on '{self.name}'")
        _build.install_artifact(artifact, self.settings)
        if simulator():   # the simulator lacks warp shuffles: `codegen.cuda_sim` gives them
            from codegen import cuda_sim
            cuda_sim.install()
        return _build.load_source(artifact.source, artifact.key, list(artifact.functions), self.settings).functions

    # -- running -------------------------------------------------------------------
    def call(self, fn, args: list, items: int, parallel: bool, grid=(), block=()) -> None:
        if not grid or not block:
            raise BackendError("a launch step without grid and block cannot run on the GPU "
                               "(a CPU template's launch was given to the cuda backend)")
        fn[tuple(grid), tuple(block)](*args)

    def library(self, routine: str):
        raise BackendError(f"backend 'cuda' has no library routine '{routine}'")

    def empty(self, shape, dtype):
        return _cuda().device_array(tuple(int(d) for d in shape), dtype=np.dtype(dtype))

    def asarray(self, a, dtype):
        dtype = np.dtype(dtype)
        if is_device_array(a):
            if a.dtype != dtype:
                raise BackendError(f"a device array of {a.dtype} was passed where {dtype} is read "
                                   "(device arrays are not converted)")
            return a
        return _cuda().to_device(np.ascontiguousarray(a, dtype=dtype))

    def to_host(self, a) -> np.ndarray:
        return a.copy_to_host() if is_device_array(a) else np.asarray(a)

    def copy_into(self, dst, a) -> None:
        if is_device_array(dst):
            src = a if is_device_array(a) else np.ascontiguousarray(a, dtype=dst.dtype)
            dst.copy_to_device(src)
        else:
            np.copyto(dst, self.to_host(a))

    def synchronize(self) -> None:
        _cuda().synchronize()

    def flush(self, nbytes: int = 256 << 20) -> None:
        """Evict the GPU's L2 before a timing repeat: a device-to-device copy larger than any L2."""
        bufs = self.__dict__.get("_flush")
        if bufs is None:
            cuda = _cuda()
            bufs = self._flush = (cuda.device_array(nbytes // 4, np.float32), cuda.device_array(nbytes // 4, np.float32))
        bufs[1].copy_to_device(bufs[0])
        self.synchronize()

    def device_count(self) -> int:
        """GPUs the runner gives a worker each (one under the simulator or a declared arch)."""
        if simulator():
            return 1
        cuda = _cuda()
        try:
            return max(1, len(cuda.gpus)) if cuda.is_available() else 1
        except Exception:
            return 1

    def repeat_seconds(self, run, number: int) -> float:
        """CUDA events around the calls (the simulator's events do not time: the wall clock there)."""
        if simulator():
            return super().repeat_seconds(run, number)
        cuda = _cuda()
        start, stop = cuda.event(), cuda.event()
        start.record()
        for _ in range(number):
            run()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1000.0


def check_available(settings=None) -> None:
    """Raise `CudaError` (one line) unless kernels can run on a GPU or the simulator here."""
    cuda = _cuda()
    if not simulator() and not cuda.is_available():
        raise CudaError("no CUDA device is available here; set NUMBA_ENABLE_CUDASIM=1 to run kernels "
                        "in numba-cuda's simulator")


__all__ = ["CudaBackend", "CudaError", "check_available", "declared_props", "is_device_array", "parse_arch",
           "simulator"]

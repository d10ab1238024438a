"""The backend interface: what turns a lowered kernel into something that runs.

A backend knows one kind of device. It describes the `Target` it runs on (whose
key keeps records of different machines apart), renders a loop module to
source, compiles it to an `Artifact` (bytes that can travel to another process
or machine), loads an artifact into callable functions, runs one step of a
launch description, and times a call. Backends are created by name; the heavy
imports (numba, numba-cuda) happen only when one is chosen.

Built-in: `cpu` (numba, `codegen.cpu`) and `cuda` (numba-cuda, `codegen.cuda`). Others register with
`register_backend(name, "module:Class")` or a `tensortune.backends` entry point;
tests add a pure-NumPy interpreter this way (tests/interp_backend.py) without
touching the tuner, the runtime or the templates.

How a launch description runs on a backend: `codegen.kernel.BoundKernel` resolves
the arguments to arrays (`empty`, `asarray`) and hands each `Call` to `call` and
each `Library` step to `library`. See `schedules.launch` for the description.
"""
from __future__ import annotations

import abc
import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from codegen.target import Target
from ir.errors import TensortuneError
from ir.lazy import load_object
from ir.settings import Settings, resolve
from schedules.loopnest import LoopModule


ALIGN = 64   # bytes: a cache line, and a 512-bit vector


def aligned_empty(shape, dtype) -> np.ndarray:
    """`np.empty` whose data start on an `ALIGN`-byte boundary. NumPy's own start 16 bytes past
    one (malloc's header), so every 64-byte vector load of an AVX-512 kernel spans two cache
    lines: measured on an Intel Xeon, LayerNorm 128x1024 22.8 us misaligned vs 16.7 aligned."""
    dtype = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return np.frombuffer(raw, dtype, nbytes // dtype.itemsize, start).reshape(shape)


def aligned_copy(a: np.ndarray, min_bytes: int = 4096) -> np.ndarray:
    """A copy of `a` that starts on an `ALIGN`-byte boundary where it holds `min_bytes` or more;
    a smaller one is NumPy's own copy: its loads gain little from the boundary, and the aligned
    allocation's Python path costs ~20 us more where a model's weights have pushed it out of
    the caches (measured on an Intel Xeon, 2026-12-04), ~5 us more in a warm loop (7.7 KB: 5.9
    against 0.6 us, AMD EPYC Zen 3, 2026-12-07)."""
    if a.nbytes < min_bytes:
        return np.array(a)
    out = aligned_empty(a.shape, a.dtype)
    np.copyto(out, a)
    return out


def aligned(a, dtype=None) -> np.ndarray:
    """`a` as a C-contiguous array of `dtype` starting on an `ALIGN`-byte boundary: `a` itself
    when it is one, else a copy."""
    a = np.asarray(a, dtype=dtype)
    if a.flags.c_contiguous and a.ctypes.data % ALIGN == 0:
        return a
    out = aligned_empty(a.shape, a.dtype)
    np.copyto(out, a)
    return out


class BackendError(TensortuneError):
    """A backend that does not exist or cannot run here (its package or device is missing)."""


@dataclass(frozen=True)
class Artifact:
    """A compiled loop module as data: enough for `Backend.load` in another process or on
    another machine of the same target to run it without compiling. `files` are the
    backend's compiled outputs by name (numba's cache index and machine code on the CPU;
    PTX/cubin on CUDA); `source` is kept for error messages and inspection."""
    backend: str
    key: str                       # content key: same source and target -> same key
    target_key: str
    source: str
    functions: tuple[str, ...]
    files: dict = field(default_factory=dict, compare=False, hash=False)   # name -> bytes
    compile_s: float = 0.0
    cached: bool = False           # the compile was a cache hit
    meta: dict = field(default_factory=dict, compare=False, hash=False)   # backend-specific (timestamps)

    @property
    def nbytes(self) -> int:
        return len(self.source) + sum(len(b) for b in self.files.values())


_BLAS = None


def _blas_controllers() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded in this process (found once)."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController
        _BLAS = list(ThreadpoolController().select(user_api="blas").lib_controllers)
    return _BLAS


def blas_on_threads(fn: Callable, threads: int) -> Callable:
    """`fn` (a BLAS call) on `threads` of the BLAS library's threads, its setting restored after.

    NumPy's OpenBLAS otherwise uses every core whatever the model was loaded with: a model
    deployed at 1 thread ran its BLAS steps on 2, and OpenBLAS's pool then spins ~100 ms
    after each call (measured on a 2-core Zen 5), which a 1-thread runner's process clock
    counted against the BLAS candidate and which takes a core from the process's other work.
    The thread count is the library's global setting, hence set and restored around each
    call (about 1 us each, against a matmul of tens of microseconds and more)."""
    libs = _blas_controllers()

    def call(*args):
        before = [lib.get_num_threads() for lib in libs]
        if all(b == threads for b in before):
            return fn(*args)
        for lib in libs:
            lib.set_num_threads(threads)
        try:
            return fn(*args)
        finally:
            for lib, b in zip(libs, before):
                lib.set_num_threads(b)
    return call


class Backend(abc.ABC):
    name: str = ""
    template_kind: str = "cpu"   # which templates' loop modules it runs (`Template.kind`)
    device: bool = False         # its arrays live in device memory (the executor copies in and out)

    def __init__(self, settings: Settings | None = None):
        self.settings = resolve(settings)

    # -- what it runs on -----------------------------------------------------------
    @abc.abstractmethod
    def target(self) -> Target:
        """The machine as timings see it; `target().key` keeps records apart."""

    # -- code ----------------------------------------------------------------------
    @abc.abstractmethod
    def render(self, module: LoopModule) -> str:
        """The source text this backend compiles for `module` (deterministic)."""

    def source_key(self, module: LoopModule) -> str:
        """The content key of `module` on this target: equal keys share one compile."""
        import hashlib
        return hashlib.sha256(self.render(module).encode()).hexdigest()[:24]

    @abc.abstractmethod
    def compile(self, module: LoopModule) -> Artifact:
        """Compile every function of `module` (a cache hit is allowed) into an artifact.
        A module the compiler rejects raises `codegen.CompileError`."""

    @abc.abstractmethod
    def load(self, artifact: Artifact) -> dict[str, Callable]:
        """Function name -> callable, from an artifact made here or elsewhere."""

    # -- running -------------------------------------------------------------------
    @abc.abstractmethod
    def call(self, fn: Callable, args: list, items: int, parallel: bool, grid=(), block=()) -> None:
        """Run one `Call` step: `fn` over `items` work items (see `schedules.launch`)."""

    def batch(self, calls: list) -> Callable[[], None] | None:
        """One callable running flat calls ((run, args) of `codegen.kernel.Calls`, every argument
        fixed) in order, faster than calling each from Python; None where this backend has no
        such thing or some call cannot take part. Its `seconds()` gives each call's seconds in
        its last run; raising, its `failed` names the failing call's index."""
        return None

    def library(self, routine: str) -> Callable:
        """A routine of a `Library` step by name; the CPU has NumPy's BLAS matmul, run on this
        backend's threads (`blas_on_threads`)."""
        if routine == "matmul":
            return blas_on_threads(lambda a, b, out: np.matmul(a, b, out=out), self.settings.num_threads)
        raise BackendError(f"backend '{self.name}' has no library routine '{routine}'")

    def empty(self, shape, dtype) -> np.ndarray:
        """A buffer of this backend's memory (host memory on the CPU, at a cache line)."""
        return aligned_empty(shape, dtype)

    def asarray(self, a, dtype) -> np.ndarray:
        """A C-contiguous array of `dtype` in this backend's memory holding `a` (on the CPU `a`
        itself where it is one, wherever it starts: a copy would cost every call that passes a
        graph input)."""
        return np.ascontiguousarray(a, dtype=dtype)

    def to_host(self, a) -> np.ndarray:
        """`a` as a host (NumPy) array: a copy of device memory, the array itself on the CPU."""
        return np.asarray(a)

    def copy_into(self, dst, a) -> None:
        """Write `a` (host or this backend's memory) into the buffer `dst` of this backend."""
        np.copyto(dst, a)

    def synchronize(self) -> None:
        """Wait for launched work to finish (asynchronous devices); the CPU is synchronous."""

    def fp_mode(self):
        """A context the kernels run in: the floating-point mode of the calling thread they
        expect (the CPU's flushes denormals, `codegen.fpmode`), restored after."""
        return contextlib.nullcontext()

    def time(self, run: Callable[[], None], number: int | None, repeat: int, min_repeat_ms: float,
             flush: Callable[[], None] | None = None) -> tuple[list[float], int]:
        """(seconds per call of each repeat, number). `number` None: grow it until one repeat
        lasts `min_repeat_ms`. `flush` (if given) runs before every repeat, outside the timing."""
        if number is None:
            number, min_s = 1, min_repeat_ms / 1000.0
            while True:
                dt = self.repeat_seconds(run, number)
                if dt >= min_s or number >= 1 << 20:
                    break
                number = max(number * 2, int(number * min_s / max(dt, 1e-9) * 1.1))
        lat = []
        for _ in range(repeat):
            if flush is not None:
                flush()
            lat.append(self.repeat_seconds(run, number) / number)
        return lat, number

    def repeat_seconds(self, run: Callable[[], None], number: int) -> float:
        """Seconds `number` back-to-back calls of `run` take, until the device is done: the
        host's clock around them here; a GPU backend times them with its events instead."""
        import time
        t0 = time.perf_counter()
        for _ in range(number):
            run()
        self.synchronize()
        return time.perf_counter() - t0


_BACKENDS: dict[str, str] = {"cpu": "codegen.cpu:CpuBackend", "cuda": "codegen.cuda:CudaBackend"}
_INSTANCES: dict[tuple, Backend] = {}


def register_backend(name: str, factory: str | type) -> None:
    """Make `get_backend(name)` create `factory` ("module:Class" or the class itself)."""
    _BACKENDS[name] = factory
    for k in [k for k in _INSTANCES if k[0] == name]:
        del _INSTANCES[k]


def _entry_points() -> None:
    try:
        from importlib.metadata import entry_points
        for ep in entry_points(group="tensortune.backends"):
            _BACKENDS.setdefault(ep.name, ep.value)
    except Exception:  # a broken third-party distribution must not stop the built-ins
        pass


def backend_names() -> list[str]:
    _entry_points()
    return sorted(_BACKENDS)


def get_backend(name: str | Backend | None = None, settings: Settings | None = None) -> Backend:
    """The backend called `name` (default: the settings' backend), one instance per settings."""
    if isinstance(name, Backend):
        return name
    settings = resolve(settings)
    name = name or settings.backend
    key = (name, settings)
    if key in _INSTANCES:
        return _INSTANCES[key]
    if name not in _BACKENDS:
        _entry_points()
    if name not in _BACKENDS:
        raise BackendError(f"unknown backend '{name}' (known: {', '.join(backend_names())})")
    try:
        factory = load_object(_BACKENDS[name])
    except (ImportError, AttributeError) as e:
        raise BackendError(f"backend '{name}' cannot be loaded: {e}") from None
    inst = _INSTANCES[key] = factory(settings)
    return inst


def template_kind(name: str) -> str:
    """Which templates backend `name` runs (`Backend.template_kind`), without creating it:
    records of a target of kind `name` were made with those templates."""
    if name not in _BACKENDS:
        _entry_points()
    try:
        return getattr(load_object(_BACKENDS[name]), "template_kind", "cpu")
    except (KeyError, ImportError, AttributeError):
        return "cpu"

"""`interp`: a backend that runs loop modules in the Python interpreter, compiling nothing.

It exists to prove that the backend seam is real: this module lives in tests, registers
itself when imported (a plugin: `--plugin tests.interp_backend`,
`runtime.load(..., plugins=["tests.interp_backend"])`; the tuner's worker processes import
the plugins their parent loaded), and the tuner, the runtime and the templates run on it
unchanged. It is also the smallest worked example for the author of the next backend
(docs/backends.md).

The loop module is rendered by `codegen.source.render` with no decorator and a header that
gives the bodies what numba gave them: `prange` (an ordinary `range`: each copy strides over
its own work items) and `math.*` with numba's semantics (float32 in, float32 out; IEEE
results such as inf and nan instead of OverflowError or ValueError). `call` runs the copies
t = 0..T-1 one after another under `np.errstate(all="ignore")`, so integer wrap-around and
division by zero give NumPy's results quietly, as numba's `error_model="numpy"` does.

Pure Python loops are slow: use it on tiny shapes only.
"""
from __future__ import annotations

import hashlib
import linecache
import platform
import time

import numpy as np

from codegen.backend import Artifact, Backend, BackendError, register_backend
from codegen.build import CompileError
from codegen.source import render
from codegen.target import Target
from schedules.loopnest import LoopModule

# `np` names of the math functions whose Python versions raise where numba returns inf/nan
_NUMPY_MATH = {"exp": "exp", "expm1": "expm1", "log": "log", "log1p": "log1p", "log2": "log2", "log10": "log10",
               "sqrt": "sqrt", "fmod": "fmod", "sin": "sin", "cos": "cos", "tan": "tan",
               "asin": "arcsin", "acos": "arccos", "atan": "arctan", "atan2": "arctan2", "sinh": "sinh",
               "cosh": "cosh", "tanh": "tanh", "asinh": "arcsinh", "acosh": "arccosh", "atanh": "arctanh"}

HEADER = f'''import math as _pymath
import types as _types
import numpy as np

prange = range   # a parallel loop is an ordinary loop here: copies stride over their own items
math = _types.SimpleNamespace(**{{_n: getattr(_pymath, _n) for _n in dir(_pymath) if not _n.startswith("_")}})
for _name, _np_name in {_NUMPY_MATH!r}.items():
    setattr(math, _name, getattr(np, _np_name))   # numba's math: the argument's type, IEEE inf/nan


def index_in(g, size):   # codegen.checks.index_in, in Python
    g = g + size if g < 0 else g
    if g < 0 or g >= size:
        raise IndexError("an index is out of range")
    return g


def _tile_runs(n_k, a_base=0, b_base=0):
    """tile_fma's k runs as (A offset, B offset, count): n_k itself, or its nest form (outer
    (count, a_stride, b_stride) levels around an inner count or (a_offset, b_offset, count) segments)."""
    if not isinstance(n_k, tuple):
        yield a_base, b_base, n_k
    elif len(n_k) == 1:
        inner = n_k[0]
        for a_seg, b_seg, count in (inner if isinstance(inner, tuple) else ((0, 0, inner),)):
            yield a_base + a_seg, b_base + b_seg, count
    else:
        count, a_step, b_step = n_k[0]
        for i in range(count):
            yield from _tile_runs(n_k[1:], a_base + i * a_step, b_base + i * b_step)


def tile_fma(A, a_offsets, a_kstride, B, b_offset, b_kstride, n_k, C, c_offset, c_rowstride, accumulate, NR, LANES):
    """codegen.vector_tile.tile_fma (an LLVM intrinsic there), element by element: the plain and
    the nest form of n_k; C's tile row-major (c_rowstride an int) or column-major and cut to m x n
    ((c_colstride, m, n))."""
    a, b, c = A.reshape(-1), B.reshape(-1), C.reshape(-1)
    assert np.shares_memory(c, C), "tile_fma: C must be contiguous"
    columns = isinstance(c_rowstride, tuple)
    rows, cols = (c_rowstride[1], c_rowstride[2]) if columns else (len(a_offsets), NR)
    for r, ao in enumerate(a_offsets[:rows]):
        for j in range(cols):
            s = np.float32(0.0)
            for a_run, b_run, count in _tile_runs(n_k, 0, b_offset):
                for k in range(count):
                    s += a[ao + a_run + k * a_kstride] * b[b_run + k * b_kstride + j]
            at = c_offset + (j * c_rowstride[0] + r if columns else r * c_rowstride + j)
            c[at] = c[at] + s if accumulate else s
'''


def _no_decorator(fn) -> str:
    return ""


class InterpBackend(Backend):
    name = "interp"

    def target(self) -> Target:
        return Target.make("interp", name=f"CPython {platform.python_version()} interpreter",
                           threads=self.settings.num_threads, python=platform.python_version(), numpy=np.__version__)

    def render(self, module: LoopModule) -> str:
        banner = (f"interpreted by tests/interp_backend.py -- {module.meta.get('template', '?')}\n"
                  f"target {self.target().key}")
        return render(module, banner, header=HEADER, decorator=_no_decorator, helpers=lambda bodies: "")

    def compile(self, module: LoopModule) -> Artifact:
        t0 = time.perf_counter()
        src = self.render(module)
        key = hashlib.sha256(src.encode()).hexdigest()[:24]
        try:
            compile(src, _filename(key), "exec")   # syntax only: the interpreter has no more to check
        except SyntaxError as e:
            raise CompileError(f"SyntaxError: {e}") from None
        return Artifact(self.name, key, self.target().key, src, tuple(f.name for f in module.functions),
                        compile_s=time.perf_counter() - t0)

    def load(self, artifact: Artifact) -> dict:
        if artifact.backend != self.name:
            raise BackendError(f"an artifact of backend '{artifact.backend}' cannot run on '{self.name}'")
        name = _filename(artifact.key)
        linecache.cache[name] = (len(artifact.source), None, artifact.source.splitlines(True), name)  # tracebacks
        namespace = {"__name__": f"tensortune_interp_{artifact.key}"}
        exec(compile(artifact.source, name, "exec"), namespace)
        return {f: namespace[f] for f in artifact.functions}

    def call(self, fn, args: list, items: int, parallel: bool, grid=(), block=()) -> None:
        copies = max(1, min(self.settings.num_threads, items)) if parallel else 1
        with np.errstate(all="ignore"):
            for t in range(copies):
                fn(*args, t, copies)


def _filename(key: str) -> str:
    return f"<interp kernel {key}>"


register_backend("interp", InterpBackend)

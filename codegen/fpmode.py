"""Denormal floats flushed to zero while tensortune's CPU kernels run (x86 MXCSR FTZ and DAZ).

An operation on a denormal float (|x| < 1.2e-38) takes a microcode assist on Intel cores,
~100 cycles instead of one. Softmax over a masked attention row makes them: e^(-10000 - m)
rounds to the smallest normal, times 1 / sum it is denormal. Measured on an Intel Xeon
(AVX-512): BERT-small's attention context matmul (64 x 32x32 @ 32x64) on such
probabilities 2.0 ms against 0.054 ms on normal ones (NumPy's: 3.9 vs 0.06 ms); inside the
model it was 60 % of the call, 107x onnxruntime's step. Inference runtimes flush them
(TensorFlow around each op, PyTorch's `set_flush_denormal`); a flushed value is off by less
than 1.2e-38, far inside `ir.accuracy`'s tolerance.

The mode is a per-thread register. `flushed()` sets it around a model call or a measurement
and restores the caller's, so the user's own NumPy code keeps IEEE denormals; the worker
threads of `codegen.cpu.parallel_for` only run kernels and set it once (`flush_here`).
Elsewhere than x86-64 both are no-ops.
"""
from __future__ import annotations

import functools
import platform

AVAILABLE = platform.machine().lower() in ("x86_64", "amd64")
FTZ_DAZ = 0x8040   # MXCSR bit 15: results flushed to zero; bit 6: denormal inputs read as zero

@functools.lru_cache(maxsize=None)
def _compiled():
    """(mxcsr, set_mxcsr, swap_in) as numba functions, defined at first use: numba must not be
    touched before `codegen.cpu` has chosen the process's CPU features (`_use_wide_vectors`)."""
    import codegen.cpu  # noqa: F401  (first: numba's CPU features are fixed at its first compile)
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    i32, i8p = ir.IntType(32), ir.IntType(8).as_pointer()

    def csr_call(builder, name: str, slot) -> None:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p]), name)
        builder.call(fn, [builder.bitcast(slot, i8p)])

    @intrinsic
    def get(typingctx):
        def codegen(context, builder, sig, args):
            slot = cgutils.alloca_once(builder, i32)
            csr_call(builder, "llvm.x86.sse.stmxcsr", slot)
            return builder.load(slot)
        return types.uint32(), codegen

    @intrinsic
    def put(typingctx, value):
        def codegen(context, builder, sig, args):
            slot = cgutils.alloca_once(builder, i32)
            builder.store(args[0], slot)
            csr_call(builder, "llvm.x86.sse.ldmxcsr", slot)
            return context.get_dummy_value()
        return types.void(types.uint32), codegen

    @njit(nogil=True, cache=True)
    def mxcsr():
        return get()

    @njit(nogil=True, cache=True)
    def set_mxcsr(value):
        put(value)

    @njit(nogil=True, cache=True)
    def swap_in(bits):
        """The register as it was; `bits` set in it."""
        old = get()
        put(old | bits)
        return old

    return mxcsr, set_mxcsr, swap_in


def mxcsr() -> int:
    """This thread's MXCSR register."""
    return int(_compiled()[0]())


class flushed:
    """`with flushed():` FTZ and DAZ set in this thread, the register restored after (nests)."""
    __slots__ = ("_old",)

    def __enter__(self):
        self._old = _compiled()[2](FTZ_DAZ) if AVAILABLE else None
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            _compiled()[1](self._old)


def flush_here() -> None:
    """FTZ and DAZ set in this thread for good: for threads that only run kernels."""
    if AVAILABLE:
        _compiled()[2](FTZ_DAZ)

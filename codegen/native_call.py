"""A compiled kernel called from native code: its machine-code address, a trampoline, an argument block.

Why: a pool thread that returns to Python between copies must take the GIL, and on a 2-vCPU
KVM guest a thread waiting for it is woken by a futex 0.1-4 ms later (measured,
experiments/bench_overhead.md): mid-sized kernels then ran no faster on 2 threads than on 1.
`codegen.spin.serve_copies` runs copies without Python: it calls
`tramp(fn, block, t, T)`, where `fn` is the address of the kernel numba compiled (numba's own
calling convention), `block` an int64 array holding every argument but (t, T) as words (an
array: its data pointer, size, item size, shape, strides; a scalar: its bits), and `tramp`
a small function, built once per signature with llvmlite, that rebuilds the arguments from the
words and calls `fn`. Only kernels compiled for one explicit signature whose last two
parameters are (t, T) qualify (`entry`); anything else returns None and runs as before.
The block is packed in Python from the arrays of one call: the caller keeps those arrays alive
while the copies run.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

_lock = threading.Lock()
_trampolines: dict = {}     # signature -> (address, the library that holds it)


@dataclass(frozen=True)
class NativeEntry:
    """How a pool thread calls one kernel: `address` and `trampoline` are machine-code
    addresses; `pack(args)` the argument block for its arguments without (t, T)."""
    fn: object
    address: int
    trampoline: int
    kinds: tuple   # per argument: ("array", ndim), ("int", bits), ("float", bits), ("bool", 8)

    def pack(self, args) -> np.ndarray:
        words = []
        for a, (kind, n) in zip(args, self.kinds):
            if kind == "array":
                if a.ndim != n:
                    raise TypeError(f"expected a {n}-d array, got {a.ndim}-d")
                words += [a.ctypes.data, a.size, a.itemsize, *a.shape, *a.strides]
            elif kind == "float":
                words.append(int(np.array(a, np.float32 if n == 32 else np.float64)
                                 .view(np.int32 if n == 32 else np.int64)))
            else:   # integers and booleans; an unsigned one past 2^63 keeps its bits
                v = int(a)
                words.append(v - (1 << 64) if v >= 1 << 63 else v)
        return np.array(words, np.int64)


def _kinds(argtypes) -> tuple | None:
    from numba import types
    kinds = []
    for ty in argtypes:
        if (isinstance(ty, types.Array) and ty.ndim > 0
                and isinstance(ty.dtype, (types.Integer, types.Float, types.Boolean))):
            kinds.append(("array", ty.ndim))
        elif isinstance(ty, types.Boolean):
            kinds.append(("bool", 8))
        elif isinstance(ty, types.Integer):
            kinds.append(("int", ty.bitwidth))
        elif isinstance(ty, types.Float):
            kinds.append(("float", ty.bitwidth))
        else:
            return None
    return tuple(kinds)


def entry(fn) -> NativeEntry | None:
    """`fn`'s native entry, or None where it has none (not numba, not one explicit signature
    ending in (int64 t, int64 T), an argument type the block does not carry, a numba whose
    internals differ)."""
    cached = getattr(fn, "_tensortune_native", False)
    if cached is not False:
        return cached
    made = None
    try:
        from numba import types
        sigs = list(getattr(fn, "signatures", ()))
        if len(sigs) == 1 and not getattr(fn, "_can_compile", True):
            argtypes = tuple(sigs[0])
            kinds = _kinds(argtypes[:-2])
            if len(argtypes) >= 2 and all(t == types.int64 for t in argtypes[-2:]) and kinds is not None:
                cres = fn.overloads[sigs[0]]
                if cres.signature.return_type == types.none:
                    address = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
                    made = NativeEntry(fn, address, trampoline(argtypes), kinds)
    except Exception:   # numba's internals as this module reads them: absent, no native path
        made = None
    try:
        fn._tensortune_native = made
    except AttributeError:
        pass
    return made


def trampoline(argtypes) -> int:
    """The address of `i32 tramp(i64 fn, i64 block, i64 t, i64 T)` for kernels of `argtypes`
    (their last two the int64 t, T): the words of `block` made back into numba's arguments,
    `fn` called with numba's calling convention, its status returned (0: no exception)."""
    key = tuple(argtypes)
    with _lock:
        if key not in _trampolines:
            _trampolines[key] = _build(key, f"tensortune_trampoline_{len(_trampolines)}")
        return _trampolines[key][0]


def _build(argtypes: tuple, name: str):
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    ctx = cpu_target.target_context
    i64 = ir.IntType(64)
    with global_compiler_lock:
        lib = ctx.codegen().create_library(name)
        mod = lib.create_ir_module(name)
        fn = ir.Function(mod, ir.FunctionType(ir.IntType(32), [i64, i64, i64, i64]), name)
        b = ir.IRBuilder(fn.append_basic_block())
        address, block_at, t, T = fn.args
        block = b.inttoptr(block_at, i64.as_pointer())
        at = [0]

        def word():
            v = b.load(b.gep(block, [ir.Constant(i64, at[0])]))
            at[0] += 1
            return v
        values = []
        for ty in argtypes[:-2]:
            if isinstance(ty, types.Array):
                ary = ctx.make_array(ty)(ctx, b)
                data = b.inttoptr(word(), ary.data.type)
                word()   # the size: numba's populate_array computes it from the shape
                itemsize = word()
                shape = [word() for _ in range(ty.ndim)]
                strides = [word() for _ in range(ty.ndim)]
                ctx.populate_array(ary, data=data, shape=cgutils.pack_array(b, shape),
                                   strides=cgutils.pack_array(b, strides), itemsize=itemsize, meminfo=None)
                values.append(ary._getvalue())
            elif isinstance(ty, types.Float):
                bits = ir.IntType(ty.bitwidth)
                w = word()
                values.append(b.bitcast(w if ty.bitwidth == 64 else b.trunc(w, bits), ctx.get_value_type(ty)))
            else:   # integers and booleans
                lt = ctx.get_value_type(ty)
                w = word()
                values.append(w if lt.width == 64 else (b.icmp_unsigned("!=", w, ir.Constant(i64, 0))
                                                        if lt.width == 1 else b.trunc(w, lt)))
        values += [t, T]
        fnty = ctx.call_conv.get_function_type(types.none, list(argtypes))
        flat = ctx.call_conv._get_arg_packer(list(argtypes)).as_arguments(b, values)
        ret = cgutils.alloca_once(b, fnty.args[0].pointee)
        exc = cgutils.alloca_once(b, fnty.args[1].pointee)
        b.ret(b.call(b.inttoptr(address, fnty.as_pointer()), [ret, exc] + list(flat)))
        lib.add_ir_module(mod)
        lib.finalize()
        return lib.get_pointer_to_function(name), lib

"""Atomic load, store and compare-and-swap on an int64 mailbox; a bounded nogil spin on one word.

What `codegen.cpu`'s thread pool needs to hand work over without waking a sleeping thread:
a Python `SimpleQueue` handoff costs ~18 µs on a 2-vCPU KVM guest (the idle vCPU halts and
is woken by an IPI), a write the other thread is spinning on costs well under one.
Only x86-64 Linux has the spin (`pause`, `rdtsc`, `sched_yield`); elsewhere `AVAILABLE` is
False and the pool blocks at once.
"""
from __future__ import annotations

import platform
import sys
import time

AVAILABLE = platform.machine().lower() in ("x86_64", "amd64") and sys.platform.startswith("linux")

if AVAILABLE:
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def _word(context, builder, aryty, ary, i):
        return cgutils.get_item_pointer(context, builder, aryty, context.make_array(aryty)(context, builder, ary), [i])

    @intrinsic
    def _load(typingctx, ary, i):
        def codegen(context, builder, sig, args):
            return builder.load_atomic(_word(context, builder, sig.args[0], *args), "seq_cst", 8)
        return types.int64(ary, types.intp), codegen

    @intrinsic
    def _store(typingctx, ary, i, v):
        def codegen(context, builder, sig, args):
            builder.store_atomic(args[2], _word(context, builder, sig.args[0], args[0], args[1]), "seq_cst", 8)
            return context.get_dummy_value()
        return types.void(ary, types.intp, types.int64), codegen

    @intrinsic
    def _cas(typingctx, ary, i, old, new):
        def codegen(context, builder, sig, args):
            ptr = _word(context, builder, sig.args[0], args[0], args[1])
            return builder.extract_value(builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst"), 1)
        return types.boolean(ary, types.intp, types.int64, types.int64), codegen

    def _call_ignoring_result(name: str, returns):
        """An intrinsic calling the argument-less external `name` for its effect."""
        @intrinsic
        def call(typingctx):
            def codegen(context, builder, sig, args):
                builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(returns, []), name), [])
                return context.get_dummy_value()
            return types.void(), codegen
        return call

    _pause = _call_ignoring_result("llvm.x86.sse2.pause", ir.VoidType())
    _yield = _call_ignoring_result("sched_yield", ir.IntType(32))

    @intrinsic
    def _ticks(typingctx):
        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                                "llvm.readcyclecounter")
            return builder.call(fn, [])
        return types.int64(), codegen

    @njit(nogil=True, cache=True)
    def load(box, i):
        return _load(box, i)

    @njit(nogil=True, cache=True)
    def store(box, i, v):
        _store(box, i, v)

    @njit(nogil=True, cache=True)
    def claim(box, i, old, new):
        """box[i] = new if it is `old` (compare-and-swap): whether this thread won it."""
        return _cas(box, i, old, new)

    @njit(nogil=True, cache=True)
    def store_load(box, i, v, j):
        """box[i] = v, then box[j]: one side of a flag-then-check handshake (seq_cst: of two
        threads doing this on crossed words, at least one sees the other's store)."""
        _store(box, i, v)
        return _load(box, j)

    @njit(nogil=True, cache=True)
    def ticks():
        return _ticks()

    @njit(nogil=True, cache=True)
    def spin_wait(box, i, old, max_ticks):
        """Whether box[i] changed from `old` within `max_ticks` TSC ticks (spun, GIL released).
        Yields the core between looks: on a machine busier than its cores, a spinner would
        otherwise hold one for its whole time slice from the thread it waits for."""
        if _load(box, i) != old:
            return True
        start = _ticks()
        while _ticks() - start < max_ticks:
            for _ in range(8):
                _pause()
            if _load(box, i) != old:
                return True
            _yield()
            if _load(box, i) != old:
                return True
        return False

    @njit(nogil=True, cache=True)
    def publish_and_wait(box, done, value, waiter, gen, old, max_ticks):
        """A worker's end of a task in one GIL release: box[done] = value; then 2 when the
        caller sleeps on box[waiter] (set there, cleared here: the worker must wake it), else
        whether box[gen] left `old` within `max_ticks` (1) or not (0)."""
        _store(box, done, value)
        if _load(box, waiter) != 0:
            _store(box, waiter, 0)
            return 2
        return 1 if spin_wait(box, gen, old, max_ticks) else 0


_TICKS_PER_S: float | None = None


def ticks_per_second() -> float:
    """The TSC rate, measured once against `time.perf_counter` over ~2 ms."""
    global _TICKS_PER_S
    if _TICKS_PER_S is None:
        ticks()
        t0, c0 = time.perf_counter(), ticks()
        while time.perf_counter() - t0 < 0.002:
            pass
        _TICKS_PER_S = (ticks() - c0) / (time.perf_counter() - t0)
    return _TICKS_PER_S

"""Atomic load, store and compare-and-swap on an int64 mailbox; a bounded nogil spin on one word.

What `codegen.cpu`'s thread pools need to hand work over without waking a sleeping thread:
a Python `SimpleQueue` handoff costs ~18 µs on a 2-vCPU KVM guest (the idle vCPU halts and
is woken by an IPI), a write the other thread is spinning on costs well under one.
Only x86-64 Linux has the spin (`pause`, `rdtsc`, `sched_yield`); elsewhere `AVAILABLE` is
False and the pool blocks at once.

The native pool's side lives here too (`serve_copies`, `post_copies`, `run_here`): its threads
never run Python. A task is copies 0..V-1 of one kernel, called through a trampoline
(`codegen.native_call`); every thread, the caller included, claims the next unrun copy from one
word (`NEXT`: the task's generation, its copy count and the next copy, so a stale claim fails)
until none is left, so a thread that runs slower (a vCPU its host shares) simply runs fewer.
A thread with nothing to do spins, then sleeps on a futex on the generation word.
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


# the native pool's mailbox: int64 words, the fields that different threads write on separate lines
ROW = 8
N_GEN, N_SLEEPERS, N_NEXT, N_FINISHED, N_STATUS, N_TASK = 0, ROW, 2 * ROW, 3 * ROW, 4 * ROW, 5 * ROW
N_FN, N_TRAMP, N_BLOCK, N_COPIES = N_TASK, N_TASK + 1, N_TASK + 2, N_TASK + 3
N_READY = N_STATUS + 1               # pool threads that entered `serve_copies`
N_RAN = N_STATUS + 2                 # copies the pool threads ran (the caller's not counted)
N_WORDS = 6 * ROW
COPY_BITS = 12                       # NEXT = gen << 24 | end << 12 | start: the copies not yet claimed
MAX_COPIES = (1 << COPY_BITS) - 1
_MASK = MAX_COPIES

if AVAILABLE:
    _I64 = ir.IntType(64)

    def _box_address(context, builder, aryty, ary, i):
        return builder.ptrtoint(_word(context, builder, aryty, ary, i), _I64)

    @intrinsic
    def _call_copy(typingctx, tramp, fn, block, t, T):
        """i32 tramp(fn, block, t, T): a trampoline of `codegen.native_call`, by address."""
        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(32), [_I64, _I64, _I64, _I64])
            return builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))
        return types.int32(tramp, fn, block, t, T), codegen

    def _futex(op: int):
        @intrinsic
        def futex(typingctx, ary, i, val):
            """syscall(SYS_futex, &ary[i], op, val, NULL): FUTEX_WAIT_PRIVATE sleeps while the word's
            low 32 bits equal `val` (little-endian); FUTEX_WAKE_PRIVATE wakes up to `val` sleepers."""
            def codegen(context, builder, sig, args):
                fnty = ir.FunctionType(_I64, [_I64], var_arg=True)
                fn = cgutils.get_or_insert_function(builder.module, fnty, "syscall")
                addr = _box_address(context, builder, sig.args[0], args[0], args[1])
                val = builder.trunc(args[2], ir.IntType(32))
                return builder.call(fn, [ir.Constant(_I64, 202), addr, ir.Constant(ir.IntType(32), op), val,
                                         ir.Constant(_I64, 0)])
            return types.int64(ary, types.intp, types.int64), codegen
        return futex

    _futex_wait = _futex(128)   # FUTEX_WAIT | FUTEX_PRIVATE_FLAG
    _futex_wake = _futex(129)   # FUTEX_WAKE | FUTEX_PRIVATE_FLAG

    @njit(nogil=True, cache=True)
    def _add(box, i, d):
        while True:
            v = _load(box, i)
            if _cas(box, i, v, v + d):
                return v + d

    @njit(nogil=True, cache=True)
    def run_copies(box, gen, from_end):
        """Claim and run copies of task `gen` until none is left unclaimed; returns how many ran
        here. The caller claims from the first copy up, pool threads (`from_end`) from the last
        down: on threads of equal speed each runs the same copies call after call, so the lines
        a copy writes stay in its core's cache (claimed in turns, a 1x1 conv's output moved
        between the cores on every call: 2 threads ran it no faster than one). Each one is
        counted in N_FINISHED, a failing one's status kept in N_STATUS. The task's fields are
        read only after a claim succeeded: until every copy finished, the caller does not post
        another."""
        ran = 0
        while True:
            w = _load(box, N_NEXT)
            end, start = (w >> COPY_BITS) & _MASK, w & _MASK
            if (w >> (2 * COPY_BITS)) != gen or start >= end:
                return ran
            if from_end:
                v, claimed = end - 1, w - (1 << COPY_BITS)
            else:
                v, claimed = start, w + 1
            if _cas(box, N_NEXT, w, claimed):
                status = _call_copy(box[N_TRAMP], box[N_FN], box[N_BLOCK], v, box[N_COPIES])
                if status != 0:
                    _store(box, N_STATUS, status)
                _add(box, N_FINISHED, 1)
                ran += 1

    @njit(nogil=True, cache=True)
    def serve_copies(box, max_ticks):
        """A pool thread's whole life: run the copies of each task posted, spin `max_ticks` for
        the next, then sleep on the generation word (N_SLEEPERS counts the sleepers: announce,
        then re-check, against the poster's store-then-load)."""
        seen = _load(box, N_GEN)
        _add(box, N_READY, 1)
        while True:
            if not spin_wait(box, N_GEN, seen, max_ticks):
                _add(box, N_SLEEPERS, 1)
                while _load(box, N_GEN) == seen:
                    _futex_wait(box, N_GEN, seen)
                _add(box, N_SLEEPERS, -1)
            seen = _load(box, N_GEN)
            ran = run_copies(box, seen, True)
            if ran:
                _add(box, N_RAN, ran)

    @njit(nogil=True, cache=True)
    def post_copies(box, gen, copies, fn, tramp, block):
        """Post task `gen` (the previous one has finished) and wake the sleepers."""
        box[N_FN], box[N_TRAMP], box[N_BLOCK], box[N_COPIES] = fn, tramp, block, copies
        _store(box, N_FINISHED, 0)
        _store(box, N_STATUS, 0)
        _store(box, N_NEXT, (gen << (2 * COPY_BITS)) | (copies << COPY_BITS))
        _store(box, N_GEN, gen)
        if _load(box, N_SLEEPERS) != 0:
            _futex_wake(box, N_GEN, 1 << 30)

    @njit(nogil=True, cache=True)
    def post_and_run(box, gen, copies, fn, tramp, block):
        """The caller's whole task `gen`, in one GIL release: post it (`post_copies`), run its
        share of the copies, wait for the others' (spun, yielding the core between looks).
        Returns the task's status (0: every copy ran without an exception)."""
        post_copies(box, gen, copies, fn, tramp, block)
        run_copies(box, gen, False)
        while _load(box, N_FINISHED) != copies:
            for _ in range(8):
                _pause()
            if _load(box, N_FINISHED) == copies:
                break
            _yield()
        return _load(box, N_STATUS)


    @njit(nogil=True, cache=True)
    def run_program(box, gen, table, stamps):
        """Kernel calls in order, with no Python between them: row i of `table` is (fn, tramp,
        block, copies) of one call (`codegen.native_call`); copies <= 1 runs it here as copy
        (0, 1), more posts it to the native pool as task gen + 1, gen + 2, ... (`post_and_run`).
        stamps[i] gets the TSC before row i, stamps[n] after the last: each call's time, for
        ~20 cycles a call. Returns the last task's generation, or -1 - i where row i failed
        (rows after it not run)."""
        for i in range(table.shape[0]):
            stamps[i] = _ticks()
            copies = table[i, 3]
            if copies <= 1:
                status = _call_copy(table[i, 1], table[i, 0], table[i, 2], 0, 1)
            else:
                gen += 1
                status = post_and_run(box, gen, copies, table[i, 0], table[i, 1], table[i, 2])
            if status != 0:
                return -1 - i
        stamps[table.shape[0]] = _ticks()
        return gen


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

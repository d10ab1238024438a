"""The `cpu` backend: loop modules rendered to Python, compiled by numba.

Kernels are serial `nogil` numba functions; `call` runs copies of one on
threads, copy t of T handling its share of the work items (`parallel_for`): generated kernels
through the native pool, whose threads call them by address and never run Python
(`codegen.native_call`), other callables through a pool of Python threads. Numba's
`parallel=True` would compile each candidate about 3x slower (measured: 5 s ->
15 s for a dense register tile), and compile time is the tuner's main cost.

Each function compiles from its own file (`codegen.build.parts_for`), so helpers
shared by many kernels compile once. An artifact is the module's rendered source
plus, for each part, its source, numba's cache files (index and machine code) and
the source file's timestamp, which numba's index checks: written into another
process's (or machine's) private kernel cache, numba loads the machine code
instead of compiling. On a CPU that differs, numba's index has
no entry for it and compiles: correct, only slower.
"""
from __future__ import annotations

import os
import platform
import queue
import threading
import time
from functools import lru_cache

import numpy as np

from codegen import build as _build
from codegen import fpmode
from codegen.backend import Artifact, Backend

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


MIN_WORK_PER_THREAD = 1 << 18
"""Work units (FLOPs + bytes, `ir.workload.work_estimate`) a kernel needs per thread before a
second thread takes part: a kernel splits on 2 threads from 512 K units (~5 us here). With each
copy's items one contiguous run (`schedules.loopnest.thread_share`), on a 2-vCPU Emerald Rapids
KVM guest, untuned, 2 threads, processes taking turns, medians / onnxruntime's: 2^21 -> 2^18
took MobileNetV2 (96x96) 1.64-1.66x -> 1.37x, ViT-small 1.11-1.19x -> 1.05x, ResNet-18 (64x64)
1.20x -> 1.17x, BERT-small (seq 32) 0.84x -> 0.93x (2^19: 1.46x, 1.03x, -, 0.90x). On that
guest a line another core wrote costs a step ~3 ns to read: a step on one thread after a split
one reads half its input from the other core, so splitting the small kernels of a CNN too keeps
each thread on the channels it wrote. (2^21 came from the Zen 4 guest, items interleaved
between the threads: ResNet-18 5.3 ms with 2^25 -> 3.6-4.5 ms.) Kernels of Python callables
(no native entry) still go through the Python pool. Below it, tune's in-model check still times
kernels on every thread (`tuner.verify.SplitVerdict`)."""


SPIN_S = 5e-4
"""How long a pool thread spins (GIL released, yielding the core between looks) for its next
task after finishing one, and a caller for its workers' copies, before blocking. It covers
the Python between the 2-thread kernels of one model call and between back-to-back calls,
so those hand over by a memory write, not a wake-up (~18 µs on a 2-vCPU KVM guest, the idle
vCPU halted): measured there (experiments/bench_overhead.md, 2-thread handoff), the gaps
between consecutive 2-thread kernels of a call are 1-9 µs (median), 20 µs (p99), and a call's
own entry and exit 25-30 µs (p99 50). Short, because each spin is CPU time the process
burns idle: below 1 ms, `tuner.verify.settle` finds the process idle in its first 10 ms
window (SETTLE_BUSY x SETTLE_WINDOW_S), and a 1-thread candidate timed by the process's CPU
clock right after a 2-thread run is charged at most this."""

_ROW = 16   # int64 words between mailbox fields: written by different threads, kept on separate cache lines
_GEN, _SLEEP, _DONE, _WAITER, _CLAIM = 0, _ROW, 2 * _ROW, 3 * _ROW, 4 * _ROW


class _PySpin:
    """`codegen.spin`'s functions without atomics or spinning (not x86-64): every access is made
    holding the GIL, which orders them."""
    load = staticmethod(lambda box, i: int(box[i]))
    store = staticmethod(lambda box, i, v: box.__setitem__(i, v))
    spin_wait = staticmethod(lambda box, i, old, max_ticks: int(box[i]) != old)

    _claims = threading.Lock()

    @staticmethod
    def store_load(box, i, v, j):
        box[i] = v
        return int(box[j])

    @staticmethod
    def claim(box, i, old, new):
        with _PySpin._claims:   # a read then a write: the GIL may switch between them
            if box[i] != old:
                return False
            box[i] = new
            return True

    @staticmethod
    def publish_and_wait(box, done, value, waiter, gen, old, max_ticks):
        box[done] = value
        if box[waiter]:
            box[waiter] = 0
            return 2
        return int(box[gen] != old)


class _Worker:
    """Thread t of `parallel_for` (t >= 1) and its mailbox: the caller writes a task and bumps
    box[_GEN]; the thread claims it (box[_CLAIM], compare-and-swap), runs it, writes the
    generation to box[_DONE] and spins for the next one (`SPIN_S`), then sleeps on `wake`
    (box[_SLEEP] = 1 says so). A caller done with its own copy claims a task its thread has
    not claimed yet and runs it itself (only with `codegen.spin`: without, it waits): a
    running thread claims within a few µs of the post, so what is taken is the copy of a
    kernel shorter than that (better run serially) or of a thread that lost its core to
    other processes, for a time slice (ms): measured on the busy 2-vCPU guest, 0.1% of
    trivial 2-thread calls took 3.5 ms before this, 71 µs after. A caller that
    stopped spinning sleeps on `woken` (box[_WAITER] = 1). Flag then re-check on both sides
    (seq_cst atomics) means a post or a finish is either seen by the spinner or signalled to
    the sleeper; a stray signal only makes a sleeper re-check."""

    def __init__(self, pool: "_Pool", index: int):
        self.pool, self.box, self.gen = pool, np.zeros(5 * _ROW, np.int64), 0
        self.task, self.error = None, None
        self.wake, self.woken = queue.SimpleQueue(), queue.SimpleQueue()
        threading.Thread(target=self._serve, daemon=True, name=f"tensortune-{index}").start()

    def post(self, fn, args: tuple) -> None:
        sp, box = self.pool.spin, self.box
        self.task, self.error, self.gen = (fn, args), None, self.gen + 1
        if sp.store_load(box, _GEN, self.gen, _SLEEP):
            self.wake.put(None)

    def wait(self) -> BaseException | None:
        sp, box, gen = self.pool.spin, self.box, self.gen
        if self.pool.window and sp.claim(box, _CLAIM, gen - 1, gen):   # not started: run it here
            self._run()
            sp.store(box, _DONE, gen)
        elif not sp.spin_wait(box, _DONE, gen - 1, self.pool.window):
            while sp.load(box, _DONE) != gen:
                if sp.store_load(box, _WAITER, 1, _DONE) == gen:
                    sp.store(box, _WAITER, 0)
                    break
                self.woken.get()
        return self.error

    def _run(self) -> None:
        fn, args = self.task
        try:
            fn(*args)
        except BaseException as e:   # handed to the caller, which raises it
            self.error = e

    def _serve(self) -> None:
        fpmode.flush_here()   # this thread only runs kernels: denormals flushed for good
        sp, box, window = self.pool.spin, self.box, self.pool.window
        seen, new = 0, False
        while True:
            while not new and sp.load(box, _GEN) == seen:
                if sp.store_load(box, _SLEEP, 1, _GEN) == seen:
                    self.wake.get()
                sp.store(box, _SLEEP, 0)
            seen = sp.load(box, _GEN)
            if not sp.claim(box, _CLAIM, seen - 1, seen):   # the caller ran it
                new = bool(sp.spin_wait(box, _GEN, seen, window))
                continue
            self._run()
            r = sp.publish_and_wait(box, _DONE, seen, _WAITER, _GEN, seen, window)
            if r == 2:
                self.woken.put(None)
                r = sp.spin_wait(box, _GEN, seen, window)
            new = bool(r)


class _Pool:
    """Threads 1, 2, ... of `parallel_for` for callables without a native entry (a Python
    function, a numba function compiled on demand), started on first need and kept, spinning `SPIN_S`
    after each task. One caller at a time (`lock`); made anew in a forked child."""

    def __init__(self):
        from codegen import spin
        self.spin = spin if spin.AVAILABLE and SPIN_S > 0 else _PySpin
        self.window = int(SPIN_S * spin.ticks_per_second()) if self.spin is spin else 0
        self.lock, self.workers = threading.Lock(), []

    def get(self, workers: int) -> list:
        while len(self.workers) < workers:
            self.workers.append(_Worker(self, len(self.workers) + 1))
        return self.workers


class _NativePool:
    """Threads 1, 2, ... for kernels with a native entry (`codegen.native_call`): each lives in
    `codegen.spin.serve_copies` and never returns to Python, so no handoff waits for the GIL.
    A kernel on T threads runs as up to `COPIES_PER_THREAD` x T copies that every thread, the
    caller too, claims one at a time: a thread whose vCPU runs slower takes fewer. One caller
    at a time (`lock`); made anew in a forked child."""

    def __init__(self):
        from codegen import spin
        self.spin, self.box, self.gen = spin, np.zeros(spin.N_WORDS, np.int64), 0
        self.window = int(SPIN_S * spin.ticks_per_second())
        self.lock, self.threads = threading.Lock(), 0

    def _serve(self) -> None:
        fpmode.flush_here()   # this thread only runs kernels: denormals flushed for good
        self.spin.serve_copies(self.box, self.window)

    def _start(self, threads: int) -> None:
        """Start pool threads up to `threads` and wait (at most 5 s) until each runs natively:
        a thread still loading `serve_copies` needs the GIL, which a caller running kernel
        after kernel rarely leaves it (measured: its first few hundred calls all ran on the
        caller alone)."""
        from numba import types
        self.spin.serve_copies.compile((types.int64[::1], types.int64))   # loaded here, not in each thread
        while self.threads < threads:
            self.threads += 1
            threading.Thread(target=self._serve, daemon=True, name=f"tensortune-native-{self.threads}").start()
        deadline = time.monotonic() + 5.0
        while self.spin.load(self.box, self.spin.N_READY) < self.threads and time.monotonic() < deadline:
            time.sleep(0.0005)

    def run(self, entry, args: tuple, block_at: int, threads: int, copies: int) -> None:
        """Copies 0..copies-1 of `entry`'s kernel on `args` (`block_at`: the address of their
        packed words, kept alive by the caller)."""
        if self.threads < threads - 1:
            self._start(threads - 1)
        self.gen += 1
        if self.spin.post_and_run(self.box, self.gen, copies, entry.address, entry.trampoline, block_at) != 0:
            for t in range(copies):   # a copy raised: run them here, where the exception can be seen
                entry.fn(*args, t, copies)
            raise RuntimeError(f"kernel {getattr(entry.fn, '__name__', entry.fn)} failed on a pool thread")


COPIES_PER_THREAD = 4
"""Copies of a kernel per thread the native pool claims from (capped by its work items): on a
2-vCPU KVM guest one vCPU ran the same loop at half the other's speed, for seconds at a time
(taskset, one process per vCPU: 104 vs 222 us); T equal copies then take as long as the slow
one, 4T let the fast thread run more of them (a prototype, one run: naive 96^3 matmul 1.69x
faster on 2 threads with 4 copies a thread, 0.90x with one)."""


_pool: _Pool | None = None
_native: _NativePool | None = None
_pool_lock = threading.Lock()


def _the_pool() -> _Pool:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = _Pool()
    return _pool


def _the_native_pool() -> _NativePool:
    global _native
    if _native is None:
        with _pool_lock:
            if _native is None:
                _native = _NativePool()
    return _native


def _native_entry(fn):
    """`fn`'s native entry where the native pool can run it (x86-64 Linux, spinning on)."""
    from codegen import native_call, spin
    if not spin.AVAILABLE or SPIN_S <= 0:
        return None
    return native_call.entry(fn)


def _forget_pool() -> None:
    """In a forked child: the parent's threads are not there (and its locks may be held)."""
    global _pool, _native, _pool_lock
    _pool, _native, _pool_lock = None, None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def threads_for(threads: int, items: int | None, work: int | None) -> int:
    """How many threads run a kernel: at most `threads`, no more than its work `items`, and
    one per `MIN_WORK_PER_THREAD` of its work: handing a copy to a pool thread costs a few
    microseconds while it spins (`SPIN_S`), tens once it sleeps, more than a tiny kernel runs."""
    if items is not None:
        threads = min(threads, items)
    if work is not None:
        threads = min(threads, max(1, work // MIN_WORK_PER_THREAD))
    return max(1, threads)


def parallel_for(fn, args: tuple, threads: int, items: int | None = None, work: int | None = None) -> None:
    """fn(*args, t, T) for t in range(T); the calling thread runs t = 0, the pool's threads
    the others (or the calling thread too, while another caller has the pool).

    T is `threads`, cut by `threads_for` to the work items the kernel strides over and
    to its size (`work`) when given."""
    threads = threads_for(threads, items, work)
    if threads <= 1:
        fn(*args, 0, 1)
        return
    entry = _native_entry(fn)
    if entry is not None:
        block = entry.pack(args)
        _run_native(entry, args, block.ctypes.data, threads, _copies(threads, items))
        return
    pool = _the_pool()
    if not pool.lock.acquire(blocking=False):
        # another caller has the pool (another Python thread, or a kernel run by a pool thread):
        # the copies are independent, so run them here rather than wait for it
        for t in range(threads):
            fn(*args, t, threads)
        return
    try:
        workers = pool.get(threads - 1)
        for t in range(1, threads):
            workers[t - 1].post(fn, (*args, t, threads))
        try:
            fn(*args, 0, threads)
        finally:
            errors = [e for e in (w.wait() for w in workers[:threads - 1]) if e is not None]
    finally:
        pool.lock.release()
    if errors:
        raise errors[0]


def _copies(threads: int, items: int | None) -> int:
    from codegen.spin import MAX_COPIES
    return max(threads, min(items if items is not None else threads, threads * COPIES_PER_THREAD, MAX_COPIES))


def _run_native(entry, args: tuple, block_at: int, threads: int, copies: int) -> None:
    pool = _native or _the_native_pool()
    if not pool.lock.acquire(blocking=False):
        for t in range(threads):   # another caller has the pool: the copies are independent, run them here
            entry.fn(*args, t, threads)
        return
    try:
        pool.run(entry, args, block_at, threads, copies)
    finally:
        pool.lock.release()


def _same(args: tuple, before: tuple | None) -> bool:
    """Whether `args` are `before`'s arrays (the same objects) and equal scalars."""
    return before is not None and len(args) == len(before) and all(
        a is b or (not isinstance(a, np.ndarray) and not isinstance(b, np.ndarray) and a == b)
        for a, b in zip(args, before))


class _Spread:
    """A kernel run on T > 1 threads: `_Spread(fn, T, items)(*args)` is `parallel_for(fn, args, T,
    items)`; for the native pool the argument block of the last arguments is kept (a plan calls
    a step with the same tuple of the same buffers each time)."""
    __slots__ = ("fn", "threads", "items", "entry", "copies", "_packed")

    def __init__(self, fn, threads: int, items: int | None = None):
        self.fn, self.threads, self.items = fn, threads, items
        self.entry, self.copies = _native_entry(fn), _copies(threads, items)
        self._packed = None   # (args, their block, its address): one tuple, so that callers on two threads never mix them

    def __call__(self, *args) -> None:
        if self.entry is None:
            parallel_for(self.fn, args, self.threads, self.items)
            return
        packed = self._packed
        if packed is None or not _same(args, packed[0]):
            block = self.entry.pack(args)
            self._packed = packed = (args, block, block.ctypes.data)
        _run_native(self.entry, args, packed[2], self.threads, self.copies)


def _native_row(run, args: tuple):
    """(entry, its arguments, copies, threads) of one flat call where `spin.run_program` can run
    it: a kernel split over the native pool (`_Spread`), or one run here as (t, T) = (0, 1)."""
    if isinstance(run, _Spread):
        return (run.entry, args, run.copies, run.threads) if run.entry is not None else None
    if len(args) < 2 or args[-2:] != (0, 1) or not hasattr(run, "signatures"):
        return None
    entry = _native_entry(run)
    return (entry, args[:-2], 1, 1) if entry is not None else None


class _Batch:
    """Flat calls of fixed arguments run in order from one native loop (`spin.run_program`):
    no Python between kernels, no dispatch on their arguments. Called one by one from the
    executor's loop they cost ~0.7 us each more (measured on an Emerald Rapids guest, untuned,
    1 thread: ViT-small's 65 calls 0.93x the time, BERT-small 0.88x, 2 threads MobileNetV2 0.91x).
    Where another caller holds the native pool, the calls run one by one as before.
    `seconds()`: each call's seconds in the last run (the loop reads the TSC between calls), so
    a timed run of the model runs as a deployed one does."""
    __slots__ = ("calls", "table", "blocks", "threads", "failed", "stamps", "_python_s", "_spin")

    def __init__(self, calls: list, rows: list):
        from codegen import spin
        self._spin = spin   # bound once: an import statement in `__call__` cost every model call
        self.calls = list(calls)
        self.blocks = [entry.pack(args) for entry, args, _, _ in rows]   # kept alive: the table points at them
        self.table = np.array([(e.address, e.trampoline, b.ctypes.data, copies)
                               for (e, _, copies, _), b in zip(rows, self.blocks)], np.int64).reshape(len(rows), 4)
        self.threads = max(threads for *_, threads in rows)
        self.failed: int | None = None
        self.stamps = np.zeros(len(rows) + 1, np.int64)
        self._python_s: list | None = None   # where the last run went call by call from Python: their seconds

    def seconds(self) -> np.ndarray:
        """Seconds of each call in the last run."""
        if self._python_s is not None:
            return np.asarray(self._python_s)
        return np.diff(self.stamps) / self._spin.ticks_per_second()

    def __call__(self) -> None:
        pool = None
        if self.threads > 1:
            pool = _native or _the_native_pool()
            if not pool.lock.acquire(blocking=False):
                self._python_s, perf = [], time.perf_counter
                for self.failed, (run, args) in enumerate(self.calls):
                    t0 = perf()
                    run(*args)
                    self._python_s.append(perf() - t0)
                return
        self._python_s = None
        try:
            if pool is not None and pool.threads < self.threads - 1:
                pool._start(self.threads - 1)
            gen0 = pool.gen if pool is not None else 0
            got = self._spin.run_program(pool.box if pool is not None else _NO_BOX, gen0, self.table, self.stamps)
            if got >= 0:
                if pool is not None:
                    pool.gen = got
                return
            i = -1 - got
            if pool is not None:
                pool.gen = gen0 + int(np.count_nonzero(self.table[:i + 1, 3] > 1))
        finally:
            if pool is not None:
                pool.lock.release()
        self.failed = i
        run, args = self.calls[i]
        run(*args)   # the failing call again from Python, where its exception can be seen
        raise RuntimeError(f"kernel {getattr(run, '__name__', run)} failed in a native batch")


_NO_BOX = np.zeros(1, np.int64)   # `run_program`'s mailbox where no call uses the pool


class CpuBackend(Backend):
    name = "cpu"

    def target(self) -> Target:
        return Target.make("cpu", threads=self.settings.num_threads, **_host())

    def render(self, module: LoopModule) -> str:
        return _build.source_for(module, self.target())[0]

    def compile(self, module: LoopModule) -> Artifact:
        target = self.target()
        src, key = _build.source_for(module, target)
        parts = _build.parts_for(module, target)
        cm = _build.load_parts(src, key, parts, self.settings)
        files, shipped = {}, []
        for part in parts:
            part_files, mtime_ns = _build.part_files(part, self.settings)
            files.update(part_files)
            shipped.append({"key": part.key, "source": part.source, "functions": part.functions,
                            "mtime_ns": mtime_ns})
        return Artifact("cpu", key, target.key, src, tuple(f.name for f in module.functions), files, cm.compile_s,
                        cm.cached, meta={"parts": shipped})

    def has_cached(self, module: LoopModule) -> bool:
        """Whether this process or the kernel cache already holds the machine code of every
        function of `module`, so `compile` only loads it (tens of milliseconds, not seconds)."""
        return all(_build.part_cached(p, self.settings) for p in _build.parts_for(module, self.target()))

    def load(self, artifact: Artifact) -> dict:
        shipped = artifact.meta.get("parts")
        if shipped is None:   # a whole-module artifact
            _build.install_artifact(artifact, self.settings)
            return _build.load_source(artifact.source, artifact.key, list(artifact.functions),
                                      self.settings).functions
        parts = [_build.Part(p["key"], p["source"], tuple(p["functions"])) for p in shipped]
        _build.install_parts(parts, artifact.files, {p["key"]: p["mtime_ns"] for p in shipped}, self.settings)
        return _build.load_parts(artifact.source, artifact.key, parts, self.settings).functions

    def fp_mode(self):
        """Denormals flushed to zero in the calling thread (`codegen.fpmode`: ~100 cycles an
        operation on Intel cores otherwise), its own mode restored after."""
        return fpmode.flushed()

    def call(self, fn, args: list, items: int, parallel: bool, grid=(), block=()) -> None:
        parallel_for(fn, tuple(args), self.settings.num_threads if parallel else 1, items)

    def batch(self, calls: list):
        rows = [_native_row(run, tuple(args)) for run, args in calls]
        return _Batch(calls, rows) if rows and all(r is not None for r in rows) else None

    def launcher(self, items: int, parallel: bool, grid=(), block=(), work: int | None = None):
        """How a bound kernel's plan runs one `Call` step, decided once: fn -> (run, trailing
        args). On one thread that is the kernel function itself with (t, T) = (0, 1)."""
        threads = threads_for(self.settings.num_threads if parallel else 1, items, work)

        def make(fn):
            return (fn, (0, 1)) if threads <= 1 else (_Spread(fn, threads, items), ())
        return make

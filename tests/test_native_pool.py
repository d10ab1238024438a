"""The native pool (`codegen.cpu._NativePool`, `codegen.spin.serve_copies`, `codegen.native_call`):
kernels of one explicit signature ending in (t, T) run on threads that never return to Python."""
import multiprocessing
import time

import numpy as np
import pytest
from numba import njit

from codegen import cpu, native_call, spin
from tests.helpers import all_finish, within

pytestmark = pytest.mark.skipif(not spin.AVAILABLE, reason="the native pool needs codegen.spin (x86-64 Linux)")


@njit("void(float32[:, ::1], float64[:, :], float32, int64, boolean, int64, int64)", nogil=True, cache=True)
def _rows(x, out, k, shift, neg, t, T):
    """Rows t, t+T, ... of out = ±(x * k + shift + row index); `out` may be a strided view."""
    for i in range(t, x.shape[0], T):
        for j in range(x.shape[1]):
            v = x[i, j] * k + shift + i
            out[i, j] = -v if neg else v


@njit("void(int64[::1], int64[::1], int64, int64, int64)", nogil=True, cache=True)
def _meet(started, met, max_ticks, t, T):
    """Copy t says it started, then waits (bounded) until every copy has: met[t] = 1 only when
    all T ran at the same time, which serial copies on one thread never do."""
    spin.store(started, t, 1)
    begin = spin.ticks()
    while spin.ticks() - begin < max_ticks:
        n = 0
        for u in range(T):
            n += spin.load(started, u)
        if n == T:
            met[t] = 1
            return


@njit("void(float64[::1], int64, int64)", nogil=True, cache=True)
def _fails_on_copy_1(out, t, T):
    if t == 1:
        raise ValueError("copy 1 failed")
    out[t] = 1.0


@njit("void(int64[::1], int64, int64)", nogil=True, cache=True)
def _order(seq, t, T):
    """Copy t notes when it ran (run on one thread: seq[T] counts the copies run so far)."""
    seq[t] = seq[T]
    seq[T] += 1


def _expected(x, k, shift, neg):
    """The kernel run serially by numba's own dispatcher, which boxes the arguments itself."""
    out = np.empty(x.shape)
    _rows(x, out, np.float32(k), shift, neg, 0, 1)
    assert np.isfinite(out).all() and (out != 0).any()
    return out


def _within(seconds, fn):
    within(seconds, fn, "the native pool")


def test_entry_only_for_one_explicit_signature_ending_in_t_and_T():
    assert native_call.entry(_rows) is not None

    @njit(nogil=True)
    def lazy(x, t, T):
        x[t] = 1.0
    lazy(np.zeros(2), 0, 1)
    assert native_call.entry(lazy) is None                       # compiled on demand: may take others
    assert native_call.entry(lambda t, T: None) is None

    @njit("void(float64[::1], int32, int32)", nogil=True)
    def int32_threads(x, t, T):
        x[t] = 1.0
    assert native_call.entry(int32_threads) is None


def test_every_argument_kind_and_strided_output_over_many_calls():
    rng = np.random.default_rng(0)
    for threads in (2, 3):
        for k in range(300):
            x = rng.standard_normal((int(rng.integers(1, 40)), 5)).astype(np.float32)
            wide = np.full((x.shape[0], 10), np.nan)
            out = wide[:, ::2]                                   # strides of 16 bytes along a row
            neg = bool(k % 2)
            cpu.parallel_for(_rows, (x, out, np.float32(0.5 + k), k - 7, neg), threads, items=x.shape[0])
            np.testing.assert_array_equal(out, _expected(x, 0.5 + k, k - 7, neg))
            assert np.isnan(wide[:, 1::2]).all()                 # the columns between untouched


def test_the_plan_path_keeps_its_block_and_repacks_for_new_buffers():
    spread = cpu._Spread(_rows, 2, 64)
    assert spread.entry is not None and spread.copies == 2 * cpu.COPIES_PER_THREAD
    x = np.random.default_rng(1).standard_normal((64, 3)).astype(np.float32)
    out = np.zeros((64, 3))
    for k in range(200):
        spread(x, out, np.float32(k), 1, False)
        np.testing.assert_array_equal(out, _expected(x, k, 1, False))
    kept = spread._packed[1]
    spread(x, out, np.float32(199), 1, False)
    assert spread._packed[1] is kept                             # the same arrays and scalars: not repacked
    other = np.zeros((64, 3))
    spread(x, other, np.float32(2.0), 1, False)
    assert spread._packed[1] is not kept
    np.testing.assert_array_equal(other, _expected(x, 2.0, 1, False))


def test_copies_run_on_the_pool_threads_at_once_also_after_they_slept():
    """Each call after the spin window wakes the sleeping threads (futex); copies that wait for
    one another complete only when the pool ran them at the same time as the caller."""
    max_ticks = int(2.0 * spin.ticks_per_second())

    def calls():
        for _ in range(4):
            time.sleep(max(0.02, 10 * cpu.SPIN_S))
            ran = cpu._native.box[spin.N_RAN] if cpu._native is not None else 0
            started, met = np.zeros(3, np.int64), np.zeros(3, np.int64)
            cpu.parallel_for(_meet, (started, met, max_ticks), 3, items=3)
            assert met.tolist() == [1, 1, 1]
            assert cpu._native.box[spin.N_RAN] - ran == 2   # the pool threads' count of their copies
    _within(60, calls)


def test_a_failing_copy_raises_in_the_caller_and_the_pool_still_serves():
    for _ in range(3):
        with pytest.raises(ValueError, match="copy 1 failed"):
            cpu.parallel_for(_fails_on_copy_1, (np.zeros(2),), 2, items=2)
        x = np.ones((8, 2), np.float32)
        out = np.zeros((8, 2))
        cpu.parallel_for(_rows, (x, out, np.float32(3.0), 0, False), 2, items=8)
        np.testing.assert_array_equal(out, _expected(x, 3.0, 0, False))


def test_idle_pool_threads_sleep():
    x = np.ones((16, 4), np.float32)
    cpu.parallel_for(_rows, (x, np.zeros((16, 4)), np.float32(1.0), 0, False), 2, items=16)
    time.sleep(10 * cpu.SPIN_S)
    c0, w0 = time.process_time(), time.perf_counter()
    time.sleep(0.05)
    assert time.process_time() - c0 < 0.2 * (time.perf_counter() - w0)


def test_concurrent_callers_get_their_own_results():
    errors = []

    def caller(seed):
        x = np.random.default_rng(seed).standard_normal((29, 7)).astype(np.float32)
        for k in range(500):
            out = np.zeros((29, 7))
            cpu.parallel_for(_rows, (x, out, np.float32(k), seed, False), 2, items=29)
            if not np.array_equal(out, _expected(x, k, seed, False)):
                errors.append((seed, k))

    assert all_finish(caller, (10, 20)) and not errors


def _child(conn):
    x = np.random.default_rng(2).standard_normal((16, 4)).astype(np.float32)
    ok = True
    for k in range(50):
        out = np.zeros((16, 4))
        cpu.parallel_for(_rows, (x, out, np.float32(k), 0, False), 2, items=16)
        ok &= bool(np.array_equal(out, _expected(x, k, 0, False)))
    conn.send((ok, cpu._native.threads))


def test_forked_child_starts_its_own_pool():
    x = np.ones((16, 4), np.float32)
    cpu.parallel_for(_rows, (x, np.zeros((16, 4)), np.float32(1.0), 0, False), 2, items=16)
    assert cpu._native is not None                              # the parent's pool exists
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    p = ctx.Process(target=_child, args=(there,))
    p.start()
    assert here.poll(60), "the forked child hung in parallel_for"
    assert here.recv() == (True, 1)
    p.join(10)
    assert p.exitcode == 0


def test_one_plan_step_called_from_two_threads_with_their_own_buffers():
    """A `_Spread` keeps the block of its last arguments; two callers with different buffers
    must each run on their own (the one that finds the pool taken runs its copies itself)."""
    spread = cpu._Spread(_rows, 2, 32)
    errors = []

    def caller(seed):
        x = np.random.default_rng(seed).standard_normal((32, 6)).astype(np.float32)
        out = np.zeros((32, 6))
        for k in range(400):
            spread(x, out, np.float32(k), seed, False)
            if not np.array_equal(out, _expected(x, k, seed, False)):
                errors.append((seed, k))

    assert all_finish(caller, (1, 2)) and not errors


@njit("void(uint64[::1], uint64, int8, float64, int64, int64)", nogil=True, cache=True)
def _scalars(out, big, small, f, t, T):
    for i in range(t, out.shape[0], T):
        out[i] = big + np.uint64(i) + np.uint64(small + 128) + np.uint64(f)


def test_scalars_of_every_width_reach_the_kernel_unchanged():
    out, ref = np.zeros(16, np.uint64), np.zeros(16, np.uint64)
    args = (np.uint64(2 ** 63 + 5), np.int8(-100), 7.75)
    _scalars(ref, *args, 0, 1)
    cpu.parallel_for(_scalars, (out, *args), 2, items=16)
    np.testing.assert_array_equal(out, ref)
    assert ref[0] == 2 ** 63 + 5 + 28 + 7


def test_a_torch_exported_model_at_two_shapes_runs_its_split_kernels_on_the_pool(monkeypatch):
    """MobileNetV3 as torch.onnx (dynamo) wrote it, dynamic batch and image size, every kernel
    split over two threads: the same outputs as onnxruntime, and the pool threads ran copies."""
    import onnxruntime as ort

    import runtime
    from ir.settings import Settings
    from tests.real_models.cases import BY_NAME
    monkeypatch.setattr(cpu, "MIN_WORK_PER_THREAD", 1)
    path = str(__import__("pathlib").Path(__file__).parent / "real_models" / "mobilenetv3_dynamo.onnx")
    model = runtime.load(path, settings=Settings(threads=2))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    before = cpu._native.box[spin.N_RAN] if cpu._native is not None else 0
    for seed in (0, 1):
        feeds = BY_NAME["mobilenetv3_dynamo"].feeds(seed)
        ours, ref = model.run(feeds), sess.run(None, feeds)
        for o, r in zip(sess.get_outputs(), ref):
            np.testing.assert_allclose(ours[o.name], r, rtol=1e-4, atol=1e-5)
    assert cpu._native.box[spin.N_RAN] > before


def test_the_caller_claims_copies_from_the_front_pool_threads_from_the_back():
    """On threads of equal speed each runs the same copies call after call (and with contiguous
    shares, the same blocks of the output): the caller's claims go up from copy 0, a pool
    thread's down from the last; a claim for a finished task's generation runs nothing."""
    entry = native_call.entry(_order)
    for from_end, expected in ((False, [0, 1, 2, 3, 4]), (True, [4, 3, 2, 1, 0])):
        box, seq = np.zeros(spin.N_WORDS, np.int64), np.zeros(6, np.int64)
        block = entry.pack((seq,))
        spin.post_copies(box, 7, 5, entry.address, entry.trampoline, block.ctypes.data)
        assert spin.run_copies(box, 6, from_end) == 0          # a stale generation claims nothing
        assert spin.run_copies(box, 7, from_end) == 5
        assert seq[:5].tolist() == expected and box[spin.N_FINISHED] == 5
        assert spin.run_copies(box, 7, not from_end) == 0      # none left

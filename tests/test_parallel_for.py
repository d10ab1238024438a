"""`codegen.cpu.parallel_for`'s spinning pool: results, errors, sleep/wake, fork, concurrent callers."""
import multiprocessing
import queue
import threading
import time

import numpy as np
import pytest
from numba import njit

from codegen import cpu
from tests.helpers import all_finish, within


@njit(nogil=True, cache=True)
def _scaled_rows(x, out, k, t, T):
    """Rows t, t+T, ... of out = x * k + row index: each copy writes only its own rows."""
    for i in range(t, x.shape[0], T):
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] * k + i


def _within(seconds, fn):
    within(seconds, fn, "parallel_for")


def _serial(x, k):
    out = np.empty_like(x)
    _scaled_rows(x, out, k, 0, 1)
    return out


def test_two_threads_match_serial_over_many_consecutive_calls():
    x = np.random.default_rng(0).standard_normal((37, 19))
    for k in range(2000):
        out = np.full_like(x, np.nan)
        cpu.parallel_for(_scaled_rows, (x, out, float(k)), 2)
        assert np.array_equal(out, _serial(x, float(k))), k


def test_worker_error_reaches_caller_and_pool_still_serves():
    def fails_off_the_caller(t, T):
        if t == 1:
            raise ValueError("copy 1 failed")

    x = np.ones((8, 3))
    for _ in range(3):
        with pytest.raises(ValueError, match="copy 1 failed"):
            cpu.parallel_for(fails_off_the_caller, (), 2)
        out = np.zeros_like(x)
        cpu.parallel_for(_scaled_rows, (x, out, 2.0), 2)
        assert np.array_equal(out, _serial(x, 2.0))


def test_calls_after_the_spin_window_wake_the_sleeping_workers():
    x = np.random.default_rng(1).standard_normal((16, 4))

    def calls():
        for k in range(4):
            time.sleep(max(0.02, 10 * cpu.SPIN_S))   # workers and caller both past their spin
            out = np.zeros_like(x)
            cpu.parallel_for(_scaled_rows, (x, out, float(k)), 2)
            assert np.array_equal(out, _serial(x, float(k)))
            worker = cpu._the_pool().workers[0]
            assert cpu._the_pool().spin.load(worker.box, cpu._DONE) == worker.gen   # copy 1 ran on the worker
    _within(60, calls)


def test_a_slow_worker_copy_wakes_the_caller_that_stopped_spinning():
    """Copy 1 outlasts the caller's spin, so the caller sleeps and the worker must wake it."""
    out = np.zeros(2)

    def slow_off_the_caller(t, T):
        if t == 1:
            time.sleep(max(0.02, 10 * cpu.SPIN_S))
        out[t] += 1

    _within(60, lambda: [cpu.parallel_for(slow_off_the_caller, (), 2) for _ in range(5)])
    assert out.tolist() == [5, 5]


def test_a_copy_no_thread_starts_runs_on_the_caller():
    """A worker whose thread never claims its task (here: it has none), as one that lost its
    core for a time slice: the caller, done with its own, runs the copy and raises its error."""
    pool = cpu._the_pool()
    if not pool.window:
        pytest.skip("without codegen.spin the caller waits for its threads")
    w = object.__new__(cpu._Worker)
    w.pool, w.box, w.gen, w.task, w.error = pool, np.zeros(5 * cpu._ROW, np.int64), 0, None, None
    w.wake, w.woken = queue.SimpleQueue(), queue.SimpleQueue()
    ran = []

    def posts_and_waits():
        for _ in range(3):
            w.post(lambda: ran.append(threading.get_ident()), ())
            assert w.wait() is None and ran[-1] == threading.get_ident()
    _within(60, posts_and_waits)
    assert len(ran) == 3

    def fails():
        raise OSError("stolen copy")
    w.post(fails, ())
    errors = []
    _within(60, lambda: errors.append(w.wait()))
    assert isinstance(errors[0], OSError)


def test_a_callers_own_error_still_waits_for_the_others():
    out = np.zeros(2)

    def fails_on_the_caller(t, T):
        if t == 0:
            raise KeyError("copy 0")
        time.sleep(0.01)
        out[t] = 1

    with pytest.raises(KeyError):
        cpu.parallel_for(fails_on_the_caller, (), 2)
    assert out[1] == 1   # copy 1 had finished when the error came out


def test_spinning_ends():
    x = np.ones((16, 4))
    cpu.parallel_for(_scaled_rows, (x, np.zeros_like(x), 1.0), 2)
    time.sleep(10 * cpu.SPIN_S)
    c0, w0 = time.process_time(), time.perf_counter()
    time.sleep(0.05)
    assert time.process_time() - c0 < 0.2 * (time.perf_counter() - w0)   # no thread of ours still busy


def _child(conn):
    x = np.random.default_rng(2).standard_normal((16, 4))
    ok = True
    for k in range(50):
        out = np.zeros_like(x)
        cpu.parallel_for(_scaled_rows, (x, out, float(k)), 2)
        ok &= bool(np.array_equal(out, _serial(x, float(k))))
    conn.send((ok, len(cpu._the_pool().workers)))


def test_forked_child_runs_parallel_for():
    x = np.ones((16, 4))
    cpu.parallel_for(_scaled_rows, (x, np.zeros_like(x), 1.0), 2)   # the parent's pool exists
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    p = ctx.Process(target=_child, args=(there,))
    p.start()
    assert here.poll(60), "the forked child hung in parallel_for"
    assert here.recv() == (True, 1)
    p.join(10)
    assert p.exitcode == 0


def test_concurrent_callers_get_their_own_results():
    errors = []

    def caller(seed):
        x = np.random.default_rng(seed).standard_normal((29, 7))
        for k in range(500):
            out = np.zeros_like(x)
            cpu.parallel_for(_scaled_rows, (x, out, float(k + seed)), 2)
            if not np.array_equal(out, _serial(x, float(k + seed))):
                errors.append((seed, k))

    assert all_finish(caller, (10, 20)) and not errors


def test_nested_call_from_a_copy_runs():
    x = np.random.default_rng(3).standard_normal((12, 5))
    outs = [np.zeros_like(x), np.zeros_like(x)]

    def outer(t, T):   # each copy runs a 2-thread kernel itself: the pool is taken, it runs serially
        cpu.parallel_for(_scaled_rows, (x, outs[t], 3.0), 2)

    cpu.parallel_for(outer, (), 2)
    assert all(np.array_equal(o, _serial(x, 3.0)) for o in outs)


def test_the_blocking_pool_without_spin_gives_the_same_results(monkeypatch):
    """What runs where `codegen.spin` is unavailable (not x86-64 Linux) or SPIN_S is 0."""
    monkeypatch.setattr(cpu, "SPIN_S", 0)
    monkeypatch.setattr(cpu, "_pool", None)
    assert cpu._the_pool().spin is cpu._PySpin
    x = np.random.default_rng(4).standard_normal((21, 6))
    for k in range(300):
        out = np.zeros_like(x)
        cpu.parallel_for(_scaled_rows, (x, out, float(k)), 3)
        assert np.array_equal(out, _serial(x, float(k))), k

"""The runner times one-thread CPU candidates by the calling thread's CPU clock (`tuner.measure.
jobs.ThreadClock`): time the process spends preempted (other jobs on shared cores, the tuner's own
compiles) is not the candidate's, and the deployed model's steps, short enough to run
unpreempted, do not pay it; nor is the work of another thread of the process (a thread pool
still spinning after the reference check)."""
from __future__ import annotations

import threading
import time

from codegen import get_backend
from ir.settings import Settings
from tuner.measure.jobs import timed


def _sleepy(arrays, out):
    """Off the CPU for 2 ms, as a preempted call is; a little work on it."""
    time.sleep(2e-3)
    sum(range(200))


def test_one_thread_candidates_are_timed_without_the_time_off_the_cpu():
    backend = get_backend("cpu", Settings(threads=1))
    lat, number = timed(_sleepy, None, None, number=3, repeat=3, min_repeat_ms=1.0, flush=False, backend=backend)
    assert number == 3 and len(lat) == 3
    assert max(lat) < 1e-3, lat


def test_another_threads_work_is_not_the_candidates():
    """A thread of the process busy beside the candidate (as OpenBLAS's pool spins ~100 ms after
    a NumPy matmul): the process clock charged its time to the candidate, the thread's does not.
    The test's own thread holds the GIL only in short slices, so the candidate still runs."""
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=busy, daemon=True)
    spinner.start()
    try:
        backend = get_backend("cpu", Settings(threads=1))
        lat, _ = timed(_sleepy, None, None, number=3, repeat=3, min_repeat_ms=1.0, flush=False, backend=backend)
    finally:
        stop.set()
        spinner.join()
    assert max(lat) < 1e-3, lat


def test_several_threads_are_timed_by_the_wall_clock():
    """Their work runs on other threads too, so the calling thread's or the process's CPU time is no
    latency: the wall clock, as before."""
    backend = get_backend("cpu", Settings(threads=2))
    lat, _ = timed(_sleepy, None, None, number=2, repeat=2, min_repeat_ms=1.0, flush=False, backend=backend)
    assert min(lat) >= 2e-3, lat

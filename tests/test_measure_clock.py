"""The runner times one-thread CPU candidates by the process's CPU clock (`tuner.measure.jobs.
ProcessClock`): time the process spends preempted (other jobs on shared cores, the tuner's own
compiles) is not the candidate's, and the deployed model's steps, short enough to run
unpreempted, do not pay it."""
from __future__ import annotations

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


def test_several_threads_are_timed_by_the_wall_clock():
    """Their work runs on other threads too, so the calling thread's or the process's CPU time is no
    latency: the wall clock, as before."""
    backend = get_backend("cpu", Settings(threads=2))
    lat, _ = timed(_sleepy, None, None, number=2, repeat=2, min_repeat_ms=1.0, flush=False, backend=backend)
    assert min(lat) >= 2e-3, lat

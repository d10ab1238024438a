"""Task scheduler: the budget goes where it cuts Σ weight × best latency most."""
from __future__ import annotations

from types import SimpleNamespace

from database import Database
from tests.simulated import TARGET, replay
from tuner.scheduler import GradientScheduler, RoundRobinScheduler, make_scheduler
from tuner.tune import TuneOptions, tune_tasks


def task(weight=1, flops=1e9, template="dense"):
    return SimpleNamespace(weight=weight, flops=flops, template=SimpleNamespace(name=template))


def run(sched, curves, rounds=40):
    """curves[i](r) = best latency of task i after r rounds of it."""
    for _ in range(rounds):
        i = sched.next_task()
        if i is None:
            break
        sched.update(i, 8, curves[i](sched.rounds[i] + 1))
    return sched.rounds


def improving(start, end):
    return lambda r: end + (start - end) / r


def test_gradient_feeds_the_task_that_still_improves():
    rounds = run(GradientScheduler([task(), task()], eps=0), [improving(5.0, 1.0), lambda r: 1.0])
    assert rounds[0] >= 2 * rounds[1] and rounds[1] >= 1   # warm-up gave the flat task one round


def test_gradient_weighs_by_occurrences():
    rounds = run(GradientScheduler([task(weight=1), task(weight=6)], eps=0),
                 [improving(5.0, 1.0), improving(5.0, 1.0)])
    assert rounds[1] > 2 * rounds[0]


def test_round_robin_is_even_and_retired_tasks_yield_their_budget():
    s = RoundRobinScheduler([task(), task(), task()])
    s.retire(1)
    rounds = run(s, [lambda r: 1.0] * 3, rounds=20)
    assert rounds == [10, 0, 10]


def test_task_without_any_valid_result_retires():
    s = GradientScheduler([task(), task()], eps=0, max_failed_rounds=3)
    rounds = run(s, [lambda r: None, improving(3.0, 1.0)], rounds=30)
    assert rounds[0] == 3 and 1 not in s.active or rounds[1] == 27
    assert 0 not in s.active


def test_unknown_scheduler_is_a_clear_error():
    import pytest
    from ir.errors import TensortuneError
    with pytest.raises(TensortuneError, match="round-robin"):
        make_scheduler("fifo", [task()])


def _spent(scheduler):
    tasks, b, r = replay(["128x256x1024", "256x256x256"], weights=[8, 1])
    reps = tune_tasks(tasks, Database("sqlite:///:memory:"),
                      TuneOptions(trials=160, strategy="random", scheduler=scheduler, seed=0, progress=False),
                      TARGET, b, r)
    return [x.trials for x in reps]


def test_tuning_gives_the_heavier_task_more_trials():
    """Replayed dense tasks; the one occurring 8 times gets most of the budget (at least two
    thirds) with `gradient`, half with `round-robin`. How much more than two thirds follows the
    replayed time of each task's default config (the recorded option nearest to the dense
    template's default): a default 4x faster on the heavy task (blocks of one column tile,
    2026-12-04) leaves it less to gain, and its share went from 144 to 112 of 160."""
    grad, rr = _spent("gradient"), _spent("round-robin")
    assert sum(grad) == sum(rr) == 160
    assert rr == [80, 80]
    assert grad[0] > 2 * grad[1], grad

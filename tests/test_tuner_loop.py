"""The tuning loop on replayed measurements: every result stored, failures recorded,
time budget and early stopping, interrupt and resume, log file, CLI flag errors."""
from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from database import Database
from tests.simulated import TARGET, replay
from tuner.measure import MeasureResult, ReplayRunner
from tuner.measure.jobs import timed
from tuner.tune import TuneOptions, summary_table, tune_tasks

SHAPE = "128x256x1024"


def opts(**kw):
    return TuneOptions(**{"trials": 32, "progress": False, **kw})


class Faulty(ReplayRunner):
    """Replays, but every 5th candidate crashes, hangs or computes garbage; and it can
    raise KeyboardInterrupt (Ctrl-C) at a given batch."""

    def __init__(self, tables, interrupt_at=None, delay=0.0):
        super().__init__(tables)
        self.batches, self.interrupt_at, self.delay = 0, interrupt_at, delay

    def run(self, inputs, builds):
        self.batches += 1
        if self.batches == self.interrupt_at:
            raise KeyboardInterrupt
        time.sleep(self.delay)
        out = super().run(inputs, builds)
        kinds = [("worker_died", "worker process died"), ("run_timeout", "no answer within 30 s"),
                 ("wrong_result", "max abs error 3.2 vs NumPy reference")]
        for k, r in enumerate(out):
            if (self.calls - len(out) + k) % 5 == 4:
                status, err = kinds[(self.calls - len(out) + k) // 5 % 3]
                out[k] = MeasureResult(r.input, status, error=err)
        return out


def faulty(interrupt_at=None, delay=0.0, shapes=(SHAPE,)):
    tasks, builder, runner = replay(list(shapes))
    return tasks, builder, Faulty(list(runner.tables.values()), interrupt_at, delay)


@pytest.mark.parametrize("strategy", ["random", "ga", "xgb"])
def test_failed_candidates_are_recorded_and_never_ranked(strategy):
    tasks, b, r = faulty()
    db = Database("sqlite:///:memory:")
    [rep] = tune_tasks(tasks, db, opts(strategy=strategy, trials=40), TARGET, b, r)
    recs = db.records()
    by_status = {s: sum(1 for x in recs if x.status == s) for s in {x.status for x in recs}}
    assert len(recs) == 40 and rep.failures == 8
    assert by_status.get("worker_died") and by_status.get("run_timeout") and by_status.get("wrong_result")
    assert all(x.median is None and x.error for x in recs if x.status != "ok")
    assert db.best(tasks[0].workload.key, TARGET.key)[0].status == "ok"
    assert rep.best == min(x.median for x in recs if x.status == "ok")


def test_interrupt_keeps_every_finished_batch_and_resume_continues():
    tasks, b, r = faulty(interrupt_at=3)
    db = Database("sqlite:///:memory:")
    with pytest.raises(KeyboardInterrupt):
        tune_tasks(tasks, db, opts(strategy="xgb", batch_size=8), TARGET, b, r)
    first = db.records()
    assert len(first) == 16   # two finished batches, nothing of the third
    transient = {x.config_hash for x in first if x.status in ("worker_died", "run_timeout")}
    assert len(transient) == 2 and any(x.status == "wrong_result" for x in first)
    tasks, b, r = faulty()
    [rep] = tune_tasks(tasks, db, opts(strategy="xgb", batch_size=8, trials=24), TARGET, b, r)
    counts = Counter(x.config_hash for x in db.records())
    assert sum(counts.values()) == 40
    # resume measured each transient failure once more, and nothing else twice (not the wrong result)
    assert {h for h, n in counts.items() if n > 1} == transient and max(counts.values()) == 2
    assert rep.trials == 24 and rep.best <= min(x.median for x in first if x.median)


def test_no_resume_may_measure_stored_configs_again():
    tasks, b, r = replay([SHAPE])
    db = Database("sqlite:///:memory:")
    tune_tasks(tasks, db, opts(strategy="grid", trials=8), TARGET, b, r)
    tune_tasks(tasks, db, opts(strategy="grid", trials=8, resume=False), TARGET, b, r)
    hashes = [x.config_hash for x in db.records()]
    assert len(hashes) == 16 and len(set(hashes)) == 8


def test_time_budget_stops_between_batches():
    tasks, b, r = faulty(delay=0.05)
    reps = tune_tasks(tasks, Database("sqlite:///:memory:"), opts(trials=10_000, batch_size=4, time_budget=0.3),
                      TARGET, b, r)
    assert reps.stopped == "time budget"
    assert 4 <= reps[0].trials <= 40 and reps.timing.wall_s < 3


def test_early_stopping_retires_a_task_and_the_others_get_the_budget():
    tasks, b, r = replay([SHAPE, "256x256x256"])
    reps = tune_tasks(tasks, Database("sqlite:///:memory:"),
                      opts(strategy="grid", trials=400, early_stopping=16, scheduler="round-robin"), TARGET, b, r)
    assert reps.stopped.startswith("every task finished")
    assert all(x.since_best >= 16 for x in reps) and sum(x.trials for x in reps) < 400


def test_log_file_and_summary(tmp_path):
    log = tmp_path / "tune.jsonl"
    tasks, b, r = replay([SHAPE, "256x256x256"], weights=[2, 1])
    reps = tune_tasks(tasks, Database("sqlite:///:memory:"), opts(trials=24, log_file=str(log)), TARGET, b, r)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("measure") == 24
    assert kinds.count("round") == 3
    end = events[-1]
    assert end["timing"]["candidates"] == 24 and end["estimated_latency"] == pytest.approx(
        2 * reps[0].best + reps[1].best)
    table = summary_table(reps)
    assert "estimated model latency" in table and "24 candidates" in table and "/min" in table


def test_timed_honours_number_repeat_and_flushes_between_repeats(monkeypatch):
    from tuner.measure import jobs
    calls, flushes = [], []
    monkeypatch.setattr(jobs, "flush_caches", lambda: flushes.append(len(calls)))
    lat, number = timed(lambda a, o: calls.append(1), None, None, number=7, repeat=3, min_repeat_ms=0,
                        flush=True)
    assert number == 7 and len(lat) == 3 and len(calls) == 21 and flushes == [0, 7, 14]
    calls.clear()
    lat, number = timed(lambda a, o: time.sleep(0.001), None, None, number=None, repeat=2, min_repeat_ms=10,
                        flush=False)
    assert number >= 5 and len(lat) == 2 and all(0.0009 < x < 0.01 for x in lat)


def test_flush_caches_writes_every_element_of_a_buffer_larger_than_the_caches():
    from tuner.measure import jobs
    jobs._FLUSH.clear()
    jobs.flush_caches()
    jobs.flush_caches()
    [buf] = jobs._FLUSH.values()
    assert buf.nbytes >= 32 << 20 and buf.min() == buf.max() == 2.0


@pytest.mark.parametrize("args, needle", [
    (["--strategy", "annealing"], "--strategy 'annealing'"),
    (["--scheduler", "fifo"], "--scheduler 'fifo'"),
    (["--cost-model", "gbm"], "--cost-model 'gbm'"),
    (["--time-budget", "0"], "--time-budget"),
    (["--repeat", "0"], "--repeat"),
    (["--compile-share", "1"], "--compile-share"),
])
def test_bad_tuner_flags_are_one_line_errors(args, needle, capsys):
    from tuner.cli import main
    rc = main(["--model", "does-not-matter.onnx", "--trials", "4"] + args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0]

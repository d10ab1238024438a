"""`tune-batch`: a subgraph shared by two models is tuned once (deduplicated through the
database, SQLite and PostgreSQL), the summary covers every model, a rerun measures
nothing, an interrupted batch continues without measuring a config twice; and the
command end to end on two real ONNX models."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from database import Database
from tuner.batch import ModelJob, plan_shares, split_trials, summary_tables, to_json, tune_batch
from tuner.callbacks import MeasureCallback
from tuner.task import Task
from tuner.tune import TuneOptions

try:  # tests/ as a package or as a plain rootdir-inserted folder
    from tests.helpers import dense_model
    from tests.simulated import TARGET, replay
except ImportError:
    from helpers import dense_model
    from simulated import TARGET, replay

SHARED, ONLY_A, ONLY_B = "128x256x1024", "128x1024x256", "256x256x256"


def opts(**kw):
    return TuneOptions(**{"trials": 16, "batch_size": 4, "strategy": "random", "progress": False, **kw})


def two_models():
    """(jobs, builder, runner): model a = [shared, only_a], model b = [shared x2, only_b],
    replayed (recorded measurements, nothing compiles)."""
    tasks, builder, runner = replay((SHARED, ONLY_A, ONLY_B))
    shared, only_a, only_b = tasks
    b_shared = Task(shared.workload, shared.template, 2, shared.name)   # b has the layer twice
    return [ModelJob("a", [shared, only_a]), ModelJob("b", [b_shared, only_b])], builder, runner


def per_workload(db) -> Counter:
    return Counter(r.workload_key for r in db.records(target_key=TARGET.key))


def no_config_twice(db) -> bool:
    keys = [(r.workload_key, r.target_key, r.config_hash) for r in db.records()]
    return len(keys) == len(set(keys))


def test_split_trials_in_whole_batches_biggest_first():
    assert split_trials(16, [1.0, 3.0], 4) == [8, 8]
    assert split_trials(10, [1.0, 3.0, 2.0], 4) == [2, 4, 4]      # 2 batches, the rest to the next in line
    assert split_trials(3, [1.0, 2.0], 8) == [0, 3]
    assert sum(split_trials(61, [5, 1, 4, 2, 3], 8)) == 61


def test_a_shared_task_takes_the_largest_share_any_model_gives_it():
    jobs, _, _ = two_models()
    per_model = plan_shares(jobs, 16, 4)
    assert sorted(st.share for st in per_model.values()) == [8, 8, 8] and len(per_model) == 3
    total = plan_shares(jobs, 12, 4, total=True)
    assert sum(st.share for st in total.values()) == 12


def test_a_shared_subgraph_is_tuned_once_and_the_summary_covers_both_models(db_url, tmp_path):
    jobs, builder, runner = two_models()
    log = tmp_path / "log.jsonl"
    with Database(db_url) as db:
        rep = tune_batch(jobs, db, opts(log_file=str(log)), target=TARGET, builder=builder, runner=runner)
        shared_key = jobs[0].tasks[0].workload.key
        counts = per_workload(db)
        assert sorted(counts.values()) == [8, 8, 8] and counts[shared_key] == 8
        assert no_config_twice(db) and db.claims() == []
        # the shared workload's records come from model a's job only: b measured only its own task
        segments = _jobs_in_log(log)
        assert len(segments) == 2
        assert {e["workload"] for e in segments[0]} == {shared_key, jobs[0].tasks[1].workload.key}
        assert {e["workload"] for e in segments[1]} == {jobs[1].tasks[1].workload.key}
        assert [j.measured for j in jobs] == [16, 8] and rep.measured == 24
        text = summary_tables(rep)
        assert "model a" in text and "model b" in text and "shared: tuned with a" in text
        out = to_json(rep)
        b_shared = out["models"][1]["tasks"][0]
        assert b_shared["measured"] == 0 and b_shared["shared_with"] == ["a"] and b_shared["best"] is not None
        assert all(m["estimated_latency"] for m in out["models"])
        # b has the shared layer twice: its estimate weighs it twice
        best = {t["workload"]: t["best"] for m in out["models"] for t in m["tasks"]}
        assert out["models"][1]["estimated_latency"] == pytest.approx(
            2 * best[shared_key] + best[jobs[1].tasks[1].workload.key])

        again, builder2, runner2 = two_models()     # the same command once more: everything is done
        rep2 = tune_batch(again, db, opts(), target=TARGET, builder=builder2, runner=runner2)
        assert rep2.measured == 0 and [j.status for j in again] == ["already tuned", "already tuned"]
        assert per_workload(db) == counts


def _jobs_in_log(log: Path) -> list[list[dict]]:
    """The measure events of each job (each job's tune_tasks writes a start event)."""
    segments = []
    for line in log.read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "start":
            segments.append([])
        elif e["event"] == "measure":
            segments[-1].append(e)
    return segments


class InterruptAfter(MeasureCallback):
    """Ctrl-C after `n` results of the batch (the first callbacks stored the last one)."""

    def __init__(self, n: int):
        self.n = n

    def on_result(self, ctx, i, result):
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt


def test_an_interrupted_batch_continues_where_it_stopped(db_url):
    jobs, builder, runner = two_models()
    with Database(db_url) as db:
        with pytest.raises(KeyboardInterrupt):   # in model b's job, after a's 16 and 3 of b's
            tune_batch(jobs, db, opts(), target=TARGET, builder=builder, runner=runner,
                       callbacks=[InterruptAfter(16 + 3)])
        assert sum(per_workload(db).values()) == 19 and db.claims() == []
        before = {(r.workload_key, r.config_hash) for r in db.records()}
        again, builder2, runner2 = two_models()
        rep = tune_batch(again, db, opts(), target=TARGET, builder=builder2, runner=runner2)
        assert [j.status for j in again] == ["already tuned", "tuned"] and rep.measured == 5
        assert sorted(per_workload(db).values()) == [8, 8, 8] and no_config_twice(db)
        assert before <= {(r.workload_key, r.config_hash) for r in db.records()}
        assert "resumed from 3" in summary_tables(rep)


def test_trials_total_splits_the_budget_over_the_distinct_tasks(tmp_path):
    jobs, builder, runner = two_models()
    with Database(f"sqlite:///{tmp_path / 't.db'}") as db:
        rep = tune_batch(jobs, db, opts(), trials_total=12, target=TARGET, builder=builder, runner=runner)
        assert rep.measured == 12 and sum(per_workload(db).values()) == 12


def test_a_task_another_run_took_to_its_share_is_not_measured_again(tmp_path):
    """Deduplicated through the database: a batch of model b alone, after the batch of a."""
    jobs, builder, runner = two_models()
    with Database(f"sqlite:///{tmp_path / 't.db'}") as db:
        tune_batch(jobs[:1], db, opts(), target=TARGET, builder=builder, runner=runner)
        _, builder2, runner2 = two_models()
        rep = tune_batch(jobs[1:], db, opts(), target=TARGET, builder=builder2, runner=runner2)
        assert rep.measured == 8 and "stored before" in summary_tables(rep)
        assert sorted(per_workload(db).values()) == [8, 8, 8]


# -- the command, on real models -----------------------------------------------------------

def test_tune_batch_command_on_two_models_sharing_a_layer(tmp_path, capsys):
    """Two tiny models with one identical dense layer (16x32 @ 32x16 + bias + relu), real
    compiles and timings; the second run of the same command measures nothing."""
    import onnx
    from tuner.batch import main
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(dense_model(16, 32, 16), a)
    onnx.save(dense_model(16, 32, 16, seed=1), b)      # other weights, same workload
    url = f"sqlite:///{tmp_path / 't.db'}"
    flags = ["--db", url, "--trials", "2", "--batch-size", "2", "--strategy", "random", "--repeat", "1",
             "--min-repeat-ms", "1", "--no-progress"]
    assert main([str(a), str(b), *flags, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [m["model"] for m in out["models"]] == ["a", "b"] and out["distinct_tasks"] == 1
    assert out["measured"] == 2 and out["models"][1]["tasks"][0]["origin"] == "shared: tuned with a"
    assert all(m["estimated_latency"] for m in out["models"])
    assert main([str(a), str(b), *flags]) == 0
    text = capsys.readouterr().out
    assert "model a" in text and "model b" in text and "0 measurements in" in text
    with Database(url) as db:
        assert len(db.records()) == 2


@pytest.mark.parametrize("args, says", [
    (["--trials", "4", "--trials-total", "8"], "not both"),
    (["--trials", "0"], "--trials must be a positive number"),
    (["--shape", "nosuchdim=4"], "dynamic dims of none of the models"),
    (["--runner", "nosuch"], "unknown --runner 'nosuch'"),
])
def test_bad_batch_flags_are_one_line(tmp_path, capsys, args, says):
    import onnx
    from tuner.batch import main
    a = tmp_path / "a.onnx"
    onnx.save(dense_model(16, 32, 16), a)
    assert main([str(a), "--db", f"sqlite:///{tmp_path / 't.db'}", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err

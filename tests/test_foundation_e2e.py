"""The whole path on the bundled MLP: tune → database → plan → runtime.load, vs onnxruntime."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import runtime
from database import Database
from runtime.cli import main as run_main
from tuner.cli import main as tune_main

MLP = Path(__file__).resolve().parents[1] / "experiments" / "models" / "mlp.onnx"


def ort_run(x):
    return ort.InferenceSession(str(MLP), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    d = tmp_path_factory.mktemp("tuned")
    url, plan = f"sqlite:///{d / 'tuning.db'}", d / "plan.json"
    rc = tune_main(["--model", str(MLP), "--trials", "6", "--batch-size", "3", "--db", url, "--plan", str(plan),
                    "--no-progress"])
    assert rc == 0
    return url, plan


def test_identical_layers_make_one_task(tuned):
    url, _ = tuned
    db = Database(url)
    assert len(db.workloads()) == 1
    measured = [r for r in db.records() if r.strategy != "in-model"]   # less the in-model check's verdicts
    assert len(measured) == 6 and db.stats()["records"] >= 6
    best = db.best_per_workload()
    assert len(best) == 1 and best[0].status == "ok"


@pytest.mark.parametrize("batch", [32, 7, 1])
def test_load_from_db_matches_onnxruntime(tuned, batch):
    url, _ = tuned
    m = runtime.load(MLP, db=url)
    x = np.random.default_rng(batch).standard_normal((batch, 256)).astype(np.float32)
    np.testing.assert_allclose(m(x=x), ort_run(x), rtol=1e-4, atol=1e-4)
    cov = m.coverage({"batch": batch})
    kinds = set(cov.counts)
    assert kinds == ({"tuned"} if batch == 32 else {"nearest"})  # other batches reuse the batch-32 config


def test_plan_moved_to_fresh_dir_loads_without_db(tuned, tmp_path):
    _, plan = tuned
    moved = tmp_path / "deploy" / "plan.json"
    moved.parent.mkdir()
    shutil.copy(plan, moved)
    m = runtime.load(MLP, plan=moved)
    x = np.random.default_rng(0).standard_normal((32, 256)).astype(np.float32)
    np.testing.assert_allclose(m(x), ort_run(x), rtol=1e-4, atol=1e-4)
    assert set(m.coverage({"batch": 32}).counts) == {"tuned"}


def test_plan_from_other_target_falls_back_with_warning(tuned, tmp_path):
    _, plan = tuned
    d = json.loads(plan.read_text())
    d["target"]["key"] = "cpu-someothermachine"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(d))
    with pytest.warns(UserWarning, match="tuned on target"):
        m = runtime.load(MLP, plan=other)
    x = np.ones((4, 256), np.float32)
    np.testing.assert_allclose(m(x), ort_run(x), rtol=1e-4, atol=1e-4)
    assert set(m.coverage({"batch": 4}).counts) == {"default"}


def test_tune_run_check_and_bench(tuned, capsys):
    url, plan = tuned
    assert run_main(["--model", str(MLP), "--db", url, "--check", "--bench", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["check"]["ok"] and out["check"]["max_abs_error"] < 1e-3
    assert set(out["latency_ms"]) == {"p50", "p95", "p99"}
    assert out["coverage"]["subgraphs"] == {"tuned": 3}
    assert run_main(["--model", str(MLP), "--plan", str(plan), "--check"]) == 0
    assert "OK" in capsys.readouterr().out


def test_tune_db_best_shows_the_result(tuned, capsys):
    from database.cli import main as db_main
    url, _ = tuned
    assert db_main(["--db", url, "best"]) == 0
    out = capsys.readouterr().out
    assert "dense" in out and "MatMul+Add+Relu" in out

"""`tune` end to end with the model-guided strategy on real kernels (compiles: slow)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from database import Database
from tuner.cli import main

MLP = Path(__file__).resolve().parents[1] / "experiments" / "models" / "mlp.onnx"


@pytest.mark.slow
def test_tune_xgb_with_flags_logs_and_reports_model_latency(tmp_path, capsys):
    url, log = f"sqlite:///{tmp_path / 't.db'}", tmp_path / "log.jsonl"
    rc = main(["--model", str(MLP), "--trials", "6", "--batch-size", "3", "--strategy", "xgb", "--db", url,
               "--log-file", str(log), "--no-progress", "--repeat", "3", "--number", "2", "--flush-cache",
               "--scheduler", "round-robin", "--measure-runs", "3", "--seed", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "estimated model latency" in out and "end-to-end at {'batch': 32}: estimated" in out
    events = [json.loads(x) for x in log.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds.count("measure") == 6 and "model_latency" in kinds
    lat = next(e for e in events if e["event"] == "model_latency")
    assert lat["measured"] > 0 and lat["estimated"] > 0
    recs = [r for r in Database(url).records() if r.strategy != "in-model"]   # the in-model check's own
    assert len(recs) == 6 and all(len(r.latencies) == 3 for r in recs if r.status == "ok")
    assert all(r.strategy == "xgb" for r in recs)

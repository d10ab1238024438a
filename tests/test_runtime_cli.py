"""tune-run: --json report (check, latency percentiles, memory, coverage), --strict, valid int ids."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ir import import_onnx, simplify
from runtime.cli import id_bound, main as run_main, random_feeds

try:
    from tests.models import make_bert
except ImportError:
    from models import make_bert


@pytest.fixture(scope="module")
def scaler_model(tmp_path_factory):
    """MatMul (a dense kernel) → ai.onnx.ml Scaler (no template, no NumPy reference: onnx.reference) → Relu."""
    w = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Scaler", ["h"], ["c"], domain="ai.onnx.ml", offset=[0.5], scale=[2.0]),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "scaler", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
                          [numpy_helper.from_array(w, "w")],
                          value_info=[helper.make_tensor_value_info("c", TensorProto.FLOAT, ["batch", 16])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    path = tmp_path_factory.mktemp("cli") / "scaler.onnx"
    onnx.save(m, path)
    return path


def test_json_report(scaler_model, capsys):
    rc = run_main(["--model", str(scaler_model), "--shape", "batch=4", "--check", "--bench", "4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["check"]["ok"]
    assert set(out["latency_ms"]) == {"p50", "p95", "p99"}
    assert out["latency_ms"]["p50"] <= out["latency_ms"]["p99"]
    mem = out["memory"]
    assert mem["planned_bytes"] <= mem["no_reuse_bytes"] and mem["buffers"] >= 1
    cov = out["coverage"]
    assert cov["subgraphs"].get("reference", 0) >= 1 and "Scaler" in cov["onnx_reference_ops"]
    assert abs(sum(cov["node_share"].values()) - 1) < 1e-9 and abs(sum(cov["time_share"].values()) - 1) < 1e-9


def test_strict_fails_when_a_subgraph_falls_back(scaler_model):
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "--model", str(scaler_model), "--shape", "batch=2",
                        "--strict"], capture_output=True, text=True, timeout=300)
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "--strict" in lines[0] and "Scaler" in lines[0] and "reference" in lines[0]


def test_int_ids_stay_inside_the_gather_table():
    g = simplify(import_onnx(make_bert(layers=1, hidden=32, heads=2, ffn=64, vocab=37)))
    assert id_bound(g, "input_ids") == 37
    assert id_bound(g, "attention_mask") == 2
    feeds = random_feeds(g, {"batch": 2, "seq": 64}, seed=1)
    ids = feeds["input_ids"]
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 37 and ids.max() > 1

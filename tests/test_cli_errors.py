"""Bad input gets one clear line naming the problem and a non-zero exit, never a traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from onnx import TensorProto, helper

MLP = Path(__file__).resolve().parents[1] / "experiments" / "models" / "mlp.onnx"


def run(args):
    p = subprocess.run([sys.executable, "-m"] + args, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def assert_one_line_error(rc, err, *needles):
    assert rc != 0
    assert "Traceback" not in err
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_model(tmp_path):
    rc, _, err = run(["tuner.cli", "--model", str(tmp_path / "nope.onnx"), "--trials", "2"])
    assert_one_line_error(rc, err, "nope.onnx", "does not exist")


def test_corrupt_model(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage not protobuf" * 10)
    rc, _, err = run(["tuner.cli", "--model", str(bad), "--trials", "2"])
    assert_one_line_error(rc, err, "bad.onnx")


def test_unsupported_op(tmp_path):
    g = helper.make_graph([helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "fancy.onnx"
    path.write_bytes(m.SerializeToString())
    rc, _, err = run(["tuner.cli", "--model", str(path), "--trials", "2", "--db", f"sqlite:///{tmp_path}/x.db"])
    assert_one_line_error(rc, err, "FancyOp")


@pytest.mark.parametrize("trials", ["0", "-3"])
def test_bad_trials(trials):
    rc, _, err = run(["tuner.cli", "--model", str(MLP), "--trials", trials])
    assert_one_line_error(rc, err, "--trials")


@pytest.mark.parametrize("url", ["nosuchdriver://x/y", "postgresql+psycopg://nobody@127.0.0.1:1/none"])
def test_bad_db_url(url):
    rc, _, err = run(["tuner.cli", "--model", str(MLP), "--trials", "2", "--db", url])
    assert_one_line_error(rc, err, "database")


def test_out_of_range_shape(tmp_path):
    rc, _, err = run(["runtime.cli", "--model", str(MLP), "--dim", "batch=1:16", "--shape", "batch=64"])
    assert_one_line_error(rc, err, "batch", "64", "16")


def test_corrupt_plan(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    rc, _, err = run(["runtime.cli", "--model", str(MLP), "--plan", str(plan)])
    assert_one_line_error(rc, err, "plan.json")

"""--fallback onnxruntime: maximal unsupported regions run in one onnxruntime session each;
coverage reports their share; --strict refuses them; without the flag, one clear error."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime
from ir.errors import UnsupportedOpError
from runtime.cli import main as tune_run
from runtime.executor import FallbackError

MS = "com.microsoft"


def _model(nodes, outputs, value_info, inits, opset=17):
    g = helper.make_graph(nodes, "fb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, s) for o, s in outputs], inits,
                          value_info=[helper.make_tensor_value_info(v, TensorProto.FLOAT, s) for v, s in value_info])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 9
    return m


def chain_model():
    """Relu -> [FusedMatMul -> Gelu] (com.microsoft, one region) -> Add -> Sigmoid."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("FusedMatMul", ["r", "w"], ["fm"], domain=MS, alpha=0.5, name="fused_mm"),
             helper.make_node("Gelu", ["fm"], ["ge"], domain=MS, name="ms_gelu"),
             helper.make_node("Add", ["ge", "b"], ["a"], name="add"),
             helper.make_node("Sigmoid", ["a"], ["y"], name="sigmoid")]
    return _model(nodes, [("y", ["N", 6])], [("fm", ["N", 6]), ("ge", ["N", 6])], inits)


def diamond_model():
    """A -> Relu -> C with A -> C as well: A and C are unsupported but cannot share a session
    (the Relu between them would run in the middle of it)."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")]
    nodes = [helper.make_node("FusedMatMul", ["x", "w"], ["a"], domain=MS, name="A"),
             helper.make_node("Relu", ["a"], ["b"], name="B"),
             helper.make_node("FusedMatMul", ["a", "b"], ["c"], domain=MS, transB=1, name="C"),
             helper.make_node("Tanh", ["c"], ["y"], name="D")]
    return _model(nodes, [("y", ["N", "N"])], [("a", ["N", 8]), ("c", ["N", "N"])], inits)


def branches_model():
    """Two unsupported branches from x that an unsupported node joins: one region of three."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), k) for k in ("w1", "w2")]
    nodes = [helper.make_node("FusedMatMul", ["x", "w1"], ["a"], domain=MS, name="A"),
             helper.make_node("FusedMatMul", ["x", "w2"], ["b"], domain=MS, alpha=2.0, name="B"),
             helper.make_node("FusedMatMul", ["a", "b"], ["c"], domain=MS, transB=1, name="C"),
             helper.make_node("Sigmoid", ["c"], ["y"], name="D")]
    return _model(nodes, [("y", ["N", "N"])], [("a", ["N", 8]), ("b", ["N", 8]), ("c", ["N", "N"])], inits)


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_region_runs_in_one_session_and_matches_onnxruntime():
    m = chain_model()
    cm = runtime.load(m, fallback="onnxruntime")
    rng = np.random.default_rng(2)
    for n in (3, 7):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        np.testing.assert_allclose(cm(x), _ort(m, {"x": x})[0], rtol=1e-5, atol=1e-6)
    cov = cm.coverage({"N": 7})
    assert cov.counts["onnxruntime"] == 1 and cov.nodes["onnxruntime"] == 2   # one session for the region
    assert cov.nodes.get("reference", 0) == 0                                 # the rest compiled
    rate = cov.to_json()["fallback_rate"]
    assert rate["nodes"] == pytest.approx(2 / 5) and 0 < rate["time"] <= 1
    assert "onnxruntime: 1 subgraphs / 2 nodes" in str(cov)


def test_regions_never_form_a_cycle():
    m = diamond_model()
    cm = runtime.load(m, fallback="onnxruntime")
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(cm(x), _ort(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert cm.coverage({"N": 4}).counts["onnxruntime"] == 2


def test_branches_that_join_are_one_region():
    m = branches_model()
    cm = runtime.load(m, fallback="onnxruntime")
    x = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(cm(x), _ort(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
    cov = cm.coverage({"N": 3})
    assert cov.counts["onnxruntime"] == 1 and cov.nodes["onnxruntime"] == 3


def test_node_whose_reference_fails_moves_to_onnxruntime(monkeypatch):
    """A node no reference can run (ours refuses its case, and onnx.reference too: simulated
    here for BatchNormalization in training mode, which both now cover) moves to onnxruntime
    at the first call; the model's other nodes stay compiled."""
    import dataclasses

    import ir.reference
    from ir.ops import OPS

    def refuse(node, *args):
        raise UnsupportedOpError(f"node '{node.name}' ({node.op}): this case has no reference")

    monkeypatch.setitem(OPS, "BatchNormalization", dataclasses.replace(OPS["BatchNormalization"], ref=refuse))
    monkeypatch.setattr(ir.reference, "_run_onnx_node", lambda g, node, args: refuse(node))
    c = np.linspace(0.5, 1.5, 4).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="sq"),
             helper.make_node("Reshape", ["sq", "shape"], ["sq4"], name="to_nchw"),
             helper.make_node("BatchNormalization", ["sq4", "s", "b", "m", "v"], ["bn", "rm", "rv"],
                              training_mode=1, name="bn_train"),
             helper.make_node("Reshape", ["bn", "back"], ["y"], name="to_nc")]
    inits = [numpy_helper.from_array(c, k) for k in "sbmv"] + [
        numpy_helper.from_array(np.array([-1, 4, 2], np.int64), "shape"),
        numpy_helper.from_array(np.array([-1, 8], np.int64), "back")]
    m = _model(nodes, [("y", ["N", 8])], [("bn", ["N", 4, 2])], inits, opset=15)
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(3, 8)
    with pytest.raises(UnsupportedOpError, match="bn_train"):
        runtime.load(m).run({"x": x})
    cm = runtime.load(m, fallback="onnxruntime")
    np.testing.assert_allclose(cm(x), _ort(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
    cov = cm.coverage()
    assert cov.nodes["onnxruntime"] == 1 and cov.nodes.get("reference", 0) == 0


def test_strict_refuses_onnxruntime_regions():
    cm = runtime.load(chain_model(), fallback="onnxruntime", strict=True)
    with pytest.raises(FallbackError, match="would run in onnxruntime"):
        cm(np.zeros((2, 8), np.float32))


def test_without_fallback_one_clear_error(tmp_path, capsys):
    with pytest.raises(UnsupportedOpError, match="node 'fused_mm': op 'FusedMatMul' of domain 'com.microsoft'"):
        runtime.load(chain_model())
    path = tmp_path / "fb.onnx"
    onnx.save(chain_model(), path)
    assert tune_run(["--model", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fused_mm" in err and "--fallback onnxruntime" in err
    with pytest.raises(Exception, match="unknown fallback 'tensorrt'"):
        runtime.load(chain_model(), fallback="tensorrt")


def test_tune_run_cli_reports_fallback_rate(tmp_path, capsys):
    path = tmp_path / "fb.onnx"
    onnx.save(chain_model(), path)
    assert tune_run(["--model", str(path), "--fallback", "onnxruntime", "--check", "--shape", "N=4"]) == 0
    out = capsys.readouterr().out
    assert "fallback to onnxruntime: 40% of nodes" in out and "OK" in out
    assert tune_run(["--model", str(path), "--fallback", "onnxruntime", "--strict"]) == 2

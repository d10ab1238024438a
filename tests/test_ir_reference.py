"""run_reference: dim binding, errors, and per-node fallback to onnx.reference with its report."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from ir import ShapeError, import_onnx, simplify
from ir.reference import run_reference


def _model(nodes, inputs, outputs):
    m = helper.make_model(helper.make_graph(nodes, "t", inputs, outputs), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_unknown_op_falls_back_and_is_reported():
    m = _model([helper.make_node("Relu", ["x"], ["r"]),
                helper.make_node("Scaler", ["r"], ["c"], domain="ai.onnx.ml", offset=[0.5], scale=[2.0]),
                helper.make_node("Neg", ["c"], ["y"])], [_vi("x", ["N", 3])], [_vi("y", ["N", 3])])
    m.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    m.graph.value_info.append(_vi("c", ["N", 3]))  # onnx shape inference does not type Scaler
    g = simplify(import_onnx(m))
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    out = run_reference(g, {"x": x})
    np.testing.assert_allclose(out["y"], -((np.maximum(x, 0) - 0.5) * 2.0), rtol=1e-6)
    assert out.report.fallback_ops == ["Scaler"] and out.report.fallback_nodes[0][1] == "Scaler"
    assert out.report.node_rate == pytest.approx(1 / 3) and 0 < out.report.time_share <= 1
    assert "1/3 nodes fell back" in str(out.report)


def test_no_fallback_report_is_clean():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", 3])], [_vi("y", ["N", 3])])
    out = run_reference(simplify(import_onnx(m)), {"x": np.ones((2, 3), np.float32)})
    assert out.report.fallback_nodes == [] and out.report.node_rate == 0 and out.sizes == {"N": 2}


def test_inconsistent_binding_names_input_and_dim():
    m = _model([helper.make_node("Add", ["a", "b"], ["y"])], [_vi("a", ["N", 3]), _vi("b", ["N", 3])],
               [_vi("y", ["N", 3])])
    g = simplify(import_onnx(m))
    with pytest.raises(ShapeError, match=r"input 'b' axis 0: dim 'N' = 5 but another input bound it to 2"):
        run_reference(g, {"a": np.ones((2, 3), np.float32), "b": np.ones((5, 3), np.float32)})
    with pytest.raises(ShapeError, match=r"input 'a' axis 1: got 4, expected 3"):
        run_reference(g, {"a": np.ones((2, 4), np.float32), "b": np.ones((2, 4), np.float32)})
    with pytest.raises(ShapeError, match=r"missing input 'b'"):
        run_reference(g, {"a": np.ones((2, 3), np.float32)})

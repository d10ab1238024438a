"""float16 / bfloat16 weights and inputs: computed in float32 (ir.precision), callers see the
declared dtypes; float16 compared with onnxruntime, bfloat16 with a float32 NumPy computation."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import runtime

BF16 = ml_dtypes.bfloat16


def _mlp(elem, w, b, opset=17):
    """x[N, 8] @ w + b -> Relu -> Cast(to elem) -> y; plus z = ConstantOfShape(Shape(y)) * y."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("Cast", ["r"], ["y"], to=elem),
             helper.make_node("Shape", ["y"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["two"],
                              value=numpy_helper.from_array(np.array([2], dtype=w.dtype))),
             helper.make_node("Mul", ["two", "y"], ["z"])]
    g = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", elem, ["N", 8])],
                          [helper.make_tensor_value_info("y", elem, ["N", 4]),
                           helper.make_tensor_value_info("z", elem, ["N", 4])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def test_float16_model_matches_onnxruntime_in_declared_dtypes():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float16)
    b = rng.standard_normal(4).astype(np.float16)
    m = _mlp(TensorProto.FLOAT16, w, b)
    cm = runtime.load(m)
    assert all(str(v.dtype) not in ("float16", "bfloat16") for v in cm.graph.constants.values())
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (2, 5):
        x = rng.standard_normal((n, 8)).astype(np.float16)
        got = cm.run({"x": x})
        want_y, want_z = sess.run(None, {"x": x})
        assert got["y"].dtype == np.float16 and got["z"].dtype == np.float16
        # both round to float16 once or more: agree within float16 resolution
        np.testing.assert_allclose(got["y"].astype(np.float32), want_y.astype(np.float32), rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(got["z"].astype(np.float32), want_z.astype(np.float32), rtol=2e-3, atol=4e-3)
        exact = np.maximum(x.astype(np.float32) @ w.astype(np.float32) + b.astype(np.float32), 0)
        # float32 compute, one rounding (summation order may move a value by one float16 step)
        np.testing.assert_allclose(got["y"].astype(np.float32), exact.astype(np.float16).astype(np.float32),
                                   rtol=1e-3, atol=1e-6)
    cov = cm.coverage()
    assert cov.nodes["default"] >= 3, cov   # MatMul + Add + Relu compiled; only the casts stay outside


def test_half_output_cast_leaves_the_kernel_before_it_compiled():
    w = np.random.default_rng(2).standard_normal((8, 4)).astype(np.float16)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["N", 4])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    cm = runtime.load(m)
    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float16)
    got = cm(x)
    assert got.dtype == np.float16
    want = (x.astype(np.float32) @ w.astype(np.float32)).astype(np.float16)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-3)
    assert cm.coverage().counts["default"] == 1   # the MatMul, in a kernel


def test_bfloat16_weights_and_inputs():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 4)).astype(BF16)
    b = rng.standard_normal(4).astype(BF16)
    m = _mlp(TensorProto.BFLOAT16, w, b, opset=21)
    cm = runtime.load(m)
    assert cm.graph.type_of("x").dtype == "bfloat16"
    x = rng.standard_normal((3, 8)).astype(BF16)
    got = cm.run({"x": x})
    assert got["y"].dtype == BF16 and got["z"].dtype == BF16
    exact = np.maximum(x.astype(np.float32) @ w.astype(np.float32) + b.astype(np.float32), 0)
    np.testing.assert_allclose(got["y"].astype(np.float32), exact, rtol=8e-3, atol=1e-6)
    np.testing.assert_allclose(got["z"].astype(np.float32), 2 * exact, rtol=8e-3, atol=1e-6)
    # float32 inputs are accepted for a bfloat16 input and converted
    got32 = cm.run({"x": x.astype(np.float32)})
    np.testing.assert_array_equal(got32["y"], got["y"])


def test_float32_model_is_untouched():
    from ir import import_onnx
    from ir.precision import compute_in_float32
    w = np.ones((8, 4), np.float32)
    g = import_onnx(_mlp(TensorProto.FLOAT, w, np.zeros(4, np.float32)))
    assert compute_in_float32(g) is g

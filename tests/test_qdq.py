"""QuantizeLinear / DequantizeLinear: per-tensor, per-axis, blocked, int8/uint8/int16/uint16/int4,
against onnxruntime; and a QDQ model as onnxruntime's own quantizer writes it (Conv + MatMul)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime
from ir.errors import TensortuneError


def _ort(model, feeds):
    """onnxruntime running the Q/DQ nodes as written: its default optimizations rewrite
    DQ -> Conv -> Q into QLinearConv (integer requantization), which rounds differently
    from the ONNX definition of the QDQ graph by several quantization steps."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _qdq_model(x_shape, scale, zp, qtype, axis=1, block=0, opset=21):
    """x -> QuantizeLinear -> q (output) -> DequantizeLinear -> y (output)."""
    inits = [numpy_helper.from_array(scale, "s")]
    ins = ["x", "s"]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zp"))
        ins.append("zp")
    attrs = {"axis": axis}
    if block:
        attrs["block_size"] = block
    nodes = [helper.make_node("QuantizeLinear", ins, ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q"] + ins[1:], ["y"], **attrs)]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("q", qtype, list(x_shape)),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x_shape))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


CASES = [  # (name, scale shape, zero point dtype (None: no zp -> uint8), axis, block, opset)
    ("per_tensor_uint8", (), np.uint8, 1, 0, 13),
    ("per_tensor_no_zp", (), None, 1, 0, 13),
    ("per_axis_int8", (6,), np.int8, 1, 0, 13),
    ("per_axis_last_int8", (5,), np.int8, -1, 0, 19),
    ("per_tensor_int16", (), np.int16, 1, 0, 21),
    ("per_axis_uint16", (6,), np.uint16, 1, 0, 21),
    ("blocked_int8", (4, 3, 5), np.int8, 1, 2, 21),
]
QTYPES = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8, np.int16: TensorProto.INT16,
          np.uint16: TensorProto.UINT16, None: TensorProto.UINT8}


@pytest.mark.parametrize("name,sshape,zdt,axis,block,opset", CASES, ids=[c[0] for c in CASES])
def test_quantize_dequantize_match_onnxruntime(name, sshape, zdt, axis, block, opset):
    rng = np.random.default_rng(0)
    x_shape = (4, 6, 5)
    x = (rng.standard_normal(x_shape) * 3).astype(np.float32)
    scale = rng.uniform(0.01, 0.05, sshape).astype(np.float32)
    zp = None
    if zdt is not None:
        info = np.iinfo(zdt)
        zp = rng.integers(max(info.min, -20), min(info.max, 20) + 1, sshape).astype(zdt)
    m = _qdq_model(x_shape, scale, zp, QTYPES[zdt], axis, block, opset)
    want_q, want_y = _ort(m, {"x": x})
    got = runtime.load(m).run({"x": x})
    assert got["q"].dtype == want_q.dtype
    np.testing.assert_array_equal(got["q"], want_q)  # saturation and round-half-to-even agree
    np.testing.assert_allclose(got["y"], want_y, rtol=0, atol=1e-6)


def test_int4_weight_dequantizes_and_folds():
    """An int4 weight (blocked, as weight-only quantizers write it) folds to float32 at import."""
    rng = np.random.default_rng(1)
    w = rng.integers(-8, 8, (8, 6))
    scale = rng.uniform(0.05, 0.1, (4, 6)).astype(np.float32)
    w_t = helper.make_tensor("w", TensorProto.INT4, [8, 6], w.reshape(-1).tolist())
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], axis=0, block_size=2),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    g = helper.make_graph(nodes, "int4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])],
                          [w_t, numpy_helper.from_array(scale, "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    cm = runtime.load(m)
    assert "DequantizeLinear" not in {n.op for n in cm.graph.nodes}  # folded into a float32 constant
    x = rng.standard_normal((3, 8)).astype(np.float32)
    want = x @ (w * np.repeat(scale, 2, axis=0)).astype(np.float32)
    np.testing.assert_allclose(cm(x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cm(x), _ort(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_bad_per_axis_scale_is_one_clear_error():
    scale = np.full((4,), 0.1, np.float32)  # axis 1 has 6 channels
    m = _qdq_model((4, 6, 5), scale, np.zeros(4, np.int8), TensorProto.INT8, axis=1)
    with pytest.raises(TensortuneError, match="per-axis scale/zero point has shape \\[4\\], expected \\[6\\]"):
        runtime.load(m).run({"x": np.zeros((4, 6, 5), np.float32)})


class _Reader:
    def __init__(self, shape, n=4):
        rng = np.random.default_rng(2)
        self.data = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)])

    def get_next(self):
        return next(self.data, None)


def test_model_quantized_by_onnxruntime_runs_and_matches(tmp_path):
    """Conv -> Relu -> Flatten -> MatMul -> Add, quantized by onnxruntime.quantization (QDQ format,
    per-channel int8 weights, uint8 activations), at two batch sizes."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    b = rng.standard_normal(4).astype(np.float32) * 0.1
    wm = rng.standard_normal((4 * 6 * 6, 5)).astype(np.float32) * 0.1
    bm = rng.standard_normal(5).astype(np.float32) * 0.1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"], axis=1),
             helper.make_node("MatMul", ["f", "wm"], ["mm"]),
             helper.make_node("Add", ["mm", "bm"], ["y"])]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
                          [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (wm, "wm"), (bm, "bm"))])
    fp = tmp_path / "fp32.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), fp)
    qp = tmp_path / "qdq.onnx"
    quantize_static(str(fp), str(qp), _Reader((2, 3, 8, 8)), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    qm = onnx.load(qp)
    ops = {n.op_type for n in qm.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    cm = runtime.load(str(qp))
    assert not {n.op for n in cm.graph.nodes if n.op == "DequantizeLinear" and n.inputs[0] in cm.graph.constants}
    for n in (1, 3):
        x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
        want = _ort(qm, {"x": x})[0]
        got = cm(x)
        # a value next to a rounding boundary may land one quantization step away
        # (float32 summation order differs): allow one step, on few elements
        step = float(onnx.numpy_helper.to_array(next(i for i in qm.graph.initializer if i.name == "y_scale")))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=step * 1.01)
        assert (np.abs(got - want) > step / 2).mean() <= 0.2
    cov = cm.coverage()  # activation Q -> DQ pairs fused into the kernels: nothing on the reference path
    assert cov.nodes.get("reference", 0) == 0 and "QuantizeDequantize" in {n.op for n in cm.graph.nodes}, cov


def test_fused_quantize_dequantize_is_exact():
    """QuantizeDequantize (one op, compiled) equals QuantizeLinear then DequantizeLinear bit for bit,
    on values at rounding boundaries and beyond the clipping range."""
    s = np.float32(0.05)
    x = np.concatenate([(np.arange(-300, 300) + 0.5) * s, np.linspace(-20, 20, 401)]).astype(np.float32)
    x = x[: (x.size // 8) * 8].reshape(-1, 8)
    m = _qdq_model(x.shape, np.array(s), np.array(3, np.int8), TensorProto.INT8, opset=13)
    m.graph.output.pop(0)  # only y: the pair fuses (q read by nothing else)
    cm = runtime.load(m)
    assert [n.op for n in cm.graph.nodes] == ["QuantizeDequantize"]
    got = cm(x)
    np.testing.assert_array_equal(got, _ort(m, {"x": x})[0])
    assert cm.coverage().nodes.get("reference", 0) == 0

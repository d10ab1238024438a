"""Symbolic shapes: propagation through ops, shape-value chains, constraints, errors."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import sympy
from onnx import TensorProto, helper, numpy_helper

from ir import ModelError, ShapeError, import_onnx, simplify
from ir.passes import infer_shapes
from ir.shapes import simplify_dim, symbol

N, S = symbol("N"), symbol("S")


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _vi(name, shape, t=TensorProto.FLOAT):
    """shape None: an output whose shape we leave to inference (rank 1-6 via fresh dim names)."""
    return helper.make_tensor_value_info(name, t, shape)


def _out(name, rank):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [f"{name}_{i}" for i in range(rank)])


def _i64(name, v):
    return numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)


def _shape(m, name):
    return infer_shapes(import_onnx(m)).type_of(name).shape


def test_reshape_minus_one_and_zero_stay_symbolic():
    m = _model([helper.make_node("Reshape", ["x", "s"], ["y"])], [_vi("x", ["N", 4, 8])], [_out("y", 2)],
               [_i64("s", [0, -1])])
    assert _shape(m, "y") == (N, 32)
    m = _model([helper.make_node("Reshape", ["x", "s"], ["y"])], [_vi("x", ["N", 4, 8])], [_out("y", 2)],
               [_i64("s", [-1, 8])])
    assert _shape(m, "y") == (4 * N, 8)  # onnx.shape_inference invents unk__0 here


def test_shape_gather_concat_reshape_chain_resolves():
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "i0"], ["n"], axis=0),
             helper.make_node("Gather", ["sh", "i1"], ["s"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Unsqueeze", ["s", "ax"], ["s1"]),
             helper.make_node("Concat", ["n1", "s1", "h", "d"], ["tgt"], axis=0),
             helper.make_node("Reshape", ["x", "tgt"], ["y"])]
    m = _model(nodes, [_vi("x", ["N", "S", 256])], [_out("y", 4)],
               [_i64("i0", 0), _i64("i1", 1), _i64("ax", [0]), _i64("h", [4]), _i64("d", [64])])
    assert _shape(m, "y") == (N, S, 4, 64)
    g = simplify(import_onnx(m))
    assert [n.op for n in g.nodes] == ["Reshape"]          # the shape chain is gone
    assert list(g.constants[g.nodes[0].inputs[1]]) == [0, 0, 4, 64]


def test_shape_of_static_tensor_folds_to_constant():
    nodes = [helper.make_node("Shape", ["w"], ["sh"]), helper.make_node("Reshape", ["x", "sh"], ["y"])]
    m = _model(nodes, [_vi("x", [2, 3])], [_out("y", 2)],
               [numpy_helper.from_array(np.zeros((3, 2), np.float32), "w")])
    g = simplify(import_onnx(m))
    assert [n.op for n in g.nodes] == ["Reshape"] and g.type_of("y").shape == (3, 2)


@pytest.mark.parametrize("node,shape,expected", [
    (helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1]), ["N", 3, 32, "H"],
     lambda H: (N, 8, 16, sympy.floor((H - 1) / 2) + 1)),
    (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2]), ["N", 3, 32, 32],
     lambda H: (N, 3, 16, 16)),
    (helper.make_node("Flatten", ["x"], ["y"], axis=2), ["N", 3, 32, 32], lambda H: (3 * N, 1024)),
    (helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1]), ["N", 3, 32, "H"], lambda H: (N, 32, H, 3)),
    (helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0), ["N", 3, 32, 32], lambda H: (N, 3)),
    (helper.make_node("GlobalAveragePool", ["x"], ["y"]), ["N", 3, 32, "H"], lambda H: (N, 3, 1, 1)),
])
def test_symbolic_shapes_per_op(node, shape, expected):
    inits = [numpy_helper.from_array(np.zeros((8, 3, 3, 3), np.float32), "w")] if node.op_type == "Conv" else []
    m = _model([node], [_vi("x", shape)], [_out("y", len(expected(symbol("H"))))], inits, opset=13)
    assert _shape(m, "y") == tuple(simplify_dim(d) for d in expected(symbol("H")))  # one canonical form


def test_agrees_with_onnx_shape_inference_on_static_models():
    """Our static shapes equal onnx.shape_inference's on a Conv/Pool/Concat/Split/Slice/Gather model."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], dilations=[2, 2], pads=[2, 1, 2, 1], group=3),
             helper.make_node("AveragePool", ["c"], ["p"], kernel_shape=[3, 3], ceil_mode=1, strides=[2, 2]),
             helper.make_node("Concat", ["p", "p"], ["cc"], axis=1),
             helper.make_node("Split", ["cc"], ["s0", "s1"], axis=1, num_outputs=2),
             helper.make_node("Slice", ["s0", "st", "en", "ax"], ["sl"]),
             helper.make_node("Gather", ["sl", "idx"], ["ga"], axis=3),
             helper.make_node("Pad", ["ga", "pads"], ["pd"]),
             helper.make_node("Expand", ["pd", "es"], ["ex"])]
    inits = [numpy_helper.from_array(np.zeros((6, 1, 3, 3), np.float32), "w"), _i64("st", [1, -3]), _i64("en", [100, -1]),
             _i64("ax", [2, 3]), _i64("idx", [[0, 1], [1, 0]]), _i64("pads", [0, 0, 1, 0, 0, 0, 2, 1, 0, 0]),
             _i64("es", [2, 1, 1, 1, 1, 1])]
    m = _model(nodes, [_vi("x", [2, 3, 31, 29])], [_out("ex", 6)], inits, opset=18)
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    theirs = {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim) for vi in inferred.graph.value_info}
    g = infer_shapes(import_onnx(m))
    for name in ["c", "p", "cc", "s0", "s1", "sl", "ga", "pd"]:
        assert g.type_of(name).shape == theirs[name], name
    out = onnx.shape_inference.infer_shapes(m).graph.output[0]
    assert g.type_of("ex").shape == tuple(d.dim_value for d in out.type.tensor_type.shape.dim)


def test_constraints_between_symbolic_dims():
    m = _model([helper.make_node("Add", ["a", "b"], ["y"])], [_vi("a", ["N", 8]), _vi("b", ["M", 8])], [_out("y", 2)])
    g = infer_shapes(import_onnx(m))
    assert len(g.constraints) == 1 and {str(g.constraints[0][0]), str(g.constraints[0][1])} == {"N", "M"}
    from ir.reference import run_reference
    with pytest.raises(ShapeError, match="must agree"):
        run_reference(g, {"a": np.zeros((2, 8), np.float32), "b": np.zeros((3, 8), np.float32)})


def test_static_mismatch_names_node_and_dims():
    m = _model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")], [_vi("a", ["N", 8]), _vi("b", [7, 4])],
               [_out("y", 2)])
    with pytest.raises(ShapeError, match=r"'mm'.*8 vs 7"):
        infer_shapes(import_onnx(m))


def test_unsatisfiable_reshape_names_node():
    m = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")], [_vi("x", [3, 5])], [_out("y", 2)],
               [_i64("s", [4, -1])])
    with pytest.raises(ShapeError, match=r"'bad_reshape'.*not divisible"):
        infer_shapes(import_onnx(m))
    m = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r2")], [_vi("x", [3, 5])], [_out("y", 2)],
               [_i64("s", [4, 4])])
    with pytest.raises(ShapeError, match=r"'r2'.*15 elements"):
        infer_shapes(import_onnx(m))


def test_malformed_onnx_is_model_error(tmp_path):
    m = _model([helper.make_node("Relu", ["x", "extra_missing"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(ModelError, match="fails onnx.checker"):
        import_onnx(m)
    bad = tmp_path / "junk.onnx"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ModelError, match="junk.onnx"):
        import_onnx(str(bad))


def test_dim_out_of_range_names_input_dim_value_range():
    from ir.reference import run_reference
    from ir.shapes import DimRange
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", 4])], [_out("y", 2)])
    g = simplify(import_onnx(m, dims={"batch": DimRange("batch", 1, 8)}))
    with pytest.raises(ShapeError, match=r"input 'x' axis 0.*'batch' = 9.*\[1, 8\]"):
        run_reference(g, {"x": np.zeros((9, 4), np.float32)})

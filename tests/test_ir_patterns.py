"""The GELU and SiLU rewrites: PyTorch's erf form becomes one Gelu node, x * Sigmoid(x) one Swish node,
and each fuses into the epilogue of the MatMul or Conv before it."""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ir import import_onnx, partition, simplify
from ir.patterns import fuse_gelu, fuse_swish
from ir.reference import run_reference


def gelu_model(form: str):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(1.0), "one"),
             numpy_helper.from_array(np.float32(0.5), "half")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"])]
    if form == "div":
        inits.append(numpy_helper.from_array(np.float32(math.sqrt(2)), "c"))
        nodes.append(helper.make_node("Div", ["h", "c"], ["s"]))
    else:
        inits.append(numpy_helper.from_array(np.float32(1 / math.sqrt(2)), "c"))
        nodes.append(helper.make_node("Mul", ["h", "c"], ["s"]))
    nodes += [helper.make_node("Erf", ["s"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"])]
    if form == "div":  # (x * (1 + erf)) * 0.5, as torch exports
        nodes += [helper.make_node("Mul", ["h", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    else:  # ((1 + erf) * 0.5) * x
        nodes += [helper.make_node("Mul", ["a", "half"], ["m"]), helper.make_node("Mul", ["m", "h"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("form", ["div", "mul"])
def test_erf_gelu_becomes_one_node_and_fuses(form):
    raw = import_onnx(gelu_model(form))
    g = simplify(raw)
    assert [n.op for n in g.nodes] == ["MatMul", "Gelu"]
    [sg] = partition(g)
    assert sg.ops == ["MatMul", "Gelu"]
    x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    np.testing.assert_allclose(run_reference(g, {"x": x})["y"], run_reference(raw, {"x": x})["y"], rtol=1e-5, atol=1e-6)


def test_wrong_constant_is_left_alone():
    m = gelu_model("div")
    for init in m.graph.initializer:
        if init.name == "half":
            init.CopyFrom(numpy_helper.from_array(np.float32(0.25), "half"))
    g = fuse_gelu(import_onnx(m))
    assert "Gelu" not in [n.op for n in g.nodes]


def silu_model(order: str, extra_reader: bool = False):
    """Conv -> Sigmoid -> Mul(conv, sigmoid) (or Mul(sigmoid, conv)), as torch exports nn.SiLU."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["h"], ["s"]),
             helper.make_node("Mul", ["h", "s"] if order == "xs" else ["s", "h"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 9, 11])]
    if extra_reader:   # the Sigmoid's value is read again: it must stay
        nodes.append(helper.make_node("Neg", ["s"], ["z"]))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 9, 11]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 11])],
                          outs, [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("order", ["xs", "sx"])
def test_silu_becomes_swish_and_fuses_into_the_conv(order):
    import runtime
    raw = import_onnx(silu_model(order))
    g = simplify(raw)
    assert [n.op for n in g.nodes] == ["Conv", "Swish"]
    [sg] = partition(g)
    assert sg.ops == ["Conv", "Swish"]
    x = np.random.default_rng(1).standard_normal((1, 4, 9, 11)).astype(np.float32) * 4
    want = run_reference(raw, {"x": x})["y"]
    np.testing.assert_allclose(run_reference(g, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)
    m = runtime.load(silu_model(order))
    np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    assert [st.name for st in m.prepare({"x": x}).steps] == ["Conv + Swish"]


def test_sigmoid_read_elsewhere_is_left_alone():
    g = fuse_swish(import_onnx(silu_model("xs", extra_reader=True)))
    assert "Swish" not in [n.op for n in g.nodes] and "Sigmoid" in [n.op for n in g.nodes]


def tanh_gelu_model(order: str):
    """MatMul -> Reshape -> GELU's tanh form as torch exports GPT-2's `gelu_new`:
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the product in two orders."""
    rng = np.random.default_rng(0)
    consts = {"w": rng.standard_normal((16, 24)).astype(np.float32) * 0.5, "shape": np.array([1, -1, 24], np.int64),
              "half": np.float32(0.5), "three": np.float32(3.0), "c": np.float32(0.044715),
              "k": np.float32(math.sqrt(2 / math.pi)), "one": np.float32(1.0)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"]), helper.make_node("Reshape", ["h0", "shape"], ["h"]),
             helper.make_node("Pow", ["h", "three"], ["p"]), helper.make_node("Mul", ["c", "p"], ["q"]),
             helper.make_node("Add", ["h", "q"], ["a"]), helper.make_node("Mul", ["a", "k"], ["s"]),
             helper.make_node("Tanh", ["s"], ["t"]), helper.make_node("Add", ["one", "t"], ["u"])]
    if order == "half_first":   # (x * 0.5) * (1 + tanh), as GPT-2's export
        nodes += [helper.make_node("Mul", ["h", "half"], ["hh"]), helper.make_node("Mul", ["hh", "u"], ["y"])]
    else:                       # (x * (1 + tanh)) * 0.5
        nodes += [helper.make_node("Mul", ["u", "h"], ["m"]), helper.make_node("Mul", ["half", "m"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", 24])],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("order", ["half_first", "half_last"])
def test_tanh_gelu_becomes_one_node_and_fuses_past_the_reshape(order):
    import runtime
    raw = import_onnx(tanh_gelu_model(order))
    g = simplify(raw)
    assert [n.op for n in g.nodes] == ["MatMul", "Gelu", "Reshape"]
    assert g.nodes[1].attrs["approximate"] == "tanh"
    assert [sg.ops for sg in partition(g)][0] == ["MatMul", "Gelu"]
    x = np.random.default_rng(1).standard_normal((7, 16)).astype(np.float32) * 2
    want = run_reference(raw, {"x": x})["y"]
    np.testing.assert_allclose(run_reference(g, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(runtime.load(tanh_gelu_model(order)).run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)


def test_reshape_stays_where_its_value_is_read_twice():
    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h0"]), helper.make_node("Reshape", ["h0", "shape"], ["h"]),
         helper.make_node("Relu", ["h"], ["y"]), helper.make_node("Neg", ["h"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 5]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3, 5])],
        [numpy_helper.from_array(rng.standard_normal((4, 5)).astype(np.float32), "w"),
         numpy_helper.from_array(np.array([1, 3, 5], np.int64), "shape")])
    s = simplify(import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])))
    assert [n.op for n in s.nodes].index("Reshape") < [n.op for n in s.nodes].index("Relu")

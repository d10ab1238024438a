"""Partitioner rules (TVM pattern kinds) and the partition description."""
from __future__ import annotations

import numpy as np

from ir.fusion import describe_partition, partition
from ir.graph import Graph, Node, TensorType
from ir.passes import infer_shapes
from ir.shapes import DimRange, symbol

N = symbol("N")


def _graph(nodes, inputs, outputs, constants=None, types=None):
    return infer_shapes(Graph(nodes, list(inputs), list(outputs), dict(constants or {}), dict(types or {}),
                              {"N": DimRange("N")}))


def _w(*shape):
    return np.ones(shape, np.float32)


def test_anchor_absorbs_bias_activation_and_residual():
    g = _graph([Node("MatMul", ("x", "w"), ("m",)), Node("Add", ("m", "b"), ("a",)),
                Node("Relu", ("a",), ("r",)), Node("Add", ("r", "x"), ("y",))], ["x"], ["y"],
               {"w": _w(8, 8), "b": _w(8)}, {"x": TensorType((N, 8))})
    sgs = partition(g)
    assert [(str(s), s.kind) for s in sgs] == [("MatMul + Add + Relu + Add", "anchor")]
    assert sgs[0].inputs == ["x", "w", "b"] and sgs[0].output == "y"


def test_conv_absorbs_epilogue_but_not_a_shape_change():
    g = _graph([Node("Conv", ("x", "w"), ("c",)), Node("Mul", ("c", "s"), ("m",)), Node("Relu", ("m",), ("r",)),
                Node("Flatten", ("r",), ("y",))], ["x"], ["y"], {"w": _w(4, 3, 1, 1), "s": _w(4, 1, 1)},
               {"x": TensorType((N, 3, 2, 2))})
    assert [(str(s), s.kind) for s in partition(g)] == [("Conv + Mul + Relu", "anchor"), ("Flatten", "injective")]


def test_value_with_two_consumers_ends_a_group():
    g = _graph([Node("MatMul", ("x", "w"), ("m",)), Node("Relu", ("m",), ("r",)), Node("Add", ("m", "r"), ("y",))],
               ["x"], ["y"], {"w": _w(8, 8)}, {"x": TensorType((N, 8))})
    assert [str(s) for s in partition(g)] == ["MatMul", "Relu + Add"]


def test_reduction_absorbs_elementwise_prologue():
    g = _graph([Node("Add", ("x", "b"), ("a",)), Node("Mul", ("a", "s"), ("m",)),
                Node("Softmax", ("m",), ("p",), {"axis": -1}), Node("Relu", ("p",), ("y",))],
               ["x"], ["y"], {"b": _w(8), "s": _w(8)}, {"x": TensorType((N, 8))})
    sgs = partition(g)
    assert [(str(s), s.kind) for s in sgs] == [("Add + Mul + Softmax", "reduce"), ("Relu", "elemwise")]


def test_injective_ops_chain():
    g = _graph([Node("Reshape", ("x", "s"), ("r",)), Node("Transpose", ("r",), ("t",), {"perm": [0, 2, 1]}),
                Node("MatMul", ("t", "w"), ("y",))], ["x"], ["y"],
               {"s": np.array([0, 2, 4], np.int64), "w": _w(2, 3)}, {"x": TensorType((N, 8))})
    assert [(str(s), s.kind) for s in partition(g)] == [("Reshape + Transpose", "injective"), ("MatMul", "anchor")]


def test_describe_partition_groups_by_signature_and_lists_fallbacks():
    nodes = []
    x = "x"
    for k in range(3):
        nodes += [Node("MatMul", (x, f"w{k}"), (f"m{k}",)), Node("Relu", (f"m{k}",), (f"r{k}",))]
        x = f"r{k}"
    nodes.append(Node("DeformConv", (x,), ("y",)))     # no reference of ours: falls back
    g = Graph(nodes, ["x"], ["y"], {f"w{k}": _w(16, 16) for k in range(3)}, {"x": TensorType((N, 16))},
              {"N": DimRange("N", 1, 64)}, hints={"y": TensorType((N, 16))})
    g = infer_shapes(g)
    text = describe_partition(g, partition(g))
    lines = text.splitlines()
    assert "4 subgraphs, 2 distinct workloads" in lines[0] and "N in [1, 64]" in lines[0]
    row = next(line for line in lines if "MatMul + Relu" in line)
    assert " 3 " in row and "528*N" in row  # 2*16*16 + 16 (Relu) and "float32[N, 16]" in row
    assert lines[-1] == "fallback to onnx.reference: DeformConv"


def test_partition_comes_in_dependency_order():
    """A residual Add absorbed by a later conv group reads the downsample branch's output:
    the partition must list that branch first (it once came after, and the executor failed)."""
    from ir import import_onnx, simplify
    from tests.models import make_resnet18
    g = simplify(import_onnx(make_resnet18(image=32)))
    made = set(g.inputs) | set(g.constants)
    for sg in partition(g):
        assert set(sg.inputs) <= made, (str(sg), set(sg.inputs) - made)
        made |= {o for n in sg.nodes for o in n.outputs if o}

"""Each pass on a small graph built by hand, checked for structure and for unchanged numerics."""
from __future__ import annotations

import numpy as np
import pytest

from ir.graph import Graph, Node, TensorType
from ir.passes import (cancel_transposes, decompose_gemm, eliminate_dead_code, fold_batchnorm, fold_constants,
                       infer_shapes, remove_identities, resolve_reshape_targets, simplify)
from ir.reference import run_reference
from ir.shapes import DimRange, symbol

N = symbol("N")
RNG = np.random.default_rng(0)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _graph(nodes, inputs, outputs, constants=None, types=None):
    g = Graph(nodes, list(inputs), list(outputs), dict(constants or {}), dict(types or {}),
              {"N": DimRange("N")})
    return infer_shapes(g)


def _same_numbers(g1, g2, feeds):
    a, b = run_reference(g1, feeds), run_reference(g2, feeds)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-5)


def test_fold_constants_evaluates_constant_subgraphs():
    g = _graph([Node("Transpose", ("w",), ("wt",), {"perm": [1, 0]}),
                Node("Mul", ("wt", "two"), ("w2",)),
                Node("MatMul", ("x", "w2"), ("y",))], ["x"], ["y"],
               {"w": _f32(3, 4), "two": np.float32(2)}, {"x": TensorType((N, 4))})
    f = fold_constants(g)
    assert [n.op for n in f.nodes] == ["MatMul"]
    np.testing.assert_allclose(f.constants["w2"], 2 * g.constants["w"].T)
    _same_numbers(g, f, {"x": _f32(2, 4)})


def test_dead_code_is_removed():
    g = _graph([Node("Relu", ("x",), ("dead",)), Node("Neg", ("x",), ("y",))], ["x"], ["y"],
               {"unused": _f32(3)}, {"x": TensorType((N, 4))})
    d = eliminate_dead_code(g)
    assert [n.op for n in d.nodes] == ["Neg"] and "unused" not in d.constants


def test_identities_and_noops_are_removed():
    g = _graph([Node("Identity", ("x",), ("a",)),
                Node("Dropout", ("a",), ("b",)),
                Node("Cast", ("b",), ("c",), {"to": 1}),
                Node("Reshape", ("c", "same"), ("d",)),
                Node("Cast", ("d",), ("e",), {"to": 11}),     # a real cast stays
                Node("Relu", ("e",), ("y",))], ["x"], ["y"],
               {"same": np.array([0, 4], np.int64)}, {"x": TensorType((N, 4))})
    r = remove_identities(g)
    assert [n.op for n in r.nodes] == ["Cast", "Relu"] and r.nodes[0].inputs == ("x",)
    _same_numbers(g, r, {"x": _f32(3, 4)})


def test_batchnorm_folds_into_conv():
    c = 4
    bn = {"s": _f32(c) + 2, "b": _f32(c), "m": _f32(c), "v": np.abs(_f32(c)) + 0.5}
    g = _graph([Node("Conv", ("x", "w", "cb"), ("c",), {"pads": [1, 1, 1, 1]}),
                Node("BatchNormalization", ("c", "s", "b", "m", "v"), ("y",), {"epsilon": 1e-5})],
               ["x"], ["y"], {"w": _f32(c, 3, 3, 3), "cb": _f32(c), **bn}, {"x": TensorType((N, 3, 8, 8))})
    f = fold_batchnorm(g)
    assert [n.op for n in f.nodes] == ["Conv"]
    _same_numbers(g, f, {"x": _f32(2, 3, 8, 8)})


def test_batchnorm_folds_into_matmul_bias():
    c = 5
    bn = {"s": _f32(c) + 2, "b": _f32(c), "m": _f32(c), "v": np.abs(_f32(c)) + 0.5}
    g = _graph([Node("MatMul", ("x", "w"), ("h",)), Node("Add", ("h", "bias"), ("hb",)),
                Node("BatchNormalization", ("hb", "s", "b", "m", "v"), ("y",))],
               ["x"], ["y"], {"w": _f32(3, c), "bias": _f32(c), **bn}, {"x": TensorType((N, 3))})
    f = fold_batchnorm(g)
    assert [n.op for n in f.nodes] == ["MatMul", "Add"]
    _same_numbers(g, f, {"x": _f32(4, 3)})


def test_lone_batchnorm_becomes_mul_add():
    c = 3
    bn = {"s": _f32(c), "b": _f32(c), "m": _f32(c), "v": np.abs(_f32(c)) + 0.5}
    g = _graph([Node("BatchNormalization", ("x", "s", "b", "m", "v"), ("y",))], ["x"], ["y"], bn,
               {"x": TensorType((N, c, 4, 4))})
    f = fold_batchnorm(g)
    assert [n.op for n in f.nodes] == ["Mul", "Add"] and f.constants["BatchNormalization:y/scale"].shape == (c, 1, 1)
    _same_numbers(g, f, {"x": _f32(2, c, 4, 4)})


def test_transposes_and_reshapes_cancel():
    g = _graph([Node("Transpose", ("x",), ("t1",), {"perm": [0, 2, 1]}),
                Node("Transpose", ("t1",), ("t2",), {"perm": [0, 2, 1]}),
                Node("Reshape", ("t2", "s1"), ("r1",)),
                Node("Reshape", ("r1", "s2"), ("r2",)),
                Node("Relu", ("r2",), ("y",))], ["x"], ["y"],
               {"s1": np.array([-1, 12], np.int64), "s2": np.array([-1, 3, 4], np.int64)}, {"x": TensorType((N, 3, 4))})
    c = eliminate_dead_code(cancel_transposes(g))
    assert [n.op for n in c.nodes] == ["Relu"]        # both pairs cancel; the final Reshape is a no-op
    _same_numbers(g, c, {"x": _f32(2, 3, 4)})


def test_transpose_pair_composes():
    g = _graph([Node("Transpose", ("x",), ("t1",), {"perm": [1, 2, 0]}),
                Node("Transpose", ("t1",), ("y",), {"perm": [1, 0, 2]})], ["x"], ["y"], {},
               {"x": TensorType((2, 3, 4))})
    c = eliminate_dead_code(cancel_transposes(g))
    assert len(c.nodes) == 1 and c.nodes[0].attrs["perm"] == [2, 1, 0]
    _same_numbers(g, c, {"x": _f32(2, 3, 4)})


def test_gemm_decomposes_into_matmul_epilogue():
    g = _graph([Node("Gemm", ("x", "w", "b"), ("y",), {"transB": 1, "alpha": 2.0, "beta": 0.5})], ["x"], ["y"],
               {"w": _f32(5, 3), "b": _f32(5)}, {"x": TensorType((N, 3))})
    d = fold_constants(decompose_gemm(g))
    assert [n.op for n in d.nodes] == ["MatMul", "Mul", "Add"]
    _same_numbers(g, d, {"x": _f32(2, 3)})


def test_resolve_reshape_targets_turns_shape_values_into_constants():
    g = _graph([Node("Shape", ("x",), ("sh",)),
                Node("Concat", ("sh", "tail"), ("tgt",), {"axis": 0}),
                Node("Reshape", ("x", "tgt"), ("y",))], ["x"], ["y"],
               {"tail": np.array([1], np.int64)}, {"x": TensorType((N, 4))})
    r = eliminate_dead_code(resolve_reshape_targets(g))
    assert [n.op for n in r.nodes] == ["Reshape"] and list(r.constants[r.nodes[0].inputs[1]]) == [0, 4, 1]
    _same_numbers(g, r, {"x": _f32(3, 4)})


def test_simplify_pipeline_keeps_numbers():
    bn = {"s": _f32(4) + 2, "b": _f32(4), "m": _f32(4), "v": np.abs(_f32(4)) + 0.5}
    g = _graph([Node("Identity", ("x",), ("xi",)),
                Node("Conv", ("xi", "w"), ("c",)),
                Node("BatchNormalization", ("c", "s", "b", "m", "v"), ("bn",)),
                Node("Relu", ("bn",), ("r",)),
                Node("Flatten", ("r",), ("y",))], ["x"], ["y"], {"w": _f32(4, 2, 1, 1), **bn},
               {"x": TensorType((N, 2, 3, 3))})
    s = simplify(g)
    assert [n.op for n in s.nodes] == ["Conv", "Relu", "Flatten"]
    _same_numbers(g, s, {"x": _f32(2, 2, 3, 3)})

"""MatMul and Gemm: the anchors of dense subgraphs."""
from __future__ import annotations

import numpy as np

from ir.errors import ShapeError
from ir.graph import TensorType
from ir.ops.registry import ANCHOR, broadcast_shapes, note_equal, register
from ir.shapes import format_shape


def _same_dim(node, a, b, what):
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise ShapeError(f"node '{node.name}' ({node.op}): {what} mismatch: {a} vs {b}")
    note_equal(node, a, b)


def _matmul_infer(node, types, consts):
    a, b = types[0].shape, types[1].shape
    if len(a) == 0 or len(b) == 0:
        raise ShapeError(f"node '{node.name}' (MatMul): scalar operands are not allowed")
    a2 = a if len(a) > 1 else (1,) + tuple(a)
    b2 = b if len(b) > 1 else tuple(b) + (1,)
    _same_dim(node, a2[-1], b2[-2], f"inner dims of {format_shape(a)} @ {format_shape(b)}")
    batch = broadcast_shapes(node, tuple(a2[:-2]), tuple(b2[:-2]))
    out = tuple(batch) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return [TensorType(out, types[0].dtype)]


register("MatMul", ANCHOR, _matmul_infer, lambda n, xs: [np.matmul(xs[0], xs[1])])


def _gemm_infer(node, types, consts):
    a, b = types[0].shape, types[1].shape
    if len(a) != 2 or len(b) != 2:
        raise ShapeError(f"node '{node.name}' (Gemm): needs 2-D inputs, got {format_shape(a)} and {format_shape(b)}")
    m, ka = (a[1], a[0]) if node.attrs.get("transA", 0) else (a[0], a[1])
    kb, n = (b[1], b[0]) if node.attrs.get("transB", 0) else (b[0], b[1])
    _same_dim(node, ka, kb, "inner dims")
    out = (m, n)
    if len(types) > 2:
        broadcast_shapes(node, out, types[2].shape)
    return [TensorType(out, types[0].dtype)]


def _gemm_ref(node, xs):
    a, b = xs[0], xs[1]
    if node.attrs.get("transA", 0):
        a = a.T
    if node.attrs.get("transB", 0):
        b = b.T
    y = np.float32(node.attrs.get("alpha", 1.0)) * (a @ b)
    if len(xs) > 2 and xs[2] is not None:
        y = y + np.float32(node.attrs.get("beta", 1.0)) * xs[2]
    return [y.astype(xs[0].dtype, copy=False)]


register("Gemm", ANCHOR, _gemm_infer, _gemm_ref)

"""Indexing, scatter/gather, cumulative, sorting and layout ops (injective or opaque).

Ops whose output size depends on the data (NonZero, Compress, Unique, TopK with a
run-time K, OneHot with a run-time depth) raise `DataDependentShapeError` from their
shape function: the importer then takes the model's annotation, or the runtime
the size the reference produces.
"""
from __future__ import annotations

import numpy as np

from ir.errors import DataDependentShapeError, ShapeError
from ir.graph import TensorType
from ir.ops.elementwise import _DTYPE_NAMES
from ir.ops.registry import INJECTIVE, OPAQUE, dims_of, register
from ir.shapes import format_shape


def _axis(node, rank, default=0):
    a = int(node.attrs.get("axis", default))
    if not -rank <= a < max(rank, 1):
        raise ShapeError(f"node '{node.name}' ({node.op}): axis {a} out of range for rank {rank}")
    return a % max(rank, 1)


def _data_dependent(node, what):
    raise DataDependentShapeError(f"node '{node.name}' ({node.op}): the output shape depends on {what}")


def _const_int(node, consts, i, what) -> int:
    if len(consts) <= i or consts[i] is None:
        _data_dependent(node, what)
    v = dims_of(consts[i])
    if len(v) != 1 or not isinstance(v[0], int):
        _data_dependent(node, what)
    return v[0]


def _wrap(idx, size):
    """Negative indices count from the end (ONNX gather/scatter semantics)."""
    idx = np.asarray(idx, dtype=np.int64)
    return np.where(idx < 0, idx + size, idx)


# -- GatherElements / ScatterElements ------------------------------------------------------
def _gather_elements(node, xs):
    x, idx = xs
    axis = _axis(node, x.ndim)
    return [np.take_along_axis(x, _wrap(idx, x.shape[axis]), axis=axis)]


register("GatherElements", INJECTIVE, lambda n, t, c: [TensorType(t[1].shape, t[0].dtype)], _gather_elements)

_REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduction(node):
    r = node.attrs.get("reduction", "none")
    if r != "none" and r not in _REDUCTIONS:
        raise ShapeError(f"node '{node.name}' ({node.op}): unknown reduction '{r}'")
    return None if r == "none" else _REDUCTIONS[r]


def _scatter_elements(node, xs):
    x, idx, upd = xs
    axis = _axis(node, x.ndim)
    y = x.copy()
    idx = _wrap(idx, x.shape[axis])
    grid = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    where = tuple(np.broadcast_arrays(*grid))
    fn = _reduction(node)
    if fn is None:
        y[where] = upd
    else:
        fn.at(y, where, upd)
    return [y]


register("ScatterElements", INJECTIVE, lambda n, t, c: [t[0]], _scatter_elements)
register("Scatter", INJECTIVE, lambda n, t, c: [t[0]], _scatter_elements)  # deprecated alias (opset 9-10)


# -- GatherND / ScatterND --------------------------------------------------------------------
def _gather_nd_infer(node, types, consts):
    data, idx = types[0].shape, types[1].shape
    b = int(node.attrs.get("batch_dims", 0))
    last = idx[-1]
    if not isinstance(last, int):
        raise ShapeError(f"node '{node.name}' (GatherND): the last dim of indices {format_shape(idx)} must be static")
    return [TensorType(tuple(idx[:-1]) + tuple(data[b + last:]), types[0].dtype)]


def _gather_nd(node, xs):
    data, idx = xs
    b = int(node.attrs.get("batch_dims", 0))
    bshape = data.shape[:b]
    nb = int(np.prod(bshape, dtype=np.int64))
    d2 = data.reshape((nb,) + data.shape[b:])
    i2 = idx.reshape((nb,) + idx.shape[b:])
    k = idx.shape[-1]
    out = []
    for j in range(nb):
        ij = _wrap(i2[j], np.asarray(d2[j].shape[:k])).reshape(-1, k)
        out.append(d2[j][tuple(ij.T)])
    y = np.stack(out) if out else np.empty((0,), data.dtype)
    return [y.reshape(idx.shape[:-1] + data.shape[b + k:])]


register("GatherND", INJECTIVE, _gather_nd_infer, _gather_nd)


def _scatter_nd(node, xs):
    data, idx, upd = xs
    y = data.copy()
    k = idx.shape[-1]
    flat_idx = _wrap(idx.reshape(-1, k), np.asarray(data.shape[:k]))
    flat_upd = upd.reshape((flat_idx.shape[0],) + data.shape[k:])
    fn = _reduction(node)
    for i, u in zip(flat_idx, flat_upd):
        t = tuple(i)
        y[t] = u if fn is None else fn(y[t], u)
    return [y]


register("ScatterND", INJECTIVE, lambda n, t, c: [t[0]], _scatter_nd)


# -- Trilu / EyeLike / OneHot ------------------------------------------------------------------
def _trilu(node, xs):
    x = xs[0]
    k = int(np.asarray(xs[1]).reshape(-1)[0]) if len(xs) > 1 and xs[1] is not None else 0
    return [np.triu(x, k) if node.attrs.get("upper", 1) else np.tril(x, k)]


register("Trilu", INJECTIVE, lambda n, t, c: [t[0]], _trilu)


def _eyelike_dtype(node, in_dtype):
    to = node.attrs.get("dtype")
    return in_dtype if to is None else _DTYPE_NAMES.get(int(to), in_dtype)


def _eyelike(node, xs):
    x = xs[0]
    return [np.eye(x.shape[0], x.shape[1], int(node.attrs.get("k", 0)), dtype=_eyelike_dtype(node, x.dtype))]


register("EyeLike", OPAQUE, lambda n, t, c: [TensorType(t[0].shape, _eyelike_dtype(n, t[0].dtype))], _eyelike)


def _onehot_infer(node, types, consts):
    depth = _const_int(node, consts, 1, "the depth input")
    shape = list(types[0].shape)
    axis = int(node.attrs.get("axis", -1))
    axis = axis + len(shape) + 1 if axis < 0 else axis
    return [TensorType(tuple(shape[:axis]) + (depth,) + tuple(shape[axis:]), types[2].dtype)]


def _onehot(node, xs):
    idx, depth, values = xs
    depth = int(np.asarray(depth).reshape(-1)[0])
    idx = np.asarray(idx).astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    hot = idx[..., None] == np.arange(depth)
    y = np.where(hot, values[1], values[0]).astype(values.dtype)
    axis = int(node.attrs.get("axis", -1))
    axis = axis + idx.ndim + 1 if axis < 0 else axis
    return [np.moveaxis(y, -1, axis)]


register("OneHot", OPAQUE, _onehot_infer, _onehot)


# -- data-dependent sizes: NonZero, Compress, Unique, TopK -------------------------------------
register("NonZero", OPAQUE, lambda n, t, c: _data_dependent(n, "how many elements are non-zero"),
         lambda n, xs: [np.asarray(np.nonzero(xs[0]), dtype=np.int64).reshape(xs[0].ndim, -1)])


def _compress(node, xs):
    x, cond = xs
    axis = node.attrs.get("axis")
    return [np.compress(np.asarray(cond, dtype=bool), x, axis=None if axis is None else int(axis))]


register("Compress", OPAQUE, lambda n, t, c: _data_dependent(n, "the condition"), _compress)


def _unique(node, xs):
    x = xs[0]
    axis = node.attrs.get("axis")
    y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True,
                                          axis=None if axis is None else int(axis))
    if not node.attrs.get("sorted", 1):  # first-occurrence order
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        y = np.take(y, order, axis=0 if axis is None else int(axis))
        first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
    return [y, first.astype(np.int64), inverse.reshape(-1).astype(np.int64), counts.astype(np.int64)]


register("Unique", OPAQUE, lambda n, t, c: _data_dependent(n, "how many values are distinct"), _unique)


def _topk_infer(node, types, consts):
    k = _const_int(node, consts, 1, "K") if len(node.inputs) > 1 else int(node.attrs["k"])
    shape = list(types[0].shape)
    shape[_axis(node, len(shape), -1)] = k
    return [TensorType(tuple(shape), types[0].dtype), TensorType(tuple(shape), "int64")]


def _topk(node, xs):
    x = xs[0]
    k = int(np.asarray(xs[1]).reshape(-1)[0]) if len(xs) > 1 else int(node.attrs["k"])
    axis = _axis(node, x.ndim, -1)
    n = x.shape[axis]
    if node.attrs.get("largest", 1):
        # descending, ties by lower index: a stable ascending sort of the reversed axis, reversed
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    vals = np.take_along_axis(x, idx, axis=axis)  # sorted=0 allows any order; sorted is one
    return [vals, idx.astype(np.int64)]


register("TopK", OPAQUE, _topk_infer, _topk)


# -- CumSum / CumProd ---------------------------------------------------------------------------
def _cumulative(np_fn, identity):
    def ref(node, xs):
        x = xs[0]
        axis = int(np.asarray(xs[1]).reshape(-1)[0]) % x.ndim
        rev = node.attrs.get("reverse", 0)
        y = np.flip(x, axis) if rev else x
        y = np_fn(y, axis=axis, dtype=x.dtype)
        if node.attrs.get("exclusive", 0):
            pad = np.full_like(np.take(y, [0], axis=axis), identity)
            y = np.concatenate([pad, np.delete(y, -1, axis=axis)], axis=axis)
        return [np.flip(y, axis) if rev else y]
    return ref


register("CumSum", OPAQUE, lambda n, t, c: [t[0]], _cumulative(np.cumsum, 0))
register("CumProd", OPAQUE, lambda n, t, c: [t[0]], _cumulative(np.cumprod, 1))


# -- ReverseSequence ------------------------------------------------------------------------------
def _reverse_sequence(node, xs):
    x, lens = xs
    t_axis, b_axis = int(node.attrs.get("time_axis", 0)), int(node.attrs.get("batch_axis", 1))
    y = x.copy()
    for b, n in enumerate(np.asarray(lens).reshape(-1)):
        sel = [slice(None)] * x.ndim
        sel[b_axis], sel[t_axis] = b, slice(0, int(n))
        y[tuple(sel)] = np.flip(x[tuple(sel)], axis=t_axis - (1 if b_axis < t_axis else 0))
    return [y]


register("ReverseSequence", INJECTIVE, lambda n, t, c: [t[0]], _reverse_sequence)


# -- DepthToSpace / SpaceToDepth ------------------------------------------------------------------
def _blocksize(node):
    return int(node.attrs["blocksize"])


def _d2s_infer(node, types, consts):
    n, c, h, w = types[0].shape
    b = _blocksize(node)
    if isinstance(c, int) and c % (b * b):
        raise ShapeError(f"node '{node.name}' (DepthToSpace): channels {c} not divisible by blocksize^2 = {b * b}")
    return [TensorType((n, c // (b * b), h * b, w * b), types[0].dtype)]


def _d2s(node, xs):
    x = xs[0]
    n, c, h, w = x.shape
    b = _blocksize(node)
    if node.attrs.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [y.reshape(n, c // (b * b), h * b, w * b)]


def _s2d_infer(node, types, consts):
    n, c, h, w = types[0].shape
    b = _blocksize(node)
    return [TensorType((n, c * b * b, h // b, w // b), types[0].dtype)]


def _s2d(node, xs):
    x = xs[0]
    n, c, h, w = x.shape
    b = _blocksize(node)
    perm = (0, 1, 3, 5, 2, 4) if node.attrs.get("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(perm)
    return [y.reshape(n, c * b * b, h // b, w // b)]


register("DepthToSpace", INJECTIVE, _d2s_infer, _d2s)
register("SpaceToDepth", INJECTIVE, _s2d_infer, _s2d)

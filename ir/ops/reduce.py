"""Reductions: Reduce*, Softmax, LogSoftmax, LayerNormalization (kind "reduce").

Reduce axes come from the `axes` attribute (old opsets) or the second input (new ones).
"""
from __future__ import annotations

import numpy as np

from ir.errors import DataDependentShapeError, ShapeError
from ir.graph import TensorType
from ir.ops.registry import REDUCE, dims_of, register


def _axes(node, rank, consts):
    """The reduced axes, normalized; None means all axes."""
    if len(consts) > 1 and node.inputs[1]:
        if consts[1] is None:
            raise DataDependentShapeError(f"node '{node.name}' ({node.op}): axes input must be a constant")
        axes = dims_of(consts[1])
    else:
        axes = node.attrs.get("axes")
    if not axes:
        return [] if node.attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    for a in axes:
        if not -rank <= int(a) < rank:
            raise ShapeError(f"node '{node.name}' ({node.op}): axis {a} out of range for rank {rank}")
    return sorted(int(a) % rank for a in axes)


def _reduce_infer(node, types, consts):
    shape = types[0].shape
    axes = _axes(node, len(shape), consts)
    keep = node.attrs.get("keepdims", 1)
    out = tuple((1 if i in axes else d) for i, d in enumerate(shape) if keep or i not in axes)
    return [TensorType(out, types[0].dtype)]


def _reduce(np_fn, post=None):
    def ref(node, xs):
        x = xs[0]
        axes = _axes(node, x.ndim, xs)
        keep = bool(node.attrs.get("keepdims", 1))
        if not axes:
            y = x.copy()
        else:
            y = np_fn(x, axis=tuple(axes), keepdims=keep)
        if post is not None:
            y = post(y)
        return [np.asarray(y).astype(x.dtype, copy=False)]
    return ref


register("ReduceMean", REDUCE, _reduce_infer, _reduce(np.mean))
register("ReduceSum", REDUCE, _reduce_infer, _reduce(np.sum))
def _extreme(fn, empty):
    """max/min that return the identity (-inf / +inf) over an empty set, as ONNX does."""
    def f(x, axis, keepdims):
        if x.size == 0:
            init = (np.iinfo(x.dtype).min if empty < 0 else np.iinfo(x.dtype).max) if x.dtype.kind in "iu" \
                else (False if empty < 0 else True) if x.dtype == bool else empty * np.inf
            return fn(x, axis=axis, keepdims=keepdims, initial=init)
        return fn(x, axis=axis, keepdims=keepdims)
    return f


register("ReduceMax", REDUCE, _reduce_infer, _reduce(_extreme(np.max, -1)))
register("ReduceMin", REDUCE, _reduce_infer, _reduce(_extreme(np.min, 1)))
register("ReduceProd", REDUCE, _reduce_infer, _reduce(np.prod))
register("ReduceL2", REDUCE, _reduce_infer, _reduce(lambda x, **k: np.sqrt(np.sum(x * x, **k))))
register("ReduceSumSquare", REDUCE, _reduce_infer, _reduce(lambda x, **k: np.sum(x * x, **k)))


# -- Softmax / LogSoftmax -------------------------------------------------------------
def _softmax_2d(node, x):
    """Opset < 13 semantics: flatten to 2-D at `axis` (default 1), softmax over the tail."""
    axis = int(node.attrs.get("axis", 1)) % max(x.ndim, 1)
    return x.reshape(int(np.prod(x.shape[:axis])), -1), 1


def _softmax(log):
    def ref(node, xs):
        x = xs[0]
        if node.attrs.get("_opset", 13) < 13:
            x2, axis = _softmax_2d(node, x)
        else:
            x2, axis = x, int(node.attrs.get("axis", -1))
        z = x2 - x2.max(axis=axis, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=axis, keepdims=True)
        y = z - np.log(s) if log else e / s
        return [y.reshape(x.shape).astype(x.dtype, copy=False)]
    return ref


register("Softmax", REDUCE, lambda n, t, c: [t[0]], _softmax(False), flops_per_elem=5)
register("LogSoftmax", REDUCE, lambda n, t, c: [t[0]], _softmax(True), flops_per_elem=5)


# -- LayerNormalization (one op: normalizes over axes [axis, rank)) --------------------
def _ln_infer(node, types, consts):
    shape = types[0].shape
    axis = int(node.attrs.get("axis", -1)) % len(shape)
    stat = tuple(d if i < axis else 1 for i, d in enumerate(shape))
    stash = "float32" if types[0].dtype in ("float16", "bfloat16") else types[0].dtype
    return [types[0], TensorType(stat, stash), TensorType(stat, stash)]


def _ln_ref(node, xs):
    x = xs[0]
    axis = int(node.attrs.get("axis", -1)) % x.ndim
    axes = tuple(range(axis, x.ndim))
    eps = node.attrs.get("epsilon", 1e-5)
    xf = x.astype(np.float32) if x.dtype != np.float64 else x
    mean = xf.mean(axis=axes, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(var + np.asarray(eps, dtype=xf.dtype))
    y = (xf - mean) * inv * xs[1]
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2]
    return [y.astype(x.dtype), mean.astype(xf.dtype), inv.astype(xf.dtype)]


register("LayerNormalization", REDUCE, _ln_infer, _ln_ref, flops_per_elem=8)


def _argmax(fn):
    def infer(node, types, consts):
        shape = types[0].shape
        axis = int(node.attrs.get("axis", 0)) % len(shape)
        keep = node.attrs.get("keepdims", 1)
        out = tuple((1 if i == axis else d) for i, d in enumerate(shape) if keep or i != axis)
        return [TensorType(out, "int64")]

    def ref(node, xs):
        x = xs[0]
        axis = int(node.attrs.get("axis", 0)) % x.ndim
        if node.attrs.get("select_last_index", 0):
            y = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            y = fn(x, axis=axis)
        if node.attrs.get("keepdims", 1):
            y = np.expand_dims(y, axis)
        return [np.asarray(y, dtype=np.int64)]
    return infer, ref


register("ArgMax", REDUCE, *_argmax(np.argmax))
register("ArgMin", REDUCE, *_argmax(np.argmin))

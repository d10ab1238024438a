"""Normalizations, more reductions, Hardmax and the two classification losses (kind "reduce").

Statistics are computed in float32 for float16 inputs (as onnxruntime does) and cast back.
"""
from __future__ import annotations

import numpy as np

from ir.errors import ShapeError
from ir.graph import TensorType
from ir.ops.reduce import _reduce, _reduce_infer
from ir.ops.registry import REDUCE, register


def _f(x):
    """Compute dtype: float32 for half types, else the input's."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


# -- reductions built from the existing Reduce machinery -----------------------------------
def _logsumexp(x, axis, keepdims):
    m = np.max(x, axis=axis, keepdims=True) if x.size else np.zeros((1,) * x.ndim, x.dtype)
    m = np.where(np.isfinite(m), m, 0)
    y = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return y if keepdims else np.squeeze(y, axis=axis)


register("ReduceL1", REDUCE, _reduce_infer, _reduce(lambda x, **k: np.sum(np.abs(x), **k)))
register("ReduceLogSum", REDUCE, _reduce_infer, _reduce(lambda x, **k: np.log(np.sum(x, **k))))
register("ReduceLogSumExp", REDUCE, _reduce_infer, _reduce(_logsumexp))


# -- Hardmax: one-hot of the first maximum along an axis -------------------------------------
def _hardmax(node, xs):
    x = xs[0]
    if node.attrs.get("_opset", 13) < 13:  # flattened to 2-D at axis (default 1)
        axis = int(node.attrs.get("axis", 1)) % max(x.ndim, 1)
        x2 = x.reshape(int(np.prod(x.shape[:axis])), -1)
        return [_hardmax_axis(x2, 1).reshape(x.shape)]
    return [_hardmax_axis(x, int(node.attrs.get("axis", -1)) % x.ndim)]


def _hardmax_axis(x, axis):
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    y = np.zeros_like(x)
    np.put_along_axis(y, idx, 1, axis=axis)
    return y


register("Hardmax", REDUCE, lambda n, t, c: [t[0]], _hardmax)


# -- normalizations ---------------------------------------------------------------------------
def _instance_norm(node, xs):
    x, scale, bias = xs
    xf = _f(x)
    axes = tuple(range(2, x.ndim))
    mean = xf.mean(axis=axes, keepdims=True)
    var = xf.var(axis=axes, keepdims=True)
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    y = (xf - mean) / np.sqrt(var + node.attrs.get("epsilon", 1e-5)) * scale.reshape(bshape) + bias.reshape(bshape)
    return [y.astype(x.dtype)]


register("InstanceNormalization", REDUCE, lambda n, t, c: [t[0]], _instance_norm, flops_per_elem=6)


def _group_norm(node, xs):
    x, scale, bias = xs
    g = int(node.attrs["num_groups"])
    n, c = x.shape[:2]
    xf = _f(x).reshape(n, g, -1)
    mean = xf.mean(axis=2, keepdims=True)
    var = xf.var(axis=2, keepdims=True)
    y = ((xf - mean) / np.sqrt(var + node.attrs.get("epsilon", 1e-5))).reshape(x.shape)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    if scale.shape[0] != c:  # opset 18: one scale/bias per group
        scale, bias = np.repeat(scale, c // g), np.repeat(bias, c // g)
    return [(y * scale.reshape(bshape) + bias.reshape(bshape)).astype(x.dtype)]


register("GroupNormalization", REDUCE, lambda n, t, c: [t[0]], _group_norm, flops_per_elem=6)


def _lp_norm(node, xs):
    x = xs[0]
    axis, p = int(node.attrs.get("axis", -1)), int(node.attrs.get("p", 2))
    if p not in (1, 2):
        raise ShapeError(f"node '{node.name}' (LpNormalization): p must be 1 or 2, got {p}")
    norm = np.sum(np.abs(x), axis=axis, keepdims=True) if p == 1 else np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(norm == 0, 0, x / norm)
    return [y.astype(x.dtype)]


register("LpNormalization", REDUCE, lambda n, t, c: [t[0]], _lp_norm, flops_per_elem=3)


def _mvn(node, xs):
    x = xs[0]
    axes = tuple(node.attrs.get("axes", [0, 2, 3]))
    mean = x.mean(axis=axes, keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True))
    return [((x - mean) / (std + np.asarray(1e-9, x.dtype))).astype(x.dtype)]


register("MeanVarianceNormalization", REDUCE, lambda n, t, c: [t[0]], _mvn, flops_per_elem=5)


def _rms_norm_infer(node, types, consts):
    return [types[0]]


def _rms_norm(node, xs):
    x, scale = xs[0], xs[1]
    axis = int(node.attrs.get("axis", -1)) % x.ndim
    xf = x.astype(np.float32) if x.dtype != np.float64 else x
    ms = np.mean(xf * xf, axis=tuple(range(axis, x.ndim)), keepdims=True)
    y = xf / np.sqrt(ms + node.attrs.get("epsilon", 1e-5))
    return [(y.astype(x.dtype) * scale).astype(x.dtype)]


register("RMSNormalization", REDUCE, _rms_norm_infer, _rms_norm, flops_per_elem=4)


def _lrn(node, xs):
    x = xs[0]
    size = int(node.attrs["size"])
    alpha, beta, bias = node.attrs.get("alpha", 1e-4), node.attrs.get("beta", 0.75), node.attrs.get("bias", 1.0)
    sq = np.pad(x * x, [(0, 0), ((size - 1) // 2, size // 2)] + [(0, 0)] * (x.ndim - 2))
    window = sum(sq[:, k:k + x.shape[1]] for k in range(size))
    return [(x / (bias + alpha / size * window) ** beta).astype(x.dtype)]


register("LRN", REDUCE, lambda n, t, c: [t[0]], _lrn, flops_per_elem=8)


# -- NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss ----------------------------------------
def _nll(node, logp, target, weight):
    """Per-element losses and weights over (N, C, d1...) log-probabilities."""
    ignore = node.attrs.get("ignore_index")
    t = target.astype(np.int64)
    mask = np.ones(t.shape, bool) if ignore is None else t != int(ignore)
    safe = np.where(mask, t, 0)
    picked = np.take_along_axis(logp, np.expand_dims(safe, 1), axis=1).squeeze(1)
    w = (weight[safe] if weight is not None else np.ones(t.shape, logp.dtype)) * mask
    return -picked * w, w


def _reduce_loss(node, loss, w, dtype):
    r = node.attrs.get("reduction", "mean")
    if r == "none":
        return loss.astype(dtype)
    if r == "sum":
        return np.asarray(loss.sum(), dtype)
    return np.asarray(loss.sum() / w.sum(), dtype)


def _loss_infer(node, types, consts, extra_log_prob=False):
    x = types[0]
    shape = (x.shape[0],) + tuple(x.shape[2:]) if node.attrs.get("reduction", "mean") == "none" else ()
    out = [TensorType(shape, x.dtype)]
    if extra_log_prob:
        out.append(x)
    return out


def _nll_ref(node, xs):
    x, t = xs[0], xs[1]
    w = xs[2] if len(xs) > 2 else None
    loss, ww = _nll(node, _f(x), t, None if w is None else _f(w))
    return [_reduce_loss(node, loss, ww, x.dtype)]


def _sce_ref(node, xs):
    x, t = xs[0], xs[1]
    w = xs[2] if len(xs) > 2 else None
    xf = _f(x)
    z = xf - xf.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss, ww = _nll(node, logp, t, None if w is None else _f(w))
    return [_reduce_loss(node, loss, ww, x.dtype), logp.astype(x.dtype)]


register("NegativeLogLikelihoodLoss", REDUCE, _loss_infer, _nll_ref, flops_per_elem=2)
register("SoftmaxCrossEntropyLoss", REDUCE, lambda n, t, c: _loss_infer(n, t, c, True), _sce_ref,
         flops_per_elem=6)

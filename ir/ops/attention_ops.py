"""Attention and RotaryEmbedding (opset 23), as NumPy references.

RotaryEmbedding rotates the first `rotary_embedding_dim` features of each head by
position-dependent angles given as cos/sin caches.
"""
from __future__ import annotations

import numpy as np

from ir.graph import TensorType
from ir.ops.registry import OPAQUE, register, same_as_input


def _rotary(node, xs):
    x, cos, sin = xs[0], xs[1], xs[2]
    pos = xs[3] if len(xs) > 3 else None
    if x.ndim == 3:  # [B, S, hidden] -> [B, S, heads, head]
        heads = int(node.attrs["num_heads"])
        h = x.reshape(x.shape[0], x.shape[1], heads, -1)
    else:            # [B, heads, S, head] -> [B, S, heads, head]
        h = x.transpose(0, 2, 1, 3)
    dim = int(node.attrs.get("rotary_embedding_dim", 0)) or h.shape[-1]
    if pos is not None:
        cos, sin = cos[pos], sin[pos]            # [B, S, dim/2]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    rot = h[..., :dim]
    if node.attrs.get("interleaved", 0):
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., :dim // 2], rot[..., dim // 2:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if node.attrs.get("interleaved", 0):
        rot = np.stack([real, imag], axis=-1).reshape(rot.shape)
    else:
        rot = np.concatenate([real, imag], axis=-1)
    y = np.concatenate([rot, h[..., dim:]], axis=-1).astype(x.dtype)
    return [y.reshape(x.shape) if x.ndim == 3 else y.transpose(0, 2, 1, 3)]


register("RotaryEmbedding", OPAQUE, same_as_input(0), _rotary)


# -- Attention (opset 23+): softmax(Q K^T * scale + bias) V with masks, causal/windowed bias,
# -- a KV cache (past -> present), grouped KV heads and optional soft-capping --------------------
def _heads(x, n):
    """[B, S, n*D] -> [B, n, S, D]."""
    return x.reshape(x.shape[0], x.shape[1], n, -1).transpose(0, 2, 1, 3)


def _opt(xs, i):
    return xs[i] if len(xs) > i and xs[i] is not None else None


def _attention_bias(node, q, k_len, mask, past_len, nonpad):
    s = q.shape[2]
    dt = q.dtype
    bias = np.zeros((s, k_len), dt)
    if mask is not None:
        if mask.shape[-1] < k_len:  # a mask over the new keys only: the rest is masked out
            fill = False if mask.dtype == bool else -np.inf
            mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, k_len - mask.shape[-1])], constant_values=fill)
        bias = bias + (np.where(mask, dt.type(0), dt.type(-np.inf)) if mask.dtype == bool else mask.astype(dt))
    left, right = int(node.attrs.get("left_window_size", -1)), int(node.attrs.get("right_window_size", -1))
    causal = bool(node.attrs.get("is_causal", 0))
    if causal or left >= 0 or right >= 0:
        offset = (nonpad.reshape(-1, 1, 1, 1) - s) if (nonpad is not None and past_len == 0) else past_len
        pos = np.arange(s)[:, None] + offset                   # absolute position of each query
        j = np.arange(k_len)[None, :]
        allowed = np.ones(np.broadcast_shapes(np.shape(pos), j.shape), bool)
        if causal:
            allowed &= j <= pos
        if left >= 0:
            allowed &= pos - j <= left
        if right >= 0:
            allowed &= j - pos <= right
        bias = bias + np.where(allowed, dt.type(0), dt.type(-np.inf))
    if nonpad is not None:
        keep = np.arange(k_len)[None, :] < nonpad.reshape(-1, 1)
        bias = bias + np.where(keep, dt.type(0), dt.type(-np.inf)).reshape(-1, 1, 1, k_len)
    return bias


def _attention(node, xs):
    q, k, v = xs[0], xs[1], xs[2]
    mask, past_k, past_v, nonpad = _opt(xs, 3), _opt(xs, 4), _opt(xs, 5), _opt(xs, 6)
    three_d = q.ndim == 3
    if three_d:
        q = _heads(q, int(node.attrs["q_num_heads"]))
        k, v = _heads(k, int(node.attrs["kv_num_heads"])), _heads(v, int(node.attrs["kv_num_heads"]))
    past_len = 0
    if past_k is not None:
        past_len = past_k.shape[2]
        k, v = np.concatenate([past_k, k], axis=2), np.concatenate([past_v, v], axis=2)
    present_k, present_v = k, v
    bias = _attention_bias(node, q, k.shape[2], mask, past_len, nonpad)
    if q.shape[1] != k.shape[1]:  # grouped-query attention: each KV head serves several Q heads
        k, v = np.repeat(k, q.shape[1] // k.shape[1], axis=1), np.repeat(v, q.shape[1] // v.shape[1], axis=1)
    scale = node.attrs.get("scale")
    s = q.dtype.type(np.sqrt(1 / np.sqrt(q.shape[3]) if scale is None else scale))
    qk = (q * s) @ (k * s).transpose(0, 1, 3, 2)
    cap = node.attrs.get("softcap")
    if cap:
        qk = (np.tanh(qk / q.dtype.type(cap)) * q.dtype.type(cap)).astype(q.dtype)
    scores = qk + bias
    mode = int(node.attrs.get("qk_matmul_output_mode", 0))
    precision = node.attrs.get("softmax_precision")
    if precision is not None:
        from onnx.helper import tensor_dtype_to_np_dtype
        scores_sm = scores.astype(tensor_dtype_to_np_dtype(int(precision)))
    else:
        scores_sm = scores
    top = np.max(scores_sm, axis=-1, keepdims=True)
    e = np.exp(scores_sm - np.where(np.isneginf(top), 0, top))
    total = np.sum(e, axis=-1, keepdims=True)
    probs = e / np.where(total == 0, 1, total)
    probs = np.where(np.isneginf(np.max(bias, axis=-1, keepdims=True)), 0, probs).astype(q.dtype)
    y = probs @ v
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
    qk_out = {2: scores, 3: probs}.get(mode, qk)
    return [y.astype(q.dtype), present_k, present_v, np.broadcast_to(qk_out, probs.shape).astype(q.dtype)]


def _attention_infer(node, types, consts):
    q, k, v = types[0].shape, types[1].shape, types[2].shape
    if len(q) == 3:
        hq, hkv = int(node.attrs["q_num_heads"]), int(node.attrs["kv_num_heads"])
        b, s, kl = q[0], q[1], k[1]
        dk, dv = k[2] // hkv, v[2] // hkv
    else:
        b, hq, s, hkv, kl, dk, dv = q[0], q[1], q[2], k[1], k[2], k[3], v[3]
    past = types[4].shape[2] if len(types) > 4 and types[4] is not None else 0
    total = kl + past
    y = (b, s, hq * dv) if len(q) == 3 else (b, hq, s, dv)
    dt = types[0].dtype
    return [TensorType(tuple(y), dt), TensorType((b, hkv, total, dk), dt), TensorType((b, hkv, total, dv), dt),
            TensorType((b, hq, s, total), dt)]


register("Attention", OPAQUE, _attention_infer, _attention)

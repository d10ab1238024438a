"""RotaryEmbedding (opset 23): rotate the first `rotary_embedding_dim` features of each head
by position-dependent angles, given as cos/sin caches."""
from __future__ import annotations

import numpy as np

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

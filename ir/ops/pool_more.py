"""LpPool, GlobalLpPool, MaxUnpool and Col2Im: window geometry as in `ir.ops.nn`'s pooling."""
from __future__ import annotations

import numpy as np

from ir.errors import DataDependentShapeError
from ir.graph import TensorType
from ir.ops.nn import _concrete_pads, _global_infer, _pool_infer, _windows
from ir.ops.registry import OPAQUE, REDUCE, dims_of, register


def _lp_pool(node, xs):
    x = xs[0]
    k = x.ndim - 2
    p = float(node.attrs.get("p", 2))
    kernel = list(node.attrs["kernel_shape"])
    strides, dil, pads, outs, extra = _concrete_pads(node, list(x.shape[2:]), kernel)
    widths = [(0, 0), (0, 0)] + [(pads[i], pads[i + k] + extra[i]) for i in range(k)]
    win = _windows(np.pad(np.abs(x) ** p, widths), kernel, strides, dil, outs)
    return [np.ascontiguousarray(win.sum(axis=tuple(range(-k, 0))) ** (1 / p), dtype=x.dtype)]


register("LpPool", REDUCE, _pool_infer, _lp_pool)


def _global_lp(node, xs):
    x = xs[0]
    p = float(node.attrs.get("p", 2))
    y = (np.abs(x) ** p).sum(axis=tuple(range(2, x.ndim)), keepdims=True) ** (1 / p)
    return [y.astype(x.dtype)]


register("GlobalLpPool", REDUCE, _global_infer, _global_lp)


# -- MaxUnpool: scatter values to the flat positions MaxPool's Indices named ----------------
def _unpool_shape(node, in_shape):
    kernel = list(node.attrs["kernel_shape"])
    k = len(kernel)
    strides = list(node.attrs.get("strides") or [1] * k)
    pads = list(node.attrs.get("pads") or [0] * (2 * k))
    return tuple(in_shape[:2]) + tuple((in_shape[2 + i] - 1) * strides[i] + kernel[i] - pads[i] - pads[i + k]
                                       for i in range(k))


def _unpool_infer(node, types, consts):
    if len(node.inputs) > 2 and node.inputs[2]:
        if consts[2] is None:
            raise DataDependentShapeError(f"node '{node.name}' (MaxUnpool): output_shape must be a constant")
        return [TensorType(tuple(dims_of(consts[2])), types[0].dtype)]
    return [TensorType(_unpool_shape(node, types[0].shape), types[0].dtype)]


def _unpool(node, xs):
    """Indices address the unpadded pooling input; an `output_shape` larger than that pads at the end."""
    x, idx = xs[0], xs[1]
    natural = _unpool_shape(node, x.shape)
    y = np.zeros(int(np.prod(natural)), x.dtype)
    y[idx.reshape(-1)] = x.reshape(-1)
    if len(xs) < 3 or xs[2] is None:
        return [y.reshape(natural)]
    out = np.zeros(tuple(int(v) for v in xs[2]), x.dtype)
    out[tuple(slice(0, d) for d in natural)] = y.reshape(natural)
    return [out]


register("MaxUnpool", OPAQUE, _unpool_infer, _unpool)


# -- Col2Im: sum sliding blocks [N, C*prod(block), L] back into an image [N, C, *image] -------------
def _col2im_infer(node, types, consts):
    if consts[1] is None:
        raise DataDependentShapeError(f"node '{node.name}' (Col2Im): image_shape must be a constant")
    x = types[0].shape
    image = dims_of(consts[1])
    if consts[2] is None:
        raise DataDependentShapeError(f"node '{node.name}' (Col2Im): block_shape must be a constant")
    block = int(np.prod(dims_of(consts[2])))
    return [TensorType((x[0], x[1] // block) + tuple(image), types[0].dtype)]


def _col2im(node, xs):
    cols, image, block = xs[0], [int(v) for v in xs[1]], [int(v) for v in xs[2]]
    k = len(image)
    strides = list(node.attrs.get("strides") or [1] * k)
    dil = list(node.attrs.get("dilations") or [1] * k)
    pads = list(node.attrs.get("pads") or [0] * (2 * k))
    padded = [image[i] + pads[i] + pads[i + k] for i in range(k)]
    blocks = [(padded[i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(k)]
    n, cb, _ = cols.shape
    c = cb // int(np.prod(block))
    v = cols.reshape((n, c) + tuple(block) + tuple(blocks))
    y = np.zeros((n, c) + tuple(padded), cols.dtype)
    for off in np.ndindex(*block):
        sl = tuple(slice(off[i] * dil[i], off[i] * dil[i] + strides[i] * (blocks[i] - 1) + 1, strides[i]) for i in range(k))
        y[(slice(None), slice(None)) + sl] += v[(slice(None), slice(None)) + off]
    crop = tuple(slice(pads[i], pads[i] + image[i]) for i in range(k))
    return [np.ascontiguousarray(y[(slice(None), slice(None)) + crop])]


register("Col2Im", OPAQUE, _col2im_infer, _col2im)

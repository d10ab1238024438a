"""Convolution, pooling and BatchNormalization (NCHW, any number of spatial dims).

Output sizes are symbolic: `floor((H + pads - dilated kernel) / stride) + 1`.
References use sliding windows + einsum, so they stay short and reasonably fast.
"""
from __future__ import annotations

import numpy as np

from ir.errors import ShapeError
from ir.graph import TensorType
from ir.ops.registry import ANCHOR, OPAQUE, REDUCE, note_equal, register
from ir.shapes import ceil_div, floor_div, format_shape, simplify_dim


def _div(a, b, ceil=False):
    """floor/ceil(a / b) for int or sympy a."""
    return ceil_div(a, int(b)) if ceil else floor_div(a, int(b))  # flat, cached (ir.shapes)


def _window(node, spatial, kernel):
    """(strides, dilations, pads_begin, pads_end, out_sizes) for a conv/pool window."""
    k = len(kernel)
    strides = list(node.attrs.get("strides") or [1] * k)
    dil = list(node.attrs.get("dilations") or [1] * k)
    pads = list(node.attrs.get("pads") or [0] * (2 * k))
    auto = node.attrs.get("auto_pad", "NOTSET")
    ceil = bool(node.attrs.get("ceil_mode", 0))
    eff = [(kernel[i] - 1) * dil[i] + 1 for i in range(k)]
    outs = []
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(k):
            outs.append(_div(spatial[i], strides[i], ceil=True))
        pads = [None] * (2 * k)  # depend on the bound sizes; computed in the reference
    elif auto == "VALID":
        pads = [0] * (2 * k)
        outs = [_div(spatial[i] - eff[i], strides[i], ceil) + 1 for i in range(k)]
    else:
        outs = [_div(spatial[i] + pads[i] + pads[i + k] - eff[i], strides[i], ceil) + 1 for i in range(k)]
        for i in range(k):  # ceil_mode: a last window that starts in the end padding is dropped
            if ceil and isinstance(outs[i], int) and isinstance(spatial[i], int) \
                    and (outs[i] - 1) * strides[i] >= spatial[i] + pads[i]:
                outs[i] -= 1
    for i, o in enumerate(outs):
        if isinstance(o, int) and o < 1:
            raise ShapeError(f"node '{node.name}' ({node.op}): window of size {kernel} does not fit "
                             f"input spatial size {format_shape(spatial)} (pads {pads})")
    return strides, dil, pads, outs, eff


def _concrete_pads(node, spatial, kernel):
    """Pads at concrete sizes, resolving auto_pad SAME_* and the extra tail of ceil_mode."""
    strides, dil, pads, outs, eff = _window(node, spatial, kernel)
    k = len(kernel)
    if pads[0] is None:
        pads = [0] * (2 * k)
        for i in range(k):
            total = max(0, (outs[i] - 1) * strides[i] + eff[i] - spatial[i])
            small, big = total // 2, total - total // 2
            lo_first = node.attrs.get("auto_pad") == "SAME_UPPER"
            pads[i], pads[i + k] = (small, big) if lo_first else (big, small)
    extra = [max(0, (outs[i] - 1) * strides[i] + eff[i] - (spatial[i] + pads[i] + pads[i + k])) for i in range(k)]
    return strides, dil, pads, outs, extra


def _windows(x, kernel, strides, dil, outs):
    """View x[N, C, *spatial] (already padded) as [N, C, *outs, *kernel]."""
    k = len(kernel)
    eff = [(kernel[i] - 1) * dil[i] + 1 for i in range(k)]
    v = np.lib.stride_tricks.sliding_window_view(x, eff, axis=tuple(range(2, 2 + k)))
    sl = (slice(None), slice(None)) + tuple(slice(None, (outs[i] - 1) * strides[i] + 1, strides[i]) for i in range(k)) \
        + tuple(slice(None, None, dil[i]) for i in range(k))
    return v[sl]


# -- Conv -----------------------------------------------------------------------------
def _conv_infer(node, types, consts):
    x, w = types[0].shape, types[1].shape
    if len(x) < 3 or len(w) != len(x):
        raise ShapeError(f"node '{node.name}' (Conv): input {format_shape(x)} and weight {format_shape(w)} "
                         "must have the same rank >= 3")
    group = int(node.attrs.get("group", 1))
    kernel = list(node.attrs.get("kernel_shape") or w[2:])
    note_equal(node, x[1], w[1] * group)
    if len(types) > 2 and types[2] is not None:
        note_equal(node, types[2].shape[0], w[0])
    _, _, _, outs, _ = _window(node, x[2:], kernel)
    return [TensorType((x[0], w[0]) + tuple(outs), types[0].dtype)]


def _conv_ref(node, xs):
    x, w = xs[0], xs[1]
    b = xs[2] if len(xs) > 2 else None
    group = int(node.attrs.get("group", 1))
    k = x.ndim - 2
    kernel = list(w.shape[2:])
    strides, dil, pads, outs, extra = _concrete_pads(node, list(x.shape[2:]), kernel)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + k] + extra[i]) for i in range(k)])
    win = _windows(xp, kernel, strides, dil, outs)                 # N C *outs *kernel
    n, c = x.shape[:2]
    m = w.shape[0]
    win = win.reshape((n, group, c // group) + tuple(outs) + tuple(kernel))
    wg = w.reshape((group, m // group, c // group) + tuple(kernel))
    sp, ke = "hwdpqr"[:k], "ijklmo"[:k]
    y = np.einsum(f"ngc{sp}{ke},gmc{ke}->ngm{sp}", win, wg, optimize=True)
    y = y.reshape((n, m) + tuple(outs))
    if b is not None:
        y = y + b.reshape((1, m) + (1,) * k)
    return [np.ascontiguousarray(y, dtype=x.dtype)]


register("Conv", ANCHOR, _conv_infer, _conv_ref)


def _convt_geometry(node, spatial, kernel):
    """(strides, dilations, pads, output_padding, out sizes) of a ConvTranspose; output_shape
    and auto_pad=SAME_* fix the output size and imply the pads (ONNX's formula)."""
    k = len(kernel)
    strides = list(node.attrs.get("strides") or [1] * k)
    dil = list(node.attrs.get("dilations") or [1] * k)
    pads = list(node.attrs.get("pads") or [0] * (2 * k))
    outpad = list(node.attrs.get("output_padding") or [0] * k)
    auto = node.attrs.get("auto_pad", "NOTSET")
    full = [simplify_dim(strides[i] * (spatial[i] - 1) + outpad[i] + (kernel[i] - 1) * dil[i] + 1) for i in range(k)]
    want = list(node.attrs.get("output_shape") or [])[-k:] if node.attrs.get("output_shape") else None
    if want is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        want = [simplify_dim(spatial[i] * strides[i]) for i in range(k)]
    if want is not None:
        for i in range(k):
            total = full[i] - want[i]
            if isinstance(total, int):
                total = max(total, 0)
                half = total // 2
                pads[i], pads[i + k] = (half, total - half) if auto == "SAME_UPPER" else (total - half, half)
        return strides, dil, pads, outpad, want
    return strides, dil, pads, outpad, [simplify_dim(full[i] - pads[i] - pads[i + k]) for i in range(k)]


def _conv_transpose_infer(node, types, consts):
    x, w = types[0].shape, types[1].shape
    group = int(node.attrs.get("group", 1))
    kernel = list(node.attrs.get("kernel_shape") or w[2:])
    note_equal(node, x[1], w[0])
    outs = _convt_geometry(node, x[2:], kernel)[4]
    return [TensorType((x[0], w[1] * group) + tuple(outs), types[0].dtype)]


def _conv_transpose_ref(node, xs):
    """Scatter form: every input pixel adds a weighted kernel patch to the output."""
    x, w = xs[0], xs[1]
    n, c = x.shape[:2]
    k = x.ndim - 2
    group = int(node.attrs.get("group", 1))
    kernel = list(w.shape[2:])
    strides, dil, pads, outpad, outs = _convt_geometry(node, list(x.shape[2:]), kernel)
    mg = w.shape[1]
    full = [strides[i] * (x.shape[2 + i] - 1) + outpad[i] + (kernel[i] - 1) * dil[i] + 1 for i in range(k)]
    # an output_shape larger than the natural size is zero-extended at the end
    size = [max(full[i], pads[i] + outs[i]) for i in range(k)]
    y = np.zeros((n, mg * group) + tuple(size), dtype=x.dtype)
    cg = c // group
    for g in range(group):
        xs_g = x[:, g * cg:(g + 1) * cg]
        wg = w[g * cg:(g + 1) * cg]                                      # cg, mg, *kernel
        contrib = np.tensordot(xs_g, wg, axes=([1], [0]))                # n, *sp, mg, *kernel
        for kidx in np.ndindex(*kernel):
            sl = tuple(slice(kidx[i] * dil[i], kidx[i] * dil[i] + strides[i] * (x.shape[2 + i] - 1) + 1, strides[i])
                       for i in range(k))
            patch = contrib[(slice(None),) + (slice(None),) * k + (slice(None),) + kidx]   # n, *sp, mg
            y[(slice(None), slice(g * mg, (g + 1) * mg)) + sl] += np.moveaxis(patch, -1, 1)
    crop = tuple(slice(pads[i], pads[i] + outs[i]) for i in range(k))
    y = y[(slice(None), slice(None)) + crop]
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2].reshape((1, -1) + (1,) * k)
    return [np.ascontiguousarray(y, dtype=x.dtype)]


register("ConvTranspose", OPAQUE, _conv_transpose_infer, _conv_transpose_ref)


# -- Pooling --------------------------------------------------------------------------
def _pool_infer(node, types, consts):
    x = types[0].shape
    kernel = list(node.attrs["kernel_shape"])
    _, _, _, outs, _ = _window(node, x[2:], kernel)
    return [TensorType(tuple(x[:2]) + tuple(outs), types[0].dtype)]


def _pool_ref(node, xs):
    x = xs[0]
    k = x.ndim - 2
    kernel = list(node.attrs["kernel_shape"])
    strides, dil, pads, outs, extra = _concrete_pads(node, list(x.shape[2:]), kernel)
    widths = [(0, 0), (0, 0)] + [(pads[i], pads[i + k] + extra[i]) for i in range(k)]
    axes = tuple(range(-k, 0))
    if node.op == "MaxPool":
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        win = _windows(np.pad(x, widths, constant_values=fill), kernel, strides, dil, outs)
        y = np.ascontiguousarray(win.max(axis=axes))
        if len(node.outputs) < 2 or not node.outputs[1]:
            return [y]
        return [y, _argmax_indices(node, x, win, widths, kernel, strides, dil, outs)]
    total = _windows(np.pad(x, widths), kernel, strides, dil, outs).sum(axis=axes)
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    if node.attrs.get("count_include_pad", 0):  # count pads, but not the ceil_mode tail
        padded = np.pad(ones, widths[:2] + [(pads[i], pads[i + k]) for i in range(k)], constant_values=1)
        count_src = np.pad(padded, [(0, 0), (0, 0)] + [(0, extra[i]) for i in range(k)])
    else:
        count_src = np.pad(ones, widths)
    count = _windows(count_src, kernel, strides, dil, outs).sum(axis=axes)
    return [np.ascontiguousarray(total / count, dtype=x.dtype)]


def _argmax_indices(node, x, win, widths, kernel, strides, dil, outs):
    """MaxPool's Indices output: flat index of each max in x (row-major, or column-major
    over the spatial axes with storage_order=1)."""
    k = len(kernel)
    spatial = x.shape[2:]
    if node.attrs.get("storage_order", 0):
        coords = np.indices(spatial)
        flat_sp = sum(coords[i] * int(np.prod(spatial[:i])) for i in range(k))
    else:
        flat_sp = np.arange(int(np.prod(spatial))).reshape(spatial)
    base = (np.arange(x.shape[0] * x.shape[1]) * int(np.prod(spatial))).reshape(x.shape[:2] + (1,) * k)
    idx = np.pad(base + flat_sp, widths, constant_values=-1)
    iwin = _windows(idx, kernel, strides, dil, outs)
    flat = win.reshape(win.shape[:2 + k] + (-1,))
    pick = flat.argmax(axis=-1)[..., None]
    return np.take_along_axis(iwin.reshape(flat.shape), pick, axis=-1)[..., 0].astype(np.int64)


def _maxpool_infer(node, types, consts):
    y = _pool_infer(node, types, consts)[0]
    return [y, TensorType(y.shape, "int64")]


register("MaxPool", REDUCE, _maxpool_infer, _pool_ref)
register("AveragePool", REDUCE, _pool_infer, _pool_ref)


def _global_infer(node, types, consts):
    x = types[0].shape
    return [TensorType(tuple(x[:2]) + (1,) * (len(x) - 2), types[0].dtype)]


def _global_ref(fn):
    return lambda node, xs: [fn(xs[0], axis=tuple(range(2, xs[0].ndim)), keepdims=True).astype(xs[0].dtype)]


register("GlobalAveragePool", REDUCE, _global_infer, _global_ref(np.mean))
register("GlobalMaxPool", REDUCE, _global_infer, _global_ref(np.max))


# -- BatchNormalization (inference form: per-channel scale and shift) -----------------
def _bn_infer(node, types, consts):
    x = types[0].shape
    for t in types[1:5]:
        note_equal(node, t.shape[0], x[1])
    return [types[0]] + list(types[3:5])  # training mode also writes the running mean and var


def bn_scale_shift(node, scale, bias, mean, var):
    """Per-channel (a, b) with BN(x) = a * x + b: used by the reference and by BN folding."""
    eps = np.float32(node.attrs.get("epsilon", 1e-5))
    a = (scale / np.sqrt(var + eps)).astype(scale.dtype)
    return a, (bias - mean * a).astype(scale.dtype)


def _bn_ref(node, xs):
    x = xs[0]
    if node.attrs.get("training_mode", 0):
        return _bn_training(node, xs)
    a, b = bn_scale_shift(node, *xs[1:5])
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return [(x * a.reshape(shape) + b.reshape(shape)).astype(x.dtype)]


def _bn_training(node, xs):
    """Normalize with the batch's statistics; update the running ones with `momentum`."""
    x, scale, bias, mean, var = xs[:5]
    axes = (0,) + tuple(range(2, x.ndim))
    bmean, bvar = x.mean(axis=axes), x.var(axis=axes)
    a, b = bn_scale_shift(node, scale, bias, bmean.astype(scale.dtype), bvar.astype(scale.dtype))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    m = np.asarray(node.attrs.get("momentum", 0.9), mean.dtype)
    return [(x * a.reshape(shape) + b.reshape(shape)).astype(x.dtype),
            (mean * m + bmean * (1 - m)).astype(mean.dtype), (var * m + bvar * (1 - m)).astype(var.dtype)]


# opaque: its [C] params do not broadcast NumPy-style; passes fold it into a Conv/MatMul or
# decompose it into Mul + Add with [C, 1, 1] constants.
register("BatchNormalization", OPAQUE, _bn_infer, _bn_ref, flops_per_elem=2)

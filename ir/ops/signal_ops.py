"""DFT and STFT over signals laid out as [..., N, 1] (real) or [..., N, 2] (real, imaginary)."""
from __future__ import annotations

import numpy as np

from ir.errors import DataDependentShapeError
from ir.graph import TensorType
from ir.ops.registry import OPAQUE, dims_of, register


def _complex(x):
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def _pairs(z, real_only=False):
    return np.real(z)[..., None] if real_only else np.stack([np.real(z), np.imag(z)], axis=-1)


def _dft_params(node, rank, consts):
    """(axis, explicit dft_length or None); opset 17 names the axis in an attribute, 20 in input 2."""
    if "axis" in node.attrs:
        axis = int(node.attrs["axis"])
    elif len(node.inputs) > 2 and node.inputs[2]:
        if consts[2] is None:
            raise DataDependentShapeError(f"node '{node.name}' (DFT): axis must be a constant")
        axis = int(dims_of(consts[2])[0])
    else:
        axis = -2
    length = None
    if len(node.inputs) > 1 and node.inputs[1]:
        if consts[1] is None:
            raise DataDependentShapeError(f"node '{node.name}' (DFT): dft_length must be a constant")
        length = dims_of(consts[1])[0]
    return axis % rank, length


def _dft_out(node, shape, axis, length):
    inverse, onesided = node.attrs.get("inverse", 0), node.attrs.get("onesided", 0)
    n = length if length is not None else (2 * (shape[axis] - 1) if inverse and onesided else shape[axis])
    out = list(shape)
    out[axis] = n // 2 + 1 if onesided and not inverse else n
    out[-1] = 1 if inverse and onesided else 2
    return tuple(out), n


def _dft_infer(node, types, consts):
    axis, length = _dft_params(node, len(types[0].shape), consts)
    return [TensorType(_dft_out(node, types[0].shape, axis, length)[0], types[0].dtype)]


def _dft(node, xs):
    x = xs[0]
    axis, length = _dft_params(node, x.ndim, list(xs) + [None] * 3)
    _, n = _dft_out(node, x.shape, axis, length)
    z = _complex(x)
    if node.attrs.get("inverse", 0):
        if node.attrs.get("onesided", 0):
            return [_pairs(np.fft.irfft(z, n=n, axis=axis), real_only=True).astype(x.dtype)]
        return [_pairs(np.fft.ifft(z, n=n, axis=axis)).astype(x.dtype)]
    y = np.fft.fft(z, n=n, axis=axis)
    if node.attrs.get("onesided", 0):
        y = np.take(y, np.arange(n // 2 + 1), axis=axis)
    return [_pairs(y).astype(x.dtype)]


register("DFT", OPAQUE, _dft_infer, _dft)


def _stft(node, xs):
    x, step = xs[0], int(np.asarray(xs[1]).reshape(-1)[0])
    window = xs[2] if len(xs) > 2 and xs[2] is not None else None
    if len(xs) > 3 and xs[3] is not None:
        flen = int(np.asarray(xs[3]).reshape(-1)[0])
    else:
        flen = len(window)
    z = _complex(x)                                                     # [B, L]
    frames = (z.shape[1] - flen) // step + 1
    idx = np.arange(frames)[:, None] * step + np.arange(flen)[None, :]
    seg = z[:, idx]                                                     # [B, frames, flen]
    if window is not None:
        seg = seg * window
    y = np.fft.fft(seg, axis=-1)
    if node.attrs.get("onesided", 1):
        y = y[..., :flen // 2 + 1]
    return [_pairs(y).astype(x.dtype)]


def _stft_infer(node, types, consts):
    raise DataDependentShapeError(f"node '{node.name}' (STFT): the frame count depends on input values")


register("STFT", OPAQUE, _stft_infer, _stft)

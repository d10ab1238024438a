"""Signal windows (Hann/Hamming/Blackman), BitCast, CenterCropPad and the random generators
(Bernoulli, RandomUniform/Normal[Like]): small NumPy references."""
from __future__ import annotations

import numpy as np

from ir.errors import DataDependentShapeError, ShapeError
from ir.graph import TensorType
from ir.ops.elementwise import _DTYPE_NAMES
from ir.ops.registry import INJECTIVE, OPAQUE, dims_of, register


def _out_dtype(node, attr="output_datatype", default=1) -> str:
    to = int(node.attrs.get(attr, default))
    if to not in _DTYPE_NAMES:
        raise ShapeError(f"node '{node.name}' ({node.op}): {attr} {to} has no NumPy dtype")
    return _DTYPE_NAMES[to]


# -- windows: w[n] = sum_k a_k cos(2 pi k n / N), N = size (periodic) or size - 1 ----------------
_WINDOWS = {"HannWindow": (0.5, -0.5), "HammingWindow": (25 / 46, -21 / 46),
            "BlackmanWindow": (0.42, -0.5, 0.08)}


def _window_infer(node, types, consts):
    if consts[0] is None:
        raise DataDependentShapeError(f"node '{node.name}' ({node.op}): the size input must be a constant")
    return [TensorType((dims_of(consts[0])[0],), _out_dtype(node))]


def _window(node, xs):
    size = int(np.asarray(xs[0]).reshape(-1)[0])
    n = np.arange(size, dtype=np.float64)
    period = size if node.attrs.get("periodic", 1) else size - 1
    w = sum(a * np.cos(2 * np.pi * k * n / period) for k, a in enumerate(_WINDOWS[node.op]))
    return [w.astype(_out_dtype(node))]


for _name in _WINDOWS:
    register(_name, OPAQUE, _window_infer, _window)


# -- BitCast: reinterpret the bytes (same element width) ---------------------------------------
def _bitcast_infer(node, types, consts):
    to = _out_dtype(node, "to")
    if np.dtype(to).itemsize != np.dtype(types[0].dtype).itemsize:
        raise ShapeError(f"node '{node.name}' (BitCast): {types[0].dtype} and {to} differ in width")
    return [TensorType(types[0].shape, to)]


register("BitCast", INJECTIVE, _bitcast_infer, lambda n, xs: [np.array(xs[0]).view(_out_dtype(n, "to"))])  # a copy keeps 0-d


# -- CenterCropPad: crop or zero-pad each named axis to a size, centered ------------------------
def _ccp_axes(node, rank):
    axes = node.attrs.get("axes")
    return list(range(rank)) if axes is None else [int(a) % rank for a in axes]


def _ccp_infer(node, types, consts):
    if consts[1] is None:
        raise DataDependentShapeError(f"node '{node.name}' (CenterCropPad): shape must be a constant")
    shape = list(types[0].shape)
    for a, s in zip(_ccp_axes(node, len(shape)), dims_of(consts[1])):
        shape[a] = s
    return [TensorType(tuple(shape), types[0].dtype)]


def _ccp(node, xs):
    x = xs[0]
    out_shape, src, dst = list(x.shape), [slice(None)] * x.ndim, [slice(None)] * x.ndim
    for a, s in zip(_ccp_axes(node, x.ndim), np.asarray(xs[1]).reshape(-1).tolist()):
        d = x.shape[a]
        out_shape[a] = s
        lo = abs(d - s) // 2
        if s < d:
            src[a] = slice(lo, lo + s)
        elif s > d:
            dst[a] = slice(lo, lo + d)
    y = np.zeros(out_shape, x.dtype)
    y[tuple(dst)] = x[tuple(src)]
    return [y]


register("CenterCropPad", INJECTIVE, _ccp_infer, _ccp)


# -- random generators: a `seed` attribute makes the draw repeatable. The values are NumPy's
# -- generator's (no two runtimes agree on them), so only shape, dtype and range are portable -------
def _rng(node):
    seed = node.attrs.get("seed")
    return np.random.default_rng(None if seed is None else int(np.float32(seed).view(np.uint32)))


def _random_dtype(node, like=None):
    if "dtype" in node.attrs:
        return _out_dtype(node, "dtype")
    return like if like is not None else "float32"


def _random_shape(node, types):
    return tuple(node.attrs["shape"]) if "shape" in node.attrs else types[0].shape


def _random(kind):
    def ref(node, xs):
        shape = tuple(node.attrs["shape"]) if "shape" in node.attrs else xs[0].shape
        dt = _random_dtype(node, None if not xs else str(xs[0].dtype))
        g = _rng(node)
        if kind == "uniform":
            lo, hi = node.attrs.get("low", 0.0), node.attrs.get("high", 1.0)
            y = g.uniform(lo, hi, shape)
        else:
            y = g.normal(node.attrs.get("mean", 0.0), node.attrs.get("scale", 1.0), shape)
        return [y.astype(dt)]

    def infer(node, types, consts):
        like = types[0].dtype if types else None
        return [TensorType(_random_shape(node, types), _random_dtype(node, like))]
    return infer, ref


register("RandomUniform", OPAQUE, *_random("uniform"))
register("RandomUniformLike", OPAQUE, *_random("uniform"))
register("RandomNormal", OPAQUE, *_random("normal"))
register("RandomNormalLike", OPAQUE, *_random("normal"))


def _bernoulli(node, xs):
    p = xs[0]
    return [(_rng(node).random(p.shape) < p).astype(_random_dtype(node, str(p.dtype)))]


register("Bernoulli", OPAQUE, lambda n, t, c: [TensorType(t[0].shape, _random_dtype(n, t[0].dtype))], _bernoulli)

"""GridSample (2-D and volumetric): sample X at normalized grid coordinates, separably —
nearest, linear or cubic (Keys, a = -0.75) taps, zeros/border/reflection padding; and
AffineGrid, which builds such a grid from affine matrices."""
from __future__ import annotations

import itertools

import numpy as np

from ir.errors import DataDependentShapeError
from ir.graph import TensorType
from ir.ops.registry import OPAQUE, dims_of, register


def _reflect(x, lo, hi):
    """Fold x into [lo, hi] by reflecting at the borders as often as needed."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    below, above = lo - x, x - hi
    out = x.copy()
    for dx, start, other, mask in ((below, lo, hi, x < lo), (above, hi, lo, x > hi)):
        n = np.floor(dx / rng)
        r = dx - n * rng
        sign = 1 if start == lo else -1
        val = np.where(n % 2 == 0, start + sign * r, other - sign * r)
        out = np.where(mask, val, out)
    return out


def _cubic(t):
    a = -0.75
    t = np.abs(t)
    c0 = ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a
    c1 = ((a + 2) * t - (a + 3)) * t * t + 1
    c2 = ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1
    c3 = ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a
    return [c0, c1, c2, c3]


def _taps(x, mode):
    """[(integer index, weight)] per tap along one axis."""
    if mode == "nearest":
        return [(x.astype(np.int64), np.ones_like(x))]
    x0 = np.floor(x)
    t = x - x0
    if mode == "linear":
        return [(x0.astype(np.int64), 1 - t), (x0.astype(np.int64) + 1, t)]
    return [(x0.astype(np.int64) + k - 1, w) for k, w in enumerate(_cubic(t))]


def _grid_sample(node, xs):
    x, grid = xs[0], xs[1].astype(np.float64)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(node.attrs.get("mode", "linear"), node.attrs.get("mode", "linear"))
    pad = node.attrs.get("padding_mode", "zeros")
    align = bool(node.attrs.get("align_corners", 0))
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    k = len(sizes)
    out_sp = grid.shape[1:-1]
    axes_taps = []
    for d, size in enumerate(sizes):
        g = grid[..., k - 1 - d]  # the grid's last axis lists (x, y[, z]): reversed spatial order
        v = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
        if mode == "nearest":
            v = np.rint(v)
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if pad == "border":
            v = np.where((v < lo) | (v > hi), np.clip(v, 0, size - 1), v)
        elif pad == "reflection":
            v = _reflect(v, lo, hi)
        taps = []
        for idx, w in _taps(v, mode):
            if pad == "zeros":
                ok = (idx >= 0) & (idx < size)
            else:
                ok = np.ones(idx.shape, bool)
                idx = np.clip(idx, 0, size - 1) if pad == "border" else \
                    _reflect(idx.astype(np.float64), lo, hi).astype(np.int64)
            taps.append((np.clip(idx, 0, size - 1), w * ok))
        axes_taps.append(taps)
    bshape = (n, 1) + out_sp
    ni = np.arange(n).reshape((n,) + (1,) * (len(out_sp) + 1))
    ci = np.arange(c).reshape((1, c) + (1,) * len(out_sp))
    y = np.zeros((n, c) + out_sp, np.float64)
    for combo in itertools.product(*axes_taps):
        weight = np.ones(grid.shape[:-1])
        index = []
        for idx, w in combo:
            weight = weight * w
            index.append(idx.reshape(bshape))
        y += x[(ni, ci) + tuple(index)] * weight.reshape(bshape)
    return [y.astype(x.dtype)]


def _grid_sample_infer(node, types, consts):
    x, g = types[0].shape, types[1].shape
    return [TensorType(tuple(x[:2]) + tuple(g[1:-1]), types[0].dtype)]


register("GridSample", OPAQUE, _grid_sample_infer, _grid_sample)


# -- AffineGrid: the sampling grid GridSample reads, from per-batch affine matrices ---------------
def _base_coords(size, align):
    """Normalized pixel centers (or corners with align_corners) along one axis, in [-1, 1]."""
    if align:
        return np.linspace(-1, 1, size) if size > 1 else np.zeros(1)
    return (np.arange(size) * 2 + 1) / size - 1


def _affine_grid(node, xs):
    theta, size = xs[0], [int(v) for v in np.asarray(xs[1]).reshape(-1)]
    spatial = size[2:]
    align = bool(node.attrs.get("align_corners", 0))
    axes = np.meshgrid(*[_base_coords(s, align) for s in spatial], indexing="ij")  # (z,) y, x
    homo = np.stack(list(reversed(axes)) + [np.ones(spatial)], axis=-1)              # x, y, (z), 1
    grid = np.einsum("nij,...j->n...i", theta.astype(np.float64), homo)
    return [grid.astype(theta.dtype)]


def _affine_grid_infer(node, types, consts):
    if consts[1] is None:
        raise DataDependentShapeError(f"node '{node.name}' (AffineGrid): size must be a constant")
    size = dims_of(consts[1])
    return [TensorType((size[0],) + tuple(size[2:]) + (len(size) - 2,), types[0].dtype)]


register("AffineGrid", OPAQUE, _affine_grid_infer, _affine_grid)

"""Resize (opsets 10-19) and Upsample: interpolation as per-axis tap tables.

Resize is separable: along each resized axis, output index o reads T input
indices with T weights (nearest: 1 tap; linear: 2; cubic: 4; antialias: the
filter's footprint at the scale), and under tf_crop_and_resize a flag says o
maps outside the input (the output there is `extrapolation_value`). The NumPy
reference applies the tables one axis at a time; the elementwise template reads
the same tables as an index map (`schedules/templates/elementwise.py`), so the
rule that turns attributes into coordinates is written once, here. It follows
the ONNX text and, where they differ from `onnx.reference`, onnxruntime: float32
source coordinates, the integer resized length in align_corners/pytorch_half_pixel/
tf_crop_and_resize, an axis of scale 1 left alone (even under tf_crop_and_resize);
edge clamping, `exclude_outside`, antialias filters normalized to sum 1.

Inputs are told apart by type, not position, so the op reads the same whether
optional inputs are left empty ("") or dropped (a workload's view): integer
input = sizes; of the float inputs, a lone one is scales (roi alone is invalid),
two are roi then scales, and with sizes present a float input is roi.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import sympy

from ir.errors import DataDependentShapeError, ShapeError, UnsupportedOpError
from ir.graph import TensorType
from ir.ops.registry import INJECTIVE, dims_of, register
from ir.shapes import simplify_dim

MODES = ("nearest", "linear", "cubic")
TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize",
              "half_pixel_symmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@dataclass(frozen=True)
class ResizeSpec:
    """The attributes of one Resize node, checked."""

    mode: str
    transform: str
    nearest_mode: str
    cubic_a: float
    exclude_outside: bool
    extrapolation_value: float
    antialias: bool
    axes: tuple | None
    policy: str


def spec_of(node) -> ResizeSpec:
    a = node.attrs
    legacy = node.op == "Upsample"
    mode = _text(a.get("mode", "nearest"))
    transform = "asymmetric" if legacy else _text(a.get("coordinate_transformation_mode", "half_pixel"))
    nearest = "floor" if legacy else _text(a.get("nearest_mode", "round_prefer_floor"))
    policy = _text(a.get("keep_aspect_ratio_policy", "stretch"))
    for what, value, allowed in (("mode", mode, MODES), ("coordinate_transformation_mode", transform, TRANSFORMS),
                                 ("nearest_mode", nearest, NEAREST_MODES),
                                 ("keep_aspect_ratio_policy", policy, ("stretch", "not_larger", "not_smaller"))):
        if value not in allowed:
            raise UnsupportedOpError(f"node '{node.name}' ({node.op}): {what} '{value}' is not one of {', '.join(allowed)}")
    antialias = bool(a.get("antialias", 0))
    if antialias and mode == "nearest":
        raise UnsupportedOpError(f"node '{node.name}' ({node.op}): antialias applies to linear and cubic modes only")
    axes = a.get("axes")
    return ResizeSpec(mode, transform, nearest, float(a.get("cubic_coeff_a", -0.75)), bool(a.get("exclude_outside", 0)),
                      float(a.get("extrapolation_value", 0.0)), antialias, tuple(int(x) for x in axes) if axes else None,
                      policy)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _spell_out_opset10(node) -> None:
    """Opset 10 Resize had no coordinate attributes (asymmetric, nearest rounds down): write them
    on the node, so that every later view of it (a workload drops the importer's `_opset`) agrees."""
    if node.op == "Resize" and node.attrs.get("_opset", 11) < 11:
        node.attrs.setdefault("coordinate_transformation_mode", "asymmetric")
        node.attrs.setdefault("nearest_mode", "floor")


# -- operands ---------------------------------------------------------------------------
def _roles(node, present, kinds):
    """(roi, scales, sizes) positions among `present` (indices of non-empty inputs after X) by kind."""
    ints = [p for p, k in zip(present, kinds) if k == "i"]
    floats = [p for p, k in zip(present, kinds) if k == "f"]
    if len(ints) > 1 or len(floats) > 2:
        raise ShapeError(f"node '{node.name}' ({node.op}): expected X, roi, scales, sizes; got {len(present) + 1} inputs")
    if node.op == "Upsample":
        return None, (floats[0] if floats else None), None
    sizes = ints[0] if ints else None
    if sizes is not None:
        return (floats[0] if floats else None), None, sizes
    if len(floats) == 2:
        return floats[0], floats[1], None
    return None, (floats[0] if floats else None), None


def _operands(node, values, dtypes, sizes_of):
    """roi, scales, sizes (lists or None) from the inputs; `values` may hold None (unknown)."""
    present, kinds = [], []
    for i, (v, dt) in enumerate(zip(values[1:], dtypes[1:]), 1):
        if dt is None or sizes_of(i) == 0:
            continue   # empty name, or an empty tensor: the input is absent
        present.append(i)
        kinds.append("i" if np.dtype(dt).kind in "iu" else "f")
    roi_i, scales_i, sizes_i = _roles(node, present, kinds)

    def value(i, what):
        if i is None:
            return None
        if values[i] is None:
            raise DataDependentShapeError(f"node '{node.name}' ({node.op}): {what} must be a constant or computed "
                                          "from shapes; it is data-dependent")
        return values[i]
    roi = value(roi_i, "roi")
    scales = value(scales_i, "scales")
    sizes = value(sizes_i, "sizes")
    if scales is None and sizes is None:
        if node.op == "Upsample" and "scales" in node.attrs:
            scales = list(node.attrs["scales"])
        else:
            raise ShapeError(f"node '{node.name}' ({node.op}): neither scales nor sizes is given")
    roi = None if roi is None else [float(x) for x in np.asarray(roi, dtype=np.float64).reshape(-1)]
    scales = None if scales is None else [float(x) for x in np.asarray(scales, dtype=np.float64).reshape(-1)]
    sizes = None if sizes is None else dims_of(sizes)
    return roi, scales, sizes


def plan(node, in_shape, roi, scales, sizes):
    """(output shape, scale per axis, roi per axis as (start, end)); symbolic dims allowed."""
    spec = spec_of(node)
    r = len(in_shape)
    axes = [a % r for a in spec.axes] if spec.axes else list(range(r))
    given = scales if sizes is None else sizes
    if len(given) != len(axes):
        raise ShapeError(f"node '{node.name}' ({node.op}): {'scales' if sizes is None else 'sizes'} has {len(given)} "
                         f"values for {len(axes)} axes of input rank {r}")
    full_roi = [(0.0, 1.0)] * r
    if roi is not None and spec.transform == "tf_crop_and_resize":
        if len(roi) != 2 * len(axes):
            raise ShapeError(f"node '{node.name}' ({node.op}): roi has {len(roi)} values, expected {2 * len(axes)}")
        for j, a in enumerate(axes):
            full_roi[a] = (roi[j], roi[len(axes) + j])
    out, scale = list(in_shape), [1.0] * r
    if sizes is None:
        for j, a in enumerate(axes):
            s = scales[j]
            if not s > 0:
                raise ShapeError(f"node '{node.name}' ({node.op}): scale {s} of axis {a} is not positive")
            scale[a] = s
            out[a] = _floor_times(in_shape[a], s)   # the roi does not shrink it (onnxruntime, onnx.reference)
    else:
        for j, a in enumerate(axes):
            out[a] = sizes[j]
        if spec.policy != "stretch":
            if not all(isinstance(in_shape[a], int) and isinstance(sizes[j], int) for j, a in enumerate(axes)):
                raise ShapeError(f"node '{node.name}' ({node.op}): keep_aspect_ratio_policy={spec.policy} needs "
                                 "static sizes")
            ratios = [sizes[j] / in_shape[a] for j, a in enumerate(axes)]
            s = min(ratios) if spec.policy == "not_larger" else max(ratios)
            for a in axes:
                scale[a], out[a] = s, int(s * in_shape[a] + 0.5)
        else:
            for j, a in enumerate(axes):
                d = in_shape[a]
                scale[a] = (sizes[j] / d) if isinstance(d, int) and isinstance(sizes[j], int) and d else None
    for a, d in enumerate(out):
        if isinstance(d, int) and d < 0:
            raise ShapeError(f"node '{node.name}' ({node.op}): output size {d} of axis {a} is negative")
    return tuple(simplify_dim(d) for d in out), scale, full_roi


def _floor_times(d, s: float):
    if isinstance(d, int):
        return int(math.floor(d * s))
    if float(s).is_integer():
        return d * int(s)
    return simplify_dim(sympy.floor(d * sympy.Rational(s)))


# -- per-axis tables ----------------------------------------------------------------------
@dataclass
class AxisTable:
    index: np.ndarray           # int64 [out, T], clamped into [0, in)
    weight: np.ndarray          # float64 [out, T]
    outside: np.ndarray | None  # bool [out]: tf_crop_and_resize maps o outside the input


def is_identity(spec: ResizeSpec, n_in: int, n_out: int, scale: float, roi) -> bool:
    """The axis is left as it is: scale 1 and the same size (onnxruntime does so under
    tf_crop_and_resize too, whatever the roi)."""
    return n_in == n_out and math.isclose(scale, 1.0)


def taps(spec: ResizeSpec, scale: float) -> int:
    """Taps per output index: nearest 1, linear 2, cubic 4; antialias widens the filter when downsampling."""
    if spec.mode == "nearest":
        return 1
    if not spec.antialias or scale >= 1:
        return 2 if spec.mode == "linear" else 4
    return 2 - 2 * int(math.floor(-(1 if spec.mode == "linear" else 2) / scale) + 1)


def _source_coords(spec: ResizeSpec, n_in: int, n_out: int, scale: float, roi):
    """Source coordinate of every output index, in float32 arithmetic as onnxruntime computes it
    (float64 moves ties such as (1 + 0.5) / 0.6 - 0.5 off 2). The modes defined by the resized
    length use the output's integer size, as the ONNX text and onnxruntime do."""
    f = np.float32
    y = np.arange(n_out, dtype=f)
    sc = f(scale)
    t = spec.transform
    outside = None
    if t == "align_corners":
        x = np.zeros(n_out, f) if n_out == 1 else y * f(n_in - 1) / f(n_out - 1)
    elif t == "asymmetric":
        x = y / sc
    elif t == "tf_crop_and_resize":
        lo, hi = f(roi[0]), f(roi[1])
        x = np.full(n_out, (hi - lo) * f(n_in - 1) / f(2), f) if n_out == 1 else y * (hi - lo) * f(n_in - 1) / f(n_out - 1)
        x = x + lo * f(n_in - 1)
        outside = (x < 0) | (x > n_in - 1)
    elif t == "pytorch_half_pixel":
        x = np.zeros(n_out, f) if n_out == 1 else (y + f(0.5)) / sc - f(0.5)   # 0: the ONNX text, onnxruntime
    elif t == "half_pixel":
        x = (y + f(0.5)) / sc - f(0.5)
    else:  # half_pixel_symmetric: the input's centre maps to the output's centre
        offset = f(n_in) / f(2) * (f(1) - f(n_out) / (sc * f(n_in)))
        x = offset + (y + f(0.5)) / sc - f(0.5)
    return x.astype(np.float64), outside


def _filter(spec: ResizeSpec, d: np.ndarray, scale: float) -> np.ndarray:
    """Weight at signed distance d (in input pixels) from the source coordinate."""
    if spec.antialias and scale < 1:
        d = d * scale   # the filter stretched over 1/scale input pixels
    d = np.abs(d)
    if spec.mode == "linear":
        return np.clip(1 - d, 0, None)
    A = spec.cubic_a
    return np.where(d <= 1, ((A + 2) * d - (A + 3)) * d * d + 1,
                    np.where(d < 2, ((A * d - 5 * A) * d + 8 * A) * d - 4 * A, 0.0))


def axis_table(spec: ResizeSpec, n_in: int, n_out: int, scale: float, roi) -> AxisTable:
    """Source indices and weights of every output index along one axis: the n taps around the
    source coordinate x are floor(x) + (1 - n/2 ... n/2), edge-clamped (ONNX pads by the edge)."""
    if n_out == 0:
        return AxisTable(np.zeros((0, 1), np.int64), np.zeros((0, 1)), None)
    x, outside = _source_coords(spec, n_in, n_out, scale, roi)
    fl = np.floor(x)
    frac = x - fl
    if spec.mode == "nearest":
        up = {"round_prefer_floor": frac > 0.5, "round_prefer_ceil": frac >= 0.5,
              "floor": np.zeros(n_out, bool), "ceil": frac > 0}[spec.nearest_mode]
        idx = np.clip(fl + up, 0, n_in - 1).astype(np.int64)[:, None]
        return AxisTable(idx, np.ones((n_out, 1)), outside)
    n = taps(spec, scale)
    offs = np.arange(1 - n // 2, 1 + n // 2)
    idx = fl.astype(np.int64)[:, None] + offs[None, :]
    c = _filter(spec, offs[None, :] - frac[:, None], scale)
    if spec.antialias and scale < 1:
        c = c / c.sum(axis=1, keepdims=True)
    if spec.exclude_outside:
        c = np.where((idx < 0) | (idx >= n_in), 0.0, c)
        total = c.sum(axis=1, keepdims=True)
        c = c / np.where(total == 0, 1.0, total)
    return AxisTable(np.clip(idx, 0, n_in - 1), c, outside)


def tables(node, in_shape, roi, scales, sizes):
    """(output shape, per-axis AxisTable or None for an axis left as it is) at concrete shapes."""
    spec = spec_of(node)
    out, scale, full_roi = plan(node, tuple(int(d) for d in in_shape), roi, scales, sizes)
    result = []
    for a, (d, o) in enumerate(zip(in_shape, out)):
        s = scale[a] if scale[a] is not None else o / d
        result.append(None if is_identity(spec, d, o, s, full_roi[a]) else axis_table(spec, d, o, s, full_roi[a]))
    return tuple(int(d) for d in out), result


def operands_of(node, xs):
    """roi, scales, sizes from a node's input arrays (xs[0], the data, is not read)."""
    values = list(xs)
    dtypes = [None if v is None else np.asarray(v).dtype for v in values]
    dtypes[0] = None
    return _operands(node, values, dtypes, lambda i: np.asarray(values[i]).size)


def resize_ref(node, xs):
    _spell_out_opset10(node)
    x = xs[0]
    out_shape, tabs = tables(node, x.shape, *operands_of(node, xs))
    spec = spec_of(node)
    y = x.astype(np.float64)
    for a, t in enumerate(tabs):
        if t is None:
            continue
        g = np.take(y, t.index, axis=a)                      # [..., out, T, ...]
        w = t.weight.reshape((1,) * a + t.weight.shape + (1,) * (y.ndim - a - 1))
        y = (g * w).sum(axis=a + 1)
        if t.outside is not None and t.outside.any():
            y = np.where(t.outside.reshape((1,) * a + (-1,) + (1,) * (y.ndim - a - 1)), spec.extrapolation_value, y)
    if x.dtype.kind in "iu" and spec.mode != "nearest":
        info = np.iinfo(x.dtype)
        y = np.clip(np.rint(y), info.min, info.max)
    return [y.astype(x.dtype)]


def _resize_infer(node, types, consts):
    _spell_out_opset10(node)
    spec_of(node)  # attribute errors first
    dtypes = [None if t is None else t.dtype for t in types]

    def size(i):
        shape = types[i].shape
        return 0 if any(isinstance(d, int) and d == 0 for d in shape) else 1
    roi, scales, sizes = _operands(node, list(consts), dtypes, size)
    out, _, _ = plan(node, types[0].shape, roi, scales, sizes)
    return [TensorType(out, types[0].dtype)]


register("Resize", INJECTIVE, _resize_infer, resize_ref, None, 2)
register("Upsample", INJECTIVE, _resize_infer, resize_ref, None, 2)

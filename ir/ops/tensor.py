"""Injective data-movement ops and the shape ops around them.

Shape-valued inputs (Reshape's shape, Expand's shape, Slice's starts...) arrive in
`consts` either as NumPy constants or as object arrays of symbolic dims (see
`registry.VALUE_FNS`), so `Shape -> Gather -> Concat -> Reshape` stays symbolic.
"""
from __future__ import annotations

import numpy as np
import sympy

from ir.errors import DataDependentShapeError, ShapeError
from ir.graph import TensorType
from ir.ops.registry import (INJECTIVE, OPAQUE, broadcast_shapes, dims_of, note_equal, register,
                             register_value, runtime_shape)
from ir.shapes import TO_THE_END, format_shape, simplify_dim

BIG = TO_THE_END  # bounds at or past this mean "to the end"/"to the start" (1e9, INT32_MAX, INT64_MAX)


def _static_len(node, types, i):
    """The static length of 1-D input i (the rank a shape-valued input gives), or None."""
    t = types[i] if len(types) > i else None
    return t.shape[0] if t is not None and t.rank == 1 and isinstance(t.shape[0], int) else None


def _need(node, consts, i, what):
    if len(consts) <= i or consts[i] is None:
        raise DataDependentShapeError(f"node '{node.name}' ({node.op}): {what} (input {i}) must be a constant or "
                         "computed from shapes; it is data-dependent")
    return dims_of(consts[i])


def _prod(dims):
    p = 1
    for d in dims:
        p = p * d
    return simplify_dim(p)


def _input_or_attr(node, xs, i, attr, default=None):
    """Opset >= N moved many attributes to inputs; accept either."""
    if len(xs) > i and node.inputs[i] and xs[i] is not None:
        return [int(v) if not hasattr(v, "free_symbols") else v for v in np.asarray(xs[i]).reshape(-1).tolist()]
    v = node.attrs.get(attr, default)
    return None if v is None else list(v)


def _value_passthrough(fn):
    """Symbolic value of an op whose reference also works on object arrays."""
    def value(node, vals, types):
        if vals[0] is None or any(v is None for i, v in enumerate(vals[1:], 1) if node.inputs[i]):
            return None
        try:
            return [np.asarray(v, dtype=object) for v in fn(node, [None if v is None else np.asarray(v, dtype=object)
                                                                     for v in vals])]
        except (TypeError, ValueError):
            return None
    return value


# -- Reshape / Flatten ------------------------------------------------------------------
def reshape_target(node, in_shape, target):
    """The output shape of Reshape(in_shape -> target), resolving 0 and -1; raises if impossible."""
    allowzero = node.attrs.get("allowzero", 0)
    out, minus = [], None
    for i, t in enumerate(target):
        if isinstance(t, int) and t == 0 and not allowzero:
            if i >= len(in_shape):
                raise ShapeError(f"node '{node.name}' (Reshape): target {target} copies axis {i} (0) "
                                 f"but the input {format_shape(in_shape)} has rank {len(in_shape)}")
            out.append(in_shape[i])
        elif isinstance(t, int) and t == -1:
            if minus is not None:
                raise ShapeError(f"node '{node.name}' (Reshape): target {target} has more than one -1")
            minus = i
            out.append(None)
        elif isinstance(t, int) and t < -1:
            raise ShapeError(f"node '{node.name}' (Reshape): invalid target size {t} in {target}")
        else:
            out.append(t)
    total = _prod(in_shape)
    if minus is not None:
        known = _prod([d for d in out if d is not None])
        if isinstance(total, int) and isinstance(known, int):
            if known == 0 or total % known:
                raise ShapeError(f"node '{node.name}' (Reshape): cannot reshape {format_shape(in_shape)} "
                                 f"({total} elements) to {target}: {total} is not divisible by {known}")
            out[minus] = total // known
        else:
            q = simplify_dim(sympy.sympify(total) / known)  # expand cancels monomial quotients
            if not isinstance(q, int) and sympy.fraction(q)[1].free_symbols:
                q = simplify_dim(sympy.cancel(q))
            if not isinstance(q, int) and q.is_integer is False:
                raise ShapeError(f"node '{node.name}' (Reshape): cannot reshape {format_shape(in_shape)} to "
                                 f"{target}: -1 would be {q}, which is not a whole number")
            if isinstance(q, int) and isinstance(total, int) is False and q < 1:
                raise ShapeError(f"node '{node.name}' (Reshape): cannot reshape {format_shape(in_shape)} to {target}")
            out[minus] = q
    out = [simplify_dim(d) for d in out]
    new_total = _prod(out)
    if isinstance(total, int) and isinstance(new_total, int) and total != new_total:
        raise ShapeError(f"node '{node.name}' (Reshape): cannot reshape {format_shape(in_shape)} "
                         f"({total} elements) to {format_shape(tuple(out))} ({new_total} elements)")
    if not (isinstance(total, int) and isinstance(new_total, int)):
        note_equal(node, total, new_total)
    return tuple(out)


def _reshape_infer(node, types, consts):
    rank = _static_len(node, types, 1)
    if consts[1] is None and rank is not None:  # a data-dependent target: sizes known once it runs
        return [TensorType(runtime_shape(node, 0, rank), types[0].dtype)]
    target = _need(node, consts, 1, "the target shape")
    return [TensorType(reshape_target(node, types[0].shape, target), types[0].dtype)]


def _reshape_ref(node, xs):
    shape = reshape_target(node, xs[0].shape, [int(v) for v in xs[1].reshape(-1)])
    return [xs[0].reshape(shape)]


register("Reshape", INJECTIVE, _reshape_infer, _reshape_ref)
register_value("Reshape", _value_passthrough(_reshape_ref))  # int() of a symbolic target fails -> unknown


def _flatten_shape(node, shape):
    axis = int(node.attrs.get("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    return (_prod(shape[:axis]), _prod(shape[axis:]))


register("Flatten", INJECTIVE, lambda n, t, c: [TensorType(_flatten_shape(n, t[0].shape), t[0].dtype)],
         lambda n, xs: [xs[0].reshape(_flatten_shape(n, xs[0].shape))])


# -- Squeeze / Unsqueeze -----------------------------------------------------------------
def _squeeze_axes(node, shape, xs):
    if len(node.inputs) > 1 and node.inputs[1] and xs[1] is None:
        raise DataDependentShapeError(f"node '{node.name}' (Squeeze): axes must be a constant")
    axes = _input_or_attr(node, xs, 1, "axes")
    if axes is None:
        if not all(isinstance(d, int) for d in shape):
            raise ShapeError(f"node '{node.name}' (Squeeze): no axes given and input {format_shape(shape)} is symbolic")
        return [i for i, d in enumerate(shape) if d == 1]
    axes = [int(a) % len(shape) for a in axes]
    for a in axes:
        if isinstance(shape[a], int) and shape[a] != 1:
            raise ShapeError(f"node '{node.name}' (Squeeze): axis {a} of {format_shape(shape)} is not 1")
    return axes


def _squeeze_shape(node, shape, xs):
    axes = _squeeze_axes(node, shape, xs)
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _unsqueeze_shape(node, shape, xs):
    if len(node.inputs) > 1 and xs[1] is None:
        raise DataDependentShapeError(f"node '{node.name}' (Unsqueeze): axes must be a constant")
    axes = _input_or_attr(node, xs, 1, "axes")
    rank = len(shape) + len(axes)
    axes = sorted(int(a) % rank for a in axes)
    out, it = [], iter(shape)
    for i in range(rank):
        out.append(1 if i in axes else next(it))
    return tuple(out)


for _name, _fn in (("Squeeze", _squeeze_shape), ("Unsqueeze", _unsqueeze_shape)):
    register(_name, INJECTIVE, (lambda fn: lambda n, t, c: [TensorType(fn(n, t[0].shape, c), t[0].dtype)])(_fn),
             (lambda fn: lambda n, xs: [xs[0].reshape(fn(n, xs[0].shape, xs))])(_fn))
    register_value(_name, _value_passthrough((lambda fn: lambda n, xs: [xs[0].reshape(fn(n, xs[0].shape, xs))])(_fn)))


# -- Concat / Split ----------------------------------------------------------------------
def _concat_infer(node, types, consts):
    types = [t for t in types if t is not None]
    rank = types[0].rank
    axis = int(node.attrs["axis"]) % rank
    for t in types[1:]:
        if t.rank != rank:
            raise ShapeError(f"node '{node.name}' (Concat): inputs of ranks {[x.rank for x in types]}")
        for i in range(rank):
            if i != axis:
                note_equal(node, types[0].shape[i], t.shape[i])
    size = simplify_dim(sum(t.shape[axis] for t in types))
    out = tuple(size if i == axis else d for i, d in enumerate(types[0].shape))
    return [TensorType(out, types[0].dtype)]


def _concat_ref(node, xs):
    xs = [x for x in xs if x is not None]
    return [np.concatenate(xs, axis=int(node.attrs["axis"]))]


register("Concat", INJECTIVE, _concat_infer, _concat_ref)
register_value("Concat", lambda n, vals, t: None if any(v is None for v in vals)
               else [np.concatenate([np.asarray(v, dtype=object).reshape(-1) for v in vals])])


def _split_sizes(node, dim, xs):
    if len(node.inputs) > 1 and node.inputs[1] and xs[1] is None:
        raise DataDependentShapeError(f"node '{node.name}' (Split): split sizes must be a constant")
    sizes = _input_or_attr(node, xs, 1, "split")
    n = len(node.outputs)
    if sizes is not None:
        if isinstance(dim, int) and sum(sizes) != dim:
            raise ShapeError(f"node '{node.name}' (Split): sizes {sizes} do not add up to {dim}")
        return sizes
    n = int(node.attrs.get("num_outputs", n))
    if isinstance(dim, int):
        chunk = -(-dim // n)
        return [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    return [simplify_dim(dim / n)] * n


def _split_infer(node, types, consts):
    shape = types[0].shape
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    return [TensorType(tuple(s if i == axis else d for i, d in enumerate(shape)), types[0].dtype)
            for s in _split_sizes(node, shape[axis], consts)]


def _split_ref(node, xs):
    x = xs[0]
    axis = int(node.attrs.get("axis", 0)) % x.ndim
    cuts = np.cumsum(_split_sizes(node, x.shape[axis], xs))[:-1]
    return [np.ascontiguousarray(p) for p in np.split(x, cuts, axis=axis)]


register("Split", INJECTIVE, _split_infer, _split_ref)


# -- Slice ------------------------------------------------------------------------------
def _slice_params(node, rank, xs):
    starts = _input_or_attr(node, xs, 1, "starts")
    ends = _input_or_attr(node, xs, 2, "ends")
    axes = _input_or_attr(node, xs, 3, "axes") or list(range(len(starts)))
    steps = _input_or_attr(node, xs, 4, "steps") or [1] * len(starts)
    return starts, ends, [int(a) % rank for a in axes], steps


def _bound(v, d, step_positive: bool, is_start: bool):
    """One Slice bound clamped into the dim as ONNX does, symbolically where d or v is.
    Sentinels (|v| >= TO_THE_END) mean the end or the start whatever d is."""
    lo, hi = (0, d) if step_positive else (-1, d - 1)
    if not step_positive and is_start:
        lo = 0
    if isinstance(v, int):
        if v >= BIG:
            return hi
        if v <= -BIG:
            return lo
        if v < 0:
            v = d + v
            return simplify_dim(sympy.Max(lo, v)) if not isinstance(v, int) else max(lo, v)
    return simplify_dim(sympy.Min(v, hi)) if not (isinstance(v, int) and isinstance(hi, int)) else min(v, hi)


def _slice_len(node, d, s, e, st):
    """ONNX Slice length; exact for symbolic dims and bounds (symbolic bounds are
    shape values, so taken as non-negative)."""
    if st == 0:
        raise ShapeError(f"node '{node.name}' (Slice): step 0")
    if isinstance(d, int) and isinstance(s, int) and isinstance(e, int):
        return len(range(d)[slice(s, e, st)])
    start, end = _bound(s, d, st > 0, True), _bound(e, d, st > 0, False)
    span = end - start if st > 0 else start - end
    k = abs(st)
    n = span if k == 1 else sympy.floor((span + k - 1) / sympy.Integer(k))
    if isinstance(n, int):
        return max(0, n)
    return simplify_dim(sympy.Max(0, simplify_dim(n)))


def _slice_infer(node, types, consts):
    shape = list(types[0].shape)
    starts = _need(node, consts, 1, "starts") if len(node.inputs) > 1 else node.attrs["starts"]
    ends = _need(node, consts, 2, "ends") if len(node.inputs) > 2 else node.attrs["ends"]
    axes = (_need(node, consts, 3, "axes") if len(node.inputs) > 3 and node.inputs[3] else node.attrs.get("axes")) \
        or list(range(len(starts)))
    steps = (_need(node, consts, 4, "steps") if len(node.inputs) > 4 and node.inputs[4] else None) or [1] * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = int(a) % len(shape)
        shape[a] = _slice_len(node, shape[a], s, e, int(st))
    return [TensorType(tuple(shape), types[0].dtype)]


def _slice_infer_any(node, types, consts):
    """Data-dependent starts/ends: the sliced axes are runtime dims (all of them if the axes are too)."""
    try:
        return _slice_infer(node, types, consts)
    except DataDependentShapeError:
        if len(node.inputs) > 3 and node.inputs[3] and consts[3] is None:
            return [TensorType(runtime_shape(node, 0, types[0].rank), types[0].dtype)]
        n = _static_len(node, types, 1)
        axes = dims_of(consts[3]) if len(node.inputs) > 3 and node.inputs[3] else list(range(n or 0))
        if n is None and not axes:
            raise
        fresh = runtime_shape(node, 0, types[0].rank)
        cut = {int(a) % types[0].rank for a in axes}
        return [TensorType(tuple(fresh[i] if i in cut else d for i, d in enumerate(types[0].shape)), types[0].dtype)]


def _slice_ref(node, xs):
    x = xs[0]
    starts, ends, axes, steps = _slice_params(node, x.ndim, xs)
    sl = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        sl[a] = slice(int(s), int(e), int(st))
    return [np.ascontiguousarray(x[tuple(sl)])]


register("Slice", INJECTIVE, _slice_infer_any, _slice_ref)
register_value("Slice", _value_passthrough(_slice_ref))


# -- Gather -------------------------------------------------------------------------------
def _gather_infer(node, types, consts):
    data, idx = types[0].shape, types[1].shape
    axis = int(node.attrs.get("axis", 0)) % len(data)
    return [TensorType(tuple(data[:axis]) + tuple(idx) + tuple(data[axis + 1:]), types[0].dtype)]


def _gather_ref(node, xs):
    axis = int(node.attrs.get("axis", 0))
    idx = np.asarray(xs[1]).astype(np.int64)
    return [np.take(xs[0], idx, axis=axis)]


register("Gather", INJECTIVE, _gather_infer, _gather_ref)
def _gather_value(node, vals, types):
    """Gather of a shape value at constant int indices (e.g. Shape(x)[1] -> seq)."""
    if vals[0] is None or vals[1] is None or not all(isinstance(v, int) for v in dims_of(vals[1])):
        return None
    idx = np.asarray(dims_of(vals[1]), dtype=np.int64).reshape(np.shape(vals[1]))
    return [np.take(np.asarray(vals[0], dtype=object), idx, axis=int(node.attrs.get("axis", 0)))]


register_value("Gather", _gather_value)


# -- Expand / Tile / Pad ------------------------------------------------------------------
def _expand_infer(node, types, consts):
    n = _static_len(node, types, 1)
    if consts[1] is None and n is not None:  # data-dependent: keep the input's non-1 sizes
        x = types[0].shape
        rank = max(n, len(x))
        fresh = runtime_shape(node, 0, rank)
        xs = (1,) * (rank - len(x)) + tuple(x)
        return [TensorType(tuple(fresh[i] if isinstance(d, int) and d == 1 else d for i, d in enumerate(xs)),
                           types[0].dtype)]
    shape = _need(node, consts, 1, "the shape")
    return [TensorType(broadcast_shapes(node, types[0].shape, tuple(shape)), types[0].dtype)]


def _expand_ref(node, xs):
    shape = np.broadcast_shapes(xs[0].shape, tuple(int(v) for v in xs[1].reshape(-1)))
    return [np.ascontiguousarray(np.broadcast_to(xs[0], shape))]


register("Expand", INJECTIVE, _expand_infer, _expand_ref)


def _tile_infer(node, types, consts):
    reps = _need(node, consts, 1, "repeats")
    return [TensorType(tuple(simplify_dim(d * r) for d, r in zip(types[0].shape, reps)), types[0].dtype)]


register("Tile", INJECTIVE, _tile_infer, lambda n, xs: [np.tile(xs[0], [int(v) for v in xs[1].reshape(-1)])])


def _pads(node, rank, xs):
    pads = _input_or_attr(node, xs, 1, "pads")
    axes = _input_or_attr(node, xs, 3, "axes")
    axes = [int(a) % rank for a in axes] if axes else list(range(rank))
    k = len(axes)
    full = [(0, 0)] * rank
    for j, a in enumerate(axes):
        full[a] = (pads[j], pads[j + k])
    return full


def _pad_infer(node, types, consts):
    shape = types[0].shape
    if len(node.inputs) > 1 and (consts[1] is None):
        raise DataDependentShapeError(f"node '{node.name}' (Pad): pads must be a constant")
    widths = _pads(node, len(shape), consts)
    return [TensorType(tuple(simplify_dim(d + lo + hi) for d, (lo, hi) in zip(shape, widths)), types[0].dtype)]


def _pad_ref(node, xs):
    x = xs[0]
    widths = _pads(node, x.ndim, xs)
    mode = node.attrs.get("mode", "constant")
    # negative pads crop
    crop = tuple(slice(max(0, -lo), x.shape[i] - max(0, -hi)) for i, (lo, hi) in enumerate(widths))
    x = x[crop]
    widths = [(max(0, lo), max(0, hi)) for lo, hi in widths]
    if mode == "constant":
        value = xs[2] if len(xs) > 2 and xs[2] is not None and xs[2].size else node.attrs.get("value", 0)
        return [np.pad(x, widths, constant_values=np.asarray(value, dtype=x.dtype).reshape(()))]
    return [np.pad(x, widths, mode={"edge": "edge", "reflect": "reflect", "wrap": "wrap"}[mode])]


register("Pad", INJECTIVE, _pad_infer, _pad_ref)


# -- shape computations: Shape, Size, ConstantOfShape, Range -------------------------------
def _shape_range(node, rank):
    start = int(node.attrs.get("start", 0))
    end = int(node.attrs.get("end", rank))
    start, end = [min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end)]
    return start, end


def _shape_infer(node, types, consts):
    s, e = _shape_range(node, types[0].rank)
    return [TensorType((max(0, e - s),), "int64")]


def _shape_ref(node, xs):
    s, e = _shape_range(node, xs[0].ndim)
    return [np.asarray(xs[0].shape[s:e], dtype=np.int64)]


def _shape_value(node, vals, types):
    s, e = _shape_range(node, types[0].rank)
    return [np.asarray(list(types[0].shape[s:e]), dtype=object)]


register("Shape", OPAQUE, _shape_infer, _shape_ref)
register_value("Shape", _shape_value)
register("Size", OPAQUE, lambda n, t, c: [TensorType((), "int64")], lambda n, xs: [np.asarray(xs[0].size, dtype=np.int64)])
register_value("Size", lambda n, vals, types: [np.asarray(_prod(types[0].shape), dtype=object)])


def _cos_value(node):
    v = node.attrs.get("value")
    return np.zeros(1, dtype=np.float32) if v is None else np.asarray(v).reshape(-1)


def _cos_infer(node, types, consts):
    n = _static_len(node, types, 0)
    if consts[0] is None and n is not None:
        return [TensorType(runtime_shape(node, 0, n), str(_cos_value(node).dtype))]
    shape = _need(node, consts, 0, "the shape")
    return [TensorType(tuple(shape), str(_cos_value(node).dtype))]


def _cos_ref(node, xs):
    return [np.full(tuple(int(v) for v in xs[0].reshape(-1)), _cos_value(node)[0], dtype=_cos_value(node).dtype)]


def _cos_vals(node, vals, types):
    if vals[0] is None or _cos_value(node).dtype.kind not in "iu":
        return None
    shape = dims_of(vals[0])
    if not all(isinstance(d, int) for d in shape) or _prod(shape) > 64:
        return None
    return [np.full(tuple(shape), int(_cos_value(node)[0]), dtype=object)]


register("ConstantOfShape", OPAQUE, _cos_infer, _cos_ref)
register_value("ConstantOfShape", _cos_vals)


def _range_infer(node, types, consts):
    if any(c is None for c in consts[:3]):  # data-dependent length
        return [TensorType(runtime_shape(node, 0, 1), types[0].dtype)]
    start, limit, delta = (np.asarray(c).reshape(-1)[0] for c in consts[:3])
    if all(isinstance(v, (int, float, np.number)) for v in (start, limit, delta)):
        n = max(0, int(np.ceil((float(limit) - float(start)) / float(delta))))
    else:
        n = simplify_dim(sympy.Max(0, simplify_dim(sympy.ceiling((sympy.sympify(limit) - start) / delta))))
    return [TensorType((n,), types[0].dtype)]


def _range_ref(node, xs):
    return [np.arange(xs[0].item(), xs[1].item(), xs[2].item()).astype(xs[0].dtype)]


register("Range", OPAQUE, _range_infer, _range_ref)
register_value("Range", lambda n, vals, t: [np.arange(*(int(np.asarray(v).reshape(-1)[0]) for v in vals)).astype(object)]
               if all(v is not None and _all_int_values(v) for v in vals) else None)


def _all_int_values(v) -> bool:
    return all(isinstance(x, (int, np.integer)) for x in np.asarray(v, dtype=object).reshape(-1).tolist())

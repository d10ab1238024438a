"""Elementwise ops beyond `ir.ops.elementwise`: Swish and CastLike.

(Trigonometry, the ELU family, sign/rounding, bitwise/logical ops, variadic Mean and
PRelu live in `ir.ops.elementwise`, with typed scalar expressions the template compiles.)
"""
from __future__ import annotations

import numpy as np

from ir.errors import UnsupportedOpError
from ir.graph import TensorType
from ir.ops.elementwise import (_DTYPE_NAMES, DTYPE_EXPRS, NUMBA_TYPES, VECTOR_MATH, _unary, _vector_expr,
                                sigmoid_build)
from ir.ops.registry import ELEMWISE, f32, register


def _attr(n, name, default):
    return float(n.attrs.get(name, default))


def _swish_build(n, bind, a):
    """x sigmoid(alpha x), float32: the vectorizable sigmoid (`sigmoid_build`). SiLU, as exporters
    write it (x * Sigmoid(x)), becomes this op (`ir.patterns.fuse_swish`), so that it fuses into
    a conv's or a matmul's epilogue."""
    alpha = f32(_attr(n, "alpha", 1.0))
    return f"{a[0]} * {sigmoid_build(bind, f'({alpha} * {a[0]})')}"


def _swish_typed(n, args, in_dtypes, out_dtype):
    """Other than float32: libm's exp at the output's precision."""
    if out_dtype == "float32" and all(d == "float32" for d in in_dtypes):
        return None
    x = args[0]
    alpha = _attr(n, "alpha", 1.0)
    return f"np.{NUMBA_TYPES[out_dtype]}({x} / (1.0 + math.exp(-{alpha!r} * {x})))"


VECTOR_MATH["Swish"] = _swish_build
DTYPE_EXPRS["Swish"] = _swish_typed
_unary("Swish", lambda n, x: x / (1 + np.exp(-np.asarray(_attr(n, "alpha", 1.0), x.dtype) * x)),
       _vector_expr("Swish"), 8)

# -- CastLike: Cast to the dtype of the second input --------------------------------------
def _castlike_ref(n, xs):
    if xs[1].dtype.name not in _DTYPE_NAMES.values():  # float8/int4...: saturation rules of their own
        raise UnsupportedOpError(f"node '{n.name}' (CastLike): target dtype {xs[1].dtype} has no NumPy cast")
    return [np.asarray(xs[0]).astype(xs[1].dtype)]


register("CastLike", ELEMWISE, lambda n, t, c: [TensorType(t[0].shape, t[1].dtype)], _castlike_ref)

"""Elementwise ops beyond `ir.ops.elementwise`: Swish and CastLike.

(Trigonometry, the ELU family, sign/rounding, bitwise/logical ops, variadic Mean and
PRelu live in `ir.ops.elementwise`, with typed scalar expressions the template compiles.)
"""
from __future__ import annotations

import numpy as np

from ir.errors import UnsupportedOpError
from ir.graph import TensorType
from ir.ops.elementwise import _DTYPE_NAMES, _unary
from ir.ops.registry import ELEMWISE, f32, register


def _attr(n, name, default):
    return float(n.attrs.get(name, default))



_unary("Swish", lambda n, x: x / (1 + np.exp(-np.asarray(_attr(n, "alpha", 1.0), x.dtype) * x)),
       lambda n, a: f"({a[0]} / ({f32(1)} + math.exp(-{f32(_attr(n, 'alpha', 1.0))} * {a[0]})))", 8)

# -- CastLike: Cast to the dtype of the second input --------------------------------------
def _castlike_ref(n, xs):
    if xs[1].dtype.name not in _DTYPE_NAMES.values():  # float8/int4...: saturation rules of their own
        raise UnsupportedOpError(f"node '{n.name}' (CastLike): target dtype {xs[1].dtype} has no NumPy cast")
    return [np.asarray(xs[0]).astype(xs[1].dtype)]


register("CastLike", ELEMWISE, lambda n, t, c: [TensorType(t[0].shape, t[1].dtype)], _castlike_ref)

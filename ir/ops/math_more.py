"""More elementwise and broadcast math: trigonometry, the ELU family, sign/rounding,
bitwise and logical ops, variadic Mean, PRelu, CastLike.

Same conventions as `ir.ops.elementwise` (whose `_unary`/`_binary` helpers these use):
a NumPy reference that keeps the input dtype and, for float ops, a float32 scalar
expression that the elementwise template inlines, so float32 chains of these ops
compile into one kernel.
"""
from __future__ import annotations

import numpy as np

from ir.errors import UnsupportedOpError
from ir.graph import TensorType
from ir.ops.elementwise import _DTYPE_NAMES, _binary, _broadcast_infer, _unary
from ir.ops.registry import BROADCAST, ELEMWISE, f32, register

# -- trigonometric and hyperbolic (math.* exists for each in numba) ---------------------
for _name, _fn in (("Sin", "sin"), ("Cos", "cos"), ("Tan", "tan"), ("Asin", "asin"), ("Acos", "acos"),
                   ("Atan", "atan"), ("Sinh", "sinh"), ("Cosh", "cosh"), ("Asinh", "asinh"),
                   ("Acosh", "acosh"), ("Atanh", "atanh")):
    _np = getattr(np, "arc" + _fn[1:] if _fn.startswith("a") else _fn)
    _unary(_name, lambda n, x, f=_np: f(x), lambda n, a, f=_fn: f"math.{f}({a[0]})", 8)


# -- sign and rounding ------------------------------------------------------------------
_unary("Sign", lambda n, x: np.sign(x),
       lambda n, a: f"({f32(1)} if {a[0]} > {f32(0)} else ({f32(-1)} if {a[0]} < {f32(0)} else {a[0]} * {f32(0)}))")
# ONNX rounds half to even, like np.rint (and unlike Python's round on halves... which also
# rounds to even, but returns an int in numba): keep the float.
_unary("Round", lambda n, x: np.rint(x), lambda n, a: f"np.float32(np.rint({a[0]}))")


# -- the ELU family and other activations -----------------------------------------------
def _attr(n, name, default):
    return float(n.attrs.get(name, default))


_SELU_ALPHA, _SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875


def _elu(n, x):
    a = np.asarray(_attr(n, "alpha", 1.0), x.dtype)
    return np.where(x < 0, a * np.expm1(np.minimum(x, 0)), x)


def _selu(n, x):
    a, g = np.asarray(_attr(n, "alpha", _SELU_ALPHA), x.dtype), np.asarray(_attr(n, "gamma", _SELU_GAMMA), x.dtype)
    return np.where(x <= 0, g * a * np.expm1(np.minimum(x, 0)), g * x)


def _celu(n, x):
    a = np.asarray(_attr(n, "alpha", 1.0), x.dtype)
    return np.maximum(x, 0) + np.minimum(0, a * np.expm1(np.minimum(x, 0) / a))


def _shrink(n, x):
    lambd, bias = np.asarray(_attr(n, "lambd", 0.5), x.dtype), np.asarray(_attr(n, "bias", 0.0), x.dtype)
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, np.zeros_like(x)))


def _softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


_unary("Elu", _elu, lambda n, a: f"({a[0]} if {a[0]} >= {f32(0)} else {f32(_attr(n, 'alpha', 1.0))} * "
                                 f"math.expm1({a[0]}))", 8)
_unary("Selu", _selu, lambda n, a: (
    f"({f32(_attr(n, 'gamma', _SELU_GAMMA))} * {a[0]} if {a[0]} > {f32(0)} else "
    f"{f32(_attr(n, 'gamma', _SELU_GAMMA) * _attr(n, 'alpha', _SELU_ALPHA))} * math.expm1({a[0]}))"), 8)
_unary("Celu", _celu, lambda n, a: (
    f"(max({a[0]}, {f32(0)}) + min({f32(0)}, {f32(_attr(n, 'alpha', 1.0))} * "
    f"math.expm1(min({a[0]}, {f32(0)}) / {f32(_attr(n, 'alpha', 1.0))})))"), 8)
_unary("ThresholdedRelu", lambda n, x: np.where(x > _attr(n, "alpha", 1.0), x, np.zeros_like(x)),
       lambda n, a: f"({a[0]} if {a[0]} > {f32(_attr(n, 'alpha', 1.0))} else {f32(0)})")
_unary("Shrink", _shrink, lambda n, a: (
    f"({a[0]} + {f32(_attr(n, 'bias', 0.0))} if {a[0]} < {f32(-_attr(n, 'lambd', 0.5))} else "
    f"({a[0]} - {f32(_attr(n, 'bias', 0.0))} if {a[0]} > {f32(_attr(n, 'lambd', 0.5))} else {f32(0)}))"), 2)
_unary("Softsign", lambda n, x: x / (1 + np.abs(x)), lambda n, a: f"({a[0]} / ({f32(1)} + abs({a[0]})))", 3)
_unary("Mish", lambda n, x: x * np.tanh(_softplus(x)),
       lambda n, a: f"({a[0]} * math.tanh(math.log1p(math.exp(-abs({a[0]}))) + max({a[0]}, {f32(0)})))", 12)
_unary("Swish", lambda n, x: x / (1 + np.exp(-np.asarray(_attr(n, "alpha", 1.0), x.dtype) * x)),
       lambda n, a: f"({a[0]} / ({f32(1)} + math.exp(-{f32(_attr(n, 'alpha', 1.0))} * {a[0]})))", 8)
_binary("PRelu", lambda x, s: np.where(x < 0, x * s.astype(x.dtype), x),
        "({0} if {0} >= np.float32(0.0) else {0} * {1})", 2)


# -- Mean: variadic, broadcasting ---------------------------------------------------------
def _mean_ref(n, xs):
    total = xs[0].astype(xs[0].dtype)
    for x in xs[1:]:
        total = total + x
    return [np.asarray(total / np.asarray(len(xs), xs[0].dtype)).astype(xs[0].dtype, copy=False)]


register("Mean", BROADCAST, _broadcast_infer(), _mean_ref,
         lambda n, a: f"(({' + '.join(a)}) / {f32(len(a))})", 2)


# -- logical and bitwise (integer/bool: references only; the template compiles float32) ---
_binary("Xor", np.logical_xor, "({} != {})", out_dtype="bool")
for _name, _fn in (("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or), ("BitwiseXor", np.bitwise_xor)):
    register(_name, BROADCAST, _broadcast_infer(), lambda n, xs, f=_fn: [f(xs[0], xs[1]).astype(xs[0].dtype)])
register("BitwiseNot", ELEMWISE, lambda n, t, c: [t[0]], lambda n, xs: [np.invert(xs[0])])


def _bitshift(n, xs):
    x, s = xs[0], xs[1].astype(xs[0].dtype)
    y = np.left_shift(x, s) if n.attrs.get("direction", "LEFT") == "LEFT" else np.right_shift(x, s)
    return [y.astype(x.dtype)]


register("BitShift", BROADCAST, _broadcast_infer(), _bitshift)


# -- CastLike: Cast to the dtype of the second input --------------------------------------
def _castlike_ref(n, xs):
    if xs[1].dtype.name not in _DTYPE_NAMES.values():  # float8/int4...: saturation rules of their own
        raise UnsupportedOpError(f"node '{n.name}' (CastLike): target dtype {xs[1].dtype} has no NumPy cast")
    return [np.asarray(xs[0]).astype(xs[1].dtype)]


register("CastLike", ELEMWISE, lambda n, t, c: [TensorType(t[0].shape, t[1].dtype)], _castlike_ref)

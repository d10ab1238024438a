"""Elementwise and broadcast ops: each carries a NumPy reference and a scalar expression.

References keep the input dtype (ONNX does), computing in float32 for float32 inputs.
Expressions are scalar numba code over float32 (`f32(...)` literals, `math.*`).
"""
from __future__ import annotations

import math
from functools import reduce

import numpy as np

from ir.errors import UnsupportedOpError
from ir.graph import TensorType
from ir.ops.registry import BROADCAST, ELEMWISE, broadcast_shapes, f32, register, register_value, same_as_input

try:  # scipy's erf is vectorized; math.erf per element is the fallback
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover
    _erf = np.vectorize(math.erf, otypes=[np.float64])

_DTYPE_NAMES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
                9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}


def _broadcast_infer(out_dtype=None):
    def infer(node, types, consts):
        present = [t for t in types if t is not None]
        shape = broadcast_shapes(node, *[t.shape for t in present])
        return [TensorType(shape, out_dtype or present[0].dtype)]
    return infer


def _value_ref(ref):
    """Symbolic value propagation for int ops: run the NumPy reference on object arrays."""
    def value(node, vals, types):
        if any(v is None for v in vals):
            return None
        return [np.asarray(r, dtype=object) for r in ref(node, [np.asarray(v, dtype=object) for v in vals])]
    return value


def _binary(name, np_fn, expr_fmt, flops=1, out_dtype=None, value=False):
    """A two-input broadcast op; Max/Min/Sum/Mean also accept more inputs (ONNX variadic)."""
    def ref(node, xs):
        y = reduce(np_fn, xs) if len(xs) != 2 else np_fn(xs[0], xs[1])
        return [np.asarray(y).astype(out_dtype or xs[0].dtype, copy=False)]

    def expr(node, a):
        return reduce(lambda x, y: expr_fmt.format(x, y), a)

    register(name, BROADCAST, _broadcast_infer(out_dtype), ref, expr, flops)
    if value:
        register_value(name, _value_ref(lambda n, xs: [reduce(np_fn, xs)]))


def _unary(name, np_fn, expr_fn, flops=1):
    def ref(node, xs):
        return [np.asarray(np_fn(node, xs[0])).astype(xs[0].dtype, copy=False)]

    register(name, ELEMWISE, same_as_input(0), ref, expr_fn, flops)


def _int_div(a, b):
    if isinstance(a, np.ndarray) and a.dtype.kind in "iu":
        return np.trunc(a / b).astype(a.dtype)  # ONNX integer Div truncates
    if isinstance(a, np.ndarray) and a.dtype == object:
        return np.array([x // y for x, y in np.broadcast(a, b)], dtype=object).reshape(np.broadcast_shapes(a.shape, np.shape(b)))
    return np.divide(a, b)


_binary("Add", np.add, "({} + {})", value=True)
_binary("Sub", np.subtract, "({} - {})", value=True)
_binary("Mul", np.multiply, "({} * {})", value=True)
_binary("Div", _int_div, "({} / {})", value=True)
_binary("Max", np.maximum, "max({}, {})")
_binary("Min", np.minimum, "min({}, {})")
_binary("Sum", np.add, "({} + {})")
_binary("Pow", lambda a, b: np.power(a, b.astype(a.dtype) if a.dtype.kind == "f" else b), "({} ** {})", 8)
_binary("Equal", np.equal, "({} == {})", out_dtype="bool", value=True)
_binary("Less", np.less, "({} < {})", out_dtype="bool")
_binary("Greater", np.greater, "({} > {})", out_dtype="bool")
_binary("LessOrEqual", np.less_equal, "({} <= {})", out_dtype="bool")
_binary("GreaterOrEqual", np.greater_equal, "({} >= {})", out_dtype="bool")
_binary("And", np.logical_and, "({} and {})", out_dtype="bool")
_binary("Or", np.logical_or, "({} or {})", out_dtype="bool")


def _where_infer(node, types, consts):
    return [TensorType(broadcast_shapes(node, *[t.shape for t in types]), types[1].dtype)]


register("Where", BROADCAST, _where_infer, lambda n, xs: [np.where(xs[0], xs[1], xs[2])],
         lambda n, a: f"({a[1]} if {a[0]} else {a[2]})")
register_value("Where", _value_ref(lambda n, xs: [np.where(xs[0].astype(bool), xs[1], xs[2])]))

_unary("Relu", lambda n, x: np.maximum(x, 0), lambda n, a: f"max({a[0]}, {f32(0)})")
_unary("Neg", lambda n, x: -x, lambda n, a: f"(-{a[0]})")
_unary("Abs", lambda n, x: np.abs(x), lambda n, a: f"abs({a[0]})")
_unary("Exp", lambda n, x: np.exp(x), lambda n, a: f"math.exp({a[0]})", 8)
_unary("Log", lambda n, x: np.log(x), lambda n, a: f"math.log({a[0]})", 8)
_unary("Sqrt", lambda n, x: np.sqrt(x), lambda n, a: f"math.sqrt({a[0]})", 4)
_unary("Reciprocal", lambda n, x: 1 / x, lambda n, a: f"({f32(1)} / {a[0]})", 4)
_unary("Tanh", lambda n, x: np.tanh(x), lambda n, a: f"math.tanh({a[0]})", 8)
# erf as a clamped odd/even rational polynomial in float32 (the coefficients Eigen and
# XLA use; max abs error 4.2e-7 here): only mul/add/div, so LLVM vectorizes it, where
# a `math.erf` call per element ran ~3x slower than the whole fused dense kernel.
_ERF_P = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04, -5.69250639462346e-05,
          -2.10102402082508e-06, 2.77068142495902e-08, -2.72614225801306e-10)
_ERF_Q = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03, -2.13374055278905e-04,
          -1.45660718464996e-05)


def erf_expr(x: str) -> str:
    c = f"min(max({x}, {f32(-4)}), {f32(4)})"
    x2 = f"({c} * {c})"

    def horner(coefs):
        e = f32(coefs[-1])
        for k in reversed(coefs[:-1]):
            e = f"({e} * {x2} + {f32(k)})"
        return e
    return f"({c} * {horner(_ERF_P)} / {horner(_ERF_Q)})"


_unary("Erf", lambda n, x: _erf(x), lambda n, a: erf_expr(a[0]), 8)
_unary("Sigmoid", lambda n, x: 1 / (1 + np.exp(-x)),
       lambda n, a: f"({f32(1)} / ({f32(1)} + math.exp(-{a[0]})))", 8)
_unary("Softplus", lambda n, x: np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0),
       lambda n, a: f"(math.log1p(math.exp(-abs({a[0]}))) + max({a[0]}, {f32(0)}))", 8)
_unary("Not", lambda n, x: np.logical_not(x), lambda n, a: f"(not {a[0]})")
_unary("Floor", lambda n, x: np.floor(x), lambda n, a: f"math.floor({a[0]})")
_unary("Ceil", lambda n, x: np.ceil(x), lambda n, a: f"math.ceil({a[0]})")
_unary("Identity", lambda n, x: x.copy(), lambda n, a: a[0], 0)
register_value("Identity", lambda n, vals, types: [vals[0]] if vals[0] is not None else None)
register_value("Neg", _value_ref(lambda n, xs: [-xs[0]]))


def _leaky(n, x):
    alpha = n.attrs.get("alpha", 0.01)
    return np.where(x >= 0, x, x * np.float32(alpha))


_unary("LeakyRelu", _leaky, lambda n, a: f"({a[0]} if {a[0]} >= {f32(0)} else {a[0]} * {f32(n.attrs.get('alpha', 0.01))})")


def _hard_sigmoid(n, x):
    alpha, beta = n.attrs.get("alpha", 0.2), n.attrs.get("beta", 0.5)
    return np.clip(x * np.float32(alpha) + np.float32(beta), 0, 1)


_unary("HardSigmoid", _hard_sigmoid,
       lambda n, a: f"min(max({a[0]} * {f32(n.attrs.get('alpha', 0.2))} + {f32(n.attrs.get('beta', 0.5))}, {f32(0)}), {f32(1)})", 3)
_unary("HardSwish", lambda n, x: x * np.clip(x / np.float32(6) + np.float32(0.5), 0, 1),
       lambda n, a: f"({a[0]} * min(max({a[0]} / {f32(6)} + {f32(0.5)}, {f32(0)}), {f32(1)}))", 4)


def _gelu(n, x):
    if n.attrs.get("approximate", "none") == "tanh":
        c = np.float32(math.sqrt(2 / math.pi))
        return 0.5 * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x ** 3)))
    return 0.5 * x * (1 + _erf(x / np.float32(math.sqrt(2))))


def _gelu_expr(n, a):
    x = a[0]
    if n.attrs.get("approximate", "none") == "tanh":
        return (f"({f32(0.5)} * {x} * ({f32(1)} + math.tanh({f32(math.sqrt(2 / math.pi))} * "
                f"({x} + {f32(0.044715)} * {x} * {x} * {x}))))")
    return f"({f32(0.5)} * {x} * ({f32(1)} + {erf_expr(f'({x} * {f32(1 / math.sqrt(2))})')}))"


_unary("Gelu", _gelu, _gelu_expr, 10)


# -- Clip: min/max are optional inputs (opset >= 11) or attributes (older) ------------
def _clip_bounds(n, xs):
    lo = xs[1] if len(xs) > 1 and xs[1] is not None else n.attrs.get("min")
    hi = xs[2] if len(xs) > 2 and xs[2] is not None else n.attrs.get("max")
    return lo, hi


def _clip_ref(n, xs):
    lo, hi = _clip_bounds(n, xs)
    y = xs[0]
    if lo is not None:
        y = np.maximum(y, np.asarray(lo, dtype=xs[0].dtype))
    if hi is not None:
        y = np.minimum(y, np.asarray(hi, dtype=xs[0].dtype))
    return [np.asarray(y, dtype=xs[0].dtype)]


def _clip_expr(n, a):
    x, k = a[0], 1
    if "min" in n.attrs:
        x = f"max({x}, {f32(n.attrs['min'])})"
    elif len(n.inputs) > 1 and n.inputs[1] and k < len(a):
        x, k = f"max({x}, {a[k]})", k + 1
    if "max" in n.attrs:
        x = f"min({x}, {f32(n.attrs['max'])})"
    elif len(n.inputs) > 2 and n.inputs[2] and k < len(a):
        x = f"min({x}, {a[k]})"
    return x


register("Clip", ELEMWISE, same_as_input(0), _clip_ref, _clip_expr, 2)


# -- Cast: elementwise, changes the dtype ---------------------------------------------
def _cast_dtype(n) -> str:
    return _DTYPE_NAMES.get(int(n.attrs.get("to", 1)), f"onnx_type_{int(n.attrs.get('to', 1))}")


def _cast_ref(n, xs):
    if int(n.attrs.get("to", 1)) not in _DTYPE_NAMES:  # bfloat16, float8, int4...: onnx.reference
        raise UnsupportedOpError(f"node '{n.name}' (Cast): target type {n.attrs.get('to')} has no NumPy dtype")
    return [np.asarray(xs[0]).astype(_cast_dtype(n))]


def _cast_value(n, vals, types):
    if vals[0] is None or _cast_dtype(n) not in ("int64", "int32"):
        return None
    return [vals[0]]


register("Cast", ELEMWISE, lambda n, t, c: [TensorType(t[0].shape, _cast_dtype(n))], _cast_ref,
         lambda n, a: f"np.{_cast_dtype(n)}({a[0]})", 0)
register_value("Cast", _cast_value)


# -- Dropout (inference: identity; optional mask output) ------------------------------
def _dropout_infer(n, types, consts):
    return [types[0], TensorType(types[0].shape, "bool")]


register("Dropout", ELEMWISE, _dropout_infer,
         lambda n, xs: [xs[0].copy(), np.ones(xs[0].shape, dtype=bool)], lambda n, a: a[0], 0)

_ = math  # generated code imports math; kept here for the expression vocabulary

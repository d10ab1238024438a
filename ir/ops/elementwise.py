"""Elementwise and broadcast ops: each carries a NumPy reference and a scalar expression.

References keep the input dtype (ONNX does), computing in float32 for float32 inputs.
Expressions are scalar numba code over float32 (`f32(...)` literals, `math.*`); `typed_expr`
gives the code of an op over other element types (int64/int32/bool...): an op whose code
depends on the type registers a `DTYPE_EXPRS` entry, any other is computed as written and
converted to its output type.
"""
from __future__ import annotations

import math
from functools import reduce

import numpy as np

from ir.errors import UnsupportedOpError
from ir.graph import TensorType
from ir.ops.registry import OPS, BROADCAST, ELEMWISE, broadcast_shapes, f32, register, register_value, same_as_input

try:  # scipy's erf is vectorized; math.erf per element is the fallback
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover
    _erf = np.vectorize(math.erf, otypes=[np.float64])

from ir.dtypes import DTYPES as _ALL_DTYPES, RUNNABLE as _RUNNABLE  # noqa: E402
_DTYPE_NAMES = dict(_ALL_DTYPES)


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
_binary("And", np.logical_and, "({} & {})", out_dtype="bool")   # & on bools: no branch, vectorizes
_binary("Or", np.logical_or, "({} | {})", out_dtype="bool")
_binary("Xor", np.logical_xor, "({} != {})", out_dtype="bool")
_binary("BitwiseAnd", np.bitwise_and, "({} & {})")
_binary("BitwiseOr", np.bitwise_or, "({} | {})")
_binary("BitwiseXor", np.bitwise_xor, "({} ^ {})")


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
_unary("Floor", lambda n, x: np.floor(x), lambda n, a: f"np.floor({a[0]})")   # np.*: stays float (math.* -> int64)
_unary("Ceil", lambda n, x: np.ceil(x), lambda n, a: f"np.ceil({a[0]})")
_unary("Round", lambda n, x: np.rint(x), lambda n, a: f"np.rint({a[0]})")     # half to even, as ONNX
_unary("BitwiseNot", lambda n, x: np.invert(x), lambda n, a: f"(~{a[0]})")
_TRIG = {"Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
         "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh"}
for _name, _fn in _TRIG.items():   # NumPy spells asin as arcsin
    _unary(_name, (lambda f: lambda n, x: f(x))(getattr(np, _fn.replace("a", "arc", 1) if _fn[0] == "a" else _fn)),
           (lambda f: lambda n, a: f"math.{f}({a[0]})")(_fn), 8)
_unary("Softsign", lambda n, x: x / (1 + np.abs(x)), lambda n, a: f"({a[0]} / ({f32(1)} + abs({a[0]})))", 3)
_unary("Mish", lambda n, x: x * np.tanh(np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)),
       lambda n, a: f"({a[0]} * math.tanh(math.log1p(math.exp(-abs({a[0]}))) + max({a[0]}, {f32(0)})))", 12)
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
    if _cast_dtype(n) not in _RUNNABLE:  # float8, int4, strings...: onnx.reference
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


# -- activations with attributes ---------------------------------------------------------
def _attr(n, name, default):
    return f32(n.attrs.get(name, default))


_unary("Elu", lambda n, x: np.where(x >= 0, x, np.float32(n.attrs.get("alpha", 1.0)) * np.expm1(x)),
       lambda n, a: f"({a[0]} if {a[0]} >= {f32(0)} else {_attr(n, 'alpha', 1.0)} * (math.exp({a[0]}) - {f32(1)}))", 8)
_SELU = (1.67326319217681884765625, 1.05070102214813232421875)
_unary("Selu", lambda n, x: np.float32(n.attrs.get("gamma", _SELU[1])) * np.where(
           x > 0, x, np.float32(n.attrs.get("alpha", _SELU[0])) * np.expm1(x)),
       lambda n, a: f"({_attr(n, 'gamma', _SELU[1])} * ({a[0]} if {a[0]} > {f32(0)} else "
                    f"{_attr(n, 'alpha', _SELU[0])} * (math.exp({a[0]}) - {f32(1)})))", 8)
_unary("Celu", lambda n, x: np.maximum(x, 0) + np.minimum(0, np.float32(n.attrs.get("alpha", 1.0)) * np.expm1(
           x / np.float32(n.attrs.get("alpha", 1.0)))),
       lambda n, a: f"(max({a[0]}, {f32(0)}) + min({f32(0)}, {_attr(n, 'alpha', 1.0)} * "
                    f"(math.exp({a[0]} / {_attr(n, 'alpha', 1.0)}) - {f32(1)})))", 8)
_unary("ThresholdedRelu", lambda n, x: np.where(x > np.float32(n.attrs.get("alpha", 1.0)), x, 0),
       lambda n, a: f"({a[0]} if {a[0]} > {_attr(n, 'alpha', 1.0)} else {f32(0)})")


def _shrink(n, x):
    lambd, bias = n.attrs.get("lambd", 0.5), n.attrs.get("bias", 0.0)
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)).astype(x.dtype)


_unary("Shrink", _shrink, lambda n, a: f"({a[0]} + {_attr(n, 'bias', 0.0)} if {a[0]} < -{_attr(n, 'lambd', 0.5)} else "
                                        f"({a[0]} - {_attr(n, 'bias', 0.0)} if {a[0]} > {_attr(n, 'lambd', 0.5)} else {f32(0)}))")
_binary("PRelu", lambda x, s: np.where(x >= 0, x, x * s), "({0} if {0} >= 0 else {0} * {1})", 2)


def _mean_ref(node, xs):
    return [(reduce(np.add, xs) / np.asarray(len(xs), xs[0].dtype)).astype(xs[0].dtype)]


register("Mean", BROADCAST, _broadcast_infer(), _mean_ref,
         lambda n, a: f"(({' + '.join(a)}) / {f32(len(a))})", 1)


# -- tests of floats: bool results ----------------------------------------------------------
def _isinf_ref(n, xs):
    x = xs[0]
    pos, neg = n.attrs.get("detect_positive", 1), n.attrs.get("detect_negative", 1)
    return [(np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg))]


def _isinf_expr(n, a):
    pos, neg = n.attrs.get("detect_positive", 1), n.attrs.get("detect_negative", 1)
    if pos and neg:
        return f"(abs({a[0]}) == np.inf)"
    return f"({a[0]} == np.inf)" if pos else (f"({a[0]} == -np.inf)" if neg else "False")


register("IsNaN", ELEMWISE, lambda n, t, c: [TensorType(t[0].shape, "bool")], lambda n, xs: [np.isnan(xs[0])],
         lambda n, a: f"({a[0]} != {a[0]})")   # NaN is the only value unequal to itself
register("IsInf", ELEMWISE, lambda n, t, c: [TensorType(t[0].shape, "bool")], _isinf_ref, _isinf_expr)
NAN_AWARE = {"IsNaN", "IsInf"}   # generated code must not assume finite values (fastmath nnan/ninf off)


# -- integer-flavoured ops ----------------------------------------------------------------
def _mod_ref(n, xs):
    a, b = xs
    y = np.fmod(a, b) if n.attrs.get("fmod", 0) else np.mod(a, b)
    return [np.asarray(y).astype(a.dtype, copy=False)]


register("Mod", BROADCAST, _broadcast_infer(), _mod_ref, lambda n, a: f"({a[0]} % {a[1]})", 2)
register_value("Mod", _value_ref(lambda n, xs: [xs[0] % xs[1]]) )


def _sign_ref(n, xs):
    return [np.sign(xs[0]).astype(xs[0].dtype)]


register("Sign", ELEMWISE, same_as_input(0), _sign_ref,
         lambda n, a: f"({f32(1)} if {a[0]} > {f32(0)} else ({f32(-1)} if {a[0]} < {f32(0)} else {f32(0)}))")


def _bitshift_ref(n, xs):
    fn = np.left_shift if n.attrs.get("direction", "LEFT") == "LEFT" else np.right_shift
    return [fn(xs[0], xs[1]).astype(xs[0].dtype)]


register("BitShift", BROADCAST, _broadcast_infer(), _bitshift_ref,
         lambda n, a: f"({a[0]} {'<<' if n.attrs.get('direction', 'LEFT') == 'LEFT' else '>>'} {a[1]})")


# -- typed code: the expression of an op over element types other than float32 ---------------
NUMBA_TYPES = {"float32": "float32", "float64": "float64", "int64": "int64", "int32": "int32", "int16": "int16",
               "int8": "int8", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
               "bool": "boolean"}


def literal(value, dtype: str) -> str:
    """A constant of `dtype` for generated code."""
    if dtype == "bool":
        return "True" if value else "False"
    if dtype == "float32":
        return f32(value)
    return f"np.{dtype}({float(value) if dtype.startswith('float') else int(value)!r})"


def _is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def _div_typed(n, a, ins, out):
    if not _is_int(out):
        return None
    # ONNX integer Div truncates toward zero; Python's // floors: correct where the signs differ
    q = f"({a[0]} // {a[1]})"
    return f"np.{out}({q} + (1 if ({q} < 0 and {q} * {a[1]} != {a[0]}) else 0))"


def _mod_typed(n, a, ins, out):
    if not n.attrs.get("fmod", 0):
        return None   # Python's % has the divisor's sign, as ONNX fmod=0
    if _is_int(out):  # C fmod: the dividend's sign, |a| mod |b|
        return f"np.{out}((abs({a[0]}) % abs({a[1]})) * (1 if {a[0]} >= 0 else -1))"
    return f"np.{out}(math.fmod({a[0]}, {a[1]}))"


def _sign_typed(n, a, ins, out):
    one, zero = literal(1, out), literal(0, out)
    return f"({one} if {a[0]} > {zero} else (-{one} if {a[0]} < {zero} else {zero}))"


def _cast_typed(n, a, ins, out):
    if out == "bool":
        return f"({a[0]} != 0)"
    return a[0] if ins[0] == out else f"np.{NUMBA_TYPES[out]}({a[0]})"


DTYPE_EXPRS = {"Div": _div_typed, "Mod": _mod_typed, "Sign": _sign_typed, "Cast": _cast_typed,
               "CastLike": _cast_typed}   # CastLike: Cast to its second input's type (the output type)


def typed_expr(node, args: list, in_dtypes: list, out_dtype: str) -> str:
    """Scalar code of `node` over typed arguments; float32 code is the op's own expression."""
    fn = DTYPE_EXPRS.get(node.op)
    e = fn(node, args, in_dtypes, out_dtype) if fn else None
    if e is not None:
        return e
    e = OPS[node.op].expr(node, args)
    if out_dtype == "bool" or (out_dtype == "float32" and all(d == "float32" for d in in_dtypes)):
        return e
    return f"np.{NUMBA_TYPES[out_dtype]}({e})"


_ = math  # generated code imports math; kept here for the expression vocabulary

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
_unary("Sqrt", lambda n, x: np.sqrt(x), lambda n, a: f"math.sqrt({a[0]})", 4)
_unary("Reciprocal", lambda n, x: 1 / x, lambda n, a: f"({f32(1)} / {a[0]})", 4)

# -- vectorizable float32 math -----------------------------------------------------------------
# `math.exp`/`tanh`/`log` are libm calls per element: LLVM cannot vectorize a loop around them
# (measured: softmax rows at 2-4 % of copy bandwidth). These are polynomials in mul/add/div/
# min/max, float32 <-> int32 conversions and int32 shifts viewed as float32 (2^n built in the
# exponent bits): all of it vectorizes. Each is written once as `build(bind, x)`, where
# `bind(expr)` names an intermediate value: `_inline` substitutes it (one expression, for any
# caller), `op_assigns` binds it to a temporary (shorter code and faster compiles where a
# template emits statements). An argument `x` may be repeated: pass names or plain loads.
LOG2E, LN2_HI, LN2_LO = 1.4426950408889634, 0.693359375, -2.12194440e-4   # ln 2 = LN2_HI + LN2_LO
# e^r = 1 + r p(r) on |r| <= ln(2)/2 and 2^f = 1 + f q(f) on |f| <= 1/2: degree-5 minimax fits for the
# relative error (9.1e-8 before float32 rounding; Cephes' degree-7 expf: 2 FMAs more per element)
_EXP_P = (8.290315046906471e-3, 4.189793020486832e-2, 1.666763573884964e-1, 4.999915063381195e-1,
          9.999997019767761e-1)
_EXP2_P = (1.326472731307149e-3, 9.671512991189957e-3, 5.550733581185341e-2, 2.4022242426872253e-1,
           6.931470036506653e-1)
_LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
          -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)   # Cephes logf
# tanh as a clamped odd/even rational polynomial (Eigen's float tanh): +-1 beyond +-7.9053
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
           1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)
# erf likewise (the coefficients Eigen and XLA use; max abs error 4.2e-7 here), where a
# `math.erf` call per element ran ~3x slower than the whole fused dense kernel.
_ERF_P = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04, -5.69250639462346e-05,
          -2.10102402082508e-06, 2.77068142495902e-08, -2.72614225801306e-10)
_ERF_Q = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03, -2.13374055278905e-04,
          -1.45660718464996e-05)
_I, _INF = "np.int32", "np.float32(np.inf)"
# Adding 1.5 * 2^23 (+ 127, the exponent bias) rounds a float to an integer held in the low
# mantissa bits: shifted left by 23 they are the exponent field of 2^n (the constant's own bits
# there shift out)
_ROUND, _ROUND_BITS = 12582912.0 + 127, 0x4B400000 + 127


def _inline(expr: str) -> str:
    return f"({expr})"


def _horner(coefs, z: str) -> str:
    """coefs[0] * z^(n-1) + ... + coefs[-1] (highest power first)."""
    e = f32(coefs[0])
    for k in coefs[1:]:
        e = f"({e} * {z} + {f32(k)})"
    return e


def _pow2(bind, k: str) -> str:
    """2^k for an int32 k in [-150, 128] as a product of two powers built in the exponent bits
    (each half a normal number: e^x reaches the subnormals and overflows to inf as it should)."""
    h = bind(f"{k} >> {_I}(1)")
    return (f"{_I}(({h} + {_I}(127)) << {_I}(23)).view(np.float32) * "
            f"{_I}(({k} - {h} + {_I}(127)) << {_I}(23)).view(np.float32)")


def _scale_by_pow2(bind, p: str, t: str, normal: bool) -> str:
    """p * 2^n for n rounded into t (t = x + _ROUND, see above). `normal`: n in [-126, 127], one
    shift; else n in [-150, 128] as a product of two powers (subnormal results, overflow to inf)."""
    if normal:
        return f"{p} * {_I}(np.float32({t}).view(np.int32) << {_I}(23)).view(np.float32)"
    return f"{p} * {_pow2(bind, bind(f'np.float32({t}).view(np.int32) - {_I}({_ROUND_BITS})'))}"


def exp_build(bind, x: str, lo: float = -104.0, hi: float | None = 89.0) -> str:
    """e^x = 2^n e^r, n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts); x is clamped to
    [lo, hi] (e^-104 is 0 in float32, e^89 inf). hi=None: the caller knows x <= 0 (softmax).
    n is rounded by adding `_ROUND` (no round/convert instructions); this needs fastmath
    without `reassoc`, which would fold (t + M) - M to t. Within [-87.3, 88.3] 2^n is one
    normal number (fewer instructions per element)."""
    c = f"max({x}, {f32(lo)})"
    c = bind(f"np.float32({c if hi is None else f'min({c}, {f32(hi)})'})")   # float32 math, whatever x is
    t = bind(f"{c} * {f32(LOG2E)} + {f32(_ROUND)}")
    n = bind(f"{t} - {f32(_ROUND)}")
    r = bind(f"{c} - {n} * {f32(LN2_HI)} - {n} * {f32(LN2_LO)}")
    p = f"({_horner(_EXP_P, r)} * {r} + {f32(1)})"
    return _scale_by_pow2(bind, p, t, lo >= -87.3 and (hi is None or hi <= 88.3))


def exp2_build(bind, x: str, lo: float = -126.0, reassoc: bool = False) -> str:
    """2^x for x <= 0 (clamped to lo >= -126: 2^-126 is the least normal float32): n = round(x),
    2^x = 2^n 2^(x - n). Softmax computes e^(v - m) as 2^(v log2(e) - m log2(e)), one FMA
    for the argument, where e^x needs a subtraction, a multiply and two FMAs to reduce it.
    `reassoc`: for a function compiled with fastmath `reassoc`, which folds the rounding
    constant's (t + M) - M to t: n is read back from t's bits as an integer (M's bits
    subtracted, converted), which reassoc cannot fold; one vector op less than np.rint and a
    conversion (a round is two on Intel), 2-4 % of Softmax 128x1024 on AVX-512."""
    c = bind(f"np.float32(max({x}, {f32(max(lo, -126.0))}))")
    if reassoc:
        t = bind(f"np.float32({c} + {f32(_ROUND)}).view(np.int32)")
        f = bind(f"{c} - np.float32({_I}({t} - {_I}({_ROUND_BITS})))")
        return f"({_horner(_EXP2_P, f)} * {f} + {f32(1)}) * {_I}({t} << {_I}(23)).view(np.float32)"
    t = bind(f"{c} + {f32(_ROUND)}")
    f = bind(f"{c} - ({t} - {f32(_ROUND)})")
    return _scale_by_pow2(bind, f"({_horner(_EXP2_P, f)} * {f} + {f32(1)})", t, True)


def tanh_build(bind, x: str) -> str:
    c = bind(f"min(max({x}, {f32(-7.90531110763549805)}), {f32(7.90531110763549805)})")
    z = bind(f"{c} * {c}")
    return f"{c} * ({_horner(_TANH_P, z)} / {_horner(_TANH_Q, z)})"   # c * p first: subnormal for tiny c


def sigmoid_build(bind, x: str) -> str:
    """1 / (1 + e^-x): relatively accurate on both tails (no 1 - tiny cancellation). e^-x stays
    finite (x >= -88): LLVM may divide by a reciprocal estimate refined by Newton's step, which
    turns 1 / inf into nan."""
    return f"{f32(1)} / ({f32(1)} + {exp_build(bind, f'-{x}', lo=-87.3, hi=88.0)})"


def log_build(bind, x: str) -> str:
    """ln x = e ln 2 + ln m for x = m 2^e, m in [sqrt(1/2), sqrt(2)) read from the bits;
    subnormals are scaled by 2^23 first; ln 0 = -inf, ln(x < 0) = nan, ln inf = inf. The cases
    are told apart on the bits: under fastmath `ninf`, LLVM folds float compares with inf."""
    bx = bind(f"np.float32({x}).view(np.int32)")
    tiny = bind(f"{bx} < {_I}(0x00800000)")
    xs = bind(f"{x} * {f32(2.0 ** 23)} if {tiny} else {x}")
    bits = bind(f"np.float32({xs}).view(np.int32)")
    m0 = bind(f"{_I}(({bits} & {_I}(0x007FFFFF)) | {_I}(0x3F800000)).view(np.float32)")
    big = bind(f"{m0} > {f32(math.sqrt(2))}")
    e = bind(f"np.float32(({bits} >> {_I}(23)) - {_I}(127)) + ({f32(1)} if {big} else {f32(0)})"
             f" - ({f32(23)} if {tiny} else {f32(0)})")
    f = bind(f"({m0} * {f32(0.5)} if {big} else {m0}) - {f32(1)}")
    z = bind(f"{f} * {f}")
    y = bind(f"{f} + ({f} * {z} * {_horner(_LOG_P, f)} + {e} * {f32(LN2_LO)} - {f32(0.5)} * {z})"
             f" + {e} * {f32(LN2_HI)}")
    y = bind(f"{y} if ({bx} > {_I}(0)) & ({bx} < {_I}(0x7F800000)) else np.float32(np.nan)")
    y = bind(f"{_INF} if {bx} == {_I}(0x7F800000) else {y}")
    return f"-{_INF} if ({bx} & {_I}(0x7FFFFFFF)) == {_I}(0) else {y}"


def erf_build(bind, x: str) -> str:
    c = bind(f"min(max({x}, {f32(-4)}), {f32(4)})")
    x2 = bind(f"{c} * {c}")
    return f"{c} * ({_horner(_ERF_P[::-1], x2)} / {_horner(_ERF_Q[::-1], x2)})"


def exp_expr(x: str) -> str:
    return _inline(exp_build(_inline, x))


def tanh_expr(x: str) -> str:
    return _inline(tanh_build(_inline, x))


def sigmoid_expr(x: str) -> str:
    return _inline(sigmoid_build(_inline, x))


def erf_expr(x: str) -> str:
    return _inline(erf_build(_inline, x))


def _gelu_build(n, bind, a):
    x = a[0]
    if n.attrs.get("approximate", "none") == "tanh":
        # 0.5 x (1 + tanh(u)) = x sigmoid(2u): one exp polynomial where tanh's rational form took two
        # longer polynomials and a division (1.24x faster over 64 Ki floats, AMD EPYC Zen 3, 2026-12-07)
        inner = bind(f"{f32(2 * math.sqrt(2 / math.pi))} * ({x} + {f32(0.044715)} * {x} * {x} * {x})")
        return f"{x} * {bind(sigmoid_build(bind, inner))}"
    t = bind(f"{x} * {f32(1 / math.sqrt(2))}")
    return f"{f32(0.5)} * {x} * ({f32(1)} + {bind(erf_build(bind, t))})"


# op -> build(node, bind, args): the float32 code of these ops names intermediate values
VECTOR_MATH = {
    "Exp": lambda n, bind, a: exp_build(bind, a[0]),
    "Tanh": lambda n, bind, a: tanh_build(bind, a[0]),
    "Sigmoid": lambda n, bind, a: sigmoid_build(bind, a[0]),
    "Log": lambda n, bind, a: log_build(bind, a[0]),
    "Erf": lambda n, bind, a: erf_build(bind, a[0]),
    "Gelu": _gelu_build,
}


# the same ops through libm, for float64 (the polynomials are float32-accurate)
LIBM = {"Exp": "math.exp({})", "Log": "math.log({})", "Tanh": "math.tanh({})", "Erf": "math.erf({})",
        "Sigmoid": "(1.0 / (1.0 + math.exp(-{})))"}


def _vector_expr(op):
    return lambda n, a: _inline(VECTOR_MATH[op](n, _inline, a))


_unary("Exp", lambda n, x: np.exp(x), _vector_expr("Exp"), 8)
# Log's inline form would repeat its intermediates into ~10 kB of code (numba compiled it in
# 20-36 s): one expression calls libm; templates that bind statements get the polynomial
_unary("Log", lambda n, x: np.log(x), lambda n, a: f"math.log({a[0]})", 8)
_unary("Tanh", lambda n, x: np.tanh(x), _vector_expr("Tanh"), 8)
_unary("Erf", lambda n, x: _erf(x), _vector_expr("Erf"), 8)
_unary("Sigmoid", lambda n, x: 1 / (1 + np.exp(-x)), _vector_expr("Sigmoid"), 8)
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


_unary("Gelu", _gelu, _vector_expr("Gelu"), 10)


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
    if node.op in LIBM and not (out_dtype == "float32" and all(d == "float32" for d in in_dtypes)):
        return f"np.{NUMBA_TYPES[out_dtype]}({LIBM[node.op].format(*args)})"   # float64: full precision
    e = OPS[node.op].expr(node, args)
    if out_dtype == "bool" or (out_dtype == "float32" and all(d == "float32" for d in in_dtypes)):
        return e
    return f"np.{NUMBA_TYPES[out_dtype]}({e})"


def op_assigns(node, args: list, name: str, in_dtypes=None, out_dtype: str = "float32") -> list:
    """[(variable, code)] computing `node` into `name`: the ops of VECTOR_MATH over float32 bind
    their intermediate values to temporaries `{name}_0, {name}_1...`; any other op is one
    assignment of its `typed_expr`."""
    in_dtypes = in_dtypes or ["float32"] * len(args)
    if node.op not in VECTOR_MATH or out_dtype != "float32" or any(d != "float32" for d in in_dtypes):
        return [(name, typed_expr(node, args, in_dtypes, out_dtype))]
    out = []

    def bind(expr: str) -> str:
        out.append((f"{name}_{len(out)}", expr))
        return out[-1][0]
    result = VECTOR_MATH[node.op](node, bind, args)
    return out + [(name, result)]


_ = math  # generated code imports math; kept here for the expression vocabulary

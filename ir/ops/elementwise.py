"""Elementwise and broadcast ops: each carries a NumPy reference and a scalar expression."""
from __future__ import annotations

import math

import numpy as np

from ir.graph import TensorType
from ir.ops.registry import BROADCAST, ELEMWISE, broadcast_shapes, f32, register, same_as_input


def _binary(name, np_fn, expr_fmt, flops=1):
    def infer(node, types, consts):
        return [TensorType(broadcast_shapes(node, types[0].shape, types[1].shape), types[0].dtype)]

    def ref(node, xs):
        return [np_fn(xs[0], xs[1]).astype(xs[0].dtype, copy=False)]

    register(name, BROADCAST, infer, ref, lambda node, a: expr_fmt.format(*a), flops)


def _unary(name, np_fn, expr_fn, flops=1):
    def ref(node, xs):
        return [np.asarray(np_fn(node, xs[0])).astype(xs[0].dtype, copy=False)]

    register(name, ELEMWISE, same_as_input(0), ref, expr_fn, flops)


_binary("Add", np.add, "({} + {})")
_binary("Sub", np.subtract, "({} - {})")
_binary("Mul", np.multiply, "({} * {})")
_binary("Div", np.divide, "({} / {})")
_binary("Max", np.maximum, "max({}, {})")
_binary("Min", np.minimum, "min({}, {})")

_unary("Relu", lambda n, x: np.maximum(x, 0), lambda n, a: f"max({a[0]}, {f32(0)})")
_unary("Neg", lambda n, x: -x, lambda n, a: f"(-{a[0]})")
_unary("Abs", lambda n, x: np.abs(x), lambda n, a: f"abs({a[0]})")
_unary("Exp", lambda n, x: np.exp(x), lambda n, a: f"math.exp({a[0]})", 8)
_unary("Tanh", lambda n, x: np.tanh(x), lambda n, a: f"math.tanh({a[0]})", 8)
_unary("Sigmoid", lambda n, x: 1 / (1 + np.exp(-x)),
       lambda n, a: f"({f32(1)} / ({f32(1)} + math.exp(-{a[0]})))", 8)
_unary("Identity", lambda n, x: x.copy(), lambda n, a: a[0], 0)


def _leaky(n, x):
    alpha = n.attrs.get("alpha", 0.01)
    return np.where(x >= 0, x, x * np.float32(alpha))


_unary("LeakyRelu", _leaky, lambda n, a: f"({a[0]} if {a[0]} >= {f32(0)} else {a[0]} * {f32(n.attrs.get('alpha', 0.01))})")

_ = math  # generated code imports math; kept here for the expression vocabulary

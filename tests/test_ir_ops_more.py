"""Ops whose ONNX backend node tests cannot check them by value: the random generators."""
from __future__ import annotations

import numpy as np

from ir.graph import Node
from ir.ops import OPS


def test_seeded_random_like_repeats_and_stays_in_range():
    n = Node("RandomUniformLike", ("x",), ("y",), {"seed": 3.0, "low": -2.0, "high": 5.0})
    x = np.zeros((40, 5), np.float64)
    a, b = OPS[n.op].ref(n, [x])[0], OPS[n.op].ref(n, [x])[0]
    assert a.dtype == np.float64 and a.shape == (40, 5) and (a == b).all()
    assert a.min() >= -2 and a.max() < 5 and a.std() > 1
    other = OPS[n.op].ref(Node(n.op, n.inputs, n.outputs, {**n.attrs, "seed": 4.0}), [x])[0]
    assert not (other == a).all()


def test_random_normal_shape_dtype_and_moments():
    n = Node("RandomNormal", (), ("y",), {"shape": [2000], "mean": 3.0, "scale": 0.5, "dtype": 11, "seed": 1.0})
    y = OPS[n.op].ref(n, [])[0]
    assert y.dtype == np.float64 and y.shape == (2000,)
    assert abs(y.mean() - 3.0) < 0.05 and abs(y.std() - 0.5) < 0.05


def test_bernoulli_draws_ones_at_the_given_rate():
    n = Node("Bernoulli", ("p",), ("y",), {"seed": 0.0})
    p = np.array([0.0, 1.0] * 500 + [0.3] * 4000, np.float32)
    y = OPS[n.op].ref(n, [p])[0]
    assert y.dtype == np.float32 and (y[:1000:2] == 0).all() and (y[1:1000:2] == 1).all()
    assert abs(y[1000:].mean() - 0.3) < 0.03

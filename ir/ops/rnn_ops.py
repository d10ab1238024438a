"""RNN, GRU and LSTM: one time step at a time in NumPy, per direction.

Layout 0 is [seq, batch, feature], layout 1 [batch, seq, feature]. `sequence_lens`
stops each batch row early: its outputs past the end are zero and its state stays.
"""
from __future__ import annotations

import numpy as np

from ir.errors import ShapeError
from ir.graph import TensorType
from ir.ops.registry import OPAQUE, register

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _activation(name: str, alpha, beta):
    name = name.lower()
    fns = {"relu": lambda x: np.maximum(x, 0), "tanh": np.tanh, "sigmoid": _sigmoid,
           "affine": lambda x: alpha * x + beta, "leakyrelu": lambda x: np.where(x >= 0, x, alpha * x),
           "thresholdedrelu": lambda x: np.where(x > alpha, x, 0), "scaledtanh": lambda x: alpha * np.tanh(beta * x),
           "hardsigmoid": lambda x: np.clip(alpha * x + beta, 0, 1), "elu": lambda x: np.where(x >= 0, x, alpha * np.expm1(x)),
           "softsign": lambda x: x / (1 + np.abs(x)), "softplus": lambda x: np.log1p(np.exp(x))}
    if name not in fns:
        raise ShapeError(f"unknown recurrent activation '{name}'")
    return fns[name]


_ALPHA = {"leakyrelu": 0.01, "thresholdedrelu": 1.0, "hardsigmoid": 0.2, "elu": 1.0, "affine": 1.0, "scaledtanh": 1.0}
_BETA = {"hardsigmoid": 0.5, "affine": 0.0, "scaledtanh": 1.0}


def _activations(node, dirs):
    names = list(node.attrs.get("activations") or _DEFAULT_ACTS[node.op] * dirs)
    alphas, betas = list(node.attrs.get("activation_alpha") or []), list(node.attrs.get("activation_beta") or [])
    out, ia, ib = [], 0, 0
    for n in names:
        key = n.lower()
        a = b = None
        if key in _ALPHA:
            a = alphas[ia] if ia < len(alphas) else _ALPHA[key]
            ia += 1
        if key in _BETA:
            b = betas[ib] if ib < len(betas) else _BETA[key]
            ib += 1
        out.append(_activation(n, a, b))
    per = len(_DEFAULT_ACTS[node.op])
    return [out[d * per:(d + 1) * per] for d in range(dirs)]


def _dirs(node) -> int:
    return 2 if node.attrs.get("direction", "forward") == "bidirectional" else 1


def _rnn_infer(node, types, consts):
    x = types[0].shape
    h = int(node.attrs["hidden_size"])
    d = _dirs(node)
    layout = int(node.attrs.get("layout", 0))
    seq, batch = (x[0], x[1]) if layout == 0 else (x[1], x[0])
    y = (seq, d, batch, h) if layout == 0 else (batch, seq, d, h)
    state = (d, batch, h) if layout == 0 else (batch, d, h)
    dt = types[0].dtype
    return [TensorType(y, dt), TensorType(state, dt)] + ([TensorType(state, dt)] if node.op == "LSTM" else [])


def _step(node, acts, x, h, c, w, r, wb, rb, p):
    """One time step for all batch rows: new (h, c)."""
    clip = node.attrs.get("clip")

    def pre(v):
        return np.clip(v, -clip, clip) if clip is not None else v
    hs = w.shape[0] // _GATES[node.op]
    xw, hr = x @ w.T + wb, h @ r.T
    if node.op == "RNN":
        return acts[0](pre(xw + hr + rb)), c
    if node.op == "GRU":
        z = acts[0](pre(xw[:, :hs] + hr[:, :hs] + rb[:hs]))
        rt = acts[0](pre(xw[:, hs:2 * hs] + hr[:, hs:2 * hs] + rb[hs:2 * hs]))
        if node.attrs.get("linear_before_reset", 0):
            hh = acts[1](pre(xw[:, 2 * hs:] + rt * (hr[:, 2 * hs:] + rb[2 * hs:])))
        else:
            hh = acts[1](pre(xw[:, 2 * hs:] + (rt * h) @ r[2 * hs:].T + rb[2 * hs:]))
        return (1 - z) * hh + z * h, c
    g = xw + hr + rb
    i = acts[0](pre(g[:, :hs] + p[:hs] * c))
    f = acts[0](pre(g[:, 2 * hs:3 * hs] + p[2 * hs:] * c))
    if node.attrs.get("input_forget", 0):
        f = 1 - i
    cc = acts[1](pre(g[:, 3 * hs:]))
    c = f * c + i * cc
    o = acts[0](pre(g[:, hs:2 * hs] + p[hs:2 * hs] * c))
    return o * acts[2](c), c


def _rnn(node, xs):
    def opt(i):
        return xs[i] if len(xs) > i and xs[i] is not None else None
    layout = int(node.attrs.get("layout", 0))
    x = opt(0) if layout == 0 else opt(0).transpose(1, 0, 2)
    w, r = opt(1), opt(2)
    seq, batch = x.shape[:2]
    d, hs, g = w.shape[0], int(node.attrs["hidden_size"]), _GATES[node.op]
    b = opt(3) if opt(3) is not None else np.zeros((d, 2 * g * hs), x.dtype)
    lens = opt(4).astype(np.int64) if opt(4) is not None else np.full(batch, seq, np.int64)
    h0 = opt(5) if opt(5) is not None else np.zeros((d, batch, hs), x.dtype)
    c0 = opt(6) if node.op == "LSTM" and opt(6) is not None else np.zeros((d, batch, hs), x.dtype)
    p = opt(7) if node.op == "LSTM" and opt(7) is not None else np.zeros((d, 3 * hs), x.dtype)
    if layout == 1:
        h0, c0 = h0.transpose(1, 0, 2) if opt(5) is not None else h0, \
            c0.transpose(1, 0, 2) if node.op == "LSTM" and opt(6) is not None else c0
    acts = _activations(node, d)
    y = np.zeros((seq, d, batch, hs), x.dtype)
    yh, yc = np.zeros((d, batch, hs), x.dtype), np.zeros((d, batch, hs), x.dtype)
    reverse = node.attrs.get("direction", "forward") == "reverse"
    for k in range(d):
        h, c = h0[k].copy(), c0[k].copy()
        backward = reverse or k == 1
        for t in range(seq):
            live = t < lens
            rows = np.where(live, (lens - 1 - t) if backward else t, 0)
            xt = x[rows, np.arange(batch)]
            nh, nc = _step(node, acts[k], xt, h, c, w[k], r[k], b[k, :g * hs], b[k, g * hs:], p[k])
            h, c = np.where(live[:, None], nh, h), np.where(live[:, None], nc, c)
            y[rows[live], k, np.arange(batch)[live]] = h[live]
        yh[k], yc[k] = h, c
    if layout == 1:
        y, yh, yc = y.transpose(2, 0, 1, 3), yh.transpose(1, 0, 2), yc.transpose(1, 0, 2)
    return [y, yh] + ([yc] if node.op == "LSTM" else [])


for _op in _GATES:
    register(_op, OPAQUE, _rnn_infer, _rnn)

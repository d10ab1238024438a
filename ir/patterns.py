"""Pattern rewrites that turn op-by-op exports back into single ops.

PyTorch exports GELU as `x * 0.5 * (1 + erf(x / sqrt(2)))`: five nodes that read
`x` twice, so the partitioner could not fuse them into the preceding MatMul's
epilogue. Rewritten to one elementwise `Gelu` node, they fuse. The same for SiLU, exported as
`x * Sigmoid(x)` (YOLO's and EfficientNet's activation): one `Swish` node.
"""
from __future__ import annotations

import math

import numpy as np

from ir.graph import Graph, Node


def _scalar(g: Graph, name: str) -> float | None:
    c = g.constants.get(name)
    if c is None or np.size(c) != 1:
        return None
    return float(np.asarray(c).reshape(()))


def _other(n: Node, x: str) -> str | None:
    if len(n.inputs) != 2 or x not in n.inputs:
        return None
    return n.inputs[1] if n.inputs[0] == x else n.inputs[0]


def _close(v, want) -> bool:
    return v is not None and abs(v - want) < 1e-4 * abs(want)


def fuse_gelu(g: Graph) -> Graph:
    """Div(x, √2)|Mul(x, 1/√2) → Erf → Add 1 → (Mul x, Mul 0.5 in either order) ⇒ Gelu(x)."""
    prod, cons = g.producers(), g.consumers()
    only = lambda v: cons.get(v, []) if len(cons.get(v, [])) == 1 else []  # noqa: E731
    replace: dict[str, Node] = {}   # name of the node that becomes Gelu -> the Gelu node
    dead: set[str] = set()
    for erf in g.nodes:
        if erf.op != "Erf":
            continue
        scaled = prod.get(erf.inputs[0])
        if scaled is None or scaled.op not in ("Div", "Mul") or len(only(scaled.outputs[0])) != 1:
            continue
        x = scaled.inputs[0]
        c = _scalar(g, scaled.inputs[1])
        if not (_close(c, math.sqrt(2)) if scaled.op == "Div" else _close(c, 1 / math.sqrt(2))):
            continue
        [add] = only(erf.outputs[0]) or [None]
        if add is None or add.op != "Add" or not _close(_scalar(g, _other(add, erf.outputs[0]) or ""), 1.0):
            continue
        [m1] = only(add.outputs[0]) or [None]
        if m1 is None or m1.op != "Mul":
            continue
        [m2] = only(m1.outputs[0]) or [None]
        if m2 is None or m2.op != "Mul":
            continue
        a, b = _other(m1, add.outputs[0]), _other(m2, m1.outputs[0])
        if not ((a == x and _close(_scalar(g, b or ""), 0.5)) or (b == x and _close(_scalar(g, a or ""), 0.5))):
            continue
        replace[m2.name] = Node("Gelu", (x,), m2.outputs, {}, m2.name)
        dead |= {scaled.name, erf.name, add.name, m1.name}
    if not replace:
        return g
    g = g.copy()
    g.nodes = [replace.get(n.name, n) for n in g.nodes if n.name not in dead]
    return g


def fuse_swish(g: Graph) -> Graph:
    """Mul(x, Sigmoid(x)) (either order), the Sigmoid read by that Mul only ⇒ Swish(x) (alpha 1)."""
    prod, cons = g.producers(), g.consumers()
    replace: dict[str, Node] = {}
    dead: set[str] = set()
    for mul in g.nodes:
        if mul.op != "Mul" or len(mul.inputs) != 2:
            continue
        for s, x in (mul.inputs, mul.inputs[::-1]):
            sig = prod.get(s)
            if sig is not None and sig.op == "Sigmoid" and sig.inputs[0] == x and len(cons.get(s, [])) == 1 \
                    and s not in g.outputs and sig.name not in dead:
                replace[mul.name] = Node("Swish", (x,), mul.outputs, {"alpha": 1.0}, mul.name)
                dead.add(sig.name)
                break
    if not replace:
        return g
    g = g.copy()
    g.nodes = [replace.get(n.name, n) for n in g.nodes if n.name not in dead]
    return g

"""Pattern rewrites that turn op-by-op exports back into single ops.

PyTorch exports GELU as `x * 0.5 * (1 + erf(x / sqrt(2)))`: five nodes that read
`x` twice, so the partitioner could not fuse them into the preceding MatMul's
epilogue. Rewritten to one elementwise `Gelu` node, they fuse. The same for GELU's tanh form
(GPT-2's `gelu_new`, eight nodes with a Pow) and for SiLU, exported as `x * Sigmoid(x)` (YOLO's and
EfficientNet's activation): one `Swish` node.
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


def _rewritten(g: Graph, replace: dict[str, Node], dead: set[str]) -> Graph:
    """`g` with the nodes named in `replace` swapped for their rewrites and the `dead` ones dropped."""
    if not replace:
        return g
    g = g.copy()
    g.nodes = [replace.get(n.name, n) for n in g.nodes if n.name not in dead]
    return g


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
    return _rewritten(g, replace, dead)


def _scaled(g: Graph, n: Node | None, op: str, want: float) -> str | None:
    """The other input of `n` when it is `op` (Mul/Add) of a value and a scalar constant close to `want`."""
    if n is None or n.op != op or len(n.inputs) != 2:
        return None
    for v, c in (n.inputs, n.inputs[::-1]):
        if _close(_scalar(g, c), want):
            return v
    return None


def fuse_gelu_tanh(g: Graph) -> Graph:
    """0.5 x (1 + tanh(√(2/π) (x + 0.044715 Pow(x, 3)))) ⇒ Gelu(x, approximate="tanh"), the product
    as x * 0.5 * (1 + tanh) or (x * (1 + tanh)) * 0.5, operands in either order. Every node of the
    chain but x must be read by the next one only."""
    prod, cons = g.producers(), g.consumers()
    one = lambda v: (cons.get(v) or [None])[0] if len(cons.get(v, [])) == 1 and v not in g.outputs else None  # noqa: E731
    replace: dict[str, Node] = {}
    dead: set[str] = set()
    for tanh in g.nodes:
        if tanh.op != "Tanh":
            continue
        scale = prod.get(tanh.inputs[0])
        a = _scaled(g, scale, "Mul", math.sqrt(2 / math.pi))
        add = prod.get(a) if a is not None and one(a) is scale and one(scale.outputs[0]) is tanh else None
        if add is None or add.op != "Add" or len(add.inputs) != 2:
            continue
        for x, q in (add.inputs, add.inputs[::-1]):
            cube = prod.get(_scaled(g, prod.get(q), "Mul", 0.044715) or "")
            if cube is not None and cube.op == "Pow" and cube.inputs[0] == x and _close(_scalar(g, cube.inputs[1]), 3.0) \
                    and one(q) is add and one(cube.outputs[0]) is prod.get(q):
                break
        else:
            continue
        plus = one(tanh.outputs[0])
        if plus is None or _scaled(g, plus, "Add", 1.0) != tanh.outputs[0]:
            continue
        last = one(plus.outputs[0])
        if last is None or last.op != "Mul":
            continue
        other = _other(last, plus.outputs[0])
        half = prod.get(other or "")
        chain = {scale.name, add.name, prod[q].name, cube.name, tanh.name, plus.name}
        if _scaled(g, half, "Mul", 0.5) == x and one(other) is last:          # (x * 0.5) * (1 + tanh)
            end, chain = last, chain | {half.name}
        elif other == x and _scaled(g, one(last.outputs[0]), "Mul", 0.5) == last.outputs[0]:   # (x * (1 + tanh)) * 0.5
            end, chain = one(last.outputs[0]), chain | {last.name}
        else:
            continue
        if chain & dead or end.name in replace:
            continue
        replace[end.name] = Node("Gelu", (x,), end.outputs, {"approximate": "tanh"}, end.name)
        dead |= chain
    return _rewritten(g, replace, dead)


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
    return _rewritten(g, replace, dead)

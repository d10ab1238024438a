"""Lowerings: rewrite an op into ops the templates compile.

CastLike(x, like) is Cast(x, to=dtype of like) once types are known; as a Cast it
fuses into elementwise kernels instead of running on the reference path.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from ir.graph import Graph, Node


def lower_castlike(g: Graph) -> Graph:
    if not any(n.op == "CastLike" for n in g.nodes):
        return g
    g = g.copy()
    nodes = []
    for n in g.nodes:
        t = g.types.get(n.inputs[1]) if n.op == "CastLike" else None
        if t is None or t.dtype not in _TO:
            nodes.append(n)
            continue
        attrs = {k: v for k, v in n.attrs.items() if k == "saturate"}
        nodes.append(Node("Cast", (n.inputs[0],), n.outputs, {**attrs, "to": _TO[t.dtype]}, n.name))
    g.nodes = nodes
    return g


_TO = {name: helper.np_dtype_to_tensor_dtype(np.dtype(name))
       for name in ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
                    "uint32", "uint64", "bool")}


def lower_clip_gaps(g: Graph) -> Graph:
    """Clip(x, '', max) is Min(x, max) and Clip(x, min) is Max(x, min) (torch's clamp with one
    bound exports so): kernels see the bound at its position, which an omitted input shifts."""
    def rewrite(n: Node) -> Node:
        if n.op != "Clip" or "min" in n.attrs or "max" in n.attrs:
            return n
        ins = list(n.inputs) + [""] * (3 - len(n.inputs))
        if not ins[1] and ins[2]:
            return Node("Min", (ins[0], ins[2]), n.outputs, {}, n.name)
        if ins[1] and not ins[2]:
            return Node("Max", (ins[0], ins[1]), n.outputs, {}, n.name)
        return n
    if not any(n.op == "Clip" for n in g.nodes):
        return g
    g = g.copy()
    g.nodes = [rewrite(n) for n in g.nodes]
    return g


def lower(g: Graph) -> Graph:
    """Every lowering above, in order."""
    return lower_clip_gaps(lower_castlike(g))

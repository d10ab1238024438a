"""Lowerings: rewrite an op into ops the templates compile.

CastLike(x, like) is Cast(x, to=dtype of like) once types are known; as a Cast it
fuses into elementwise kernels instead of running on the reference path. Split (one
node, several outputs: kernels write one) becomes one Slice per output. ReduceMean
over the two spatial axes of an NCHW tensor (how dynamo exports AdaptiveAvgPool2d(1))
is GlobalAveragePool, which the pool template compiles.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from ir.graph import Graph, Node


def _rewrite_nodes(g: Graph, op: str, rewrite) -> Graph:
    """`g` with every `op` node replaced by `rewrite(node)` (which may return it unchanged)."""
    if not any(n.op == op for n in g.nodes):
        return g
    g = g.copy()
    g.nodes = [rewrite(n) if n.op == op else n for n in g.nodes]
    return g


def lower_castlike(g: Graph) -> Graph:
    def rewrite(n: Node) -> Node:
        t = g.types.get(n.inputs[1])
        if t is None or t.dtype not in _TO:
            return n
        attrs = {k: v for k, v in n.attrs.items() if k == "saturate"}
        return Node("Cast", (n.inputs[0],), n.outputs, {**attrs, "to": _TO[t.dtype]}, n.name)
    return _rewrite_nodes(g, "CastLike", rewrite)


_TO = {name: helper.np_dtype_to_tensor_dtype(np.dtype(name))
       for name in ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "uint16",
                    "uint32", "uint64", "bool")}


def lower_clip_gaps(g: Graph) -> Graph:
    """Clip(x, '', max) is Min(x, max) and Clip(x, min) is Max(x, min) (torch's clamp with one
    bound exports so): kernels see the bound at its position, which an omitted input shifts."""
    def rewrite(n: Node) -> Node:
        if "min" in n.attrs or "max" in n.attrs:
            return n
        ins = list(n.inputs) + [""] * (3 - len(n.inputs))
        if not ins[1] and ins[2]:
            return Node("Min", (ins[0], ins[2]), n.outputs, {}, n.name)
        if ins[1] and not ins[2]:
            return Node("Max", (ins[0], ins[1]), n.outputs, {}, n.name)
        return n
    return _rewrite_nodes(g, "Clip", rewrite)


def _split_sizes(g: Graph, n: Node, dim) -> list[int] | None:
    """Static sizes of a Split's outputs along its axis, or None where they are not known."""
    sizes = [g.types[o].shape[int(n.attrs.get("axis", 0)) % g.types[o].rank] if o in g.types else None
             for o in n.outputs]
    if not isinstance(dim, int) or any(not isinstance(s, int) for s in sizes) or sum(sizes) != dim:
        return None
    return sizes


def lower_split(g: Graph) -> Graph:
    """Split(x) -> Slice(x, start_k, end_k, axis) per output, where the sizes are static
    (constant operands, so every Slice fuses into the elementwise kernels around it)."""
    if not any(n.op == "Split" for n in g.nodes):
        return g
    g = g.copy()
    nodes = []
    for n in g.nodes:
        x = g.types.get(n.inputs[0]) if n.op == "Split" else None
        if x is None:
            nodes.append(n)
            continue
        axis = int(n.attrs.get("axis", 0)) % x.rank
        sizes = _split_sizes(g, n, x.shape[axis])
        if sizes is None:
            nodes.append(n)
            continue
        start = 0
        for k, (out, size) in enumerate(zip(n.outputs, sizes)):
            if out:
                names = [f"{n.name}__slice{k}_{what}" for what in ("starts", "ends", "axes")]
                for name, v in zip(names, (start, start + size, axis)):
                    g.constants[name] = np.asarray([v], np.int64)
                nodes.append(Node("Slice", (n.inputs[0], *names), (out,), {}, f"{n.name}__slice{k}"))
            start += size
    g.nodes = nodes
    return g


def lower_spatial_mean(g: Graph) -> Graph:
    """ReduceMean(x[N, C, H, W], axes={2, 3}, keepdims=1) -> GlobalAveragePool(x)."""
    def rewrite(n: Node) -> Node:
        if not int(n.attrs.get("keepdims", 1)):
            return n
        x = g.types.get(n.inputs[0])
        if x is None or x.rank != 4 or not x.dtype.startswith("float"):
            return n
        if len(n.inputs) > 1 and n.inputs[1]:
            axes = g.constants.get(n.inputs[1])
            axes = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
        else:
            axes = n.attrs.get("axes")
        if axes is None or sorted(int(a) % 4 for a in axes) != [2, 3]:
            return n
        return Node("GlobalAveragePool", (n.inputs[0],), n.outputs, {}, n.name)
    return _rewrite_nodes(g, "ReduceMean", rewrite)


def lower(g: Graph) -> Graph:
    """Every lowering above, in order."""
    return lower_spatial_mean(lower_split(lower_clip_gaps(lower_castlike(g))))

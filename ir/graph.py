"""The graph IR: values are referenced by name, nodes are in topological order.

A shape is a tuple whose entries are `int` or sympy expressions over the graph's
dynamic dims (see `ir.shapes`). Passes never mutate a graph; they return a new one.

Control flow: a Loop/If/Scan node keeps its bodies as `ir.Graph` attributes
(`node.attrs["body"]`, `["then_branch"]`, `["else_branch"]`). A body's `inputs` are
its formal inputs (Loop: iteration number, condition, carried values; Scan: state,
then scan slices; If: none); `outer` lists the enclosing graph's values it reads by
name. Those values are also appended to the node's inputs, after its own ONNX inputs,
in the order `node.attrs["_outer"]` names them (so passes keep their producers alive
and order the node after them): to run a body, bind `attrs["_outer"][k]` (the name
the body uses) to the node's input `len(inputs) - len(_outer) + k` (`split_outer` does it). `body.proto`
is the body's GraphProto (the onnx.reference fallback runs it as is); `body_graph`
makes a body a standalone graph (formal inputs, then outer values, as typed inputs)
that `ir.simplify`, `ir.partition` and the runtime take like any model.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ir.errors import ShapeError
from ir.shapes import DimRange, Shape, format_shape


@dataclass(frozen=True)
class TensorType:
    shape: Shape
    dtype: str = "float32"

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}{format_shape(self.shape)}"


@dataclass(frozen=True)
class Node:
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    name: str = ""

    def __post_init__(self):
        if not self.name:
            object.__setattr__(self, "name", f"{self.op}:{self.outputs[0] if self.outputs else '?'}")


@dataclass
class Graph:
    """inputs/outputs are value names; `types` holds the type of every value known so far."""

    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    types: dict[str, TensorType] = field(default_factory=dict)
    dims: dict[str, DimRange] = field(default_factory=dict)
    name: str = "graph"
    hints: dict[str, TensorType] = field(default_factory=dict)  # ONNX's own annotations
    # symbolic values of small int tensors computed from shapes (Shape -> Gather -> Concat)
    values: dict[str, Any] = field(default_factory=dict)
    # (dim_a, dim_b, node name): dims two inputs must share, checked when sizes are bound
    constraints: list = field(default_factory=list)
    opset: int = 17  # default-domain opset of the source model (for per-node fallback)
    # runtime dim name -> the node whose run tells it (no shape function / data-dependent)
    runtime_dims: dict[str, str] = field(default_factory=dict)
    outer: list[str] = field(default_factory=list)  # a control-flow body: enclosing values it reads
    proto: Any = None  # a control-flow body: the GraphProto it was imported from

    def copy(self, **changes) -> "Graph":
        g = replace(self, **changes)
        g.nodes = list(g.nodes)
        g.inputs, g.outputs = list(g.inputs), list(g.outputs)
        g.constants, g.types, g.dims, g.hints = dict(g.constants), dict(g.types), dict(g.dims), dict(g.hints)
        g.values, g.constraints = dict(g.values), list(g.constraints)
        g.runtime_dims, g.outer = dict(g.runtime_dims), list(g.outer)
        return g

    def digest(self) -> str:
        """A stable content hash (workload keys of nodes that hold bodies use it)."""
        import hashlib
        h = hashlib.sha256()
        if self.proto is not None:
            h.update(self.proto.SerializeToString(deterministic=True))
        else:
            h.update(self.summary().encode())
            for k in sorted(self.constants):
                h.update(k.encode() + np.ascontiguousarray(self.constants[k]).tobytes())
        return h.hexdigest()[:20]

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def type_of(self, name: str) -> TensorType:
        if name in self.types:
            return self.types[name]
        if name in self.constants:
            c = self.constants[name]
            return TensorType(tuple(int(d) for d in c.shape), str(c.dtype))
        raise KeyError(name)

    def summary(self) -> str:
        lines = [f"graph {self.name}: {len(self.nodes)} nodes"]
        for i in self.inputs:
            lines.append(f"  input  {i}: {self.type_of(i)}")
        for n in self.nodes:
            outs = ", ".join(f"{o}: {self.types.get(o, '?')}" for o in n.outputs)
            lines.append(f"  {n.op}({', '.join(n.inputs)}) -> {outs}")
        for o in self.outputs:
            lines.append(f"  output {o}: {self.type_of(o)}")
        return "\n".join(lines)


def split_outer(node: Node, args: list) -> tuple[list, dict]:
    """(the node's own ONNX inputs, {name the body reads: value}) of a control-flow node."""
    outer = list(node.attrs.get("_outer", ()))
    own = len(args) - len(outer)
    return list(args[:own]), dict(zip(outer, args[own:]))


def body_graph(body: Graph, types: dict) -> Graph:
    """A control-flow body as a standalone graph: its formal inputs, then the outer values
    it reads, as graph inputs; `types` (name -> TensorType, e.g. read off the arrays of a
    first iteration) types those the body leaves untyped or overrides them."""
    g = body.copy()
    g.inputs = list(body.inputs) + [o for o in body.outer if o not in body.inputs]
    for name in g.inputs:
        if name in types:
            g.types[name] = types[name]
        elif name not in g.types:
            raise ShapeError(f"body '{body.name}': input '{name}' has no type; pass it in `types`")
    g.outer, g.proto = [], None
    return g

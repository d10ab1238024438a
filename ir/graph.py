"""The graph IR: values are referenced by name, nodes are in topological order.

A shape is a tuple whose entries are `int` or sympy expressions over the graph's
dynamic dims (see `ir.shapes`). Passes never mutate a graph; they return a new one.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

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

    def copy(self, **changes) -> "Graph":
        g = replace(self, **changes)
        g.nodes = list(g.nodes)
        g.inputs, g.outputs = list(g.inputs), list(g.outputs)
        g.constants, g.types, g.dims, g.hints = dict(g.constants), dict(g.types), dict(g.dims), dict(g.hints)
        g.values, g.constraints = dict(g.values), list(g.constraints)
        return g

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

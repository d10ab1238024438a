"""The op registry: per op, its fusion pattern kind, shape function, NumPy reference
and (for elementwise ops) the scalar expression that generated kernels inline.

Pattern kinds follow TVM's: elemwise, broadcast, injective, reduce (comm-reduce),
anchor (out-elemwise-fusable: matmul, conv), opaque.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ir.errors import ShapeError, UnsupportedOpError
from ir.graph import Node, TensorType
from ir.shapes import Dim, Shape, format_shape, simplify_dim

ELEMWISE, BROADCAST, INJECTIVE, REDUCE, ANCHOR, OPAQUE = (
    "elemwise", "broadcast", "injective", "reduce", "anchor", "opaque")

# infer(node, input types, constant input values or None) -> output types
InferFn = Callable[[Node, list, list], list]
# ref(node, input arrays) -> output arrays
RefFn = Callable[[Node, list], list]
# expr(node, argument expressions) -> scalar Python/numba expression (float32)
ExprFn = Callable[[Node, list], str]


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str
    infer: InferFn
    ref: RefFn
    expr: Optional[ExprFn] = None
    flops_per_elem: int = 1


OPS: dict[str, OpDef] = {}


def register(name: str, kind: str, infer: InferFn, ref: RefFn, expr: ExprFn | None = None,
             flops_per_elem: int = 1) -> OpDef:
    OPS[name] = OpDef(name, kind, infer, ref, expr, flops_per_elem)
    return OPS[name]


def get_op(op: str, node: Node | None = None) -> OpDef:
    if op not in OPS:
        where = f" (node '{node.name}')" if node is not None else ""
        raise UnsupportedOpError(f"op '{op}'{where} is not supported by tensortune")
    return OPS[op]


def f32(x: float) -> str:
    """A float32 literal for generated code (float64 literals would widen the math)."""
    return f"np.float32({float(x)!r})"


def broadcast_shapes(node: Node, *shapes: Shape) -> Shape:
    """NumPy broadcasting over symbolic shapes; equal symbols are assumed to agree."""
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        result: Dim = 1
        for d in dims:
            if isinstance(d, int) and d == 1:
                continue
            if isinstance(result, int) and result == 1:
                result = d
            elif isinstance(d, int) and isinstance(result, int) and d != result:
                raise ShapeError(f"node '{node.name}' ({node.op}): cannot broadcast shapes "
                                 + " and ".join(format_shape(s) for s in shapes))
            elif not isinstance(result, int) and isinstance(d, int):
                result = d  # a static size pins the symbolic one
        out.append(simplify_dim(result))
    return tuple(out)


def same_as_input(i: int = 0) -> InferFn:
    return lambda node, types, consts: [types[i]]

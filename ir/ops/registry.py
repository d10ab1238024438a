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
                note_equal(node, result, d)
                result = d  # a static size pins the symbolic one
            elif not (isinstance(d, int) and isinstance(result, int)):
                note_equal(node, result, d)  # two symbols meet: assume (and record) they agree
        out.append(simplify_dim(result))
    return tuple(out)


def same_as_input(i: int = 0) -> InferFn:
    return lambda node, types, consts: [types[i]]


# -- symbolic values of small int tensors (shape arithmetic) ---------------------------
# value(node, input values (object arrays of ints / sympy exprs, or None), input types)
#   -> output values or None. Lets Shape -> Gather -> Concat -> Reshape resolve symbolically.
VALUE_FNS: dict[str, Callable] = {}


def register_value(name: str, fn: Callable) -> None:
    VALUE_FNS[name] = fn


# -- equality constraints between dims, collected while shapes are inferred ------------
_CONSTRAINTS: list = []


def note_equal(node: Node, a: Dim, b: Dim) -> None:
    """Record that dims `a` and `b` must agree (two inputs of `node` share an axis).

    Static mismatches raise at once; symbolic pairs are stored on the graph
    (`Graph.constraints`) and checked when sizes are bound.
    """
    if isinstance(a, int) and isinstance(b, int):
        if a != b:
            raise ShapeError(f"node '{node.name}' ({node.op}): dims must agree but are {a} and {b}")
        return
    if simplify_dim(a - b) == 0:
        return
    if (a, b, node.name) not in _CONSTRAINTS:
        _CONSTRAINTS.append((a, b, node.name))


def take_constraints() -> list:
    out = list(_CONSTRAINTS)
    _CONSTRAINTS.clear()
    return out


def dims_of(value) -> list:
    """An int tensor's value (numeric or object array) as a list of int / sympy dims."""
    out = []
    for v in np.asarray(value).reshape(-1).tolist():
        out.append(simplify_dim(v) if hasattr(v, "free_symbols") else int(v))
    return out

"""The op registry: per op, its fusion pattern kind, shape function, NumPy reference
and (for elementwise ops) the scalar expression that generated kernels inline.

Pattern kinds follow TVM's: elemwise, broadcast, injective, reduce (comm-reduce),
anchor (out-elemwise-fusable: matmul, conv), opaque.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional

import numpy as np

from ir.errors import ShapeError, UnsupportedOpError
from ir.graph import Node, TensorType
from ir.shapes import Dim, Shape, dim_max, dims_equal, format_shape, runtime_symbol, simplify_dim

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
    """NumPy broadcasting over symbolic shapes.

    A symbolic dim may be 1 at run time (paddle's `?` dims are fresh per input), so two
    dims that differ symbolically broadcast to their Max, exact whichever is 1, and a
    static size > 1 wins over a symbol; each such pair is recorded as a constraint
    (equal, or one of them 1), checked once sizes are bound."""
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
            elif isinstance(d, int) and isinstance(result, int):
                if d != result:
                    raise ShapeError(f"node '{node.name}' ({node.op}): cannot broadcast shapes "
                                     + " and ".join(format_shape(s) for s in shapes))
            elif dims_equal(result, d):
                result = _simpler(result, d)
            else:
                note_broadcast(node, result, d)
                result = d if isinstance(d, int) else result if isinstance(result, int) else dim_max(result, d)
        out.append(simplify_dim(result))
    return tuple(out)


@lru_cache(maxsize=65536)
def _ops_count(d) -> int:
    return d.count_ops()


def _simpler(a: Dim, b: Dim) -> Dim:
    """Of two dims assumed equal, the one downstream shapes should read (S over Min(S, 1024))."""
    if isinstance(a, int) or isinstance(b, int):
        return a if isinstance(a, int) else b
    return b if _ops_count(b) < _ops_count(a) else a


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
    if dims_equal(a, b):
        return
    _CONSTRAINTS.append(DimConstraint(a, b, node.name))  # duplicates are dropped once, in infer_shapes


class DimConstraint(tuple):
    """(a, b, node name): dims that must agree; with `broadcast`, or either may be 1."""

    def __new__(cls, a, b, where, broadcast=False):
        t = super().__new__(cls, (a, b, where))
        t.broadcast = broadcast
        return t

    def holds(self, va: int, vb: int) -> bool:
        return va == vb or (self.broadcast and 1 in (va, vb))


def note_broadcast(node: Node, a: Dim, b: Dim) -> None:
    """Record that dims `a` and `b` broadcast against each other (equal, or one is 1)."""
    if not dims_equal(a, b):
        _CONSTRAINTS.append(DimConstraint(a, b, node.name, broadcast=True))


def take_constraints() -> list:
    out = list(_CONSTRAINTS)
    _CONSTRAINTS.clear()
    return out


def runtime_dim(node: Node, output: int, axis: int) -> Dim:
    """A fresh dim that only running `node` tells (no shape function, or data-dependent):
    named after the node, so re-importing a model yields the same names."""
    base = "".join(c if c.isalnum() else "_" for c in node.name)
    return runtime_symbol(f"{base}_o{output}_{axis}")


def runtime_shape(node: Node, output: int, rank: int, known=None) -> Shape:
    """A rank-`rank` shape of runtime dims; `known` (a shape hint) keeps its static sizes."""
    return tuple(int(known[a]) if known is not None and a < len(known) and isinstance(known[a], int)
                 else runtime_dim(node, output, a) for a in range(rank))


def dims_of(value) -> list:
    """An int tensor's value (numeric or object array) as a list of int / sympy dims."""
    out = []
    for v in np.asarray(value).reshape(-1).tolist():
        out.append(simplify_dim(v) if hasattr(v, "free_symbols") else int(v))
    return out

"""Einsum and Det (opaque: NumPy references; Einsum's output shape follows its equation)."""
from __future__ import annotations

import numpy as np

from ir.errors import ShapeError
from ir.graph import TensorType
from ir.ops.registry import OPAQUE, note_equal, register


def _einsum_terms(node, ranks):
    """(input terms, output term) with '...' expanded to capital letters (one per broadcast dim)."""
    eq = node.attrs["equation"].replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ShapeError(f"node '{node.name}' (Einsum): equation '{eq}' has {len(terms)} operands, "
                         f"the node {len(ranks)} inputs")
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    fill = "".join(chr(ord("A") + k) for k in range(ell))
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            k = r - len(t.replace("...", ""))
            t = t.replace("...", fill[ell - k:])
        if len(t) != r:
            raise ShapeError(f"node '{node.name}' (Einsum): term '{t}' does not match an input of rank {r}")
        out_terms.append(t)
    if _:
        out = rhs.replace("...", fill)
    else:  # implicit output: broadcast dims, then the letters seen once, sorted
        letters = "".join(out_terms)
        out = fill + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c.islower()))
    return out_terms, out


def _einsum_infer(node, types, consts):
    terms, out = _einsum_terms(node, [len(t.shape) for t in types])
    size = {}
    for t, ty in zip(terms, types):
        for c, d in zip(t, ty.shape):
            if c in size and not (isinstance(d, int) and d == 1):
                if isinstance(size[c], int) and size[c] == 1:
                    size[c] = d
                else:
                    note_equal(node, size[c], d)
            else:
                size.setdefault(c, d)
    return [TensorType(tuple(size[c] for c in out), types[0].dtype)]


def _einsum(node, xs):
    terms, out = _einsum_terms(node, [x.ndim for x in xs])
    return [np.asarray(np.einsum(",".join(terms) + "->" + out, *xs)).astype(xs[0].dtype, copy=False)]


register("Einsum", OPAQUE, _einsum_infer, _einsum)
register("Det", OPAQUE, lambda n, t, c: [TensorType(tuple(t[0].shape[:-2]), t[0].dtype)],
         lambda n, xs: [np.asarray(np.linalg.det(xs[0])).astype(xs[0].dtype)])

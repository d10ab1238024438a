"""Injective ops that only move data."""
from __future__ import annotations

import numpy as np

from ir.graph import TensorType
from ir.ops.registry import INJECTIVE, register


def _perm(node, rank):
    return list(node.attrs.get("perm") or reversed(range(rank)))


register("Transpose", INJECTIVE,
         lambda node, types, consts: [TensorType(tuple(types[0].shape[p] for p in _perm(node, types[0].rank)), types[0].dtype)],
         lambda node, xs: [np.ascontiguousarray(np.transpose(xs[0], _perm(node, xs[0].ndim)))])

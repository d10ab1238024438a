"""The rules that match tuning results to work, each written once: the hash behind a
workload's key and signature, a config's hash, a workload's dynamic-dim sizes, and the
distance between two shapes of one signature (which tuned shape is "nearest").

Standard library only, so the database, plan-only deploys and measurement workers
import it without numpy, sympy or numba. Changing a hash here orphans every stored
record and plan: `tests/test_workload_identity.py` pins them.
"""
from __future__ import annotations

import hashlib
import json
import math


def workload_hash(description: dict) -> str:
    """Hash of a workload's JSON description (`Workload.key`, and `signature` on the
    description with dynamic sizes left symbolic)."""
    text = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def config_hash(values: dict) -> str:
    """Hash of a config's knob values (`Config.hash`, the database's `config_hash` column,
    claims): records and configs meet on this one key."""
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def dynamic_dims(inputs) -> dict[str, int]:
    """Concrete sizes of the dynamic dims, read off each input's concrete `shape` against
    its symbolic `sym` (`Workload.dims`; the database's `dims` column)."""
    out = {}
    for i in inputs:
        for size, sym in zip(i.get("shape", ()), i.get("sym", ())):
            if isinstance(sym, str) and sym.isidentifier():
                out[sym] = size
    return out


def shape_distance(want: dict[str, int], have: dict[str, int]) -> float:
    """How far dim sizes `have` (a tuned shape) are from `want`: the sum over `want`'s dims
    of |log2 of their ratio|. Infinite when `have` lacks one of them, holds a size that is
    not a positive integer, or `want` a size that is not positive: no candidate at all."""
    total = 0.0
    for name, v in want.items():
        w = have.get(name)
        if not _positive_int(w) or not v > 0:
            return math.inf
        total += abs(math.log2(v) - math.log2(w))
    return total


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0

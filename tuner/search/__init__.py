"""Search strategies, creatable by name."""
from __future__ import annotations

from tuner.search.base import SearchStrategy
from tuner.search.random_search import RandomSearch

STRATEGIES = {"random": RandomSearch}


def make_strategy(name: str, space, seed: int = 0, measured=None, **kw) -> SearchStrategy:
    if name not in STRATEGIES:
        from ir.errors import TensortuneError
        raise TensortuneError(f"unknown --strategy '{name}' (choose from: {', '.join(sorted(STRATEGIES))})")
    return STRATEGIES[name](space, seed=seed, measured=measured, **kw)


__all__ = ["SearchStrategy", "RandomSearch", "STRATEGIES", "make_strategy"]

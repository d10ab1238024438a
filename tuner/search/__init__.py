"""Search strategies, creatable by name: random, grid, ga (genetic), xgb (model-guided)."""
from __future__ import annotations

from tuner.search.base import SearchStrategy
from tuner.search.genetic import GeneticSearch
from tuner.search.grid import GridSearch
from tuner.search.model_based import ModelGuidedSearch
from tuner.search.random_search import RandomSearch

STRATEGIES = {"random": RandomSearch, "grid": GridSearch, "ga": GeneticSearch, "xgb": ModelGuidedSearch}
MODEL_GUIDED = {"xgb"}


def make_strategy(name: str, space, seed: int = 0, measured=None, history=None, featurizer=None,
                  cost_model: str = "xgb", prior=None, **kw) -> SearchStrategy:
    """`featurizer`, `cost_model` and `prior` (transfer-learning rows) go to model-guided strategies only."""
    if name not in STRATEGIES:
        from ir.errors import TensortuneError
        raise TensortuneError(f"unknown --strategy '{name}' (choose from: {', '.join(sorted(STRATEGIES))})")
    if name in MODEL_GUIDED:
        kw.update(featurizer=featurizer, cost_model=cost_model, prior=prior)
    return STRATEGIES[name](space, seed=seed, measured=measured, history=history, **kw)


__all__ = ["SearchStrategy", "RandomSearch", "GridSearch", "GeneticSearch", "ModelGuidedSearch", "STRATEGIES",
           "MODEL_GUIDED", "make_strategy"]

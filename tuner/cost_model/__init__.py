"""Cost models, creatable by name; xgboost is imported only for "xgb"."""
from __future__ import annotations

from tuner.cost_model.base import CostModel, RandomCostModel, normalized_throughput
from tuner.cost_model.features import Featurizer

COST_MODELS = ("xgb", "xgb-reg", "random")


def make_cost_model(name: str = "xgb", seed: int = 0, **kw) -> CostModel:
    if name == "xgb":
        from tuner.cost_model.xgb import XGBoostCostModel
        return XGBoostCostModel(seed=seed, **kw)
    if name == "xgb-reg":
        from tuner.cost_model.xgb import XGBoostCostModel
        return XGBoostCostModel(objective="reg:squarederror", seed=seed, **kw)
    if name == "random":
        return RandomCostModel(seed)
    from ir.errors import TensortuneError
    raise TensortuneError(f"unknown --cost-model '{name}' (choose from: {', '.join(COST_MODELS)})")


__all__ = ["CostModel", "RandomCostModel", "normalized_throughput", "Featurizer", "make_cost_model", "COST_MODELS"]

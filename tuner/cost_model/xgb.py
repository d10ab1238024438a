"""XGBoost cost model: gradient-boosted trees on normalized throughput per workload.

Trained with `rank:pairwise` by default (only the order of candidates matters, and
it compares rows only within one workload, so records of other shapes can join
the training set: transfer learning), or `reg:squarederror` on the same targets.
xgboost is imported only when this model is built.
"""
from __future__ import annotations

import numpy as np

from tuner.cost_model.base import CostModel, normalized_throughput

OBJECTIVES = ("rank:pairwise", "reg:squarederror")


class XGBoostCostModel(CostModel):
    name = "xgb"

    def __init__(self, objective: str = "rank:pairwise", rounds: int = 60, seed: int = 0, nthread: int = 1,
                 max_depth: int = 6, eta: float = 0.3):
        if objective not in OBJECTIVES:
            from ir.errors import TensortuneError
            raise TensortuneError(f"unknown cost-model objective '{objective}' (choose from: {', '.join(OBJECTIVES)})")
        import xgboost as xgb
        self.xgb = xgb
        self.objective, self.rounds = objective, rounds
        self.params = {"objective": objective, "max_depth": max_depth, "eta": eta, "min_child_weight": 1,
                       "subsample": 1.0, "lambda": 1.0, "seed": seed, "nthread": nthread, "verbosity": 0}
        self.booster = None

    @property
    def trained(self) -> bool:
        return self.booster is not None

    def fit(self, features, latencies, groups=None, own=None) -> None:
        """`own`: the group being tuned; when other groups (transfer rows) are present, it
        weighs as much as all of them together, so fresh measurements overrule the prior."""
        x = np.asarray(features, dtype=np.float32)
        groups = np.zeros(len(x), dtype=np.int64) if groups is None else np.asarray(groups)
        y = normalized_throughput(latencies, groups)
        if len(x) < 2 or not (y > 0).any():
            return
        # groups (query ids) must be contiguous for ranking objectives
        _, gid = np.unique(groups, return_inverse=True)
        order = np.argsort(gid, kind="stable")
        d = self.xgb.DMatrix(x[order], label=y[order], nthread=self.params["nthread"])
        sizes = np.bincount(gid[order])
        names = np.unique(groups)
        if self.objective.startswith("rank:"):
            d.set_group(sizes.astype(np.uint32))
            if own is not None and len(names) > 1 and own in names:
                k = int(np.searchsorted(names, own))
                w = np.ones(len(names), np.float32)
                w[k] = max(1.0, float((sizes.astype(np.float64) ** 2).sum() - sizes[k] ** 2) / max(sizes[k] ** 2, 1)) ** 0.5
                d.set_weight(w)
        elif own is not None and len(names) > 1 and own in names:
            k = int(np.searchsorted(names, own))
            w = np.where(gid[order] == k, max(1.0, (len(x) - sizes[k]) / max(sizes[k], 1)), 1.0)
            d.set_weight(w.astype(np.float32))
        self.booster = self.xgb.train(self.params, d, num_boost_round=self.rounds)

    def predict(self, features) -> np.ndarray:
        x = np.asarray(features, dtype=np.float32)
        if self.booster is None:
            return np.zeros(len(x))
        return self.booster.inplace_predict(x)

"""The cost-model interface: rank candidate configs without measuring them."""
from __future__ import annotations

import abc

import numpy as np


def normalized_throughput(latencies, groups) -> np.ndarray:
    """min latency / latency within each group (workload); failures (None) score 0.

    Ranks are comparable within a workload, never across: a config twice as fast
    as the best known scores 2, one twice as slow 0.5."""
    lat = np.array([np.nan if v is None else float(v) for v in latencies], dtype=np.float64)
    groups = np.asarray(groups)
    y = np.zeros(len(lat))
    for g in np.unique(groups):
        sel = groups == g
        ok = sel & np.isfinite(lat) & (lat > 0)
        if ok.any():
            best = lat[ok].min()
            y[ok] = best / lat[ok]
    return y


class CostModel(abc.ABC):
    """fit(features, latencies, groups) then predict(features) -> scores (higher = faster)."""

    name = ""

    @abc.abstractmethod
    def fit(self, features: np.ndarray, latencies: list, groups=None, own=None) -> None:
        """Learn from measured configs; `latencies` in seconds, None for failures;
        `groups` names the workload of each row (default: all one workload); `own`
        the group being tuned (the others are transfer-learning rows)."""

    @abc.abstractmethod
    def predict(self, features: np.ndarray) -> np.ndarray:
        """A score per row; only the order matters."""

    @property
    def trained(self) -> bool:
        return True


class RandomCostModel(CostModel):
    """No knowledge: random scores. The fallback, and the baseline a real model must beat."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def fit(self, features, latencies, groups=None, own=None) -> None:
        pass

    def predict(self, features) -> np.ndarray:
        return self.rng.random(len(features))

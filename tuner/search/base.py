"""The search-strategy interface: propose configs to measure, learn from results."""
from __future__ import annotations

import abc
import random

from schedules.space import Config, ConfigSpace


class SearchStrategy(abc.ABC):
    """`propose(n)` never returns a config in `measured` (results already stored for this
    workload and target, or proposed earlier in this run); `update` feeds results back.

    `history`: (config, latency in seconds or None for a failure) pairs already known
    for this workload, e.g. from the database on resume."""

    name = ""

    def __init__(self, space: ConfigSpace, seed: int = 0, measured: set[str] | None = None,
                 history: list[tuple[Config, float | None]] | None = None):
        self.space = space
        self.rng = random.Random(seed)
        self.measured: set[str] = set(measured or ())  # config hashes never to propose again
        self.history: list[tuple[Config, float | None]] = list(history or ())

    @abc.abstractmethod
    def propose(self, n: int) -> list[Config]:
        """Up to n configs not measured yet; fewer (or none) when the space is exhausted."""

    def update(self, results: list) -> None:
        """Learn from measured results (MeasureResult objects)."""
        for r in results:
            self.measured.add(r.input.config.hash)
            self.history.append((r.input.config, r.median))

    def exhausted(self) -> bool:
        return len(self.measured) >= len(self.space)

    def _fresh(self, cfg: Config, taken: set[str]) -> bool:
        """True (and mark it taken) if cfg is neither measured nor already in this proposal,
        and its space allows it (a pruned config is marked measured: never proposed, never built)."""
        h = cfg.hash
        if h in self.measured or h in taken:
            return False
        if not self.space.allowed(cfg):
            self.measured.add(h)
            return False
        taken.add(h)
        return True

    def _random_fill(self, out: list[Config], n: int, taken: set[str]) -> list[Config]:
        """Top `out` up to n with uniform samples, then (nearly exhausted space) by enumeration."""
        tries = 0
        while len(out) < n and tries < 20 * n:
            tries += 1
            cfg = self.space.sample(self.rng)
            if self._fresh(cfg, taken):
                out.append(cfg)
        if len(out) < n and len(self.space) <= 1 << 20:
            start = self.rng.randrange(len(self.space)) if len(self.space) else 0
            for i in range(len(self.space)):
                if len(out) >= n:
                    break
                cfg = self.space.get((start + i) % len(self.space))
                if self._fresh(cfg, taken):
                    out.append(cfg)
        return out

"""The search-strategy interface: propose configs to measure, learn from results."""
from __future__ import annotations

import abc
import random

from schedules.space import Config, ConfigSpace


class SearchStrategy(abc.ABC):
    name = ""

    def __init__(self, space: ConfigSpace, seed: int = 0, measured: set[str] | None = None):
        self.space = space
        self.rng = random.Random(seed)
        self.measured: set[str] = set(measured or ())  # config hashes never to propose again

    @abc.abstractmethod
    def propose(self, n: int) -> list[Config]:
        """Up to n configs not measured yet; fewer (or none) when the space is exhausted."""

    def update(self, results: list) -> None:
        """Learn from measured results (MeasureResult objects)."""
        for r in results:
            self.measured.add(r.input.config.hash)

    def exhausted(self) -> bool:
        return len(self.measured) >= len(self.space)

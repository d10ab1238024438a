"""Random search: uniform samples of the space, without repeats; under a code budget
(`SearchStrategy.new_codes`), samples over it become run-time variants of built code shapes."""
from __future__ import annotations

from schedules.space import Config
from tuner.search.base import SearchStrategy


class RandomSearch(SearchStrategy):
    name = "random"
    cost_aware = True

    def propose(self, n: int) -> list[Config]:
        out = self._random_fill([], n, set(), self._budget())
        self.building(out)
        return out

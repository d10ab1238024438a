"""Random search: uniform samples of the space, without repeats."""
from __future__ import annotations

from schedules.space import Config
from tuner.search.base import SearchStrategy


class RandomSearch(SearchStrategy):
    name = "random"

    def propose(self, n: int) -> list[Config]:
        return self._random_fill([], n, set())

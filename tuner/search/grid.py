"""Grid search: every config in a fixed order, code-shape knobs varying slowest, so
consecutive candidates share a compiled kernel (compile time is the main cost)."""
from __future__ import annotations

from schedules.space import Config
from tuner.search.base import SearchStrategy


class GridSearch(SearchStrategy):
    name = "grid"

    def __init__(self, space, seed: int = 0, measured=None, history=None):
        super().__init__(space, seed, measured, history)
        # run-time knobs first (fastest), code-shape knobs last (slowest)
        self.order = sorted(space.knobs, key=lambda k: k.code_shape)
        self.next_index = 0

    def _config(self, i: int) -> Config:
        return self.space.get(i, self.order)

    def propose(self, n: int) -> list[Config]:
        out, taken = [], set()
        while len(out) < n and self.next_index < len(self.space):
            cfg = self._config(self.next_index)
            self.next_index += 1
            if self._fresh(cfg, taken):
                out.append(cfg)
        return out

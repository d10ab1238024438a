"""Random search: uniform samples of the space, without repeats."""
from __future__ import annotations

from schedules.space import Config
from tuner.search.base import SearchStrategy


class RandomSearch(SearchStrategy):
    name = "random"

    def propose(self, n: int) -> list[Config]:
        out, seen = [], set(self.measured)
        tries = 0
        while len(out) < n and tries < 50 * n and len(seen) < len(self.space):
            cfg = self.space.sample(self.rng)
            tries += 1
            if cfg.hash not in seen:
                seen.add(cfg.hash)
                out.append(cfg)
        return out

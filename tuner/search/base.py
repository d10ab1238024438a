"""The search-strategy interface: propose configs to measure, learn from results.

Cost-aware batches: a config whose code shape (`ConfigSpace.code_key`) is already
built costs a run (a fraction of a second), a new code shape costs a compile
(seconds). A strategy that honours `new_codes` (`cost_aware`) proposes at most that
many configs of code shapes not built yet per call and fills the rest with run-time
variants of built ones; the tuning loop sets it from what compiles and runs cost
(`tuner.compile_budget`). `built` holds the code shapes measured, or proposed and
so being built; `broken` those whose build failed (their variants would fail alike).
"""
from __future__ import annotations

import abc
import random

from schedules.space import Config, ConfigSpace

_BUILD_FAILURES = ("compile_error", "build_timeout")


class SearchStrategy(abc.ABC):
    """`propose(n)` never returns a config in `measured` (results already stored for this
    workload and target, or proposed earlier in this run); `update` feeds results back.

    `history`: (config, latency in seconds or None for a failure) pairs already known
    for this workload, e.g. from the database on resume."""

    name = ""
    cost_aware = False   # honours `new_codes`

    def __init__(self, space: ConfigSpace, seed: int = 0, measured: set[str] | None = None,
                 history: list[tuple[Config, float | None]] | None = None):
        self.space = space
        self.rng = random.Random(seed)
        self.measured: set[str] = set(measured or ())  # config hashes never to propose again
        self.history: list[tuple[Config, float | None]] = list(history or ())
        self.new_codes: int | None = None   # configs of unbuilt code shapes a proposal may hold (None: any)
        self.built: set = {space.code_key(c) for c, lat in self.history if lat is not None}
        self.broken: set = set()

    @abc.abstractmethod
    def propose(self, n: int) -> list[Config]:
        """Up to n configs not measured yet; fewer (or none) when the space is exhausted."""

    def update(self, results: list) -> None:
        """Learn from measured results (MeasureResult objects)."""
        for r in results:
            self.measured.add(r.input.config.hash)
            self.history.append((r.input.config, r.median))
            key = self.space.code_key(r.input.config)
            if r.status in _BUILD_FAILURES:
                self.broken.add(key)
                self.built.discard(key)
            elif key not in self.broken:
                self.built.add(key)

    def building(self, configs) -> None:
        """`configs` are about to be built (proposed here or elsewhere, as the default config
        the loop adds): their code shapes count as built from now on."""
        self.built |= {self.space.code_key(c) for c in configs} - self.broken

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

    def _admit(self, cfg: Config, taken: set[str], new: set | None) -> bool:
        """`_fresh`, and within the code budget: `new` collects the unbuilt code shapes this
        proposal holds (None: no budget). A config of a broken code shape is never admitted."""
        if new is None:
            return self._fresh(cfg, taken)
        key = self.space.code_key(cfg)
        if key in self.broken:
            return False
        cheap = key in self.built or key in new
        if not cheap and len(new) >= (self.new_codes or 0):
            return False
        if not self._fresh(cfg, taken):
            return False
        if not cheap:
            new.add(key)
        return True

    def _budget(self) -> set | None:
        """The `new` set of one budgeted proposal, or None when there is no budget."""
        return set() if self.cost_aware and self.new_codes is not None else None

    def _variant(self, cfg: Config, new: set | None) -> Config:
        """`cfg`, or (its code shape over the budget) its run-time knobs on a random built code shape."""
        if new is None or len(new) < (self.new_codes or 0):
            return cfg
        key = self.space.code_key(cfg)
        if key in self.built or key in new:
            return cfg
        cheap = sorted((self.built | new) - self.broken, key=repr)
        if not cheap:
            return cfg
        return Config({**cfg.to_json(), **dict(self.rng.choice(cheap))})

    def _random_fill(self, out: list[Config], n: int, taken: set[str], new: set | None = None) -> list[Config]:
        """Top `out` up to n with uniform samples, then (nearly exhausted space) by enumeration.
        Under a code budget (`new`), a sample whose code shape is over it keeps its run-time
        knobs on a random built code shape: a uniform run-time variant of a built kernel."""
        tries = 0
        while len(out) < n and tries < 20 * n:
            tries += 1
            cfg = self._variant(self.space.sample(self.rng), new)
            if self._admit(cfg, taken, new):
                out.append(cfg)
        if len(out) < n and len(self.space) <= 1 << 20:
            start = self.rng.randrange(len(self.space)) if len(self.space) else 0
            for i in range(len(self.space)):
                if len(out) >= n:
                    break
                cfg = self.space.get((start + i) % len(self.space))
                if self._admit(cfg, taken, new):
                    out.append(cfg)
        return out

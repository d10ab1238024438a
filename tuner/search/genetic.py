"""Genetic search over knobs: a population, fitness = throughput (1 / latency, failures 0),
fitness-proportional parents, uniform crossover per knob, per-knob mutation, elitism.

Each generation is measured as it is proposed; when it is used up, the next one is
bred from everything measured so far (the elites are the best configs seen)."""
from __future__ import annotations

from schedules.space import Config
from tuner.search.base import SearchStrategy


class GeneticSearch(SearchStrategy):
    name = "ga"

    def __init__(self, space, seed: int = 0, measured=None, history=None, population: int = 32,
                 elites: int = 4, mutation: float = 0.1):
        super().__init__(space, seed, measured, history)
        self.population, self.elites, self.mutation = population, elites, mutation
        self.queue: list[Config] = []
        self.generation = 0

    def _fitness(self) -> list[tuple[float, Config]]:
        best: dict[Config, float] = {}
        for cfg, lat in self.history:
            f = 1.0 / lat if lat else 0.0
            best[cfg] = max(best.get(cfg, 0.0), f)
        return sorted(((f, c) for c, f in best.items()), key=lambda x: -x[0])

    def _mutate(self, values: dict) -> dict:
        for k in self.space.knobs:
            if len(k.options) > 1 and self.rng.random() < self.mutation:
                values[k.name] = self.rng.choice(k.options)
        return values

    def _breed(self) -> None:
        scored = self._fitness()[: self.population]
        taken = {c.hash for c in self.queue}
        children: list[Config] = []
        if sum(f for f, _ in scored) <= 0:
            self.queue += self._random_fill([], self.population, taken)
            return
        self.generation += 1
        parents = [c for _, c in scored]
        weights = [f for f, _ in scored]
        elites = parents[: self.elites]
        tries = 0
        while len(children) < self.population and tries < 20 * self.population:
            tries += 1
            if elites and self.rng.random() < 0.5:     # elitism: the best genes go on more often
                a = self.rng.choice(elites)
            else:
                a = self.rng.choices(parents, weights)[0]
            b = self.rng.choices(parents, weights)[0]
            values = {k.name: (a if self.rng.random() < 0.5 else b)[k.name] for k in self.space.knobs}
            child = Config(self._mutate(values))
            if self._fresh(child, taken):
                children.append(child)
        self.queue += self._random_fill(children, self.population, taken)

    def propose(self, n: int) -> list[Config]:
        out = []
        for _ in range(3):
            while self.queue and len(out) < n:
                cfg = self.queue.pop(0)
                if cfg.hash not in self.measured and cfg not in out:
                    out.append(cfg)
            if len(out) >= n:
                break
            if not self.queue and not self.history:
                self.queue = self._random_fill([], self.population, {c.hash for c in out})
            elif not self.queue:
                self._breed()
            if not self.queue:
                break
        for c in out:
            self.measured.add(c.hash)
        return out

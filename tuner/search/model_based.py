"""Model-guided search (AutoTVM's XGBTuner, Ansor's evolutionary search): a cost model
ranks the space, the best-ranked unmeasured configs are measured, the model retrains.

* Candidates: every config when the space is small (`exhaustive_limit`), otherwise
  simulated annealing over knob neighbours, started from the best measured configs
  and random points, scored by the model.
* ε-greedy: a share `eps` of each batch is uniform random, so a wrong model still
  sees the rest of the space.
* Never proposes a config in `measured` (the database's configs for this workload
  and target, and everything proposed in this run).
* Ties (equal scores, within `tie`) prefer configs whose code shape is already built:
  they cost a run, not a compile.
* Cost-aware batches (`new_codes`, set by the tuning loop): the best-scored configs
  that fit the code budget, so a batch holds few new code shapes and many run-time
  variants of built ones, ranked by the model like the rest.
* Retrains only when `retrain_every` new results arrived.
* Transfer learning: `prior` holds (features, latency, group) rows of the same
  template on other workloads for this target; the model trains on them too (ranks
  compare rows only within a group), so the first batch is already guided.
"""
from __future__ import annotations

import heapq
import math
import time

import numpy as np

from schedules.space import Config
from tuner.cost_model import CostModel, make_cost_model
from tuner.search.base import SearchStrategy


class ModelGuidedSearch(SearchStrategy):
    name = "xgb"
    cost_aware = True

    def __init__(self, space, seed: int = 0, measured=None, history=None, featurizer=None,
                 cost_model: CostModel | str = "xgb", prior=None, eps: float = 0.05, retrain_every: int = 8,
                 min_train: int = 8, plan_size: int = 64, exhaustive_limit: int = 20000,
                 sa_points: int = 128, sa_steps: int = 60, tie: float = 1e-3):
        super().__init__(space, seed, measured, history)
        if featurizer is None:
            raise ValueError("ModelGuidedSearch needs a featurizer (Featurizer(template, workload))")
        self.featurize = featurizer
        self.model = make_cost_model(cost_model, seed=seed) if isinstance(cost_model, str) else cost_model
        self.prior = list(prior or ())
        self.eps, self.retrain_every, self.min_train = eps, retrain_every, min_train
        self.plan_size, self.exhaustive_limit = plan_size, exhaustive_limit
        self.sa_points, self.sa_steps, self.tie = sa_points, sa_steps, tie
        self.np_rng = np.random.default_rng(seed)
        self.plan: list[Config] = []
        self.new_since_fit = len(self.history)
        self.fits = 0
        self.model_s = 0.0          # seconds spent fitting and scoring (the "model" share of tuning time)
        self._all: list[Config] | None = None
        self._all_pred, self._all_fit = None, -1

    # -- learning ------------------------------------------------------------------------
    def update(self, results: list) -> None:
        super().update(results)
        self.new_since_fit += len(results)

    def add_prior(self, rows) -> None:
        """More transfer rows (features, latency, group), e.g. results of another task of
        the same template measured in this run; used from the next fit on."""
        self.prior.extend(rows)

    def _data(self):
        xs, ys, gs = [], [], []
        if self.history:
            xs.append(self.featurize([c for c, _ in self.history]))
            ys += [lat for _, lat in self.history]
            gs += ["self"] * len(self.history)
        width = xs[0].shape[1] if xs else self.featurize.width
        prior = [(f, lat, g) for f, lat, g in self.prior if len(f) == width]
        if prior:
            xs.append(np.stack([f for f, _, _ in prior]))
            ys += [lat for _, lat, _ in prior]
            gs += [str(g) for _, _, g in prior]
        return (np.concatenate(xs) if xs else np.zeros((0, width), np.float32)), ys, gs

    def _maybe_fit(self) -> bool:
        own_ok = sum(1 for _, lat in self.history if lat)
        have_prior = bool(self.prior)
        if own_ok < self.min_train and not have_prior:
            return False
        if self.model.trained and self.new_since_fit < self.retrain_every:
            return False
        t0 = time.perf_counter()
        x, y, g = self._data()
        self.model.fit(x, y, g, own="self" if self.history else None)
        self.model_s += time.perf_counter() - t0
        self.new_since_fit = 0
        self.fits += 1
        self.plan = []
        return True

    # -- proposing -----------------------------------------------------------------------
    def propose(self, n: int) -> list[Config]:
        self._maybe_fit()
        new = self._budget()
        if not self.model.trained:
            out = self._random_fill([], n, set(), new)
            self.measured |= {c.hash for c in out}
            self.building(out)
            return out
        n_random = sum(1 for _ in range(n) if self.rng.random() < self.eps)
        out, taken = [], set()
        if new is not None:
            t0 = time.perf_counter()
            out = self._pick_within_budget(n - n_random, taken, new)
            self.model_s += time.perf_counter() - t0
        else:
            if len(self.plan) < n - n_random:
                t0 = time.perf_counter()
                self.plan = self._make_plan(max(self.plan_size, n))
                self.model_s += time.perf_counter() - t0
            while self.plan and len(out) < n - n_random:
                cfg = self.plan.pop(0)
                if self._fresh(cfg, taken):
                    out.append(cfg)
        out = self._random_fill(out, n, taken, new)
        self.measured |= {c.hash for c in out}
        self.building(out)
        return out

    def _pick_within_budget(self, k: int, taken: set, new: set) -> list[Config]:
        """The best-scored k configs that fit the code budget: in score order, a config of a
        built code shape (or of one this proposal already holds) always, one of a new code
        shape while `new_codes` allows. On a large space the candidates are the annealing
        plan plus model-scored run-time variants of the built code shapes."""
        out: list[Config] = []
        if k <= 0:
            return out
        if len(self.space) <= self.exhaustive_limit:
            s = self._score_all()
            pool = [(self._all[i], self._all_key[i]) for i in np.argsort(-s, kind="stable") if np.isfinite(s[i])]
        else:
            if len(self.plan) < k:
                self.plan = self._make_plan(max(self.plan_size, k))
            cheap = sorted(self.built - self.broken, key=repr)
            variants = [Config({**self.space.sample(self.rng).to_json(), **dict(self.rng.choice(cheap))})
                        for _ in range(max(64, 8 * k))] if cheap else []
            cands = list(dict.fromkeys(self.plan + variants))
            order = np.argsort(-self._scores(cands), kind="stable") if cands else []
            pool = [(cands[i], self.space.code_key(cands[i])) for i in order]
        for cfg, key in pool:
            if len(out) >= k:
                break
            if key in self.broken or (len(new) >= (self.new_codes or 0) and key not in self.built and key not in new):
                continue
            if self._admit(cfg, taken, new):
                out.append(cfg)
        if len(self.space) > self.exhaustive_limit:
            self.plan = [c for c in self.plan if c.hash not in taken and c.hash not in self.measured]
        return out

    def _scores(self, configs: list[Config]) -> np.ndarray:
        s = np.asarray(self.model.predict(self.featurize(configs)), dtype=np.float64)
        span = float(s.max() - s.min()) if len(s) else 0.0
        if span > 0 and self.tie > 0:   # a hair of extra score for configs whose kernel is already built
            s = s + self.tie * span * np.array([self.space.code_key(c) in self.built for c in configs])
        return s

    def _make_plan(self, k: int) -> list[Config]:
        if len(self.space) <= self.exhaustive_limit:
            return self._rank_all(k)
        return self._anneal(k)

    def _score_all(self) -> np.ndarray:
        """The model's score of every config of a small space (features, hashes and code keys
        computed once, predictions once per fit), built code shapes a hair up, configs
        measured or proposed -inf."""
        if self._all is None:
            self._all = list(self.space)
            self._all_x = self.featurize(self._all)
            self._all_hash = [c.hash for c in self._all]
            self._all_key = [self.space.code_key(c) for c in self._all]
            ids = {key: i for i, key in enumerate(dict.fromkeys(self._all_key))}
            self._all_code = np.array([ids[key] for key in self._all_key])
            self._code_ids = ids
        if self._all_pred is None or self._all_fit != self.fits:
            self._all_pred = np.asarray(self.model.predict(self._all_x), dtype=np.float64)
            self._all_fit = self.fits
        s = self._all_pred.copy()
        span = float(s.max() - s.min()) if len(s) else 0.0
        if span > 0 and self.tie > 0:
            built = np.array([self._code_ids.get(key, -1) for key in self.built])
            s = s + self.tie * span * np.isin(self._all_code, built)
        s[np.array([h in self.measured for h in self._all_hash], dtype=bool)] = -np.inf
        return s

    def _rank_all(self, k: int) -> list[Config]:
        """The k best-scored unmeasured configs of a small space."""
        s = self._score_all()
        free = int(np.isfinite(s).sum())
        if not free:
            return []
        top = np.argsort(-s, kind="stable")[: min(k, free)]
        return [self._all[i] for i in top]

    def _anneal(self, k: int) -> list[Config]:
        """Simulated annealing: points walk to random knob neighbours, accepting worse
        scores with probability exp((new - old) / T), T cooling to 0; the best k
        unmeasured configs seen are kept."""
        starts = [c for c, lat in sorted((x for x in self.history if x[1]), key=lambda x: x[1])[: self.sa_points // 4]]
        while len(starts) < self.sa_points:
            starts.append(self.space.sample(self.rng))
        points = starts
        scores = self._scores(points)
        heap: list[tuple[float, int, Config]] = []
        seen: set[Config] = set()
        counter = 0

        def keep(cfgs, ss):
            nonlocal counter
            for c, s in zip(cfgs, ss):
                if c in seen or c.hash in self.measured:
                    continue
                seen.add(c)
                counter += 1
                item = (float(s), counter, c)
                if len(heap) < k:
                    heapq.heappush(heap, item)
                elif item[0] > heap[0][0]:
                    heapq.heapreplace(heap, item)

        keep(points, scores)
        t0 = 1.0
        scale = float(np.std(scores)) or 1.0
        for step in range(self.sa_steps):
            temp = t0 * (1 - (step + 1) / self.sa_steps)
            new = []
            for c in points:
                nb = self.space.random_neighbour(c, self.rng) if self.rng.random() >= 0.2 else None
                if nb is None:   # an occasional long jump (or no neighbour): one knob anywhere
                    knob = self.rng.choice(self.space.knobs)
                    new.append(Config({**c.to_json(), knob.name: self.rng.choice(knob.options)}))
                else:
                    new.append(nb)
            ns = self._scores(new)
            keep(new, ns)
            for i in range(len(points)):
                d = (ns[i] - scores[i]) / scale
                if d > 0 or (temp > 0 and self.rng.random() < math.exp(d / max(temp, 1e-9))):
                    points[i], scores[i] = new[i], ns[i]
        return [c for _, _, c in sorted(heap, key=lambda x: (-x[0], x[1]))]

"""Task schedulers: which task gets the next batch of trials.

The goal is the model's end-to-end latency, Σ weight_i × best_i over tasks (weight:
how often the subgraph occurs). `round-robin` gives every task the same share;
`gradient` (Ansor's task scheduler, TVM's `GradientBasedTaskScheduler`) first gives
each task one round (warm-up), then picks the task whose next round is expected to
cut that sum most:

    grad_i = w_i × (α × backward_i + (1 − α) × forward_i)

backward_i: how much best_i fell per round over the last `window` rounds;
forward_i: an optimistic guess of the next round: min(best_i − best_i / rounds_i,
β × flops_i / best throughput of a similar task (same template)) − best_i.
The most negative gradient wins; with probability `eps` a random task does (so no
estimate starves a task for ever). A task whose best did not move in its last
`patience` rounds counts as stagnant: its gradient is damped (× `stagnant_damping`),
so it yields budget to tasks that still improve, weights still counting. Tasks whose search is exhausted, that stopped early, or that never
produced a valid result in `max_failed_rounds` rounds retire.
"""
from __future__ import annotations

import abc
import random


def estimated_latency(weighted_bests) -> float | None:
    """Σ weight × best latency over (weight, best) per task: the model's estimated tuned
    latency, the sum a scheduler cuts; None while a task has no best yet."""
    pairs = list(weighted_bests)
    if any(best is None for _, best in pairs):
        return None
    return sum(weight * best for weight, best in pairs)


class TaskScheduler(abc.ABC):
    name = ""

    def __init__(self, tasks, seed: int = 0):
        self.n = len(tasks)
        self.weights = [float(t.weight) for t in tasks]
        self.flops = [float(t.flops) for t in tasks]
        self.groups = [getattr(t.template, "name", "") for t in tasks]
        self.best: list[float | None] = [None] * self.n
        self.rounds = [0] * self.n
        self.trials = [0] * self.n
        self.history: list[list[float | None]] = [[] for _ in range(self.n)]   # best after each round
        self.active = set(range(self.n))
        self.rng = random.Random(seed)
        self.failed_rounds = [0] * self.n

    def set_best(self, i: int, best: float | None) -> None:
        """Known best before tuning starts (resume)."""
        self.best[i] = best

    def update(self, i: int, trials: int, best: float | None) -> None:
        """Task i ran one round of `trials` measurements; `best` is its best latency now."""
        self.rounds[i] += 1
        self.trials[i] += trials
        self.best[i] = best
        self.history[i].append(best)
        self.failed_rounds[i] = self.failed_rounds[i] + 1 if best is None else 0

    def retire(self, i: int) -> None:
        self.active.discard(i)

    def objective(self) -> float | None:
        return estimated_latency(zip(self.weights, self.best))

    def next_task(self, busy=()) -> int | None:
        """The task to tune next, or None when every task has retired. Tasks in `busy`
        (a batch of theirs is still being measured) are passed over while others are active."""
        if not self.active:
            return None
        idle = self.active - set(busy)
        if not idle or idle == self.active:
            return self._pick()
        active, self.active = self.active, idle
        try:
            return self._pick()
        finally:
            self.active = active

    @abc.abstractmethod
    def _pick(self) -> int:
        ...


class RoundRobinScheduler(TaskScheduler):
    name = "round-robin"

    def __init__(self, tasks, seed: int = 0):
        super().__init__(tasks, seed)
        self.cursor = 0

    def _pick(self) -> int:
        for _ in range(self.n):
            i = self.cursor % self.n
            self.cursor += 1
            if i in self.active:
                return i
        raise AssertionError("no active task")


class GradientScheduler(TaskScheduler):
    name = "gradient"

    def __init__(self, tasks, seed: int = 0, alpha: float = 0.2, beta: float = 2.0, window: int = 3,
                 eps: float = 0.05, warmup_rounds: int = 1, max_failed_rounds: int = 3, patience: int = 4,
                 stagnant_damping: float = 0.5):
        super().__init__(tasks, seed)
        self.patience, self.stagnant_damping = patience, stagnant_damping
        self.alpha, self.beta, self.window, self.eps = alpha, beta, window, eps
        self.warmup_rounds, self.max_failed_rounds = warmup_rounds, max_failed_rounds

    def update(self, i: int, trials: int, best: float | None) -> None:
        super().update(i, trials, best)
        if self.failed_rounds[i] >= self.max_failed_rounds:
            self.retire(i)

    def gradient(self, i: int) -> float:
        best = self.best[i]
        if best is None:
            return float("-inf")       # no valid result yet: finding one is worth most
        hist = [b for b in self.history[i] if b is not None]
        backward = (hist[-1] - hist[-1 - self.window]) / self.window if len(hist) > self.window else 0.0
        g1 = best - best / max(self.rounds[i], 1)
        g2 = float("inf")
        similar = [j for j in range(self.n) if self.groups[j] == self.groups[i] and self.best[j]]
        if len(similar) > 1:
            top = max(self.flops[j] / self.best[j] for j in similar)
            g2 = self.beta * self.flops[i] / top
        forward = min(g1, g2) - best
        damp = self.stagnant_damping if self.stagnant(i) else 1.0
        return damp * self.weights[i] * (self.alpha * backward + (1 - self.alpha) * forward)

    def stagnant(self, i: int) -> bool:
        hist = [b for b in self.history[i] if b is not None]
        return bool(self.patience) and len(hist) > self.patience and hist[-1] >= hist[-1 - self.patience]

    def _pick(self) -> int:
        active = sorted(self.active)
        cold = [i for i in active if self.rounds[i] < self.warmup_rounds]
        if cold:
            return cold[0]
        if self.rng.random() < self.eps:
            return self.rng.choice(active)
        grads = [self.gradient(i) for i in active]
        if max(grads) == min(grads):
            return self.rng.choice(active)
        return active[min(range(len(active)), key=lambda k: grads[k])]


SCHEDULERS = {"gradient": GradientScheduler, "round-robin": RoundRobinScheduler}


def make_scheduler(name: str, tasks, seed: int = 0, **kw) -> TaskScheduler:
    if name not in SCHEDULERS:
        from ir.errors import TensortuneError
        raise TensortuneError(f"unknown --scheduler '{name}' (choose from: {', '.join(SCHEDULERS)})")
    return SCHEDULERS[name](tasks, seed=seed, **kw)

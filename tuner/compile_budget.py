"""How many new code shapes the next batch may compile (cost-aware batches).

A candidate whose code shape is built costs one run (check and timing, a fraction of a
second); a new code shape costs a compile (seconds of one builder's CPU). Left alone, a
model-guided search proposes a new code shape for nearly every candidate and the tuner
spends nearly all its time compiling. `CompileBudget` keeps compiling to `share` of
the tuning wall time: each batch earns compile seconds in proportion to the time its
candidates took to run (`share / (1 - share)` of it, times the builders that compile at
once), each batch spends the compile seconds its new code shapes really took, and the
next batch may hold as many new code shapes as the credit pays for at the recent cost
of one, in multiples of the builders (they compile side by side). What a code shape
costs is learned from the results (`compile_s`), so a warm kernel cache, where a "new"
code shape only loads, makes them cheap; a run's cost is its measured `run_s`, or
(a runner that reports none, such as replay) what the timing options imply.

A strategy that cannot fill a batch within the budget gets one new code shape (see
`tuner.tune._next_configs`): a task always makes progress.
"""
from __future__ import annotations

import statistics

FREE_S = 0.05   # a "compile" cheaper than this is a cache load


class CompileBudget:
    def __init__(self, share: float, builders: int = 1, run_s: float = 0.2, compile_s: float = 3.0,
                 window: int = 16):
        if not 0.0 < share < 1.0:
            from ir.errors import TensortuneError
            raise TensortuneError(f"--compile-share must be between 0 and 1 (exclusive), got {share}")
        self.share, self.builders = share, max(1, int(builders))
        self.default_run_s, self.default_compile_s = run_s, compile_s
        self.window = window
        # seconds of the recent new code shapes' compiles, starting from two of the prior: a task's
        # first batch also compiles the helpers (packing, padding) once per machine, and must not
        # alone make every later code shape look that dear
        self.compile_costs: list[float] = [compile_s, compile_s]
        self.credit = self.builders * compile_s  # the first batch compiles on every builder
        self.compiled = 0                         # new code shapes paid for
        self.spent_s = 0.0

    @property
    def code_cost(self) -> float:
        """Seconds one new code shape costs now: the median of the recent ones."""
        return statistics.median(self.compile_costs[-self.window:])

    def allowance(self) -> int:
        """New code shapes the next batch may hold: what the credit pays for, in whole
        rounds of the builders (0 while it pays for less than one round)."""
        if self.code_cost < FREE_S:   # compiles that cost nothing (a warm kernel cache): no limit
            return 1 << 20
        return self.builders * int(max(self.credit, 0.0) // (self.builders * self.code_cost))

    def observe(self, results: list, new_codes: dict) -> None:
        """A finished batch: `results` (MeasureResults) and `new_codes` (code key -> compile
        seconds of the code shapes this batch built for the first time)."""
        run = sum(r.run_s if r.run_s > 0 else self.default_run_s for r in results)
        self.credit += self.share / (1.0 - self.share) * self.builders * run
        for cost in new_codes.values():
            self.compile_costs.append(cost)
            self.credit -= cost
            self.spent_s += cost
        self.compiled += len(new_codes)
        self.credit = min(self.credit, 4 * self.builders * max(self.code_cost, FREE_S))   # no hoard for a burst later

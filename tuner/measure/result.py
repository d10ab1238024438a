"""What goes into a measurement and what comes out. Workers never raise: every
outcome, failures included, is a `MeasureResult` with a typed status."""
from __future__ import annotations

from dataclasses import dataclass, field

from database.record import (  # noqa: F401  (the status list is the database's: re-exported for the tuner)
    BUILD_TIMEOUT, COMPILE_ERROR, OK, RUN_TIMEOUT, RUNTIME_ERROR, STATUSES, WORKER_DIED, WRONG_RESULT)
from ir.workload import Workload
from schedules.space import Config


@dataclass(frozen=True)
class MeasureInput:
    workload: Workload
    template: str
    config: Config
    fault: str = ""   # test-only hook: "crash", "hang", "sigkill" make the worker misbehave on purpose


@dataclass
class MeasureResult:
    input: MeasureInput
    status: str
    latencies: list[float] = field(default_factory=list)   # seconds per call, one per repeat
    error: str = ""
    compile_s: float = 0.0
    run_s: float = 0.0
    target: dict | None = None   # Target.describe() of the machine that measured it (None: not measured)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def median(self) -> float | None:
        if not self.ok or not self.latencies:
            return None
        s = sorted(self.latencies)
        n = len(s)
        return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the repeats: how noisy this timing was."""
        m = self.median
        return (max(self.latencies) - min(self.latencies)) / m if m else None

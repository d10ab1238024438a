"""Builder and Runner interfaces. The tuning loop knows only these; they are created
by name (`tuner.measure.registry`): `local` (worker processes on this machine) is
built in, and a Ray implementation registers as `ray`.

A builder compiles a batch and hands back each candidate's `codegen.Kernel` (data:
the lowered template and the backend's artifact, which pickles); a runner ships
that kernel to the process or machine that times it, which loads the artifact and
never compiles. A runner measures up to `capacity` batches at once (one per
machine it drives): the loop `submit`s that many and takes `next_result` as each
candidate finishes, whichever batch it belongs to.
"""
from __future__ import annotations

import abc
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from tuner.measure.result import OK, MeasureInput, MeasureResult

_tickets = itertools.count(1)


@dataclass
class BuildResult:
    status: str          # ok | compile_error | build_timeout | worker_died
    error: str = ""
    compile_s: float = 0.0
    cached: bool = False     # loaded from the kernel cache: no compile happened
    kernel: object = None    # codegen.Kernel when status is ok (None from builders that build nothing)

    @property
    def ok(self) -> bool:
        return self.status == OK


class Builder(abc.ABC):
    parallel: int = 1   # candidates' code shapes it compiles at once (the loop's compile budget counts in these)

    @abc.abstractmethod
    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        """Compile candidates (in parallel where possible); one result per input."""

    def close(self) -> None:
        pass


class Runner(abc.ABC):
    """Checks and times built candidates. Subclasses implement `run` (and `stream` when
    they can give results one by one); a runner over several machines also sets
    `capacity` and overrides `submit`/`next_result` so that its batches run at once."""

    capacity: int = 1   # batches measured at the same time (the loop keeps this many in flight)

    @abc.abstractmethod
    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        """Check and time built candidates, one at a time per host; failed builds pass through."""

    def stream(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> Iterator[MeasureResult]:
        """`run`, one result at a time as each candidate finishes (in input order), so the
        tuner stores each before the next is timed. Runners that can should override it."""
        yield from self.run(inputs, builds)

    def submit(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> int:
        """Start measuring one batch; returns its ticket. The default starts nothing: its
        `stream` runs in the caller's thread as `next_result` asks, batch after batch,
        so on one host no timing ever overlaps another (or a compile)."""
        ticket = next(_tickets)
        self.__dict__.setdefault("_queued", deque()).append((ticket, iter(self.stream(inputs, builds))))
        return ticket

    def next_result(self) -> tuple[int, MeasureResult]:
        """(ticket, result) of the next candidate to finish among the submitted batches;
        blocks until one does. Each batch gives exactly one result per input."""
        queued = self.__dict__.get("_queued")
        while queued:
            ticket, results = queued[0]
            r = next(results, None)
            if r is not None:
                return ticket, r
            queued.popleft()
        raise RuntimeError("next_result: no batch in flight")

    def close(self) -> None:
        pass


def measure(builder: Builder, runner: Runner, inputs: list[MeasureInput]) -> list[MeasureResult]:
    return runner.run(inputs, builder.build(inputs))

"""Builder and Runner interfaces. The tuning loop knows only these; a local
process pool implements them now, and a Ray implementation drops in later."""
from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass

from tuner.measure.result import MeasureInput, MeasureResult


@dataclass
class BuildResult:
    status: str          # ok | compile_error | build_timeout | worker_died
    error: str = ""
    compile_s: float = 0.0
    cached: bool = False     # loaded from the kernel cache: no compile happened


class Builder(abc.ABC):
    @abc.abstractmethod
    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        """Compile candidates (in parallel where possible); one result per input."""

    def close(self) -> None:
        pass


class Runner(abc.ABC):
    @abc.abstractmethod
    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        """Check and time built candidates, one at a time per host; failed builds pass through."""

    def stream(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> Iterator[MeasureResult]:
        """`run`, one result at a time as each candidate finishes (in input order), so the
        tuner stores each before the next is timed. Runners that can should override it."""
        yield from self.run(inputs, builds)

    def close(self) -> None:
        pass


def measure(builder: Builder, runner: Runner, inputs: list[MeasureInput]) -> list[MeasureResult]:
    return runner.run(inputs, builder.build(inputs))

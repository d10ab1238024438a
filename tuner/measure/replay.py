"""Replay measurement: a Builder and Runner that look latencies up in a recorded table
instead of compiling and timing, so search strategies, the scheduler and the tuning
loop are tested (and benchmarked) fast and deterministically, without a compiler.

A table is a JSON file written by `experiments/convergence/record_dataset.py` from
real measurements of the dense template: the workload, the recorded knobs (a subspace
of the template's space) and a latency per config index (null = the config failed).
`ReplayTemplate` wraps the real template so that tuning sees exactly the recorded
subspace; lowering (for loop-nest features) goes to the real template.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ir.workload import Workload
from schedules import get_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Template
from tuner.measure.base import Builder, BuildResult, Runner
from tuner.measure.result import OK, RUNTIME_ERROR, MeasureInput, MeasureResult


@dataclass
class Table:
    workload: Workload
    template: str
    space: ConfigSpace
    latency: list            # seconds per config index, None for failures
    compile_s: dict          # str(code key) -> seconds of the real compile

    @classmethod
    def load(cls, path) -> "Table":
        d = json.loads(Path(path).read_text())
        space = ConfigSpace([Knob(n, tuple(o), bool(cs)) for n, o, cs in d["knobs"]])
        lat = [None if v is None else v * 1e-6 for v in d["latency_us"]]
        if len(lat) != len(space):
            raise ValueError(f"{path}: {len(lat)} latencies for a space of {len(space)} configs")
        return cls(Workload.from_json(d["workload"]), d["template"], space, lat, d.get("compile_s", {}))

    def lookup(self, cfg: Config) -> float | None:
        return self.latency[self.space.index_of(cfg)]

    @property
    def best(self) -> float:
        return min(v for v in self.latency if v is not None)


class ReplayTemplate(Template):
    """The real template, restricted to the recorded subspace of each recorded workload."""

    def __init__(self, tables: list[Table]):
        self.real = get_template(tables[0].template)
        self.name, self.version = self.real.name, self.real.version
        self.tables = {t.workload.key: t for t in tables}

    def matches(self, wl) -> bool:
        return wl.key in self.tables

    def space(self, wl) -> ConfigSpace:
        return self.tables[wl.key].space if wl.key in self.tables else self.real.space(wl)

    def default_config(self, wl) -> Config:
        space, want = self.space(wl), self.real.default_config(wl).to_json()
        values = {}
        for k in space.knobs:   # the recorded option nearest to the real default
            v = want[k.name]
            values[k.name] = v if v in k.options else min(
                k.options, key=lambda o: abs(o - v) if isinstance(o, (int, float)) else o != v)
        return Config(values)

    def lower(self, wl, cfg):
        return self.real.lower(wl, cfg)


class ReplayBuilder(Builder):
    """Builds nothing; reports the recorded compile time once per new code shape."""

    def __init__(self, tables: list[Table]):
        self.tables = {t.workload.key: t for t in tables}
        self.built: set = set()

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        out = []
        for inp in inputs:
            t = self.tables[inp.workload.key]
            key = t.space.code_key(inp.config)
            cached = key in self.built
            self.built.add(key)
            out.append(BuildResult(OK, compile_s=0.0 if cached else float(t.compile_s.get(str(key), 0.0)),
                                   cached=cached))
        return out


class ReplayRunner(Runner):
    """Answers with the recorded latency; a failure recorded as null replays as a runtime error.
    `calls` counts candidates looked up (what a real runner would have timed)."""

    def __init__(self, tables: list[Table], repeat: int = 3):
        self.tables = {t.workload.key: t for t in tables}
        self.repeat = repeat
        self.calls = 0

    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        out = []
        for inp, b in zip(inputs, builds):
            self.calls += 1
            if b.status != OK:
                out.append(MeasureResult(inp, b.status, error=b.error, compile_s=b.compile_s))
                continue
            t = self.tables.get(inp.workload.key)
            if t is None:
                out.append(MeasureResult(inp, RUNTIME_ERROR, error="workload not in the replay table"))
                continue
            try:
                lat = t.lookup(inp.config)
            except (KeyError, ValueError) as e:
                out.append(MeasureResult(inp, RUNTIME_ERROR, error=f"config not in the replay table: {e}"))
                continue
            if lat is None:
                out.append(MeasureResult(inp, RUNTIME_ERROR, error="recorded failure", compile_s=b.compile_s))
            else:
                out.append(MeasureResult(inp, OK, latencies=[lat] * self.repeat, compile_s=b.compile_s))
        return out

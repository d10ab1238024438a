"""Replay fixtures: tasks of the dense template whose measurements come from tables
recorded on real kernels (experiments/convergence/data, written by
experiments/convergence/record_dataset.py), so the tuner's logic runs in
milliseconds, deterministically, without compiling anything."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from codegen.target import Target
from tuner.measure.replay import ReplayBuilder, ReplayRunner, ReplayTemplate, Table
from tuner.task import Task

DATA = Path(__file__).resolve().parents[1] / "experiments" / "convergence" / "data"
SHAPES = ("128x256x1024", "128x1024x256", "256x256x256")
# a fixed target, so replayed records never mix with this machine's real ones
TARGET = Target("cpu", "replay", "replay", "avx512f,fma", 2, "0.0", "0.0")


@lru_cache(maxsize=None)
def table(shape: str) -> Table:
    return Table.load(DATA / f"dense_{shape}.json")


def replay(shapes=SHAPES, weights=None):
    """(tasks, builder, runner) for the given recorded shapes. The template knows every
    recorded shape, so records of the others read back in their recorded space."""
    tables = [table(s) for s in shapes]
    template = ReplayTemplate([table(s) for s in SHAPES])
    weights = weights or [1] * len(tables)
    tasks = [Task(t.workload, template, w, f"dense:{s}") for t, s, w in zip(tables, shapes, weights)]
    return tasks, ReplayBuilder(tables), ReplayRunner(tables)


def trials_to_reach(history: list, target: float) -> int | None:
    """1-based index of the first trial whose best-so-far latency is <= target."""
    for i, best in enumerate(history):
        if best is not None and best <= target:
            return i + 1
    return None

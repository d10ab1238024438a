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
TARGET = Target.make("cpu", cpu="replay", cpu_name="replay", features="avx512f,fma", cores=2, threads=2,
                     numba="0.0", llvmlite="0.0")


@lru_cache(maxsize=None)
def table(name: str) -> Table:
    """A recorded table by file stem ("conv2d_resnet18_layer1") or dense shape ("128x256x1024")."""
    path = DATA / f"{name}.json"
    return Table.load(path if path.exists() else DATA / f"dense_{name}.json")


def replay(shapes=SHAPES, weights=None):
    """(tasks, builder, runner) for the given recorded tables (one template). For dense the
    template knows every recorded shape, so records of the others read back in their space."""
    tables = [table(s) for s in shapes]
    known = [table(s) for s in SHAPES] if tables[0].template == "dense" else tables
    template = ReplayTemplate(known + [t for t in tables if t not in known])
    weights = weights or [1] * len(tables)
    tasks = [Task(t.workload, template, w, f"{t.template}:{s}") for t, s, w in zip(tables, shapes, weights)]
    return tasks, ReplayBuilder(tables), ReplayRunner(tables)


def trials_to_reach(history: list, target: float) -> int | None:
    """1-based index of the first trial whose best-so-far latency is <= target."""
    for i, best in enumerate(history):
        if best is not None and best <= target:
            return i + 1
    return None

"""Tasks: one per distinct fused subgraph (workload) of a model at the tuned shapes."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ir.graph import Graph
from ir.fusion import FusedSubgraph, partition
from ir.shapes import DimRange
from ir.errors import ShapeError
from ir.workload import Workload, make_workload
from schedules import Template, find_template

DEFAULT_DIM_SIZE = 32


@dataclass
class Task:
    workload: Workload
    template: Template
    weight: int          # how many times the subgraph occurs in the model (at this shape)
    name: str

    @property
    def flops(self) -> int:
        return self.workload.flops()


def shape_points(dims: dict[str, DimRange], shapes: dict[str, list[int]] | None = None) -> list[dict[str, int]]:
    """The concrete dim sizes to tune for: the product of `--shape` values; a dim
    without any is tuned at 32 clamped into its declared range."""
    shapes = dict(shapes or {})
    unknown = set(shapes) - set(dims)
    if unknown:
        raise ShapeError(f"--shape names {sorted(unknown)} are not dynamic dims of the model (it has: {sorted(dims) or 'none'})")
    axes = []
    for name, rng in dims.items():
        values = shapes.get(name) or [min(max(DEFAULT_DIM_SIZE, rng.lo), rng.hi)]
        for v in values:
            rng.check(v, "--shape: ")
        axes.append([(name, v) for v in values])
    return [dict(p) for p in itertools.product(*axes)] if axes else [{}]


def extract_tasks(g: Graph, points: list[dict[str, int]],
                  subgraphs: list[FusedSubgraph] | None = None) -> tuple[list[Task], list[FusedSubgraph]]:
    """(tasks, subgraphs that no template covers: they run on the reference path)."""
    subgraphs = subgraphs if subgraphs is not None else partition(g)
    tasks: dict[str, Task] = {}
    uncovered = []
    for sizes in points:
        for sg in subgraphs:
            wl = make_workload(g, sg, sizes)
            if wl.key in tasks:
                tasks[wl.key].weight += 1
                continue
            t = find_template(wl)
            if t is None:
                if sg not in uncovered:
                    uncovered.append(sg)
                continue
            tasks[wl.key] = Task(wl, t, 1, f"{t.name}:{wl.describe()}")
    return list(tasks.values()), uncovered

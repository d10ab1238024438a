"""Tasks: one per distinct fused subgraph (workload) of a model at the tuned shapes."""
from __future__ import annotations

from dataclasses import dataclass

from ir.graph import Graph
from ir.fusion import FusedSubgraph, partition
from ir.points import shape_points  # noqa: F401  (re-exported for the tuner)
from ir.shapes import UnboundDimsError
from ir.workload import Workload, make_workload
from schedules import Template, find_template

@dataclass
class Task:
    workload: Workload
    template: Template
    weight: int          # how many times the subgraph occurs in the model (at this shape)
    name: str

    @property
    def flops(self) -> int:
        return self.workload.flops()


def extract_tasks(g: Graph, points: list[dict[str, int]], subgraphs: list[FusedSubgraph] | None = None,
                  kind: str = "cpu") -> tuple[list[Task], list[FusedSubgraph]]:
    """(tasks, subgraphs that no template of `kind` covers: on a GPU they run CPU kernels,
    on the CPU the reference path)."""
    subgraphs = subgraphs if subgraphs is not None else partition(g)
    tasks: dict[str, Task] = {}
    uncovered = []
    for sizes in points:
        for sg in subgraphs:
            try:
                wl = make_workload(g, sg, sizes)
            except UnboundDimsError:  # shapes only a run tells: not tunable ahead
                if sg not in uncovered:
                    uncovered.append(sg)
                continue
            if wl.key in tasks:
                tasks[wl.key].weight += 1
                continue
            t = find_template(wl, kind)
            if t is None:
                if sg not in uncovered:
                    uncovered.append(sg)
                continue
            tasks[wl.key] = Task(wl, t, 1, f"{t.name}:{wl.describe()}")
    return list(tasks.values()), uncovered

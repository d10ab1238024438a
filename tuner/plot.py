"""Convergence plots: the best latency of each task, and the estimated model latency
(Σ weight × best), against the trial number of the run.

The data (`Convergence`) comes from a run's reports (`from_reports`, what `tune --plot`
draws) or from database records in insertion order (`from_records`, what `tune-db
plot` draws); `draw` writes it as a PNG with matplotlib's Agg canvas (no display, no
global pyplot state). matplotlib is the optional extra `plot`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ir.errors import TensortuneError
from tuner.scheduler import estimated_latency


class PlotError(TensortuneError):
    """matplotlib is missing, or the plot cannot be written."""


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotError("plotting needs matplotlib: pip install 'tensortune[plot]'") from None


@dataclass
class Convergence:
    names: list[str]                 # per task
    weights: list[int]               # occurrences of each task in the model
    best: list[list]                 # per task: best latency (s) after each of its trials (None: no result yet)
    order: list[int]                 # the task of each trial, in the order they were measured
    start: list | None = None        # per task: best known before the first trial (stored, on resume)

    def task_series(self, j: int) -> tuple[list[int], list]:
        """(trial numbers of the run, 1-based, at which task j was measured; its best after each)."""
        xs = [n + 1 for n, t in enumerate(self.order) if t == j]
        return xs, list(self.best[j])

    def estimate(self) -> list:
        """Σ weight × best after each trial of `order`; None while some task has no result."""
        current = list(self.start) if self.start else [None] * len(self.names)
        seen = [0] * len(self.names)
        out = []
        for t in self.order:
            current[t] = self.best[t][seen[t]]
            seen[t] += 1
            out.append(estimated_latency(zip(self.weights, current)))
        return out


def from_reports(reports) -> Convergence:
    """The convergence of a `tune_tasks` run (its `TuneReports`)."""
    return Convergence([r.task.name for r in reports], [r.task.weight for r in reports],
                       [list(r.history) for r in reports], list(reports.order), [r.initial for r in reports])


def best_so_far(records) -> list:
    """Best ok median after each record (records in the order they were measured)."""
    best, out = None, []
    for r in records:
        if r.status == "ok" and r.median is not None and (best is None or r.median < best):
            best = r.median
        out.append(best)
    return out


def from_records(tasks: list[tuple[str, int, list]]) -> Convergence:
    """The convergence of stored records: (name, weight, records) per task; trials are
    numbered in insertion order (record ids) across all tasks."""
    merged = sorted((r.id, j) for j, (_, _, recs) in enumerate(tasks) for r in recs)
    ordered = [sorted(recs, key=lambda r: r.id) for _, _, recs in tasks]
    return Convergence([n for n, _, _ in tasks], [w for _, w, _ in tasks], [best_so_far(recs) for recs in ordered],
                       [j for _, j in merged])


def draw(conv: Convergence, path, title: str = "") -> None:
    """Write the plot as a PNG: best latency per task vs trials (and, for several tasks,
    the estimated model latency vs trials below it)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    several = len(conv.names) > 1
    fig = Figure(figsize=(9, 7 if several else 4.5), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2 if several else 1, 1, sharex=True, squeeze=False)[:, 0]
    ax = axes[0]
    for j, name in enumerate(conv.names):
        xs, ys = conv.task_series(j)
        pts = [(x, y * 1e3) for x, y in zip(xs, ys) if y is not None]
        if pts:
            line, = ax.step(*zip(*pts), where="post", marker=".", markersize=3, label=f"{conv.weights[j]}x {name}"[:70])
            if pts[-1][0] < len(conv.order):   # no more trials for this task: its best holds to the end
                ax.plot([pts[-1][0], len(conv.order)], [pts[-1][1]] * 2, ls=":", color=line.get_color())
    ax.set_ylabel("best latency per task (ms)")
    ax.set_title(title or "convergence")
    ax.grid(True, alpha=0.3)
    if conv.names and any(h.get_label() for h in ax.get_lines()):
        ax.legend(fontsize=7, loc="upper right")
    if several:
        est = [(n + 1, e * 1e3) for n, e in enumerate(conv.estimate()) if e is not None]
        if est:
            axes[1].step(*zip(*est), where="post", color="black")
        axes[1].set_ylabel("estimated model latency (ms)\nΣ weight × best")
        axes[1].grid(True, alpha=0.3)
    axes[-1].set_xlabel("trial")
    fig.tight_layout()
    try:
        fig.savefig(str(path), format="png")
    except OSError as e:
        raise PlotError(f"cannot write the plot to {path}: {e.strerror or e}") from None


def records_for_model(db, model, dims: list[str] | None = None, shapes: list[str] | None = None,
                      target: str | None = None) -> list[tuple[str, int, list]]:
    """(task name, weight, its records in insertion order) for every task of `model` at the
    shape points `shapes` (`--shape` flags; `dims`: `--dim` flags), as `tune` extracts them."""
    from ir import import_onnx, simplify
    from ir.shapes import parse_dim_ranges, parse_shape_points
    from tuner.task import extract_tasks, shape_points
    graph = simplify(import_onnx(model, parse_dim_ranges(dims)))
    tasks, _ = extract_tasks(graph, shape_points(graph.dims, parse_shape_points(shapes)))
    return [(t.name, t.weight, db.records(workload_key=t.workload.key, target_key=target)) for t in tasks]

"""The tuning loop: model → passes → partition → tasks → search + measure → database.

It knows only interfaces (SearchStrategy, Builder, Runner, Database); every
result is committed to the database as it arrives, so an interrupted run loses
nothing and a new run resumes from what is stored.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field

from codegen import Target, host_target
from database import Database, Record
from ir import import_onnx, simplify
from ir.errors import TensortuneError
from ir.shapes import DimRange
from tuner.measure import Builder, LocalBuilder, LocalRunner, MeasureInput, MeasureResult, Runner, measure
from tuner.search import make_strategy
from tuner.task import Task, extract_tasks, shape_points


@dataclass
class TuneOptions:
    trials: int = 64
    strategy: str = "random"
    batch_size: int = 8
    seed: int = 0
    early_stopping: int | None = None   # stop a task after this many trials without improvement
    resume: bool = True                  # skip configs the database already holds for this target
    progress: bool = True
    log_file: str | None = None
    build_timeout: float = 120.0
    run_timeout: float = 30.0
    repeat: int = 5
    min_repeat_ms: float = 20.0


@dataclass
class TaskReport:
    task: Task
    trials: int = 0
    failures: int = 0
    best: float | None = None            # seconds
    best_config: dict | None = None
    default: float | None = None         # latency of the template's default config
    since_best: int = 0
    history: list = field(default_factory=list)

    @property
    def gflops(self) -> float | None:
        return self.task.flops / self.best / 1e9 if self.best else None

    @property
    def speedup(self) -> float | None:
        return self.default / self.best if self.best and self.default else None


def to_record(r: MeasureResult, target: Target, strategy: str, template_version: int) -> Record:
    wl = r.input.workload
    return Record(workload=wl.to_json(), workload_key=wl.key, signature=wl.signature, family=wl.family,
                  template=r.input.template, template_version=template_version, target=target.describe(),
                  config=r.input.config.to_json(), status=r.status, latencies=list(r.latencies), median=r.median,
                  spread=r.spread, error=r.error[:2000], compile_s=r.compile_s, strategy=strategy, flops=wl.flops())


class _Log:
    def __init__(self, path: str | None):
        self.f = open(path, "a") if path else None

    def write(self, **event) -> None:
        if self.f:
            self.f.write(json.dumps({"time": time.time(), **event}) + "\n")
            self.f.flush()

    def close(self):
        if self.f:
            self.f.close()


def tune_tasks(tasks: list[Task], db: Database, opts: TuneOptions, target: Target | None = None,
               builder: Builder | None = None, runner: Runner | None = None) -> list[TaskReport]:
    """Spend `opts.trials` measurements over `tasks`, round-robin in batches."""
    target = target or host_target()
    own = builder is None
    builder = builder or LocalBuilder(timeout=opts.build_timeout)
    runner = runner or LocalRunner(timeout=opts.run_timeout, repeat=opts.repeat, min_repeat_ms=opts.min_repeat_ms)
    reports = [TaskReport(t) for t in tasks]
    strategies = {}
    for rep in reports:
        t = rep.task
        space = t.template.space(t.workload)
        known = db.measured(t.workload.key, target.key) if opts.resume else {}
        strategies[t.workload.key] = make_strategy(opts.strategy, space, seed=opts.seed, measured=set(known))
        oks = [m for m in known.values() if m is not None]
        rep.best = min(oks) if oks else None
        rep.default = known.get(t.template.default_config(t.workload).hash)
        if opts.resume and rep.best is not None:
            best = db.best(t.workload.key, target.key, 1)
            rep.best_config = best[0].config if best else None
    log = _Log(opts.log_file)
    bar = _progress(opts)
    spent, active = 0, list(reports)
    try:
        while spent < opts.trials and active:
            for rep in list(active):
                if spent >= opts.trials:
                    break
                n = min(opts.batch_size, opts.trials - spent)
                configs = _next_configs(rep, strategies[rep.task.workload.key], n)
                if not configs:
                    active.remove(rep)
                    continue
                inputs = [MeasureInput(rep.task.workload, rep.task.template.name, c) for c in configs]
                results = measure(builder, runner, inputs)
                for r in results:
                    db.add(to_record(r, target, opts.strategy, rep.task.template.version))
                    _account(rep, r, default=r.input.config == rep.task.template.default_config(rep.task.workload))
                    log.write(event="measure", task=rep.task.name, workload=rep.task.workload.key,
                              config=r.input.config.to_json(), status=r.status, median=r.median,
                              error=r.error[:200], best=rep.best)
                strategies[rep.task.workload.key].update(results)
                spent += len(results)
                if bar is not None:
                    bar.update(len(results))
                    bar.set_postfix_str(_status_line(reports, rep))
                if opts.early_stopping and rep.since_best >= opts.early_stopping:
                    active.remove(rep)
    finally:
        if bar is not None:
            bar.close()
        log.close()
        if own:
            builder.close()
            runner.close()
    return reports


def _next_configs(rep: TaskReport, strategy, n: int):
    """The default config first (to report speedups), then what the strategy proposes."""
    default = rep.task.template.default_config(rep.task.workload)
    first = [] if default.hash in strategy.measured else [default]
    strategy.measured |= {c.hash for c in first}
    return first + strategy.propose(n - len(first))


def _account(rep: TaskReport, r: MeasureResult, default: bool) -> None:
    rep.trials += 1
    if not r.ok:
        rep.failures += 1
    m = r.median
    if default and m is not None:
        rep.default = m
    if m is not None and (rep.best is None or m < rep.best):
        rep.best, rep.best_config, rep.since_best = m, r.input.config.to_json(), 0
    else:
        rep.since_best += 1
    rep.history.append(rep.best)


def _progress(opts: TuneOptions):
    if not opts.progress:
        return None
    from tqdm import tqdm
    return tqdm(total=opts.trials, desc="tuning", unit="trial", file=sys.stderr, dynamic_ncols=True)


def estimated_latency(reports: list[TaskReport]) -> float | None:
    """Σ occurrences × best latency over tasks: the model's estimated tuned latency."""
    if any(r.best is None for r in reports):
        return None
    return sum(r.task.weight * r.best for r in reports)


def _status_line(reports, rep) -> str:
    g = rep.gflops
    est = estimated_latency(reports)
    return (f"{rep.task.template.name} best {g:.1f} GFLOP/s" if g else f"{rep.task.template.name} no result yet") + \
        (f" | model est. {est * 1e3:.3f} ms" if est else "")


def summary_table(reports: list[TaskReport]) -> str:
    head = ("task", "x", "trials", "fail", "best", "GFLOP/s", "default", "speedup")
    rows = [head]
    for r in reports:
        rows.append((r.task.name[:60], str(r.task.weight), str(r.trials), str(r.failures),
                     _ms(r.best), f"{r.gflops:.1f}" if r.gflops else "-", _ms(r.default),
                     f"{r.speedup:.2f}x" if r.speedup else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    est = estimated_latency(reports)
    if est:
        lines.append(f"estimated model latency (sum of occurrences x best): {_ms(est)}")
    return "\n".join(lines)


def _ms(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def check_runnable(graph) -> None:
    """Ops of custom domains that tensortune has no implementation for cannot run at all."""
    from ir.errors import UnsupportedOpError
    from ir.ops import OPS
    bad = [n for n in graph.nodes if n.op not in OPS and n.attrs.get("_domain")]
    if bad:
        n = bad[0]
        raise UnsupportedOpError(f"op '{n.op}' of domain '{n.attrs['_domain']}' (node '{n.name}') is not supported "
                                 f"by tensortune" + (f" ({len(bad) - 1} more such nodes)" if len(bad) > 1 else ""))


def tune_model(model, db: Database, opts: TuneOptions, dims: dict[str, DimRange] | None = None,
               shapes: dict[str, list[int]] | None = None, target: Target | None = None,
               builder: Builder | None = None, runner: Runner | None = None):
    """Import, simplify, partition and tune a model. Returns (graph, points, reports, uncovered subgraphs)."""
    if opts.trials <= 0:
        raise TensortuneError(f"--trials must be a positive number, got {opts.trials}")
    graph = simplify(import_onnx(model, dims))
    check_runnable(graph)
    points = shape_points(graph.dims, shapes)
    tasks, uncovered = extract_tasks(graph, points)
    reports = tune_tasks(tasks, db, opts, target, builder, runner)
    return graph, points, reports, uncovered

"""Measure callbacks: what happens after each result and each batch of the tuning loop
(as MetaSchedule's measure callbacks).

`tune_tasks` runs `default_callbacks(opts)` and then the caller's, in list order:
`on_start(ctx)` once, `on_result(ctx, i, result)` for each result of task i as it
arrives (shielded from SIGINT/SIGTERM, after the loop accounted for it in
`ctx.reports[i]`), `on_batch(ctx, i, results)` when a batch of task i is complete
(`ctx.batch` holds its build/run times), and `on_end(ctx)` once, also after an
interrupt. `ctx` is the run's `tuner.tune.TuneContext`.

`SaveToDatabase` comes first, so a result is stored before anything logs it.
"""
from __future__ import annotations

import json
import sys
import time

from ir.errors import redact
from tuner.tune import _status_line, estimated_latency, to_record


class MeasureCallback:
    """Override what you need; every hook does nothing by default."""

    def on_start(self, ctx) -> None:
        pass

    def on_result(self, ctx, i: int, result) -> None:
        pass

    def on_batch(self, ctx, i: int, results: list) -> None:
        pass

    def on_end(self, ctx) -> None:
        pass


class SaveToDatabase(MeasureCallback):
    """Commit each result the moment it exists (under the target that measured it)."""

    def on_result(self, ctx, i, result):
        t0 = time.perf_counter()
        rep = ctx.reports[i]
        ctx.db.add_many([to_record(result, ctx.target, ctx.opts.strategy, rep.task.template.version)],
                        owner=ctx.owner)
        ctx.timing.db_s += time.perf_counter() - t0


class UpdateStrategy(MeasureCallback):
    """Feed a finished batch to its task's search strategy (the cost model learns here)."""

    def on_batch(self, ctx, i, results):
        t0 = time.perf_counter()
        ctx.strategies[i].update(results)
        ctx.timing.model_s += time.perf_counter() - t0


def share_results(i: int, results, reports, strategies) -> None:
    """Transfer within a run: results of task i become prior rows of the other
    model-guided tasks of the same template (other shapes learn from this one)."""
    src = strategies[i]
    if not hasattr(src, "featurize"):
        return
    rows = [(src.featurize.row(r.input.config), r.median, reports[i].task.workload.key) for r in results]
    for j, rep in enumerate(reports):
        if j != i and rep.task.template.name == reports[i].task.template.name and hasattr(strategies[j], "add_prior"):
            strategies[j].add_prior(rows)


class ShareTransfer(MeasureCallback):
    """`share_results` after each batch (`TuneOptions.transfer`)."""

    def on_batch(self, ctx, i, results):
        t0 = time.perf_counter()
        share_results(i, results, ctx.reports, ctx.strategies)
        ctx.timing.model_s += time.perf_counter() - t0


class JsonLog(MeasureCallback):
    """Machine-readable progress, one JSON object a line: start, measure (each result),
    early_stop, round (each batch), end. Secrets in URLs or errors are redacted."""

    def __init__(self, path: str):
        self.f = open(path, "a")

    def write(self, **event) -> None:
        if self.f is not None:
            self.f.write(redact(json.dumps({"time": time.time(), **event}, default=str)) + "\n")
            self.f.flush()

    def on_start(self, ctx):
        self.write(event="start", tasks=[r.task.name for r in ctx.reports], options=vars(ctx.opts),
                   target=ctx.target.key)

    def on_result(self, ctx, i, r):
        rep = ctx.reports[i]
        self.write(event="measure", task=rep.task.name, workload=rep.task.workload.key,
                   config=r.input.config.to_json(), status=r.status, median=r.median, spread=r.spread,
                   compile_s=r.compile_s, error=r.error[:200], best=rep.best)

    def on_batch(self, ctx, i, results):
        rep, b = ctx.reports[i], ctx.batch
        if b.early_stopped:
            self.write(event="early_stop", task=rep.task.name, trials=rep.trials)
        self.write(event="round", task=rep.task.name, trials=rep.trials, best=rep.best,
                   estimated_latency=estimated_latency(ctx.reports), candidates=len(results),
                   compiles=b.compiles, build_s=round(b.build_s, 3), run_s=round(b.run_s, 3))

    def on_end(self, ctx):
        if self.f is None:
            return
        reps = ctx.reports
        self.write(event="end", stopped=getattr(reps, "stopped", ""), timing=reps.timing.to_json(),
                   estimated_latency=estimated_latency(reps),
                   tasks=[{"task": r.task.name, "trials": r.trials, "best": r.best, "config": r.best_config}
                          for r in reps])
        self.f.close()
        self.f = None


class Progress(MeasureCallback):
    """A tqdm bar on stderr, advanced after each batch, with the best so far."""

    def __init__(self):
        self.bar = None

    def on_start(self, ctx):
        from tqdm import tqdm
        self.bar = tqdm(total=ctx.opts.trials, desc="tuning", unit="trial", file=sys.stderr, dynamic_ncols=True)

    def on_batch(self, ctx, i, results):
        self.bar.update(len(results))
        self.bar.set_postfix_str(_status_line(ctx.reports, ctx.reports[i], i))

    def on_end(self, ctx):
        if self.bar is not None:
            self.bar.close()


class ConvergencePlot(MeasureCallback):
    """Write the convergence plot (`tuner.plot`) of this run to `path` at the end."""

    def __init__(self, path: str):
        from tuner.plot import require_matplotlib
        require_matplotlib()   # before tuning, not after it
        self.path = path

    def on_end(self, ctx):
        from tuner.plot import draw, from_reports
        draw(from_reports(ctx.reports), self.path)


def default_callbacks(opts) -> list[MeasureCallback]:
    """The callbacks a run has without asking: store, learn, share (opts.transfer), log
    (opts.log_file), progress bar (opts.progress), plot (opts.plot)."""
    cbs: list[MeasureCallback] = [SaveToDatabase(), UpdateStrategy()]
    if opts.transfer:
        cbs.append(ShareTransfer())
    if opts.log_file:
        cbs.append(JsonLog(opts.log_file))
    if opts.progress:
        cbs.append(Progress())
    if opts.plot:
        cbs.append(ConvergencePlot(opts.plot))
    return cbs


__all__ = ["MeasureCallback", "SaveToDatabase", "UpdateStrategy", "ShareTransfer", "JsonLog", "Progress",
           "ConvergencePlot", "default_callbacks", "share_results"]

"""`tune-batch`: tune many models into one database as one batch, one job per model.

A subgraph that several models share (one workload key) is tuned once: the database
is the record of what is done. Every distinct task has a *share* of trials, fixed by
the command line: a model's `--trials` split over its tasks in whole batches, biggest
(occurrences x FLOPs) first, a shared task taking the largest share any of its models
gives it (`--trials-total`: the total split over the distinct tasks of the batch). A
task is tuned in the job of the first model that has it, up to its share of measured
configs for this target; a job measures only the tasks below their share, so

* a later model finds a shared task at its share and reuses its records;
* a task that another run, batch or `tune` already took to its share is not measured
  again;
* rerunning an interrupted batch continues where it stopped (a finished batch run
  again measures nothing): configs already stored are never measured twice, and the
  claims of a killed run are released or expire (see `tuner.tune`).

The runner is whatever `tune` would use (`--runner local|ray`, `--ray ADDRESS`): the
batch creates it once and every job measures through it.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, fields, replace

from codegen import Target
from database import Database
from ir.errors import TensortuneError
from codegen.backend import template_kind
from ir.settings import Settings, current, resolve
from tuner.callbacks import MeasureCallback
from tuner.task import Task, extract_tasks
from tuner.tune import TuneOptions, TuneReports, _ms, check_runnable


class BatchError(TensortuneError):
    """A batch that cannot start: no models, bad budgets, names that fit no model."""


@dataclass
class ModelJob:
    """One model of the batch: its tasks (with this model's occurrence counts)."""
    name: str
    tasks: list[Task]
    source: str = ""                      # the model file
    uncovered: list = field(default_factory=list)
    status: str = "pending"               # tuned | already tuned | stopped: ... | not started: ...
    measured: int = 0                     # measurements of this job in this run
    reports: TuneReports | None = None


@dataclass
class SharedTask:
    """One distinct workload of the batch and what the database holds of it."""
    task: Task                            # as the first model that has it sees it
    share: int                            # measured configs that make it done
    models: list[int]                     # the models that have it, in batch order
    stored_before: int = 0                # measured configs at the start of this run
    stored: int = 0                       # ... at the end
    measured: int = 0                     # measurements of this run
    best: float | None = None
    default: float | None = None

    @property
    def owner(self) -> int:
        """The model whose job tunes it."""
        return self.models[0]


@dataclass
class BatchReport:
    jobs: list[ModelJob]
    tasks: dict[str, SharedTask]          # workload key -> task
    target: Target
    stopped: str = ""                     # why the batch ended early ("" if every job ran)
    wall_s: float = 0.0

    @property
    def measured(self) -> int:
        return sum(j.measured for j in self.jobs)


# -- planning ---------------------------------------------------------------------------

def load_jobs(paths: list[str], dims=None, shapes=None, fallback: str | None = None) -> list[ModelJob]:
    """Import, simplify and partition every model before anything is tuned (a bad model
    fails the batch at once). `--dim`/`--shape` names apply to the models that have
    them; a name no model has is an error."""
    from ir import import_onnx, simplify
    from tuner.task import shape_points
    if not paths:
        raise BatchError("no models given")
    dims, shapes = dict(dims or {}), dict(shapes or {})
    jobs, seen_dims = [], set()
    for path in paths:
        names = _dim_params(path) if dims else set()
        graph = simplify(import_onnx(path, {k: v for k, v in dims.items() if k in names}))
        if not fallback:
            check_runnable(graph)
        seen_dims |= set(graph.dims)
        points = shape_points(graph.dims, {k: v for k, v in shapes.items() if k in graph.dims})
        tasks, uncovered = extract_tasks(graph, points, kind=template_kind(current().backend))
        jobs.append(ModelJob(_unique_name(graph.name, jobs), tasks, str(path), uncovered))
    unknown = sorted((set(dims) | set(shapes)) - seen_dims)
    if unknown:
        raise BatchError(f"--dim/--shape names {unknown} are dynamic dims of none of the models "
                         f"(they have: {sorted(seen_dims) or 'none'})")
    return jobs


def _dim_params(path) -> set[str]:
    """The named dims of a model's inputs, read without its weights."""
    import onnx
    from ir.onnx_import import load_onnx
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:
        proto = load_onnx(path)   # says in one line what is wrong with the file
    return {d.dim_param for vi in proto.graph.input if vi.type.HasField("tensor_type")
            for d in vi.type.tensor_type.shape.dim if d.dim_param}


def _unique_name(name: str, jobs: list[ModelJob]) -> str:
    taken = {j.name for j in jobs}
    out, k = name, 2
    while out in taken:
        out, k = f"{name}#{k}", k + 1
    return out


def split_trials(n: int, importance: list[float], batch_size: int) -> list[int]:
    """`n` trials over tasks in whole batches, round-robin from the most important task
    (the remainder, under one batch, goes to the next in line): the shares sum to n."""
    shares = [0] * len(importance)
    if not shares:
        return shares
    order = sorted(range(len(importance)), key=lambda i: -importance[i])
    batches, rest = divmod(n, batch_size)
    for j in range(batches):
        shares[order[j % len(order)]] += batch_size
    shares[order[batches % len(order)]] += rest
    return shares


def plan_shares(jobs: list[ModelJob], trials: int, batch_size: int, total: bool = False) -> dict[str, SharedTask]:
    """The distinct tasks of the batch with their shares (see the module docstring)."""
    tasks: dict[str, SharedTask] = {}
    for m, job in enumerate(jobs):
        for t in job.tasks:
            st = tasks.setdefault(t.workload.key, SharedTask(t, 0, []))
            st.models.append(m)
    if total:
        keys = list(tasks)
        imp = [sum(t.weight * t.flops for j in jobs for t in j.tasks if t.workload.key == k) for k in keys]
        for k, s in zip(keys, split_trials(trials, imp, batch_size)):
            tasks[k].share = s
        return tasks
    for job in jobs:
        for t, s in zip(job.tasks, split_trials(trials, [t.weight * t.flops for t in job.tasks], batch_size)):
            tasks[t.workload.key].share = max(tasks[t.workload.key].share, s)
    return tasks


# -- running ------------------------------------------------------------------------------

class BoundToShare(MeasureCallback):
    """Each task measures only up to its share of distinct configs (those stored before
    this run count): its claims are cut to what is missing, so a job spends exactly the
    trials its tasks lack, however the scheduler orders them (a task asked for more
    than it lacks gets a smaller batch; one at its share gets none and retires).
    Concurrent batches of the same models share the work: each counts the others'
    stored configs before every claim."""

    def __init__(self, shares: list[int], known: list[set[str]]):
        self.shares, self.known = shares, known

    def on_start(self, ctx):
        claim = ctx.claim_batch

        def bounded(i: int, n: int) -> list:
            # what other tuners on this database stored meanwhile counts too (a concurrent batch
            # of the same models); this task's own last batch is complete (one in flight at most)
            self.known[i] |= set(ctx.db.measured(ctx.reports[i].task.workload.key, ctx.target.key))
            return claim(i, min(n, self.shares[i] - len(self.known[i])))

        ctx.claim_batch = bounded

    def on_result(self, ctx, i, result):
        self.known[i].add(result.input.config.hash)


def tune_batch(jobs: list[ModelJob], db: Database, opts: TuneOptions, *, trials_total: int | None = None,
               target: Target | None = None, builder=None, runner=None, settings: Settings | None = None,
               callbacks=(), log=None) -> BatchReport:
    """Tune the jobs in order into `db`: each measures its tasks that are below their
    share (`opts.trials` per model, or `trials_total` for the whole batch);
    `opts.time_budget` counts for the whole batch. Builder and runner (names or
    instances, default `opts.builder`/`opts.runner`) are made once and shared by the
    jobs. `log(line)` hears what each job does. Ctrl-C stops the batch between two
    commits (KeyboardInterrupt propagates); run it again to continue."""
    from tuner.tune import make_stages, tune_tasks
    t_start = time.perf_counter()
    if not jobs:
        raise BatchError("no models given")
    trials = trials_total if trials_total is not None else opts.trials
    if not trials > 0:
        raise BatchError(f"--trials{'-total' if trials_total is not None else ''} must be a positive number, "
                         f"got {trials}")
    db.require_writable("store measurements")
    settings = resolve(settings)
    log = log or (lambda line: None)
    tasks = plan_shares(jobs, trials, opts.batch_size, total=trials_total is not None)
    owned, report = [], None
    try:
        builder, runner, target = make_stages(opts, settings, builder, runner, target, owned)   # shared by all jobs
        known = {k: set(db.measured(k, target.key)) for k in tasks}
        for k, st in tasks.items():
            st.stored_before = len(known[k])
        report = BatchReport(jobs, tasks, target)
        for m, job in enumerate(jobs):
            if report.stopped:
                job.status = f"not started: {report.stopped}"
                continue
            mine = [tasks[t.workload.key] for t in job.tasks if tasks[t.workload.key].owner == m]
            todo = [st for st in mine if len(known[st.task.workload.key]) < st.share]
            if not todo:
                job.status = "already tuned"
                log(f"{job.name}: nothing to measure (of its {len(job.tasks)} task(s), "
                    f"{len(job.tasks) - len(mine)} tuned with earlier models, the rest at their share)")
                continue
            left = None
            if opts.time_budget is not None:
                left = opts.time_budget - (time.perf_counter() - t_start)
                if left <= 0:
                    report.stopped = "time budget"
                    job.status = f"not started: {report.stopped}"
                    continue
            deficit = sum(st.share - len(known[st.task.workload.key]) for st in todo)
            # configs whose stored failure was transient are measured once more: trials, but no new config
            retries = sum(len(db.retryable(st.task.workload.key, target.key)) for st in todo)
            job_opts = replace(opts, trials=deficit + retries, time_budget=left)
            cap = BoundToShare([st.share for st in todo], [known[st.task.workload.key] for st in todo])
            log(f"{job.name}: tuning {len(todo)} of its {len(job.tasks)} task(s), {deficit} trials to go")
            job.status = "interrupted"
            reps = tune_tasks([st.task for st in todo], db, job_opts, target, builder, runner, settings=settings,
                              callbacks=[cap, *callbacks])
            job.reports = reps
            job.measured = sum(r.trials for r in reps)
            for st, r in zip(todo, reps):
                st.measured += r.trials
            job.status = "tuned"
            if reps.stopped == "time budget":
                job.status, report.stopped = "stopped: time budget", "time budget"
    finally:
        for stage in owned:
            stage.close()
        if report is not None:
            report.wall_s = time.perf_counter() - t_start
    _read_results(report, db)
    return report


def _read_results(report: BatchReport, db: Database) -> None:
    """Best, default and stored count of every task, from the database (whoever measured them)."""
    tk = report.target.key
    for key, st in report.tasks.items():
        measured = db.measured(key, tk)
        st.stored = len(measured)
        oks = [v for v in measured.values() if v is not None]
        st.best = min(oks) if oks else None
        st.default = measured.get(st.task.template.default_config(st.task.workload).hash)


# -- reporting ----------------------------------------------------------------------------

def _origin(report: BatchReport, m: int, st: SharedTask) -> str:
    if st.owner != m:
        return f"shared: tuned with {report.jobs[st.owner].name}"
    if st.measured:
        return "tuned" if not st.stored_before else f"tuned (resumed from {st.stored_before})"
    return "stored before" if st.stored_before else "not measured"


def model_latency(job: ModelJob, report: BatchReport) -> float | None:
    """Σ occurrences in this model × best latency of the task: its estimated tuned latency."""
    from tuner.scheduler import estimated_latency
    return estimated_latency((t.weight, report.tasks[t.workload.key].best) for t in job.tasks)


def summary_tables(report: BatchReport) -> str:
    """One table per model: its tasks, their shares and stored configs, best latency,
    where the result comes from; then the model's estimated latency."""
    out = []
    for m, job in enumerate(report.jobs):
        head = ("task", "x", "share", "stored", "measured", "best", "GFLOP/s", "speedup", "origin")
        rows = [head]
        for t in job.tasks:
            st = report.tasks[t.workload.key]
            g = t.flops / st.best / 1e9 if st.best else None
            sp = st.default / st.best if st.best and st.default else None
            rows.append((t.name[:60], str(t.weight), str(st.share), str(st.stored),
                         str(st.measured if st.owner == m else 0), _ms(st.best), f"{g:.1f}" if g else "-",
                         f"{sp:.2f}x" if sp else "-", _origin(report, m, st)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [f"model {job.name} ({job.source}): {job.status}, {job.measured} measurements this run"]
        lines += ["  ".join(c.ljust(w) if i in (0, len(head) - 1) else c.rjust(w)
                            for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
        lines.insert(2, "  ".join("-" * w for w in widths))
        est = model_latency(job, report)
        lines.append(f"estimated model latency (sum of occurrences x best): {_ms(est)}")
        if job.uncovered:
            lines.append(f"{len(job.uncovered)} subgraph(s) without a template run on the reference path")
        out.append("\n".join(lines))
    shared = sum(1 for st in report.tasks.values() if len(set(st.models)) > 1)
    out.append(f"batch: {len(report.jobs)} models, {len(report.tasks)} distinct tasks ({shared} shared), "
               f"{report.measured} measurements in {report.wall_s:.1f} s"
               + (f"; stopped: {report.stopped}" if report.stopped else ""))
    return "\n\n".join(out)


def to_json(report: BatchReport) -> dict:
    models = []
    for m, job in enumerate(report.jobs):
        rows = []
        for t in job.tasks:
            st = report.tasks[t.workload.key]
            rows.append({"task": t.name, "workload": t.workload.key, "weight": t.weight, "share": st.share,
                         "stored_before": st.stored_before, "stored": st.stored,
                         "measured": st.measured if st.owner == m else 0, "best": st.best, "default": st.default,
                         "origin": _origin(report, m, st),
                         "shared_with": [report.jobs[k].name for k in dict.fromkeys(st.models) if k != m]})
        models.append({"model": job.name, "source": job.source, "status": job.status, "measured": job.measured,
                       "estimated_latency": model_latency(job, report), "tasks": rows,
                       "uncovered": sorted({str(sg) for sg in job.uncovered})})
    return {"target": report.target.key, "stopped": report.stopped, "measured": report.measured,
            "wall_s": round(report.wall_s, 3), "distinct_tasks": len(report.tasks), "models": models}


# -- command line -------------------------------------------------------------------------

# `tune` flags that mean nothing for a batch (one model, its plan, its plot, its whole-model timing)
_NOT_FOR_BATCH = {"help", "model", "plan", "show_graph", "plot", "measure_runs", "resume"}
_HELP = {"trials": "measurements per model (default 64), split over its tasks in whole batches",
         "time_budget": "stop starting new batches after this many seconds of the whole batch",
         "db": "SQLAlchemy URL of the shared database (default $TENSORTUNE_DB or sqlite:///tuning.db); "
               "postgresql+psycopg://... for batches on several machines"}


def _parser():
    """`tune`'s flags (all but those of one model), plus the batch's own."""
    import copy
    from ir.errors import CliParser
    from tuner.cli import _parser as tune_parser
    p = CliParser(prog="tune-batch", description="Tune many ONNX models into one database, one job per model; "
                  "subgraphs shared by several models are tuned once. Run it again to continue an interrupted "
                  "batch. As a Ray Job: ray job submit --working-dir . -- tune-batch M1.onnx M2.onnx --ray auto "
                  "--db postgresql+psycopg://...")
    p.add_argument("models", nargs="+", metavar="MODEL", help="ONNX model files")
    for action in tune_parser()._actions:
        if action.dest in _NOT_FOR_BATCH:
            continue
        action = copy.copy(action)
        action.container = p
        if action.dest in _HELP:
            action.help = _HELP[action.dest]
        if action.dest == "trials":
            action.default = None   # so that it and --trials-total exclude each other
        p._add_action(action)
    p.add_argument("--trials-total", type=int, default=None, metavar="N",
                   help="measurements for the whole batch instead of --trials per model, split over its "
                        "distinct tasks")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    return p


def options_from_args(args) -> TuneOptions:
    """`TuneOptions` from the flags of the same names (so flags that `tune` gains pass
    through; `--ray ADDRESS` has chosen the Ray stages in `tuner.cli.ray_defaults`)."""
    given = vars(args)
    kw = {f.name: given[f.name] for f in fields(TuneOptions) if f.name in given}
    kw["progress"] = not given.get("no_progress", False)
    kw["transfer"] = not given.get("no_transfer", False)
    kw.pop("plot", None)
    return TuneOptions(**kw)


def _check(args) -> None:
    from tuner.cost_model import COST_MODELS
    from tuner.measure import builder_names
    from tuner.scheduler import SCHEDULERS
    from tuner.search import STRATEGIES
    for flag, v in (("--trials", args.trials), ("--trials-total", args.trials_total), ("--batch-size", args.batch_size),
                    ("--repeat", args.repeat), ("--number", args.number), ("--early-stopping", args.early_stopping),
                    ("--time-budget", args.time_budget), ("--build-timeout", args.build_timeout),
                    ("--run-timeout", args.run_timeout)):
        if v is not None and not v > 0:  # `not >`: NaN too
            raise BatchError(f"{flag} must be a positive number, got {v}")
    for flag, v in (("--min-repeat-ms", args.min_repeat_ms), ("--seed", args.seed)):
        if not v >= 0:
            raise BatchError(f"{flag} must be >= 0, got {v}")
    for flag, v, names in (("--strategy", args.strategy, sorted(STRATEGIES)),
                           ("--cost-model", args.cost_model, list(COST_MODELS)),
                           ("--scheduler", args.scheduler, sorted(SCHEDULERS)),
                           ("--builder", args.builder, builder_names())):
        if v not in names:
            raise BatchError(f"unknown {flag} '{v}' (choose from: {', '.join(names)})")


def main(argv=None) -> int:
    from ir.errors import run_cli
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    return run_cli("tune-batch", _run, args,
                   interrupted="every finished measurement is in the database (run the same command again to "
                               "continue the batch)")


def _run(args) -> int:
    import json
    from codegen import cache_dir
    from ir.custom import load_plugins
    from ir.errors import redact
    from ir.settings import current
    from ir.shapes import parse_dim_ranges, parse_shape_points
    from runtime.fallback import check_fallback
    from tuner.measure import runner_names
    settings = current()
    load_plugins(list(args.plugin) + list(settings.plugins))
    check_fallback(args.fallback)
    _check(args)
    if args.trials is not None and args.trials_total is not None:
        raise BatchError("give --trials (per model) or --trials-total (for the batch), not both")
    if args.trials is None:
        args.trials = 64
    from tuner.cli import ray_defaults
    ray_defaults(args, args.argv)   # --ray implies the Ray runner and builder, as in `tune`
    opts = options_from_args(args)
    if opts.runner not in runner_names():
        hint = " (the Ray runner needs `pip install 'tensortune[cluster]'`)" if opts.runner == "ray" else ""
        raise BatchError(f"unknown --runner '{opts.runner}' (choose from: {', '.join(runner_names())}){hint}")
    jobs = load_jobs(args.models, parse_dim_ranges(args.dim), parse_shape_points(args.shape), args.fallback)
    cache_dir(settings)
    db = Database(args.db)
    say = (lambda line: None) if args.json else (lambda line: print(f"tune-batch: {line}", file=sys.stderr))
    try:
        report = tune_batch(jobs, db, opts, trials_total=args.trials_total, settings=settings, log=say)
    finally:
        db.close()
    if args.json:
        print(json.dumps({**to_json(report), "db": redact(db.url)}, indent=1))
    else:
        print(summary_tables(report))
        print(f"results in {redact(db.url)}")
    if report.tasks and all(st.best is None for st in report.tasks.values()) and report.measured:
        print("tune-batch: error: every candidate failed: nothing usable was found", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The tuning loop: model → passes → partition → tasks → search + measure → database.

It knows only interfaces (SearchStrategy, Builder, Runner, Database, measure
callbacks); builder and runner are created by name (`tuner.measure.registry`). The
loop keeps up to `runner.capacity` batches in flight and takes each result as it
finishes; what happens then (store, learn, share, log, progress, plot) are the
callbacks of `tuner.callbacks`. Every result is committed to the database as it
arrives (and Ctrl-C or SIGTERM waits for a commit in progress), so an interrupted
run loses nothing and a new run resumes from what is stored, measuring once more the
configs whose failure was transient. Configs are claimed in the database before
they are measured, so tuners sharing a database never measure one twice.
"""
from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

from codegen import Target, host_target
from database import Database, Record
from ir import import_onnx, simplify
from ir.errors import TensortuneError
from ir.graph import Graph
from ir.settings import Settings, resolve
from ir.shapes import DimRange
from tuner.measure import Builder, MeasureInput, MeasureResult, Runner, make_builder, make_runner
from tuner.search import make_strategy
from tuner.task import Task, extract_tasks, shape_points


@dataclass
class TuneOptions:
    trials: int = 64                     # measurements for all tasks together
    strategy: str = "random"             # random | grid | ga | xgb
    batch_size: int = 8
    seed: int = 0                        # same seed, same database content -> same proposals
    early_stopping: int | None = None    # stop a task after this many trials without improvement
    resume: bool = True                  # skip configs the database already holds for this target
    progress: bool = True
    log_file: str | None = None
    build_timeout: float = 120.0
    run_timeout: float = 30.0
    number: int | None = None            # calls per repeat (None: grow until min_repeat_ms)
    repeat: int = 5
    min_repeat_ms: float = 20.0
    flush_cache: bool = False            # evict caches (touch a large buffer) before each repeat
    scheduler: str = "gradient"          # gradient | round-robin
    time_budget: float | None = None     # seconds; stop starting new batches after this
    cost_model: str = "xgb"              # for model-guided strategies: xgb | xgb-reg | random
    transfer: bool = True                # warm-start the cost model from other shapes of the template
    max_prior: int = 4000                # transfer-learning rows at most
    claim_ttl: float | None = None       # seconds a claimed config stays reserved (None: a batch's worst case)
    fallback: str | None = None          # "onnxruntime": unsupported ops do not stop tuning the rest
    builder: str = "local"               # measurement stages by name (tuner.measure.registry)
    runner: str = "local"
    plot: str | None = None              # write the convergence plot (PNG) here at the end
    ray: str | None = None               # the Ray cluster of the "ray" stages: "auto" or the head's HOST:PORT
    target_key: str | None = None        # the "ray" runner measures only on nodes of this target key
    verify_runs: int = 0                 # > 0: after tuning, time each tuned subgraph against its default inside
                                         # the model this many runs and keep the faster (tuner.verify)
    compile_share: float | None = 0.5    # cost-aware batches: compiling new code shapes takes about this share of
                                         # the tuning time, the rest measures run-time variants of built ones
                                         # (tuner.compile_budget); None or 0: any proposal may be a new code shape


@dataclass
class TaskReport:
    task: Task
    trials: int = 0
    failures: int = 0
    best: float | None = None            # seconds
    best_config: dict | None = None
    default: float | None = None         # latency of the template's default config
    initial: float | None = None         # best stored before this run (resume)
    since_best: int = 0
    history: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)   # status -> failures of this run

    @property
    def gflops(self) -> float | None:
        return self.task.flops / self.best / 1e9 if self.best else None

    @property
    def speedup(self) -> float | None:
        return self.default / self.best if self.best and self.default else None


@dataclass
class Timing:
    """Where the tuning time went (seconds of wall clock in the tuning process)."""
    candidates: int = 0
    build_s: float = 0.0      # builder wall time (compiles in parallel workers)
    run_s: float = 0.0        # runner wall time (checks and timing, exclusive)
    model_s: float = 0.0      # proposing and learning (cost-model fits, search)
    db_s: float = 0.0
    wall_s: float = 0.0
    compiles: int = 0         # builds that really compiled (not a kernel-cache hit)

    @property
    def per_minute(self) -> float:
        return 60.0 * self.candidates / self.wall_s if self.wall_s else 0.0

    def to_json(self) -> dict:
        return {"candidates": self.candidates, "build_s": round(self.build_s, 3), "run_s": round(self.run_s, 3),
                "model_s": round(self.model_s, 3), "db_s": round(self.db_s, 3), "wall_s": round(self.wall_s, 3),
                "compiles": self.compiles, "per_minute": round(self.per_minute, 1)}


class TuneReports(list):
    """The per-task reports (a list), plus `timing`, `stopped` (why tuning ended),
    `order` (the task index of each result, in the order results arrived) and, after
    `tune_model` with `verify_runs`, `verification` (`tuner.verify.Verification`)."""
    timing: Timing
    stopped: str = ""
    order: list
    verification = None


def builder_options(opts: TuneOptions, settings: Settings) -> dict:
    """The options every builder factory takes (`tuner.measure.registry`), plus the
    cluster's address for the Ray builder."""
    extra = {"address": opts.ray or "auto"} if opts.builder == "ray" else {}
    return {"timeout": opts.build_timeout, "settings": settings, **extra}


def runner_options(opts: TuneOptions, settings: Settings) -> dict:
    """The options every runner factory takes (`tuner.measure.registry`), plus the
    cluster's address, the node filter and the build timeout (it builds) for the Ray runner."""
    extra = {"address": opts.ray or "auto", "target_key": opts.target_key, "build_timeout": opts.build_timeout} \
        if opts.runner == "ray" else {}
    return {"timeout": opts.run_timeout, "repeat": opts.repeat, "min_repeat_ms": opts.min_repeat_ms,
            "number": opts.number, "flush_cache": opts.flush_cache, "settings": settings, **extra}


def to_record(r: MeasureResult, target: Target, strategy: str, template_version: int) -> Record:
    """The record of one result, under the target of the machine that measured it (the
    worker says which), or `target` for results no machine measured (failed builds)."""
    wl = r.input.workload
    return Record(workload=wl.to_json(), workload_key=wl.key, signature=wl.signature, family=wl.family,
                  template=r.input.template, template_version=template_version,
                  target=dict(r.target) if r.target else target.describe(),
                  config=r.input.config.to_json(), status=r.status, latencies=list(r.latencies), median=r.median,
                  spread=r.spread, error=r.error[:2000], compile_s=r.compile_s, strategy=strategy, flops=wl.flops())


class TuneContext:
    """The state of one `tune_tasks` call, as measure callbacks see it: `reports`, `db`,
    `opts`, `target`, `settings`, `scheduler`, `strategies` (per task), `owner` (of the
    claims), `batch` (the `Batch` just finished, in `on_batch`), `interrupts`."""

    def __init__(self, reports: TuneReports, db: Database, opts: TuneOptions, target: Target, settings: Settings,
                 scheduler, callbacks: list):
        self.reports, self.db, self.opts, self.target, self.settings = reports, db, opts, target, settings
        self.scheduler, self.callbacks = scheduler, callbacks
        self.timing = reports.timing
        self.strategies: list = []
        self.retry: list[list] = []            # per task: configs whose stored failures were transient
        self.tries: list[dict] = []            # per task: config hash -> records stored before this run
        self.owner = f"{_host()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"   # see owner_alive
        self.ttl = opts.claim_ttl or opts.batch_size * (opts.build_timeout + opts.run_timeout) + 60.0
        self.interrupts: _Interrupts | None = None
        self.batch: Batch | None = None
        self.budget = None                      # tuner.compile_budget.CompileBudget (see tune_tasks)
        self.claimed_new: dict[int, set] = {}   # task -> code shapes its last claimed batch builds first

    def add_task(self, rep: TaskReport) -> None:
        t, db, target, opts = rep.task, self.db, self.target, self.opts
        known = db.measured(t.workload.key, target.key) if opts.resume else {}
        retry = db.retryable(t.workload.key, target.key) if opts.resume else {}
        space = t.template.space(t.workload)
        configs = []
        for cfg, _ in retry.values():
            try:
                configs.append(space.validate(cfg))
            except Exception:  # a config of an older template version: not retried
                continue
        self.retry.append(configs)
        self.tries.append({h: n for h, (_, n) in retry.items()})
        self.strategies.append(make_task_strategy(t, db, opts, target, known))
        oks = [m for m in known.values() if m is not None]
        rep.best = rep.initial = min(oks) if oks else None
        rep.default = known.get(t.template.default_config(t.workload).hash)
        if rep.best is not None:
            best = db.best(t.workload.key, target.key, 1)
            rep.best_config = best[0].config if best else None

    def claim_batch(self, i: int, n: int) -> list:
        """Up to n configs for task i that no other tuner holds or has measured meanwhile;
        refused proposals are dropped (their holder measures them) and the batch refilled."""
        rep, strategy, wl = self.reports[i], self.strategies[i], self.reports[i].task.workload
        budget = self.budget.allowance() if self.budget is not None and strategy.cost_aware else None
        before = set(strategy.built)
        out = []
        while len(out) < n:
            left = None if budget is None else max(0, budget - len(strategy.built - before))
            configs = _next_configs(rep, strategy, n - len(out), self.retry[i], left)
            if not configs and not out and left == 0:   # nothing built to vary: one new code shape
                configs = _next_configs(rep, strategy, n, self.retry[i], 1)
            if not configs:   # the space is exhausted (for this tuner)
                break
            strategy.measured |= {c.hash for c in configs}
            known = {c.hash: self.tries[i].get(c.hash, 0) for c in configs} if self.opts.resume else None
            granted = set(self.db.claim(wl.key, self.target.key, [c.hash for c in configs], self.owner, self.ttl,
                                        known, alive=owner_alive))
            out += [c for c in configs if c.hash in granted]
        self.claimed_new[i] = {strategy.space.code_key(c) for c in out} - before
        return out

    def on_result(self, i: int, r: MeasureResult) -> None:
        """Account for one result, then hand it to the callbacks (the first stores it),
        shielded: a signal that arrives meanwhile stops the run after them, so the log
        matches the database."""
        with self.interrupts.shielded():
            rep = self.reports[i]
            self.reports.order.append(i)
            _account(rep, r, default=r.input.config == rep.task.template.default_config(rep.task.workload))
            for cb in self.callbacks:
                cb.on_result(self, i, r)

    def on_batch(self, b: Batch) -> None:
        """Tell the scheduler (retiring a task that stopped improving), then the callbacks."""
        i, rep, scheduler = b.task, self.reports[b.task], self.scheduler
        self.batch = b
        scheduler.update(i, len(b.results), rep.best)
        self.timing.candidates += len(b.results)
        if self.budget is not None:
            self.budget.observe(b.results, _code_costs(b, self.strategies[i].space, self.budget.code_cost))
        if self.opts.early_stopping and rep.since_best >= self.opts.early_stopping:
            scheduler.retire(i)
            b.early_stopped = True
        for cb in self.callbacks:
            cb.on_batch(self, i, b.results)

    def end(self, failed: bool) -> None:
        """Every callback's `on_end`, even after a failure; an error of one is raised
        after all ran, unless the run already fails (then it is a warning)."""
        errors = []
        for cb in self.callbacks:
            try:
                cb.on_end(self)
            except Exception as e:
                errors.append(e)
        if errors and not failed:
            raise errors[0]
        for e in errors:
            warnings.warn(f"measure callback failed at the end of an interrupted run: {type(e).__name__}: {e}")


def _history(db: Database, t: Task, target: Target, space) -> list:
    """(config, median or None) of this workload's stored records that fit its space."""
    out = []
    for rec in db.records(workload_key=t.workload.key, target_key=target.key):
        try:
            out.append((space.validate(rec.config), rec.median if rec.status == "ok" else None))
        except Exception:  # a config of an older template version: not comparable
            continue
    return out


def _prior(db: Database, t: Task, target: Target, limit: int) -> list:
    """Transfer-learning rows: (features, median or None, workload key) of the same template
    on other workloads, for this target."""
    from ir.workload import Workload
    from tuner.cost_model import Featurizer
    recs = [r for r in db.records(template=t.template.name, target_key=target.key)
            if r.workload_key != t.workload.key and r.template_version == t.template.version][-limit:]
    feats: dict[str, Featurizer] = {}
    rows = []
    for r in recs:
        try:
            if r.workload_key not in feats:
                wl = Workload.from_json(r.workload)
                feats[r.workload_key] = Featurizer(t.template, wl, t.template.space(wl))
            f = feats[r.workload_key]
            rows.append((f.row(f.space.validate(r.config)), r.median if r.status == "ok" else None, r.workload_key))
        except Exception:  # a workload or config this template version cannot read
            continue
    return rows


def make_task_strategy(t: Task, db: Database, opts: TuneOptions, target: Target, known: dict):
    """The search strategy of one task, fed with what the database knows."""
    from tuner.search import MODEL_GUIDED
    space = t.template.space(t.workload)
    kw = {}
    if opts.strategy in MODEL_GUIDED:
        from tuner.cost_model import Featurizer
        kw = {"featurizer": Featurizer(t.template, t.workload, space), "cost_model": opts.cost_model,
              "prior": _prior(db, t, target, opts.max_prior) if opts.transfer else None}
    history = _history(db, t, target, space) if opts.resume else None
    return make_strategy(opts.strategy, space, seed=opts.seed, measured=set(known), history=history, **kw)



def make_stages(opts: TuneOptions, settings, builder=None, runner=None, target=None, owned: list | None = None):
    """(builder, runner, target): stages given by name (or None: the options') are made here
    and appended to `owned` (the caller closes them); the target records are stored under is
    the measuring machines' (a runner on other machines, Ray, knows it), else this host's."""
    owned = owned if owned is not None else []
    if builder is None or isinstance(builder, str):
        builder = make_builder(builder or opts.builder, **builder_options(opts, settings))
        owned.append(builder)
    if runner is None or isinstance(runner, str):
        runner = make_runner(runner or opts.runner, **runner_options(opts, settings))
        owned.append(runner)
    target = target or getattr(runner, "target", None) or host_target(settings.backend, settings)
    return builder, runner, target


def tune_tasks(tasks: list[Task], db: Database, opts: TuneOptions, target: Target | None = None,
               builder: Builder | str | None = None, runner: Runner | str | None = None, *,
               settings: Settings | None = None, callbacks=()) -> TuneReports:
    """Spend `opts.trials` measurements (or `opts.time_budget` seconds) over `tasks`, the
    task scheduler choosing which task gets the next batch; up to `runner.capacity`
    batches are measured at once.

    `builder`/`runner`: instances, or names for `tuner.measure.registry` (default
    `opts.builder`/`opts.runner`, "local"); those made here are closed here. `callbacks`:
    `tuner.callbacks.MeasureCallback`s run after the defaults (save, learn, share, log,
    progress, plot). Each config is claimed in the database before it is built
    (concurrent tuners on one database never measure it twice) and each result is
    committed as the runner returns it; SIGINT/SIGTERM stop the run between two
    commits, never inside one."""
    from tuner.callbacks import default_callbacks
    from tuner.scheduler import make_scheduler
    t_start = time.perf_counter()
    db.require_writable("store measurements")   # before anything is measured
    settings = resolve(settings)
    owned = []
    try:
        builder, runner, target = make_stages(opts, settings, builder, runner, target, owned)
        reports = TuneReports(TaskReport(t) for t in tasks)
        reports.timing, reports.order = Timing(), []
        ctx = TuneContext(reports, db, opts, target, settings, make_scheduler(opts.scheduler, tasks, seed=opts.seed),
                          default_callbacks(opts) + list(callbacks or ()))
        if opts.compile_share:   # None or 0: no budget (as `--compile-share 0`)
            from tuner.compile_budget import CompileBudget
            ctx.budget = CompileBudget(opts.compile_share, builders=getattr(builder, "parallel", 1),
                                       run_s=_expected_run_s(opts))
    except BaseException:
        for stage in owned:
            stage.close()
        raise
    timing, failed = reports.timing, False
    try:
        with _Interrupts() as ctx.interrupts:
            for i, rep in enumerate(reports):
                t0 = time.perf_counter()
                ctx.add_task(rep)
                timing.model_s += time.perf_counter() - t0
                ctx.scheduler.set_best(i, rep.best)
            for cb in ctx.callbacks:
                cb.on_start(ctx)
            reports.stopped = _measure(ctx, builder, runner, t_start)
    except KeyboardInterrupt:
        reports.stopped, failed = "interrupted", True
        raise
    except BaseException:
        failed = True
        raise
    finally:
        timing.wall_s = time.perf_counter() - t_start
        try:
            db.release(ctx.owner)   # configs claimed but not measured (an interrupt): free for others
        except TensortuneError:
            pass                    # they expire anyway; never hide why the run stopped
        try:
            ctx.end(failed)
        finally:
            for stage in owned:
                stage.close()
    return reports


@dataclass
class Batch:
    """One batch in flight: its task, what was built, what came back so far, and what it cost."""
    task: int
    inputs: list
    builds: list
    results: list = field(default_factory=list)
    build_s: float = 0.0
    run_s: float = 0.0        # time the loop waited for the runner on this batch's results
    compiles: int = 0
    early_stopped: bool = False
    new_codes: set = field(default_factory=set)   # code shapes this batch builds for the first time

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.inputs)


def _compiles(builds) -> int:
    """Builds that really compiled; candidates sharing one source share one compile."""
    return len({b.kernel.artifact.key if b.kernel is not None else id(b) for b in builds
                if b.status == "ok" and b.compile_s > 0 and not b.cached})


def _code_costs(b: Batch, space, default: float) -> dict:
    """code key -> compile seconds of each code shape batch `b` built first (a failed build:
    `default`, what one costs now)."""
    costs = {}
    for r in b.results:
        key = space.code_key(r.input.config)
        if key in b.new_codes:
            cost = r.compile_s if r.ok or r.compile_s > 0 else default
            costs[key] = max(costs.get(key, 0.0), cost)
    return costs


def _expected_run_s(opts: TuneOptions) -> float:
    """Seconds one candidate's check and timing take by the timing options, for runners
    that report no run time: a calibration, the repeats, a warm-up and the checks."""
    return (opts.repeat + 1) * opts.min_repeat_ms / 1000.0 + 0.05


def _measure(ctx: "TuneContext", builder: Builder, runner: Runner, t_start: float) -> str:
    """Keep up to `runner.capacity` batches in flight until the trials, the time budget or
    the tasks run out; hand each result, then each finished batch, to the callbacks.
    Returns why it stopped. A capacity-1 runner gets the next batch only after the last
    one is done: build on all cores, then time exclusively."""
    opts, reports, scheduler, timing = ctx.opts, ctx.reports, ctx.scheduler, ctx.reports.timing
    capacity = max(1, int(getattr(runner, "capacity", 1)))
    flight: dict[int, Batch] = {}
    spent, stopped = 0, None
    while True:
        while stopped is None and len(flight) < capacity:
            pending = sum(len(b.inputs) - len(b.results) for b in flight.values())
            if spent + pending >= opts.trials:
                stopped = "trials"
            elif opts.time_budget is not None and time.perf_counter() - t_start >= opts.time_budget:
                stopped = "time budget"
            else:
                i = scheduler.next_task(busy={b.task for b in flight.values()})
                if i is None:
                    stopped = "every task finished (exhausted or stopped early)"
                    break
                t0 = time.perf_counter()
                configs = ctx.claim_batch(i, min(opts.batch_size, opts.trials - spent - pending))
                timing.model_s += time.perf_counter() - t0
                if not configs:
                    scheduler.retire(i)
                    continue
                task = reports[i].task
                inputs = [MeasureInput(task.workload, task.template.name, c) for c in configs]
                t0 = time.perf_counter()
                builds = builder.build(inputs)
                b = Batch(i, inputs, builds, build_s=time.perf_counter() - t0, compiles=_compiles(builds),
                          new_codes=ctx.claimed_new.pop(i, set()))
                timing.build_s += b.build_s
                timing.compiles += b.compiles
                flight[runner.submit(inputs, builds)] = b
        if not flight:
            return stopped or "trials"
        t0 = time.perf_counter()
        ticket, r = runner.next_result()
        dt = time.perf_counter() - t0
        b = flight[ticket]
        b.run_s += dt
        timing.run_s += dt
        b.results.append(r)
        ctx.on_result(b.task, r)
        spent += 1
        if b.done:
            del flight[ticket]
            ctx.on_batch(b)


def _host() -> str:
    return socket.gethostname()[:64]   # claims.owner holds 100 characters


def owner_alive(owner: str) -> bool:
    """Whether the tuner that holds a claim ("host:pid:nonce") may still run: a process
    of this host that is gone (killed, crashed) is not; of other hosts nothing is known,
    so their claims wait for expiry."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != _host() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


class _Interrupts:
    """SIGINT and SIGTERM raise KeyboardInterrupt, except inside `shielded()` (storing a
    result): a signal that arrives there is raised right after it, so a finished
    measurement is either stored and logged or was never taken. Handlers exist only in
    the main thread (signals are delivered there)."""

    def __init__(self):
        self.depth, self.pending, self.saved = 0, False, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self.saved.items():
            signal.signal(sig, old)

    def _handle(self, signum, frame):
        if self.depth:
            self.pending = True
            return
        raise KeyboardInterrupt

    @contextmanager
    def shielded(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if self.pending and not self.depth:
            self.pending = False
            raise KeyboardInterrupt


def _next_configs(rep: TaskReport, strategy, n: int, retry: list | None = None, new_codes: int | None = None):
    """The default config first (to report speedups), then configs whose stored failures
    were transient (each tried once more, popped from `retry`), then what the strategy proposes,
    with at most `new_codes` new code shapes among them all (None: no limit)."""
    default = rep.task.template.default_config(rep.task.workload)
    first = [] if default.hash in strategy.measured else [default]
    while retry and len(first) < n:
        first.append(retry.pop(0))
    strategy.measured |= {c.hash for c in first}
    if n <= len(first):
        return first
    if new_codes is not None:
        fresh = {strategy.space.code_key(c) for c in first} - strategy.built
        strategy.new_codes = max(0, new_codes - len(fresh))
    strategy.building(first)
    return first + strategy.propose(n - len(first))


def _account(rep: TaskReport, r: MeasureResult, default: bool) -> None:
    rep.trials += 1
    if not r.ok:
        rep.failures += 1
        rep.failed[r.status] = rep.failed.get(r.status, 0) + 1
    m = r.median
    if default and m is not None:
        rep.default = m
    if m is not None and (rep.best is None or m < rep.best):
        rep.best, rep.best_config, rep.since_best = m, r.input.config.to_json(), 0
    else:
        rep.since_best += 1
    rep.history.append(rep.best)


def unusable_warnings(reports: list[TaskReport]) -> list[str]:
    """One line per task left without any working config (this run or stored): what failed."""
    out = []
    for r in reports:
        if r.best is None:
            why = ", ".join(f"{n} {s}" for s, n in sorted(r.failed.items(), key=lambda x: -x[1])) or "none measured"
            out.append(f"task {r.task.name}: no candidate gave a usable result ({r.trials} trials this run: {why}); "
                       "it runs on its template's default config or the reference path")
    return out


def estimated_latency(reports: list[TaskReport]) -> float | None:
    """Σ occurrences × best latency over tasks: the model's estimated tuned latency."""
    from tuner.scheduler import estimated_latency as weighted
    return weighted((r.task.weight, r.best) for r in reports)


def _status_line(reports, rep, i: int) -> str:
    g = rep.gflops
    est = estimated_latency(reports)
    head = f"task {i + 1}/{len(reports)} {rep.task.template.name} {rep.trials} trials"
    return head + (f", best {g:.1f} GFLOP/s" if g else ", no result yet") + \
        (f" | model est. {_ms(est)}" if est else "")


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
    timing = getattr(reports, "timing", None)
    if timing is not None and timing.candidates:
        lines.append(f"{timing.candidates} candidates in {timing.wall_s:.1f} s ({timing.per_minute:.0f}/min): "
                     f"build {timing.build_s:.1f} s ({timing.compiles} compiles), run {timing.run_s:.1f} s, "
                     f"search/model {timing.model_s:.1f} s, database {timing.db_s:.1f} s")
    return "\n".join(lines)


def measure_model_latency(model, db, dims=None, sizes: dict | None = None, runs: int = 10, seed: int = 0,
                          fallback: str | None = None, settings: Settings | None = None) -> float:
    """Median seconds of one run of the whole model (a path, a ModelProto or an imported
    `ir.Graph`) with its tuned kernels (runtime.load on random inputs at `sizes`), after a
    warm-up run that compiles and packs."""
    import runtime
    from runtime.cli import random_feeds
    settings = resolve(settings)
    m = runtime.load(model, db=db, dims=dims, fallback=fallback, target=settings.backend, settings=settings)
    feeds = random_feeds(m.graph, dict(sizes or {}), seed)
    m.run(feeds)
    ts = []
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        m.run(feeds)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def measure_deployed(model, db, sizes: dict | None = None, runs: int = 10, seed: int = 0,
                     fallback: str | None = None, settings: Settings | None = None):
    """The whole model deployed from `db` (`runtime.load(db=...)`: the configs the in-model
    check kept) and with default configs, run in turn on the same random inputs after a
    warm-up run each, so that the load of a shared machine hits both alike: a
    `tuner.verify.Measured` (medians, and the deployed model's time per kernel workload
    and outside its kernels). At least `runs` calls of each, and as many as fill the in-model
    check's span (`tuner.verify.runs_to_span`): 10 calls of the bundled MLP (0.25 ms) are
    2.5 ms of measurement, and the same deployment timed twice so read 1.25-1.62x apart
    ("tuned/untuned" with the tuned config rejected, Zen 3, 2026-12-07)."""
    import runtime
    from runtime.cli import random_feeds
    from tuner.verify import measured_pair, runs_to_span
    settings = resolve(settings)
    tuned = runtime.load(model, db=db, fallback=fallback, target=settings.backend, settings=settings)
    default = runtime.load(model, fallback=fallback, target=settings.backend, settings=settings)
    feeds = random_feeds(tuned.graph, dict(sizes or {}), seed)
    return measured_pair(tuned, default, feeds, runs_to_span([tuned, default], feeds, runs))


def verification_lines(reports) -> list[str]:
    """What the in-model check decided, one line per rejected config plus a summary."""
    v = getattr(reports, "verification", None)
    if v is None:
        return []
    lines = [f"in-model check ({v.runs} runs, tuned and default configs in turn): {len(v.verdicts)} tuned "
             f"subgraph workload(s) compared, {len(v.verdicts) - len(v.rejected)} kept, {len(v.rejected)} "
             "rejected (their default config ran faster inside the model and is deployed instead)"]
    for x in v.rejected:
        lines.append(f"  rejected {x.name[:70]}: tuned {_ms(x.tuned_s)} vs default {_ms(x.default_s)} in the model")
    from runtime.choose import ONE, SPLIT
    for key, timed, deployed in ((SPLIT, "its size keeps on fewer threads also timed on {}", "every thread"),
                                 (ONE, "its size splits over {} threads also timed on one", "one thread")):
        tried = [x for x in v.splits if x.key == key]
        if tried:
            kept = [x for x in v.split if x.key == key]
            lines.append(f"  {len(tried)} kernel workload(s) {timed.format(tried[0].threads)}: {len(kept)} ran "
                         f"faster so and are deployed on {deployed}")
            lines += [f"  {deployed} {x.name[:60]}: {_ms(x.by_size[0])} -> {_ms(x.other[0])}" for x in kept]
    return lines


def agreement_line(estimated: float | None, measured: float, untuned: float | None = None,
                   tolerance: float = 0.2) -> str:
    """The estimate vs the measured latency, with a warning when they disagree by more
    than `tolerance`, and the untuned latency for comparison."""
    text = f"estimated {_ms(estimated)}, measured {_ms(measured)}"
    if untuned:
        text += f", untuned {_ms(untuned)} (tuned/untuned {measured / untuned:.2f})"
    if estimated:
        off = estimated / measured - 1.0
        text += f"; estimate {off:+.0%} off" + (f" (more than {tolerance:.0%}: the model ran slower or faster than "
                                                 "the estimate's kernel times predict; `tune-run --profile` shows "
                                                 "where)" if abs(off) > tolerance else "")
    return text


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
               builder: Builder | str | None = None, runner: Runner | str | None = None, *,
               settings: Settings | None = None, callbacks=()):
    """Import, simplify, partition and tune a model (a path or ModelProto; an `ir.Graph`
    is taken as already imported and simplified). Returns (graph, points, reports,
    uncovered subgraphs)."""
    if opts.trials <= 0:
        raise TensortuneError(f"--trials must be a positive number, got {opts.trials}")
    graph = model if isinstance(model, Graph) else simplify(import_onnx(model, dims))
    if not opts.fallback:
        check_runnable(graph)
    points = shape_points(graph.dims, shapes)
    from codegen.backend import template_kind
    tasks, uncovered = extract_tasks(graph, points, kind=template_kind(target.kind if target is not None
                                                                      else resolve(settings).backend))
    reports = tune_tasks(tasks, db, opts, target, builder, runner, settings=settings, callbacks=callbacks)
    if opts.verify_runs > 0 and tasks:
        settings = resolve(settings)
        host = host_target(settings.backend, settings)
        measured_on = target or getattr(runner, "target", None) or host
        if measured_on.key == host.key:
            from tuner.verify import store_verdicts, verify_in_model
            reports.verification = verify_in_model(graph, db, points[0], settings, runs=opts.verify_runs,
                                                   fallback=opts.fallback, seed=opts.seed)
            store_verdicts(db, reports.verification, host)
    return graph, points, reports, uncovered

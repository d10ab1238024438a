"""In-model verification: the tuned kernels timed where they will run, inside the deployed model.

A candidate is timed alone by the tuner: the same inputs again and again, its weights
hot in the caches, the other kernels not running. Inside the model each kernel finds
its weights cold (the layers before it evicted them) and the executor's dispatch
around it, so a config that wins alone can lose in the model (issue 13: a tuned
ResNet-18 was slower than the untuned one). This step loads the model twice, with the
tuned configs and with the default ones, runs both interleaved on the same inputs,
and compares every tuned subgraph against its default config, step by step. Where the
default is faster, the tuned config is rejected.

The decision is stored as records of strategy `IN_MODEL` (one per config compared,
its median the typical in-model seconds per occurrence): `runtime.choose` deploys the faster
of them whenever the database's best config is one that was verified, so
`runtime.load(db=...)` and `build_plan` deploy what this step decided. A new best
found by a later `tune` is deployed unverified until that run verifies it.

On more than one thread the same run times each kernel that its size keeps on fewer
threads (`codegen.cpu.threads_for`) once more on every thread (a third model): the size
rule is one constant for every machine, and whether a 20 M-unit conv gains from a second
thread depends on the machine's pool (1.3-1.6x on a Zen 4 guest, slower on Intel guests
whose pool threads wake late). Where every thread ran it at least `SPLIT_GAIN` faster, a
`SPLIT` record of its config deploys it so (`SplitVerdict`). The other way too: each kernel
its size splits is timed on one thread (a fourth model), and where that ran at least
`SPLIT_GAIN` faster a `ONE` record keeps it there. On a 2-vCPU Zen 3 guest ViT-small's 1.2 MFLOP
projections ran 14 us on one thread and 21 split, its 4.7 MFLOP MLP layers 58 and 45 us, and
MobileNetV2's first convs gained or lost from a second thread with the host's phase.

The same in-model times make tune's estimate of the deployed latency
(`deployed_estimate`): each kernel counted with its time inside the model where this
step measured it, not with its time alone, which is lower by the in-model penalty.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from schedules import get_template
from runtime.choose import DEFAULT, IN_MODEL, NEAREST, ONE, REFERENCE, SPLIT, TUNED

SPLIT_GAIN = 0.95        # every thread is kept only where it ran in at most this share of the time: the margin
                         # of the in-model noise, so that no kernel flips on a coin toss
SPLIT_MIN_WORK = 1 << 17  # work units below which no kernel is tried on every thread: a pool hand-off costs more;
                          # below `codegen.cpu.MIN_WORK_PER_THREAD` x 2, or 2-thread models have no candidate


@dataclass
class Verdict:
    """One tuned workload compared with its default config inside the model."""
    workload: object              # ir.workload.Workload
    template: str
    template_version: int
    occurrences: int
    tuned_config: dict
    default_config: dict
    tuned_s: float                # typical in-model seconds per occurrence (`per_occurrence`)
    default_s: float
    tuned_runs: list = field(default_factory=list)
    default_runs: list = field(default_factory=list)

    @property
    def kept(self) -> str:
        """"tuned" unless its default config ran faster inside the model."""
        return TUNED if self.tuned_s <= self.default_s else DEFAULT

    @property
    def name(self) -> str:
        return f"{self.template}:{self.workload.describe()}"


@dataclass
class SplitVerdict:
    """One kernel workload timed inside the model on the threads its size gives it and on the
    other count: every thread (`key` SPLIT) for a kernel the size rule keeps on fewer, one
    thread (`key` ONE) for a kernel it splits."""
    workload: object              # ir.workload.Workload
    template: str
    template_version: int
    occurrences: int
    config: dict
    threads: int
    one_s: float                  # typical in-model seconds per occurrence, on the fewer threads
    split_s: float                # the same, on `threads` threads
    one_runs: list = field(default_factory=list)
    split_runs: list = field(default_factory=list)
    key: str = SPLIT              # the config key that deploys the other count

    @property
    def other(self) -> tuple[float, list]:
        """(seconds, runs) on the other count than the size rule's."""
        return (self.split_s, self.split_runs) if self.key == SPLIT else (self.one_s, self.one_runs)

    @property
    def by_size(self) -> tuple[float, list]:
        """(seconds, runs) as the size rule runs it."""
        return (self.one_s, self.one_runs) if self.key == SPLIT else (self.split_s, self.split_runs)

    @property
    def kept(self) -> bool:
        return self.other[0] <= SPLIT_GAIN * self.by_size[0]

    @property
    def name(self) -> str:
        return f"{self.template}:{self.workload.describe()}"


@dataclass
class Measured:
    """Two models run in turn: end-to-end medians, and of the first its typical seconds
    per occurrence of each kernel workload and outside its kernels (reference and view
    steps, the executor loop)."""
    tuned_s: float
    default_s: float
    other_s: float
    in_model: dict                # workload key -> typical seconds per occurrence (`per_occurrence`)
    runs: int
    configs: dict = field(default_factory=dict)   # workload key -> the config the first model ran it with
    # Σ over steps of each step's typical time + the typical time outside steps (`step_sum`): on a loaded
    # machine preemption lands in some step of most calls, inflating end-to-end medians; this does not
    tuned_steps_s: float | None = None
    default_steps_s: float | None = None
    occurrences: dict = field(default_factory=dict)   # workload key -> kernel steps of the first model running it


@dataclass
class Verification:
    verdicts: list[Verdict]
    measured: Measured            # of the model as stored (before the verdicts) and the untuned one
    runs: int
    splits: list[SplitVerdict] = field(default_factory=list)   # kernels also timed on every thread, or on one

    @property
    def split(self) -> list[SplitVerdict]:
        return [s for s in self.splits if s.kept]

    @property
    def rejected(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.kept == DEFAULT]


def step_times(model, feeds: dict) -> tuple[float, list[float]]:
    """(seconds of one run, seconds of each step in it): the executor's timed run mode."""
    t0 = time.perf_counter()
    _, steps = model.run_timed(feeds)
    return time.perf_counter() - t0, steps


BLOCK = 2   # timed calls of one model in a row (after one untimed call) before the next model's turn:
            # few, so that the turns spread over time and a burst of load on a shared machine hits all models


def interleaved(models: list, feeds: dict, runs: int, block: int = BLOCK) -> list[tuple[list, np.ndarray]]:
    """Per model: (end-to-end seconds of each timed run, [runs x steps] seconds), measured as
    the deployed model runs: in blocks of `block` calls of one model in a row, after one
    untimed call that brings its weights and code back into the caches, the models taking
    turns block by block, the order rotating from round to round.

    Why blocks: a deployed model is called again and again, its own weights hot in L2/L3.
    Alternating the models call by call (block=1) makes each call find the other model's
    data in the caches: measured on BERT-small (1 thread, Zen 3), the same model's step sum
    was 0.73 ms called back to back, 0.88 ms (+19 %) alternated with a copy of itself and
    1.07 ms (+46 %) alternated with a copy and onnxruntime, its first steps up to 3x slower.
    Why turns and rotation: on a loaded machine (2 cores, load 8-10) two copies of one model
    in a fixed order measured up to 1.7x apart, by position; taking turns spreads the load
    over all models alike and rotation cancels the bias of position. One warm-up run each
    first. `runs` is rounded up to whole blocks."""
    for m in models:
        m.run(feeds)
    out = [([], []) for _ in models]

    def timed(j: int):
        def call():
            t, steps = step_times(models[j], feeds)
            out[j][0].append(t)
            out[j][1].append(steps)
        return call
    take_turns([(lambda m=m: m.run(feeds), timed(j)) for j, m in enumerate(models)], runs, block)
    return [(tot, np.asarray(per)) for tot, per in out]


SETTLE_MAX_S = 0.3      # longest wait for the other threads of the process to go idle
SETTLE_WINDOW_S = 0.01   # the kernel adds a running thread's CPU time to the process clock at its ticks (4 ms at
                         # HZ=250): a shorter window read a spinning pool as idle
SETTLE_BUSY = 0.1       # of one core: "idle"


def settle(max_s: float = SETTLE_MAX_S) -> float:
    """Wait until this process's other threads are idle (at most `max_s`); returns the seconds waited.

    Thread pools spin after a call, waiting for the next one: measured on a 2-core Zen 5 VM,
    onnxruntime's pool keeps one core busy ~50 ms after `run`, OpenBLAS's ~100 ms after a
    matmul. Whatever runs next in the process at 2 threads finds one core taken: a generated
    1024^3 matmul took 13 ms right after a NumPy matmul, 6.8 ms alone. So when runtimes take
    turns, each turn starts once the last one's spinners have stopped; within its own turn a
    runtime keeps the benefit of its spinning, as it would deployed."""
    t0 = time.perf_counter()
    while True:
        c0, w0 = time.process_time(), time.perf_counter()
        time.sleep(SETTLE_WINDOW_S)
        w1 = time.perf_counter()
        if (time.process_time() - c0) < SETTLE_BUSY * (w1 - w0) or w1 - t0 >= max_s:
            return w1 - t0


def take_turns(calls: list, runs: int, block: int = BLOCK) -> int:
    """Run `calls`, each a pair (untimed call, timed call), taking turns as `interleaved`
    describes: per turn, in the order rotating from turn to turn, `settle`, then each pair's
    untimed call (where `block` > 1: the caches switch to its data and its threads wake)
    and then `block` timed calls.
    Returns how many timed calls each made: `runs` rounded up to whole blocks."""
    block = max(1, int(block))
    turns = -(-max(1, runs) // block)
    for r in range(turns):
        for k in range(len(calls)):
            warm, call = calls[(k + r) % len(calls)]
            if len(calls) > 1:
                settle()
            if block > 1:
                warm()
            for _ in range(block):
                call()
    return turns * block


TYPICAL_PERCENTILE = 25   # of a step's seconds over the calls: its time when not preempted (see `typical`)


def typical(x, axis=None):
    """The `TYPICAL_PERCENTILE`th percentile: a preemption only ever adds time, and on the loaded
    2-core machine (load 5, 1 thread) most ResNet-18 steps of 1-5 ms were preempted in a third
    to a half of the calls, so their medians were inflated: two identical models measured
    side by side differed by 25-34 % in their sums of step medians, by 6-8 % in their sums of
    25th percentiles. Where nothing preempts, a step's times are tight and the two nearly agree."""
    return np.percentile(np.asarray(x, dtype=float), TYPICAL_PERCENTILE, axis=axis)


def step_sum(totals, per) -> float:
    """Σ over steps of each step's typical seconds + the typical (end to end - Σ steps), `typical`
    being a low percentile: a call's latency with each part at its unpreempted time (as
    `runtime.profile`'s total, which uses medians)."""
    per = np.asarray(per, dtype=float).reshape(len(totals), -1)
    return float(typical(per, axis=0).sum() + typical(np.asarray(totals) - per.sum(axis=1)))


def runs_per_occurrence(per: np.ndarray, idx: list[int]) -> list[float]:
    """Each run's seconds per occurrence of the steps `idx` (one workload's)."""
    return [float(x) for x in per[:, idx].sum(axis=1) / len(idx)]


def per_occurrence(per: np.ndarray, idx: list[int]) -> float:
    """Seconds per occurrence of the steps `idx`: the mean of their typical times, as `step_sum`
    counts them. Not the median of each call's sum over the steps: a workload occurring k times is
    k times as likely to have a preemption land in one of its steps in a given call, and
    on a loaded machine that sum's median counted the preemptions."""
    return float(typical(np.asarray(per)[:, idx], axis=0).mean())


def outside_kernels(totals, per, occurrences: dict) -> float:
    """Seconds of a call outside its kernel steps, as `step_sum` counts them: Σ over the other
    steps (reference, views, sessions) of each one's typical time + the typical time outside all
    steps (the executor loop). With `per_occurrence`'s times of the kernel workloads it adds
    up to `step_sum`."""
    per = np.asarray(per, dtype=float).reshape(len(totals), -1)
    kernel = {k for idx in occurrences.values() for k in idx}
    rest = [k for k in range(per.shape[1]) if k not in kernel]
    return float(typical(per[:, rest], axis=0).sum() + typical(np.asarray(totals) - per.sum(axis=1)))


def load_pair(graph, db, settings, fallback: str | None = None):
    """(model with the database's best configs, ignoring earlier verdicts; model with default configs)."""
    import runtime
    from runtime.choose import Chooser
    tuned = runtime.load(graph, db=db, fallback=fallback, target=settings.backend, settings=settings)
    tuned.chooser = Chooser(None, tuned.chooser.db, tuned.chooser.target_key, kind=tuned.chooser.kind,
                            use_verdicts=False)
    default = runtime.load(graph, fallback=fallback, target=settings.backend, settings=settings)
    return tuned, default


class _Threads:
    """A chooser that deploys what `inner` chooses, every kernel on every thread (`split`) or on
    one (`one`)."""

    def __init__(self, inner, **flag):
        self.inner, self.flag = inner, flag

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def choose(self, wl):
        from dataclasses import replace
        c = self.inner.choose(wl)
        return c if c.kind == REFERENCE else replace(c, **self.flag)


def thread_model(graph, db, settings, fallback: str | None = None, **flag):
    """The model `load_pair` tunes, each kernel run on every thread however small (split=True)
    or on one however large (one=True)."""
    import runtime
    from runtime.choose import Chooser
    m = runtime.load(graph, db=db, fallback=fallback, target=settings.backend, settings=settings)
    m.chooser = _Threads(Chooser(None, m.chooser.db, m.chooser.target_key, kind=m.chooser.kind,
                                 use_verdicts=False), **flag)
    return m


def _cut_by_size(kernel, threads: int) -> bool:
    """Whether the size rule runs this bound kernel on fewer than `threads` threads, and it is
    large enough (`SPLIT_MIN_WORK`) that every thread might pay."""
    from codegen.cpu import threads_for
    w = kernel.work_estimate
    return w is not None and w >= SPLIT_MIN_WORK and threads_for(threads, None, w) < threads


def _split_by_size(kernel, threads: int) -> bool:
    """Whether the size rule runs this bound kernel on more than one thread."""
    from codegen.cpu import threads_for
    w = kernel.work_estimate
    return w is not None and threads_for(threads, None, w) > 1


def _kernel_steps(steps) -> dict[str, list[int]]:
    """workload key -> the indices of the kernel steps that run it."""
    out: dict[str, list] = {}
    for k, st in enumerate(steps):
        if st.kernel is not None:
            out.setdefault(st.kernel.kernel.workload.key, []).append(k)
    return out


def measured_pair(tuned, default, feeds: dict, runs: int, timed=None) -> Measured:
    """Run `tuned` and `default` in turn (`interleaved`; `timed`: its result, when already run) and
    summarize as a `Measured`."""
    (t_tot, t_per), (d_tot, d_per) = timed or interleaved([tuned, default], feeds, runs)
    steps = tuned.prepare(feeds).steps
    occurrences = _kernel_steps(steps)
    in_model = {key: per_occurrence(t_per, idx) for key, idx in occurrences.items()}
    configs = {key: steps[idx[0]].kernel.kernel.config.to_json() for key, idx in occurrences.items()}
    return Measured(float(np.median(t_tot)), float(np.median(d_tot)), outside_kernels(t_tot, t_per, occurrences),
                    in_model,
                    max(1, runs), configs, step_sum(t_tot, t_per), step_sum(d_tot, d_per),
                    {key: len(idx) for key, idx in occurrences.items()})


MIN_SPAN_S = 0.25   # the in-model check times each model for at least this long (see `runs_to_span`)
MAX_RUNS = 400


def runs_to_span(models: list, feeds: dict, runs: int, min_s: float = MIN_SPAN_S) -> int:
    """At least `runs`, and as many as fill `min_s` seconds of each model's calls (at most
    `MAX_RUNS`), from one call of the slowest: the check's times become the estimate,
    and 5 runs of a 0.8 ms BERT-small are 4 ms of measurement, which one burst of a
    neighbour's work on a shared core moves as a whole (estimate / measured 0.86-1.49
    from run to run with the same code). Each model's first call also compiles and packs."""
    slowest = 0.0
    for m in models:
        m.run(feeds)
        t0 = time.perf_counter()
        m.run(feeds)
        slowest = max(slowest, time.perf_counter() - t0)
    return max(runs, min(MAX_RUNS, int(min_s / max(slowest, 1e-6)) + 1))


def verify_in_model(graph, db, sizes: dict, settings, runs: int = 15, fallback: str | None = None,
                    seed: int = 0, min_s: float = MIN_SPAN_S) -> Verification:
    """Time every tuned subgraph of `graph` at `sizes` against its default config inside
    the model (see the module docstring), `runs` calls of each at least and as many as fill
    `min_s` seconds (`runs_to_span`); nothing is stored (see `store_verdicts`)."""
    from runtime.cli import random_feeds
    tuned, default = load_pair(graph, db, settings, fallback)
    feeds = random_feeds(tuned.graph, dict(sizes), seed)
    t_steps, d_steps = tuned.prepare(feeds).steps, default.prepare(feeds).steps
    threads = settings.num_threads
    models = [tuned, default]
    other = {}   # SPLIT / ONE -> (the test that picks a kernel for it, the index of its model)
    for key, test, flag in ((SPLIT, _cut_by_size, {"split": True}), (ONE, _split_by_size, {"one": True})):
        if threads > 1 and settings.backend == "cpu" and \
                any(st.kernel is not None and test(st.kernel, threads) for st in t_steps):
            other[key] = (test, len(models))
            models.append(thread_model(graph, db, settings, fallback, **flag))
    runs = runs_to_span(models, feeds, runs, min_s)
    timed = interleaved(models, feeds, runs)
    (_, t_per), (_, d_per) = timed[:2]
    verdicts = []
    for idx in _kernel_steps(t_steps).values():
        ts, ds = t_steps[idx[0]], d_steps[idx[0]]
        if ts.kind not in (TUNED, NEAREST) or ds.kernel is None or ts.kernel.kernel.config == ds.kernel.kernel.config:
            continue   # a default config (nothing to compare) or no kernel in the untuned model
        kt = ts.kernel.kernel
        verdicts.append(Verdict(kt.workload, kt.template, get_template(kt.template).version, len(idx),
                                kt.config.to_json(), ds.kernel.kernel.config.to_json(), per_occurrence(t_per, idx),
                                per_occurrence(d_per, idx), runs_per_occurrence(t_per, idx),
                                runs_per_occurrence(d_per, idx)))
    splits = []
    for key, (test, m) in other.items():
        o_per = timed[m][1]
        o_steps = models[m].prepare(feeds).steps
        for idx in _kernel_steps(t_steps).values():
            ts = t_steps[idx[0]]
            if not test(ts.kernel, threads) or o_steps[idx[0]].kernel is None:
                continue
            kt = ts.kernel.kernel
            mine, theirs = (t_per, o_per) if key == SPLIT else (o_per, t_per)   # (fewer threads, `threads`)
            splits.append(SplitVerdict(kt.workload, kt.template, get_template(kt.template).version, len(idx),
                                       kt.config.to_json(), threads, per_occurrence(mine, idx),
                                       per_occurrence(theirs, idx), runs_per_occurrence(mine, idx),
                                       runs_per_occurrence(theirs, idx), key))
    return Verification(verdicts, measured_pair(tuned, default, feeds, runs, timed[:2]), max(1, runs), splits)


def store_verdicts(db, verification: Verification, target) -> int:
    """One `IN_MODEL` record per config compared (tuned and default) of every verdict, and
    of every kernel that ran faster on the other thread count its config on its threads and with
    `SPLIT` (every thread) or `ONE` (one), so the chooser deploys the fastest; returns how many
    were stored."""
    from database import Record
    recs = []
    compared = [(v.workload, v.template, v.template_version, ((v.tuned_config, v.tuned_s, v.tuned_runs),
                                                               (v.default_config, v.default_s, v.default_runs)))
                for v in verification.verdicts]
    compared += [(s.workload, s.template, s.template_version, ((s.config, *s.by_size),
                                                               ({**s.config, s.key: True}, *s.other)))
                 for s in verification.split]
    for wl, template, version, configs in compared:
        for cfg, med, runs in configs:
            spread = (max(runs) - min(runs)) / med if runs and med else None
            recs.append(Record(workload=wl.to_json(), workload_key=wl.key, signature=wl.signature, family=wl.family,
                               template=template, template_version=version, target=target.describe(),
                               config=dict(cfg), status="ok", latencies=list(runs), median=med, spread=spread,
                               strategy=IN_MODEL, flops=wl.flops()))
    if recs:
        db.add_many(recs)
    return len(recs)


@dataclass
class EstimatePart:
    """One kernel workload of the deployed program in tune's estimate."""
    workload_key: str
    name: str
    occurrences: int              # kernel steps of the deployed program that run it
    seconds: float | None         # per occurrence; None where nothing timed it
    source: str                   # "in-model check", "in-model record", "alone", "model run" or "none"


def estimate_parts(reports, db, target_key: str, measured: Measured | None = None,
                   verification: Verification | None = None, in_model: bool = True) -> list[EstimatePart]:
    """Tune's estimate, kernel workload by kernel workload of the program the model runs.

    The workloads and their occurrences are the kernel steps of the model as run
    (`verification.measured`, else `measured`), not the tasks: a task can be a
    subgraph the executor folds at load (BERT's Shape->Gather->Unsqueeze is a task that
    never runs) or occur another number of times than its weight; only where no run of
    the model is known do the tasks' weights count. Each workload's deployed config is
    its task's best, or the default where the in-model check rejected the best or the
    tuner measured nothing; its time per occurrence, first found of: the check's
    in-model time of that config (`verification`, with `in_model`), an `IN_MODEL`
    record of it (with `in_model`), the tuner's median alone, the time `measured` (else
    the check) ran it in the model."""
    from ir.keys import config_hash
    rejected = {v.workload.key for v in verification.rejected} if verification else set()
    checked: dict[tuple, float] = {}   # (workload key, config hash) -> in-model seconds per occurrence
    if verification is not None and in_model:
        m = verification.measured
        for key, t in m.in_model.items():
            if key in m.configs:
                checked[(key, config_hash(m.configs[key]))] = t
        for v in verification.verdicts:
            checked[(v.workload.key, config_hash(v.tuned_config))] = v.tuned_s
            checked[(v.workload.key, config_hash(v.default_config))] = v.default_s
    split = {s.workload.key: s for s in verification.split} if verification is not None and in_model else {}
    program = verification.measured if verification is not None else measured
    fallback = measured.in_model if measured else program.in_model if program else {}
    by_key = {r.task.workload.key: r for r in reports}
    if program is not None and program.occurrences:
        occurrences = dict(program.occurrences)
    else:
        occurrences = {key: r.task.weight for key, r in by_key.items()}
    parts = []
    for key, n in occurrences.items():
        r = by_key.get(key)
        cfg = None
        if r is not None:
            wl = r.task.workload
            cfg = r.task.template.default_config(wl).to_json() if key in rejected or r.best_config is None \
                else r.best_config
        if key in split:   # the chooser deploys the fastest config timed in the model, on the other count too
            sv = split[key]
            t_cfg = checked.get((key, config_hash(cfg))) if cfg is not None else None
            if t_cfg is None or sv.other[0] < t_cfg:
                cfg = {**sv.config, sv.key: True}
                checked[(key, config_hash(cfg))] = sv.other[0]
        found = []
        if cfg is not None:
            found.append(("in-model check", checked.get((key, config_hash(cfg)))))
            if in_model:
                found.append(("in-model record", _median(db, key, target_key, cfg, in_model=True)))
            found.append(("alone", _median(db, key, target_key, cfg, in_model=False)))
        found.append(("model run", fallback.get(key)))
        source, t = next(((src, t) for src, t in found if t is not None), ("none", None))
        parts.append(EstimatePart(key, r.task.name if r is not None else key, n, t, source))
    return parts


def deployed_estimate(reports, db, target_key: str, measured: Measured | None = None,
                      verification: Verification | None = None, in_model: bool = True) -> float | None:
    """The tuned model's latency as the tuner predicts it: Σ over the kernel workloads of
    the deployed program of occurrences × the seconds per occurrence of the config that
    is deployed (`estimate_parts`), plus the time outside kernels.

    A kernel timed alone can run faster than inside the model (its weights hot, no
    neighbours: see the module docstring), so with `in_model` each workload counts with
    its time inside the model where the in-model check measured its deployed config.
    The time outside kernels (reference and view steps, the executor loop) is the
    check's own measurement of the model (`verification.measured`), else `measured`'s;
    both are measured, never guessed. `in_model=False`: kernels as timed alone (what the
    search optimized), for comparison. None where a workload has no time at all."""
    parts = estimate_parts(reports, db, target_key, measured, verification, in_model)
    if any(p.seconds is None for p in parts):
        return None
    outside = verification.measured if verification is not None else measured
    return sum(p.occurrences * p.seconds for p in parts) + (outside.other_s if outside else 0.0)


def _median(db, workload_key: str, target_key: str, config: dict, in_model: bool) -> float | None:
    """The best median of `config` timed inside the model (`IN_MODEL` records) or alone."""
    from ir.keys import config_hash
    h = config_hash(config)
    meds = [r.median for r in db.records(workload_key=workload_key, target_key=target_key, status="ok")
            if r.config_hash == h and (r.strategy == IN_MODEL) == in_model and r.median is not None]
    return min(meds) if meds else None

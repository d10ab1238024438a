"""Measurement stages by name, the kernel that travels from builder to runner, the
target the measuring machine reports, several batches in flight, measure callbacks."""
from __future__ import annotations

import pickle
from collections import Counter

import pytest

from database import Database
from tests.simulated import TARGET, replay
from tuner.callbacks import MeasureCallback
from tuner.measure import (LocalRunner, MeasureInput, MeasureResult, MeasureStageError, ReplayRunner, make_runner,
                           register_runner, runner_names)
from tuner.tune import TuneOptions, to_record, tune_tasks

SHAPES = ["128x256x1024", "256x256x256"]


def opts(**kw):
    return TuneOptions(**{"trials": 32, "progress": False, "strategy": "random", **kw})


# -- by name ------------------------------------------------------------------------------

def test_runners_are_made_by_name_and_an_unknown_name_is_one_line():
    r = make_runner("local", timeout=5.0, repeat=2)
    try:
        assert isinstance(r, LocalRunner) and r.capacity == 1 and r.repeat == 2
    finally:
        r.close()
    with pytest.raises(MeasureStageError, match=r"unknown runner 'nope' \(choose from: .*local"):
        make_runner("nope")


def test_a_registered_runner_is_used_by_name_with_the_tuners_options():
    tasks, b, r = replay(SHAPES[:1])
    made = []

    def factory(**options):
        made.append(options)
        return ReplayRunner(list(r.tables.values()))

    register_runner("replay-test", factory)
    assert "replay-test" in runner_names()
    [rep] = tune_tasks(tasks, Database("sqlite:///:memory:"), opts(trials=8, runner="replay-test", repeat=3),
                       TARGET, b)
    assert rep.trials == 8 and len(made) == 1
    assert made[0]["repeat"] == 3 and made[0]["settings"] is not None and "timeout" in made[0]


def test_tune_cli_refuses_an_unknown_runner_before_reading_the_model(capsys):
    from tuner.cli import main
    rc = main(["--model", "does-not-matter.onnx", "--trials", "4", "--runner", "cluster9"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--runner 'cluster9'" in err[0] and "local" in err[0]


# -- the target that measured it ----------------------------------------------------------

def test_records_carry_the_measuring_machines_target_not_the_tuners_guess():
    tasks, _, _ = replay(SHAPES[:1])
    t = tasks[0]
    cfg = t.template.default_config(t.workload)
    remote = {"kind": "cpu", "cpu": "elsewhere", "key": "cpu-elsewhere"}
    measured = MeasureResult(MeasureInput(t.workload, "dense", cfg), "ok", [1e-3], target=remote)
    never_ran = MeasureResult(MeasureInput(t.workload, "dense", cfg), "compile_error", error="x")
    assert to_record(measured, TARGET, "random", 1).target == remote
    assert to_record(never_ran, TARGET, "random", 1).target_key == TARGET.key


# -- several batches in flight ------------------------------------------------------------

class TwoMachines(ReplayRunner):
    """A runner over two (pretend) machines: `submit` hands a batch to a free machine and
    returns at once; results come back alternating between the batches in flight, as two
    machines of equal speed would return them."""

    capacity = 2

    def __init__(self, tables):
        super().__init__(tables)
        self.flight: dict[int, list] = {}
        self.turn = 0
        self.max_in_flight = 0
        self.tickets: list[int] = []     # the batch of each result, in the order results came back

    def submit(self, inputs, builds):
        assert len(self.flight) < self.capacity, "the loop submitted more batches than the runner takes"
        ticket = max([0, *self.flight, *self.tickets]) + 1
        self.flight[ticket] = list(self.run(inputs, builds))
        self.max_in_flight = max(self.max_in_flight, len(self.flight))
        return ticket

    def next_result(self):
        tickets = sorted(self.flight)
        ticket = tickets[self.turn % len(tickets)]
        self.turn += 1
        r = self.flight[ticket].pop(0)
        if not self.flight[ticket]:
            del self.flight[ticket]
        self.tickets.append(ticket)
        return ticket, r


@pytest.mark.parametrize("shapes", [SHAPES, SHAPES[:1]])
def test_a_runner_of_capacity_two_gets_two_batches_and_results_stream_back_interleaved(shapes):
    tasks, b, r = replay(shapes)
    runner = TwoMachines(list(r.tables.values()))
    db = Database("sqlite:///:memory:")
    seen = Recorder()
    reps = tune_tasks(tasks, db, opts(trials=40, batch_size=4, scheduler="round-robin"), TARGET, b, runner,
                      callbacks=[seen])
    assert runner.max_in_flight == 2
    firsts = runner.tickets[:2]
    assert firsts[0] != firsts[1]                           # the second batch answered before the first was done
    recs = db.records()
    assert len(recs) == 40 == sum(x.trials for x in reps) and reps.stopped == "trials"
    assert max(Counter(x.config_hash + x.workload_key for x in recs).values()) == 1   # nothing measured twice
    assert [x.config for x in recs] == [e[2].input.config.to_json() for e in seen.events if e[0] == "result"]
    batches = [e for e in seen.events if e[0] == "batch"]
    assert len(batches) == 10 and all(n == 4 for _, _, n in batches)
    if len(shapes) == 2:   # two tasks: the two batches in flight are of different tasks
        assert {reps.order[0], reps.order[1]} == {0, 1}
    assert db.claims() == []


def test_capacity_one_builds_the_next_batch_only_after_the_last_is_timed():
    """The local rule: a build never overlaps a timing on one host."""
    tasks, b, r = replay(SHAPES[:1])
    log = []

    class Builder(type(b)):
        def build(self, inputs):
            log.append("build")
            return super().build(inputs)

    class Runner(ReplayRunner):
        def stream(self, inputs, builds):
            for x in self.run(inputs, builds):
                log.append("time")
                yield x

    b2 = Builder(list(r.tables.values()))
    tune_tasks(tasks, Database("sqlite:///:memory:"), opts(trials=12, batch_size=4), TARGET, b2,
               Runner(list(r.tables.values())))
    assert log == (["build"] + ["time"] * 4) * 3


# -- callbacks -----------------------------------------------------------------------------

class Recorder(MeasureCallback):
    def __init__(self):
        self.events = []

    def on_start(self, ctx):
        self.events.append(("start",))

    def on_result(self, ctx, i, result):
        stored = ctx.db.records(workload_key=result.input.workload.key)
        self.events.append(("result", i, result, len(stored)))

    def on_batch(self, ctx, i, results):
        self.events.append(("batch", i, len(results)))

    def on_end(self, ctx):
        self.events.append(("end", ctx.reports.stopped))


def test_user_callbacks_run_after_the_defaults_each_result_already_stored():
    tasks, b, r = replay(SHAPES[:1])
    rec = Recorder()
    tune_tasks(tasks, Database("sqlite:///:memory:"), opts(trials=8, batch_size=4), TARGET, b, r, callbacks=[rec])
    kinds = [e[0] for e in rec.events]
    assert kinds == ["start"] + (["result"] * 4 + ["batch"]) * 2 + ["end"]
    assert [e[3] for e in rec.events if e[0] == "result"] == list(range(1, 9))   # stored before we saw it
    assert rec.events[-1] == ("end", "trials")


def test_on_end_runs_after_an_interrupt_too():
    tasks, b, r = replay(SHAPES[:1])

    class Stops(ReplayRunner):
        def run(self, inputs, builds):
            raise KeyboardInterrupt

    rec = Recorder()
    with pytest.raises(KeyboardInterrupt):
        tune_tasks(tasks, Database("sqlite:///:memory:"), opts(trials=8), TARGET, b,
                   Stops(list(r.tables.values())), callbacks=[rec])
    assert rec.events == [("start",), ("end", "interrupted")]


# -- the kernel travels: real compiles (two worker processes, one small dense kernel) -------

@pytest.fixture(scope="module")
def small_dense():
    from ir import import_onnx, make_workload, partition, simplify
    from tests.helpers import dense_model
    g = simplify(import_onnx(dense_model(8, 16, 24)))
    return make_workload(g, partition(g)[0], {})


def test_the_runner_times_the_builders_kernel_from_an_empty_cache(small_dense, tmp_path):
    """BuildResult.kernel is data (it pickles); the runner's worker installs its artifact
    into its own, empty kernel cache and runs it: no template, no compile on that side."""
    from codegen import host_target
    from ir.settings import Settings
    from schedules import get_template
    from tuner.measure import LocalBuilder
    dense = get_template("dense")
    cfg = dense.default_config(small_dense)
    knob = next(k for k in dense.space(small_dense).knobs if not k.code_shape and len(k.options) > 1)
    other = cfg.to_json()   # a config differing only in a run-time knob: same source, one compile
    other[knob.name] = next(o for o in knob.options if o != other[knob.name])
    inputs = [MeasureInput(small_dense, "dense", cfg),
              MeasureInput(small_dense, "dense", dense.space(small_dense).validate(other))]
    build_settings = Settings(cache_dir=str(tmp_path / "builder"))
    run_settings = Settings(cache_dir=str(tmp_path / "runner"))
    builder = LocalBuilder(n_workers=1, timeout=300, settings=build_settings)
    runner = LocalRunner(timeout=60, repeat=2, min_repeat_ms=1, settings=run_settings)
    try:
        builds = builder.build(inputs)
        assert [x.status for x in builds] == ["ok", "ok"], [x.error for x in builds]
        assert builds[0].kernel.artifact.key == builds[1].kernel.artifact.key
        assert builds[0].kernel.config == inputs[0].config and builds[1].kernel.config == inputs[1].config
        assert pickle.loads(pickle.dumps(builds[0].kernel)).artifact.files == builds[0].kernel.artifact.files
        results = runner.run(inputs, builds)
    finally:
        builder.close()
        runner.close()
    assert [x.status for x in results] == ["ok", "ok"], [x.error for x in results]
    key = builds[0].kernel.artifact.key
    assert (tmp_path / "runner" / "kernels" / f"k_{key}.py").exists()
    assert results[0].target["key"] == host_target("cpu", run_settings).key


def test_tune_reads_the_model_file_once(monkeypatch, tmp_path, capsys):
    """Tuning, timing the whole model and writing the plan all use the graph read at the start."""
    import ir.onnx_import as onnx_import
    from tests.helpers import dense_model
    from tuner import tune
    from tuner.cli import main
    model = tmp_path / "m.onnx"
    model.write_bytes(dense_model(8, 16, 8).SerializeToString())
    reads, real = [], onnx_import.load_onnx
    monkeypatch.setattr(onnx_import, "load_onnx", lambda m: reads.append(m) or real(m))

    def tuned_instantly(tasks, db, opts, target=None, builder=None, runner=None, *, settings=None, callbacks=()):
        reps = tune.TuneReports(tune.TaskReport(t, trials=1, best=1e-3) for t in tasks)
        reps.timing, reps.order, reps.stopped = tune.Timing(), [], "trials"
        return reps

    monkeypatch.setattr(tune, "tune_tasks", tuned_instantly)
    rc = main(["--model", str(model), "--trials", "2", "--db", f"sqlite:///{tmp_path / 't.db'}", "--no-progress",
               "--measure-runs", "1", "--plan", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "measured" in out and (tmp_path / "plan.json").exists()
    assert len(reads) == 1

"""Measurement survives crashing and hanging candidates (a killed tuner: tests/test_durability.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ir import import_onnx, make_workload, partition, simplify
from schedules import get_template
from tuner.measure import LocalBuilder, LocalRunner, MeasureInput, measure

MLP = Path(__file__).resolve().parents[1] / "experiments" / "models" / "mlp.onnx"


@pytest.fixture(scope="module")
def mlp_workload():
    g = simplify(import_onnx(MLP))
    return make_workload(g, partition(g)[0], {"batch": 8})


def test_crash_and_hang_become_failed_results_and_the_run_goes_on(mlp_workload):
    dense = get_template("dense")
    cfg = dense.default_config(mlp_workload)
    inputs = [MeasureInput(mlp_workload, "dense", cfg, fault="crash"),
              MeasureInput(mlp_workload, "dense", cfg, fault="sigkill"),
              MeasureInput(mlp_workload, "dense", cfg, fault="hang"),
              MeasureInput(mlp_workload, "dense", cfg)]
    builder, runner = LocalBuilder(timeout=300), LocalRunner(timeout=20, repeat=3, min_repeat_ms=2)
    try:
        results = measure(builder, runner, inputs)
    finally:
        builder.close()
        runner.close()
    assert [r.status for r in results] == ["worker_died", "worker_died", "run_timeout", "ok"]
    assert "exit code -11" in results[0].error and "exit code -9" in results[1].error   # here, no retry
    assert "no answer" in results[2].error
    assert results[3].median > 0 and len(results[3].latencies) == 3


def test_wrong_result_is_recorded_not_ranked(mlp_workload, monkeypatch):
    """A template bug that computes garbage is caught by the NumPy check."""
    from codegen import compile_kernel
    from tuner.measure import jobs
    wl = mlp_workload
    dense = get_template("dense")
    runner_req = {"kernel": compile_kernel(dense, wl, dense.default_config(wl)), "repeat": 1, "min_repeat_ms": 1}
    real = jobs._expected
    monkeypatch.setattr(jobs, "_expected", lambda w: ([(a, e + 1.0) for a, e in real(w)[0]], real(w)[1]))
    reply = jobs.run_job(runner_req)
    assert "wrong" in reply and "max abs error" in reply["wrong"]


@pytest.mark.parametrize("threads", [1, 2])
def test_the_runner_times_the_kernel_as_a_model_program_calls_it(mlp_workload, monkeypatch, threads):
    """The check runs the bound kernel as `bk(arrays, out)`; the timed calls run its launch
    planned once on the timing buffers (`jobs._as_deployed`), as a model's program does, not
    filled again (and, split, its native argument blocks packed again) on every call."""
    from codegen import compile_kernel
    from codegen.kernel import BoundKernel
    from tuner.measure import jobs
    wl = mlp_workload
    dense = get_template("dense")
    calls, plans = [], []
    real_call, real_plan = BoundKernel.__call__, BoundKernel.plan
    monkeypatch.setattr(BoundKernel, "__call__", lambda self, *a, **k: calls.append(a) or real_call(self, *a, **k))
    monkeypatch.setattr(BoundKernel, "plan", lambda self, *a, **k: plans.append(a) or real_plan(self, *a, **k))
    from ir import settings
    before = settings.current()
    try:
        reply = jobs.run_job({"kernel": compile_kernel(dense, wl, dense.default_config(wl)), "repeat": 3,
                              "min_repeat_ms": 1, "settings": before.with_(threads=threads).to_json()})
    finally:
        settings.use(before)
    assert "wrong" not in reply and len(reply["latencies"]) == 3 and reply["number"] >= 1
    assert len(calls) == len(jobs._expected(wl)[0])   # one per check input set; none timed
    planned = [a for a in plans if a and a[1] is not None]
    assert len(planned) == 1                          # the timing buffers, planned once


def test_compile_error_is_a_result(mlp_workload):
    builder = LocalBuilder(n_workers=1, timeout=60)
    try:
        from schedules import Config
        bad = MeasureInput(mlp_workload, "dense", Config({"regtile": "5x5"}))
        [r] = builder.build([bad])
    finally:
        builder.close()
    assert r.status == "compile_error" and r.error


def test_candidates_sharing_a_code_shape_compile_once_and_each_is_measured(mlp_workload):
    """Run-time knobs are kernel arguments: two configs that differ only in them share one
    compile (one build job); a config of another code shape gets its own; all three are timed."""
    dense = get_template("dense")
    space = dense.space(mlp_workload)
    base = dense.default_config(mlp_workload)
    run_knob = next(k for k in space.knobs if not k.code_shape and len(k.options) > 1)
    code_knob = next(k for k in space.knobs if k.code_shape and len(k.options) > 1)
    other_run = next(o for o in run_knob.options if o != base[run_knob.name])
    other_code = next(o for o in code_knob.options if o != base[code_knob.name]
                      and space.allowed({**base.to_json(), code_knob.name: o}))
    configs = [base, space.validate({**base.to_json(), run_knob.name: other_run}),
               space.validate({**base.to_json(), code_knob.name: other_code})]
    builder, runner = LocalBuilder(n_workers=2, timeout=300), LocalRunner(timeout=60, repeat=1, min_repeat_ms=1)
    jobs = []
    real = builder._build_one
    builder._build_one = lambda worker, module: jobs.append(module) or real(worker, module)
    try:
        results = measure(builder, runner, [MeasureInput(mlp_workload, "dense", c) for c in configs])
    finally:
        builder.close()
        runner.close()
    assert len(jobs) == 2
    assert [r.status for r in results] == ["ok"] * 3 and all(r.median > 0 for r in results)

"""A tuned model is never slower than the untuned one (issue 13): the in-model check
(`tuner.verify`) rejects a stored config that measured fast alone but runs slower in
the model, `runtime.load(db=...)` and the plan then deploy the default, and the
estimate `tune` prints is computed from the deployed configs.

The op here is a test op with a template of its own whose `reps` knob repeats the
whole computation: reps=64 does 64 times the work of the default (reps=1) and is
stored with a tiny "alone" median, as a lucky or hot-cache measurement would be.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import runtime
from codegen import host_target
from database import Database, Record
from ir import import_onnx, simplify
from ir.custom import register_op, same_shape
from ir.settings import current
from runtime.choose import IN_MODEL, deployed_record
from schedules import ConfigSpace, Knob, Lowered, Template, find_template, register_template
from schedules.launch import Call, In, Launch, Out, Scalar
from schedules.loopnest import Assign, For, Function, LoopModule, Param
from tuner.tune import TaskReport, agreement_line
from tuner.task import extract_tasks, shape_points
from tuner.verify import deployed_estimate, store_verdicts, verify_in_model

DOMAIN = "tests.never_slower"
N = 1 << 16


def _ref(node, xs):
    return [(xs[0] * np.float32(0.5) + np.float32(1.0)).astype(xs[0].dtype)]


register_op("Affine", kind="opaque", infer=same_shape, ref=_ref, domain=DOMAIN, flops_per_elem=2)


class RepeatedTemplate(Template):
    """y = 0.5 x + 1, computed `reps` times over (each pass writes the same y)."""
    name = "never_slower_affine"
    version = 1

    def matches(self, wl):
        return len(wl.ops) == 1 and wl.ops[0]["op"] == "Affine"

    def space(self, wl):
        return ConfigSpace([Knob("reps", (1, 2, 64))])

    def default_config(self, wl):
        return self.space(wl).validate({"reps": 1})

    def lower(self, wl, cfg):
        body = (For("r", "0", str(cfg["reps"]), (
            For("i", "0", "n", (Assign("y[i]", "x[i] * np.float32(0.5) + np.float32(1.0)"),)),)),)
        params = (Param("x", "float32[::1]"), Param("y", "float32[::1]"), Param("n", "int64"),
                  Param("t", "int64"), Param("T", "int64"))
        module = LoopModule((Function("affine", params, body),), doc=f"affine reps={cfg['reps']}",
                            meta={"template": f"{self.name} v{self.version}"})
        call = Call("affine", (In(0, (N,), "float32"), Out((N,)), Scalar(N)), items=1, parallel=False)
        return Lowered(module, Launch((call,)))


register_template(RepeatedTemplate())


def _model() -> onnx.ModelProto:
    node = helper.make_node("Affine", ["x"], ["y"], domain=DOMAIN, name="affine")
    g = helper.make_graph([node], "affine", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


def _record(wl, template, config: dict, median: float, target: dict, strategy: str = "random") -> Record:
    return Record(workload=wl.to_json(), workload_key=wl.key, signature=wl.signature, family=wl.family,
                  template=template.name, template_version=template.version, target=target, config=config,
                  status="ok", latencies=[median] * 3, median=median, strategy=strategy, flops=wl.flops())


@pytest.fixture
def setup(tmp_path):
    graph = simplify(import_onnx(_model()))
    points = shape_points(graph.dims, None)
    tasks, _ = extract_tasks(graph, points)
    assert len(tasks) == 1
    wl = tasks[0].workload
    template = find_template(wl)
    assert template.name == RepeatedTemplate.name
    target = host_target()
    db = Database(f"sqlite:///{tmp_path / 'v.db'}")
    # "alone", the repeated config looked 1000x faster than the default: it is the stored best
    db.add_many([_record(wl, template, {"reps": 64}, 1e-9, target.describe()),
                 _record(wl, template, {"reps": 1}, 1e-6, target.describe())])
    return graph, points, tasks, wl, db, target, tmp_path


def test_a_config_fast_alone_but_slow_in_the_model_is_replaced_by_the_default(setup):
    graph, points, tasks, wl, db, target, tmp_path = setup
    assert runtime.load(graph, db=db).prepare({"x": np.zeros(N, np.float32)}).steps[0].kernel.kernel.config["reps"] == 64

    v = verify_in_model(graph, db, points[0], current(), runs=5)
    assert len(v.verdicts) == 1
    verdict = v.verdicts[0]
    assert verdict.tuned_config == {"reps": 64} and verdict.default_config == {"reps": 1}
    assert verdict.tuned_s > 4 * verdict.default_s   # 64x the work, measured in the model
    assert verdict.kept == "default" and v.rejected == [verdict]

    assert store_verdicts(db, v, target) == 2
    assert {(r.config["reps"], r.strategy) for r in db.records()} >= {(64, IN_MODEL), (1, IN_MODEL)}
    # the stored best alone is still reps=64, but what deploys is the in-model verdict
    assert db.best(wl.key, target.key, 1)[0].config == {"reps": 64}
    assert deployed_record(db, wl.key, target.key).config == {"reps": 1}
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    deployed = runtime.load(graph, db=db)
    assert deployed.prepare({"x": x}).steps[0].kernel.kernel.config["reps"] == 1
    np.testing.assert_allclose(deployed.run({"x": x})["y"], _ref(None, [x])[0], rtol=1e-6)
    plan = runtime.build_plan(graph, db, points, target.key, target=target)
    assert [e.config for e in plan.entries] == [{"reps": 1}]

    # the estimate: occurrences x the deployed config's (the default's) time inside the model, as the check
    # measured it, plus what runs outside kernels in the model; timed alone it would be the default's 1 us
    rep = TaskReport(tasks[0], best=1e-9, best_config={"reps": 64}, default=1e-6)
    m = v.measured
    assert deployed_estimate([rep], db, target.key, m, v) == pytest.approx(verdict.default_s + m.other_s)
    assert deployed_estimate([rep], db, target.key, m, v, in_model=False) == pytest.approx(1e-6 + m.other_s)
    # without the verdict the tuned config counts as deployed: with its stored in-model time, or alone with the
    # stored best's 1 ns, what misled the tuner
    assert deployed_estimate([rep], db, target.key, m) == pytest.approx(verdict.tuned_s + m.other_s)
    assert deployed_estimate([rep], db, target.key, m, in_model=False) == pytest.approx(1e-9 + m.other_s)
    assert m.configs == {wl.key: {"reps": 64}}
    assert m.in_model[wl.key] > 0 and m.tuned_s >= m.in_model[wl.key]


def test_the_verdict_holds_until_a_new_best_is_stored(setup):
    graph, points, tasks, wl, db, target, tmp_path = setup
    store_verdicts(db, verify_in_model(graph, db, points[0], current(), runs=3), target)
    assert deployed_record(db, wl.key, target.key).config == {"reps": 1}
    # a later tune stores a config never timed in the model as the new best: it deploys as measured
    # until that run's own check
    template = find_template(wl)
    db.add(_record(wl, template, {"reps": 2}, 1e-12, target.describe()))
    assert deployed_record(db, wl.key, target.key).config == {"reps": 2}
    # where the best alone is the default config there is nothing to compare
    fresh = Database(f"sqlite:///{tmp_path / 'fresh.db'}")
    fresh.add(_record(wl, template, {"reps": 1}, 1e-6, target.describe()))
    assert verify_in_model(graph, fresh, points[0], current(), runs=2).verdicts == []


def test_the_agreement_line_warns_beyond_the_tolerance():
    assert "more than 20%" in agreement_line(1e-3, 2e-3, 2.5e-3)
    line = agreement_line(1.9e-3, 2e-3, 2.5e-3)
    assert "more than" not in line and "-5% off" in line and "tuned/untuned 0.80" in line


def test_the_step_sum_ignores_a_preemption_that_lands_in_a_different_step_each_call():
    from tuner.verify import step_sum
    per = np.full((5, 4), 1e-3)
    for k in range(3):          # 3 of 5 calls lose 16 ms, each in another step
        per[k, k] += 16e-3
    totals = per.sum(axis=1) + 1e-4    # 0.1 ms outside the steps
    assert np.median(totals) > 16e-3
    assert step_sum(totals, per) == pytest.approx(4e-3 + 1e-4)

"""Tune's estimate of the deployed latency (`tuner.verify`) counts every step the deployed
model runs, each once per occurrence, and nothing it does not run; and the in-model
timing measures each model as it is deployed, its calls back to back (issue 13: on
BERT-small the estimate was 0.62 of the measured latency with every step on its default
config)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from codegen import host_target
from database import Database, Record
from ir import import_onnx, simplify
from ir.settings import current
from tuner.task import extract_tasks, shape_points
from tuner.tune import TaskReport, measure_deployed
from tuner.verify import deployed_estimate, estimate_parts, interleaved, outside_kernels, per_occurrence, step_sum

WIDTH = 1 << 15


def _model() -> onnx.ModelProto:
    """y = relu(x) * 2 + pos[:seq], seq read from Shape(x) as exporters write it (BERT's position
    embedding): the Gather+Unsqueeze of the shape is a task, but the executor folds it at load."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "two"], ["m"], name="mul"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "one"], ["n"], name="seq_dim", axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"], name="seq_1d"),
        helper.make_node("Slice", ["pos", "ax0", "n1", "ax0"], ["p"], name="pos_slice"),
        helper.make_node("Add", ["m", "p"], ["y"], name="add"),
    ]
    inits = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
             helper.make_tensor("one", TensorProto.INT64, [], [1]),
             helper.make_tensor("ax0", TensorProto.INT64, [1], [0]),
             numpy_helper.from_array(np.linspace(-1, 1, WIDTH, dtype=np.float32), "pos")]
    g = helper.make_graph(nodes, "folded_shape",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _alone_record(task, median: float, target) -> Record:
    wl, t = task.workload, task.template
    return Record(workload=wl.to_json(), workload_key=wl.key, signature=wl.signature, family=wl.family,
                  template=t.name, template_version=t.version, target=target.describe(),
                  config=t.default_config(wl).to_json(), status="ok", latencies=[median] * 3, median=median,
                  strategy="random", flops=wl.flops())


def test_the_estimate_of_a_default_only_database_is_the_deployed_models_step_sum(tmp_path):
    graph = simplify(import_onnx(_model()))
    points = shape_points(graph.dims, {"batch": [4], "seq": [WIDTH]})
    tasks, _ = extract_tasks(graph, points)
    target = host_target()
    db = Database(f"sqlite:///{tmp_path / 'd.db'}")
    measured = measure_deployed(graph, db, points[0], runs=10, settings=current())
    # at least 10 calls each, as many as fill the check's 0.25 s: this 0.2 ms model gets more (10 calls of the
    # bundled MLP, 2.5 ms of measurement, read the same deployment 1.25-1.62x apart)
    assert measured.runs > 10
    not_run = [t for t in tasks if t.workload.key not in measured.occurrences]
    assert not_run, [t.name for t in tasks]   # the shape computation: a task the model never runs
    kernel_steps = sum(measured.occurrences.values())
    assert kernel_steps >= 1

    reports = [TaskReport(t) for t in tasks]    # nothing tuned: every step on its default config
    parts = estimate_parts(reports, db, target.key, measured)
    assert sum(p.occurrences for p in parts) == kernel_steps
    assert all(p.source == "model run" for p in parts)
    est = deployed_estimate(reports, db, target.key, measured)
    assert est is not None
    # from the same runs, each step counted once with its median: the step sum, exactly. Leaving the
    # kernel step out, or counting it twice, misses by its share, far more than the tolerance. (Its share
    # itself is the machine's: on a loaded 2-core CI host the shape steps took 70 % of the sum.)
    kernels = sum(p.occurrences * p.seconds for p in parts)
    assert kernels > 1e-6 * measured.tuned_steps_s
    assert est == pytest.approx(measured.tuned_steps_s, rel=1e-9)

    # a stored time of that task (a tuner's record of it) does not count: that step never runs
    db.add_many([_alone_record(t, 1.0, target) for t in not_run])
    assert deployed_estimate(reports, db, target.key, measured) == pytest.approx(est)


class _FakeModel:
    """Records which model each call ran, timed or not."""
    def __init__(self, name, log):
        self.name, self.log = name, log

    def run(self, feeds):
        self.log.append((self.name, False))

    def run_timed(self, feeds):
        self.log.append((self.name, True))
        return {}, [1e-6, 2e-6]


def test_each_timed_call_follows_a_call_of_the_same_model():
    """As deployed, a model's calls come back to back (its weights in the caches): a timed call right
    after another model's call would measure that model's cache footprint too."""
    log = []
    models = [_FakeModel("a", log), _FakeModel("b", log), _FakeModel("c", log)]
    out = interleaved(models, {}, runs=9, block=3)
    assert [len(tot) for tot, _ in out] == [9, 9, 9]
    assert all(per.shape == (9, 2) for _, per in out)
    for prev, (name, is_timed) in zip(log, log[1:]):
        if is_timed:
            assert prev[0] == name
    # the models take turns and the order rotates, so that a loaded machine hits all of them alike
    firsts = [name for k, (name, is_timed) in enumerate(log[3:]) if not is_timed and k % 4 == 0]
    assert firsts[:3] == ["a", "b", "c"] and firsts[3:6] == ["b", "c", "a"]


def test_kernel_and_outside_times_add_up_to_the_step_sum_and_ignore_scattered_preemptions():
    """Steps 0 and 2 run workload "k" (2 occurrences), 1 and 3 are reference/view steps; 16 ms preemptions
    land in 3 of 5 calls' kernel steps and in 3 of 5 calls' other steps, never twice in one step's
    majority: medians of per-call sums (over k's steps, over the other steps) would count them."""
    per = np.tile([1e-3, 2e-4, 1e-3, 3e-4], (5, 1))
    for call, step in ((0, 1), (1, 3), (2, 1), (0, 0), (3, 0), (4, 2)):
        per[call, step] += 16e-3
    totals = per.sum(axis=1) + 1e-4
    occurrences = {"k": [0, 2]}
    assert per_occurrence(per, [0, 2]) == pytest.approx(1e-3)
    assert outside_kernels(totals, per, occurrences) == pytest.approx(2e-4 + 3e-4 + 1e-4)
    assert 2 * per_occurrence(per, [0, 2]) + outside_kernels(totals, per, occurrences) == \
        pytest.approx(step_sum(totals, per))

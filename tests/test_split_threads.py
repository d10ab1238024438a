"""Kernels that the size rule keeps on fewer threads are timed on every thread by the
in-model check (`tuner.verify.SplitVerdict`), and where that ran faster the `SPLIT` record
deploys them so, from the database and from a plan (issue 13: ResNet-18's 64-channel
convs ran 1.3-1.6x faster on two threads of a Zen 4 guest, and slower on Intel guests).
The other way too: kernels it splits are timed on one thread, and a `ONE` record keeps them
there where that ran faster (ViT's small projections on a Zen 3 guest)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime
import tuner.verify as verify
from codegen import host_target
from codegen.cpu import _Spread
from database import Database
from ir import import_onnx, simplify
from ir.settings import Settings
from runtime.choose import IN_MODEL, ONE, SPLIT, deployed_record
from tuner.task import extract_tasks, shape_points
from tuner.tune import TaskReport, verification_lines

C, HW = 16, 8   # 2 * 16 * 16 * 9 * 64 = 0.3 M FLOPs (+ 17 KB): under two threads' share (2 x 2^18)
C_SPLIT, HW_SPLIT = 64, 16   # 2 * 64 * 64 * 9 * 256 = 19 M FLOPs: the size rule splits it on two threads


def _graph(C=C, HW=HW):
    w = np.random.default_rng(0).standard_normal((C, C, 3, 3)).astype(np.float32) * 0.1
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")
    g = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, HW, HW])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, HW, HW])],
                          initializer=[numpy_helper.from_array(w, "w")])
    return simplify(import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])))


def _verified(folder, c: int, hw: int):
    """The check of a c-channel conv on hw x hw, on two threads, against an empty database (its
    default config)."""
    graph, settings = _graph(c, hw), Settings(threads=2)
    db = Database(f"sqlite:///{folder / 'v.db'}")
    points = shape_points(graph.dims, None)
    return graph, settings, db, points, verify.verify_in_model(graph, db, points[0], settings, runs=3)


def _checked(verified, folder):
    """`verified` with a database of its own and a copy of the check to change."""
    graph, settings, _, points, v = verified
    return graph, settings, Database(f"sqlite:///{folder / 'c.db'}"), points, copy.deepcopy(v)


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    return _verified(tmp_path_factory.mktemp("split"), C, HW)


@pytest.fixture
def checked(verified, tmp_path):
    return _checked(verified, tmp_path)


def _x(c: int = C, hw: int = HW):
    return {"x": np.random.default_rng(1).standard_normal((1, c, hw, hw)).astype(np.float32)}


def test_a_kernel_cut_by_its_size_is_timed_on_every_thread(checked):
    graph, settings, db, points, v = checked
    assert v.verdicts == []   # nothing tuned: no config to compare with the default
    assert len(v.splits) == 1
    s = v.splits[0]
    assert s.threads == 2 and s.template == "conv2d" and s.occurrences == 1
    assert s.one_s > 0 and s.split_s > 0 and len(s.one_runs) == len(s.split_runs) >= 3
    # on one thread nothing is cut, and no third model runs
    assert verify.verify_in_model(graph, db, points[0], Settings(threads=1), runs=2).splits == []


def test_a_faster_split_is_stored_and_deployed_on_every_thread(checked):
    graph, settings, db, points, v = checked
    s = v.splits[0]
    s.split_s = s.one_s / 2   # as on a machine whose second thread pays
    target = host_target(settings=settings)
    assert verify.store_verdicts(db, v, target) == 2
    assert {r.strategy for r in db.records()} == {IN_MODEL}
    assert deployed_record(db, s.workload.key, target.key).config == {**s.config, SPLIT: True}
    assert any("every thread" in line for line in verification_lines(TaskReportsWith(v)))

    untuned = runtime.load(graph, settings=settings).run(_x())["y"]
    plan = runtime.build_plan(graph, db, points, target.key, target=target)
    assert plan.entries[0].config[SPLIT] is True
    for deployed in (runtime.load(graph, db=db, settings=settings), runtime.load(graph, plan=plan, settings=settings)):
        step = deployed.prepare(_x()).steps[0]
        assert step.kernel.work_estimate is None and step.kernel.kernel.config.to_json() == s.config
        runs = [run for run, _ in step.kernel.plan([None], None, None).calls]
        assert any(isinstance(r, _Spread) and r.threads == 2 for r in runs)
        np.testing.assert_allclose(deployed.run(_x())["y"], untuned, rtol=1e-5, atol=1e-5)

    # tune's estimate counts the conv with its time on every thread
    assert _estimated(graph, points, db, target, v, s.one_s) == [pytest.approx(s.split_s)]


def _estimated(graph, points, db, target, v, default_s: float) -> list:
    """tune's estimate of the conv's seconds, from the check `v` and the database."""
    tasks, _ = extract_tasks(graph, points)
    rep = TaskReport(tasks[0], best=None, best_config=None, default=default_s)
    return [p.seconds for p in verify.estimate_parts([rep], db, target.key, v.measured, v)]


def _deployed_after_storing(checked, x):
    """The conv's step deployed from the database after storing the check `checked` holds."""
    graph, settings, db, points, v = checked
    assert verify.store_verdicts(db, v, host_target(settings=settings)) == 0
    return runtime.load(graph, db=db, settings=settings).prepare(x).steps[0]


def test_a_split_that_did_not_pay_is_not_stored(checked):
    v = checked[-1]
    v.splits[0].split_s = v.splits[0].one_s * 1.01   # within the noise margin
    assert _deployed_after_storing(checked, _x()).kernel.work_estimate is not None


class TaskReportsWith:
    def __init__(self, v):
        self.verification = v


def test_two_thread_models_have_a_window_of_split_candidates():
    """Kernels below two threads' share (`MIN_WORK_PER_THREAD` x 2) and above `SPLIT_MIN_WORK`
    are the ones the check times on every thread: the window must not be empty."""
    from codegen import cpu
    assert verify.SPLIT_MIN_WORK < 2 * cpu.MIN_WORK_PER_THREAD
    assert verify._cut_by_size(type("K", (), {"work_estimate": verify.SPLIT_MIN_WORK})(), 2)


@pytest.fixture(scope="module")
def verified_split(tmp_path_factory):
    """The check of a conv the size rule splits."""
    return _verified(tmp_path_factory.mktemp("one"), C_SPLIT, HW_SPLIT)


@pytest.fixture
def checked_split(verified_split, tmp_path):
    return _checked(verified_split, tmp_path)


def _x_split():
    return _x(C_SPLIT, HW_SPLIT)


def test_a_kernel_split_by_its_size_is_timed_on_one_thread(checked_split):
    graph, settings, db, points, v = checked_split
    assert [s.key for s in v.splits] == [ONE]
    s = v.splits[0]
    assert s.threads == 2 and s.template == "conv2d" and s.occurrences == 1
    assert s.one_s > 0 and s.split_s > 0 and len(s.one_runs) == len(s.split_runs) >= 3
    assert s.by_size == (s.split_s, s.split_runs) and s.other == (s.one_s, s.one_runs)


def test_a_faster_single_thread_is_stored_and_deployed_on_one_thread(checked_split):
    graph, settings, db, points, v = checked_split
    s = v.splits[0]
    s.one_s = s.split_s / 2   # as on a machine whose second thread costs more than it brings
    target = host_target(settings=settings)
    assert verify.store_verdicts(db, v, target) == 2
    assert deployed_record(db, s.workload.key, target.key).config == {**s.config, ONE: True}
    assert any("deployed on one thread" in line for line in verification_lines(TaskReportsWith(v)))

    untuned = runtime.load(graph, settings=settings)
    step = untuned.prepare(_x_split()).steps[0]
    assert any(isinstance(r, _Spread) for r, _ in step.kernel.plan([None], None, None).calls)   # split by size
    plan = runtime.build_plan(graph, db, points, target.key, target=target)
    assert plan.entries[0].config[ONE] is True
    for deployed in (runtime.load(graph, db=db, settings=settings), runtime.load(graph, plan=plan, settings=settings)):
        step = deployed.prepare(_x_split()).steps[0]
        assert step.kernel.work_estimate == 0 and step.kernel.kernel.config.to_json() == s.config
        assert not any(isinstance(r, _Spread) for r, _ in step.kernel.plan([None], None, None).calls)
        np.testing.assert_allclose(deployed.run(_x_split())["y"], untuned.run(_x_split())["y"], rtol=1e-5, atol=1e-5)

    # tune's estimate counts the conv with its time on one thread
    assert _estimated(graph, points, db, target, v, s.split_s) == [pytest.approx(s.one_s)]


def test_a_single_thread_that_did_not_pay_is_not_stored(checked_split):
    v = checked_split[-1]
    v.splits[0].one_s = v.splits[0].split_s * 0.97   # within the noise margin
    assert _deployed_after_storing(checked_split, _x_split()).kernel.work_estimate

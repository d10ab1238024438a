"""Measurement on a real multi-node Ray cluster (ray.cluster_utils, on this machine):
`tune --ray` end to end, per-node targets kept apart, and the faults a cluster has
(a worker process, an actor or a whole node lost mid-run; a crashing kernel).

Three nodes: two of one CPU and one of two, so the cluster has two kinds of node
(target keys differ by thread count). One cluster for the module; never `ray stop`.
"""
from __future__ import annotations

import os
import signal

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

for _k, _v in {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}.items():
    os.environ.setdefault(_k, _v)
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tensortune[cluster]')")

from codegen import get_backend  # noqa: E402
from database import Database  # noqa: E402
from ir import import_onnx, simplify  # noqa: E402
from ir.settings import Settings  # noqa: E402
from tuner.callbacks import MeasureCallback  # noqa: E402
from tuner.measure import LocalRunner, MeasureInput, make_builder, make_runner  # noqa: E402
from tuner.measure import ray as ray_stage  # noqa: E402
from tuner.search import make_strategy  # noqa: E402
from tuner.task import extract_tasks, shape_points  # noqa: E402
from tuner.tune import TuneOptions, builder_options, runner_options, tune_tasks  # noqa: E402

pytestmark = pytest.mark.long   # a 3-node local Ray cluster: minutes (CI runs it)

STORE = 80_000_000   # Ray's minimum
# no compile budget: it picks by measured compile times, and these tests compare two runs' proposals
QUICK = ["--trials", "6", "--batch-size", "2", "--strategy", "random", "--measure-runs", "0", "--no-progress",
         "--repeat", "2", "--min-repeat-ms", "1", "--compile-share", "0"]


def elementwise_model(n=256) -> onnx.ModelProto:
    """relu(x + b): kernels that compile in well under two seconds."""
    b = numpy_helper.from_array(np.arange(n, dtype=np.float32), "b")
    nodes = [helper.make_node("Add", ["x", "b"], ["y"]), helper.make_node("Relu", ["y"], ["out"])]
    g = helper.make_graph(nodes, "ew", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, n])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [64, n])], [b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("ray_cache")
    os.chmod(d, 0o700)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TENSORTUNE_CACHE", str(d))   # the CLI's settings come from the environment
        yield str(d)


@pytest.fixture(scope="module")
def cluster(cache):
    from ray.cluster_utils import Cluster
    c = Cluster(initialize_head=True,
                head_node_args={"num_cpus": 1, "object_store_memory": STORE, "include_dashboard": False})
    try:
        workers = [c.add_node(num_cpus=1, object_store_memory=STORE),
                   c.add_node(num_cpus=2, object_store_memory=STORE)]
        ray.init(address=c.address, log_to_driver=False)
        yield c, workers
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("ray_model") / "ew.onnx"
    onnx.save(elementwise_model(), p)
    return str(p)


def key_for(threads: int, cache: str) -> str:
    """The target key a node of `threads` CPUs on this machine measures under."""
    return get_backend("cpu", Settings(cache_dir=cache, threads=threads)).target().key


def test_ray_builder_alone_compiles_as_tasks_and_the_kernels_run_anywhere(cluster, cache, model_path):
    assert not ray_stage._live_runners   # no runner holds the nodes: builds are Ray tasks
    settings = Settings(cache_dir=cache)
    [task] = _tasks(model_path)
    cfgs = make_strategy("random", task.template.space(task.workload), seed=3).propose(2)
    inputs = [MeasureInput(task.workload, task.template.name, c) for c in cfgs]
    builder, runner = make_builder("ray", settings=settings), LocalRunner(repeat=2, min_repeat_ms=1, settings=settings)
    try:
        builds = builder.build(inputs)
        assert all(b.ok and b.kernel.artifact is not None for b in builds), [b.error for b in builds]
        assert all(r.ok for r in runner.run(inputs, builds))
    finally:
        runner.close()
        builder.close()


def _measured(db) -> list:
    """The records of measured candidates: less the verdicts of tune's in-model check, which it
    stores when the configs were tuned for this machine's own target (a node like the driver)."""
    return [r for r in db.records() if r.strategy != "in-model"]


def test_tune_on_ray_gives_records_like_a_local_run_from_every_node(cluster, cache, model_path, tmp_path, capsys):
    from tuner.cli import main
    c, _ = cluster
    ray_db, local_db = f"sqlite:///{tmp_path}/ray.db", f"sqlite:///{tmp_path}/local.db"
    assert main(["--model", model_path, "--db", ray_db, "--ray", c.address] + QUICK) == 0
    out = capsys.readouterr().out
    assert "measuring on 3 Ray node(s)" in out
    assert main(["--model", model_path, "--db", local_db] + QUICK) == 0
    on_ray, local = _measured(Database(ray_db)), _measured(Database(local_db))
    assert len(on_ray) == len(local) == 6
    assert sorted(r.status for r in on_ray) == sorted(r.status for r in local) == ["ok"] * 6
    assert {r.config_hash for r in on_ray} == {r.config_hash for r in local}   # same proposals, same seed
    assert {(r.workload_key, r.template, r.template_version) for r in on_ray} == \
        {(r.workload_key, r.template, r.template_version) for r in local}
    assert all(len(r.latencies) == 2 and r.median > 0 for r in on_ray + local)
    # three batches in flight on three nodes: both kinds of node measured, each under its own target
    assert {r.target["threads"] for r in on_ray} == {1, 2}
    assert {r.target["key"] for r in on_ray} == {key_for(1, cache), key_for(2, cache)}


def test_target_key_tunes_one_kind_of_node_and_keys_never_mix(cluster, cache, model_path, tmp_path, capsys):
    from tuner.cli import main
    c, _ = cluster
    db_url, one, two = f"sqlite:///{tmp_path}/keys.db", key_for(1, cache), key_for(2, cache)
    assert main(["--model", model_path, "--db", db_url, "--ray", c.address, "--target-key", one] + QUICK) == 0
    assert "measuring on 2 Ray node(s)" in capsys.readouterr().out
    db = Database(db_url)
    first = _measured(db)
    assert len(first) == 6 and {r.target["key"] for r in first} == {one}
    assert main(["--model", model_path, "--db", db_url, "--runner", "ray", "--ray", c.address,
                 "--target-key", two] + QUICK) == 0
    assert "measuring on 1 Ray node(s)" in capsys.readouterr().out
    recs = _measured(db)
    # the second kind measured the same configs again (resume is per target) and nothing of the first changed
    assert [r.id for r in recs if r.target["key"] == one] == [r.id for r in first]
    # key two is this machine's: tune then also checks its configs inside the model (in-model records)
    twos = [r for r in recs if r.target["key"] == two]
    assert len(twos) == 6 and {r.target["threads"] for r in twos} == {2}
    assert {r.config_hash for r in twos} == {r.config_hash for r in first}
    wl = first[0].workload_key
    assert db.best(wl, one)[0].target["key"] == one and db.best(wl, two)[0].target["key"] == two
    assert main(["--model", model_path, "--db", db_url, "--ray", c.address, "--target-key", "cpu-nope"] + QUICK) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no node's target key is cpu-nope" in err[0] and one in err[0] and two in err[0]


def test_tune_batch_on_ray_measures_on_the_nodes_and_a_shared_model_once(cluster, cache, model_path, tmp_path,
                                                                        capsys):
    """`tune-batch --ray`: the Ray stages, records under the measuring nodes' key, and a second
    model with the same subgraphs measures nothing (the database says they are done)."""
    import shutil
    from tuner.batch import main
    c, _ = cluster
    one = key_for(1, cache)
    twin = tmp_path / "twin.onnx"
    shutil.copy(model_path, twin)
    db_url = f"sqlite:///{tmp_path}/batch.db"
    i = QUICK.index("--measure-runs")
    flags = QUICK[:i] + QUICK[i + 2:]   # tune-batch measures no whole model
    assert main([model_path, str(twin), "--db", db_url, "--ray", c.address, "--target-key", one] + flags) == 0
    recs = Database(db_url).records()
    assert recs and all(r.status == "ok" for r in recs) and {r.target["key"] for r in recs} == {one}
    assert len({r.config_hash for r in recs}) == len(recs)   # nothing measured twice


def test_an_address_that_does_not_answer_is_one_line_and_exit_2(model_path, capsys, monkeypatch):
    from tuner.cli import main
    monkeypatch.setattr(ray, "is_initialized", lambda: False)   # as a fresh driver would be
    assert main(["--model", model_path, "--ray", "127.0.0.1:1"] + QUICK) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Ray cluster answers at 127.0.0.1:1" in err[0]


def test_ray_flags_with_another_runner_are_refused_before_anything_runs(capsys):
    from tuner.cli import main
    for flags in (["--runner", "local", "--ray", "auto"], ["--target-key", "cpu-x"]):
        assert main(["--model", "does-not-matter.onnx"] + flags + QUICK) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "goes with --runner ray" in err[0]


# -- faults ---------------------------------------------------------------------------------------

def _tasks(model_path):
    g = simplify(import_onnx(model_path))
    return extract_tasks(g, shape_points(g.dims, None))[0]


@pytest.fixture(scope="module")
def stages(cluster, cache):
    """Made by name with the tuner's options, as `tune_tasks` makes them."""
    settings = Settings(cache_dir=cache)
    opts = TuneOptions(runner="ray", builder="ray", ray=cluster[0].address, repeat=2, min_repeat_ms=1, run_timeout=60)
    runner = make_runner("ray", **runner_options(opts, settings))
    builder = make_builder("ray", **builder_options(opts, settings))
    try:
        yield builder, runner
    finally:
        runner.close()
        builder.close()


class OnFirstResult(MeasureCallback):
    """Do `act(runner, actor index)` once, to an actor with work in flight, right after the first result."""

    def __init__(self, runner, act):
        self.runner, self.act, self.victim = runner, act, None

    def on_result(self, ctx, i, result):
        if self.victim is None:
            busy = [a for a in sorted(self.runner.healthy) if self.runner.load[a] > 0 and self.eligible(a)]
            self.victim = busy[0]
            self.act(self.runner, self.victim)

    def eligible(self, a):
        return True


def _tune_with(stages, model_path, tmp_path, callback, trials=8):
    builder, runner = stages
    db = Database(f"sqlite:///{tmp_path}/faults.db")
    opts = TuneOptions(trials=trials, batch_size=2, strategy="random", progress=False, repeat=2, min_repeat_ms=1)
    retried = runner.retried
    [rep] = tune_tasks(_tasks(model_path), db, opts, runner.target, builder, runner, callbacks=[callback])
    return rep, db.records(), runner.retried - retried


def _kill_process(runner, a):
    os.kill(runner.pids[a], signal.SIGKILL)


def _kill_actor(runner, a):
    ray.kill(runner.actors[a], no_restart=False)


@pytest.mark.parametrize("kill", [_kill_process, _kill_actor], ids=["worker-process", "actor"])
def test_losing_a_worker_process_or_an_actor_mid_run_costs_a_retry_not_a_result(stages, model_path, tmp_path, kill):
    cb = OnFirstResult(stages[1], kill)
    rep, recs, retried = _tune_with(stages, model_path, tmp_path, cb)
    assert cb.victim is not None and retried >= 1
    assert rep.trials == 8 and len(recs) == 8 and {r.status for r in recs} == {"ok"}


def test_a_candidate_recorded_worker_died_only_after_its_retries_and_the_actors_come_back(stages, model_path):
    builder, runner = stages
    [task] = _tasks(model_path)
    cfg = task.template.default_config(task.workload)
    doomed = [MeasureInput(task.workload, task.template.name, cfg, fault="exit-actor")]
    [r] = runner.run(doomed, builder.build(doomed))
    assert r.status == "worker_died" and "lost 3 times" in r.error   # 1 try + 2 retries, on other nodes
    again = [MeasureInput(task.workload, task.template.name, cfg) for _ in range(3)]
    assert [x.status for x in runner.run(again, builder.build(again))] == ["ok"] * 3   # restarted actors serve


def _faulty_then_fine(stages, model_path, fault):
    """Measure a candidate with `fault`, then a fine one, in one batch: (results, the actors'
    processes before, the runner's retries before)."""
    builder, runner = stages
    [task] = _tasks(model_path)
    cfg = task.template.default_config(task.workload)
    inputs = [MeasureInput(task.workload, task.template.name, cfg, fault=fault),
              MeasureInput(task.workload, task.template.name, cfg)]
    pids, retried = ray.get([a.ping.remote() for a in runner.actors]), runner.retried
    return runner.run(inputs, builder.build(inputs)), pids, retried


def test_a_crashing_kernel_costs_one_result_not_the_actor(stages, model_path):
    runner = stages[1]
    (crashed, fine), pids, retried = _faulty_then_fine(stages, model_path, "crash")
    assert crashed.status == "worker_died" and "worker process died" in crashed.error   # its child, not the actor
    assert fine.status == "ok" and runner.retried == retried   # not retried elsewhere
    assert ray.get([a.ping.remote() for a in runner.actors]) == pids   # the same actor processes serve


def test_a_worker_child_killed_from_outside_is_a_lost_node_retried_elsewhere(stages, model_path):
    """Ray kills an exiting actor's children before the actor (`ray.kill`), so a reply can come
    back first saying the child died: SIGKILL from outside is the node's loss, not the kernel's."""
    runner = stages[1]
    (killed, fine), pids, retried = _faulty_then_fine(stages, model_path, "sigkill")
    assert killed.status == "worker_died" and "lost 3 times" in killed.error and "ChildKilled" in killed.error
    assert fine.status == "ok" and runner.retried == retried + 2
    assert ray.get([a.ping.remote() for a in runner.actors]) == pids   # the actors themselves never died


def test_losing_a_whole_node_mid_run_the_driver_and_the_run_survive(stages, cluster, model_path, tmp_path):
    c, workers = cluster
    by_id = {n.node_id: n for n in workers}
    runner = stages[1]

    def remove(runner, a):
        c.remove_node(by_id[runner.nodes[a]])

    cb = OnFirstResult(runner, remove)
    cb.eligible = lambda a: runner.nodes[a] in by_id   # a worker node, not the head (the driver's)
    rep, recs, retried = _tune_with(stages, model_path, tmp_path, cb)
    assert cb.victim is not None and retried >= 1
    assert rep.trials == 8 and len(recs) == 8 and {r.status for r in recs} == {"ok"}
    assert cb.victim in runner.dead or cb.victim not in runner.healthy   # it takes no more work


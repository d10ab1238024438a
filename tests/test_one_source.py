"""Each rule that matches tuning results to work exists once, and every user of it agrees:
the config hash, the status list, the nearest-shape distance, FLOP counting; and
`runtime.load` takes a graph already imported, so `tune` reads its model once."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import runtime
from database import Database, DatabaseError, Record
from database import record as db_record
from database.jsonl import _Bad, _check_fields
from ir import ModelError, import_onnx, partition, simplify
from ir.errors import ShapeError
from ir.fusion import subgraph_flops
from ir.keys import config_hash, shape_distance
from ir.shapes import DimRange, bind
from ir.workload import Workload, make_workload
from runtime.plan import Plan, PlanEntry
from schedules.space import Config
from tuner.measure import result as measure_result
from tuner.scheduler import RoundRobinScheduler, estimated_latency
from tuner.task import extract_tasks

try:
    from tests.helpers import dense_model
    from tests.models import make_bert, make_mlp, make_resnet18
except ImportError:
    from helpers import dense_model
    from models import make_bert, make_mlp, make_resnet18

CPU = {"key": "cpu-one-source", "kind": "cpu", "cores": 2}
SIG = "sig-one-source"


# -- the config hash ---------------------------------------------------------------------
@pytest.mark.parametrize("values", [{"regtile": "4x16", "order": "ij", "parallel": True, "kb": 256},
                                    {"b": 1, "a": 2.5}, {}])
def test_config_hash_is_one_rule(values):
    rec = Record(workload={}, workload_key="k", signature="s", family="dense", template="t", template_version=1,
                 target=CPU, config=dict(values), status="ok", latencies=[1.0], median=1.0)
    assert Config(values).hash == config_hash(values) == rec.config_hash


def test_config_hash_is_the_stored_one():
    """Stored records and claims are keyed by it: computed before the rule moved."""
    assert Config({"regtile": "4x16", "order": "ij", "parallel": True, "kb": 256}).hash == "35154646405f1525"


def test_the_database_keys_records_by_config_hash(tmp_path):
    wl = _workload(8)
    cfg = Config({"tile": 4, "order": "ji"})
    with Database(f"sqlite:///{tmp_path / 'h.db'}") as db:
        db.add(_record(wl, cfg.to_json(), 1e-3))
        assert set(db.measured(wl.key, CPU["key"])) == {cfg.hash}


# -- the status list ---------------------------------------------------------------------
def test_one_status_list():
    assert measure_result.STATUSES is db_record.STATUSES
    assert measure_result.OK == db_record.OK == "ok"
    assert set(db_record.TRANSIENT_STATUSES) < set(db_record.STATUSES)
    assert all(db_record.is_transient(s) for s in db_record.TRANSIENT_STATUSES)
    assert not db_record.is_transient(db_record.WRONG_RESULT)


def test_database_and_import_refuse_other_statuses(tmp_path):
    with Database(f"sqlite:///{tmp_path / 's.db'}") as db:
        with pytest.raises(DatabaseError, match="not one of ok, compile_error"):
            db.add(_record(_workload(8), {"tile": 4}, 1e-3, status="crashed"))
    line = _record(_workload(8), {"tile": 4}, 1e-3, status="crashed").to_json()
    with pytest.raises(_Bad, match="'status' 'crashed' is not one of"):
        _check_fields(line)


def test_the_status_list_imports_without_sqlalchemy():
    """Measurement workers import it: the database package loads SQLAlchemy only when asked."""
    code = "import sys, database.record, database; assert 'sqlalchemy' not in sys.modules; database.Database; " \
           "assert 'sqlalchemy' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the nearest-shape distance ----------------------------------------------------------
def test_shape_distance():
    assert shape_distance({"b": 8}, {"b": 8}) == 0
    assert shape_distance({"b": 8, "s": 16}, {"b": 2, "s": 64, "x": 3}) == 2 + 2
    assert shape_distance({"b": 8}, {"s": 8}) == math.inf      # a dim the tuned shape lacks
    assert shape_distance({"b": 8}, {"b": 0}) == math.inf
    assert shape_distance({"b": 8}, {"b": "8"}) == math.inf
    assert shape_distance({"b": 0}, {"b": 8}) == math.inf


TUNED = [{"b": 1, "s": 128}, {"b": 8, "s": 16}, {"b": 32, "s": 64}, {"b": 4}]


@pytest.mark.parametrize("want", [{"b": 2, "s": 128}, {"b": 6, "s": 20}, {"b": 16, "s": 64}, {"b": 4, "s": 32},
                                  {"b": 3}, {"c": 3}])
def test_plan_and_database_pick_the_same_nearest(tmp_path, want):
    plan = Plan(CPU, entries=[PlanEntry(f"k{n}", SIG, "t", 1, dims, {"tile": 4}, 1e-3) for n, dims in enumerate(TUNED)])
    scored = [(shape_distance(want, d), n) for n, d in enumerate(TUNED)]
    best = min(x for x in scored if x[0] != math.inf)[1] if any(x[0] != math.inf for x in scored) else None
    got = plan.nearest(SIG, want)
    assert (plan.entries.index(got) if got else None) == best
    with Database(f"sqlite:///{tmp_path / 'n.db'}") as db:
        for dims in TUNED:
            db.add(_record(_workload(**dims), {"tile": 4}, 1e-3))
        r = db.nearest(SIG, want, CPU["key"])
        assert (r.workload["inputs"][0]["shape"] if r else None) == (_shape(**TUNED[best]) if best is not None else None)


# -- FLOP counting -------------------------------------------------------------------------
def _reduce_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("ReduceMean", ["e"], ["y"], keepdims=0, axes=[1])]
    m = helper.make_model(helper.make_graph(nodes, "r", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("make", [lambda: make_mlp(32, 2), lambda: make_resnet18(image=32, classes=10),
                                  lambda: make_bert(layers=1, hidden=32, heads=2, ffn=64, vocab=50, max_pos=16),
                                  _reduce_model])
def test_workload_flops_are_the_subgraph_flops_at_its_sizes(make):
    g = simplify(import_onnx(make()))
    sizes = {name: 3 for name in g.dims}
    subgraphs = partition(g)
    for sg in subgraphs:
        wl = make_workload(g, sg, sizes)
        assert wl.flops() == bind((subgraph_flops(g, sg),), sizes)[0], wl.describe()
    tasks, _ = extract_tasks(g, [sizes], subgraphs)
    assert tasks and all(t.flops == t.workload.flops() for t in tasks)


def test_a_reduction_counts_its_input():
    """Exp over 4x16 then ReduceMean to 4: both count the 64 elements they read."""
    g = simplify(import_onnx(_reduce_model()))
    wl = make_workload(g, partition(g)[0], {"batch": 4})
    from ir.ops import OPS
    assert wl.flops() == 64 * (OPS["Exp"].flops_per_elem + OPS["ReduceMean"].flops_per_elem)


# -- the estimated model latency -------------------------------------------------------------
def test_the_scheduler_objective_is_the_estimated_latency():
    from types import SimpleNamespace
    tasks = [SimpleNamespace(weight=w, flops=1.0, template=SimpleNamespace(name="t")) for w in (3, 1)]
    s = RoundRobinScheduler(tasks)
    s.set_best(0, 2e-3)
    assert s.objective() is None is estimated_latency([(3, 2e-3), (1, None)])
    s.set_best(1, 5e-3)
    assert s.objective() == estimated_latency([(3, 2e-3), (1, 5e-3)]) == pytest.approx(11e-3)


# -- runtime.load takes an imported graph ----------------------------------------------------
def test_load_accepts_an_imported_graph():
    model = dense_model(4, 16, 8, epilogue=("bias", "relu"), dynamic_batch=True)
    graph = import_onnx(model)
    before = dict(graph.dims)
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    from_file = runtime.load(model, dims={"batch": (1, 8)})
    from_graph = runtime.load(graph, dims={"batch": (1, 8)})
    np.testing.assert_array_equal(from_graph(x), from_file(x))
    assert graph.dims == before                       # the caller's graph is not changed
    assert from_graph.graph.dims["batch"] == DimRange("batch", 1, 8)
    with pytest.raises(ShapeError, match=r"\[1, 8\]"):
        from_graph(np.ones((9, 16), np.float32))
    simplified = runtime.load(simplify(graph))        # what `tune` holds: simplified once more, the same
    np.testing.assert_array_equal(simplified(x), from_file(x))
    with pytest.raises(ModelError, match="not dynamic dims of the model"):
        runtime.load(graph, dims={"seq": (1, 8)})


# -- helpers -------------------------------------------------------------------------------
def _shape(b: int, s: int | None = None) -> list[int]:
    return [b, 16] if s is None else [b, s, 16]


def _workload(b: int, s: int | None = None) -> Workload:
    shape, sym = _shape(b, s), (["b", 16] if s is None else ["b", "s", 16])
    return Workload.from_json({"ops": [{"op": "Relu", "in": ["i0"], "attrs": {}}],
                               "inputs": [{"shape": shape, "sym": sym, "dtype": "float32", "const": False}],
                               "output_shape": shape, "output_dtype": "float32"})


def _record(wl: Workload, config: dict, median: float, status: str = "ok") -> Record:
    # one signature for all shapes, as for one dynamic family (the sym shapes differ by rank here)
    return Record(workload=wl.to_json(), workload_key=wl.key, signature=SIG, family="elemwise", template="t",
                  template_version=1, target=dict(CPU), config=config, status=status,
                  latencies=[median] * 3 if status == "ok" else [], median=median if status == "ok" else None)

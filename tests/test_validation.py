"""Nothing that does not fit is deployed, nothing grows without bound (issue 10, items 10, 13):
type-exact config validation (ConfigSpace, plans, imports, deploy), implausible timings
refused at import, and the per-shape program cache bounded by an LRU."""
from __future__ import annotations

import gc
import json
import weakref

import numpy as np
import onnx
import pytest

import runtime
from codegen import host_target
from database import Database, DatabaseError, Record
from database.cli import main as tune_db
from database.jsonl import peak_rates
from ir import import_onnx, make_workload, partition, simplify
from ir.errors import TensortuneError
from ir.shapes import DimRange
from runtime.choose import StaleRecordError
from runtime.cli import main as tune_run
from runtime.plan import Plan, PlanEntry, PlanError
from schedules import ConfigError, find_template, get_template
from schedules.space import ConfigSpace, Knob
from tests.helpers import dense_model

BATCH = 8
CFG = {"regtile": "4x16", "order": "ji", "parallel": False, "MB": 2, "NB": 2, "KB": 32, "tile_code": "slp"}


# -- ConfigSpace: type-exact ------------------------------------------------------------------

SPACE = ConfigSpace([Knob("lanes", (1, 4, 8, 16)), Knob("cache", (True, False)), Knob("tile", ("4x8", "8x8"))])
GOOD = {"lanes": 8, "cache": True, "tile": "4x8"}


@pytest.mark.parametrize("knob, value", [("lanes", 8.0), ("lanes", True), ("lanes", "8"), ("lanes", np.int64(8)),
                                         ("cache", 1), ("cache", 0), ("cache", "True"), ("tile", ["4x8"])])
def test_validation_is_type_exact(knob, value):
    with pytest.raises(ConfigError) as e:
        SPACE.validate({**GOOD, knob: value})
    msg = str(e.value)
    assert f"'{knob}'" in msg and type(value).__name__ in msg and repr(value) in msg


def test_the_space_own_values_pass_and_round_trip_json():
    for cfg in SPACE:
        assert SPACE.validate(json.loads(json.dumps(cfg.to_json()))) == cfg


# -- plans and deploy ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "dense.onnx"
    onnx.save(dense_model(8, 32, 48, epilogue=("bias", "relu"), dynamic_batch=True), path)
    return path


def numpy_ref(path, x):
    from onnx import numpy_helper
    w = {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    return np.maximum(x @ w["w"] + w["b"], 0)


def make_plan(path, config) -> Plan:
    g = simplify(import_onnx(path, {"batch": DimRange("batch", 1, 64)}))
    entries = []
    for sg in partition(g):
        wl = make_workload(g, sg, {"batch": BATCH})
        entries.append(PlanEntry(wl.key, wl.signature, "dense", find_template(wl).version, wl.dims, dict(config), 1e-5))
    return Plan(host_target().describe(), {"batch": [1, 64]}, entries, "dense")


MISTYPED = [("MB", 2.0), ("parallel", 0), ("KB", "32"), ("MB", True)]


@pytest.mark.parametrize("knob, value", MISTYPED)
def test_mistyped_plan_config_warns_and_runs_the_default(model_path, tmp_path, knob, value):
    plan = tmp_path / "plan.json"
    make_plan(model_path, {**CFG, knob: value}).save(plan)
    x = np.random.default_rng(0).standard_normal((BATCH, 32)).astype(np.float32)
    with pytest.warns(UserWarning, match=rf"plan entry 0 .*'{knob}' = {value!r} \({type(value).__name__}\)"):
        m = runtime.load(model_path, plan=plan)
        out = m(x)
    np.testing.assert_allclose(out, numpy_ref(model_path, x), rtol=1e-5, atol=1e-5)
    assert set(m.coverage({"batch": BATCH}).counts) == {"default"}
    with pytest.raises(StaleRecordError, match=f"'{knob}'"):
        runtime.load(model_path, plan=plan, strict=True)(x)


def test_tune_run_with_a_mistyped_plan_never_fails_internally(model_path, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    make_plan(model_path, {**CFG, "MB": 2.0}).save(plan)
    args = ["--model", str(model_path), "--plan", str(plan), "--shape", f"batch={BATCH}", "--json"]
    assert tune_run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["coverage"]["subgraphs"] == {"default": 1}
    assert any("'MB' = 2.0 (float)" in w for w in report["warnings"]), report["warnings"]   # item 11: in the report
    assert tune_run(args + ["--strict"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tune-run: error:" in err[0] and "'MB' = 2.0" in err[0] and "internal" not in err[0]


@pytest.mark.parametrize("value, needle", [([2], "list"), ({"x": 1}, "dict"), (None, "None")])
def test_plan_with_a_non_scalar_config_value_is_rejected_naming_the_entry(model_path, tmp_path, value, needle):
    plan = make_plan(model_path, CFG).to_json()
    plan["entries"].append({**plan["entries"][0], "config": {**CFG, "MB": value}})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    with pytest.raises(PlanError, match=r"entry 1 is malformed: config knob 'MB'"):
        Plan.load(path)


# -- imports: mistyped configs and implausible timings ----------------------------------------------

def _record(path, median=1e-3, config=None, cores=2) -> Record:
    g = simplify(import_onnx(path, {"batch": DimRange("batch", 1, 64)}))
    wl = make_workload(g, partition(g)[0], {"batch": BATCH})
    target = {**host_target().describe(), "cores": cores}
    return Record(workload=wl.to_json(), workload_key=wl.key, signature=wl.signature, family=wl.family,
                  template="dense", template_version=get_template("dense").version, target=target,
                  config=dict(config or CFG), status="ok", latencies=[median] * 3, median=median, flops=wl.flops())


def _import(tmp_path, capsys, *records) -> tuple[int, str]:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    rc = tune_db(["--db", f"sqlite:///{tmp_path / 'db.sqlite'}", "import", str(src)])
    return rc, capsys.readouterr().err.strip()


def test_a_good_record_imports(model_path, tmp_path, capsys):
    rc, err = _import(tmp_path, capsys, _record(model_path))
    assert rc == 0, err
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    assert [r.config for r in db.records()] == [CFG]
    db.close()


@pytest.mark.parametrize("knob, value", MISTYPED)
def test_import_rejects_a_mistyped_config_naming_the_line(model_path, tmp_path, capsys, knob, value):
    rc, err = _import(tmp_path, capsys, _record(model_path), _record(model_path, config={**CFG, knob: value}))
    assert rc == 2 and len(err.splitlines()) == 1
    assert "in.jsonl:2: bad record" in err and f"'{knob}' = {value!r} ({type(value).__name__})" in err
    assert "nothing imported" in err


def test_import_rejects_timings_faster_than_the_target_can_run(model_path, tmp_path, capsys):
    rec = _record(model_path)
    wl_flops = rec.flops
    flops_peak, _ = peak_rates(rec.target)
    assert flops_peak == 2 * 64 * 5e9
    floor = wl_flops / flops_peak
    rc, err = _import(tmp_path, capsys, _record(model_path, median=floor * 1.5))
    assert rc == 0, err                                                   # fast, but possible
    for median in (floor / 2, 1e-15, 0.0):
        rc, err = _import(tmp_path, capsys, _record(model_path, median=median))
        assert rc == 2 and "in.jsonl:1: bad record: implausible timing" in err and "GFLOP/s" in err, err
    # more cores, higher peak: the same time becomes possible
    rc, err = _import(tmp_path, capsys, _record(model_path, median=floor / 2, cores=4))
    assert rc == 0, err


def test_import_rejects_timings_faster_than_memory_allows(tmp_path, capsys):
    """A copy-like workload with few FLOPs: the bound is the bytes its output needs written."""
    from tests.template_cases import make_wl
    wl = make_wl([("Relu", ["i0"], {})], [((1024, 1024), "float32", False)])
    t = get_template("elementwise")
    target = {**host_target().describe(), "cores": 2}
    _, bps = peak_rates(target)
    floor = 1024 * 1024 * 4 / bps
    for median, ok in ((floor * 2, True), (floor / 4, False)):
        r = Record(workload=wl.to_json(), workload_key=wl.key, signature=wl.signature, family=wl.family,
                   template="elementwise", template_version=t.version, target=target,
                   config=t.default_config(wl).to_json(), status="ok", latencies=[median], median=median)
        rc, err = _import(tmp_path, capsys, r)
        assert (rc == 0) == ok, err
        if not ok:
            assert "implausible timing" in err and "GB/s" in err


def test_database_api_import_raises_a_tensortune_error(model_path, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(_record(model_path, config={**CFG, "MB": 2.0}).to_json()) + "\n")
    db = Database(f"sqlite:///{tmp_path / 'api.sqlite'}")
    with pytest.raises(DatabaseError, match="in.jsonl:1"):
        db.import_jsonl(src)
    assert isinstance(DatabaseError("x"), TensortuneError) and db.records() == []
    db.close()


# -- bounded per-shape programs ----------------------------------------------------------------------

def _arena_bytes(m) -> int:
    return sum(p.arena.nbytes for p in m._programs.values() if p.arena is not None)


def test_programs_are_an_lru_and_results_stay_right(tmp_path):
    from tests.models import make_mlp
    path = tmp_path / "mlp.onnx"
    onnx.save(make_mlp(width=32, layers=3), path)
    m = runtime.load(path, dims={"batch": (1, 512)}, max_programs=4)
    rng = np.random.default_rng(0)
    first = rng.standard_normal((3, 32)).astype(np.float32)
    want_first = m(first).copy()
    first_arena = weakref.ref(m._programs[(("batch", 3),)].arena)
    held = []
    for batch in range(4, 64):
        x = rng.standard_normal((batch, 32)).astype(np.float32)
        m(x)
        held.append((len(m._programs), _arena_bytes(m)))
    assert max(n for n, _ in held) == 4                              # never more than max_programs
    assert len(m._kernels) <= 4 * len(m.subgraphs)                    # nor their per-shape kernels
    largest = m._programs[(("batch", 63),)].arena.nbytes               # arenas grow with the batch
    assert all(b <= 4 * largest for _, b in held)
    gc.collect()
    assert first_arena() is None                                      # the evicted program's arena is freed
    np.testing.assert_array_equal(m(first), want_first)               # rebuilt after eviction: same result
    assert list(m._programs)[-1] == (("batch", 3),)                   # and now the most recent
    # a hot shape is kept while others come and go
    hot = rng.standard_normal((5, 32)).astype(np.float32)
    for batch in range(100, 120):
        m(hot)
        m(rng.standard_normal((batch, 32)).astype(np.float32))
        assert (("batch", 5),) in m._programs


def test_default_and_bad_max_programs(tmp_path):
    from runtime.executor import MAX_BOUND_SHAPES, MAX_PROGRAMS
    from tests.models import make_mlp
    path = tmp_path / "mlp.onnx"
    onnx.save(make_mlp(width=16, layers=1), path)
    m = runtime.load(path, dims={"batch": (1, 4096)})
    assert m.max_programs == MAX_PROGRAMS == 16
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(TensortuneError, match="max_programs"):
            runtime.load(path, max_programs=bad)
    for batch in range(1, MAX_BOUND_SHAPES + 40):
        m._bind({"x": np.zeros((batch, 16), np.float32)})
    assert len(m._sizes_by_shapes) == MAX_BOUND_SHAPES

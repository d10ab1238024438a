"""Dynamic shapes at deploy: dims bound from inputs, ShapeErrors that name input/dim/value/range,
exact → nearest → default kernels at shapes never tuned, packed weights shared across shapes,
plans (hand-made here: no tuning) moved to a fresh directory, stale and corrupt plans."""
from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

import runtime
from codegen import host_target
from ir import import_onnx, make_workload, partition, simplify
from ir.errors import ShapeError
from ir.shapes import DimRange
from runtime.choose import StaleRecordError
from runtime.plan import Plan, PlanEntry, PlanError
from schedules import find_template

try:
    from tests.helpers import dense_model
except ImportError:
    from helpers import dense_model

TUNED_BATCH = 8
CFG = {"regtile": "4x16", "order": "ji", "parallel": False, "MB": 2, "NB": 2, "KB": 32, "tile_code": "slp"}


@pytest.fixture(scope="module")
def model():
    return dense_model(8, 32, 48, epilogue=("bias", "relu"), dynamic_batch=True)


def numpy_ref(model, x):
    from onnx import numpy_helper
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return np.maximum(x @ w["w"] + w["b"], 0)


def make_plan(model, config=CFG, version=None, template="dense") -> Plan:
    g = simplify(import_onnx(model, {"batch": DimRange("batch", 1, 64)}))
    entries = []
    for sg in partition(g):
        wl = make_workload(g, sg, {"batch": TUNED_BATCH})
        t = find_template(wl)
        entries.append(PlanEntry(wl.key, wl.signature, template, t.version if version is None else version,
                                 wl.dims, dict(config), 1e-5))
    return Plan(host_target().describe(), {"batch": [1, 64]}, entries, "dense")


@pytest.fixture(scope="module")
def plan_file(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    make_plan(model).save(path)
    return path


@pytest.fixture(scope="module")
def loaded(plan_file, model):
    import onnx
    path = plan_file.parent / "model.onnx"
    onnx.save(model, path)
    return runtime.load(path, plan=plan_file)


@pytest.mark.parametrize("batch", [TUNED_BATCH, 3, 29])
def test_exact_then_nearest_at_untuned_shapes(loaded, model, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 32)).astype(np.float32)
    np.testing.assert_allclose(loaded(x), numpy_ref(model, x), rtol=1e-4, atol=1e-4)
    cov = loaded.coverage({"batch": batch})
    assert set(cov.counts) == ({"tuned"} if batch == TUNED_BATCH else {"nearest"})
    step = loaded.program({"batch": batch}).steps[0]
    assert step.kernel.kernel.config.to_json() == CFG  # the tuned config, reused at the new shape


def test_weights_packed_once_across_shapes(loaded):
    for b in (1, 2, 5):
        loaded(np.ones((b, 32), np.float32))
    assert loaded.stats["binds"] == 1 and loaded.stats["bind_reused"] >= 2


def test_plan_moved_to_fresh_dir_loads_without_db(plan_file, tmp_path, model):
    moved = tmp_path / "deploy" / "plan.json"
    moved.parent.mkdir()
    shutil.copy(plan_file, moved)
    m = runtime.load(model, plan=moved)
    x = np.ones((TUNED_BATCH, 32), np.float32)
    np.testing.assert_allclose(m(x), numpy_ref(model, x), rtol=1e-4, atol=1e-4)
    assert set(m.coverage({"batch": TUNED_BATCH}).counts) == {"tuned"}


def test_plan_dims_are_declared_ranges(loaded):
    with pytest.raises(ShapeError) as e:
        loaded(np.ones((65, 32), np.float32))
    msg = str(e.value)
    assert "'x'" in msg and "batch" in msg and "65" in msg and "[1, 64]" in msg


@pytest.mark.parametrize("feed, needles", [
    (np.ones((4, 31), np.float32), ["'x'", "axis 1", "31", "32"]),
    (np.ones((4,), np.float32), ["'x'", "rank 1"]),
    (np.ones((4, 32), np.complex64), ["'x'", "dtype", "complex64"]),
])
def test_shape_errors_name_input_and_dim(loaded, feed, needles):
    with pytest.raises(ShapeError) as e:
        loaded(feed)
    for n in needles:
        assert n in str(e.value), str(e.value)


def test_unknown_and_missing_inputs(loaded):
    with pytest.raises(ShapeError, match="unknown input.*'y'"):
        loaded.run({"x": np.ones((2, 32), np.float32), "y": 1})
    with pytest.raises(ShapeError, match="missing input 'x'"):
        loaded.run({})


def test_stale_config_warns_and_runs_default(model, tmp_path):
    bad = make_plan(model, config={**CFG, "regtile": "99x99"})
    with pytest.warns(UserWarning, match="does not fit"):
        m = runtime.load(model, plan=bad)
        x = np.ones((TUNED_BATCH, 32), np.float32)
        np.testing.assert_allclose(m(x), numpy_ref(model, x), rtol=1e-4, atol=1e-4)
    assert set(m.coverage({"batch": TUNED_BATCH}).counts) == {"default"}
    with pytest.raises(StaleRecordError, match="99x99"):
        runtime.load(model, plan=bad, strict=True)(x)


@pytest.mark.parametrize("kw, needle", [({"version": 999}, "v999"), ({"template": "gone"}, "'gone'")])
def test_other_template_or_version_is_not_run(model, kw, needle):
    with pytest.warns(UserWarning, match=needle):
        m = runtime.load(model, plan=make_plan(model, **kw))
        m(np.ones((TUNED_BATCH, 32), np.float32))
    assert set(m.coverage({"batch": TUNED_BATCH}).counts) == {"default"}


def _mutations():
    yield "not valid JSON", lambda p: "{not json"
    yield "format", lambda p: json.dumps({**p, "format": "other"})
    yield "version", lambda p: json.dumps({**p, "version": 7})
    yield "target", lambda p: json.dumps({**p, "target": "cpu"})
    yield "dims", lambda p: json.dumps({**p, "dims": {"batch": [0, 4]}})
    yield "entries", lambda p: json.dumps({**p, "entries": {}})
    yield "entry 0", lambda p: json.dumps({**p, "entries": [{"workload_key": "k"}]})
    yield "config", lambda p: json.dumps({**p, "entries": [{**p["entries"][0], "config": [1, 2]}]})
    yield "dims", lambda p: json.dumps({**p, "entries": [{**p["entries"][0], "dims": {"batch": -3}}]})


@pytest.mark.parametrize("needle, mutate", list(_mutations()), ids=[f"{k}-{n}" for k, (n, _) in enumerate(_mutations())])
def test_corrupt_plan_rejected_with_clear_error(plan_file, tmp_path, needle, mutate):
    bad = tmp_path / "bad.json"
    bad.write_text(mutate(json.loads(plan_file.read_text())))
    with pytest.raises(PlanError) as e:
        Plan.load(bad)
    assert "bad.json" in str(e.value) and needle in str(e.value), str(e.value)


def test_plan_from_other_target_strict_fails(plan_file, model, tmp_path):
    d = json.loads(plan_file.read_text())
    d["target"]["key"] = "cpu-elsewhere"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(d))
    with pytest.raises(PlanError, match="cpu-elsewhere"):
        runtime.load(model, plan=other, strict=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        runtime.load(model, plan=other)
    assert any("tuned on target" in str(x.message) for x in w)


def test_shape_computations_fold_per_shape_and_reshapes_run_as_views():
    """BERT-style position slicing reads Shape(input_ids): computed once per concrete
    shape at build time, never on the reference path; the mask Unsqueeze is a view."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    table = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    nodes = [helper.make_node("Shape", ["ids"], ["shp"]),
             helper.make_node("Gather", ["shp", "one"], ["seq"], axis=0),
             helper.make_node("Unsqueeze", ["seq", "ax0"], ["seq1"]),
             helper.make_node("Slice", ["table", "zero1", "seq1"], ["pos"]),
             helper.make_node("Unsqueeze", ["ids", "ax12"], ["mask"]),
             helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["pos", "maskf"], ["out"])]
    inits = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(np.array([0], np.int64), "zero1"),
             numpy_helper.from_array(np.array([2], np.int64), "ax12")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "s", 4])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m = runtime.load(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, s in [(2, 5), (1, 11)]:
        ids = np.random.default_rng(s).integers(0, 3, size=(b, s)).astype(np.int64)
        np.testing.assert_allclose(m(ids=ids), sess.run(None, {"ids": ids})[0], rtol=1e-6)
        cov = m.coverage({"b": b, "s": s})
        assert "reference" not in cov.counts
        assert cov.counts.get("static", 0) >= 1

"""runtime.profile: a small CNN profiled step by step (kinds, rows that add up to the
total, onnxruntime's nodes attributed to the steps that compute them), the timed run
mode apart from `run`, onnxruntime's trace parsed, and `tune-run --profile`."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime
from ir.settings import Settings
from runtime.cli import main as run_main
from runtime.profile import OVERHEAD, ProfileError, parse_trace


def tiny_cnn() -> onnx.ModelProto:
    """Conv 3x3 + Relu -> Flatten (a view) -> MatMul + Add -> Softmax, batch 1, 6x6 image."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "wc"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bc"),
             numpy_helper.from_array((rng.standard_normal((64, 8)) / 8).astype(np.float32), "wd"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "bd")]
    nodes = [helper.make_node("Conv", ["x", "wc", "bc"], ["c"], name="conv", kernel_shape=[3, 3], pads=[0, 0, 0, 0]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten", axis=1),
             helper.make_node("MatMul", ["f", "wd"], ["m"], name="fc"),
             helper.make_node("Add", ["m", "bd"], ["a"], name="fc_bias"),
             helper.make_node("Softmax", ["a"], ["y"], name="softmax", axis=-1)]
    g = helper.make_graph(nodes, "tiny_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "tiny_cnn.onnx"
    onnx.save(tiny_cnn(), path)
    model = runtime.load(path, settings=Settings.from_env().with_(threads=1))
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 2, 6, 6)).astype(np.float32)}
    model.run(feeds)   # compiles
    return path, model, feeds


def test_rows_add_up_to_the_total_and_name_what_runs_each_step(cnn):
    path, model, feeds = cnn
    prof = model.profile(feeds, runs=5)
    steps = model.prepare(feeds).steps
    assert prof.runs == 5 and prof.wall_s > 0 and len(prof.steps) == len(steps)
    groups = {g.group: g for g in prof.groups()}
    kernels = {s.kernel.kernel.template for s in steps if s.kernel is not None}
    assert {"conv2d", "dense"} <= kernels <= set(groups)
    assert sum(g.steps for g in groups.values()) == len(steps)
    assert sum(g.seconds for g in groups.values()) == pytest.approx(prof.total_s)
    assert sum(g.share for g in groups.values()) == pytest.approx(1.0)
    assert groups[OVERHEAD].seconds == pytest.approx(prof.total_s - sum(s.seconds for s in prof.steps))
    assert groups[OVERHEAD].seconds > 0   # the call's own work (program lookup, outputs) is in no step
    assert all(s.seconds > 0 for s in prof.steps) and "onnxruntime" not in prof.table()
    by_index = {s.index: s for s in prof.steps}
    for k, st in enumerate(steps):
        assert by_index[k].ops == " + ".join(st.subgraph.ops) and by_index[k].choice == st.kind
    assert json.loads(json.dumps(prof.to_json()))["groups"][0]["group"] == prof.groups()[0].group


def test_onnxruntime_nodes_go_to_the_steps_that_compute_them(cnn):
    path, model, feeds = cnn
    prof = model.profile(feeds, runs=4, onnx_model=str(path))
    ort = prof.onnxruntime
    assert ort is not None and ort.runs == 4 and ort.plain_s > 0 and ort.plain_cpu_s > 0 and ort.by_op
    assert prof.cpu_s > 0 and "CPU time of the calling thread" in prof.table()
    attributed = sum(s.onnxruntime_s for s in prof.steps + prof.static)
    assert attributed + sum(prof.unmatched.values()) == pytest.approx(sum(ort.by_op.values()))
    conv = next(s for s in prof.steps if s.group == "conv2d")
    assert conv.onnxruntime_s > 0   # onnxruntime's Conv (fused with the Relu or not) is the conv step's
    groups = prof.groups()
    assert sum(g.onnxruntime_s for g in groups) == pytest.approx(ort.total_s)
    text = prof.table()
    assert "vs onnxruntime" in text and "conv2d" in text and OVERHEAD in text


def test_run_reads_no_clock_after_a_programs_first_call(cnn):
    _, model, feeds = cnn
    steps = model.prepare(feeds).steps
    before = [(s.seconds, s.calls) for s in steps]
    model.run(feeds)
    assert [(s.seconds, s.calls) for s in steps] == before
    out, times = model.run_timed(feeds)
    assert len(times) == len(steps) and all(t >= 0 for t in times)
    assert [s.calls for s in steps] == [c + 1 for _, c in before]
    np.testing.assert_array_equal(out["y"], model.run(feeds)["y"])


def test_bad_run_counts_are_refused(cnn):
    _, model, feeds = cnn
    with pytest.raises(ProfileError, match="runs >= 1"):
        model.profile(feeds, runs=0)


def _event(name, ts, dur, cat="Node", op="Conv"):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_a_trace_is_read_per_call_after_the_warm_up():
    """Medians per node over the calls after the warm-up; the overhead is model_run minus its nodes."""
    events = [_event("model_run", 0, 1000, "Session"), _event("conv_kernel_time", 10, 900),
              _event("model_run", 2000, 100, "Session"), _event("conv_kernel_time", 2010, 60),
              _event("relu_kernel_time", 2080, 10, op="Relu"),
              _event("model_run", 3000, 140, "Session"), _event("conv_kernel_time", 3010, 80),
              _event("relu_kernel_time", 3100, 20, op="Relu")]
    p = parse_trace(events, warmup=1)
    assert p.runs == 2 and p.total_s == pytest.approx(120e-6)
    assert p.by_node == {"conv": ("Conv", pytest.approx(70e-6)), "relu": ("Relu", pytest.approx(15e-6))}
    assert p.overhead_s == pytest.approx(35e-6)
    with pytest.raises(ProfileError, match="no timed call"):
        parse_trace(events[:2], warmup=1)


def test_tune_run_profile_json_and_text(cnn, capsys, monkeypatch):
    path, _, _ = cnn
    monkeypatch.setenv("TENSORTUNE_NUM_THREADS", "1")   # the kernels the fixture compiled
    assert run_main(["--model", str(path), "--profile", "--profile-runs", "3", "--json"]) == 0
    prof = json.loads(capsys.readouterr().out)["profile"]
    assert prof["runs"] == 3 and prof["onnxruntime"] is None
    assert sum(g["seconds"] for g in prof["groups"]) == pytest.approx(prof["total_s"])
    assert run_main(["--model", str(path), "--profile", "--profile-runs", "2", "--vs-onnxruntime"]) == 0
    text = capsys.readouterr().out
    assert "profile:" in text and "onnxruntime by op type" in text and "conv2d" in text


@pytest.mark.parametrize("argv, message", [(["--profile-runs", "0", "--profile"], "--profile-runs must be >= 1"),
                                           (["--vs-onnxruntime"], "add --profile")])
def test_tune_run_refuses_a_profile_it_cannot_take(cnn, capsys, argv, message):
    path, _, _ = cnn
    assert run_main(["--model", str(path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_loop_body_is_timed_exactly_when_its_enclosing_call_is():
    """The coverage takes a body's time out of its Loop node's: both must come from the same calls."""
    try:
        from tests.test_control_flow import loop_model
    except ImportError:
        from test_control_flow import loop_model
    cm = runtime.load(loop_model(), settings=Settings.from_env().with_(threads=1))
    feeds = {"x": np.ones((2, 8), np.float32), "M": np.array(3, np.int64)}
    for _ in range(3):       # the first call is timed, the next two are not
        cm.run(feeds)
    cm.run_timed(feeds)
    (loop,) = [s for s in cm.prepare(feeds).steps if s.kind == "control_flow"]
    assert loop.calls == 2
    bodies = loop.session.compiled
    assert bodies and all(s.calls == 2 * 3 for b in bodies for p in b._programs.values() for s in p.steps)
    assert cm.coverage().seconds["control_flow"] >= -1e-9

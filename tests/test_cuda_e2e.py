"""The cuda target end to end under numba-cuda's simulator: measurement on a GPU worker
(check against NumPy, a worker replaced after a CUDA error, one worker per GPU), `tune
--target cuda` storing records under the GPU's target key, `runtime.load(..., target="cuda")`
matching onnxruntime with one upload per input, the CPU fallback shown in coverage, the
GPU cost-model features, and the device check script."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("numba.cuda")

import runtime  # noqa: E402
from codegen import compile_kernel, get_backend  # noqa: E402
from codegen.cuda import simulator  # noqa: E402
from database import Database  # noqa: E402
from ir import import_onnx, partition, simplify  # noqa: E402
from ir.settings import Settings, current  # noqa: E402
from ir.workload import make_workload  # noqa: E402
from schedules import find_template, get_template  # noqa: E402
from schedules.launch import Call, In, Launch, Out, Scalar  # noqa: E402
from schedules.loopnest import Assign, Function, LoopModule, Param  # noqa: E402
from schedules.template import Lowered  # noqa: E402
from tuner.measure import LocalRunner, MeasureInput  # noqa: E402
from tuner.measure.base import BuildResult  # noqa: E402
from tuner.measure.result import OK, RUNTIME_ERROR  # noqa: E402

pytestmark = pytest.mark.skipif(not simulator(), reason="runs on numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")
ROOT = Path(__file__).resolve().parents[1]


def _model(path: Path, softmax: bool = True) -> str:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["r" if softmax else "out"])]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["r"], ["out"], axis=-1))
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 5])], [w, b])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def _cuda_settings() -> Settings:
    return current().with_(backend="cuda")


@pytest.fixture(scope="module")
def dense_wl(tmp_path_factory):
    g = simplify(import_onnx(_model(tmp_path_factory.mktemp("m") / "m.onnx", softmax=False)))
    sg = next(s for s in partition(g) if s.nodes[0].op == "MatMul")
    return make_workload(g, sg, {"batch": 3})


def _built(wl, settings, cfg=None) -> tuple[MeasureInput, BuildResult]:
    t = find_template(wl, "cuda")
    cfg = cfg or t.default_config(wl)
    k = compile_kernel(t, wl, cfg, get_backend("cuda", settings))
    return MeasureInput(wl, t.name, cfg), BuildResult(OK, kernel=k)


def _faulty(kernel):
    """The same kernel with a module that reads past the end of its input (an illegal
    address on a GPU; an IndexError in the simulator)."""
    bad = Function("boom", (Param("x", "float32[:, ::1]"), Param("out", "float32[:, ::1]"), Param("n", "int64")),
                   (Assign("out[0, 0]", "x[n, 0]"),))
    mod = LoopModule((bad,), meta={"template": "faulty"})
    launch = Launch((Call("boom", (In(0, (3, 6)), Out((3, 5)), Scalar(10 ** 6)), grid=(1,), block=(1,)),))
    be = get_backend("cuda", _cuda_settings())
    return replace(kernel, lowered=Lowered(mod, launch), artifact=be.compile(mod))


def test_a_gpu_worker_checks_times_and_is_replaced_after_a_cuda_error(dense_wl):
    s = _cuda_settings()
    runner = LocalRunner(settings=s, repeat=2, min_repeat_ms=1.0, timeout=120)
    try:
        assert runner.capacity == 1 and runner.device
        inp, build = _built(dense_wl, s)
        r = runner.run([inp], [build])[0]
        assert r.status == OK and r.target["kind"] == "cuda" and r.median > 0
        pid = runner.worker.pid
        bad = BuildResult(OK, kernel=_faulty(build.kernel))
        r_bad, r_after = runner.run([inp, inp], [bad, build])
        assert r_bad.status == RUNTIME_ERROR and "IndexError" in r_bad.error
        assert r_after.status == OK and runner.worker.pid != pid   # a fresh worker (and CUDA context)
    finally:
        runner.close()


def test_one_worker_per_gpu_measures_batches_side_by_side(dense_wl):
    s = _cuda_settings()
    runner = LocalRunner(settings=s, repeat=1, min_repeat_ms=0.5, timeout=120, devices=2)
    try:
        assert runner.capacity == 2
        assert [w.env.get("CUDA_VISIBLE_DEVICES") for w in runner.workers] == ["0", "1"]
        inp, build = _built(dense_wl, s)
        tickets = {runner.submit([inp], [build]), runner.submit([inp, inp], [build, build])}
        got = [runner.next_result() for _ in range(3)]
        assert {t for t, _ in got} == tickets and all(r.status == OK for _, r in got)
        assert all(w.pid is not None for w in runner.workers)   # both GPUs' workers measured
        with pytest.raises(RuntimeError, match="no batch in flight"):
            runner.next_result()
    finally:
        runner.close()


def test_gpu_features_rank_by_what_the_device_sees(dense_wl):
    from tuner.cost_model.features import Featurizer
    t = find_template(dense_wl, "cuda")
    f = Featurizer(t, dense_wl)
    assert f.gpu
    rows = f(list(t.space(dense_wl))[:5])
    assert rows.shape[0] == 5 and np.isfinite(rows).all()
    cpu = Featurizer(find_template(dense_wl, "cpu"), dense_wl)
    assert not cpu.gpu


def test_tune_target_cuda_then_deploy_on_the_gpu_matching_onnxruntime(tmp_path, capsys, monkeypatch):
    import onnxruntime as ort
    from runtime.cli import main as tune_run
    from tuner.cli import main as tune
    path = _model(tmp_path / "tiny.onnx")
    url = f"sqlite:///{tmp_path / 'cuda.db'}"
    assert tune(["--model", path, "--target", "cuda", "--trials", "3", "--db", url, "--shape", "batch=2",
                 "--no-progress", "--measure-runs", "1", "--verify-runs", "1", "--min-repeat-ms", "1", "--repeat", "2",
                 "--strategy", "random"]) == 0
    capsys.readouterr()
    db = Database(url)
    cuda_key = get_backend("cuda", _cuda_settings()).target().key
    assert cuda_key.startswith("cuda-")
    g = simplify(import_onnx(path))
    wl = make_workload(g, next(s for s in partition(g) if s.nodes[0].op == "MatMul"), {"batch": 2})
    best = db.best(wl.key, cuda_key, 1)
    assert best and best[0].template == "cuda_dense"
    assert not db.best(wl.key, get_backend("cpu").target().key, 1)   # nothing stored under the CPU's key

    m = runtime.load(path, db=db, target="cuda", settings=_cuda_settings())
    be = m.backend
    uploads = []
    real = be.asarray
    monkeypatch.setattr(be, "asarray", lambda a, dt: (uploads.append(type(a)), real(a, dt))[1])
    x = np.random.default_rng(1).standard_normal((2, 6)).astype(np.float32)
    m(x)   # the first call builds the program: weights and bias go up once, here
    assert uploads.count(np.ndarray) == 3
    uploads.clear()
    for _ in range(2):
        got = m(x)
    assert isinstance(got, np.ndarray)
    assert uploads.count(np.ndarray) == 2   # then one host-to-device copy of the input per call
    ref = ort.InferenceSession(path).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    cov = m.coverage()
    assert cov.counts.get("tuned", 0) >= 1
    expected_host = 0 if find_template(make_workload(g, partition(g)[-1], {"batch": 2}), "cuda") else 1
    assert cov.counts.get("cpu-fallback", 0) == expected_host

    assert tune_run(["--model", path, "--db", url, "--target", "cuda", "--shape", "batch=2", "--check"]) == 0
    assert "tuned" in capsys.readouterr().out


def test_a_subgraph_without_a_gpu_template_runs_on_the_cpu_and_says_so(tmp_path):
    """Erf has no GPU template here (nor does anything else once the GPU templates are
    hidden): the CPU backend runs it inside the GPU model, shown as cpu-fallback."""
    import onnxruntime as ort
    from schedules import registry
    path = _model(tmp_path / "m.onnx")
    hidden = {n: t for n, t in registry._TEMPLATES.items() if t.kind == "cuda" and n != "cuda_dense"}
    for n in hidden:
        del registry._TEMPLATES[n]
    try:
        m = runtime.load(path, target="cuda", settings=_cuda_settings())
        x = np.random.default_rng(2).standard_normal((3, 6)).astype(np.float32)
        np.testing.assert_allclose(m(x), ort.InferenceSession(path).run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        cov = m.coverage()
        assert cov.counts.get("default") == 1 and cov.counts.get("cpu-fallback") == 1
        assert "cpu-fallback" in str(cov)
    finally:
        registry._TEMPLATES.update(hidden)
    assert get_template("cuda_dense").kind == "cuda"


def test_no_gpu_and_no_simulator_is_one_clear_line(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run([sys.executable, "-m", "tuner.cli", "--model", _model(tmp_path / "m.onnx"), "--target", "cuda",
                        "--db", f"sqlite:///{tmp_path / 'x.db'}"], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.strip().splitlines() if ln]
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "NUMBA_ENABLE_CUDASIM" in lines[0]
    assert not (tmp_path / "x.db").exists()


def test_the_device_check_script_runs_on_the_simulator(tmp_path):
    out = tmp_path / "results.md"
    p = subprocess.run([sys.executable, str(ROOT / "experiments" / "cuda" / "check.py"), "--tiny", "--problems",
                        "dense", "--trials", "2", "--time-budget", "20", "--runs", "1", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    text = out.read_text()
    assert "simulator" in text and "| dense 12^3 | 1 |" in text and "tuned" in text


def test_device_arrays_with_the_real_drivers_flags_run_a_model(tmp_path, monkeypatch):
    """numba's real DeviceNDArray answers `flags` with a dict ({'C_CONTIGUOUS': ...}), the
    simulator's arrays with NumPy's flags object: the first deploy on an H200 failed on
    `x.flags.writeable` (2026-12-04). With the simulator's arrays given the real flags, a model
    on the GPU backend still runs and matches onnxruntime."""
    import onnxruntime as ort
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    monkeypatch.setattr(FakeCUDAArray, "flags", property(lambda self: {"C_CONTIGUOUS": True, "F_CONTIGUOUS": False}),
                        raising=False)
    path = _model(tmp_path / "m.onnx")
    m = runtime.load(path, target="cuda", settings=_cuda_settings())
    x = np.random.default_rng(3).standard_normal((3, 6)).astype(np.float32)
    np.testing.assert_allclose(m(x), ort.InferenceSession(path).run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)

"""Models as real exporters write them (tests/real_models/: torch 2.13 dynamo and TorchScript
exports of GPT-2, BERT, ViT, a MobileNetV3-style CNN, a YOLO-style detector and an sdpa block;
onnx.helper models with paddle2onnx and tf2onnx conventions) through `runtime.load`, the path a
user gets: import in seconds, outputs that match onnxruntime at two shapes that differ in every
dynamic dim, and no node left on the NumPy/onnx.reference path.

Each model is loaded once per module and its calls are shared by the three tests.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort
import pytest

import runtime

try:
    from tests.real_models.cases import CASES
except ImportError:
    from real_models.cases import CASES

IMPORT_LIMIT_S = 10.0   # loose: the goal is ~1 s; this catches a regression to minutes
LOAD_BUDGET_S = 12      # a load still running then is stopped, so a slow import costs CI seconds, not minutes
RTOL = 1e-4             # max |diff| <= RTOL * max |ref|, per output

pytestmark = pytest.mark.long   # 14 models' first calls compile their kernels: minutes (CI runs it)

@dataclass
class Outcome:
    """What happened when the model was loaded and run at its two shapes."""
    model: object = None
    load_s: float = 0.0
    error: BaseException | None = None
    stage: str = ""
    results: list = field(default_factory=list)   # per shape: (feeds, our outputs, onnxruntime outputs)


_OUTCOMES: dict[str, Outcome] = {}


def _outcome(case) -> Outcome:
    if case.name in _OUTCOMES:
        return _OUTCOMES[case.name]
    out = _OUTCOMES[case.name] = Outcome()
    try:
        out.stage = "load"
        t0 = time.perf_counter()
        out.model = _load_within_budget(str(case.path))
        out.load_s = time.perf_counter() - t0
        sess = ort.InferenceSession(str(case.path), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        for k in (0, 1):
            out.stage = f"call at shape {k}"
            feeds = case.feeds(k)
            got = out.model.run(feeds)
            ref = dict(zip(names, sess.run(None, feeds)))
            out.results.append((feeds, got, ref))
        out.stage = "done"
    except Exception as e:  # kept, and raised by every test of this model
        out.error = e
    return out


def _load_within_budget(path: str):
    def stop(signum, frame):
        raise TimeoutError(f"runtime.load still running after {LOAD_BUDGET_S} s: stopped")
    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(LOAD_BUDGET_S)
    try:
        return runtime.load(path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _raise_failure(out: Outcome, load_only: bool = False):
    """Re-raise what stopped the model (with `load_only`, only a failure of runtime.load itself)."""
    if out.error is not None and (out.stage == "load" or not load_only):
        raise AssertionError(f"{out.stage}: {type(out.error).__name__}: {out.error}") from out.error


def _cases(test: str):
    return [pytest.param(c, id=c.name) for c in CASES]


@pytest.mark.parametrize("case", _cases("import"))
def test_imports_in_seconds(case):
    out = _outcome(case)
    _raise_failure(out, load_only=True)
    assert out.load_s < IMPORT_LIMIT_S, f"runtime.load took {out.load_s:.1f} s"


@pytest.mark.parametrize("case", _cases("match"))
def test_matches_onnxruntime_at_two_shapes(case):
    out = _outcome(case)
    _raise_failure(out)
    for feeds, got, ref in out.results:
        shapes = {k: v.shape for k, v in feeds.items()}
        assert set(got) == set(ref), f"outputs {sorted(got)} vs onnxruntime's {sorted(ref)}"
        for name, r in ref.items():
            g = np.asarray(got[name])
            assert g.shape == r.shape and g.dtype == r.dtype, \
                f"{name} at {shapes}: {g.dtype}{list(g.shape)} vs onnxruntime {r.dtype}{list(r.shape)}"
            err = float(np.max(np.abs(g.astype(np.float64) - r))) if r.size else 0.0
            scale = float(np.max(np.abs(r))) if r.size else 0.0
            assert err <= RTOL * scale, f"{name} at {shapes}: max |diff| {err:.3g} > {RTOL} * max |ref| {scale:.3g}"


@pytest.mark.parametrize("case", _cases("compiled"))
def test_no_node_on_the_reference_path(case):
    out = _outcome(case)
    _raise_failure(out)
    cov = out.model.coverage()
    print(f"{case.name}: {cov}")
    ref_share = cov.share("reference")
    assert ref_share == 0.0 and not cov.fallback_ops, \
        f"{ref_share:.0%} of nodes on the reference path; onnx.reference ops: {cov.fallback_ops}; {cov}"


def test_reverse_slice_over_a_whole_axis_is_kept():
    """tf2onnx writes x[..., ::-1] as Slice(starts -1, ends INT64_MIN, steps -1): same shape as its
    input, but not a no-op (simplify once removed it, silently reversing nothing)."""
    from onnx import TensorProto, helper, numpy_helper
    consts = {"s": [-1], "e": [-(2**63)], "a": [1], "p": [-1]}
    g = helper.make_graph(
        [helper.make_node("Slice", ["x", "s", "e", "a", "p"], ["t"]), helper.make_node("Relu", ["t"], ["y"])], "rev",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["unk__1", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["unk__2", 4])],
        [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    np.testing.assert_array_equal(runtime.load(model)(x), np.maximum(x[:, ::-1], 0))


def test_winograd_inside_a_real_exported_detector(monkeypatch):
    """The torch-exported detector (dynamic batch and size) with its 3x3 stride-1 convs as
    winograd (the default rule opened to every such conv: by default its few channels keep
    them blocked), at its two shapes, 1 and 2 threads: outputs match onnxruntime."""
    import schedules.templates.conv2d as conv2d
    from ir.settings import Settings
    from schedules.microkernel import vector_shape
    shape = vector_shape()
    monkeypatch.setitem(conv2d.WINOGRAD_DEFAULT, shape, (1, 1, ("4x24",) if shape[0] == 8 else ("8x32",)))
    case = next(c for c in CASES if c.name == "detector_dynamo")
    sess = ort.InferenceSession(str(case.path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for threads in (1, 2):
        model = runtime.load(str(case.path), settings=Settings.from_env().with_(threads=threads))
        for k in (0, 1):
            feeds = case.feeds(k)
            kernels = [st.kernel.kernel for st in model.prepare(feeds).steps if st.kernel is not None]
            assert any(k.template == "conv2d" and k.config["algo"] == "winograd" for k in kernels)
            got, ref = model.run(feeds), sess.run(None, feeds)
            for name, r in zip(names, ref):
                err = float(np.max(np.abs(np.asarray(got[name], np.float64) - r)))
                assert err <= RTOL * float(np.max(np.abs(r))), (threads, k, name, err)

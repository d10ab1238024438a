"""Minimal repros of every failure the real-exporter models of tests/real_models/ hit, one
tiny onnx.helper model each, grouped by the area that owns the fix (issue 9).

    python experiments/real_models/repros.py [NAME ...]

Each repro runs through `runtime.load` at two shapes against onnxruntime in its own
process (a repro may try a huge allocation), and prints one line: OK, WRONG (outputs
differ), or FAIL with the error's type and first line, plus the ops left on the reference
path. The model each repro stands for is named in its docstring.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "repro", inputs, outputs,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _vi(name, dims, t=F):
    return helper.make_tensor_value_info(name, t, dims)


def _i64(*v):
    return np.array(v, np.int64)


def _rand(*shape):
    return np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------ import / shapes
def torch_reshape_target_with_minus_one():
    """sdpa_dynamo, gpt2/bert exports: Reshape(x[B,H,S,D], Concat([-1], Shape(x)[-2:-1], Shape(x)[-1:]))
    (torch's flatten of the heads). resolve_reshape_targets turns S into -1 without counting the
    literal -1 already there: 'target [-1, -1, 8] has more than one -1'."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "m2", "m1"], ["sd"]),
             helper.make_node("Slice", ["s", "m1", "big"], ["dd"]),
             helper.make_node("Concat", ["m1", "sd", "dd"], ["t"], axis=0),
             helper.make_node("Reshape", ["x", "t"], ["y"])]
    m = _model(nodes, [_vi("x", ["B", 4, "S", 8])], [_vi("y", [None, "S", 8])],
               {"m2": _i64(-2), "m1": _i64(-1), "big": _i64(INT64_MAX)})
    return m, [{"x": _rand(1, 4, 3, 8)}, {"x": _rand(2, 4, 5, 8)}]


def paddle_dim_value_minus_one():
    """paddle_det: paddle2onnx writes a dynamic dim as dim_value -1; the importer keeps it as the
    fixed size -1 (ir/onnx_import._type_of), and Conv fails: 'window of size [3, 3] does not fit
    input spatial size [-1, -1]'."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    m = _model(nodes, [_vi("x", [-1, 3, -1, -1])], [_vi("y", [-1, 4, -1, -1])], {"w": _rand(4, 3, 3, 3)})
    return m, [{"x": _rand(1, 3, 8, 8)}, {"x": _rand(2, 3, 6, 10)}]


def paddle_question_mark_dims():
    """paddle_rec: every dim named '?' becomes ONE symbol '_' (ir/onnx_import._type_of keys dims by
    their raw name), so N, H and W must be equal: "input 'x' axis 2: dim '_' = 16 but another input
    bound it to 1"."""
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = _model(nodes, [_vi("x", ["?", 3, "?", "?"])], [_vi("y", ["?", 3, "?", "?"])])
    return m, [{"x": _rand(1, 3, 4, 6)}, {"x": _rand(2, 3, 5, 7)}]


def tf2onnx_slice_end_1e9():
    """tf2onnx_cnn: Slice(x[N, W], starts 0, ends 1e9, axis 0) gives the dim 1e9 instead of N
    (the symbolic slice clamps INT64_MAX but not other ends past the dim); the memory plan then
    asks numpy for 14.9 GiB: an internal MemoryError, not a TensortuneError."""
    nodes = [helper.make_node("Slice", ["x", "z", "e"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    m = _model(nodes, [_vi("x", ["unk__1", 4])], [_vi("y", ["unk__2", 4])],
               {"z": _i64(0), "e": _i64(1_000_000_000)})
    return m, [{"x": _rand(2, 4)}, {"x": _rand(3, 4)}]


def tf2onnx_reverse_slice_symbolic():
    """tf2onnx_cnn (x[..., ::-1] on a dynamic axis): Slice starts -1, ends INT64_MIN, steps -1 on a
    symbolic dim: 'symbolic slice [-1:-9223372036854775808:-1] of a dim W is not supported'."""
    nodes = [helper.make_node("Slice", ["x", "s", "e", "a", "p"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    m = _model(nodes, [_vi("x", ["N", "W"])], [_vi("y", ["N", "W"])],
               {"s": _i64(-1), "e": _i64(INT64_MIN), "a": _i64(1), "p": _i64(-1)})
    return m, [{"x": _rand(2, 4)}, {"x": _rand(3, 5)}]


def dynamic_hw_import_time():
    """mobilenetv3_torchscript/detector: a chain of 12 stride-1/2 Convs on dynamic H/W; the shape
    expressions (floor((H - 1)/2) + 1 nested) go through sympy per dim: seconds per dozen nodes."""
    nodes, cur, inits = [], "x", {}
    for i in range(12):
        inits[f"w{i}"] = _rand(4, 4, 3, 3)
        nodes.append(helper.make_node("Conv", [cur, f"w{i}"], [f"c{i}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                      strides=[2, 2] if i % 3 == 0 else [1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        cur = f"r{i}"
    nodes[-1].output[0] = "y"
    m = _model(nodes, [_vi("x", ["N", 4, "H", "W"])], [_vi("y", ["N", 4, None, None])], inits)
    return m, [{"x": _rand(1, 4, 32, 32)}, {"x": _rand(2, 4, 40, 56)}]


# ------------------------------------------------------------------ missing ops
def isnan_sdpa_guard():
    """every sdpa export (gpt2, bert, vit, sdpa_*): Where(IsNaN(softmax), 0, softmax). IsNaN has no
    op entry: onnx.reference per node."""
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1), helper.make_node("IsNaN", ["p"], ["n"]),
             helper.make_node("Where", ["n", "zero", "p"], ["y"])]
    m = _model(nodes, [_vi("x", ["B", "S"])], [_vi("y", ["B", "S"])], {"zero": np.zeros((), np.float32)})
    return m, [{"x": _rand(2, 5)}, {"x": _rand(3, 7)}]


def resize_nearest_scales():
    """detector_*, paddle_det: Resize(x, scales [1,1,2,2]) nearest/asymmetric/floor (nn.Upsample)."""
    nodes = [helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
    m = _model(nodes, [_vi("x", ["N", 2, "H", "W"])], [_vi("y", ["N", 2, None, None])],
               {"sc": np.array([1, 1, 2, 2], np.float32)})
    return m, [{"x": _rand(1, 2, 4, 4)}, {"x": _rand(2, 2, 3, 5)}]


def resize_linear_sizes():
    """detector_*, paddle_det: Resize(x, sizes=Concat(Shape(x)[:2], Shape(ref)[2:])) linear/half_pixel
    (F.interpolate(size=..., mode='bilinear'))."""
    nodes = [helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Shape", ["r"], ["sr"]),
             helper.make_node("Slice", ["sx", "z", "two"], ["nc"]), helper.make_node("Slice", ["sr", "two", "four"], ["hw"]),
             helper.make_node("Concat", ["nc", "hw"], ["sz"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="linear",
                              coordinate_transformation_mode="half_pixel")]
    m = _model(nodes, [_vi("x", ["N", 2, "h", "w"]), _vi("r", ["N", 1, "H", "W"])], [_vi("y", ["N", 2, "H", "W"])],
               {"z": _i64(0), "two": _i64(2), "four": _i64(4)})
    return m, [{"x": _rand(1, 2, 4, 4), "r": _rand(1, 1, 8, 8)}, {"x": _rand(2, 2, 3, 5), "r": _rand(2, 1, 6, 10)}]


def gather_elements_nd():
    """bert_*/gpt2_dynamo: GatherElements and GatherND (transformers' mask and pooler indexing)."""
    nodes = [helper.make_node("GatherElements", ["x", "i"], ["g"], axis=1),
             helper.make_node("GatherND", ["g", "j"], ["y"], batch_dims=0)]
    m = _model(nodes, [_vi("x", ["B", 4]), _vi("i", ["B", 2], TensorProto.INT64), _vi("j", ["K", 1], TensorProto.INT64)],
               [_vi("y", ["K", 2])])
    return m, [{"x": _rand(2, 4), "i": _i64([0, 3], [1, 2]), "j": _i64([1], [0], [1])},
               {"x": _rand(3, 4), "i": _i64([0, 1], [2, 3], [3, 3]), "j": _i64([2], [0])}]


AREAS = {
    "import/shapes": [torch_reshape_target_with_minus_one, paddle_dim_value_minus_one, paddle_question_mark_dims,
                      tf2onnx_slice_end_1e9, tf2onnx_reverse_slice_symbolic, dynamic_hw_import_time],
    "missing op": [isnan_sdpa_guard, resize_nearest_scales, resize_linear_sizes, gather_elements_nd],
}
ALL = {f.__name__: (area, f) for area, fs in AREAS.items() for f in fs}


def check(name: str) -> str:
    """One line: OK / WRONG / FAIL for the repro `name` (run in this process)."""
    import time

    import onnxruntime as ort

    import runtime
    model, feeds = ALL[name][1]()
    t0 = time.perf_counter()
    try:
        m = runtime.load(model)
        load_s = time.perf_counter() - t0
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        for f in feeds:
            got = m.run(f)
            for n, r in zip(names, sess.run(None, f)):
                g = np.asarray(got[n])
                if g.shape != r.shape or np.max(np.abs(g - r), initial=0) > 1e-4 * np.max(np.abs(r), initial=0):
                    return f"WRONG {n} at {[v.shape for v in f.values()]}: {g.shape} vs onnxruntime {r.shape}"
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"FAIL {type(e).__name__}: {msg[:240]}"
    cov = m.coverage()
    ref = f"; reference path {cov.share('reference'):.0%} of nodes, onnx.reference ops {cov.fallback_ops}" \
        if cov.share("reference") else ""
    return f"OK (load {load_s:.2f} s){ref}"


def main(argv=None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(ALL)
    if len(names) == 1 and names[0].startswith("--one="):
        print(check(names[0][6:]))
        return 0
    root = Path(__file__).resolve().parents[2]
    for area, fs in AREAS.items():
        print(f"## {area}")
        for f in fs:
            if f.__name__ not in names:
                continue
            try:
                r = subprocess.run([sys.executable, __file__, f"--one={f.__name__}"], cwd=root, capture_output=True,
                                   text=True, timeout=300)
                line = (r.stdout.strip().splitlines() or [f"FAIL process exited {r.returncode}: "
                                                         f"{(r.stderr.strip().splitlines() or [''])[-1]}"])[-1]
            except subprocess.TimeoutExpired:
                line = "FAIL timed out after 300 s"
            print(f"- {f.__name__}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

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


def opaque_op_type_from_onnx_inference():
    """bert_*/gpt2_dynamo/detector_dynamo, even with every input dim fixed: an op without a shape
    function (here GatherND at indices built by Range from Shape, as transformers' mask code
    writes them) takes its type from onnx.shape_inference, whose dims are unk__N: "shape [unk__0, 3]
    cannot be evaluated: unbound dims ['unk__0']"."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "ax1"], ["idx"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
             helper.make_node("GatherND", ["xt", "idx"], ["g"]), helper.make_node("Mul", ["g", "two"], ["y"])]
    m = _model(nodes, [_vi("x", [3, 5])], [_vi("y", [5, 3])],
               {"zero": np.int64(0), "one": np.int64(1), "ax1": _i64(1), "two": np.float32(2)})
    return m, [{"x": _rand(3, 5)}, {"x": _rand(3, 5) + 1}]


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


# ------------------------------------------------------------------ kernels / coverage
def split_on_reference():
    """detector_*, gpt2_*, sdpa_torchscript (C2f blocks, qkv split): Split has no template."""
    nodes = [helper.make_node("Split", ["x", "sp"], ["a", "b"], axis=1), helper.make_node("Mul", ["a", "b"], ["y"])]
    m = _model(nodes, [_vi("x", ["B", 8, "H"])], [_vi("y", ["B", 4, "H"])], {"sp": _i64(4, 4)})
    return m, [{"x": _rand(1, 8, 3)}, {"x": _rand(2, 8, 5)}]


def bool_mask_where_on_reference():
    """sdpa_*, every sdpa export: Where(Unsqueeze(mask: bool input), 0, -inf). A kernel whose inputs are
    bool (the Unsqueeze of a bool graph input, the Where that reads it) has no template: reference path."""
    nodes = [helper.make_node("Unsqueeze", ["m", "ax1"], ["mu"]), helper.make_node("Where", ["mu", "zero", "ninf"], ["bias"]),
             helper.make_node("Add", ["x", "bias"], ["t"]), helper.make_node("Softmax", ["t"], ["y"], axis=-1)]
    m = _model(nodes, [_vi("x", ["B", "S", "S"]), _vi("m", ["B", "S"], TensorProto.BOOL)], [_vi("y", ["B", "S", "S"])],
               {"zero": np.float32(0), "ninf": np.float32(-np.inf), "ax1": _i64(1)})
    keep = lambda b, s: np.arange(s)[None, :] < np.maximum(1, s - np.arange(b))[:, None]  # noqa: E731
    return m, [{"x": _rand(2, 4, 4), "m": keep(2, 4)}, {"x": _rand(3, 6, 6), "m": keep(3, 6)}]


def cast_and_bool_on_reference():
    """gpt2_*, bert_* (attention-mask building): Cast int64->bool and And run on the reference path."""
    nodes = [helper.make_node("Cast", ["m"], ["mb"], to=TensorProto.BOOL), helper.make_node("And", ["mb", "keep"], ["a"]),
             helper.make_node("Cast", ["a"], ["af"], to=TensorProto.FLOAT), helper.make_node("Mul", ["x", "af"], ["y"])]
    m = _model(nodes, [_vi("x", ["B", "S"]), _vi("m", ["B", "S"], TensorProto.INT64)], [_vi("y", ["B", "S"])],
               {"keep": np.array(True)})
    return m, [{"x": _rand(2, 5), "m": _i64([1, 1, 1, 0, 0], [1, 1, 1, 1, 1])},
               {"x": _rand(1, 3), "m": _i64([1, 0, 1])}]


def bool_gather_flatten_on_reference():
    """gpt2_torchscript (causal-mask slicing): Cast to bool, Flatten and Gather of a bool tensor run on
    the reference path (bool data is not compiled)."""
    nodes = [helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BOOL), helper.make_node("Flatten", ["b"], ["f"], axis=1),
             helper.make_node("Gather", ["f", "i"], ["g"], axis=0), helper.make_node("Cast", ["g"], ["gf"], to=F),
             helper.make_node("Mul", ["gf", "two"], ["y"])]
    m = _model(nodes, [_vi("x", ["B", 2, 3]), _vi("i", ["K"], TensorProto.INT64)], [_vi("y", ["K", 6])],
               {"two": np.float32(2)})
    return m, [{"x": _rand(2, 2, 3), "i": _i64(0, 1)}, {"x": _rand(3, 2, 3), "i": _i64(2, 1, 1)}]


def reduce_mean_spatial_on_reference():
    """mobilenetv3_dynamo (AdaptiveAvgPool2d(1) exported as ReduceMean axes [-1, -2] keepdims): no template."""
    nodes = [helper.make_node("ReduceMean", ["x", "ax"], ["t"], keepdims=1), helper.make_node("Relu", ["t"], ["y"])]
    m = _model(nodes, [_vi("x", ["B", 4, "H", "W"])], [_vi("y", ["B", 4, 1, 1])], {"ax": _i64(-1, -2)}, opset=18)
    return m, [{"x": _rand(1, 4, 6, 6)}, {"x": _rand(2, 4, 5, 9)}]


def unbind_slice_squeeze_on_reference():
    """sdpa_dynamo (qkv.unbind(0)): Slice then Squeeze of one axis runs on the reference path."""
    nodes = [helper.make_node("Slice", ["x", "z", "o", "z"], ["s"]), helper.make_node("Squeeze", ["s", "z"], ["q"]),
             helper.make_node("MatMul", ["q", "w"], ["y"])]
    m = _model(nodes, [_vi("x", [3, "B", "S", 8])], [_vi("y", ["B", "S", 8])], {"z": _i64(0), "o": _i64(1),
                                                                               "w": _rand(8, 8)})
    return m, [{"x": _rand(3, 1, 4, 8)}, {"x": _rand(3, 2, 6, 8)}]


def heads_reshape_transpose_on_reference():
    """vit_dynamo (attention heads): Reshape [B,S,64]->[B,S,4,16], Transpose, Reshape chains run on the
    reference path before the MatMul."""
    nodes = [helper.make_node("Reshape", ["x", "t1"], ["r1"]), helper.make_node("Transpose", ["r1"], ["tr"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["tr", "t2"], ["r2"]), helper.make_node("MatMul", ["r2", "w"], ["y"])]
    m = _model(nodes, [_vi("x", ["B", 5, 64])], [_vi("y", [None, 5, 16])],
               {"t1": _i64(-1, 5, 4, 16), "t2": _i64(-1, 5, 16), "w": _rand(16, 16)})
    return m, [{"x": _rand(1, 5, 64)}, {"x": _rand(3, 5, 64)}]


AREAS = {
    "import/shapes": [torch_reshape_target_with_minus_one, paddle_dim_value_minus_one, paddle_question_mark_dims,
                      tf2onnx_slice_end_1e9, tf2onnx_reverse_slice_symbolic, opaque_op_type_from_onnx_inference,
                      dynamic_hw_import_time],
    "missing op": [isnan_sdpa_guard, resize_nearest_scales, resize_linear_sizes, gather_elements_nd],
    "kernel/coverage": [split_on_reference, bool_mask_where_on_reference, cast_and_bool_on_reference,
                        bool_gather_flatten_on_reference,
                        reduce_mean_spatial_on_reference, unbind_slice_squeeze_on_reference,
                        heads_reshape_transpose_on_reference],
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

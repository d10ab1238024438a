"""Models as real exporters write them (torch, paddle2onnx, tf2onnx conventions, control
flow, odd dtypes), made with onnx.helper: they import fast, get our own shapes, and run
like onnxruntime at two shapes. See issue 9 and DESIGN.md "Real models"."""
from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ir import ModelError, ShapeError, import_onnx, partition, simplify
from ir.reference import run_reference
from ir.shapes import UnboundDimsError, free_dims, symbol
from ir.workload import make_workload

ort = pytest.importorskip("onnxruntime")
INT64_MAX, INT32_MAX = 2**63 - 1, 2**31 - 1


def _model(nodes, inputs, outputs, inits=(), opset=17, value_info=()):
    g = helper.make_graph(nodes, "t", inputs, outputs, list(inits), value_info=list(value_info))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _i64(name, v):
    return numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)


def _f32(name, shape, rng, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _matches_onnxruntime(m, feeds_list, compiled=True):
    """Our reference executor (and runtime.load's) equals onnxruntime at every feed."""
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    g = simplify(import_onnx(m))
    loaded = None
    if compiled:
        import runtime
        loaded = runtime.load(m)
    for feeds in feeds_list:
        want = sess.run(None, feeds)
        got = run_reference(g, feeds)
        runs = [[got[o] for o in g.outputs]]
        if loaded is not None:
            out = loaded.run(feeds)
            runs.append([out[o] for o in g.outputs])
        for outs in runs:
            for a, b in zip(outs, want):
                assert a.shape == b.shape and a.dtype == b.dtype
                np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64),
                                           atol=1e-4 * max(1.0, float(np.max(np.abs(b), initial=0))))
    return g


def _workloads(g, sizes):
    """make_workload for every subgraph (what tune/tune inspect do); runtime-dim ones skip."""
    out = []
    for sg in partition(g):
        try:
            out.append(make_workload(g, sg, sizes))
        except UnboundDimsError:
            pass
    return out


# -- 1. torch attention reshape targets -----------------------------------------------
def _shape_dim(nodes, x, axis, tag):
    nodes += [helper.make_node("Shape", [x], [f"{tag}_sh"]),
              helper.make_node("Gather", [f"{tag}_sh", f"i{axis}"], [f"{tag}_g"], axis=0),
              helper.make_node("Unsqueeze", [f"{tag}_g", "ax0"], [f"{tag}_u"])]
    return f"{tag}_u"


def attention_model(heads=4, head_dim=16, seed=0):
    """Torch's split/merge heads: Reshape to Concat(Shape(x)[0], [-1], [h], [64]) and back to
    Concat(Shape[0], Shape[1], [-1]): targets that already hold a -1."""
    rng = np.random.default_rng(seed)
    hidden = heads * head_dim
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"])]
    b = _shape_dim(nodes, "x", 0, "b")
    nodes += [helper.make_node("Concat", [b, "m1", "h", "d"], ["t1"], axis=0),
              helper.make_node("Reshape", ["q", "t1"], ["q4"]),
              helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["q4"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("MatMul", ["qt", "kt"], ["s"]),
              helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "qt"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3])]
    b2, s2 = _shape_dim(nodes, "ct", 0, "b2"), _shape_dim(nodes, "ct", 1, "s2")
    nodes += [helper.make_node("Concat", [b2, s2, "m1"], ["t2"], axis=0),
              helper.make_node("Reshape", ["ct", "t2"], ["y"])]
    inits = [_f32("wq", (hidden, hidden), rng), _i64("i0", 0), _i64("i1", 1), _i64("ax0", [0]), _i64("m1", [-1]),
             _i64("h", [heads]), _i64("d", [head_dim])]
    return _model(nodes, [_vi("x", ["batch", "seq", hidden])], [_vi("y", ["batch", "seq", hidden])], inits)


def test_torch_attention_targets_holding_minus_one_resolve_symbolically():
    m = attention_model()
    g = simplify(import_onnx(m))
    B, S = symbol("batch"), symbol("seq")
    reshapes = [n for n in g.nodes if n.op == "Reshape"]
    assert [g.type_of(n.outputs[0]).shape for n in reshapes] == [(B, S, 4, 16), (B, S, 64)]
    assert [list(g.constants[n.inputs[1]]) for n in reshapes] == [[0, 0, 4, 16], [0, 0, 64]]
    assert not {"Shape", "Gather", "Concat"} & {n.op for n in g.nodes}  # the shape chains are gone
    rng = np.random.default_rng(1)
    _matches_onnxruntime(m, [{"x": rng.standard_normal((1, 5, 64)).astype(np.float32)},
                             {"x": rng.standard_normal((3, 7, 64)).astype(np.float32)}])


def test_target_with_two_free_dims_keeps_its_shape_chain_and_runs():
    """Reshape [B*S, 64] -> Concat(B, S, [-1]): no constant target exists; still no second -1."""
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["f"])]
    b, s = _shape_dim(nodes, "x", 0, "b"), _shape_dim(nodes, "x", 1, "s")
    nodes += [helper.make_node("Relu", ["f"], ["r"]), helper.make_node("Concat", [b, s, "m1"], ["t"], axis=0),
              helper.make_node("Reshape", ["r", "t"], ["y"])]
    m = _model(nodes, [_vi("x", ["batch", "seq", 64])], [_vi("y", ["batch", "seq", 64])],
               [_i64("flat", [-1, 64]), _i64("i0", 0), _i64("i1", 1), _i64("ax0", [0]), _i64("m1", [-1])])
    g = simplify(import_onnx(m))
    assert g.type_of("y").shape == (symbol("batch"), symbol("seq"), 64)
    rng = np.random.default_rng(2)
    _matches_onnxruntime(m, [{"x": rng.standard_normal((2, 3, 64)).astype(np.float32)},
                             {"x": rng.standard_normal((4, 5, 64)).astype(np.float32)}])


# -- 2. annotations are hints; runtime dims --------------------------------------------
def test_value_info_expressions_and_unk_are_hints_only():
    """onnx/exporter annotations (`unk__3`, `floor(...)` strings) never become dims."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["p"], ["y"])]
    rng = np.random.default_rng(3)
    vinfo = [_vi("c", ["unk__3", 4, "floor(height/2 - 1/2) + 1", "unk__4"]),
             _vi("p", ["N", 4, "floor(floor(height/2 - 1/2)/2) + 1", "?"])]
    m = _model(nodes, [_vi("x", ["N", 3, "height", "width"])], [_vi("y", ["N", 4, "unk__9", "unk__10"])],
               [_f32("w", (4, 3, 3, 3), rng)], value_info=vinfo)
    g = simplify(import_onnx(m))
    assert free_dims(g.type_of("y").shape) == {"N", "height", "width"}
    assert not g.runtime_dims
    sizes = {"N": 2, "height": 19, "width": 30}
    assert {tuple(w.output_shape) for w in _workloads(g, sizes)} >= {(2, 4, 5, 8)}
    _matches_onnxruntime(m, [{"x": rng.standard_normal((2, 3, 19, 30)).astype(np.float32)},
                             {"x": rng.standard_normal((1, 3, 16, 9)).astype(np.float32)}])


def test_op_without_shape_function_gets_runtime_dims_resolved_by_running(monkeypatch):
    """NonZero (data-dependent) without a shape function of ours: its count is a runtime dim;
    later nodes never fail with 'unbound dims', they run once it is known."""
    from ir.ops import OPS
    monkeypatch.delitem(OPS, "NonZero", raising=False)
    nodes = [helper.make_node("Greater", ["x", "zero"], ["pos"]),
             helper.make_node("NonZero", ["pos"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("Cast", ["idx"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "two"], ["f2"]),
             helper.make_node("ReduceSum", ["f2", "ax"], ["y"], keepdims=0),
             helper.make_node("Relu", ["x"], ["z"])]
    m = _model(nodes, [_vi("x", ["N", 5])], [_vi("y", [2]), _vi("z", ["N", 5])],
               [numpy_helper.from_array(np.float32(0.0), "zero"), numpy_helper.from_array(np.float32(2.0), "two"),
                _i64("ax", [0])], opset=13)
    g = simplify(import_onnx(m))
    (count,) = {d for d in g.type_of("f2").shape if not isinstance(d, int)}
    assert count.name in g.runtime_dims and g.type_of("f2").shape == (count, 2)
    ws = _workloads(g, {"N": 4})  # the subgraphs not after NonZero still make workloads
    assert any(w.output_shape == (4, 5) for w in ws)
    rng = np.random.default_rng(4)
    _matches_onnxruntime(m, [{"x": rng.standard_normal((4, 5)).astype(np.float32)},
                             {"x": rng.standard_normal((9, 5)).astype(np.float32)}])
    from tuner.cli import inspect_text
    assert "NonZero" in inspect_text(m)


def test_data_dependent_reshape_target_and_slice_end():
    """A Reshape target and a Slice end read from data: runtime dims, right results."""
    nodes = [helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.INT64),
             helper.make_node("Concat", ["m1", "nf"], ["t"], axis=0),
             helper.make_node("Reshape", ["x", "t"], ["r"]),
             helper.make_node("Slice", ["r", "zero", "nf", "one"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    m = _model(nodes, [_vi("x", ["N", 6]), _vi("n", [1], TensorProto.INT32)], [_vi("y", ["a", "b"])],
               [_i64("m1", [-1]), _i64("zero", [0]), _i64("one", [1])])
    rng = np.random.default_rng(5)
    _matches_onnxruntime(m, [{"x": rng.standard_normal((2, 6)).astype(np.float32), "n": np.array([3], np.int32)},
                             {"x": rng.standard_normal((4, 6)).astype(np.float32), "n": np.array([4], np.int32)}])


# -- 3. exporter conventions ---------------------------------------------------------------
def _raw_input(name, dims, t=TensorProto.FLOAT):
    """A graph input written the exporter's way: ints (paddle's -1/0) and strings ('?', '')."""
    vi = onnx.ValueInfoProto()
    vi.name = name
    vi.type.tensor_type.elem_type = t
    shape = vi.type.tensor_type.shape
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, int):
            dim.dim_value = d
        elif d is not None:
            dim.dim_param = d
    return vi


def test_paddle_minus_one_and_question_marks_are_fresh_dims():
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 1], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["c"], ["p"], axes=[2], keepdims=0),
             helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 2, 1]),
             helper.make_node("Mul", ["pt", "ratio"], ["y"])]
    inputs = [_raw_input("x", [-1, 3, "?", -1]), _raw_input("ratio", ["?", "?", None])]
    m = _model(nodes, inputs, [_raw_input("y", [-1, -1, 4])], [_f32("w", (4, 3, 3, 3), rng)], opset=13)
    g = simplify(import_onnx(m))
    x, ratio = g.type_of("x").shape, g.type_of("ratio").shape
    assert x[1] == 3 and len({*x[::2], x[3], *ratio}) == 6  # every unknown dim its own symbol
    assert all(d.name in g.dims for d in (x[0], x[2], x[3], *ratio))
    zero = _model([helper.make_node("Relu", ["x"], ["y"])], [_raw_input("x", [0, "", 4])], [_vi("y", ["a", "b", 4])])
    assert [str(d) for d in import_onnx(zero).type_of("x").shape] == ["x_0", "x_1", "4"]  # dim_value 0 too
    feeds = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32), "ratio": np.ones((1, 1, 1), np.float32)},
             {"x": rng.standard_normal((2, 3, 8, 40)).astype(np.float32),
              "ratio": rng.uniform(0.5, 1, (2, 1, 1)).astype(np.float32)}]
    _matches_onnxruntime(m, feeds)


@pytest.mark.parametrize("end", [10**9, INT64_MAX, INT32_MAX])
def test_tf2onnx_slice_sentinels_clamp_symbolically(end):
    """x[1:END] on the batch, x[::-1] to INT64_MIN on H, x[-3:] on W: the batch never becomes 1e9."""
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["a"]),
             helper.make_node("Slice", ["a", "rst", "ren", "rax", "rstep"], ["b"]),
             helper.make_node("Slice", ["b", "wst", "wen", "wax"], ["y"])]
    inits = [_i64("st", [1]), _i64("en", [end]), _i64("ax", [0]), _i64("rst", [-1]), _i64("ren", [-INT64_MAX - 1]),
             _i64("rax", [1]), _i64("rstep", [-1]), _i64("wst", [-3]), _i64("wen", [end]), _i64("wax", [2])]
    m = _model(nodes, [_vi("x", ["unk__12", "unk__13", "unk__14", 3])], [_vi("y", ["unk__15", "unk__16", 3, 3])],
               inits, opset=13)
    g = simplify(import_onnx(m))
    n, h, w = g.type_of("x").shape[:3]  # unk__N: fresh dims named after the input
    y = g.type_of("y").shape
    assert y[0] == n - 1 and y[1] == h and y[3] == 3
    from ir.shapes import bind
    assert bind(y, {n.name: 5, h.name: 4, w.name: 2}) == (4, 4, 2, 3)
    rng = np.random.default_rng(7)
    _matches_onnxruntime(m, [{"x": rng.standard_normal((3, 4, 5, 3)).astype(np.float32)},
                             {"x": rng.standard_normal((2, 6, 2, 3)).astype(np.float32)}])


def test_slice_end_within_a_symbolic_dim_is_exact():
    """pos[:S] of a static [16, 8] table: Min(S, 16), not S (and not 16)."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "i1"], ["s"]),
             helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"]),
             helper.make_node("Slice", ["pos", "z", "s1", "ax0"], ["p"]), helper.make_node("Add", ["x", "p"], ["y"])]
    rng = np.random.default_rng(8)
    m = _model(nodes, [_vi("x", ["B", "S", 8])], [_vi("y", ["B", "S", 8])],
               [_f32("pos", (16, 8), rng), _i64("i1", 1), _i64("ax0", [0]), _i64("z", [0])])
    g = simplify(import_onnx(m))
    assert g.type_of("y").shape == (symbol("B"), symbol("S"), 8)
    with pytest.raises(ShapeError, match="must agree"):  # S = 20 > 16 rows: a real mismatch
        run_reference(g, {"x": np.zeros((1, 20, 8), np.float32)})
    _matches_onnxruntime(m, [{"x": rng.standard_normal((2, 5, 8)).astype(np.float32)},
                             {"x": rng.standard_normal((1, 16, 8)).astype(np.float32)}])


# -- 5. import speed -------------------------------------------------------------------------
def cnn_model(nodes_wanted=1000, seed=0) -> onnx.ModelProto:
    """A CNN-ish model with dynamic batch, height and width: Conv (some stride 2) + bias +
    activation + elementwise, MaxPool now and then, a torch-style Flatten via Shape at the end."""
    rng = np.random.default_rng(seed)
    nodes, inits, k, c = [], [], 0, 3
    x = "x"

    def add(op, ins, **attrs):
        nonlocal k
        k += 1
        nodes.append(helper.make_node(op, ins, [f"v{k}"], name=f"{op}_{k}", **attrs))
        return f"v{k}"

    block = 0
    while len(nodes) < nodes_wanted - 12:
        block += 1
        cout = 4 + (block % 3) * 2
        inits.append(_f32(f"w{block}", (cout, c, 3, 3), rng))
        inits.append(_f32(f"b{block}", (1, cout, 1, 1), rng))
        stride = 2 if block % 40 == 0 else 1
        y = add("Conv", [x, f"w{block}"], strides=[stride, stride], pads=[1, 1, 1, 1])
        y = add("Add", [y, f"b{block}"])
        y = add(["Relu", "Sigmoid", "Tanh"][block % 3], [y])
        if block % 2 == 0 and cout == c:
            y = add("Add", [y, x])  # residual
        y = add("Mul", [y, f"b{block}"])
        if block % 55 == 0:
            y = add("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)
        x, c = y, cout
    g = add("GlobalAveragePool", [x])
    sh = add("Shape", [g])
    b = add("Gather", [sh, "i0"], axis=0)
    bu = add("Unsqueeze", [b, "ax0"])
    t = add("Concat", [bu, "m1"], axis=0)
    y = add("Reshape", [g, t])
    nodes[-1].output[0] = "y"
    inits += [_i64("i0", 0), _i64("ax0", [0]), _i64("m1", [-1])]
    return _model(nodes, [_vi("x", ["batch", 3, "height", "width"])], [_vi("y", ["batch", c])], inits, opset=13)


def transformer_model(nodes_wanted=1000, hidden=32, heads=4, seed=0) -> onnx.ModelProto:
    """Transformer-ish, dynamic batch and sequence: MatMul, torch-style Reshape targets via
    Shape/Gather/Concat, Transpose, Softmax, LayerNormalization, residual Adds."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], [_i64("i0", 0), _i64("i1", 1), _i64("ax0", [0]), _i64("m1", [-1]), _i64("h", [heads]),
                        _i64("d", [hidden // heads]), numpy_helper.from_array(np.float32(np.sqrt(hidden // heads)), "sc")]
    x, layer = "x", 0
    while len(nodes) < nodes_wanted - 40:
        layer += 1
        p = f"l{layer}"

        def op(o, ins, out=None, **attrs):
            out = out or f"{p}.{len(nodes)}"
            nodes.append(helper.make_node(o, ins, [out], name=out, **attrs))
            return out
        inits += [_f32(f"{p}.{w}", (hidden, hidden), rng) for w in ("q", "k", "v", "o")]
        inits += [numpy_helper.from_array(np.ones(hidden, np.float32), f"{p}.g"),
                  numpy_helper.from_array(np.zeros(hidden, np.float32), f"{p}.b")]
        sh = op("Shape", [x])
        b = op("Unsqueeze", [op("Gather", [sh, "i0"], axis=0), "ax0"])
        s = op("Unsqueeze", [op("Gather", [sh, "i1"], axis=0), "ax0"])
        split = op("Concat", [b, "m1", "h", "d"], axis=0)
        heads_ = []
        for w, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            heads_.append(op("Transpose", [op("Reshape", [op("MatMul", [x, f"{p}.{w}"]), split])], perm=perm))
        scores = op("Div", [op("MatMul", heads_[:2]), "sc"])
        ctx = op("Transpose", [op("MatMul", [op("Softmax", [scores], axis=-1), heads_[2]])], perm=[0, 2, 1, 3])
        merge = op("Concat", [b, s, "m1"], axis=0)
        attn = op("MatMul", [op("Reshape", [ctx, merge]), f"{p}.o"])
        x = op("LayerNormalization", [op("Add", [x, attn]), f"{p}.g", f"{p}.b"], axis=-1)
    nodes[-1].output[0] = "y"
    return _model(nodes, [_vi("x", ["batch", "sequence", hidden])], [_vi("y", ["batch", "sequence", hidden])],
                  inits, opset=17)


def _import_seconds(m):
    t0 = time.perf_counter()
    g = simplify(import_onnx(m))
    sgs = partition(g)
    return time.perf_counter() - t0, g, sgs


@pytest.mark.parametrize("make", [cnn_model, transformer_model], ids=["cnn_batch_hw", "transformer_batch_seq"])
def test_thousand_node_dynamic_model_imports_fast(make):
    m = make(1000)
    assert len(m.graph.node) >= 960
    seconds, g, sgs = _import_seconds(m)
    print(f"{make.__name__}: {len(m.graph.node)} nodes -> import+simplify+partition {seconds:.2f} s")
    assert seconds < 10, f"import took {seconds:.1f} s"  # about 1 s on 2 shared cores
    assert not g.runtime_dims and len(sgs) > 100
    assert free_dims(g.type_of("y").shape) <= {"batch", "height", "width", "sequence"}


def test_thousand_node_models_run_like_onnxruntime_at_two_shapes():
    rng = np.random.default_rng(9)
    m = cnn_model(120)
    _matches_onnxruntime(m, [{"x": rng.standard_normal((1, 3, 9, 12)).astype(np.float32)},
                             {"x": rng.standard_normal((2, 3, 7, 5)).astype(np.float32)}], compiled=False)
    m = transformer_model(80)
    _matches_onnxruntime(m, [{"x": rng.standard_normal((1, 3, 32)).astype(np.float32)},
                             {"x": rng.standard_normal((2, 5, 32)).astype(np.float32)}], compiled=False)


# -- 6. control flow ---------------------------------------------------------------------------
def loop_model():
    """y = x + sum_{i<n} (x * i + bias): a Loop whose body reads `x` and `bias` from outside."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("Add", ["xi", "bias_r"], ["t"]),
         helper.make_node("Add", ["acc", "t"], ["acc2"]),
         helper.make_node("Identity", ["cond"], ["cond2"]),
         helper.make_node("ReduceSum", ["t", "axis0"], ["scan"], keepdims=0)],
        "loop_body", [_vi("i", [], TensorProto.INT64), _vi("cond", [], TensorProto.BOOL), _vi("acc", None)],
        [_vi("cond2", [], TensorProto.BOOL), _vi("acc2", None), _vi("scan", [3])],
        [numpy_helper.from_array(np.array([0], np.int64), "axis0")])
    nodes = [helper.make_node("Relu", ["bias"], ["bias_r"]),
             helper.make_node("Loop", ["n", "yes", "x"], ["acc_out", "scans"], body=body),
             helper.make_node("Add", ["acc_out", "x"], ["y"])]
    return _model(nodes, [_vi("x", ["N", 3]), _vi("n", [], TensorProto.INT64)],
                  [_vi("y", ["N", 3]), _vi("scans", ["T", 3])], [numpy_helper.from_array(np.ones(3, np.float32), "bias"), numpy_helper.from_array(np.array(True), "yes")])


def if_scan_model():
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["r"])], "then", [], [_vi("r", ["N", 4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["r2"])], "else", [], [_vi("r2", ["N", 4])])
    sbody = helper.make_graph([helper.make_node("Add", ["s", "row"], ["s2"]), helper.make_node("Identity", ["s2"], ["o"])],
                              "scan_body", [_vi("s", [4]), _vi("row", [4])], [_vi("s2", [4]), _vi("o", [4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["tot"], keepdims=0),
             helper.make_node("Greater", ["tot", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["b"], then_branch=then, else_branch=other),
             helper.make_node("Scan", ["init", "b"], ["final", "rows"], body=sbody, num_scan_inputs=1),
             helper.make_node("Relu", ["rows"], ["y"])]
    return _model(nodes, [_vi("x", ["N", 4])], [_vi("y", ["N", 4]), _vi("final", [4])],
                  [numpy_helper.from_array(np.float32(2.0), "two"), numpy_helper.from_array(np.float32(0.0), "zero"),
                   numpy_helper.from_array(np.zeros(4, np.float32), "init")], opset=13)


@pytest.mark.parametrize("make", [loop_model, if_scan_model])
def test_control_flow_imports_partitions_and_inspects(make):
    m = make()
    g = simplify(import_onnx(m))
    cf = [n for n in g.nodes if n.op in ("Loop", "If", "Scan")]
    assert cf and all(n.op not in __import__("ir.ops", fromlist=["OPS"]).OPS for n in cf)  # opaque, untunable
    from ir.graph import Graph
    for n in cf:
        bodies = [v for k, v in n.attrs.items() if k in ("body", "then_branch", "else_branch")]
        assert bodies and all(isinstance(b, Graph) for b in bodies)
        outer = n.attrs.get("_outer", [])
        assert list(n.inputs[len(n.inputs) - len(outer):]) == outer or outer == []
    if make is loop_model:
        (loop,) = cf
        assert loop.attrs["body"].outer == ["x", "bias_r"] and loop.attrs["_outer"] == ["x", "bias_r"]
        assert "bias_r" in g.constants  # folded, and kept alive by the Loop that reads it
    import json
    for w in _workloads(g, {"N": 2}):
        json.dumps(w.to_json())
        assert w.key
    from tuner.cli import inspect_text
    assert make().graph.node[-1].op_type in inspect_text(m) or "Relu" in inspect_text(m)


def test_a_body_is_a_graph_the_passes_and_runtime_take():
    """The API the executor runs bodies with: body_graph(...) -> simplify -> run, per iteration."""
    from ir.graph import TensorType, body_graph, split_outer
    g = simplify(import_onnx(loop_model()))
    (loop,) = [n for n in g.nodes if n.op == "Loop"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    own, outer = split_outer(loop, [np.array(2), np.array(True), x, x, g.constants["bias_r"]])
    assert len(own) == 3 and set(outer) == {"x", "bias_r"}
    types = {"acc": TensorType((2, 3)), "x": TensorType((2, 3)), "bias_r": TensorType((3,))}
    body = simplify(body_graph(loop.attrs["body"], types))
    feeds = {"i": np.array(1, np.int64), "cond": np.array(True), "acc": x, **outer}
    out = run_reference(body, feeds)
    np.testing.assert_allclose(out["acc2"], x + x * 1 + 1)
    np.testing.assert_allclose(out["scan"], (x * 1 + 1).sum(0))
    import runtime
    from runtime.choose import Chooser
    compiled = runtime.CompiledModel(body, partition(body), Chooser(None, None, "cpu"))
    np.testing.assert_allclose(compiled.run(feeds)["acc2"], x + x + 1)


def test_control_flow_runs_like_onnxruntime():
    rng = np.random.default_rng(10)
    _matches_onnxruntime(loop_model(), [{"x": rng.standard_normal((2, 3)).astype(np.float32), "n": np.array(3)},
                                        {"x": rng.standard_normal((5, 3)).astype(np.float32), "n": np.array(1)}],
                         compiled=False)
    _matches_onnxruntime(if_scan_model(), [{"x": rng.standard_normal((2, 4)).astype(np.float32)},
                                           {"x": -np.abs(rng.standard_normal((3, 4))).astype(np.float32)}],
                         compiled=False)


# -- 7. dtypes -----------------------------------------------------------------------------------
@pytest.mark.parametrize("t,name", [(TensorProto.BFLOAT16, "bfloat16"), (TensorProto.INT16, "int16"),
                                    (TensorProto.UINT16, "uint16"), (TensorProto.FLOAT16, "float16"),
                                    (TensorProto.DOUBLE, "float64"), (TensorProto.UINT32, "uint32"),
                                    (TensorProto.INT8, "int8"), (TensorProto.UINT64, "uint64")])
def test_element_types_are_never_retyped(t, name):
    m = _model([helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Cast", ["x"], ["z"], to=t)],
               [_vi("x", ["N", 2], t)], [_vi("y", ["N", 2], t), _vi("z", ["N", 2], t)])
    g = import_onnx(m)
    assert g.type_of("x").dtype == name
    assert simplify(g).type_of("z").dtype == name


def test_types_only_onnx_reference_runs_keep_their_dtype_and_run():
    """float8 weights and complex casts are never retyped: they run on the per-node path."""
    m = _model([helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
                helper.make_node("Add", ["x", "wf"], ["y"])], [_vi("x", ["N", 2])], [_vi("y", ["N", 2])],
               [helper.make_tensor("w", TensorProto.FLOAT8E4M3FN, [2], [1.0, 2.0])], opset=19)
    g = import_onnx(m)
    assert str(g.constants["w"].dtype) == "float8_e4m3fn"
    _matches_onnxruntime(m, [{"x": np.ones((1, 2), np.float32)}, {"x": np.zeros((3, 2), np.float32)}],
                         compiled=False)


@pytest.mark.parametrize("where,make", [
    ("graph input 'x' has element type UNDEFINED", lambda: _model(
        [helper.make_node("Identity", ["x"], ["y"])], [_vi("x", [2], TensorProto.UNDEFINED)], [_vi("y", [2])])),
    ("node 'to_nothing' \\(Cast\\) output 'y' has element type 99", lambda: _model(
        [helper.make_node("Cast", ["x"], ["y"], to=99, name="to_nothing")], [_vi("x", [2])], [_vi("y", [2])])),
])
def test_element_type_we_do_not_know_is_a_model_error_naming_it(where, make):
    try:
        m = make()
    except onnx.checker.ValidationError:
        pytest.skip("onnx.checker already rejects this model")
    with pytest.raises(ModelError, match=where):
        import_onnx(m)


# -- 8. the guard against huge allocations --------------------------------------------------
def test_a_misread_size_is_an_error_naming_node_value_and_dim_not_an_allocation():
    m = _model([helper.make_node("Tile", ["x", "reps"], ["t"], name="tile"), helper.make_node("Relu", ["t"], ["y"])],
               [_vi("x", ["batch", 4])], [_vi("y", ["batch", "w"])], [_i64("reps", [1, 2**30])])
    g = simplify(import_onnx(m))
    with pytest.raises(ShapeError, match=r"node 'tile'.*output 't'.*axis 1 = 4294967296"):
        _workloads(g, {"batch": 2})
    import runtime
    with pytest.raises(ShapeError, match=r"node '(tile|Relu_1)'.*2\*\*31"):
        runtime.load(m)(np.zeros((2, 4), np.float32))
    with pytest.raises(ShapeError, match=r"node 'tile' \(Tile\): output 't'.*axis 1"):
        run_reference(g, {"x": np.zeros((2, 4), np.float32)})

"""elementwise template: broadcast chains and injective copies (Transpose, Reshape, Slice,
Gather, Concat, Cast) agree with the NumPy reference, over float32, int64, int32 and bool values
(masks, NaN tests, integer shape arithmetic)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules import get_template
from tests.template_cases import check, make_wl

EW = get_template("elementwise")
RNG = np.random.default_rng(0)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), shape=st.lists(st.sampled_from([1, 2, 3, 17]), min_size=1, max_size=4),
       vector=st.sampled_from(["flat", "last"]), unroll=st.sampled_from([1, 4, 8]))
def test_broadcast_chains_match_numpy(data, shape, vector, unroll):
    """GELU-like chain x / s -> erf -> + 1 -> * x -> * b, where b broadcasts along a random mask of dims."""
    mask = data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    bshape = tuple(d if m else 1 for d, m in zip(shape, mask))
    wl = make_wl([("Div", ["i0", "i1"], {}), ("Erf", ["t0"], {}), ("Add", ["t1", "i2"], {}), ("Mul", ["t2", "i0"], {}),
                  ("Mul", ["t3", "i3"], {})],
                 [(tuple(shape), "float32", False), ((), "float32", True), ((), "float32", True), (bshape, "float32", False)])
    assert EW.matches(wl)
    space = EW.space(wl)
    runtime = {k.name: data.draw(st.sampled_from(k.options)) for k in space.knobs if not k.code_shape}
    check(EW, wl, space.validate({**runtime, "vector": vector, "unroll": unroll}))


CASES = {
    "reshape_transpose": ([("Reshape", ["i0", "i1"], {}), ("Transpose", ["t0"], {"perm": [0, 2, 1, 3]})],
                          [((2, 5, 12), "float32", False), ((4,), "int64", True)], lambda: [f32(2, 5, 12), np.array([2, 5, 3, 4])]),
    "transpose_reshape": ([("Transpose", ["i0"], {"perm": [0, 2, 1, 3]}), ("Reshape", ["t0", "i1"], {})],
                          [((1, 3, 5, 4), "float32", False), ((3,), "int64", True)], lambda: [f32(1, 3, 5, 4), np.array([1, 5, 12])]),
    "gather": ([("Gather", ["i0", "i1"], {"axis": 0})], [((10, 6), "float32", True), ((2, 3), "int64", False)],
               lambda: [f32(10, 6), np.array([[1, -2, 3], [0, 9, 4]])]),
    "slice_dynamic_ends": ([("Slice", ["i0", "i1", "i2", "i3"], {})],
                           [((9, 6), "float32", True), ((1,), "int64", True), ((1,), "int64", False), ((1,), "int64", True)],
                           lambda: [f32(9, 6), np.array([1]), np.array([7]), np.array([0])]),
    "concat": ([("Concat", ["i0", "i1"], {"axis": 1})], [((2, 3, 4), "float32", False), ((2, 5, 4), "float32", False)], None),
    "mask": ([("Cast", ["i0"], {"to": 1}), ("Sub", ["i1", "t0"], {}), ("Mul", ["t1", "i2"], {})],
             [((2, 1, 1, 7), "int64", False), ((), "float32", True), ((), "float32", True)],
             lambda: [RNG.integers(0, 2, (2, 1, 1, 7)), np.float32(1.0), np.float32(-1e4)]),
    "flatten": ([("Flatten", ["i0"], {"axis": 1})], [((2, 5, 1, 1), "float32", False)], None),
    # Reshape's axes in groups of equal size (`_reshape_groups`): one axis split in three (3 x 5 x 4),
    # size-1 axes on both sides, two axes merged (a non-power-of-two 6 = 2 x 3 and 4 x 2 = 8) and a
    # group of two axes on each side (6 x 4 -> 4 x 6), each between Transposes so that the index is not the flat one
    "reshape_groups_split_merge": ([("Transpose", ["i0"], {"perm": [1, 0, 2]}), ("Reshape", ["t0", "i1"], {}),
                                    ("Transpose", ["t1"], {"perm": [4, 1, 2, 3, 0, 5]})],
                                   [((60, 2, 3), "float32", False), ((6,), "int64", True)],
                                   lambda: [f32(60, 2, 3), np.array([2, 1, 3, 5, 4, 3])]),
    "reshape_groups_many_to_many": ([("Transpose", ["i0"], {"perm": [2, 1, 0, 3]}), ("Reshape", ["t0", "i1"], {}),
                                     ("Transpose", ["t1"], {"perm": [3, 1, 2, 0]})],
                                    [((3, 6, 4, 8), "float32", False), ((4,), "int64", True)],
                                    lambda: [f32(3, 6, 4, 8), np.array([4, 6, 3, 8])]),
    "reshape_groups_merge_pow2": ([("Transpose", ["i0"], {"perm": [0, 2, 1, 3]}), ("Reshape", ["t0", "i1"], {}),
                                   ("Transpose", ["t1"], {"perm": [1, 0, 2]})],
                                  [((1, 3, 16, 64), "float32", False), ((3,), "int64", True)],
                                  lambda: [f32(1, 3, 16, 64), np.array([1, 16, 192])]),
    # Slices whose steps the workload holds: code constants (1 the common case, 2 and -1 here), the
    # starts from the kernel's table; then a channel split of a CSP block feeding a Concat
    "slice_steps_known": ([("Slice", ["i0", "i1", "i2", "i3", "i4"], {})],
                          [((4, 9, 10), "float32", False), ((3,), "int64", True), ((3,), "int64", True),
                           ((3,), "int64", True), ((3,), "int64", True)],
                          lambda: [f32(4, 9, 10), np.array([1, 8, 2]), np.array([4, 0, 9]), np.array([0, 1, 2]),
                                   np.array([1, -2, 3])]),
    "slice_concat_channels": ([("Slice", ["i0", "i1", "i2", "i3"], {}), ("Concat", ["t0", "i4"], {"axis": 1})],
                              [((2, 16, 3, 5), "float32", False), ((1,), "int64", True), ((1,), "int64", True),
                               ((1,), "int64", True), ((2, 4, 3, 5), "float32", False)],
                              lambda: [f32(2, 16, 3, 5), np.array([8]), np.array([16]), np.array([1]), f32(2, 4, 3, 5)]),
    # a Concat along the channels: each row is one input's (`_row_branches`), here an upsampled map's
    "resize_concat_channels": ([("Resize", ["i0", "i1", "i2"], {"mode": "linear"}), ("Concat", ["t0", "i3"], {"axis": 1})],
                               [((1, 3, 4, 5), "float32", False), ((0,), "float32", True), ((4,), "float32", True),
                                ((1, 2, 8, 10), "float32", False)],
                               lambda: [f32(1, 3, 4, 5), np.zeros(0, np.float32), np.array([1, 1, 2, 2], np.float32),
                                        f32(1, 2, 8, 10)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_injective_copies(name):
    ops, ins, arrays = CASES[name]
    arrays = arrays() if arrays else None
    wl = make_wl(ops, ins, arrays)
    assert EW.matches(wl)
    check(EW, wl, EW.space(wl).validate({**EW.default_config(wl).to_json(), "vector": "last", "unroll": 4}), arrays=arrays)


NEG = np.array([[-7, 7, -6, 5], [3, -3, 0, 9]], np.int64)

TYPED = {
    # integer arithmetic as ONNX defines it: Div truncates, Mod takes the divisor's sign (fmod=1: the dividend's)
    "int64_div_mod": ([("Div", ["i0", "i1"], {}), ("Mod", ["i0", "i1"], {}), ("Mul", ["t0", "t1"], {}),
                       ("Mod", ["i0", "i1"], {"fmod": 1}), ("Add", ["t2", "t3"], {})],
                      [((2, 4), "int64", False), ((4,), "int64", True)], lambda: [NEG, np.array([2, -3, 4, -5])]),
    "int32_sign_abs_neg": ([("Sign", ["i0"], {}), ("Abs", ["i0"], {}), ("Mul", ["t0", "t1"], {}), ("Neg", ["t2"], {}),
                            ("Max", ["t3", "i1"], {})],
                           [((2, 4), "int32", False), ((), "int32", True)], lambda: [NEG.astype(np.int32), np.int32(-5)]),
    # torch attention masks: Where(Equal(mask, 0), -inf, scores), bool results, int -> float casts
    "attention_mask": ([("Equal", ["i0", "i1"], {}), ("Where", ["t0", "i2", "i3"], {})],
                       [((2, 1, 1, 5), "int64", False), ((), "int64", True), ((), "float32", True),
                        ((2, 3, 5, 5), "float32", False)],
                       lambda: [RNG.integers(0, 2, (2, 1, 1, 5)), np.int64(0), np.float32(-np.inf), f32(2, 3, 5, 5)]),
    "comparisons_to_bool": ([("Less", ["i0", "i1"], {}), ("Not", ["t0"], {}), ("GreaterOrEqual", ["i0", "i2"], {}),
                             ("And", ["t1", "t2"], {}), ("Xor", ["t3", "t0"], {})],
                            [((3, 4), "float32", False), ((4,), "float32", False), ((), "float32", True)], None),
    # torch sdpa exports: Where(IsNaN(softmax), 0, softmax); NaN and inf must survive fastmath
    "isnan_isinf": ([("IsNaN", ["i0"], {}), ("IsInf", ["i0"], {"detect_negative": 0}), ("Or", ["t0", "t1"], {}),
                     ("Where", ["t2", "i1", "i0"], {})],
                    [((3, 4), "float32", False), ((), "float32", True)],
                    lambda: [np.array([[np.nan, 1, np.inf, -np.inf]] * 3, np.float32), np.float32(0)]),
    "cast_chain": ([("Cast", ["i0"], {"to": 6}), ("Cast", ["t0"], {"to": 9}), ("Cast", ["t1"], {"to": 1}),
                    ("Add", ["t2", "i0"], {})],
                   [((2, 5), "float32", False)], lambda: [np.array([[-2.7, -0.5, 0, 0.4, 3.9]] * 2, np.float32)]),
    "expand_int64": ([("Expand", ["i0", "i1"], {}), ("Cast", ["t0"], {"to": 9})],
                     [((1, 5), "int64", False), ((3,), "int64", True)], lambda: [RNG.integers(0, 2, (1, 5)), np.array([2, 3, 5])]),
    "gather_int64_data": ([("Gather", ["i0", "i1"], {"axis": 1})], [((2, 6), "int64", False), ((3,), "int32", True)],
                          lambda: [RNG.integers(-9, 9, (2, 6)), np.array([5, -1, 0], np.int32)]),
    # a gathered index inside one branch of a Concat is read only for that branch's elements
    "concat_of_gather": ([("Gather", ["i0", "i1"], {"axis": 0}), ("Concat", ["t0", "i2"], {"axis": 0})],
                         [((5, 4), "float32", True), ((2,), "int64", False), ((3, 4), "float32", False)],
                         lambda: [f32(5, 4), np.array([4, -5]), f32(3, 4)]),
    "bitwise_shift": ([("BitwiseAnd", ["i0", "i1"], {}), ("BitShift", ["t0", "i2"], {"direction": "LEFT"}),
                       ("BitwiseNot", ["t1"], {})],
                      [((2, 4), "int32", False), ((4,), "int32", False), ((), "int32", True)],
                      lambda: [RNG.integers(0, 99, (2, 4)).astype(np.int32), RNG.integers(0, 99, 4).astype(np.int32), np.int32(2)]),
    "round_floor_ceil": ([("Round", ["i0"], {}), ("Floor", ["i0"], {}), ("Ceil", ["i0"], {}), ("Add", ["t0", "t1"], {}),
                          ("Sub", ["t3", "t2"], {})],
                         [((6,), "float32", False)], lambda: [np.array([0.5, 1.5, 2.5, -0.5, -1.7, 2.2], np.float32)]),
}


@pytest.mark.parametrize("name", sorted(TYPED))
def test_typed_values(name):
    ops, ins, arrays = TYPED[name]
    arrays = arrays() if arrays else None
    wl = make_wl(ops, ins, arrays)
    assert EW.matches(wl), name
    for vector in ("flat", "last"):
        cfg = EW.space(wl).validate({**EW.default_config(wl).to_json(), "vector": vector, "unroll": 4})
        check(EW, wl, cfg, arrays=arrays)


def test_int64_shape_arithmetic_compiles():
    wl = make_wl([("Unsqueeze", ["i0", "i1"], {})], [((2, 3), "int64", False), ((2,), "int64", True)],
                 [np.ones((2, 3), np.int64), np.array([1, 2])])
    assert EW.matches(wl) and wl.output_dtype == "int64"
    check(EW, wl, EW.default_config(wl), arrays=[np.arange(6).reshape(2, 3) - 3, np.array([1, 2])])


def test_unsupported_element_types_are_not_matched():
    wl = make_wl([("Relu", ["i0"], {})], [((4,), "float16", False)])
    assert not EW.matches(wl)


# index maps of ops registered in ir/ops/index_ops.py and ir/ops/math_more.py (the ops helper's modules)
INDEXED = {
    "gather_elements": ([("GatherElements", ["i0", "i1"], {"axis": 1}), ("Relu", ["t0"], {})],
                        [((3, 5), "float32", False), ((3, 4), "int64", False)],
                        lambda: [f32(3, 5), RNG.integers(-5, 5, (3, 4))]),
    "gather_nd": ([("GatherND", ["i0", "i1"], {})], [((4, 3, 2), "float32", False), ((5, 2), "int64", False)],
                  lambda: [f32(4, 3, 2), np.stack([RNG.integers(-4, 4, 5), RNG.integers(0, 3, 5)], 1)]),
    "gather_nd_batch_dims": ([("GatherND", ["i0", "i1"], {"batch_dims": 1})],
                             [((2, 3, 4), "float32", False), ((2, 5, 1), "int64", False)],
                             lambda: [f32(2, 3, 4), RNG.integers(0, 3, (2, 5, 1))]),
    "trilu_lower": ([("Trilu", ["i0", "i1"], {"upper": 0})], [((2, 4, 5), "float32", False), ((), "int64", True)],
                    lambda: [f32(2, 4, 5), np.array(1)]),
    "castlike": ([("CastLike", ["i0", "i1"], {}), ("Add", ["t0", "i1"], {})],
                 [((2, 4), "float32", False), ((1,), "int64", False)], lambda: [f32(2, 4) * 5, np.array([3])]),
}


@pytest.mark.parametrize("name", sorted(INDEXED))
def test_index_maps(name):
    from ir.ops import OPS
    ops, ins, arrays = INDEXED[name]
    if ops[0][0] not in OPS:
        pytest.skip(f"{ops[0][0]} is registered by another module (ir/ops/index_ops.py or math_more.py)")
    arrays = arrays()
    wl = make_wl(ops, ins, arrays)
    assert EW.matches(wl), name
    for vector in ("flat", "last"):
        check(EW, wl, EW.space(wl).validate({**EW.default_config(wl).to_json(), "vector": vector}), arrays=arrays)


def _attention_model():
    """Torch-style masked attention scores: Shape/Gather/Concat reshape targets, an int64 mask
    turned into Where(Equal(mask, 0), -inf, scores), Softmax, sdpa's Where(IsNaN(p), 0, p)."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh
    rng = np.random.default_rng(1)
    d, heads = 8, 2
    n = h.make_node
    nodes = [
        n("MatMul", ["x", "wq"], ["q"]), n("MatMul", ["x", "wk"], ["k"]),
        n("Shape", ["x"], ["shp"]), n("Gather", ["shp", "zero"], ["b"]), n("Gather", ["shp", "one"], ["s"]),
        n("Unsqueeze", ["b", "ax0"], ["b1"]), n("Unsqueeze", ["s", "ax0"], ["s1"]),
        n("Concat", ["b1", "s1", "heads", "hd"], ["tgt"], axis=0),
        n("Reshape", ["q", "tgt"], ["q4"]), n("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        n("Reshape", ["k", "tgt"], ["k4"]), n("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        n("MatMul", ["qt", "kt"], ["sc"]),
        n("Unsqueeze", ["mask", "ax12"], ["m4"]), n("Equal", ["m4", "izero"], ["meq"]),
        n("Where", ["meq", "ninf", "sc"], ["msc"]), n("Softmax", ["msc"], ["p"], axis=-1),
        n("IsNaN", ["p"], ["nan"]), n("Where", ["nan", "fzero", "p"], ["p2"]),
        n("Cast", ["mask"], ["mf"], to=TP.FLOAT), n("Unsqueeze", ["mf", "ax12"], ["mf4"]), n("Mul", ["p2", "mf4"], ["out"]),
    ]
    consts = {"wq": rng.standard_normal((d, d)).astype(np.float32), "wk": rng.standard_normal((d, d)).astype(np.float32),
              "zero": np.array(0), "one": np.array(1), "ax0": np.array([0]), "ax12": np.array([1, 2]),
              "heads": np.array([heads]), "hd": np.array([d // heads]), "izero": np.array(0),
              "ninf": np.array(-np.inf, np.float32), "fzero": np.array(0, np.float32)}
    g = h.make_graph(nodes, "attn", [h.make_tensor_value_info("x", TP.FLOAT, ["B", "S", d]),
                                     h.make_tensor_value_info("mask", TP.INT64, ["B", "S"])],
                     [h.make_tensor_value_info("out", TP.FLOAT, ["B", heads, "S", "S"])],
                     [nh.from_array(v, k) for k, v in consts.items()])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_torch_style_attention_mask_runs_on_compiled_kernels():
    ort = pytest.importorskip("onnxruntime")
    import runtime
    model = _attention_model()
    m = runtime.load(model)
    sess = ort.InferenceSession(model.SerializeToString())
    for s in (4, 6):   # two sequence lengths; batch row 0 masks all but 2 positions
        feeds = {"x": RNG.standard_normal((2, s, 8)).astype(np.float32),
                 "mask": (np.arange(s)[None, :] < np.array([[2], [s]])).astype(np.int64)}
        want = sess.run(None, feeds)[0]
        np.testing.assert_allclose(m(**feeds), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    cov = m.coverage()
    assert cov.share("reference") == 0 and cov.share("view") == 0, str(cov)


def test_transcendental_chain_is_polynomial_and_matches_numpy():
    """Tanh, Exp, Sigmoid and Log in one chain: vectorizable polynomials (no libm call per
    element, which kept LLVM from vectorizing), each op's value a temporary; values as NumPy's."""
    from codegen.source import render
    wl = make_wl([("Tanh", ["i0"], {}), ("Mul", ["t0", "i1"], {}), ("Exp", ["t1"], {}), ("Sigmoid", ["t2"], {}),
                  ("Log", ["t3"], {})], [((5, 37), "float32", False), ((), "float32", True)])
    cfg = EW.default_config(wl)
    src = render(EW.lower(wl, cfg).module)
    assert "math." not in src and "v4 = " in src
    check(EW, wl, cfg)


@pytest.mark.parametrize("data_shape,axis,ids", [
    ((10, 16), 0, [[3, -1, 0, 9, 2]]),       # BERT's embedding: rows of a (vocab, hidden) table
    ((2, 5, 3, 4), 1, [4, -5, 0]),           # an inner gathered axis: rows of 3 x 4 per (outer, index)
])
def test_gather_of_whole_rows_is_a_row_copy(data_shape, axis, ids):
    """A lone Gather of contiguous rows copies each row (one index load per row), negative
    indices counting from the end, and matches NumPy."""
    from codegen.source import render
    ids = np.array(ids, np.int64)
    arrays = [f32(*data_shape), ids]
    wl = make_wl([("Gather", ["i0", "i1"], {"axis": axis})], [(data_shape, "float32", True), (ids.shape, "int64", False)],
                 arrays)
    src = render(EW.lower(wl, EW.default_config(wl)).module)
    assert "row copies" in src and "out[np.uint64(dst + j)] = x0[np.uint64(src + j)]" in src
    check(EW, wl, EW.default_config(wl), arrays)


def test_row_gather_refuses_an_index_out_of_range():
    from codegen import compile_kernel
    table, ids = f32(4, 8), np.array([1, 4], np.int64)
    wl = make_wl([("Gather", ["i0", "i1"], {"axis": 0})], [((4, 8), "float32", True), ((2,), "int64", False)],
                 [table, np.array([1, 0], np.int64)])
    kernel = compile_kernel(EW, wl, EW.default_config(wl))
    with pytest.raises(IndexError, match="out of range"):
        kernel.bind([table, ids])([table, ids], np.empty(wl.output_shape, np.float32))


def test_short_rows_keep_the_index_loop():
    """A gather along the last axis (rows of one element) stays on the general index loop."""
    from codegen.source import render
    wl = make_wl([("Gather", ["i0", "i1"], {"axis": 1})], [((3, 6), "float32", False), ((2,), "int64", True)],
                 [f32(3, 6), np.array([5, 0], np.int64)])
    assert "row copies" not in render(EW.lower(wl, EW.default_config(wl)).module)


@pytest.mark.parametrize("op,ins,attrs", [
    ("Transpose", [((2, 3, 5, 12), "float32", False)], {"perm": [0, 2, 1, 3]}),
    ("Gather", [((9, 12), "float32", True), ((2, 3), "int64", False)], {"axis": 0}),
])
def test_row_loops_run_to_a_run_time_length(op, ins, attrs):
    """The last-axis row loop (and the row gather's copy) runs to the run-time `n`, the row's
    length: with a literal trip count LLVM unrolled the copy fully and it stayed scalar."""
    from codegen.source import render
    from schedules.launch import Scalar
    arrays = None
    if op == "Gather":
        arrays = [np.random.default_rng(0).standard_normal((9, 12)).astype(np.float32),
                  np.array([[0, 8, -1], [3, 3, 2]], np.int64)]
    wl = make_wl([(op, [f"i{k}" for k in range(len(ins))], attrs)], ins, arrays)
    t = get_template("elementwise")
    cfg = t.space(wl).validate({**t.default_config(wl).to_json(), "vector": "last"})
    low = t.lower(wl, cfg)
    assert "for j in range(0, n):" in render(low.module)
    assert [a.value for a in low.launch.steps[-1].args if isinstance(a, Scalar)][0] == 12
    check(t, wl, cfg, arrays)


@pytest.mark.parametrize("attrs,factors,whole_row", [
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel"}, (2, 2), True),
    ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, (3, 2), True),
    ({"mode": "cubic", "coordinate_transformation_mode": "half_pixel", "exclude_outside": 1}, (2, 2), False),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel"}, (0.6, 0.7), False),   # tables only
])
def test_interpolation_along_two_axes_goes_through_a_row_buffer(attrs, factors, whole_row):
    """Linear/cubic over H and W: H first, once per output row, into a row buffer, then W from it;
    where the W tables are the closed form with clamped indices (linear, cubic without
    exclude_outside), the buffer repeats its edge values and the whole row is one closed-form loop
    (no edge columns through the tables). All agree with the reference."""
    from codegen.source import render
    x = np.random.default_rng(4).standard_normal((1, 2, 7, 21)).astype(np.float32)
    arrays = [x, np.zeros(0, np.float32), np.array([1, 1, *factors], np.float32)]
    wl = make_wl([("Resize", ["i0", "i1", "i2"], attrs)],
                 [(x.shape, "float32", False), ((0,), "float32", True), ((4,), "float32", True)], arrays)
    cfg = EW.space(wl).validate({**EW.default_config(wl).to_json(), "vector": "last"})
    src = render(EW.lower(wl, cfg).module)
    assert "rt0 = np.empty(" in src
    assert ("for jx in range(0, 21)" in src) == whole_row
    check(EW, wl, cfg, arrays=arrays)


@pytest.mark.parametrize("n,ops,interleaved", [
    (1031, [("Tanh", ["i0"], {}), ("Mul", ["t0", "i1"], {}), ("Sigmoid", ["t1"], {})], True),
    (3, [("Exp", ["i0"], {}), ("Add", ["t0", "i1"], {})], True),          # fewer elements than parts
    (257, [("Add", ["i0", "i1"], {}), ("Mul", ["t0", "i1"], {})], False),  # no polynomial: one loop
])
def test_polynomial_chains_run_as_interleaved_parts(n, ops, interleaved):
    """A flat chain with a vectorizable polynomial runs its block as parts whose statements are
    interleaved (independent dependency chains side by side); the remainder and tiny sizes too."""
    from codegen.source import render
    wl = make_wl(ops, [((n,), "float32", False), ((), "float32", True)])
    cfg = EW.space(wl).validate({**EW.default_config(wl).to_json(), "vector": "flat", "unroll": 1})
    src = render(EW.lower(wl, cfg).module)
    assert ("i_p3 = i + 3 * hh" in src) == interleaved
    check(EW, wl, cfg)


@pytest.mark.parametrize("shapes, row", [
    (((2, 96, 4, 5), (2, 96, 1, 1)), 20),   # MobileNetV3's squeeze-excite scale: rows of the whole plane
    (((2, 3, 4, 5), (5,)), 5),               # a row vector: one row per (n, c, h)
    (((2, 3, 1, 5), (2, 1, 1, 5)), 5),       # size-1 axes go; the axes split where the operands differ
    (((4, 1), (1, 6)), 6),
    (((1, 1, 1), (1,)), None),               # one element: the flat loop
])
def test_pointwise_chains_merge_the_axes_their_operands_agree_on(shapes, row):
    """A broadcast chain's rows are the longest contiguous run that every operand reads whole or
    broadcasts whole (`_merged_axes`): the Mul below runs 192 rows of 20, not 768 rows of 5 with
    three index divisions each. Checked against NumPy with both vector knobs."""
    a, b = shapes
    wl = make_wl([("Mul", ["i0", "i1"], {}), ("Add", ["t0", "i0"], {}), ("Relu", ["t1"], {})],
                 [(a, "float32", False), (b, "float32", False)])
    for vector in ("flat", "last"):
        cfg = EW.space(wl).validate({**EW.default_config(wl).to_json(), "vector": vector})
        step = EW.lower(wl, cfg).launch.steps[-1]
        n = next(x.value for x in step.args if type(x).__name__ == "Scalar")
        if row is not None and vector == "last":
            assert n == row
        check(EW, wl, cfg)


@pytest.mark.parametrize("width", [8, 5])
def test_an_upsampled_map_in_a_channel_concat_is_a_closed_form_row(width):
    """A YOLO-style neck: Resize 2x (linear, half_pixel) of a narrow map, then Concat along the
    channels. Each output row is one input's, picked once a row (`_row_branches`); the upsampled
    rows go through the row buffer, whose padded edges let the whole row take the closed form even
    when the row is too short for a closed-form run between table-read edges (8 columns: the
    detector's 6x8 -> 12x16, 16.5 -> 10.9 us in the model). Both agree with the reference."""
    from codegen.source import render
    x, y = f32(2, 3, 6, width), f32(2, 2, 12, 2 * width)
    arrays = [x, np.zeros(0, np.float32), np.array([1, 1, 2, 2], np.float32), y]
    wl = make_wl([("Resize", ["i0", "i1", "i2"], {"mode": "linear"}), ("Concat", ["t0", "i3"], {"axis": 1})],
                 [(x.shape, "float32", False), ((0,), "float32", True), ((4,), "float32", True), (y.shape, "float32", False)],
                 arrays)
    cfg = EW.space(wl).validate({**EW.default_config(wl).to_json(), "vector": "last"})
    src = render(EW.lower(wl, cfg).module)
    assert "if o1 < 3:" in src and "rt0 = np.empty(" in src
    assert (f"for jx in range(0, {width})" in src) == (width >= 8)   # MIN_CLOSED columns at least
    check(EW, wl, cfg, arrays=arrays)


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_slices_and_concats_merge_axes_and_match_numpy(data):
    """A copy of Slices and Concats runs over merged axes (`_merged_copy`): random 4-d splits and
    re-joins (a Slice cutting one axis, at step 1 or 2, or none; a Concat of it with a fresh input
    along any axis), checked against NumPy with both vector knobs."""
    shape = data.draw(st.lists(st.sampled_from([1, 2, 3, 6]), min_size=4, max_size=4))
    cut = data.draw(st.integers(0, 3))
    step = data.draw(st.sampled_from([1, 1, 2]))
    start = data.draw(st.integers(0, shape[cut] - 1))
    axis = data.draw(st.integers(0, 3))
    x = f32(*shape)
    sliced = x[tuple(slice(start, None, step) if a == cut else slice(None) for a in range(4))]
    other = list(sliced.shape)
    other[axis] = data.draw(st.integers(1, 3))
    y = f32(*other)
    arrays = [x, np.array([start]), np.array([shape[cut]]), np.array([cut]), np.array([step]), y]
    wl = make_wl([("Slice", ["i0", "i1", "i2", "i3", "i4"], {}), ("Concat", ["t0", "i5"], {"axis": axis})],
                 [(x.shape, "float32", False), ((1,), "int64", True), ((1,), "int64", True), ((1,), "int64", True),
                  ((1,), "int64", True), (y.shape, "float32", False)], arrays)
    for vector in ("flat", "last"):
        check(EW, wl, EW.space(wl).validate({**EW.default_config(wl).to_json(), "vector": vector}), arrays=arrays)


def test_a_csp_split_and_rejoin_copies_whole_runs():
    """The detector's CSP block: channels 8..16 of (2, 16, 12, 16) joined with two (2, 8, 12, 16)
    maps along the channels. Merged, each image is one row of 4608 copied as three runs of 1536
    (was 576 rows of 16, each element choosing its input: 10.7 -> 0.9 us in the model)."""
    from codegen.source import render
    x, a, b = f32(2, 16, 12, 16), f32(2, 8, 12, 16), f32(2, 8, 12, 16)
    arrays = [x, np.array([8]), np.array([16]), np.array([1]), a, b]
    wl = make_wl([("Slice", ["i0", "i1", "i2", "i3"], {}), ("Concat", ["t0", "i4", "i5"], {"axis": 1})],
                 [(x.shape, "float32", False), ((1,), "int64", True), ((1,), "int64", True), ((1,), "int64", True),
                  (a.shape, "float32", False), (b.shape, "float32", False)], arrays)
    cfg = EW.space(wl).validate({**EW.default_config(wl).to_json(), "vector": "last"})
    low = EW.lower(wl, cfg)
    src = render(low.module)
    assert "base = row * 4608" in src and "for j in range(1536, 3072):" in src
    assert [a.index for a in low.launch.steps[-1].args if type(a).__name__ == "In"] == [0, 4, 5]
    check(EW, wl, cfg, arrays=arrays)


def test_tanh_gelu_keeps_its_relative_precision_in_the_negative_tail():
    """Gelu(approximate="tanh") as x * sigmoid(2u) (`_gelu_build`): 0.5 x (1 + tanh(u)) lost the
    tail to cancellation (1 + tanh(u) near -1: 35 % relative error where the value is ~1e-6) and
    took two rational polynomials; over [-20, 20] the relative error now stays under 1e-5."""
    n = 4096
    x = np.linspace(-20, 20, n).astype(np.float32)
    wl = make_wl([("Gelu", ["i0"], {"approximate": "tanh"})], [((n,), "float32", False)], [x])
    from codegen import compile_kernel
    out = np.empty(n, np.float32)
    for fn, args in compile_kernel(EW, wl, EW.default_config(wl)).bind([x]).plan([x], out).calls:
        fn(*args)
    x64 = x.astype(np.float64)
    ref = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    big = np.abs(ref) > 1e-6
    assert np.max(np.abs(out[big] - ref[big]) / np.abs(ref[big])) < 1e-5
    assert np.max(np.abs(out - ref)) < 1e-5 and np.isfinite(out).all()

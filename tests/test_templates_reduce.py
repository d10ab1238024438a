"""reduce template: softmax / logsoftmax / layernorm (with BERT's Add + Add prologue) and
Reduce* along contiguous axes agree with the NumPy reference on odd shapes and random configs."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedules import get_template
from tests.template_cases import check, make_wl, precompile

RED = get_template("reduce")


def softmax(shape, op="Softmax"):
    return make_wl([(op, ["i0"], {"axis": -1})], [(shape, "float32", False)])


def layernorm(b, s, h):
    return make_wl([("Add", ["i0", "i1"], {}), ("Add", ["t0", "i2"], {}),
                    ("LayerNormalization", ["t1", "i3", "i4"], {"axis": -1, "epsilon": 1e-12})],
                   [((b, s, h), "float32", False), ((s, h), "float32", True), ((h,), "float32", True),
                    ((h,), "float32", True), ((h,), "float32", True)])


def cfg(wl, lanes, cache, **runtime):
    """`lanes` and `cache` where the space has them (one-pass LayerNorm: LLVM's lanes, and a
    prologue always buffered)."""
    space = RED.space(wl)
    code = {"lanes": lanes, "cache": cache} if any(k.name == "lanes" for k in space.knobs) else {}
    return space.validate({**RED.default_config(wl).to_json(), **code, **runtime})


CODE = [(8, True), (1, False)]


@pytest.fixture(scope="module")
def compiled():
    pairs = [(w, cfg(w, *c)) for w in (softmax((3, 17)), layernorm(2, 3, 21)) for c in CODE]
    precompile("reduce", pairs)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), kind=st.sampled_from(["softmax", "layernorm"]), b=st.sampled_from([1, 2]),
       s=st.sampled_from([1, 3, 5]), h=st.sampled_from([1, 7, 33, 64]))
def test_random_shapes_and_configs_match_numpy(compiled, data, kind, b, s, h):
    wl = softmax((b, s, h)) if kind == "softmax" else layernorm(b, s, h)
    assert RED.matches(wl)
    runtime = {k.name: data.draw(st.sampled_from(k.options)) for k in RED.space(wl).knobs if not k.code_shape}
    check(RED, wl, cfg(wl, *data.draw(st.sampled_from(CODE)), **runtime))


@pytest.mark.parametrize("ops,shape", [
    ([("LogSoftmax", ["i0"], {"axis": -1})], (5, 19)),
    ([("ReduceMean", ["i0"], {"axes": [1], "keepdims": 1})], (2, 5, 7)),         # middle axis
    ([("ReduceMax", ["i0"], {"axes": [1, 2], "keepdims": 0})], (3, 4, 5)),      # contiguous last axes
    ([("GlobalAveragePool", ["i0"], {})], (1, 6, 3, 3)),
])
def test_other_reductions(ops, shape):
    wl = make_wl(ops, [(shape, "float32", False)])
    assert RED.matches(wl)
    check(RED, wl, RED.default_config(wl))


def test_axes_the_family_cannot_take_fall_back():
    """Softmax over a leading axis (opset 13) and axes given by a non-constant input stay on the
    reference path."""
    assert not RED.matches(make_wl([("Softmax", ["i0"], {"axis": 0})], [((3, 4), "float32", False)]))
    wl = make_wl([("ReduceSum", ["i0", "i1"], {"keepdims": 1})], [((2, 3, 4), "float32", False), ((1,), "int64", False)],
                 [np.ones((2, 3, 4), np.float32), np.array([1])])
    assert "value" not in wl.inputs[1] and not RED.matches(wl)


def _axes_input(op, shape, axes, keepdims, positive=False):
    """A Reduce* with its axes as a constant input (opset 18), as make_workload stores it."""
    x = np.random.default_rng(1).uniform(0.1 if positive else -1, 1, shape).astype(np.float32)
    return make_wl([(op, ["i0", "i1"], {"keepdims": keepdims})], [(shape, "float32", False), ((len(axes),), "int64", True)],
                   [x, np.array(axes, np.int64)]), [x, np.array(axes, np.int64)]


@pytest.mark.parametrize("op,shape,axes,keepdims", [
    ("ReduceMean", (1, 7, 12), [1], 0),          # ViT's mean over the tokens
    ("ReduceSum", (3, 5, 4), [0], 1),            # a leading axis
    ("ReduceMax", (2, 3, 4, 5), [0, 2], 0),      # two runs, the last dims kept
    ("ReduceMin", (2, 3, 4, 5), [1, 3], 1),      # two runs, the last axis reduced
    ("ReduceProd", (2, 3, 4), [0, 2], 0),
    ("ReduceL2", (3, 4, 6), [0, 1], 0),
    ("ReduceL1", (4, 3, 5), [1], 1),
    ("ReduceSumSquare", (2, 9, 3), [-2], 0),
    ("ReduceLogSum", (2, 3, 4), [0, 2], 1),
    ("ReduceMean", (2, 1, 3), [1], 1),           # only a size-1 axis: a copy
    ("ReduceLogSumExp", (3, 5, 37), [2], 0),
    ("ReduceLogSumExp", (2, 7, 6), [1], 1),
    ("ReduceLogSumExp", (2, 3, 4, 5), [1, 3], 0),
])
def test_any_axes_match_numpy(op, shape, axes, keepdims):
    wl, arrays = _axes_input(op, shape, axes, keepdims, positive=op == "ReduceLogSum")
    assert RED.matches(wl)
    check(RED, wl, RED.default_config(wl), arrays)


@pytest.mark.parametrize("unroll", [1, 2, 8])
def test_middle_axis_unrolls_with_a_tail(unroll):
    """11 reduced rows: `unroll` rows per pass over the output row, then the remainder."""
    wl, arrays = _axes_input("ReduceMean", (2, 11, 9), [1], 0)
    cfg = RED.space(wl).validate({**RED.default_config(wl).to_json(), "unroll": unroll})
    check(RED, wl, cfg, arrays)


def test_middle_axis_reads_rows_contiguously():
    """The inner loop runs over the contiguous kept axis with unsigned indices (what LLVM
    vectorizes), output rows accumulating input rows."""
    from codegen.source import render
    wl, _ = _axes_input("ReduceMean", (1, 197, 192), [1], 0)
    src = render(RED.lower(wl, RED.default_config(wl)).module)
    assert "x0[np.uint64(src0 + i)]" in src and "x0[np.uint64(src3 + i)]" in src


def test_classic_forms_only_for_cuda():
    """`_anchor` (what the CUDA family lowers) refuses the forms only the CPU family covers."""
    from schedules.templates.reduce import _anchor
    assert _anchor(_axes_input("ReduceMean", (1, 7, 12), [1], 0)[0]) == (0, 1, 7, 12)
    assert _anchor(_axes_input("ReduceMax", (2, 3, 4), [0, 2], 0)[0]) is None
    assert _anchor(_axes_input("ReduceL2", (2, 3, 4), [2], 0)[0]) is None


def test_layernorm_over_a_size_one_axis():
    """Found by the property test in CI: normalizing over one element (h = 1); each value is
    its own mean, so the output is the bias exactly (a prologue recomputed under reassoc
    rounded apart from its first pass, times 1 / sqrt(eps) = 1e6, when it was not buffered)."""
    wl = layernorm(1, 3, 1)
    check(RED, wl, RED.default_config(wl))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_row_exp_is_a_polynomial_with_unsigned_indices(op):
    """No libm exp per element (one log per row for LogSoftmax) and no signed row indices: both
    kept LLVM from vectorizing the row loops."""
    from codegen.source import render
    wl = softmax((3, 40), op)
    src = render(RED.lower(wl, cfg(wl, 8, True)).module)
    assert "math.exp" not in src and src.count("math.log") == (op == "LogSoftmax")
    assert "x0[np.uint64(base + c" in src and "x0[base" not in src


def test_default_lanes_are_two_vectors_and_at_most_the_row():
    """The default splits long rows' reductions over two vectors of partial results (one
    vector's add latency bounded LayerNorm), short rows over no more lanes than they have."""
    from schedules.microkernel import vector_shape
    from schedules.templates.reduce import default_lanes
    v = vector_shape()[0]
    lane_form = make_wl([("Sigmoid", ["i0"], {}), ("Softmax", ["t0"], {"axis": -1})], [((4, 1024), "float32", False)])
    assert RED.default_config(lane_form)["lanes"] == default_lanes(1024) == 2 * v
    assert all(k.name != "lanes" for k in RED.space(softmax((4, 1024))).knobs)   # one pass: LLVM's lanes
    assert default_lanes(5) == 4 and default_lanes(1) == 1
    assert default_lanes(1024, {"vector_bits": 512}) == 32


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_long_rows_with_the_default_lanes_and_a_tail(op):
    """Rows longer than the lanes with a remainder (100 = 6 x 16 + 4), wide inputs: the
    exp2 polynomial's argument reduction and the lane tails."""
    wl = softmax((3, 100), op)
    check(RED, wl, RED.default_config(wl))


@pytest.mark.parametrize("shape,axes", [((3, 9), [1]), ((9, 3), [0]), ((3, 2, 4), [0, 2])])
def test_logsumexp_of_infinities_matches_numpy(shape, axes):
    """A reduced set that is all -inf gives -inf, one holding +inf gives +inf (the max is
    taken as 0 there, as the reference does): the kernels keep inf semantics (no ninf)."""
    x = np.random.default_rng(2).uniform(-3, 3, shape).astype(np.float32)
    first = tuple(slice(None) if a in axes else 0 for a in range(len(shape)))
    x[first] = -np.inf
    last = tuple(slice(None) if a in axes else -1 for a in range(len(shape)))
    x[last] = 1.0
    x[tuple(0 if a in axes else -1 for a in range(len(shape)))] = np.inf
    wl = make_wl([("ReduceLogSumExp", ["i0"], {"axes": axes, "keepdims": 0})], [(shape, "float32", False)], [x])
    assert RED.matches(wl)
    check(RED, wl, RED.default_config(wl), [x])


@pytest.mark.parametrize("op", ["ReduceSumSquare", "ReduceMax", "ReduceLogSumExp"])
@pytest.mark.parametrize("cache", [True, False])
def test_reductions_after_a_prologue(op, cache):
    """An Add fused before a last-axis reduction of the new kinds (and Max, which now shares
    their pass), with and without the row buffer."""
    wl = make_wl([("Add", ["i0", "i1"], {}), (op, ["t0"], {"axes": [2], "keepdims": 1})],
                 [((2, 3, 21), "float32", False), ((21,), "float32", True)])
    assert RED.matches(wl)
    check(RED, wl, RED.space(wl).validate({**RED.default_config(wl).to_json(), "cache": cache}))


def test_one_pass_layernorm_keeps_accuracy_away_from_zero():
    """One-pass LayerNorm sums d = v - v[0] and d^2: rows with a large mean (100 +- 1, where
    E[v^2] - E[v]^2 in float32 is off by ~1e-3 relative) and a row whose first value is the
    outlier (the worst case of the shift) match the reference."""
    rng = np.random.default_rng(3)
    x = (100 + rng.standard_normal((4, 300))).astype(np.float32)
    x[1, 0] = 130.0
    x[2] = rng.standard_normal(300).astype(np.float32) * 1e-3
    x[2, 0] = 5.0
    g, b = np.ones(300, np.float32), np.zeros(300, np.float32)
    wl = make_wl([("LayerNormalization", ["i0", "i1", "i2"], {"axis": -1})],
                 [((4, 300), "float32", False), ((300,), "float32", True), ((300,), "float32", True)], [x, g, b])
    assert "lanes" not in RED.default_config(wl).to_json()
    check(RED, wl, RED.default_config(wl), [x, g, b])


@pytest.mark.parametrize("k", [2.5, 2.9, 3.2])
def test_one_pass_layernorm_near_and_past_its_second_pass(k):
    """float32 one-pass sums cancel (1 + 3 E[d]^2 / var)-fold, d = v - v[0]: rows of 1024 at mean
    100 whose first value is k std away (E[d]^2 / var = k^2), under (2.5) and just past (2.9,
    3.2) the E[d]^2 > 8 var that reads the row again, with BERT's prologue, meet
    the accuracy rule: the one-pass bound holds up to where it is used (a row whose shift is
    its outlier: `test_one_pass_layernorm_keeps_accuracy_away_from_zero`)."""
    rng = np.random.default_rng(5)
    x = (100 + rng.standard_normal((1, 6, 1024))).astype(np.float32)
    x[0, :, 0] = x[0, :, 1:].mean(-1) + k * x[0, :, 1:].std(-1) * np.array([1, -1, 1, -1, 1, -1])
    zeros, g, b = np.zeros((6, 1024), np.float32), np.ones(1024, np.float32), np.zeros(1024, np.float32)
    wl = make_wl([("Add", ["i0", "i1"], {}), ("Add", ["t0", "i2"], {}),
                  ("LayerNormalization", ["t1", "i3", "i4"], {"axis": -1})],
                 [((1, 6, 1024), "float32", False), ((6, 1024), "float32", False), ((1024,), "float32", True),
                  ((1024,), "float32", True), ((1024,), "float32", True)], [x, zeros, b, g, b])
    check(RED, wl, RED.default_config(wl), [x, zeros, b, g, b])


@pytest.mark.parametrize("op,center", [("Softmax", 0.0), ("Softmax", -3e4), ("Softmax", 3e4), ("LogSoftmax", 0.0),
                                       ("LogSoftmax", -300.0), ("LogSoftmax", 300.0)])
def test_one_pass_softmax_max_keys_and_shift(op, center):
    """The row max as an integer max of order-preserving keys (negative rows, -0 and +0, -inf in
    a row) and Softmax's exponent shifted by m c' (c' one ulp off log2 e): rows far from 0 on
    either side match the reference (LogSoftmax's v - (m + ln s) rounds by ulp(m): 300, not 3e4)."""
    rng = np.random.default_rng(7)
    x = (center + 4 * rng.standard_normal((5, 67))).astype(np.float32)
    x[1] = -np.abs(x[1]) - 1
    x[2, :3] = [-0.0, 0.0, -0.0]
    x[2, 3:] = -rng.uniform(1, 5, 64).astype(np.float32)
    x[3, 5] = -np.inf
    wl = make_wl([(op, ["i0"], {"axis": -1})], [((5, 67), "float32", False)], [x])
    check(RED, wl, RED.default_config(wl), [x])


@pytest.mark.parametrize("op,cache", [("Softmax", True), ("Softmax", False), ("LogSoftmax", True),
                                      ("LogSoftmax", False), ("LayerNormalization", None)])
def test_one_pass_after_an_arithmetic_prologue(op, cache):
    """BERT's masked Add before Softmax and Add + Add before LayerNorm take the one-pass form
    (compiled with reassoc), Softmax with and without the row buffer (LayerNorm always has it)."""
    from codegen.source import render
    ins = [((2, 3, 37), "float32", False), ((3, 37), "float32", False), ((37,), "float32", True)]
    ops = [("Add", ["i0", "i1"], {}), ("Mul", ["t0", "i2"], {})]
    if op == "LayerNormalization":
        ins += [((37,), "float32", True), ((37,), "float32", True)]
        ops.append((op, ["t1", "i3", "i4"], {"axis": -1}))
    else:
        ops.append((op, ["t1"], {"axis": -1}))
    wl = make_wl(ops, ins)
    c = RED.space(wl).validate({**RED.default_config(wl).to_json(), **({} if cache is None else {"cache": cache})})
    assert "'reassoc'" in render(RED.lower(wl, c).module)
    check(RED, wl, c)


def test_polynomial_prologue_keeps_the_lane_form():
    """reassoc would fold the rounding constant of Sigmoid's e^x (exp_build): a prologue with
    such an op keeps the lane-split passes and the default fastmath flags."""
    from codegen.source import render
    wl = make_wl([("Sigmoid", ["i0"], {}), ("LayerNormalization", ["t0", "i1", "i2"], {"axis": -1})],
                 [((3, 40), "float32", False), ((40,), "float32", True), ((40,), "float32", True)])
    c = RED.default_config(wl)
    assert "lanes" in c.to_json() and "reassoc" not in render(RED.lower(wl, c).module)
    check(RED, wl, c)


def test_an_input_of_as_many_elements_is_not_broadcast_per_call():
    """BERT's position embeddings (seq, hidden) added to (1, seq, hidden): read in place, not
    broadcast at launch (a read-only view, copied on every call: the step's per-call work)."""
    from schedules.launch import In
    wl = layernorm(1, 3, 21)
    args = RED.lower(wl, RED.default_config(wl)).launch.steps[0].args
    assert [a.broadcast for a in args if isinstance(a, In) and a.index == 1] == [None]


def at(a: np.ndarray, off: int) -> np.ndarray:
    """A copy of `a` starting `off` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 128, np.uint8)
    k = (-raw.ctypes.data) % 64 + off
    v = raw[k:k + a.nbytes].view(a.dtype).reshape(a.shape)
    v[...] = a
    return v


@pytest.mark.parametrize("off", [0, 16])
@pytest.mark.parametrize("RB", [1, 4, 16])
def test_one_pass_layernorm_pairs_and_an_odd_row(RB, off):
    """One-pass LayerNorm normalizes rows in pairs (the second row's loads, buffer and periodic
    inputs moved to base2, buf2, pb*b) where its rows start on cache lines, then a block's odd
    row alone; otherwise every row alone: 7 rows in blocks of 1, 4 and 16, with BERT's (s, h) and
    (h,) prologue inputs, their arrays and the output on a 64-byte boundary and 16 bytes past one."""
    from codegen import compile_kernel
    from codegen.source import render
    from ir import accuracy
    wl = layernorm(1, 7, 32)
    c = RED.space(wl).validate({**RED.default_config(wl).to_json(), "RB": RB})
    src = render(RED.lower(wl, c).module)
    assert "base2 + c1" in src and "buf2[" in src and "ctypes.data" in src
    arrays = [at(a, off) for a in wl.random_inputs(0)]
    out = at(np.zeros(wl.output_shape, np.float32), off)
    compile_kernel(RED, wl, c).bind(arrays)(arrays, out)
    assert accuracy.compare(out, accuracy.reference(wl, arrays), accuracy.workload_reduction(wl)).ok

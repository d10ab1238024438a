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

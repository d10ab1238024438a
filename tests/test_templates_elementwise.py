"""elementwise template: broadcast chains and injective copies (Transpose, Reshape, Slice,
Gather, Concat, Cast) agree with the NumPy reference; int64-only subgraphs stay on the reference."""
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


def test_int64_shape_subgraphs_stay_on_the_reference():
    wl = make_wl([("Unsqueeze", ["i0", "i1"], {})], [((2, 3), "int64", False), ((2,), "int64", True)],
                 [np.ones((2, 3), np.int64), np.array([1, 2])])
    assert not EW.matches(wl)

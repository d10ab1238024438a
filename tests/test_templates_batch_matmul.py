"""batch_matmul template: batched MatMul of two activations (broadcast batch dims, odd M/N/K,
fused epilogue with a broadcast mask) agrees with the NumPy reference on random shapes/configs."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedules import get_template
from schedules.microkernel import tile_codes
from tests.template_cases import check, make_wl, precompile

BMM = get_template("batch_matmul")


def attention(b, h, m, k, n):
    """scores = (q @ kT) / scale + mask[b, 1, 1, n], as in BERT."""
    return make_wl([("MatMul", ["i0", "i1"], {}), ("Div", ["t0", "i2"], {}), ("Add", ["t1", "i3"], {})],
                   [((b, h, m, k), "float32", False), ((b, h, k, n), "float32", False), ((), "float32", True),
                    ((b, 1, 1, n), "float32", False)])


VEC = tile_codes()[1]   # this machine's vector IR code ("vec8" on AVX2, "vec16" on AVX-512)
# (regtile, tile_code); the shapes below cut them by M and N: the edge tiles (clamped rows, padded B panel)
TILES = [("4x16", "slp"), ("2x16", "slp"), ("4x16", VEC), ("2x16", VEC)]


@pytest.fixture(scope="module")
def compiled():
    wl = attention(1, 2, 5, 3, 7)
    precompile("batch_matmul", [(wl, BMM.space(wl).validate({**BMM.default_config(wl).to_json(), "regtile": t,
                                                              "tile_code": c})) for t, c in TILES])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), b=st.sampled_from([1, 2]), h=st.sampled_from([1, 3]), m=st.sampled_from([1, 5, 16]),
       k=st.sampled_from([1, 8, 13]), n=st.sampled_from([1, 16, 37]))
def test_random_shapes_and_configs_match_numpy(compiled, data, b, h, m, k, n):
    wl = attention(b, h, m, k, n)
    assert BMM.matches(wl)
    space = BMM.space(wl)
    values = {kn.name: data.draw(st.sampled_from(kn.options)) for kn in space.knobs if not kn.code_shape}
    tile, code = data.draw(st.sampled_from(TILES))
    check(BMM, wl, space.validate({**values, "regtile": tile, "tile_code": code}))


def test_broadcast_batch_without_epilogue():
    wl = make_wl([("MatMul", ["i0", "i1"], {})], [((3, 1, 5, 7), "float32", False), ((4, 7, 33), "float32", False)])
    assert BMM.matches(wl)
    check(BMM, wl, BMM.default_config(wl))


def test_dense_keeps_constant_weights():
    from schedules import find_template
    wl = make_wl([("MatMul", ["i0", "i1"], {})], [((2, 5, 8), "float32", False), ((8, 4), "float32", True)])
    assert find_template(wl).name == "dense"


@pytest.mark.parametrize("code", ["slp", VEC])
def test_default_tile_cut_by_m_and_n(code):
    """The default tile (8x32 on AVX-512, 4x16 on AVX2) on a ViT-like odd sequence: rows past M
    (clamped A rows) and columns past N (the padded B panel) must neither be stored nor change
    what is stored; the last B matrix's edge panel lies at the end of its buffer."""
    wl = attention(1, 2, 37, 5, 37)
    cfg = BMM.space(wl).validate({**BMM.default_config(wl).to_json(), "tile_code": code, "parallel": False})
    check(BMM, wl, cfg)


@pytest.mark.parametrize("mask_shape, table", [
    ((1, 1, 9, 13), True),    # GPT-2's causal mask [1, 1, S, S] over [b, h] batches: read through a batch table
    ((9, 13), True),          # fewer dims than the output
    ((2, 1, 9, 13), True),    # per-example masks over heads
    ((2, 3, 9, 13), False),   # the output's own shape: read as it is
    ((1, 1, 1, 13), False),   # one row per batch: a row extra
    ((2, 1, 1, 13), True),    # an sdpa export's padding mask [B, 1, 1, S]: one row per example, every row reads it
    ((2, 3, 1, 13), True),    # one row per batch
])
@pytest.mark.parametrize("tile, code", [("4x16", "slp"), ("4x16", VEC)])
def test_mask_broadcast_over_batches_is_read_through_a_table(mask_shape, table, tile, code):
    """scores = (q @ kT) + mask, the mask's matrices broadcast over the batch dims: each output batch
    reads its mask matrix through a table (`ie_<param>`); the launch passes the mask as it is (no
    broadcast copy, so a model's program keeps the step's launch fixed) and the result is NumPy's."""
    wl = make_wl([("MatMul", ["i0", "i1"], {}), ("Add", ["t0", "i2"], {})],
                 [((2, 3, 9, 5), "float32", False), ((2, 3, 5, 13), "float32", False), (mask_shape, "float32", False)])
    cfg = BMM.space(wl).validate({**BMM.default_config(wl).to_json(), "regtile": tile, "tile_code": code})
    low = BMM.lower(wl, cfg)
    [call] = low.launch.steps
    mask_in = next(a for a in call.args if getattr(a, "index", None) == 2)
    assert mask_in.broadcast is None
    assert any(name.startswith("ie_") for name in low.launch.tables) == table
    check(BMM, wl, cfg)

"""conv2d template: random shapes (odd sizes, batch 1, groups incl. depthwise) and random
configs agree with the NumPy reference. Sizes are run-time arguments of the kernel, so a few
precompiled code shapes serve every drawn shape."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedules import get_template
from tests.template_cases import check, conv_wl, precompile

CONV = get_template("conv2d")
# (geometry kwargs, epilogue, code shapes the property test draws from)
GEOMETRIES = [
    (dict(k=3, s=2, p=1), ("res", "relu"), [("direct", "4x16", "oc_px")]),
    (dict(k=3, s=1, p=2, d=2), ("chan", "relu"), [("im2col", "4x16", "px_oc")]),
]


def config(wl, algo, regtile, order, **runtime):
    base = CONV.default_config(wl).to_json()
    return CONV.space(wl).validate({**base, "algo": algo, "regtile": regtile, "order": order, **runtime})


@pytest.fixture(scope="module")
def compiled():
    pairs = []
    for geo, epi, shapes in GEOMETRIES:
        wl = conv_wl(1, 4, 9, 11, 6, epi=epi, **geo)
        pairs += [(wl, config(wl, *s)) for s in shapes]
    precompile("conv2d", pairs)


def test_space_knobs_and_code_shapes():
    wl = conv_wl(1, 64, 56, 56, 64, epi=("relu",))
    space = CONV.space(wl)
    assert {k.name for k in space.knobs if k.code_shape} == {"algo", "regtile", "order"}
    assert len({space.code_key(c) for c in space}) <= 16
    assert CONV.matches(wl) and CONV.matches(conv_wl(1, 8, 7, 7, 8, g=8, bias=False))


def test_dynamic_batch_does_not_shape_the_space():
    a, b = conv_wl(1, 8, 9, 9, 8, epi=("res",)), conv_wl(3, 8, 9, 9, 8, epi=("res",))
    assert [k.options for k in CONV.space(a).knobs] == [k.options for k in CONV.space(b).knobs]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), geo=st.sampled_from(range(len(GEOMETRIES))), n=st.sampled_from([1, 2]),
       cg=st.sampled_from([1, 3, 5]), groups=st.sampled_from(["1", "2", "depthwise"]),
       ocg=st.sampled_from([1, 7, 17, 33]), h=st.sampled_from([1, 5, 8]), w=st.sampled_from([1, 6, 13]))
def test_random_shapes_and_configs_match_numpy(compiled, data, geo, n, cg, groups, ocg, h, w):
    kwargs, epi, shapes = GEOMETRIES[geo]
    g = {"1": 1, "2": 2, "depthwise": 4}[groups]
    if groups == "depthwise":
        cg, ocg = 1, 1
    h, w = max(h, 3 if kwargs.get("p", 0) == 0 else 1), w
    wl = conv_wl(n, cg * g, h, w, ocg * g, g=g, epi=epi, bias=data.draw(st.booleans()), **kwargs)
    assert CONV.matches(wl)
    space = CONV.space(wl)
    runtime = {k.name: data.draw(st.sampled_from(k.options)) for k in space.knobs if not k.code_shape}
    check(CONV, wl, config(wl, *data.draw(st.sampled_from(shapes)), **runtime))


@pytest.mark.slow
def test_every_code_shape_on_one_odd_shape():
    wl = conv_wl(1, 5, 9, 11, 37, k=3, s=2, p=1, epi=("res", "relu"))
    space = CONV.space(wl)
    reps = {}
    for cfg in space:
        reps.setdefault(space.code_key(cfg), cfg)
    precompile("conv2d", [(wl, c) for c in reps.values()])
    for cfg in reps.values():
        check(CONV, wl, cfg)

"""conv2d template: random shapes (odd sizes, batch 1, groups incl. depthwise) and random
configs agree with the NumPy reference. Sizes are run-time arguments of the kernel, so a few
precompiled code shapes serve every drawn shape."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codegen import compile_kernel
from codegen.source import render
from schedules import get_template
from schedules.microkernel import tile_codes
from schedules.space import ConfigError
from schedules.epilogue import parse_epilogue
from schedules.templates.conv2d import blocked_tile
from schedules.templates.conv2d_blocked import pixel_run, residual_split
from tests.template_cases import check, conv_wl, make_wl, precompile

CONV = get_template("conv2d")
# (geometry kwargs, epilogue, code shapes of ordinary convs, code shapes of depthwise ones)
GEOMETRIES = [
    (dict(k=3, s=2, p=1), ("res", "relu"),
     [dict(algo="direct", vec="oc", regtile="4x16"), dict(algo="direct", vec="px", regtile="4x16"),
      dict(algo="blocked", vec="oc", regtile="6x16")],
     [dict(algo="depthwise", regtile="4x8", PB=1), dict(algo="dw_blocked", regtile="4x8")]),
    (dict(k=3, s=1, p=2, d=2), ("chan", "relu"),
     [dict(algo="im2col", vec="oc", regtile="4x16", order="px_oc"), dict(algo="im2col", vec="px", regtile="4x16"),
      dict(algo="blocked", vec="oc", regtile="4x24", order="px_oc")],
     [dict(algo="depthwise", regtile="2x16", PB=1), dict(algo="dw_blocked", regtile="8x8")]),
    (dict(k=1, s=2, p=0), ("relu",), [dict(algo="im2col", vec="px", regtile="4x16"), dict(algo="blocked", vec="oc", regtile="4x16")],
     [dict(algo="depthwise", regtile="4x8", PB=1)]),
]


def config(wl, **code):
    """The default config with `code` over it; another algorithm than blocked gets the knobs that
    only the blocked tile has at their plain values (a winograd default keeps them as it needs them)."""
    base = CONV.default_config(wl).to_json()
    algo = code.get("algo", base["algo"])
    if algo != "blocked" and not (algo == base["algo"] == "winograd") and "KC" in base:
        base.update(tile_code="slp", KC=0)
    if code.get("algo") == "dw_blocked":   # its tile is SLP code; a stride-1 depthwise default is vector IR
        base["tile_code"] = "slp"
    return CONV.space(wl).validate({**base, **code})


def depthwise_wl(n, c, h, w, mult=1, **kw):
    return conv_wl(n, c, h, w, c * mult, g=c, **kw)


@pytest.fixture(scope="module")
def compiled():
    pairs = []
    for geo, epi, shapes, dw_shapes in GEOMETRIES:
        wl, dw = conv_wl(1, 4, 9, 11, 6, epi=epi, **geo), depthwise_wl(1, 4, 9, 11, epi=epi, **geo)
        pairs += [(wl, config(wl, **s)) for s in shapes] + [(dw, config(dw, **s)) for s in dw_shapes]
    precompile("conv2d", pairs)


def test_space_knobs_and_code_shapes():
    wl = conv_wl(1, 64, 56, 56, 64, epi=("relu",))
    space = CONV.space(wl)
    assert {k.name for k in space.knobs if k.code_shape} == {"algo", "vec", "regtile", "order", "tile_code"}
    # compiles a tuner may need per geometry (AVX-512: + 3 wide vector-IR blocked tiles x 2 orders, < 1 s each;
    # the direct vec='px' and the im2col vec='oc' kernels' vector-IR tiles: + 9 tiles x 2 orders each;
    # 3x3 stride 1: winograd's vector-IR GEMM tiles x 2 orders)
    assert len({space.code_key(c) for c in space}) <= 114
    with pytest.raises(ConfigError, match="tile_code='slp'"):
        space.validate({**CONV.default_config(wl).to_json(), "algo": "direct", "vec": "oc",
                        "tile_code": space.knobs[-2].options[1]})
    with pytest.raises(ConfigError, match="vec='oc'"):
        space.validate({**CONV.default_config(wl).to_json(), "algo": "blocked", "vec": "px"})
    recorded = {**{k: v for k, v in CONV.default_config(wl).to_json().items() if k != "tile_code"}, "regtile": "6x16",
                "algo": "blocked", "vec": "oc"}
    assert space.validate(recorded)["tile_code"] == "slp"   # records made before the knob: as they ran
    dw = depthwise_wl(1, 32, 56, 56)
    assert {k.name for k in CONV.space(dw).knobs if k.code_shape} == {"algo", "regtile", "tile_code"}
    assert CONV.matches(wl) and CONV.matches(conv_wl(1, 8, 7, 7, 8, g=8, bias=False))


@pytest.mark.parametrize("wl", [
    conv_wl(1, 64, 56, 56, 64), conv_wl(1, 64, 56, 56, 128, k=1, s=2, p=0), conv_wl(1, 512, 7, 7, 512),
    conv_wl(1, 960, 1, 1, 240, k=1, p=0), conv_wl(1, 3, 224, 224, 64, k=7, s=2, p=3),
    depthwise_wl(1, 32, 112, 112), depthwise_wl(1, 960, 7, 7), depthwise_wl(1, 96, 112, 112, s=2),
    depthwise_wl(1, 8, 3, 3, mult=2)], ids=lambda wl: "x".join(map(str, wl.inputs[1]["shape"])))
def test_default_config_is_in_the_space_and_fits_the_shape(wl):
    cfg = CONV.default_config(wl)
    assert CONV.space(wl).validate(cfg) == cfg
    dw = wl.inputs[1]["shape"][1] == 1 and wl.nodes()[0].attrs.get("group", 1) > 1
    assert (cfg["algo"] in ("depthwise", "dw_blocked", "dw_plane")) == dw, "depthwise convs get their own schedules"
    # a handoff to a second thread costs more than a tiny conv runs
    from schedules.templates.conv2d import THREAD_WAKE_FLOPS
    assert cfg["parallel"] == (wl.flops() >= THREAD_WAKE_FLOPS)
    assert cfg["parallel"] == (wl.flops() >= 2e5)
    oh, ow = wl.output_shape[2:]
    if not dw and oh * ow < 16:
        assert cfg["vec"] == "oc", "a map of a few pixels cannot fill pixel vectors"
    if dw and cfg["algo"] == "depthwise":
        assert int(cfg["regtile"].split("x")[1]) <= max(8, 2 * ow), "the tile's pixels fit a row"


def test_dynamic_batch_does_not_shape_the_space():
    a, b = conv_wl(1, 8, 9, 9, 8, epi=("res",)), conv_wl(3, 8, 9, 9, 8, epi=("res",))
    assert [k.options for k in CONV.space(a).knobs] == [k.options for k in CONV.space(b).knobs]


def test_strided_convs_read_a_phase_split_input():
    wl = conv_wl(1, 4, 9, 11, 6, k=3, s=2, p=1)
    launch = CONV.lower(wl, config(wl, algo="direct", vec="px", regtile="4x16")).launch
    (xp,) = [b for b in launch.workspaces if b.name == "Xp"]
    assert xp.shape[3] == 2 and xp.shape[4] * 2 >= 11 + 2, "stride 2: two phases of half a padded row each"
    one = conv_wl(1, 4, 9, 16, 6, k=1, s=1, p=0)
    assert not CONV.lower(one, config(one, algo="im2col", vec="px", regtile="4x16")).launch.workspaces[:-1], \
        "an unpadded 1x1 stride-1 conv reads its input in place (only the im2col panel)"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), geo=st.sampled_from(range(len(GEOMETRIES))), n=st.sampled_from([1, 2]),
       cg=st.sampled_from([1, 3, 5]), groups=st.sampled_from(["1", "2", "depthwise"]),
       ocg=st.sampled_from([1, 7, 17, 33]), h=st.sampled_from([1, 5, 8]), w=st.sampled_from([1, 6, 13]))
def test_random_shapes_and_configs_match_numpy(compiled, data, geo, n, cg, groups, ocg, h, w):
    kwargs, epi, shapes, dw_shapes = GEOMETRIES[geo]
    g = {"1": 1, "2": 2, "depthwise": 4}[groups]
    if groups == "depthwise":
        cg, ocg = 1, data.draw(st.sampled_from([1, 2]))   # with a channel multiplier too
    h, w = max(h, 3 if kwargs.get("p", 0) == 0 else 1), max(w, 3 if kwargs.get("p", 0) == 0 else 1)
    wl = conv_wl(n, cg * g, h, w, ocg * g, g=g, epi=epi, bias=data.draw(st.booleans()), **kwargs)
    assert CONV.matches(wl)
    space = CONV.space(wl)
    runtime = {k.name: data.draw(st.sampled_from(k.options)) for k in space.knobs if not k.code_shape and k.name != "KC"}
    depthwise = cg == 1 and g > 1   # also groups="2" with one channel per group
    assert ("depthwise" in space.knobs[0].options) == depthwise
    code = data.draw(st.sampled_from(dw_shapes if depthwise else shapes))
    if code["algo"] == "depthwise":
        runtime["PB"] = 1   # one plane per work item
    check(CONV, wl, config(wl, **{**code, **runtime}))


def test_blocked_layout_pads_channel_blocks_and_groups(compiled):
    """Channel blocks of 8 with a partial last block per group (10 channels a group), pixel
    tiles that cross output rows and end past the plane, with a residual epilogue."""
    geo, epi, _, _ = GEOMETRIES[0]
    wl = conv_wl(1, 20, 9, 11, 38, g=2, epi=epi, **geo)
    cfg = config(wl, algo="blocked", vec="oc", regtile="6x16", OCB=2, PB=2)
    (xc,) = [b for b in CONV.lower(wl, cfg).launch.workspaces if b.name == "Xc"]
    assert xc.shape[1] == 2 * 2, "two blocks of 8 channels per group of 10"
    check(CONV, wl, cfg)


@pytest.mark.parametrize("geo, cin, cout, groups, tile, order, kc", [
    (dict(k=3, s=1, p=1), 13, 21, 1, "6x16", "oc_px", 0),        # one run per kernel row (dilation == stride)
    (dict(k=3, s=1, p=1), 29, 21, 1, "6x16", "px_oc", 2),        # 4 blocks in chunks of 2, the last partial
    (dict(k=3, s=2, p=1), 20, 38, 2, "6x16", "oc_px", 1),        # stride 2: one call per phase plane, chunks of 1
    (dict(k=3, s=2, p=2, d=2), 9, 17, 1, "4x24", "px_oc", 0),    # dilation == stride 2: one run per kernel row
    (dict(k=3, s=1, p=2, d=2), 16, 24, 2, "4x32", "oc_px", 4),   # dilation 2, stride 1: taps a loop; 4 vectors a row
    (dict(k=5, s=3, p=2), 17, 19, 1, "6x16", "px_oc", 1),        # stride 3: three phase planes, taps 2 + 2 + 1
])
def test_blocked_vector_ir_tile_matches_numpy(geo, cin, cout, groups, tile, order, kc):
    """tile_code vec<lanes> (nest-form tile_fma calls, the reduction in chunks of KC blocks) on
    odd planes, pads, strides, dilations, groups and channel counts that are not multiples of 8;
    a bias-free residual + ReLU epilogue through the shared store loop."""
    wl = conv_wl(1, cin, 9, 11, cout, g=groups, epi=("res", "relu"), bias=False, **geo)
    code = next(k for k in CONV.space(wl).knobs if k.name == "tile_code").options[1]
    assert code.startswith("vec")
    cfg = config(wl, algo="blocked", vec="oc", regtile=tile, tile_code=code, order=order, KC=kc, OCB=2, PB=2)
    assert "tile_fma(" in render(CONV.lower(wl, cfg).module)
    check(CONV, wl, cfg)


def test_reduction_chunks_only_for_the_vector_ir_blocked_tile():
    wl = conv_wl(1, 16, 9, 9, 16, k=3, s=1, p=1, epi=("relu",))
    space = CONV.space(wl)
    with pytest.raises(ConfigError, match="KC=0"):
        space.validate({**CONV.default_config(wl).to_json(), "algo": "blocked", "tile_code": "slp", "KC": 2})
    recorded = {k: v for k, v in CONV.default_config(wl).to_json().items() if k != "KC"}
    assert space.validate(recorded)["KC"] == 0   # records made before the knob: the whole reduction at once


def test_dw_blocked_pads_channel_blocks_with_a_multiplier_and_hardswish(compiled):
    """13 channels (a partial second block of 8) x multiplier 2, stride 2, pads, tiles that end
    past the output row, rows per work item that do not divide the map, HardSwish fused."""
    geo, _, _, _ = GEOMETRIES[0]
    base = depthwise_wl(1, 13, 11, 9, mult=2, **geo)
    wl = make_wl([(o["op"], o["in"], o["attrs"]) for o in base.ops] + [("HardSwish", ["t0"], {})],
                 [(tuple(i["shape"]), i["dtype"], i["const"]) for i in base.inputs])
    cfg = config(wl, algo="dw_blocked", regtile="4x8", PB=4)
    launch = CONV.lower(wl, cfg).launch
    assert [s.function for s in launch.steps] == ["conv"] and not launch.workspaces, "the kernel pads per band"
    assert launch.steps[0].items == 2 * 2, "13 channels in two blocks of 8 x 6 output rows in bands of 4"
    check(CONV, wl, cfg)
    check(CONV, depthwise_wl(1, 13, 10, 13, epi=("relu",), **geo), cfg)   # stride 2 without the multiplier


@pytest.mark.parametrize("wl, tile", [
    (depthwise_wl(1, 8, 24, 24, s=2, epi=("clip",)), "4x16"),                   # 12-pixel rows: tiles through ct
    (depthwise_wl(1, 5, 9, 11, s=2, epi=("res", "relu")), "4x8"),               # residual: every tile through ct
    (depthwise_wl(2, 4, 9, 11, mult=2, k=3, s=1, p=2, d=2, epi=("chan", "relu")), "2x16"),   # dilation, multiplier
    (depthwise_wl(1, 3, 5, 6, k=5, s=2, p=2, epi=("relu",)), "4x16"),           # a plane smaller than the tile
    (depthwise_wl(1, 6, 13, 13, k=3, s=1, p=1, bias=False), "2x32"),            # no epilogue, no bias
    (depthwise_wl(1, 4, 12, 40, k=3, s=3, p=1, epi=("relu",)), "4x8"),          # stride 3, tiles moved back
], ids=["s2-narrow", "s2-residual", "dilated-mult", "5x5-tiny", "plain", "s3"])
def test_depthwise_vector_ir_tile_matches_numpy(wl, tile):
    """tile_code vec<lanes>: one `row_taps` call per tile on the plain padded plane, a strided
    conv's pixels picked from contiguous loads; full tiles stored in place with the epilogue
    after, edge and residual tiles through ct."""
    code = tile_codes()[1]
    cfg = config(wl, algo="depthwise", regtile=tile, PB=1, tile_code=code)
    src = render(CONV.lower(wl, cfg).module)
    assert "row_taps(" in src and "xp[ud + np.uint64(1)" not in src, "no phase split"
    check(CONV, wl, cfg)


@pytest.mark.parametrize("wl, tile", [
    (depthwise_wl(1, 16, 12, 20, s=2, epi=("relu",)), "8x8"),                  # every tile full: no SLP code
    (depthwise_wl(2, 13, 9, 11, s=2, epi=("clip",)), "8x8"),                   # a partial block: its tiles SLP
    (depthwise_wl(1, 8, 9, 6, k=5, s=1, p=2, epi=("relu",)), "8x8"),           # rows narrower than the tile
    (depthwise_wl(1, 24, 10, 13, k=3, s=1, p=2, d=2, epi=("chan", "relu")), "4x8"),   # dilation, then the epilogue
    (depthwise_wl(2, 16, 8, 10, k=5, s=2, p=2, epi=("hardswish",)), "4x8"),    # HardSwish in registers
    (depthwise_wl(1, 8, 11, 11, k=3, s=1, p=1, bias=False), "4x8"),            # no epilogue, no bias
], ids=["full", "partial-block", "narrow", "dilated-chan", "hardswish", "plain"])
def test_dw_blocked_vector_ir_tile_matches_numpy(wl, tile):
    """dw_blocked with tile_code vec<lanes>: a full tile is one `block_taps` call (bias,
    Relu/ReLU6/HardSwish in registers, transposed NCHW stores), another epilogue run over the
    stored tile after; partial tiles take the SLP tile, which is left out where none exists."""
    cfg = config(wl, algo="dw_blocked", regtile=tile, PB=4, tile_code=tile_codes()[1])
    src = render(CONV.lower(wl, cfg).module)
    assert "block_taps(" in src
    tp, cb = (int(v) for v in tile.split("x"))
    full = int(wl.inputs[0]["shape"][1]) % cb == 0 and int(wl.output_shape[3]) >= tp
    assert ("SLP-vectorized" in src) == (not full)
    check(CONV, wl, cfg)


def test_avx2_stem_defaults_take_the_wide_tile_where_it_computes_no_more():
    """AVX2 stems (<= 4 input channels, up to 3x3): pixel tiles outside four channel tiles, the
    4x24 tile where a row's 24-pixel tiles cover no more pixels than 16-pixel ones; 7x7 stems
    and shallow non-stem convs keep 4x16, channel tiles outside. The wide tile computes what
    NumPy does (HardSwish, a row of 24 and a batch of 2)."""
    def cfg(wl):
        c = CONV.default_config(wl, AVX2)
        return c["regtile"], c["order"], c["OCB"]
    assert cfg(conv_wl(2, 3, 64, 80, 16, k=3, s=2, p=1, epi=("hardswish",))) == ("4x24", "px_oc", 4)   # 40-pixel rows
    assert cfg(conv_wl(1, 3, 96, 96, 32, k=3, s=2, p=1, epi=("clip",))) == ("4x24", "px_oc", 4)        # 48
    assert cfg(conv_wl(1, 3, 64, 64, 16, k=3, s=2, p=1, epi=("relu",))) == ("4x16", "px_oc", 4)        # 32
    assert cfg(conv_wl(1, 3, 64, 64, 64, k=7, s=2, p=3, epi=("relu",))) == ("4x16", "oc_px", 1)
    assert cfg(conv_wl(1, 8, 32, 32, 16, k=3, s=1, p=1, epi=("relu",))) == ("4x16", "oc_px", 1)
    wl = conv_wl(2, 3, 48, 48, 20, k=3, s=2, p=1, epi=("hardswish",))
    assert cfg(wl) == ("4x24", "px_oc", 4)
    check(CONV, wl, CONV.default_config(wl, AVX2))


def test_dw_blocked_vector_ir_tile_only_where_it_fits():
    """block_taps stores the block's channels as the output's: a channel multiplier or a residual
    input (which may be the output buffer itself) keeps dw_blocked's SLP tile; records made
    before the knob run the code they ran."""
    code = tile_codes()[1]
    fits = depthwise_wl(1, 16, 12, 12, s=2, epi=("relu",))
    assert CONV.space(fits).validate({**CONV.default_config(fits).to_json(), "algo": "dw_blocked",
                                      "regtile": "8x8", "tile_code": code})["tile_code"] == code
    for wl in (depthwise_wl(1, 16, 12, 12, mult=2, s=2, epi=("relu",)), depthwise_wl(1, 16, 12, 12, s=2, epi=("res",))):
        with pytest.raises(ConfigError, match="block_taps"):
            CONV.space(wl).validate({**CONV.default_config(wl).to_json(), "algo": "dw_blocked", "regtile": "8x8",
                                     "PB": 16, "tile_code": code})
    recorded = {k: v for k, v in config(fits, algo="dw_blocked", regtile="8x8", PB=16).to_json().items()
                if k != "tile_code"}
    assert CONV.space(fits).validate(recorded)["tile_code"] == "slp"


def test_dw_blocked_stride_one_matches_numpy(compiled):
    geo, epi, _, _ = GEOMETRIES[1]   # dilated 3x3, stride 1, pads 2, per-channel scale + relu
    wl = depthwise_wl(1, 21, 7, 12, epi=epi, **geo)
    check(CONV, wl, config(wl, algo="dw_blocked", regtile="8x8", PB=2, parallel=True))
    wl = depthwise_wl(1, 19, 9, 13, k=3, s=1, p=1, epi=("clip",))   # rows' last tiles moved back
    check(CONV, wl, config(wl, algo="dw_blocked", regtile="4x8", PB=4))


@pytest.mark.parametrize("wl", [
    depthwise_wl(1, 8, 12, 12, epi=("clip",)), depthwise_wl(1, 32, 12, 12, s=2, epi=("clip",)),
    conv_wl(1, 16, 12, 12, 32, k=3, s=1, p=1, epi=("clip",)), conv_wl(1, 16, 12, 12, 32, k=1, s=1, p=0, epi=("clip",)),
], ids=["depthwise", "dw_blocked", "3x3", "1x1"])
def test_scalar_extras_are_read_once_per_function(wl):
    """Clip's bounds (scalar extras) are read into locals before the loops: read at every
    element, LLVM reloaded them after each store, and the tile's stores stayed scalar."""
    from codegen.backend import get_backend
    src = get_backend("cpu").render(CONV.lower(wl, CONV.default_config(wl)).module)
    assert src.count("e0[0]") == 1 and src.count("e1[0]") == 1, "one read of each bound, in the prelude"


def test_depthwise_rows_reads_nchw_with_edges_strides_and_small_planes(compiled):
    """The `depthwise` kernel (NCHW, vectors along a row): one step, no workspace; stride 2 and
    3 with odd pads (the phase split copy starts at the first column of phase 0), a 5x5 window,
    a channel multiplier, planes smaller than the tile (stored through `ct`), and a residual
    (no tile moved back over its neighbour then) against NumPy."""
    cases = [
        (depthwise_wl(1, 5, 11, 13, mult=2, k=3, s=2, p=1, epi=("relu",)), "4x8"),
        (depthwise_wl(1, 3, 10, 17, k=5, s=2, p=2, epi=("res", "relu")), "2x16"),
        (depthwise_wl(1, 4, 13, 14, k=3, s=3, p=1, epi=("relu",)), "4x8"),
        (depthwise_wl(1, 6, 9, 26, k=5, s=1, p=2, epi=("res", "relu")), "4x8"),
        (depthwise_wl(1, 7, 3, 5, k=3, s=1, p=1, epi=("relu",)), "4x16"),
        (depthwise_wl(1, 2, 4, 1, k=3, s=3, p=1, epi=("relu",)), "4x8"),   # a row narrower than the first phase-0 column
        (depthwise_wl(1, 3, 11, 13, k=3, s=1, p=1, epi=("clip",)), "4x8"),   # ReLU6's scalar bounds: tiles moved back
    ]
    cfgs = [(wl, config(wl, algo="depthwise", regtile=t, PB=1, parallel=True)) for wl, t in cases]
    precompile("conv2d", cfgs)
    for wl, cfg in cfgs:
        launch = CONV.lower(wl, cfg).launch
        assert [s.function for s in launch.steps] == ["conv"] and not launch.workspaces, "the kernel pads each plane"
        check(CONV, wl, cfg)


def test_depthwise_defaults_by_target():
    """AVX2: channel blocks (`dw_blocked`) with the vector-IR tile (`block_taps`) at any stride
    and row width; with a residual input or a channel multiplier (which that tile does not
    take), stride 1 on rows of >= 12 pixels reads NCHW as it is (`depthwise`), the rest SLP
    channel blocks. AVX-512 reads the NCHW plane in place on rows of >= 8 pixels, strided too
    (`dw_plane`)."""
    code = tile_codes(AVX2)[1]
    for wl in (depthwise_wl(1, 144, 24, 24), depthwise_wl(1, 96, 48, 48, s=2), depthwise_wl(1, 960, 7, 7)):
        assert (CONV.default_config(wl, AVX2)["algo"], CONV.default_config(wl, AVX2)["tile_code"]) == ("dw_blocked", code)
    assert CONV.default_config(depthwise_wl(1, 144, 24, 24, epi=("res",)), AVX2)["algo"] == "depthwise"
    assert CONV.default_config(depthwise_wl(1, 96, 48, 48, mult=2, s=2), AVX2)["tile_code"] == "slp"
    for wl in (depthwise_wl(1, 144, 24, 24), depthwise_wl(1, 96, 48, 48, s=2), depthwise_wl(1, 96, 8, 8, k=5, p=2)):
        assert CONV.default_config(wl, AVX512)["algo"] == "dw_plane"
    assert CONV.default_config(depthwise_wl(1, 960, 7, 7), AVX512)["algo"] == "dw_blocked"


def test_pointwise_direct_px_is_a_gemm_stored_from_registers():
    """1x1 stride-1 convs with vectors along the pixels (`_gemm_1x1`): one kernel reading the
    input in place; channel counts that leave a partial 4-channel tile, planes that leave a
    partial (or, without extras, an overlapping) 16-pixel tile, groups, a residual and a
    per-channel scale (which cannot run on the accumulators: the row-view kernel instead)."""
    cases = [
        (conv_wl(1, 5, 7, 9, 13, k=1, s=1, p=0, epi=("res", "relu")), True),   # P = 63: a partial pixel tile
        (conv_wl(2, 6, 9, 9, 10, k=1, s=1, p=0, g=2, bias=False), True),       # P = 81: the last tile overlaps
        (conv_wl(1, 3, 3, 4, 6, k=1, s=1, p=0, epi=("relu",)), True),          # P = 12 < 16
        (conv_wl(1, 4, 5, 7, 8, k=1, s=1, p=0, epi=("chan", "relu")), False),
    ]
    pairs = []
    for wl, _ in cases:
        pairs += [(wl, config(wl, algo="direct", vec="px", regtile="4x16", order=o)) for o in ("oc_px", "px_oc")]
    precompile("conv2d", pairs)
    for wl, in_place in cases:
        for order in ("oc_px", "px_oc"):
            for ocb, pb in ((1, 1), (4, 2)):
                cfg = config(wl, algo="direct", vec="px", regtile="4x16", order=order, OCB=ocb, PB=pb, parallel=pb > 1)
                launch = CONV.lower(wl, cfg).launch
                x = launch.steps[-1].args[0]
                assert (len(launch.steps) == 1 and len(getattr(x, "shape", None) or ()) == 3) == in_place, \
                    "the GEMM kernel is the one step and reads X[N, C, P] in place"
                check(CONV, wl, cfg)
    big = conv_wl(1, 16, 48, 48, 96, k=1, s=1, p=0, epi=("relu",))
    assert (CONV.default_config(big)["algo"], CONV.default_config(big)["vec"]) == ("direct", "px"), \
        "expand convs of few input channels read the plane in place"


def test_strided_pointwise_direct_px_subsamples_then_runs_the_gemm():
    """1x1 convs of stride 2 and 3 without pads, vectors along the pixels: the pixels read are
    copied into a contiguous plane (`_subsample`, 1/S^2 of the input) that the 1x1 GEMM reads;
    odd planes whose last row and column are not read, partial channel and pixel tiles, a
    residual, groups, and a per-channel scale (not on the accumulators: the phase-split kernel)."""
    cases = [
        (conv_wl(1, 5, 9, 11, 13, k=1, s=2, p=0, epi=("res", "relu")), True),    # 5x6 output: P = 30
        (conv_wl(2, 6, 14, 13, 10, k=1, s=3, p=0, g=2, bias=False), True),       # 5x5: the last tile overlaps
        (conv_wl(1, 7, 8, 8, 9, k=1, s=2, p=0, epi=("relu",)), True),            # P = 16: one full pixel tile
        (conv_wl(1, 4, 9, 7, 8, k=1, s=2, p=0, epi=("chan", "relu")), False),
    ]
    per_call = conv_wl(1, 5, 9, 11, 13, k=1, s=2, p=0, epi=("relu",)).to_json()
    per_call["inputs"][1]["const"] = False   # weights packed per call, before the subsample step
    cases.append((type(cases[0][0]).from_json(per_call), True))
    cfgs = [(wl, config(wl, algo="direct", vec="px", regtile="4x16", order="px_oc", OCB=ocb, PB=pb, parallel=pb > 1))
            for wl, _ in cases for ocb, pb in ((1, 1), (4, 2))]
    precompile("conv2d", cfgs)
    for (wl, cfg), (_, gathered) in zip(cfgs, [c for c in cases for _ in range(2)]):
        steps = [s.function for s in CONV.lower(wl, cfg).launch.steps if s.function != "pack_w"]
        assert (steps == ["subsample", "conv"]) == gathered, steps
        check(CONV, wl, cfg)
    # the strided 1x1 convs of ResNet-18 run it untuned
    assert CONV.lower(conv_wl(1, 64, 56, 56, 128, k=1, s=2, p=0, epi=("relu",)),
                      CONV.default_config(conv_wl(1, 64, 56, 56, 128, k=1, s=2, p=0, epi=("relu",)))).launch.steps[0].function \
        == "subsample"


def test_direct_px_stores_from_registers_with_a_half_tile_at_a_rows_end():
    """The direct kernel with vectors along the pixels (stems: few input channels, taps grouped
    by the input row's phase): rows that end in a half tile (moved left to the row's end, or,
    with a residual, partial), rows narrower than a tile, strides 2 and 3 with dilation 2, pads,
    partial channel tiles, and a per-channel scale (not on the accumulators: stored through `ct`)."""
    cases = [
        (conv_wl(1, 3, 23, 45, 13, k=7, s=2, p=3, epi=("relu",)), "4x16", True),       # OW 23: 16 + a half at 15
        (conv_wl(2, 3, 17, 40, 9, k=3, s=2, p=1, epi=("res", "relu")), "4x16", True),  # OW 20: 16 + 4 of a half
        (conv_wl(1, 2, 13, 29, 6, k=3, s=3, p=2, d=2, bias=False), "4x16", True),      # OW 10: one partial tile
        (conv_wl(1, 3, 11, 49, 7, k=3, s=2, p=1, epi=("relu",)), "4x16", True),        # OW 25: 9 left, a full tile at 9
        (conv_wl(1, 3, 30, 111, 11, k=3, s=2, p=1, epi=("relu",)), "8x32", True),      # OW 56: 32 + a half at 40
        (conv_wl(1, 3, 12, 15, 8, k=3, s=1, p=1, epi=("chan", "relu")), "4x16", False),
    ]
    cfgs = [(wl, config(wl, algo="direct", vec="px", regtile=t, order=o, OCB=ocb, PB=pb, parallel=pb > 1))
            for wl, t, _ in cases for o, ocb, pb in (("oc_px", 1, 1), ("px_oc", 2, 4))]
    precompile("conv2d", cfgs)
    for (wl, cfg), (_, _, in_place) in zip(cfgs, [c for c in cases for _ in range(2)]):
        assert ("og[np.uint64(oc0" in render(CONV.lower(wl, cfg).module)) == in_place
        check(CONV, wl, cfg)


def test_direct_px_vector_ir_tile_matches_numpy():
    """tile_code vec<lanes> on the direct vec='px' kernels (one `tile_fma` call per tile): stems
    (the nest over channels x kernel rows, one segment per phase plane of strides 2 and 3, a
    dilation, half tiles at a row's end, rows narrower than a tile, AVX-512's wide 14x32 tile) and
    1x1 GEMMs over the plane (partial and overlapping pixel tiles, groups, a strided subsample),
    with epilogues stored in place (Relu), through the scratch tile (a residual, which may be the
    output buffer itself) and longer than the SLP tile's registers allow (a per-channel scale)."""
    code = tile_codes()[1]
    wide = "14x32" if code == "vec16" else "6x16"
    cases = [
        (conv_wl(1, 3, 23, 45, 13, k=7, s=2, p=3, epi=("relu",)), "4x16"),          # OW 23: 16 + a half
        (conv_wl(2, 3, 17, 40, 9, k=3, s=2, p=1, epi=("res", "relu")), "4x16"),     # OW 20, a residual
        (conv_wl(1, 2, 13, 29, 6, k=3, s=3, p=2, d=2, bias=False), "4x16"),         # OW 10 < 16
        (conv_wl(1, 3, 30, 111, 20, k=3, s=2, p=1, epi=("relu",)), wide),           # OW 56, 20 channels
        (conv_wl(1, 3, 12, 15, 8, k=3, s=1, p=1, epi=("chan", "relu")), "4x16"),
        (conv_wl(1, 5, 7, 9, 13, k=1, s=1, p=0, epi=("res", "relu")), "4x16"),      # P = 63
        (conv_wl(2, 6, 9, 9, 10, k=1, s=1, p=0, g=2, bias=False), "4x16"),          # P = 81: overlapping tile
        (conv_wl(1, 4, 5, 7, 8, k=1, s=1, p=0, epi=("chan", "relu")), "4x16"),
        (conv_wl(1, 5, 9, 11, 13, k=1, s=2, p=0, epi=("res", "relu")), "4x16"),     # subsampled plane
        (conv_wl(1, 16, 20, 20, 30, k=1, s=1, p=0, epi=("relu",)), wide),
        (conv_wl(1, 3, 14, 30, 11, k=3, s=2, p=1, epi=("clip",)), "4x16"),         # ReLU6: scalar extras, in place
        (conv_wl(1, 6, 9, 9, 10, k=1, s=1, p=0, epi=("clip",)), "4x16"),
    ]
    cfgs = [(wl, config(wl, algo="direct", vec="px", regtile=t, order=o, OCB=ocb, PB=pb, parallel=pb > 1,
                        tile_code=code)) for wl, t in cases for o, ocb, pb in (("oc_px", 1, 1), ("px_oc", 2, 4))]
    precompile("conv2d", cfgs)
    for wl, cfg in cfgs:
        assert "tile_fma(" in render(CONV.lower(wl, cfg).module)
        check(CONV, wl, cfg)
    stem = conv_wl(1, 3, 224, 224, 64, k=7, s=2, p=3, epi=("relu",))
    assert CONV.default_config(stem)["tile_code"] == code, "stems run the vector-IR tile untuned"
    if code == "vec16":   # AVX-512: deep 1x1 GEMMs on small planes take the 28-accumulator tile
        assert CONV.default_config(conv_wl(1, 576, 7, 7, 160, k=1, s=1, p=0))["regtile"] == "14x32"


def test_im2col_vector_ir_tile_matches_numpy(monkeypatch):
    """tile_code vec<lanes> on im2col with vectors along the output channels: one `tile_fma`
    call per tile over the packed panel, stored column-major into the channel rows (masked past
    the plane and the group's channels), bias and epilogue after: patch embeddings (batch 2),
    a strided 1x1 with a residual, groups with a per-channel scale, no bias and 20 channels of
    a 32-channel tile, ReLU6, both loop orders, and a work item's share run as 3 copies."""
    code = tile_codes()[1]
    wide = "14x32" if code == "vec16" else "6x16"
    cases = [
        (conv_wl(1, 3, 64, 64, 40, k=16, s=16, p=0), "4x16"),                     # 16 patches
        (conv_wl(2, 3, 32, 40, 24, k=8, s=8, p=0, epi=("relu",)), "4x16"),         # 20 patches
        (conv_wl(1, 16, 14, 14, 36, k=1, s=2, p=0, epi=("res", "relu")), "4x16"),  # 49 pixels
        (conv_wl(2, 16, 9, 9, 24, k=3, s=2, p=1, g=2, epi=("chan", "relu")), "4x16"),
        (conv_wl(1, 8, 7, 7, 20, k=3, s=1, p=1, bias=False), wide),
        (conv_wl(1, 6, 13, 11, 17, k=3, s=1, p=1, epi=("clip",)), "4x16"),
    ]
    cfgs = [(wl, config(wl, algo="im2col", vec="oc", regtile=t, order=o, OCB=ocb, PB=pb, parallel=True, tile_code=code))
            for wl, t in cases for o, ocb, pb in (("oc_px", 1, 1), ("px_oc", 2, 2))]
    precompile("conv2d", cfgs)
    for wl, cfg in cfgs:
        assert "tile_fma(" in render(CONV.lower(wl, cfg).module)
        check(CONV, wl, cfg)
    from codegen.cpu import CpuBackend

    def three_copies(self, items, parallel, grid=(), block=(), work=None):
        """Each call as 3 copies run one after the other: each writes only its share of the work items."""
        return lambda fn: ((lambda *args: [fn(*args, t, 3) for t in range(3)]), ())
    monkeypatch.setattr(CpuBackend, "launcher", three_copies)
    for wl, cfg in cfgs[::3]:
        check(CONV, wl, cfg)


def test_patch_embeddings_default_to_im2col_with_the_vector_tile():
    """A ViT's patch conv (kernel = stride, no pads) of >= PATCH_K inputs a window is an im2col
    GEMM with vectors along the channels and the vector-IR tile (AVX-512 8x32: 2.35x faster
    than the direct kernel's pixel vectors at 16x16/16 @224; AVX2 6x16: 1.39x,
    experiments/bench_conv.md); a 4x4/4 stem of 48, overlapping windows (a 7x7/2 stem) and 1x1
    convs are not patches."""
    for wl in (conv_wl(1, 3, 224, 224, 384, k=16, s=16, p=0), conv_wl(1, 3, 224, 224, 384, k=8, s=8, p=0),
               conv_wl(1, 3, 64, 64, 192, k=16, s=16, p=0)):
        for target, tile, code in ((AVX512, "8x32", "vec16"), (AVX2, "6x16", "vec8")):
            cfg = CONV.default_config(wl, target)
            assert (cfg["algo"], cfg["vec"], cfg["regtile"], cfg["tile_code"]) == ("im2col", "oc", tile, code), wl.inputs
    for wl in (conv_wl(1, 3, 224, 224, 96, k=4, s=4, p=0), conv_wl(1, 3, 224, 224, 64, k=7, s=2, p=3)):
        assert CONV.default_config(wl, AVX512)["algo"] == "direct", wl.inputs
    assert CONV.default_config(conv_wl(1, 256, 28, 28, 128, k=1, p=0), AVX512)["vec"] == "px"


@pytest.mark.slow
def test_every_code_shape_on_one_odd_shape():
    for wl in (conv_wl(1, 5, 9, 11, 37, k=3, s=2, p=1, epi=("res", "relu")), depthwise_wl(1, 5, 9, 11, s=2, p=1)):
        space = CONV.space(wl)
        reps = {}
        for cfg in space:
            reps.setdefault(space.code_key(cfg), cfg)
        precompile("conv2d", [(wl, c) for c in reps.values()])
        for cfg in reps.values():
            check(CONV, wl, cfg)


AVX2 = {"vector_bits": 256, "vector_registers": 16}
AVX512 = {"vector_bits": 512, "vector_registers": 32}


@pytest.mark.parametrize("wl, avx2, avx512", [
    (conv_wl(1, 64, 56, 56, 64), "4x24", "14x32"),                          # AVX2 winograd's GEMM; blocked
    (conv_wl(1, 256, 14, 14, 512, s=2), "6x16", "14x32"),
    (conv_wl(1, 24, 56, 56, 144, k=1, p=0), "4x24", "8x32"),                # 1x1: GEMM over the plane
    (conv_wl(1, 64, 56, 56, 128, k=1, s=2, p=0), "4x24", "8x32"),           # 1x1 strided: GEMM over the subsampled plane
    (conv_wl(1, 256, 14, 14, 512, k=1, s=2, p=0), "6x16", "14x32"),         # 7x7 output: AVX2 im2col, AVX-512 the deep GEMM
    (conv_wl(1, 576, 7, 7, 160, k=1, p=0), "6x16", "14x32"),               # 7x7 map: AVX2 blocked, AVX-512 in place (deep)
    (conv_wl(1, 3, 224, 224, 64, k=7, s=2, p=3), "4x16", "8x32"),           # stem: direct
    (conv_wl(1, 3, 64, 64, 192, k=16, s=16, p=0), "6x16", "8x32"),          # ViT patches: im2col, vector IR
], ids=["3x3", "3x3s2", "1x1", "1x1s2", "1x1s2@7", "1x1@7", "stem", "patch16"])
def test_default_tiles_follow_the_vector_shape(wl, avx2, avx512):
    """AVX2's (8 lanes, 16 registers) tiles keep 8-12 accumulators (4x24 for the vector-IR GEMM over
    the plane: 12 ymm accumulators, 3 pixel vectors, a broadcast; the blocked 4x16 on planes of up
    to 16 pixels, `BLOCKED_SMALL`); AVX-512's (16, 32) fill its 32
    registers (28 accumulators of the blocked tile and of deep 1x1 GEMMs on small planes, 16 of
    the other pixel tiles), in its own space only; blocked and direct vec='px' tiles are vector IR."""
    for target, tile in ((AVX2, avx2), (AVX512, avx512)):
        cfg = CONV.default_config(wl, target)
        assert cfg["regtile"] == tile and CONV.space(wl, target).validate(cfg) == cfg
        if wl.inputs[1]["shape"][2] == 1 and wl.output_shape[2] == 7:   # 1x1 convs of 7x7 outputs
            strided = wl.inputs[0]["shape"][2] != 7
            assert (cfg["algo"], cfg["vec"]) == (("direct", "px") if target is AVX512 else
                                                 ("im2col", "px") if strided else ("blocked", "oc"))
        if cfg["algo"] in ("blocked", "winograd") or (cfg["algo"], cfg["vec"]) == ("direct", "px"):
            assert cfg["tile_code"] == f"vec{target['vector_bits'] // 32}"
        if wl.output_shape[2] * wl.output_shape[3] < 32:   # AVX-512: fewer pixels than its px tile computes;
            assert cfg["vec"] == "oc"                         # AVX2: the one such case is a patch embedding
    wide = {"12x32", "14x32", "4x64"}
    assert not wide & set(next(k for k in CONV.space(wl, AVX2).knobs if k.name == "regtile").options)


@pytest.mark.parametrize("cin, h, cout, algo", [
    (576, 7, 160, "blocked"),   # MobileNetV2's 7x7 maps, deep: the blocked kernel
    (160, 10, 64, "blocked"),
    (136, 5, 40, "blocked"),    # odd plane and channels: a partial OC tile, 25 pixels in tiles of 6
    (128, 7, 512, "direct"),    # up to 128 channels: the plane GEMM (4x24)
    (20, 6, 44, "direct"),
    (16, 4, 64, "direct"),      # 16 pixels: the plane GEMM's smallest plane
    (64, 12, 96, "direct"),     # 144 pixels: the plane GEMM, as before
])
def test_avx2_small_plane_1x1_by_reduction_depth(cin, h, cout, algo):
    """AVX2's stride-1 1x1 convs on planes of 16 to 127 pixels: more than 128 input channels run
    the blocked kernel (vector-IR 6x16), fewer the vector-IR plane GEMM (4x24), not im2col's SLP
    panels (`SMALL_PLANE_1X1_DEEP`); strided ones keep im2col; the defaults compute what NumPy does."""
    wl = conv_wl(1, cin, h, h, cout, k=1, p=0, epi=("relu",))
    cfg = CONV.default_config(wl, AVX2)
    assert (cfg["algo"], cfg["regtile"], cfg["tile_code"]) == (algo, "6x16" if algo == "blocked" else "4x24", "vec8")
    assert CONV.space(wl, AVX2).validate(cfg) == cfg
    if cin < 200:
        check(CONV, wl, cfg)
    strided = conv_wl(1, cin, 2 * h, 2 * h, cout, k=1, s=2, p=0)
    if h * h < 128:
        assert CONV.default_config(strided, AVX2)["algo"] == "im2col"


@pytest.mark.parametrize("cin, cout, h, squeeze", [
    (960, 240, 1, True), (72, 24, 1, True), (100, 36, 3, True),   # squeezes, a 3x3 map: 9 pixels
    (240, 960, 1, False), (24, 72, 1, False),                      # excites keep the direct kernel
])
def test_avx2_squeeze_1x1_defaults_to_im2col_vector_ir(cin, cout, h, squeeze):
    """AVX2's 1x1 convs on planes of under 16 pixels that reduce more channels than they output
    run im2col's vector-IR tile along the channels (`SQUEEZE_IM2COL`), the others the direct
    SLP kernel as before; both compute what NumPy does."""
    wl = conv_wl(1, cin, h, h, cout, k=1, p=0, epi=("relu",))
    cfg = CONV.default_config(wl, AVX2)
    want = ("im2col", "oc", "4x16", "vec8") if squeeze else ("direct", "oc", "4x16", "slp")
    assert (cfg["algo"], cfg["vec"], cfg["regtile"], cfg["tile_code"]) == want
    assert CONV.space(wl, AVX2).validate(cfg) == cfg
    assert CONV.default_config(wl, AVX512)["algo"] != "im2col"
    check(CONV, wl, cfg)


@pytest.mark.parametrize("h, s, avx512", [
    (2, 1, "4x64"),     # ResNet-18's layer 4 at a 64x64 image: 4 pixels, one tile of 4 (14x32 computes 14)
    (4, 2, "4x64"),     # the strided conv into that 2x2 map
    (4, 1, "8x32"),     # 16 pixels: two tiles of 8 (14x32 computes 28 in two tiles too)
    (3, 1, "14x32"),    # 9 pixels: one tile of 14 streams the weights once (4x64: three times)
    (8, 1, "8x32"),     # rows of 8: whole tiles of 8 a row (14x32 crosses rows: a window offset per pixel)
    (7, 1, "14x32"),    # rows of 7, 49 pixels: the 28-accumulator tile, two rows a tile
    (14, 1, "14x32"),   # rows of 14 and more that hold it whole: the 28-accumulator tile
    (10, 1, "14x32"),   # rows of 10 hold no tile of 8 or more: the fewest weight passes
    (1, 1, "4x64"),     # a 1x1 map (was the direct 4x16 kernel: as fast, measured)
])
def test_blocked_default_tile_fits_small_planes(h, s, avx512, monkeypatch):
    """On AVX-512 the untuned blocked tile follows the plane (`blocked_tile`): tiles of 8 or more
    pixels that rows hold whole first, then the fewest pixel tiles (weight passes), then the
    fewest pixels computed; AVX2 takes its small-plane tile on planes of up to 16 pixels (4x16,
    `BLOCKED_SMALL`), planes of under 16 included (they ran the direct kernel 2-3x slower), else its
    one tile; the small-plane defaults compute what NumPy does."""
    wl = conv_wl(1, 64, h, h, 128, s=s, epi=("relu",))
    cfg = CONV.default_config(wl, AVX512)
    assert (cfg["algo"], cfg["vec"], cfg["regtile"], cfg["tile_code"]) == ("blocked", "oc", avx512, "vec16")
    assert CONV.space(wl, AVX512).validate(cfg) == cfg
    import schedules.templates.conv2d as conv2d
    monkeypatch.setattr(conv2d, "WINOGRAD_DEFAULT", {})   # its stride-1 convs of 16+ tiles take winograd
    avx2 = CONV.default_config(wl, AVX2)
    pixels = wl.output_shape[2] * wl.output_shape[3]
    small = "4x16" if pixels <= 16 else "6x16"
    assert (avx2["algo"], avx2["vec"], avx2["regtile"], avx2["tile_code"]) == ("blocked", "oc", small, "vec8")
    if pixels < 16:
        check(CONV, wl, avx2)


@pytest.mark.parametrize("h, cin, blocked", [(4, 256, True), (8, 128, True), (16, 64, False), (8, 32, False)])
def test_strided_1x1_onto_small_planes_defaults_to_blocked_on_avx512(h, cin, blocked):
    """A strided 1x1 conv onto at most 16 pixels from >= 64 channels (ResNet's downsamples on
    small maps) runs the blocked kernel by default on AVX-512 (its pad does the subsample), with
    the plane's tile; larger planes and fewer channels keep the direct GEMM; AVX2 the same, with
    its small-plane tile. The default computes what NumPy does."""
    wl = conv_wl(1, cin, h, h, 2 * cin, k=1, s=2, p=0, epi=("res", "relu"))
    cfg = CONV.default_config(wl, AVX512)
    assert (cfg["algo"] == "blocked") == blocked
    if blocked:
        assert (cfg["vec"], cfg["tile_code"]) == ("oc", "vec16")
        assert cfg["regtile"] == blocked_tile(wl.output_shape[2] * wl.output_shape[3], (16, 32), wl.output_shape[3])
        check(CONV, wl, cfg)
    avx2 = CONV.default_config(wl, AVX2)
    assert (avx2["algo"] == "blocked") == blocked
    if blocked:
        assert avx2["regtile"] == "4x16"
        check(CONV, wl, avx2)


@pytest.mark.parametrize("geo, cin, cout, tile", [
    (dict(k=3, s=1, p=1), 29, 45, "14x32"),     # 14 pixels cross rows of 11; a partial OC tile
    (dict(k=3, s=2, p=1), 20, 70, "12x32"),     # stride 2: one call per phase plane
    (dict(k=1, s=2, p=0), 17, 33, "14x32"),
    (dict(k=3, s=1, p=1), 21, 70, "4x64"),      # the few-pixel tile: a partial OC tile of 6 of 64
])
def test_avx512_blocked_tiles_match_numpy(geo, cin, cout, tile):
    """The AVX-512 space's wide blocked tiles (vec16) on odd planes and channel counts (LLVM splits
    the vectors where the machine has narrower ones, so this runs everywhere)."""
    wl = conv_wl(1, cin, 9, 11, cout, epi=("res", "relu"), bias=False, **geo)
    cfg = CONV.space(wl, AVX512).validate({**CONV.default_config(wl, AVX512).to_json(), "algo": "blocked",
                                           "vec": "oc", "regtile": tile, "tile_code": "vec16", "KC": 2, "PB": 2})
    assert "tile_fma(" in render(CONV.lower(wl, cfg).module)
    check(CONV, wl, cfg)


@pytest.mark.parametrize("h, w, s, tile, run", [
    (7, 7, 1, "14x32", 7),      # a tile holds two rows; the last one row past the plane
    (14, 14, 2, "14x32", 7),    # stride 2: 7x7 outputs from the phase planes
    (12, 12, 1, "6x16", 6),     # rows of two tiles
    (5, 3, 1, "6x16", 3),       # tiles of two rows of 3, the last one row past the plane
])
def test_blocked_tiles_along_rows_match_numpy(h, w, s, tile, run):
    """Tiles whose pixels lie along rows (`pixel_run`) read their windows at constant offsets
    from a base per row; the output tiles, column-major and masked where they pass the plane or
    the channels (40 of 64), accumulate in place over chunks of KC blocks (3 blocks of 19 channels)."""
    wl = conv_wl(1, 19, h, w, 40, s=s, epi=("res", "relu"), bias=False)
    mr = int(tile.split("x")[0])
    assert pixel_run(mr, wl.output_shape[3]) == run
    for kc in (0, 2):
        cfg = CONV.space(wl, AVX512).validate({**CONV.default_config(wl, AVX512).to_json(), "algo": "blocked",
                                               "vec": "oc", "regtile": tile, "tile_code": "vec16", "KC": kc, "PB": 2})
        assert "o0 + xg + 8," in render(CONV.lower(wl, cfg).module)
        check(CONV, wl, cfg)


@pytest.mark.parametrize("s", [1, 2])
def test_blocked_residual_is_a_run_time_flag(s):
    """The vector-IR blocked module of Conv+Relu and Conv+Add+Relu is one source, as are Conv and
    Conv+Add (`residual_split`: the residual Add behind a run-time flag), and each matches NumPy;
    a per-channel Mul is no residual and keeps its own code."""
    wls = [conv_wl(1, 19, 9, 11, 40, s=s, epi=e) for e in (("relu",), ("res", "relu"), (), ("res",))]
    funcs = []
    for wl in wls:
        cfg = CONV.space(wl, AVX512).validate({**CONV.default_config(wl, AVX512).to_json(), "algo": "blocked",
                                               "vec": "oc", "regtile": "12x32", "tile_code": "vec16", "PB": 2})
        funcs.append(render(CONV.lower(wl, cfg).module))
        check(CONV, wl, cfg)
    assert funcs[0] == funcs[1] != funcs[2] == funcs[3] and "if R != 0:" in funcs[1]
    assert residual_split(parse_epilogue(wls[2], 3, wls[2].output_shape, 1, True))[1] is None
    chan = conv_wl(1, 19, 9, 11, 40, s=s, epi=("chan", "relu"))
    assert residual_split(parse_epilogue(chan, 3, chan.output_shape, 1, True)) is None


@pytest.mark.parametrize("wl, tile", [
    (depthwise_wl(1, 37, 9, 13, k=3, s=2, p=1, epi=("relu",)), "7x16"),            # 37 channels: a partial third block
    (depthwise_wl(1, 21, 11, 16, mult=2, k=3, s=1, p=1, epi=("res", "relu")), "8x16"),   # a residual: no tile moved back
    (depthwise_wl(1, 16, 7, 7, k=3, s=2, p=1, epi=("relu",)), "8x16"),              # rows narrower than the tile
    (depthwise_wl(1, 48, 10, 15, k=5, s=2, p=2, epi=("chan", "relu")), "7x16"),     # 5x5/2, per-channel scale
    (depthwise_wl(1, 19, 8, 9, k=3, s=1, p=1, epi=("relu",)), "7x16"),             # one block: 16 + 3 channels
], ids=["37s2", "21x2res", "16@7s2", "48k5s2", "19k3"])
def test_dw_blocked_avx512_channel_blocks_match_numpy(wl, tile):
    """The AVX-512 space's `dw_blocked` tiles of 16-channel blocks (one zmm a pixel) on odd
    planes, strides 1 and 2, channel counts not a multiple of 16 and fused epilogues (LLVM splits
    the vectors where the machine has narrower ones, so this runs everywhere)."""
    cfg = CONV.space(wl, AVX512).validate({**CONV.default_config(wl, AVX512).to_json(), "algo": "dw_blocked",
                                           "regtile": tile, "PB": 2, "tile_code": "slp"})
    assert f"NCHW{tile.split('x')[1]}c" in CONV.lower(wl, cfg).module.doc
    check(CONV, wl, cfg)


@pytest.mark.parametrize("h, avx512", [(48, "4x16"), (24, "4x32"), (14, "4x16"), (12, "4x16"), (8, "4x8")])
def test_depthwise_default_tiles_per_vector_shape(h, avx512):
    """Stride-1 depthwise convs: on AVX-512 `dw_plane` with tiles as wide as the row wastes least
    (rows of 48: 3 tiles of 16; of 24: one of 32); on AVX2 `dw_blocked`'s block_taps tile, 8
    pixels where the row holds 8 (else 4) x 8 channels, ReLU6 in registers (no pass over the
    stored tile); both compute what NumPy does."""
    wl = depthwise_wl(1, 24, h, h, k=3, s=1, p=1, epi=("clip",))
    cfg = CONV.default_config(wl, AVX512)
    assert (cfg["algo"], cfg["regtile"], cfg["tile_code"]) == ("dw_plane", avx512, "vec16")
    src = render(CONV.lower(wl, cfg).module)
    assert "plane_taps(" in src and "oimg[ob" not in src   # ReLU6 in registers: no pass over the tile
    check(CONV, wl, cfg)
    cfg = CONV.default_config(wl, AVX2)
    assert (cfg["algo"], cfg["regtile"], cfg["tile_code"]) == ("dw_blocked", "8x8", "vec8")
    src = render(CONV.lower(wl, cfg).module)
    assert "block_taps(" in src and "oimg[ur]" not in src
    check(CONV, wl, cfg)


def test_dw_blocked_tiles_follow_the_vector_shape():
    """AVX2's `dw_blocked` tiles and defaults are 8-channel blocks as before; 16-channel tiles are in
    AVX-512's space only, its default on rows of 7 pixels of whole 16-channel blocks."""
    assert not any(t.endswith("x16") for t in
                   next(k for k in CONV.space(depthwise_wl(1, 96, 14, 14), AVX2).knobs if k.name == "regtile").options
                   if t not in ("2x16", "4x16"))   # those two are the `depthwise` (rows x pixels) tiles
    for wl, avx2, avx512 in ((depthwise_wl(1, 96, 56, 56, s=3), "8x8", "8x8"), (depthwise_wl(1, 960, 7, 7), "4x8", "7x16"),
                             (depthwise_wl(1, 576, 14, 14, s=2), "4x8", "7x16"), (depthwise_wl(1, 40, 7, 7), "4x8", "4x8")):
        assert CONV.default_config(wl, AVX2)["regtile"] == avx2
        cfg = CONV.default_config(wl, AVX512)
        assert cfg["regtile"] == avx512 and CONV.space(wl, AVX512).validate(cfg) == cfg


@pytest.mark.parametrize("wl, tile", [
    (depthwise_wl(1, 8, 24, 24, s=2, epi=("clip",)), "4x16"),                   # 12-pixel rows: masked columns
    (depthwise_wl(1, 5, 9, 11, s=2, epi=("res", "relu")), "4x16"),              # residual: every tile through ct
    (depthwise_wl(2, 4, 10, 13, mult=2, k=3, s=2, p=1, epi=("chan", "relu")), "4x32"),   # multiplier, epilogue pass
    (depthwise_wl(1, 3, 5, 6, k=5, s=2, p=2, epi=("relu",)), "2x32"),           # 5x5 on a plane smaller than the tile
    (depthwise_wl(1, 6, 13, 13, k=3, s=2, p=1, bias=False), "2x64"),            # no epilogue, no bias, odd plane
    (depthwise_wl(1, 4, 10, 150, k=3, s=2, p=1, epi=("relu",)), "4x32"),        # 75-pixel rows: three column tiles
    (depthwise_wl(1, 4, 11, 20, k=3, s=2, p=0, epi=("relu",)), "4x16"),         # no pads
    (depthwise_wl(1, 6, 24, 24, k=3, s=1, p=1, epi=("clip",)), "4x32"),         # stride 1, 24-pixel rows
    (depthwise_wl(2, 5, 9, 37, k=5, s=1, p=2, epi=("res", "relu")), "4x8"),     # stride 1, 5x5, residual, batch 2
    (depthwise_wl(1, 4, 12, 21, k=3, s=1, p=2, d=2, epi=("relu",)), "2x32"),    # dilated 2 along both axes
], ids=["s2-narrow", "s2-residual", "mult-chan", "5x5-tiny", "plain", "wide", "unpadded", "s1", "s1-5x5-res",
        "dilated"])
def test_dw_plane_matches_numpy(wl, tile):
    """algo dw_plane: one `plane_taps` call per tile on the unpadded input plane (no copy of
    it), the pads as masked loads, partial tiles stored masked in place; a residual's tiles
    through ct, epilogues other than Relu/ReLU6 run over the stored tile."""
    cfg = config(wl, algo="dw_plane", regtile=tile, PB=1, tile_code=tile_codes()[1])
    src = render(CONV.lower(wl, cfg).module)
    assert "plane_taps(" in src and "xp[" not in src, "the plane read in place"
    check(CONV, wl, cfg)


def test_dw_plane_is_the_avx512_default_for_rows_of_8_or_more():
    """AVX-512: stride-1 and stride-2 depthwise convs with rows of >= 8 output pixels default to
    dw_plane (`dw_plane_tile`); rows of 7 keep dw_blocked, as AVX2 does everywhere. The algorithm is
    offered where a tap's shift stays within a vector ((KW - 1) * DW <= 4), as vector-IR code only."""
    for h, s, tile in ((48, 2, "4x32"), (24, 2, "4x16"), (112, 2, "4x32"), (16, 2, "4x8"), (56, 1, "4x32")):
        wl = depthwise_wl(1, 32, h, h, k=3, s=s, p=1, epi=("clip",))
        cfg = CONV.default_config(wl, AVX512)
        assert (cfg["algo"], cfg["regtile"], cfg["tile_code"]) == ("dw_plane", tile, "vec16")
        assert CONV.default_config(wl, AVX2)["algo"] == "dw_blocked"
    assert CONV.default_config(depthwise_wl(1, 32, 14, 14, k=3, s=2, p=1), AVX512)["algo"] == "dw_blocked"
    assert CONV.default_config(depthwise_wl(1, 32, 30, 30, k=3, s=3, p=1), AVX512)["algo"] == "dw_blocked"
    for wl in (depthwise_wl(1, 8, 12, 12, k=7, p=3), depthwise_wl(1, 8, 12, 12, s=2, d=3)):
        assert "dw_plane" not in next(k for k in CONV.space(wl).knobs if k.name == "algo").options
    wl = depthwise_wl(1, 8, 12, 12, s=2)
    with pytest.raises(ConfigError, match="dw_plane tiles"):
        CONV.space(wl).validate({**CONV.default_config(wl).to_json(), "algo": "dw_plane", "regtile": "4x16",
                                 "PB": 1, "tile_code": "slp"})


@pytest.mark.parametrize("wl", [
    conv_wl(1, 24, 12, 12, 16, k=1, s=1, p=0, epi=("res",)),            # 144 pixels: full tiles only
    conv_wl(1, 5, 7, 9, 13, k=1, s=1, p=0, epi=("res", "relu")),         # 63 pixels, 13 channels: edges too
    conv_wl(2, 16, 10, 10, 24, k=1, s=1, p=0, epi=("res", "relu")),
], ids=["full", "edges", "batch2"])
def test_1x1_residual_may_be_the_output_buffer(wl):
    """A 1x1 GEMM's residual Add with the residual input and the output one buffer (a memory plan
    may run it in place): every element's residual is read before its store overwrites it, on
    full tiles (through ct, unsigned indices) and edge tiles alike, both tile codes."""
    for code in ("slp", tile_codes()[1]):
        residual_as_output(wl, config(wl, algo="direct", vec="px", regtile="4x16", order="px_oc", OCB=1, PB=1,
                                      tile_code=code))


def residual_as_output(wl, cfg):
    """Run `cfg` with the residual input (input 3) and the output one buffer, against NumPy."""
    arrays = wl.random_inputs(0)
    want = wl.reference(arrays)
    shared = arrays[3].copy()
    arrays[3] = shared
    compile_kernel(CONV, wl, cfg).bind(arrays)(arrays, shared)
    np.testing.assert_allclose(shared, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("wl", [
    conv_wl(1, 3, 96, 96, 32, k=3, s=2, p=1, epi=("clip",)),        # MobileNet's stem
    conv_wl(2, 3, 17, 40, 24, k=3, s=1, p=1, epi=("relu",)),        # stride 1, batch 2, 40-pixel rows
    conv_wl(1, 1, 13, 21, 12, k=3, s=2, p=1, bias=False),           # one input plane, 4 channels a tile, no bias
    conv_wl(1, 4, 11, 9, 10, k=3, s=2, p=0),                        # no pads, 2 channels a tile, 4-pixel rows
    conv_wl(1, 2, 12, 35, 8, k=1, s=2, p=0, epi=("relu",)),         # 1x1/2
], ids=["stem", "s1-batch2", "one-plane", "unpadded", "1x1s2"])
def test_plane_stem_matches_numpy(wl):
    """algo plane (stems of 1-4 input channels): one `plane_taps` call per tile of output
    channels x 16 pixels over every input plane, read in place (no pad step), the pads as masked
    loads, partial tiles stored masked; offered on AVX-512 only."""
    cfg = CONV.space(wl, AVX512).validate({**CONV.default_config(wl, AVX512).to_json(), "algo": "plane",
                                           "vec": "px", "regtile": "1x16", "tile_code": "vec16", "KC": 0})
    lowered = CONV.lower(wl, cfg)
    assert "plane_taps(" in render(lowered.module) and [s.function for s in lowered.launch.steps] == ["conv"]
    check(CONV, wl, cfg)


def test_plane_is_the_avx512_default_for_3x3_stems_only():
    stem = conv_wl(1, 3, 224, 224, 32, k=3, s=2, p=1, epi=("clip",))
    assert CONV.default_config(stem, AVX512)["algo"] == "plane"
    assert CONV.default_config(stem, AVX2)["algo"] == "direct"
    assert "plane" not in next(k for k in CONV.space(stem, AVX2).knobs if k.name == "algo").options
    for wl in (conv_wl(1, 3, 224, 224, 64, k=7, s=2, p=3, epi=("relu",)),     # ResNet's stem: 1.2x slower
               conv_wl(1, 3, 32, 32, 16, k=3, s=2, p=1, epi=("res",)),         # an epilogue not in registers
               conv_wl(1, 8, 32, 32, 16, k=3, s=2, p=1),                       # more than 4 input channels
               conv_wl(1, 4, 32, 32, 8, k=3, s=2, p=1, g=2)):                  # groups
        assert "plane" not in next(k for k in CONV.space(wl, AVX512).knobs if k.name == "algo").options
        assert CONV.default_config(wl, AVX512)["algo"] != "plane"


@pytest.mark.parametrize("n, cin, h, w, cout, s, want", [
    (2, 16, 12, 20, 1, 1, ("direct", "px", "4x24")),    # paddle_det's score map: rows of 20, one channel
    (1, 64, 20, 20, 4, 1, ("direct", "px", "4x24")),
    (1, 32, 28, 28, 8, 1, ("direct", "px", "4x16")),    # 8 channels: two 4-channel rows of the tile
    (1, 64, 12, 12, 2, 1, ("direct", "px", "4x16")),    # rows of 12: the narrower pixel tile
    (1, 64, 24, 24, 4, 2, ("blocked", "oc", "6x16")),   # strided: the blocked kernel as before
    (1, 64, 28, 28, 24, 1, ("blocked", "oc", "4x24")),  # 24 channels: one 24-wide tile, no empty lanes
    (1, 40, 14, 14, 120, 1, ("blocked", "oc", "4x24")),
    (1, 32, 28, 28, 48, 1, ("blocked", "oc", "6x16")),  # 48 fills 16-wide tiles too
    (1, 64, 16, 16, 64, 1, ("winograd", "px", "6x16")),  # ResNet's channel counts: winograd (`WINOGRAD_DEFAULT`)
    (2, 12, 6, 8, 12, 1, ("blocked", "oc", "6x16")),    # rows under 14, 8-15 input channels (`SMALL_MAP_BLOCKED_CG`)
    (2, 12, 3, 4, 24, 1, ("blocked", "oc", "4x16")),    # a plane of 12 pixels: the small-plane tile first
    (1, 64, 3, 3, 4, 1, ("blocked", "oc", "4x16")),     # few channels on a plane under 16 pixels: blocked as before
    (1, 8, 28, 28, 16, 1, ("direct", "px", "4x16")),    # rows of 28: the direct kernel
])
def test_avx2_blocked_defaults_by_output_channels(n, cin, h, w, cout, s, want):
    """AVX2's untuned 3x3 convs by their output channels: into at most 8 (`BLOCKED_MIN_OC`), stride
    1, vectors along the pixels (`FEW_OC_PX_TILE`: 4 channels x 24 pixels up to 4 channels on rows of
    20 or more), where the blocked kernel's 16-channel vectors ran mostly empty; the blocked tile 4x24
    where it leaves fewer lanes empty than 6x16 (`BLOCKED_WIDE`); on rows under 14 pixels the blocked
    kernel from 8 input channels on (`SMALL_MAP_BLOCKED_CG`). AVX-512 keeps its own defaults.
    Each default computes what NumPy does."""
    wl = conv_wl(n, cin, h, w, cout, k=3, s=s, p=1, epi=("relu",))
    cfg = CONV.default_config(wl, AVX2)
    assert (cfg["algo"], cfg["vec"], cfg["regtile"], cfg["tile_code"]) == (*want, "vec8")
    assert CONV.space(wl, AVX2).validate(cfg) == cfg
    assert (CONV.default_config(wl, AVX512)["algo"] == "blocked") == (cin >= 16)
    check(CONV, wl, cfg)


def _winograd(wl, tile="4x24", target=None):
    code = tile_codes(target)[1]
    return CONV.space(wl, target).validate({**config(wl).to_json(), "algo": "winograd", "vec": "px", "regtile": tile,
                                            "tile_code": code, "order": "px_oc", "OCB": 2, "PB": 2, "KC": 0})


@pytest.mark.parametrize("wl, tile", [
    (conv_wl(1, 64, 16, 16, 64, epi=("relu",)), "4x24"),                   # even map: runs of 8 tiles, no remainder
    (conv_wl(2, 13, 11, 9, 21, epi=("res", "relu"), bias=False), "4x16"),  # odd rows and columns, batch 2, residual
    (conv_wl(1, 19, 7, 37, 17, epi=("clip",)), "6x16"),                    # ReLU6 by scalar inputs; runs + remainder
    (conv_wl(1, 8, 5, 6, 8, p=2, epi=("hardswish",)), "4x24"),              # pads of 2: a 7x8 output
    (conv_wl(1, 16, 12, 34, 24, p=0, epi=("chan",)), "8x16"),               # no pads; a per-channel scale
    (conv_wl(1, 32, 7, 7, 40, epi=("relu",)), "6x16"),                     # 16 tiles, one GEMM pixel tile, rows of 21
    (conv_wl(2, 24, 8, 8, 20, epi=("res",)), "4x24"),                      # 16 tiles under the 24 the tile computes
], ids=["even", "odd-batch2-res", "relu6", "pad2", "valid", "7x7", "8x8-edge"])
def test_winograd_matches_numpy(wl, tile):
    """algo winograd (F(2x2, 3x3)): weights transformed at prepare, the input transform
    (`wino_in_tiles`: runs moved left, or on past a narrow row), the plane GEMM over 16 groups on
    the tiles only (V's rows longer), the output transform (`wino_out_tiles`, odd maps' last row
    and column; a narrow map's whole runs through a workspace) and the epilogue; the tuner's own accuracy rule (a direct conv's tolerance) on its
    check inputs, the wide set included."""
    cfg = _winograd(wl, tile)
    lowered = CONV.lower(wl, cfg)
    oh, ow = wl.output_shape[2:]
    tiles, tw = -(-oh // 2) * -(-ow // 2), -(-ow // 2)
    gemm = lowered.launch.steps[1].body[1]
    row = {b.name: b.shape for b in lowered.launch.workspaces}["V"][2]
    lanes = int(cfg["tile_code"][3:])   # the transforms' vectors (vec8 or vec16, the host's)
    # rows aligned to 8 floats, or odd, and never planes a multiple of 4 KiB apart (the same cache sets)
    c, oc = wl.inputs[0]["shape"][1], wl.output_shape[1]
    assert (row % 8 == 0 or row % 2 == 1) and row * c % 1024 and row * oc % 1024
    assert gemm.args[-3].value == tiles and row >= tiles + max(0, lanes - tw)
    if tw < lanes:   # narrow maps: the output transform stores whole runs into Y's longer rows, then copies out
        th = -(-oh // 2)
        assert {b.name: b.shape for b in lowered.launch.workspaces}["Y"] == (1, wl.output_shape[1], 4 * th * lanes)
    assert [s.function for s in lowered.launch.prepare] == ["wino_w", "pack_w"]
    assert lowered.launch.functions() == ["wino_w", "pack_w", "pad", "wino_in", "conv", "wino_out"]
    assert lowered.launch.steps[1].count == wl.inputs[0]["shape"][0]   # transforms and GEMM per image
    src = render(lowered.module)
    assert "wino_in_tiles(" in src and "wino_out_tiles(" in src
    check(CONV, wl, cfg)


def test_winograd_avx512_vectors_match_numpy():
    """AVX-512's config (16-lane transforms and GEMM tile, its wide tile), run here as LLVM splits
    it for this CPU: runs of 16 tiles and the remainder."""
    wl = conv_wl(1, 20, 9, 41, 36, epi=("res", "relu"))
    cfg = _winograd(wl, "14x32", AVX512)
    assert cfg["tile_code"] == "vec16" and "wino_in_tiles(Xp, xo + 2 * ts, WP, V, vo + ts, C * P, 16, 0, 16)" \
        in render(CONV.lower(wl, cfg).module)
    check(CONV, wl, cfg)


def test_winograd_with_run_time_weights_and_the_residual_as_output_buffer():
    """Weights that are an input of the call (transformed and packed each call), and a residual
    input that is the output buffer itself (the tiles go to a workspace before the epilogue
    reads the residual)."""
    ops = [("Conv", ["i0", "i1", "i2"], {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 1,
                                         "kernel_shape": [3, 3]})]
    wl = make_wl(ops, [((1, 12, 10, 13), "float32", False), ((20, 12, 3, 3), "float32", False),
                       ((20,), "float32", True)])
    cfg = _winograd(wl, "4x16")
    assert [getattr(s, "function", None) for s in CONV.lower(wl, cfg).launch.steps][:2] == ["wino_w", "pack_w"]
    check(CONV, wl, cfg)
    wl = conv_wl(1, 24, 14, 15, 24, epi=("res", "relu"))
    residual_as_output(wl, _winograd(wl, "4x24"))


def test_winograd_is_offered_for_3x3_stride_1_convs_and_their_avx2_default():
    def algos(wl):
        return next(k for k in CONV.space(wl).knobs if k.name == "algo").options
    assert "winograd" in algos(conv_wl(1, 8, 9, 9, 8))
    for other in (conv_wl(1, 8, 9, 9, 8, s=2), conv_wl(1, 8, 9, 9, 8, d=2, p=2), conv_wl(1, 8, 9, 9, 8, k=5, p=2),
                  conv_wl(1, 8, 9, 9, 8, g=2), conv_wl(1, 8, 9, 9, 8, k=1, p=0)):
        assert "winograd" not in algos(other)
    with pytest.raises(ConfigError, match="vector-IR plane GEMM"):
        wl = conv_wl(1, 64, 16, 16, 64)
        CONV.space(wl).validate({**_winograd(wl).to_json(), "tile_code": "slp"})
    # the GEMM's tile: 4x24, or 6x16 where it computes 10 % fewer columns of the plane's tiles
    for (c, h, oc), algo in [((64, 56, 64), "winograd 4x24"), ((128, 28, 128), "winograd 4x24"),
                             ((512, 7, 512), "winograd 6x16"), ((256, 14, 256), "winograd 6x16"),
                             ((64, 14, 64), "winograd 6x16"), ((256, 7, 256), "winograd 6x16"),
                             ((128, 8, 128), "winograd 6x16"), ((64, 32, 96), "winograd 4x24"),
                             ((32, 56, 32), "blocked"), ((256, 4, 256), "blocked"), ((512, 2, 512), "blocked")]:
        cfg = CONV.default_config(conv_wl(1, c, h, h, oc, epi=("relu",)), AVX2)
        assert (cfg["algo"] + (f" {cfg['regtile']}" if cfg["algo"] == "winograd" else "")) == algo, (c, h, oc)
    assert CONV.default_config(conv_wl(1, 64, 56, 56, 64), AVX512)["algo"] == "blocked"   # not measured there
    # V's and M's rows: 32-byte aligned where the planes then avoid each other's cache sets, else odd
    from schedules.templates.conv2d import _plane_row
    assert [_plane_row(784, (64, 64)), _plane_row(196, (128, 128)), _plane_row(20, (64, 96)), _plane_row(50, (256, 256))] \
        == [792, 197, 24, 51]

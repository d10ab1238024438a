"""cuda_conv2d and cuda_pool under numba-cuda's simulator: the default config and a seeded
sample of configs match the NumPy reference on tiny shapes with remainders (both layouts,
strides, pads, dilations, groups, depthwise, fused epilogues), the spaces are pruned by the
device's limits, and `find_template(wl, "cuda")` picks these templates."""
from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

from codegen import compile_kernel, get_backend  # noqa: E402
from codegen.cuda import simulator  # noqa: E402
from ir import accuracy  # noqa: E402
from schedules import get_template, gpu  # noqa: E402
from schedules.registry import find_template  # noqa: E402
from tests.template_cases import conv_wl, make_wl  # noqa: E402
from tuner.measure import jobs  # noqa: E402

pytestmark = pytest.mark.skipif(not simulator(), reason="runs on numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")

CONV, POOL = get_template("cuda_conv2d"), get_template("cuda_pool")


def check(template, wl, cfg, arrays=None):
    """The tuner's correctness check, on the cuda backend: every input set (or `arrays`)."""
    be = get_backend("cuda")
    kernel = compile_kernel(template, wl, cfg, be)
    sets = [(arrays, accuracy.reference(wl, arrays))] if arrays is not None else jobs.reference_sets(wl, 0)
    wrong = jobs.check(kernel, wl, sets, accuracy.workload_reduction(wl), backend=be)
    assert wrong is None, f"{template.name} {cfg}: {wrong}"


def sample(template, wl, n, seed, most_threads=64, **fixed):
    """`n` seeded configs of the (pruned) space with small blocks: the simulator runs a thread
    as a Python thread."""
    cfgs = [c for c in template.space(wl) if template.resources(wl, c).threads <= most_threads
            and all(c[k] == v for k, v in fixed.items())]
    return random.Random(seed).sample(cfgs, n)


GEMM_CASES = [   # (conv_wl args, kwargs): remainders in pixels, channels and K everywhere
    ((1, 3, 5, 5, 4), dict(k=3, s=1, p=1, epi=("relu",))),
    ((1, 4, 7, 6, 5), dict(k=3, s=2, p=1, epi=("res", "relu"))),
    ((2, 5, 4, 5, 6), dict(k=1, s=1, p=0, bias=False)),
    ((1, 4, 7, 7, 4), dict(k=3, s=1, p=2, d=2, g=2, epi=("chan",))),
]


@pytest.mark.parametrize("case,layout,prefetch", [(0, "NCHW", True), (0, "NHWC", False), (1, "NCHW", False),
                                                   (1, "NHWC", True), (2, "NHWC", True), (3, "NCHW", False)])
def test_implicit_gemm_configs_match_numpy(case, layout, prefetch):
    args, kw = GEMM_CASES[case]
    wl = conv_wl(*args, **kw)
    assert find_template(wl, "cuda") is CONV
    for cfg in sample(CONV, wl, 1, seed=case, layout=layout, prefetch=prefetch):
        check(CONV, wl, cfg)


def test_blocks_with_more_threads_than_a_tile_has_elements():
    """256 threads, a 16x8 input tile (A) or a 8x16 weight tile (B): the threads past the tile's
    end load and store nothing."""
    wl = conv_wl(1, 3, 5, 5, 5, k=3, s=1, p=1, epi=("relu",))
    space = CONV.space(wl)
    for tiles in (dict(BM=16, BN=64, TM=2, TN=2), dict(BM=128, BN=16, TM=4, TN=2)):
        cfg = space.validate({**tiles, "BK": 8, "layout": "NCHW", "unroll": False, "prefetch": True})
        assert CONV.resources(wl, cfg).threads == 256
        check(CONV, wl, cfg)


def test_default_config_matches_numpy_and_fits_every_shape():
    wl = conv_wl(1, 3, 6, 5, 6, k=3, s=2, p=1, epi=("relu",))
    cfg = CONV.default_config(wl)
    check(CONV, wl, cfg)
    # the default depends only on the weights: another batch and image size, same config
    big = conv_wl(8, 3, 224, 224, 6, k=3, s=2, p=1, epi=("relu",))
    assert CONV.default_config(big) == cfg and CONV.space(big).allowed(cfg)


def test_depthwise_direct_kernel_matches_numpy():
    dw = conv_wl(2, 4, 5, 6, 4, k=3, s=2, p=1, g=4, epi=("relu",))
    mult = conv_wl(1, 3, 6, 5, 6, k=3, s=1, p=1, g=3, epi=("res",))    # two output channels per input channel
    for wl in (dw, mult):
        assert find_template(wl, "cuda") is CONV
        assert {k.name for k in CONV.space(wl).knobs} == {"threads", "opt", "unroll"}
        check(CONV, wl, CONV.default_config(wl))
        for cfg in sample(CONV, wl, 2, seed=3):
            check(CONV, wl, cfg)


def test_runtime_weights_and_a_broadcast_epilogue_input():
    """Weights that are an input (re-laid out on every call, into a workspace) and an Add of a
    [1, OC, 1, W] tensor (read by broadcast indexing, not copied)."""
    n, c, h, w, oc = 1, 3, 5, 5, 4
    ops = [("Conv", ["i0", "i1"], {"strides": [1, 1], "pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}),
           ("Add", ["t0", "i2"], {}), ("Relu", ["t1"], {})]
    wl = make_wl(ops, [((n, c, h, w), "float32", False), ((oc, c, 3, 3), "float32", False),
                       ((1, oc, 1, w), "float32", False)])
    assert CONV.matches(wl)
    lowered = CONV.lower(wl, CONV.default_config(wl))
    assert not lowered.launch.prepare and "Wt" in {b.name for b in lowered.launch.workspaces}
    for cfg in sample(CONV, wl, 1, seed=5, layout="NHWC"):
        check(CONV, wl, cfg)


def test_matches_exactly_what_the_cpu_conv2d_matches():
    cpu = get_template("conv2d")
    conv = [("Conv", ["i0", "i1"], {"kernel_shape": [3, 3], "pads": [1] * 4})]
    ins = [((1, 3, 5, 5), "float32", False), ((4, 3, 3, 3), "float32", True)]
    wls = [conv_wl(1, 3, 5, 5, 4, epi=("res", "relu")), conv_wl(1, 4, 5, 5, 4, g=4),
           make_wl(conv + [("Softmax", ["t0"], {"axis": 1})], ins),           # no fusable epilogue
           make_wl([("Conv", ["i0", "i1"], {"kernel_shape": [3]})], [((1, 3, 5), "float32", False),
                                                                    ((4, 3, 3), "float32", True)])]   # 1-D
    assert [CONV.matches(w) for w in wls] == [cpu.matches(w) for w in wls] == [True, True, False, False]


def test_kernels_stage_tiles_in_shared_memory_between_barriers():
    wl = conv_wl(1, 3, 5, 5, 4, k=3, s=1, p=1)
    cfg = CONV.space(wl).validate({**CONV.default_config(wl).to_json(), "layout": "NHWC"})
    src = get_backend("cuda").render(CONV.lower(wl, cfg).module)
    assert src.count("cuda.shared.array") == 3          # the transposition's tile, A and B tiles
    assert src.count("cuda.syncthreads()") == 3          # one in the transposition, two around the K slice
    launch = CONV.lower(wl, cfg).launch
    assert [s.function for s in launch.prepare] == ["pack_w"] and launch.packed[0].name == "Wt"
    assert all(s.grid and s.block for s in launch.steps)


def test_space_is_pruned_by_device_limits():
    """ResNet-18's 3x3 conv (64 channels, 56x56): configs over the threads, shared memory or
    register limits of the device (or under a warp) are never proposed; the default fits."""
    wl = conv_wl(1, 64, 56, 56, 64, k=3, s=1, p=1, epi=("relu",))
    space = CONV.space(wl)
    allowed = list(space)
    assert 0 < len(allowed) < len(space)
    lim = gpu.limits()
    for cfg in allowed:
        r = CONV.resources(wl, cfg)
        assert 32 <= r.threads <= lim.max_threads_per_block and r.shared_bytes <= lim.shared_per_block
    too_big = {"BM": 128, "BN": 128, "BK": 32, "TM": 2, "TN": 2, "layout": "NCHW", "unroll": True, "prefetch": True}
    assert space.why_invalid(too_big) and "threads per block" in space.why_invalid(too_big)
    # a device with 8 KiB of shared memory per block: the deep/wide tiles go, the default stays
    tight = gpu.constraint(CONV, wl, gpu.Limits(shared_per_block=8 << 10))
    assert "shared memory" in tight({**too_big, "TM": 8, "TN": 8})
    kept = [c for c in allowed if tight(c.to_json()) is None]
    assert 0 < len(kept) < len(allowed) and all(CONV.resources(wl, c).shared_bytes <= 8 << 10 for c in kept)
    assert space.allowed(CONV.default_config(wl)) and tight(CONV.default_config(wl).to_json()) is None
    assert CONV.resources(wl, CONV.default_config(wl)).flops == 2 * 56 * 56 * 64 * 64 * 9


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_configs_match_numpy(op):
    cases = [{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},          # ResNet's
             {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 0], "ceil_mode": 1,
              "dilations": [1, 2], "count_include_pad": 1}]
    for k, attrs in enumerate(cases):
        attrs = {a: v for a, v in attrs.items() if a != ("count_include_pad" if op == "MaxPool" else "dilations")}
        wl = make_wl([(op, ["i0"], attrs)], [((1, 3, 7, 6), "float32", False)])
        assert find_template(wl, "cuda") is POOL
        check(POOL, wl, POOL.default_config(wl))
        for cfg in sample(POOL, wl, 1, seed=k):
            check(POOL, wl, cfg)


def test_pool_space_and_what_it_does_not_match():
    wl = make_wl([("MaxPool", ["i0"], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})],
                 [((1, 64, 112, 112), "float32", False)])
    space = POOL.space(wl)
    assert len(list(space)) == len(space) == 24
    r = POOL.resources(wl, POOL.default_config(wl))
    assert r.threads == 256 and r.blocks == -(-64 * 56 * 56 // 256)
    glob = make_wl([("GlobalAveragePool", ["i0"], {})], [((1, 4, 3, 3), "float32", False)])
    assert not POOL.matches(glob)   # a reduction, as on the CPU
    x = np.zeros((1, 2, 4, 4), np.float32)
    storage = make_wl([("MaxPool", ["i0"], {"kernel_shape": [2, 2], "storage_order": 1})], [(x.shape, "float32", False)])
    assert not POOL.matches(storage) and not get_template("pool").matches(storage)

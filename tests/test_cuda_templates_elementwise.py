"""cuda_elementwise and cuda_reduce under numba-cuda's simulator: the default config and a
seeded sample of configs (small blocks) match NumPy on tiny shapes with remainders; configs
that exceed the device are pruned; `find_template(wl, "cuda")` picks them."""
from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

from codegen import compile_kernel, get_backend  # noqa: E402
from codegen.cuda import simulator  # noqa: E402
from ir import accuracy  # noqa: E402
from schedules import get_template, gpu  # noqa: E402
from schedules.launch import In  # noqa: E402
from schedules.registry import find_template  # noqa: E402
from schedules.space import ConfigError, ConfigSpace  # noqa: E402
from tests.template_cases import make_wl  # noqa: E402
from tuner.measure import jobs  # noqa: E402

pytestmark = pytest.mark.skipif(not simulator(), reason="runs on numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")

EW = get_template("cuda_elementwise")
RED = get_template("cuda_reduce")
RNG = np.random.default_rng(0)
SMALL = (32, 64)   # threads per block the simulator runs quickly (a Python thread each)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def check(template, wl, cfg, arrays=None):
    """The tuner's correctness check (`tuner.measure.jobs.check`), run on the cuda backend."""
    be = get_backend("cuda")
    kernel = compile_kernel(template, wl, cfg, be)
    sets = [(arrays, accuracy.reference(wl, arrays))] if arrays is not None else jobs.reference_sets(wl, 0)[:1]
    wrong = jobs.check(kernel, wl, sets, accuracy.workload_reduction(wl), backend=be)
    assert wrong is None, f"{template.name} {cfg}: {wrong}"
    return kernel


def sampled(template, wl, n: int, seed: int, **fixed):
    """n distinct configs of the space, drawn with `seed`, with threads per block from SMALL."""
    space, rng, out = template.space(wl), random.Random(seed), []
    for _ in range(20 * n):
        values = {**space.sample(rng).to_json(), "threads": rng.choice(SMALL), **fixed}
        cfg = space.validate(values)
        if cfg not in out:
            out.append(cfg)
        if len(out) == n:
            break
    return out


EW_CASES = {
    # (x + b) * s -> Relu, b broadcast over the last axis; 396 elements: more blocks than max_blocks=8
    "add_relu_chain": ([("Add", ["i0", "i1"], {}), ("Mul", ["t0", "i2"], {}), ("Relu", ["t1"], {})],
                       [((4, 9, 11), "float32", False), ((9, 1), "float32", True), ((), "float32", True)], None),
    "transpose": ([("Transpose", ["i0"], {"perm": [2, 0, 1]})], [((3, 5, 7), "float32", False)], None),
    # float -> int64 casts, int64 arithmetic, a bool mask, Where over int64 values
    "where_cast_int64_bool": ([("Cast", ["i0"], {"to": 7}), ("Add", ["t0", "i1"], {}), ("Greater", ["t1", "i2"], {}),
                               ("Where", ["t2", "t1", "i1"], {})],
                              [((3, 5, 7), "float32", False), ((7,), "int64", False), ((), "int64", True)],
                              lambda: [f32(3, 5, 7) * 4, RNG.integers(-3, 3, 7), np.int64(0)]),
    "mask_where": ([("Equal", ["i0", "i1"], {}), ("Where", ["t0", "i2", "i3"], {})],
                   [((2, 1, 5), "int64", False), ((), "int64", True), ((), "float32", True), ((2, 3, 5), "float32", False)],
                   lambda: [RNG.integers(0, 2, (2, 1, 5)), np.int64(0), np.float32(-np.inf), f32(2, 3, 5)]),
    "gather": ([("Gather", ["i0", "i1"], {"axis": 0})], [((10, 6), "float32", True), ((2, 3), "int64", False)],
               lambda: [f32(10, 6), np.array([[1, -2, 3], [0, 9, 4]])]),
    "resize_linear": ([("Resize", ["i0", "i1", "i2"], {"mode": "linear", "coordinate_transformation_mode": "half_pixel"})],
                      [((1, 2, 3, 4), "float32", False), ((8,), "float32", True), ((4,), "float32", True)],
                      lambda: [f32(1, 2, 3, 4), np.zeros(8, np.float32), np.array([1, 1, 2, 1.5], np.float32)]),
    # starts are data: a one-thread kernel clamps them into a workspace first
    "slice_data_starts": ([("Slice", ["i0", "i1", "i2", "i3"], {})],
                          [((9, 6), "float32", False), ((1,), "int64", False), ((1,), "int64", True), ((1,), "int64", True)],
                          lambda: [f32(9, 6), np.array([-4]), np.array([8]), np.array([0])]),
    # np.floor/ceil/rint have no numba-cuda implementation: device functions replace them
    "round_floor_ceil": ([("Round", ["i0"], {}), ("Floor", ["i0"], {}), ("Ceil", ["i0"], {}), ("Add", ["t0", "t1"], {}),
                          ("Sub", ["t3", "t2"], {})],
                         [((7,), "float32", False)],
                         lambda: [np.array([0.5, 1.5, 2.5, -0.5, -1.7, 2.2, 3e9], np.float32)]),
}


@pytest.mark.parametrize("name", sorted(EW_CASES))
def test_elementwise_default_and_sampled_configs_match_numpy(name):
    ops, ins, arrays = EW_CASES[name]
    arrays = arrays() if arrays else None
    wl = make_wl(ops, ins, arrays)
    assert EW.matches(wl) and find_template(wl, "cuda") is EW
    configs = [EW.default_config(wl)] + sampled(EW, wl, 2, seed=len(name))
    if name == "add_relu_chain":   # the grid-stride loop: 13 tiles of 32 elements on 8 blocks
        configs.append(EW.space(wl).validate({"vector": 1, "ept": 1, "threads": 32, "max_blocks": 8}))
    for cfg in configs:
        check(EW, wl, cfg, arrays)


def test_elementwise_kernel_is_coalesced_and_bounds_checked():
    ops, ins, _ = EW_CASES["add_relu_chain"]
    wl = make_wl(ops, ins)
    cfg = EW.space(wl).validate({"vector": 2, "ept": 2, "threads": 64, "max_blocks": 8})
    low = EW.lower(wl, cfg)
    (step,) = low.launch.steps
    assert step.grid == (2,) and step.block == (64,)   # 396 / (64 * 4) -> 2 blocks
    src = get_backend("cuda").render(low.module)
    assert "i = base + (1 * bs + tx) * 2 + 1" in src and src.count("if i < n:") == 4
    assert EW.resources(wl, cfg).blocks == 2


def softmax(shape, op="Softmax"):
    return make_wl([(op, ["i0"], {"axis": -1})], [(shape, "float32", False)])


def layernorm(b, s, h, scale_shape=None):
    return make_wl([("Add", ["i0", "i1"], {}), ("Add", ["t0", "i2"], {}),
                    ("LayerNormalization", ["t1", "i3", "i4"], {"axis": -1, "epsilon": 1e-5})],
                   [((b, s, h), "float32", False), ((s, h), "float32", True), ((h,), "float32", True),
                    (scale_shape or (h,), "float32", True), ((h,), "float32", True)])


RED_CASES = {
    "softmax": lambda: softmax((2, 150)),   # warp mode, cache 4: 128 columns kept in registers, 22 recomputed
    "logsoftmax": lambda: softmax((3, 5), "LogSoftmax"),
    "layernorm": lambda: layernorm(1, 3, 21),
    "reduce_mean_middle": lambda: make_wl([("ReduceMean", ["i0"], {"axes": [1], "keepdims": 1})],
                                          [((2, 5, 7), "float32", False)]),
    "reduce_max_last": lambda: make_wl([("ReduceMax", ["i0"], {"axes": [1, 2], "keepdims": 0})],
                                       [((3, 4, 10), "float32", False)]),
    "reduce_mean_rows": lambda: make_wl([("ReduceMean", ["i0"], {"axes": [-1], "keepdims": 1})],
                                        [((2, 33), "float32", False)]),
}


@pytest.mark.parametrize("name", sorted(RED_CASES))
def test_reduce_default_and_both_modes_match_numpy(name):
    wl = RED_CASES[name]()
    assert RED.matches(wl) and find_template(wl, "cuda") is RED
    # one block of 64 threads per row: two warps combine through shared memory
    configs = [RED.default_config(wl), RED.space(wl).validate({"mode": "block", "cache": 4, "threads": 64, "rows_per_block": 2})]
    configs += sampled(RED, wl, 1, seed=len(name), mode="warp")
    for cfg in configs:
        check(RED, wl, cfg)


def test_reduce_more_warps_than_rows_and_a_broadcast_prologue():
    """Warp mode with 4 warps per block over 3 rows (the 4th warp idles at no barrier); a
    LayerNorm prologue input broadcast along the middle axis is indexed, not materialized."""
    wl = make_wl([("Mul", ["i0", "i1"], {}), ("LayerNormalization", ["t0", "i2"], {"axis": -1})],
                 [((3, 2, 9), "float32", False), ((3, 1, 9), "float32", True), ((9,), "float32", True)])
    assert RED.matches(wl)
    check(RED, wl, RED.space(wl).validate({"mode": "warp", "cache": 8, "threads": 128, "rows_per_block": 1}))
    (step,) = RED.lower(wl, RED.default_config(wl)).launch.steps
    assert all(a.broadcast is None for a in step.args if isinstance(a, In))


def test_non_contiguous_reductions_are_not_matched():
    wl = make_wl([("ReduceSum", ["i0"], {"axes": [0, 2], "keepdims": 1})], [((2, 3, 4), "float32", False)])
    assert not RED.matches(wl)
    assert not RED.matches(make_wl([("Softmax", ["i0"], {"axis": 0})], [((3, 4), "float32", False)]))
    assert not EW.matches(make_wl([("Relu", ["i0"], {})], [((4,), "float16", False)]))


def test_configs_beyond_the_device_are_pruned_before_any_build():
    wl = softmax((4, 40))
    small = gpu.Limits(max_threads_per_block=256, shared_per_block=64)
    space = ConfigSpace(RED.space(wl).knobs, constraint=gpu.constraint(RED, wl, small))
    kept = list(space)
    assert kept and all(c["threads"] <= 256 and c["mode"] == "warp" for c in kept)   # block mode needs 132 B
    with pytest.raises(ConfigError, match="shared memory"):
        space.validate({"mode": "block", "cache": 0, "threads": 64, "rows_per_block": 1})
    ew = make_wl([("Relu", ["i0"], {})], [((5, 7), "float32", False)])
    few_regs = gpu.Limits(regs_per_block=64 * 32)
    space = ConfigSpace(EW.space(ew).knobs, constraint=gpu.constraint(EW, ew, few_regs))
    kept = list(space)
    assert 0 < len(kept) < len(space) and max(c["threads"] for c in kept) < 1024
    assert all(EW.resources(ew, c).regs_per_thread * c["threads"] <= 64 * 32 for c in kept)
    # the defaults fit the declared architecture every space is pruned for by default
    for wl in (softmax((2, 5)), layernorm(1, 2, 3), ew):
        t = find_template(wl, "cuda")
        t.space(wl).validate(t.default_config(wl))
        r = t.resources(wl, t.default_config(wl))
        assert r.blocks >= 1 and r.bytes_moved > 0 and r.flops > 0

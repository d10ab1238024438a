"""cuda_dense and cuda_batch_matmul under numba-cuda's simulator: the default config and
seeded samples of small-tile configs match NumPy on tiny shapes with remainders (fused
bias+relu, broadcast masks, dynamic batch); configs a device cannot launch are pruned;
the kernels stage tiles the way a real GPU needs (coalesced loads, barriers around the
staged tile)."""
from __future__ import annotations

import random

import pytest

pytest.importorskip("numba.cuda")

from codegen import compile_kernel, get_backend  # noqa: E402
from codegen.cuda import simulator  # noqa: E402
from ir import accuracy, import_onnx, make_workload, partition, simplify  # noqa: E402
from schedules import find_template, get_template  # noqa: E402
from schedules.loopnest import Assign, Call as Stmt, For  # noqa: E402
from schedules.space import ConfigError  # noqa: E402
from schedules.templates.cuda.dense import Tiling  # noqa: E402
from tests.helpers import dense_model  # noqa: E402
from tests.template_cases import make_wl  # noqa: E402
from tuner.measure import jobs  # noqa: E402

pytestmark = pytest.mark.skipif(not simulator(), reason="runs on numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")

DENSE, BMM = get_template("cuda_dense"), get_template("cuda_batch_matmul")


def dense_wl(m, k, n, epilogue=("bias", "relu"), dynamic_batch=False):
    g = simplify(import_onnx(dense_model(m, k, n, epilogue, dynamic_batch=dynamic_batch)))
    return make_workload(g, partition(g)[0], {"batch": m} if dynamic_batch else {})


def attention(b, h, m, k, n, sym=None):
    """scores = (q @ kT) / scale + mask[b, 1, 1, n]: the mask is broadcast over heads and rows."""
    return make_wl([("MatMul", ["i0", "i1"], {}), ("Div", ["t0", "i2"], {}), ("Add", ["t1", "i3"], {})],
                   [((b, h, m, k), "float32", False), ((b, h, k, n), "float32", False), ((), "float32", True),
                    ((b, 1, 1, n), "float32", False)], sym=sym)


def check(template, wl, cfg, seed=0):
    """The tuner's correctness check on the cuda backend, on one input set (the simulator is slow)."""
    kernel = compile_kernel(template, wl, cfg, "cuda")
    arrays = wl.random_inputs(seed)
    wrong = jobs.check(kernel, wl, [(arrays, accuracy.reference(wl, arrays))], accuracy.workload_reduction(wl),
                       backend=get_backend("cuda"))
    assert wrong is None, f"{template.name} {cfg}: {wrong}"
    return kernel


def small_configs(template, wl, n, seed):
    """n seeded samples of the space with tiles small enough for the simulator (<= 64 threads)."""
    space, rng, out = template.space(wl), random.Random(seed), []
    while len(out) < n:
        cfg = space.sample(rng)
        t = Tiling.of(cfg)
        if t.bm <= 32 and t.bn <= 32 and t.threads <= 64 and cfg not in out and space.allowed(cfg):
            out.append(cfg)
    return out


def test_find_template_picks_the_gpu_templates_by_kind():
    wl = dense_wl(5, 3, 7)   # onnx MatMul + Add + Relu with a constant weight
    assert find_template(wl, "cuda") is DENSE and find_template(wl).name == "dense"
    two_activations = make_wl([("MatMul", ["i0", "i1"], {})], [((2, 5, 4), "float32", False), ((2, 4, 3), "float32", False)])
    assert find_template(two_activations, "cuda") is BMM


@pytest.mark.parametrize("m, k, n, seed", [(5, 3, 7, 1), (19, 17, 23, 2), (13, 9, 16, 3)])
def test_dense_default_and_sampled_configs_match_numpy(m, k, n, seed):
    wl = dense_wl(m, k, n)
    for cfg in [DENSE.default_config(wl)] + small_configs(DENSE, wl, 1 if m < 19 else 2, seed):
        check(DENSE, wl, cfg)


def test_dense_without_epilogue_and_double_buffering_over_many_k_slices():
    wl = dense_wl(6, 17, 9, epilogue=())
    check(DENSE, wl, DENSE.space(wl).validate({"BM": 16, "BN": 16, "BK": 4, "TM": 1, "TN": 4, "vec": 2, "unroll": 2,
                                               "double": True, "WN": 4}))


def test_warp_tiles_map_threads_one_to_one_and_match_numpy():
    """WN < threads along N: warps of WN x 32/WN threads tile the block (each (tx, ty) once)."""
    wl = dense_wl(19, 5, 23)
    space = DENSE.space(wl)
    cfg = space.validate({"BM": 32, "BN": 32, "BK": 4, "TM": 4, "TN": 2, "vec": 1, "unroll": 4, "double": False,
                          "WN": 4})   # 16 x 8 threads, warps of 4 x 8
    t = Tiling.of(cfg)
    assert t.warp_tile == (32, 8)
    env_of = []
    for tid in range(t.threads):
        env = {"tid": tid}
        for a in t.thread_coords():
            env[a.target] = eval(a.value, {}, env)
        env_of.append((env["tx"], env["ty"]))
    assert sorted(env_of) == [(x, y) for x in range(t.tx) for y in range(t.ty)]
    assert {ty for tx, ty in env_of[:32]} == set(range(8)) and {tx for tx, ty in env_of[:32]} == set(range(4))
    check(DENSE, wl, cfg)
    with pytest.raises(ConfigError, match="wider than the block"):
        space.validate({**cfg.to_json(), "WN": 32})


def test_dynamic_batch_shares_one_compile_and_config():
    small, large = dense_wl(3, 11, 10, dynamic_batch=True), dense_wl(21, 11, 10, dynamic_batch=True)
    assert small.signature == large.signature and small.output_shape != large.output_shape
    cfg = DENSE.default_config(small)
    a, b = check(DENSE, small, cfg), check(DENSE, large, cfg)
    assert a.artifact.key == b.artifact.key   # sizes are run-time arguments, grids are per shape


def test_batch_matmul_broadcast_mask_default_and_samples():
    wl = attention(2, 1, 5, 9, 13)
    assert BMM.matches(wl)
    for cfg in [BMM.default_config(wl)] + small_configs(BMM, wl, 2, 4):
        check(BMM, wl, cfg)


def test_batch_matmul_broadcast_batch_dims_and_dynamic_batch():
    wl = make_wl([("MatMul", ["i0", "i1"], {})], [((3, 1, 5, 7), "float32", False), ((4, 7, 6), "float32", False)])
    check(BMM, wl, BMM.default_config(wl))
    dyn = attention(3, 2, 4, 3, 5, sym=[["b", 2, 4, 3], ["b", 2, 3, 5], [], ["b", 1, 1, 5]])
    assert dyn.signature == attention(1, 2, 4, 3, 5, sym=[["b", 2, 4, 3], ["b", 2, 3, 5], [], ["b", 1, 1, 5]]).signature
    check(BMM, dyn, small_configs(BMM, dyn, 1, 5)[0])


def test_configs_the_device_cannot_launch_are_pruned():
    wl = dense_wl(2048, 2048, 2048, epilogue=())
    space = DENSE.space(wl)
    base = {"BK": 8, "vec": 1, "unroll": 1, "double": False, "WN": 32}
    with pytest.raises(ConfigError, match="4096 threads per block"):
        space.validate({**base, "BM": 128, "BN": 128, "TM": 2, "TN": 2})
    with pytest.raises(ConfigError, match="bytes of shared memory"):
        space.validate({"BM": 128, "BN": 128, "BK": 32, "TM": 8, "TN": 8, "vec": 4, "unroll": 1, "double": True,
                        "WN": 16})
    with pytest.raises(ConfigError, match="exceeds the k slice"):
        space.validate({**base, "BM": 64, "BN": 64, "TM": 4, "TN": 4, "unroll": 16})
    kept = [Tiling.of(c) for c in space]
    assert 0 < len(kept) < len(space)
    assert all(t.threads <= 1024 and t.shared_bytes <= 48 << 10 and t.regs <= 255 and t.regs * t.threads <= 65536
               for t in kept)
    default = Tiling.of(DENSE.default_config(wl))
    assert (default.bm, default.bn, default.bk, default.tm, default.tn, default.double) == (64, 64, 8, 4, 4, True)
    assert DENSE.resources(wl, DENSE.default_config(wl)).blocks == 32 * 32


def _loop(body, var):
    return next(s for s in body if isinstance(s, For) and s.var == var)


def _values(body, names, tid):
    """The loop-invariant per-thread load indices, evaluated for one thread."""
    env = {"tid": tid}
    for s in body:
        if isinstance(s, Assign) and s.target in names:
            env[s.target] = eval(s.value, {}, env)
    return env


@pytest.mark.parametrize("vec", [1, 2, 4])
def test_kernels_stage_coalesced_tiles_between_barriers(vec):
    """Consecutive threads load consecutive addresses of a row of A and of B; the staged slice is
    multiplied between two barriers (one barrier per slice, after the multiply, when double-buffered)."""
    wl = dense_wl(64, 64, 64)
    space = DENSE.space(wl)
    for double in (False, True):
        cfg = space.validate({"BM": 64, "BN": 64, "BK": 8, "TM": 4, "TN": 4, "vec": vec, "unroll": 8, "double": double,
                              "WN": 16})
        body = DENSE.lower(wl, cfg).module.functions[0].body
        warp = [_values(body, ("ar0", "ac0", "br0", "bc0"), tid) for tid in range(32)]
        for side, col, width in (("a", "ac0", 8), ("b", "bc0", 64)):
            row = f"{side}r0"
            same_row = [(p, q) for p, q in zip(warp, warp[1:]) if p[row] == q[row]]
            assert same_row and all(q[col] - p[col] == vec for p, q in same_row)   # contiguous along the row
            assert {w[row] for w in warp} == set(range(-(-32 * vec // width)))       # and rows one after another
        kt = _loop(body, "kt").body
        syncs = [i for i, s in enumerate(kt) if isinstance(s, Stmt) and s.expr == "cuda.syncthreads()"]
        fmas = [i for i, s in enumerate(kt) if isinstance(s, Assign) and s.op == "+"]
        if double:
            assert syncs == [len(kt) - 1] and fmas
            assert any(isinstance(s, Stmt) and s.expr == "cuda.syncthreads()" for s in body[:body.index(_loop(body, "kt"))])
        else:
            assert len(syncs) == 2 and syncs[0] < min(fmas) and max(fmas) < syncs[1] == len(kt) - 1

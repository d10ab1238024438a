"""`codegen.vector_tile.tile_fma`, the register tile as LLVM vector IR, against NumPy: tile
shapes and vector widths, store and accumulate, element offsets and strides, K not a
multiple of anything (and 0); kernels calling it load from numba's cache in another process."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from codegen import get_backend
from codegen.build import CompileError
from ir.settings import Settings
from schedules.loopnest import Function, LoopModule, Param
from schedules.microkernel import vector_tile

ROOT = Path(__file__).resolve().parents[1]
ARGS = ("a0", "ak", "a_ks", "b_off", "b_ks", "n_k", "c_off", "c_rs", "acc")


def tile_module(mr: int, nr: int, lanes: int) -> LoopModule:
    """tile(A, B, C, a0, ak, a_ks, b_off, b_ks, n_k, c_off, c_rs, acc): rows a0 .. a0 + mr - 1 of
    A from column ak on (k steps of a_ks elements) times B (flat) into C (flat)."""
    call = vector_tile("A", [f"(a0 + {r}) * A.shape[1] + ak" for r in range(mr)], "a_ks", "B", "b_off", "b_ks",
                       "n_k", "C", "c_off", "c_rs", "acc", nr, lanes)
    params = (Param("A", "float32[:, ::1]"), Param("B", "float32[::1]"), Param("C", "float32[::1]")) \
        + tuple(Param(n, "int64") for n in ARGS[:-1]) + (Param("acc", "boolean"),)
    return LoopModule((Function("tile", params, (call,)),), doc=f"tile_fma {mr}x{nr} lanes {lanes}")


def expected(A, B, C, mr, nr, a0, ak, a_ks, b_off, b_ks, n_k, c_off, c_rs, acc):
    out = C.astype(np.float64)
    flat = A.reshape(-1).astype(np.float64)
    for r in range(mr):
        a = flat[(a0 + r) * A.shape[1] + ak + np.arange(n_k) * a_ks]
        b = np.stack([B[b_off + k * b_ks: b_off + k * b_ks + nr] for k in range(n_k)]) if n_k else np.zeros((0, nr))
        row = slice(c_off + r * c_rs, c_off + r * c_rs + nr)
        out[row] = (out[row] if acc else 0.0) + a @ b.astype(np.float64)
    return out


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    return get_backend("cpu", Settings(cache_dir=str(tmp_path_factory.mktemp("vector_tile"))))


@pytest.mark.parametrize("mr,nr,lanes", [(1, 8, 8), (3, 24, 8), (6, 16, 8), (2, 32, 16), (4, 12, 4)])
def test_tile_matches_numpy(backend, mr, nr, lanes):
    fn = backend.load(backend.compile(tile_module(mr, nr, lanes)))["tile"]
    rng = np.random.default_rng(mr * 100 + nr)
    A = rng.standard_normal((mr + 5, 41)).astype(np.float32)
    B = rng.standard_normal(nr * 60 + 37).astype(np.float32)
    cases = [  # a0, ak, a_ks, b_off, b_ks, n_k, c_off, c_rs, acc
        (0, 0, 1, 0, nr, 37, 0, nr, False),              # packed panel, odd K, stored
        (3, 5, 1, 3, nr + 5, 19, 7, nr + 3, True),       # offsets everywhere, padded strides, added
        (2, 40, -1, 0, nr, 23, 2, nr, True),             # A read backwards along k (a negative stride)
        (1, 0, 1, 0, nr, 0, 0, nr, False),               # no k at all: the tile stores zeros
        (1, 3, 1, 5, nr, 1, 1, nr + 1, True),            # one k, added
    ]
    for a0, ak, a_ks, b_off, b_ks, n_k, c_off, c_rs, acc in cases:
        C = rng.standard_normal(c_off + mr * c_rs + 4).astype(np.float32)
        want = expected(A, B, C, mr, nr, a0, ak, a_ks, b_off, b_ks, n_k, c_off, c_rs, acc)
        fn(A, B, C, a0, ak, a_ks, b_off, b_ks, n_k, c_off, c_rs, acc)
        assert np.allclose(C, want, rtol=1e-5, atol=1e-4), (a0, ak, a_ks, b_off, b_ks, n_k, c_off, c_rs, acc)


NEST = ("a0", "a_rs", "a_ks", "b_off", "b_ks", "n1", "sa1", "sb1", "n2", "sa2", "sb2", "n_k", "c_off", "c_rs")


def nest_module(mr: int, nr: int, lanes: int, levels: int) -> LoopModule:
    """tile(A, B, C, *NEST, acc): the nest form with `levels` outer loops (1 or 2) of run-time
    counts and strides around the k run; row r of the tile reads A from a0 + r * a_rs."""
    outer = ["(n1, sa1, sb1)", "(n2, sa2, sb2)"][:levels]
    call = vector_tile("A", [f"a0 + {r} * a_rs" for r in range(mr)], "a_ks", "B", "b_off", "b_ks",
                       f"({', '.join(outer)}, n_k)", "C", "c_off", "c_rs", "acc", nr, lanes)
    params = (Param("A", "float32[::1]"), Param("B", "float32[::1]"), Param("C", "float32[::1]")) \
        + tuple(Param(n, "int64") for n in NEST) + (Param("acc", "boolean"),)
    return LoopModule((Function("tile", params, (call,)),), doc=f"tile_fma nest {mr}x{nr} lanes {lanes} levels {levels}")


def nest_expected(A, B, C, mr, nr, a0, a_rs, a_ks, b_off, b_ks, n1, sa1, sb1, n2, sa2, sb2, n_k, c_off, c_rs, acc):
    out = C.astype(np.float64)
    for r in range(mr):
        total = np.zeros(nr)
        for j1 in range(n1):
            for j2 in range(n2):
                for k in range(n_k):
                    b = b_off + j1 * sb1 + j2 * sb2 + k * b_ks
                    total += float(A[a0 + r * a_rs + j1 * sa1 + j2 * sa2 + k * a_ks]) * B[b:b + nr].astype(np.float64)
        row = slice(c_off + r * c_rs, c_off + r * c_rs + nr)
        out[row] = (out[row] if acc else 0.0) + total
    return out


@pytest.mark.parametrize("mr,nr,lanes,levels", [(6, 16, 8, 2), (4, 24, 8, 1), (1, 8, 8, 2), (3, 32, 16, 2), (5, 12, 4, 1)])
def test_nest_form_matches_numpy(backend, mr, nr, lanes, levels):
    """Outer loops (run-time counts, zero included, strides of either sign) around the k run,
    stored or started from C, against a float64 sum of the same products."""
    fn = backend.load(backend.compile(nest_module(mr, nr, lanes, levels)))["tile"]
    rng = np.random.default_rng(mr * 1000 + nr + levels)
    A = rng.standard_normal(4000).astype(np.float32)
    B = rng.standard_normal(nr * 400 + 37).astype(np.float32)
    cases = [  # a0, a_rs, a_ks, b_off, b_ks, n1, sa1, sb1, n2, sa2, sb2, n_k, c_off, c_rs, acc
        (3, 7, 1, 5, nr, 3, 300, 30 * nr, 2, 50, 10 * nr, 9, 2, nr + 1, False),   # a conv's blocks x rows x run
        (11, 40, 1, 0, nr, 2, 97, 17 * nr, 3, 13, 5 * nr, 5, 0, nr, True),        # started from C
        (2000, -9, -1, nr * 200, -nr, 4, -211, -20 * nr, 1, 0, 0, 7, 3, nr, True),  # everything backwards
        (0, 1, 1, 0, nr, 0, 5, nr, 2, 1, nr, 3, 1, nr, False),                    # no outer iteration: zeros
        (0, 1, 1, 0, nr, 2, 5, nr, 2, 1, nr, 0, 1, nr, True),                     # no k: C unchanged
    ]
    for case in cases:
        a0, a_rs, a_ks, b_off, b_ks, n1, sa1, sb1, n2, sa2, sb2, n_k, c_off, c_rs, acc = case
        if levels == 1:
            n2, sa2, sb2 = 1, 0, 0
        args = (a0, a_rs, a_ks, b_off, b_ks, n1, sa1, sb1, n2, sa2, sb2, n_k, c_off, c_rs)
        C = rng.standard_normal(c_off + mr * c_rs + 4).astype(np.float32)
        want = nest_expected(A, B, C, mr, nr, *args, acc)
        fn(A, B, C, *args, acc)
        assert np.allclose(C, want, rtol=1e-5, atol=1e-4), case


def test_nest_form_segments_run_one_after_another(backend):
    """Innermost segments (a_offset, b_offset, count) inside an outer loop, as a strided conv's
    phase planes: the sum over the loop of each segment's run from its own offsets."""
    mr, nr = 3, 16
    call = vector_tile("A", ["0", "5", "11"], "1", "B", "2", str(nr), "((n1, 40, 9 * 16), ((0, 0, 4), (20, 64, 3), (33, 112, 2)))",
                       "C", "1", str(nr), "acc", nr, 8)
    params = (Param("A", "float32[::1]"), Param("B", "float32[::1]"), Param("C", "float32[::1]"),
              Param("n1", "int64"), Param("acc", "boolean"))
    fn = backend.load(backend.compile(LoopModule((Function("tile", params, (call,)),))))["tile"]
    rng = np.random.default_rng(7)
    A = rng.standard_normal(300).astype(np.float32)
    B = rng.standard_normal(2 + 4 * 9 * nr + nr).astype(np.float32)
    for n1, acc in ((4, False), (3, True), (0, True)):
        C = rng.standard_normal(1 + mr * nr).astype(np.float32)
        want = C.astype(np.float64)
        for r, a_row in enumerate((0, 5, 11)):
            total = np.zeros(nr)
            for j in range(n1):
                for a_seg, b_seg, n in ((0, 0, 4), (20, 64, 3), (33, 112, 2)):
                    for k in range(n):
                        b = 2 + j * 9 * nr + b_seg + k * nr
                        total += float(A[a_row + j * 40 + a_seg + k]) * B[b:b + nr].astype(np.float64)
            row = slice(1 + r * nr, 1 + (r + 1) * nr)
            want[row] = (want[row] if acc else 0.0) + total
        fn(A, B, C, n1, acc)
        assert np.allclose(C, want, rtol=1e-5, atol=1e-4), (n1, acc)


@pytest.mark.parametrize("mr,nr,lanes", [(14, 32, 16), (6, 16, 8), (3, 16, 16), (20, 16, 16), (5, 12, 4)])
def test_nest_form_column_major_tile_writes_its_rows_and_columns_only(backend, mr, nr, lanes):
    """C's tile column-major ((c_colstride, m, n) for c_rowstride: a conv's pixels x channels
    tile into NCHW channel rows): per LANES block one transpose; only rows < m and columns < n
    read (acc) and written, the elements around them (the next tile's, the next channel's) kept."""
    call = vector_tile("A", [f"a0 + {r * 3}" for r in range(mr)], "1", "B", "0", str(nr), f"((2, 5, {nr} * nk), nk)",
                       "C", "c_off", "(cs, m, n)", "acc", nr, lanes)
    params = (Param("A", "float32[::1]"), Param("B", "float32[::1]"), Param("C", "float32[::1]")) \
        + tuple(Param(n, "int64") for n in ("a0", "nk", "c_off", "cs", "m", "n")) + (Param("acc", "boolean"),)
    fn = backend.load(backend.compile(LoopModule((Function("tile", params, (call,)),))))["tile"]
    rng = np.random.default_rng(mr + nr)
    nk, a0, c_off, cs = 7, 2, 3, mr + 5
    A = rng.standard_normal(a0 + 3 * mr + 5 + nk).astype(np.float32)
    B = rng.standard_normal(2 * nr * nk).astype(np.float32)
    for m, n, acc in ((mr, nr, False), (mr, nr, True), (mr - 1, nr - 3, True), (1, 1, True), (0, nr, False)):
        C = rng.standard_normal(c_off + nr * cs + 8).astype(np.float32)
        want = C.astype(np.float64)
        for r in range(m):
            for c in range(n):
                total = sum(float(A[a0 + 3 * r + 5 * j + k]) * float(B[j * nr * nk + k * nr + c])
                            for j in range(2) for k in range(nk))
                want[c_off + c * cs + r] = (want[c_off + c * cs + r] if acc else 0.0) + total
        fn(A, B, C, a0, nk, c_off, cs, m, n, acc)
        assert np.allclose(C, want, rtol=1e-5, atol=1e-4), (m, n, acc)


def test_plain_form_has_no_column_major_tile(backend):
    call = vector_tile("A", ["0"], "1", "B", "0", "8", "3", "C", "0", "(8, 1, 8)", "False", 8, 8)
    params = (Param("A", "float32[::1]"), Param("B", "float32[::1]"), Param("C", "float32[::1]"))
    with pytest.raises(CompileError, match="tile_fma"):
        backend.compile(LoopModule((Function("tile", params, (call,)),)))


def test_nest_form_rejects_a_malformed_nest(backend):
    call = vector_tile("A", ["0", "1"], "1", "B", "0", "8", "((2, 1), 3)", "C", "0", "8", "False", 8, 8)
    params = (Param("A", "float32[::1]"), Param("B", "float32[::1]"), Param("C", "float32[::1]"))
    with pytest.raises(CompileError, match="tile_fma"):
        backend.compile(LoopModule((Function("tile", params, (call,)),)))


def test_tile_rejects_a_width_that_is_not_a_multiple_of_the_vector(backend):
    with pytest.raises(CompileError, match="tile_fma"):   # the message says why further down
        backend.compile(tile_module(2, 12, 8))


def test_source_names_the_helper_and_its_version_only_when_used(backend):
    from codegen.vector_tile import VERSION
    src = backend.render(tile_module(2, 8, 8))
    assert f"from codegen.vector_tile import tile_fma  # vector_tile v{VERSION}" in src
    plain = LoopModule((Function("nothing", (Param("x", "float32[::1]"),), ()),))
    assert "vector_tile" not in backend.render(plain)


def test_a_kernel_calling_the_tile_loads_in_another_process_without_compiling(tmp_path):
    backend = get_backend("cpu", Settings(cache_dir=str(tmp_path / "builder")))
    art = backend.compile(tile_module(2, 16, 8))
    assert not art.cached
    (tmp_path / "art.pkl").write_bytes(pickle.dumps(art))
    code = f"""
import json, pickle, numpy as np
from codegen import build, get_backend
from ir.settings import Settings
art = pickle.load(open({str(tmp_path / "art.pkl")!r}, "rb"))
backend = get_backend("cpu", Settings(cache_dir={str(tmp_path / "runner")!r}))
fn = backend.load(art)["tile"]
cm = build.load_parts(art.source, art.key, [build.Part(p["key"], p["source"], tuple(p["functions"]))
                                            for p in art.meta["parts"]], backend.settings)
A = np.ones((2, 3), np.float32); B = np.arange(48, dtype=np.float32); C = np.zeros(32, np.float32)
fn(A, B, C, 0, 0, 1, 0, 16, 3, 0, 16, False)
print(json.dumps({{"cached": cm.cached, "row": C[:16].tolist()}}))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NUMBA_CACHE_DIR", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {"cached": True, "row": [float(c + (c + 16) + (c + 32)) for c in range(16)]}


def test_cost_model_features_see_the_vector_tile_as_they_see_the_scalar_one():
    from schedules import get_template
    from tests.template_cases import make_wl
    from tuner.cost_model.features import loop_nest_features
    dense = get_template("dense")
    wl = make_wl([("MatMul", ["i0", "i1"], {})], [((5, 19), "float32", False), ((19, 37), "float32", True)])
    avx2 = {"vector_bits": 256, "vector_registers": 16}
    space = dense.space(wl, avx2)
    rows = {code: loop_nest_features(dense.lower(wl, space.validate({**dense.default_config(wl, avx2).to_json(),
                                                                     "regtile": "6x16", "tile_code": code})).module)
            for code in ("slp", "vec8")}
    assert rows["vec8"][:3] == rows["slp"][:3] == [pytest.approx(np.log2(96)), 22.0, pytest.approx(96 / 22)]


@pytest.mark.parametrize("cb,stride", [(8, 1), (16, 1), (8, 2), (16, 2), (8, 3)])
def test_regroup_channels_matches_numpy_and_leaves_the_rest(backend, cb, stride):
    """`regroup_channels`: CB channel rows of a flat NCHW plane (from an offset, a plane
    stride; every `stride`-th pixel: a strided conv's phase) into pixel-major CB-channel
    blocks; it moves all n pixels (a partial last group of CB included, fewer than CB pixels
    too), returns n and writes nothing past them."""
    from schedules.loopnest import Assign
    params = (Param("X", "float32[::1]"), Param("Y", "float32[::1]"), Param("R", "int64[::1]"),
              Param("xo", "int64"), Param("plane", "int64"), Param("yo", "int64"), Param("n", "int64"))
    body = (Assign("R[0]", f"regroup_channels(X, xo, plane, Y, yo, n, {cb}, {stride})"),)
    fn = backend.load(backend.compile(LoopModule((Function("regroup", params, body),))))["regroup"]
    rng = np.random.default_rng(cb * stride)
    plane = 53 * stride
    X = rng.standard_normal(cb * plane + 9 * stride).astype(np.float32)
    for xo, yo, n in ((0, 0, 53), (7, 5, 2 * cb), (2, 3, cb - 1), (1, 0, 1)):
        Y, R = np.full(yo + n * cb + 4, -7.0, np.float32), np.zeros(1, np.int64)
        fn(X, Y, R, xo, plane, yo, n)
        done = n
        assert R[0] == done
        want = X[xo + np.arange(cb)[None, :] * plane + stride * np.arange(done)[:, None]]   # [pixel, channel]
        np.testing.assert_array_equal(Y[yo:yo + done * cb].reshape(done, cb), want)
        assert (Y[:yo] == -7).all() and (Y[yo + done * cb:] == -7).all()


@pytest.mark.parametrize("mr,nr,lanes,k,dw,stride", [(4, 16, 16, 3, 1, 1), (2, 32, 16, 3, 1, 2), (3, 24, 8, 5, 2, 2),
                                                     (1, 8, 8, 3, 1, 3), (4, 8, 4, 1, 1, 1)])
def test_row_taps_matches_numpy_and_writes_only_its_tile(backend, mr, nr, lanes, k, dw, stride):
    """`row_taps`: MR rows x NR pixels of a depthwise window sum (bias first) from per-row
    offsets of a flat plane, dilation DW along a row, every `stride`-th pixel, clamped to [lo, hi];
    the C tile at an offset and row stride, nothing else written."""
    from schedules.loopnest import Call
    rows = ", ".join(f"x0 + {r} * xr * {stride}" for r in range(mr))
    call = Call(f"row_taps(X, ({rows},), xr, Wt, wo, bias, C, co, cr, lo, hi, {k}, {k}, {dw}, {stride}, {nr}, {lanes})")
    params = (Param("X", "float32[::1]"), Param("Wt", "float32[::1]"), Param("C", "float32[::1]"),
              Param("bias", "float32"), Param("lo", "float32"), Param("hi", "float32")) \
        + tuple(Param(n, "int64") for n in ("x0", "xr", "wo", "co", "cr"))
    fn = backend.load(backend.compile(LoopModule((Function("taps", params, (call,)),))))["taps"]
    rng = np.random.default_rng(mr * nr + k * stride)
    xr = nr * stride + (k - 1) * dw + 3                      # a row of the plane
    X = rng.standard_normal(xr * (mr * stride + k + 2)).astype(np.float32)
    Wt = rng.standard_normal(k * k + 5).astype(np.float32)
    x0, wo, co, cr, bias = 2, 5, 3, nr + 7, np.float32(0.25)
    want = np.full((mr, nr), bias, np.float64)
    for r in range(mr):
        for kh in range(k):
            for kw in range(k):
                at = x0 + r * xr * stride + kh * xr + kw * dw + stride * np.arange(nr)
                want[r] += Wt[wo + kh * k + kw] * X[at].astype(np.float64)
    written = np.zeros(co + mr * cr, bool)
    for r in range(mr):
        written[co + r * cr: co + r * cr + nr] = True
    for lo, hi in ((-np.inf, np.inf), (0.0, np.inf), (-0.5, 0.75)):   # none, Relu, a Clip
        C = np.full(co + mr * cr, -7.0, np.float32)
        fn(X, Wt, C, bias, np.float32(lo), np.float32(hi), x0, xr, wo, co, cr)
        tile = np.stack([C[co + r * cr: co + r * cr + nr] for r in range(mr)])
        np.testing.assert_allclose(tile, np.clip(want, lo, hi), rtol=1e-5, atol=1e-5)
        assert (C[~written] == -7).all()


@pytest.mark.parametrize("tp,cb,kh,kw,dw", [(8, 8, 3, 3, 1), (4, 8, 5, 5, 1), (7, 16, 3, 3, 1), (8, 16, 3, 3, 2),
                                         (1, 8, 1, 1, 1), (3, 4, 3, 2, 1)])
def test_block_taps_matches_numpy_and_writes_only_its_tile(backend, tp, cb, kh, kw, dw):
    """`block_taps`: TP pixels x CB channels of a depthwise window sum over a channel-blocked
    buffer (pixel-major blocks of CB channels; per-pixel window offsets, a row stride for
    kernel rows, dilation DW), the bias vector first, clamped to [lo, hi] and optionally
    HardSwish; stored transposed as CB runs of TP pixels a channel stride apart, nothing else
    written."""
    from schedules.loopnest import Call
    offsets = ", ".join(f"x0 + {p} * xs" for p in range(tp))
    params = (Param("X", "float32[::1]"), Param("Wt", "float32[::1]"), Param("B", "float32[::1]"),
              Param("C", "float32[::1]"), Param("lo", "float32"), Param("hi", "float32")) \
        + tuple(Param(n, "int64") for n in ("x0", "xs", "xr", "wo", "bo", "co", "cs"))
    fns = {}
    for swish in (0, 1):
        call = Call(f"block_taps(X, ({offsets},), xr, Wt, wo, B, bo, C, co, cs, lo, hi, {kh}, {kw}, {dw}, {cb}, {swish})")
        fns[swish] = backend.load(backend.compile(LoopModule((Function("taps", params, (call,)),))))["taps"]
    rng = np.random.default_rng(tp * cb + kh * kw)
    xs = 2 * cb                                           # stride 2: pixels two blocks apart
    xr = (tp * 2 + (kw - 1) * dw + 3) * cb                # a row of blocks
    X = rng.standard_normal(xr * (kh + 2)).astype(np.float32)
    Wt = rng.standard_normal(kh * kw * cb + 11).astype(np.float32)
    B = rng.standard_normal(cb + 9).astype(np.float32)
    x0, wo, bo, co, cs = 5, 3, 2, 4, tp + 6
    want = np.tile(B[bo:bo + cb].astype(np.float64), (tp, 1))            # [pixel, channel]
    for p in range(tp):
        for i in range(kh):
            for j in range(kw):
                at = x0 + p * xs + i * xr + j * dw * cb
                want[p] += Wt[wo + (i * kw + j) * cb: wo + (i * kw + j + 1) * cb] * X[at:at + cb].astype(np.float64)
    written = np.zeros(co + cb * cs, bool)
    for q in range(cb):
        written[co + q * cs: co + q * cs + tp] = True
    for swish, lo, hi in ((0, -np.inf, np.inf), (0, 0.0, np.inf), (0, -0.5, 0.75), (1, -np.inf, np.inf)):
        C = np.full(co + cb * cs, -7.0, np.float32)
        fns[swish](X, Wt, B, C, np.float32(lo), np.float32(hi), x0, xs, xr, wo, bo, co, cs)
        v = np.clip(want, lo, hi)
        if swish:
            v = v * np.clip(v / 6 + 0.5, 0, 1)
        tile = np.stack([C[co + q * cs: co + q * cs + tp] for q in range(cb)])   # [channel, pixel]
        np.testing.assert_allclose(tile, v.T, rtol=1e-5, atol=1e-5)
        assert (C[~written] == -7).all()


@pytest.mark.parametrize("mr,nr,lanes", [(4, 24, 8), (1, 8, 8), (3, 32, 16), (2, 12, 4)])
def test_residual_rows_matches_numpy_in_place_too(backend, mr, nr, lanes):
    """`residual_rows`: C's MR rows of NR = A's + a bias per row + R's, at offsets and row
    strides of their own, nothing else written; R may be C itself at the same offsets (each
    row's loads come before its stores)."""
    from schedules.loopnest import Call
    call = Call(f"residual_rows(C, co, cr, A, ao, ar, R, ro, rr, B, bo, {mr}, {nr}, {lanes})")
    params = (Param("C", "float32[::1]"), Param("A", "float32[::1]"), Param("R", "float32[::1]"),
              Param("B", "float32[::1]")) + tuple(Param(n, "int64") for n in ("co", "cr", "ao", "ar", "ro", "rr", "bo"))
    fn = backend.load(backend.compile(LoopModule((Function("rows", params, (call,)),))))["rows"]
    rng = np.random.default_rng(mr * nr)
    A, B = rng.standard_normal(mr * (nr + 5) + 7).astype(np.float32), rng.standard_normal(mr + 4).astype(np.float32)
    R = rng.standard_normal(mr * (nr + 9) + 3).astype(np.float32)
    ao, ar, ro, rr, bo, co, cr = 7, nr + 5, 3, nr + 9, 4, 2, nr + 3

    def expect(res, ro, rr):
        return np.stack([A[ao + r * ar: ao + r * ar + nr] + B[bo + r] + res[ro + r * rr: ro + r * rr + nr]
                         for r in range(mr)])
    C = np.full(co + mr * cr, -7.0, np.float32)
    fn(C, A, R, B, co, cr, ao, ar, ro, rr, bo)
    written = np.zeros(C.size, bool)
    for r in range(mr):
        written[co + r * cr: co + r * cr + nr] = True
    np.testing.assert_allclose(np.stack([C[co + r * cr: co + r * cr + nr] for r in range(mr)]), expect(R, ro, rr),
                               rtol=1e-6)
    assert (C[~written] == -7).all()
    C = rng.standard_normal(co + mr * cr).astype(np.float32)          # in place: the residual is C itself
    want = expect(C.copy(), co, cr)
    fn(C, A, C, B, co, cr, ao, ar, co, cr, bo)
    np.testing.assert_allclose(np.stack([C[co + r * cr: co + r * cr + nr] for r in range(mr)]), want, rtol=1e-6)


@pytest.mark.parametrize("mr,sh,k,dh,sw,nr,lanes,ci,mo", [
    (4, 2, 3, 1, 2, 32, 16, 1, 1), (2, 2, 3, 1, 2, 16, 16, 1, 1), (3, 2, 5, 1, 2, 32, 16, 1, 1),
    (2, 1, 3, 2, 2, 16, 8, 1, 1), (4, 2, 3, 1, 2, 16, 8, 1, 1), (1, 2, 1, 1, 2, 8, 4, 1, 1),
    (4, 1, 3, 1, 1, 32, 16, 1, 1), (2, 1, 5, 1, 1, 16, 16, 1, 1), (3, 2, 3, 2, 1, 8, 8, 1, 1),
    (2, 1, 3, 1, 3, 16, 8, 1, 1),
    (1, 2, 3, 1, 2, 32, 16, 3, 8), (2, 2, 7, 1, 2, 16, 16, 3, 4), (2, 1, 3, 1, 1, 16, 8, 2, 3)])
def test_plane_taps_matches_numpy_and_writes_only_its_tile(backend, mr, sh, k, dh, sw, nr, lanes, ci, mo):
    """`plane_taps`: MO output channels x MR rows x NR pixels (stride 1, 2 or 3 along the rows) over
    CI input planes, read straight from the unpadded planes: window rows and columns outside a
    plane (the pads, on every side) count as zeros and are never read; a bias per output
    channel; only the first n_rows x n_cols of each channel's tile are written."""
    dwc = 2 if (sw, k) == (1, 3) and mr == 3 else 1   # one case dilated along the rows too
    from schedules.loopnest import Call
    call = Call(f"plane_taps(X, xo, W, xc, h0, H, W, j0, Wt, wo, wc, B, bo, C, co, cr, cc, nrow, ncol, lo, hi, "
                f"{mr}, {sh}, {k}, {k}, {dh}, {dwc}, {sw}, {ci}, {mo}, {nr}, {lanes})")
    params = (Param("X", "float32[::1]"), Param("Wt", "float32[::1]"), Param("B", "float32[::1]"),
              Param("C", "float32[::1]"), Param("lo", "float32"), Param("hi", "float32")) \
        + tuple(Param(n, "int64") for n in ("xo", "xc", "h0", "H", "W", "j0", "wo", "wc", "bo", "co", "cr", "cc",
                                            "nrow", "ncol"))
    fn = backend.load(backend.compile(LoopModule((Function("taps", params, (call,)),))))["taps"]
    rng = np.random.default_rng(mr * nr + k * sh + sw + ci)
    wo, bo, co, cr = 5, 2, 3, nr + 7
    wc = ci * k * k + 1                       # an output channel's weights, then one unused
    cc = mr * cr + 4                          # an output channel's tile, then a gap
    Wt = rng.standard_normal(wo + mo * wc).astype(np.float32)
    B = rng.standard_normal(bo + mo).astype(np.float32)
    for H, W, h0, j0 in ((2 * mr + 4, 2 * nr, -1, -1), (7, 7, 4, -2), (12, 2 * nr + 9, 3, 10), (5, 30, -3, 20)):
        xo, xc = 11, H * W + 6
        X = rng.standard_normal(xo + ci * xc).astype(np.float32)
        planes = [np.pad(X[xo + c * xc: xo + c * xc + H * W].reshape(H, W).astype(np.float64), 120) for c in range(ci)]
        want = np.zeros((mo, mr, nr), np.float64) + B[bo:bo + mo, None, None]
        for o in range(mo):
            for c in range(ci):
                for r in range(mr):
                    for kh in range(k):
                        for kw in range(k):
                            want[o, r] += Wt[wo + o * wc + (c * k + kh) * k + kw] * \
                                planes[c][120 + h0 + r * sh + kh * dh, 120 + j0 + kw * dwc + sw * np.arange(nr)]
        for nrow, ncol, (lo, hi) in ((mr, nr, (-np.inf, np.inf)), (mr - 1 or 1, nr - 3, (0.0, np.inf)),
                                     (1, 1, (-0.5, 0.75))):
            C = np.full(co + mo * cc, -7.0, np.float32)
            fn(X, Wt, B, C, np.float32(lo), np.float32(hi), xo, xc, h0, H, W, j0, wo, wc, bo, co, cr, cc, nrow, ncol)
            written = np.zeros(C.size, bool)
            for o in range(mo):
                tile = np.stack([C[co + o * cc + r * cr: co + o * cc + r * cr + nr] for r in range(mr)])
                np.testing.assert_allclose(tile[:nrow, :ncol], np.clip(want[o], lo, hi)[:nrow, :ncol],
                                           rtol=1e-5, atol=1e-5)
                for r in range(nrow):
                    written[co + o * cc + r * cr: co + o * cc + r * cr + ncol] = True
            assert (C[~written] == -7).all()


BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)   # F(2x2, 3x3)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)


@pytest.mark.parametrize("lanes, count", [(8, 8), (4, 4), (16, 16), (8, 5), (16, 1)])
def test_wino_in_tiles_matches_numpy(backend, lanes, count):
    """`wino_in_tiles`: per ROW of B^T d, the first `count` of LANES tiles' 4x4 windows (columns
    2u .. 2u + 3 of four rows) into V's four planes 4 ROW + j at their offset; nothing else written."""
    from schedules.loopnest import Call
    body = tuple(Call(f"wino_in_tiles(X, xo, xr, V, vo, vp, n, {row}, {lanes})") for row in range(4))
    params = (Param("X", "float32[::1]"), Param("V", "float32[::1]")) + tuple(
        Param(n, "int64") for n in ("xo", "xr", "vo", "vp", "n"))
    fn = backend.load(backend.compile(LoopModule((Function("tiles", params, body),))))["tiles"]
    rng = np.random.default_rng(lanes)
    xo, xr, vo, vp = 3, 2 * lanes + 7, 5, lanes + 3
    X = rng.standard_normal(xo + 4 * xr).astype(np.float32)
    V = np.full(vo + 16 * vp, -7.0, np.float32)
    fn(X, V, xo, xr, vo, vp, count)
    rows = np.stack([X[xo + i * xr: xo + i * xr + 2 * lanes + 2] for i in range(4)]).astype(np.float64)
    written = np.zeros(V.size, bool)
    for u in range(count):
        want = BT @ rows[:, 2 * u: 2 * u + 4] @ BT.T
        for xi in range(16):
            assert V[vo + xi * vp + u] == pytest.approx(want[xi // 4, xi % 4], abs=1e-5)
            written[vo + xi * vp + u] = True
    assert (V[~written] == -7).all()


@pytest.mark.parametrize("lanes, rows, count", [(8, 2, 16), (8, 1, 16), (4, 2, 8), (16, 1, 32), (8, 2, 11), (8, 1, 4),
                                               (16, 2, 1)])
def test_wino_out_tiles_matches_numpy(backend, lanes, rows, count):
    """`wino_out_tiles`: LANES tiles' A^T m A + bias as ROWS output rows of their first `count`
    of 2 LANES pixels (each tile's two columns side by side); nothing else written, nothing read
    past the tiles a partial run stores (M is cut short there)."""
    from schedules.loopnest import Call
    call = Call(f"wino_out_tiles(M, mo, mp, B, bo, O, oo, orow, n, {rows}, {lanes})")
    params = (Param("M", "float32[::1]"), Param("B", "float32[::1]"), Param("O", "float32[::1]")) + tuple(
        Param(n, "int64") for n in ("mo", "mp", "bo", "oo", "orow", "n"))
    fn = backend.load(backend.compile(LoopModule((Function("tiles", params, (call,)),))))["tiles"]
    rng = np.random.default_rng(lanes + rows)
    mo, mp, bo, oo, orow = 2, lanes + 5, 1, 4, 2 * lanes + 3
    used = (count + 1) // 2   # tiles with a pixel to store
    M, B = rng.standard_normal(mo + 15 * mp + used).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    O = np.full(oo + 2 * orow, -7.0, np.float32)
    fn(M, B, O, mo, mp, bo, oo, orow, count)
    written = np.zeros(O.size, bool)
    for u in range(used):
        m = np.array([M[mo + xi * mp + u] for xi in range(16)], np.float64).reshape(4, 4)
        want = AT @ m @ AT.T + B[bo]
        for k in range(rows):
            for c in range(2 if 2 * u + 1 < count else 1):
                assert O[oo + k * orow + 2 * u + c] == pytest.approx(want[k, c], abs=1e-5)
                written[oo + k * orow + 2 * u + c] = True
    assert (O[~written] == -7).all()

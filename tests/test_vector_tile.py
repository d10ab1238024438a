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

"""The dense template: every config computes the right answer on odd shapes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codegen import cache_dir, compile_kernel
from ir import import_onnx, make_workload, partition, simplify
from schedules import get_template
from schedules.space import ConfigError
from tests.helpers import dense_model
from tests.template_cases import check as template_check
from tuner.measure import LocalBuilder, MeasureInput

DENSE = get_template("dense")


def workload(m, k, n, epilogue=("bias", "relu")):
    g = simplify(import_onnx(dense_model(m, k, n, epilogue)))
    sgs = partition(g)
    assert len(sgs) == 1
    return make_workload(g, sgs[0], {})


def check(wl, cfg, seed=0):
    template_check(DENSE, wl, cfg, seed=seed)


@pytest.fixture(scope="module")
def compiled_code_shapes():
    """Compile every code shape of the space once, in parallel worker processes;
    configs that differ only in run-time knobs then load from the kernel cache."""
    wl = workload(37, 19, 53)
    space = DENSE.space(wl)
    reps = {}
    for cfg in space:
        reps.setdefault(space.code_key(cfg), cfg)
    builder = LocalBuilder(timeout=600)
    try:
        results = builder.build([MeasureInput(wl, "dense", c) for c in reps.values()])
    finally:
        builder.close()
    assert all(r.status == "ok" for r in results), [r.error for r in results if r.status != "ok"]
    return len(reps)


def test_space_has_the_knobs_the_issue_asks_for():
    space = DENSE.space(workload(32, 256, 256))
    names = {k.name for k in space.knobs}
    assert {"MB", "NB", "KB", "order", "parallel", "regtile", "tile_code"} <= names
    code = {k.name for k in space.knobs if k.code_shape}
    assert code == {"regtile", "order", "tile_code"}  # block sizes and threading are run-time arguments
    assert len(space) > 1000


def test_configs_recorded_before_tile_code_read_back_as_slp():
    """Records and plans made before the vector-IR tile existed stay valid: they ran as slp."""
    space = DENSE.space(workload(32, 256, 256))
    old = {"regtile": "4x16", "order": "ji", "parallel": False, "MB": 2, "NB": 2, "KB": 32}
    assert space.validate(old)["tile_code"] == "slp"
    with pytest.raises(Exception, match="missing knobs"):
        space.validate({k: v for k, v in old.items() if k != "order"})   # other knobs have no such value


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), m=st.sampled_from([1, 2, 7, 37, 64]), k=st.sampled_from([1, 5, 19, 64]),
       n=st.sampled_from([1, 3, 53, 70]))
def test_every_config_matches_numpy_on_odd_shapes(compiled_code_shapes, data, m, k, n):
    wl = workload(m, k, n)
    space = DENSE.space(wl)
    index = data.draw(st.integers(0, len(space) - 1))
    check(wl, space.get(index))


def test_all_code_shapes_on_one_odd_shape(compiled_code_shapes):
    wl = workload(37, 19, 53)
    space = DENSE.space(wl)
    seen = set()
    for cfg in space:
        if space.code_key(cfg) not in seen:
            seen.add(space.code_key(cfg))
            check(wl, cfg)
    assert len(seen) == compiled_code_shapes


@pytest.mark.parametrize("epilogue", [(), ("residual",), ("bias", "sigmoid"), ("residual", "relu")])
def test_epilogue_modes(epilogue):
    wl = workload(9, 33, 17, epilogue)
    check(wl, DENSE.default_config(wl))


def test_batched_activation_is_flattened():
    """A[b, s, K] @ W[K, N]: leading dims flatten into M (transformer dense layers)."""
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(1).standard_normal((24, 40)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5, 24])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5, 40])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    graph = simplify(import_onnx(model))
    wl = make_workload(graph, partition(graph)[0], {})
    assert DENSE.matches(wl)
    check(wl, DENSE.default_config(wl))


def test_generated_source_is_kept_and_readable():
    wl = workload(8, 8, 8)
    k = compile_kernel(DENSE, wl, DENSE.default_config(wl))
    assert "def blocks(" in k.source and "tile_fma(" in k.source  # the register tile as vector IR
    slp = compile_kernel(DENSE, wl, DENSE.space(wl).validate({**DENSE.default_config(wl).to_json(),
                                                               "regtile": "4x16", "tile_code": "slp"}))
    assert "c3_15 += a3 * b15" in slp.source and "tile_fma" not in slp.source  # 4x16 scalar tile
    assert (cache_dir() / f"k_{k.artifact.key}.py").read_text() == k.source


def test_run_time_knobs_share_one_compile():
    wl = workload(16, 16, 16)
    space = DENSE.space(wl)
    base = DENSE.default_config(wl)
    other = space.validate({**base.to_json(), "MB": 1, "NB": 32, "parallel": False})
    a, b = compile_kernel(DENSE, wl, base), compile_kernel(DENSE, wl, other)
    assert a.artifact.key == b.artifact.key


AVX2 = {"vector_bits": 256, "vector_registers": 16}
AVX512 = {"vector_bits": 512, "vector_registers": 32}
AVX512_YMM = {"vector_bits": 256, "vector_registers": 32}   # prefer-256-bit kept


@pytest.mark.parametrize("target,lanes,regs", [(AVX2, 8, 16), (AVX512, 16, 32), (AVX512_YMM, 8, 32)])
def test_register_tiles_follow_the_targets_vectors(target, lanes, regs):
    """Tiles are whole vectors wide and fit the register file: accumulators + B vectors +
    one broadcast A within the registers, with at most a few spilled on AVX2's 16."""
    wl = workload(32, 256, 256)
    for t in (DENSE, get_template("batch_matmul")):
        tiles = [v for v in t.space(wl, target).knobs[0].options if v != "blas"]
        for tile in tiles:
            mr, nr = (int(x) for x in tile.split("x"))
            assert nr % lanes == 0, (t.name, tile, target)
            assert mr * nr // lanes <= (28 if regs == 32 else 16), (t.name, tile, target)
        assert t.default_config(wl, target)["regtile"] in tiles
    wide = [v for v in DENSE.space(wl, AVX512).knobs[0].options if v != "blas"]
    assert max(int(v.split("x")[0]) * int(v.split("x")[1]) // 16 for v in wide) >= 24   # the issue's ~28


def test_space_defaults_to_this_machines_target():
    from codegen import host_target
    t = host_target()
    wl = workload(32, 256, 256)
    assert DENSE.space(wl).knobs[0].options == DENSE.space(wl, t).knobs[0].options
    assert DENSE.space(wl, t.describe()).knobs[0].options == DENSE.space(wl, t).knobs[0].options   # a record's dict
    assert t.vector_bits in (128, 256, 512) and t.vector_registers in (16, 32)
    if "avx512f" in t.features.split(","):
        assert t.vector_registers == 32
    elif "avx" in t.features.split(","):
        assert (t.vector_bits, t.vector_registers) == (256, 16)


def _avx512_features() -> str:
    import llvmlite.binding as ll
    feats = ll.get_host_cpu_features()
    for f in ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"):
        feats[f] = True
    return feats.flatten()


@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"), reason="x86 CPU models")
def test_vector_width_probe_sees_prefer_256_bit():
    """LLVM's Intel AVX-512 models keep vectors at 256 bits unless prefer-256-bit is off (the
    probe compiles for a CPU model, it need not be this one); AMD's znver4 does not."""
    from codegen.cpu import _vector_width
    f = _avx512_features()
    assert _vector_width("sapphirerapids", f) == (256, 32)
    assert _vector_width("sapphirerapids", f + ",-prefer-256-bit") == (512, 32)
    assert _vector_width("znver4", f) == (512, 32)
    assert _vector_width("haswell", "+avx,+avx2,+fma,+sse4.2")[0] == 256


@pytest.mark.parametrize("tile", ["4x48", "12x16"])
def test_avx512_tiles_compute_the_right_answer_here(tile):
    """AVX-512 tiles are ordinary code: correct on any CPU (only slower without its registers)."""
    wl = workload(37, 19, 53)
    space = DENSE.space(wl, AVX512)
    base = DENSE.default_config(wl, AVX512).to_json()
    for order, kb in (("ij", 16), ("ji", 1 << 30)):
        cfg = space.validate({**base, "regtile": tile, "order": order, "KB": min(space.knobs[5].options, key=lambda v: abs(v - kb))})
        check(wl, cfg)


def test_few_rows_take_the_gemv_tiles():
    """A classifier head or a decoder step (M = 1-4 rows) runs a tile of M rows (no duplicated
    rows: the default 8-row tile computed 8 for one), vector IR only (as SLP code 64-256 scalar
    accumulators take minutes to compile); more rows keep the default tile."""
    from schedules.microkernel import vector_shape
    from schedules.templates.dense import DEFAULT_TILE, SMALL_M_TILES, VECTOR_IR_TILES
    shape = vector_shape()
    for m in (1, 2, 3, 4, 9):
        wl = workload(m, 40, 70, ("bias",))
        cfg = DENSE.default_config(wl)
        small = [t for rows, t in sorted(SMALL_M_TILES.get(shape, {}).items()) if m <= rows]
        assert cfg["regtile"] == (small[0] if small else DEFAULT_TILE[shape])
        check(wl, cfg)
    space = DENSE.space(workload(1, 40, 70))
    for tile in set(VECTOR_IR_TILES) & set(space.knobs[0].options):
        with pytest.raises(ConfigError, match="vector IR only"):
            space.validate({**DENSE.default_config(workload(1, 40, 70)).to_json(), "regtile": tile, "tile_code": "slp"})


def test_default_splits_a_transformer_sized_layer_over_threads():
    """ViT-small's MLP layer (16 x 192 x 768, 5 M flops) by default runs on 2 threads where the
    backend has them (the size rule decides, not a flop count of the template's own), in
    blocks of one column tile, on one thread where it has one, and both match NumPy."""
    from codegen import cpu
    from codegen.backend import get_backend
    from ir.settings import Settings
    wl = workload(16, 192, 768)
    cfg = DENSE.default_config(wl)
    assert cfg["parallel"] is True
    assert cfg["NB"] == 1 and DENSE.default_config(workload(512, 64, 256))["NB"] == 4   # blocks of one column tile
    # where all rows fit one block, so the threads share N's 12 tiles; rows in several blocks: unchanged
    x, w, b = wl.random_inputs(0)
    want = wl.reference([x, w, b])
    for threads in (1, 2):
        run = compile_kernel(DENSE, wl, cfg).bind([None, w, b], get_backend("cpu", Settings().with_(threads=threads)))
        spreads = [r for r, _ in run.plan([None, w, b]).calls if isinstance(r, cpu._Spread)]
        assert len(spreads) == (threads - 1) and all(s.threads == 2 for s in spreads)
        y = np.empty(wl.output_shape, np.float32)
        run([x, w, b], y)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)

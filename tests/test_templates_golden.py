"""Golden generated source per (template, config): catches codegen drift in the templates.

Regenerate after an intended change: TENSORTUNE_REGEN_GOLDEN=1 pytest tests/test_templates_golden.py
(then review the diff of tests/golden/)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from codegen.source import render
from schedules import get_template
from tests.template_cases import conv_wl, make_wl

GOLDEN = Path(__file__).parent / "golden"


def _cases():
    return {
        "conv2d_direct_4x16": ("conv2d", conv_wl(1, 4, 9, 11, 6, k=3, s=2, p=1, epi=("res", "relu")),
                               {"algo": "direct", "vec": "px", "regtile": "4x16", "order": "oc_px", "tile_code": "slp"}),
        "conv2d_im2col_4x16": ("conv2d", conv_wl(1, 4, 9, 11, 6, k=1, s=1, p=0, epi=("chan",)),
                               {"algo": "im2col", "regtile": "4x16", "order": "px_oc", "tile_code": "slp"}),
        # a stem's tile as one nest-form tile_fma call (segments per phase plane), AVX2's lanes
        "conv2d_direct_px_4x16_vec8": ("conv2d", conv_wl(1, 3, 9, 11, 6, k=3, s=2, p=1, epi=("relu",)),
                                       {"algo": "direct", "vec": "px", "regtile": "4x16", "order": "oc_px",
                                        "tile_code": "vec8"}),
        "reduce_layernorm_one_pass": ("reduce", make_wl(
            [("Add", ["i0", "i1"], {}), ("LayerNormalization", ["t0", "i2", "i3"], {"axis": -1})],
            [((2, 3, 8), "float32", False), ((8,), "float32", True), ((8,), "float32", True), ((8,), "float32", True)]),
            {}),
        "reduce_softmax_one_pass": ("reduce", make_wl(
            [("Add", ["i0", "i1"], {}), ("Softmax", ["t0"], {"axis": -1})],
            [((2, 3, 8), "float32", False), ((8,), "float32", True)]),
            {"cache": True}),
        "elementwise_gelu_flat": ("elementwise", make_wl(
            [("Div", ["i0", "i1"], {}), ("Erf", ["t0"], {}), ("Add", ["t1", "i2"], {}), ("Mul", ["t2", "i0"], {})],
            [((4, 8), "float32", False), ((), "float32", True), ((), "float32", True)]), {"vector": "flat", "unroll": 4}),
        "pool_max_3x3s2": ("pool", make_wl([("MaxPool", ["i0"], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4})],
                                           [((1, 2, 8, 8), "float32", False)]),
                           {"algo": "window", "owtile": 4, "unroll": True}),
        "pool_avg_3x3s2_separable": ("pool", make_wl([("AveragePool", ["i0"], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                                               "pads": [1] * 4})],
                                                     [((1, 2, 8, 8), "float32", False)]),
                                     {"algo": "separable", "owtile": 4, "unroll": True}),
        "pool_max_5x5s1_separable": ("pool", make_wl([("MaxPool", ["i0"], {"kernel_shape": [5, 5], "pads": [2] * 4})],
                                                     [((1, 2, 8, 8), "float32", False)]), {"algo": "separable"}),
        "batch_matmul_2x16": ("batch_matmul", make_wl([("MatMul", ["i0", "i1"], {})],
                                                      [((2, 5, 3), "float32", False), ((2, 3, 7), "float32", False)]),
                              {"regtile": "2x16"}),
        "dense_4x16": ("dense", make_wl([("MatMul", ["i0", "i1"], {}), ("Add", ["t0", "i2"], {}), ("Relu", ["t1"], {})],
                                        [((5, 19), "float32", False), ((19, 37), "float32", True),
                                         ((37,), "float32", True)]), {"regtile": "4x16", "order": "ji", "tile_code": "slp"}),
        # the register tile as LLVM vector IR (codegen.vector_tile), for AVX2's 8 lanes whatever this CPU
        "dense_6x16_vec8": ("dense", make_wl([("MatMul", ["i0", "i1"], {}), ("Add", ["t0", "i2"], {}), ("Relu", ["t1"], {})],
                                             [((5, 19), "float32", False), ((19, 37), "float32", True),
                                              ((37,), "float32", True)]), {"regtile": "6x16", "order": "ji", "tile_code": "vec8"}),
        "batch_matmul_4x16_vec8": ("batch_matmul", make_wl([("MatMul", ["i0", "i1"], {})],
                                                           [((2, 5, 3), "float32", False), ((2, 3, 7), "float32", False)]),
                                   {"regtile": "4x16", "tile_code": "vec8"}),
    }


AVX2 = {"vector_bits": 256, "vector_registers": 16}


@pytest.mark.parametrize("name", sorted(_cases()))
def test_generated_source_matches_golden(name):
    template_name, wl, code = _cases()[name]
    t = get_template(template_name)
    on = (AVX2,) if "vec8" in code.values() else ()   # the target, for the templates whose space takes one
    cfg = t.space(wl, *on).validate({**t.default_config(wl, *on).to_json(), **code})
    src = render(t.lower(wl, cfg).module)
    path = GOLDEN / f"{name}.py.txt"
    if os.environ.get("TENSORTUNE_REGEN_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(src)
    assert path.exists(), f"no golden file {path}: run with TENSORTUNE_REGEN_GOLDEN=1"
    assert src == path.read_text(), f"generated source of {name} changed; regenerate with TENSORTUNE_REGEN_GOLDEN=1 if intended"

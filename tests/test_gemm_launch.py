"""The GEMM-like templates (conv2d, batch_matmul, dense) describe their launch as data:
the lowered kernel pickles, every scratch buffer is a declared workspace (a call with the
caller's workspaces allocates nothing and is right even when they start as garbage), and
packed weights do not depend on the dynamic dims."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from codegen import compile_kernel
from codegen.backend import get_backend
from schedules import get_template
from schedules.template import Lowered
from tests.template_cases import conv_wl, make_wl


def _bmm_wl():
    return make_wl([("MatMul", ["i0", "i1"], {}), ("Add", ["t0", "i2"], {})],
                   [((2, 1, 5, 3), "float32", False), ((3, 3, 7), "float32", False), ((2, 1, 1, 7), "float32", False)])


def _nonconst_weights(wl):
    j = wl.to_json()
    j["inputs"][1]["const"] = False
    return type(wl).from_json(j)


CASES = {
    "conv_direct_padded": ("conv2d", lambda: conv_wl(2, 4, 9, 11, 6, k=3, s=2, p=1, epi=("res", "relu")),
                           {"algo": "direct", "regtile": "4x16", "order": "oc_px", "tile_code": "slp"}),
    "conv_im2col_grouped": ("conv2d", lambda: conv_wl(1, 4, 7, 6, 6, k=3, s=1, p=2, d=2, g=2, bias=False, epi=("chan",)),
                            {"algo": "im2col", "regtile": "4x16", "order": "px_oc"}),
    "conv_weights_per_call": ("conv2d", lambda: _nonconst_weights(conv_wl(1, 3, 6, 6, 5, k=3, s=1, p=1)),
                              {"algo": "direct", "regtile": "4x16", "order": "oc_px", "parallel": False,
                               "tile_code": "slp"}),
    "batch_matmul_broadcast": ("batch_matmul", _bmm_wl, {"regtile": "2x16"}),
    # constant weights are packed at prepare and A is read in place: no workspace, but the
    # K blocks accumulate in `out` (filled with NaN here), so the first must not read it
    "dense_k_blocked": ("dense", lambda: make_wl([("MatMul", ["i0", "i1"], {}), ("Relu", ["t0"], {})],
                                                 [((2, 5, 40), "float32", False), ((40, 19), "float32", True)]),
                        {"regtile": "4x16", "KB": 16}),
    "dense_weights_per_call": ("dense", lambda: _nonconst_weights(make_wl(
        [("MatMul", ["i0", "i1"], {}), ("Relu", ["t0"], {})], [((2, 5, 40), "float32", False), ((40, 19), "float32", True)])),
        {"regtile": "4x16", "KB": 16}),
}
NO_WORKSPACE = ("batch_matmul_broadcast", "dense_k_blocked")


def _lower(name):
    template_name, make, code = CASES[name]
    t = get_template(template_name)
    wl = make()
    return t, wl, t.space(wl).validate({**t.default_config(wl).to_json(), **code})


@pytest.mark.parametrize("name", sorted(CASES))
def test_lowered_is_data_that_pickles(name):
    t, wl, cfg = _lower(name)
    low = t.lower(wl, cfg)
    assert isinstance(low, Lowered)
    back = pickle.loads(pickle.dumps(low))
    assert back.module == low.module and back.launch.steps == low.launch.steps
    assert back.launch.tables.keys() == low.launch.tables.keys()


@pytest.mark.parametrize("name", sorted(CASES))
def test_caller_workspaces_garbage_in_no_allocation_right_answer(name, monkeypatch):
    t, wl, cfg = _lower(name)
    kernel = compile_kernel(t, wl, cfg)
    assert bool(kernel.lowered.launch.workspaces) == (name not in NO_WORKSPACE)
    backend = get_backend()
    arrays = wl.random_inputs(0)
    bound = kernel.bind(arrays, backend)
    expect = wl.reference(arrays)
    work = {b.name: np.full(b.shape, np.nan, b.dtype) for b in kernel.lowered.launch.workspaces}
    out = np.full(wl.output_shape, np.nan, np.float32)
    calls = []
    monkeypatch.setattr(type(backend), "empty", lambda self, shape, dtype: calls.append(shape))
    for _ in range(2):
        got = bound(arrays, out, work)
        np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)
        out[...] = np.nan
    assert calls == [], "a call with the caller's workspaces allocated"


def test_conv_packed_weights_do_not_depend_on_dynamic_dims():
    conv = get_template("conv2d")
    small, big = conv_wl(1, 4, 9, 11, 6, k=3, s=2, p=1), conv_wl(3, 4, 20, 17, 6, k=3, s=2, p=1)
    for algo in ("direct", "im2col"):
        cfg = conv.space(small).validate({**conv.default_config(small).to_json(), "algo": algo, "tile_code": "slp"})
        a, b = conv.lower(small, cfg).launch, conv.lower(big, cfg).launch
        assert a.packed == b.packed and a.prepare == b.prepare
        assert a.workspaces != b.workspaces   # the padded input and panels follow the shape

"""The elementwise, reduce and pool templates describe their launch as data
(`schedules.launch`): the kernel pickles whole (code, launch, tables), and runs on
workspaces handed in full of garbage, so no step relies on what a workspace held
before (the executor's memory plan gives no initial content)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from codegen.backend import get_backend
from codegen.kernel import Kernel
from schedules import get_template
from schedules.launch import Launch
from schedules.template import Lowered
from tests.template_cases import make_wl

RNG = np.random.default_rng(0)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


CASES = {
    "elementwise_gelu": ("elementwise", [("Div", ["i0", "i1"], {}), ("Erf", ["t0"], {}), ("Add", ["t1", "i2"], {}),
                                         ("Mul", ["t2", "i0"], {})],
                         [((3, 40), "float32", False), ((), "float32", True), ((), "float32", True)],
                         lambda: [f32(3, 40), np.float32(1.41), np.float32(1.0)], {"vector": "flat"}),
    # starts that are data: a generated function computes the slice parameters into a workspace
    "elementwise_slice_data_starts": ("elementwise", [("Slice", ["i0", "i1", "i2", "i3"], {}), ("Neg", ["t0"], {})],
                                      [((9, 6), "float32", False), ((1,), "int64", False), ((1,), "int64", True),
                                       ((1,), "int64", True)],
                                      lambda: [f32(9, 6), np.array([-7]), np.array([7]), np.array([0])], {"vector": "last"}),
    "elementwise_resize_linear": ("elementwise", [("Resize", ["i0", "i1", "i2"], {"mode": "linear"})],
                                  [((1, 2, 3, 5), "float32", False), ((0,), "float32", True), ((4,), "float32", True)],
                                  lambda: [f32(1, 2, 3, 5), np.zeros(0, np.float32), np.array([1, 1, 2, 0.6], np.float32)],
                                  {"vector": "last"}),
    "reduce_add_layernorm": ("reduce", [("Add", ["i0", "i1"], {}), ("LayerNormalization", ["t0", "i2", "i3"], {"axis": -1})],
                             [((2, 3, 8), "float32", False), ((3, 1), "float32", True), ((8,), "float32", True),
                              ((8,), "float32", True)], lambda: [f32(2, 3, 8), f32(3, 1), f32(8), f32(8)], {}),
    "reduce_softmax": ("reduce", [("Softmax", ["i0"], {"axis": -1})], [((4, 3, 21), "float32", False)],
                       lambda: [f32(4, 3, 21)], {"cache": False}),
    "reduce_sum_middle": ("reduce", [("ReduceSum", ["i0"], {"axes": [1], "keepdims": 0})], [((2, 5, 7), "float32", False)],
                          lambda: [f32(2, 5, 7)], {}),
    "pool_max_padded": ("pool", [("MaxPool", ["i0"], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4})],
                        [((1, 3, 9, 8), "float32", False)], lambda: [f32(1, 3, 9, 8)], {"owtile": 4, "algo": "window"}),
    "pool_max_separable": ("pool", [("MaxPool", ["i0"], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4})],
                           [((1, 3, 9, 8), "float32", False)], lambda: [f32(1, 3, 9, 8)], {"owtile": 4}),
    "pool_avg_ceil": ("pool", [("AveragePool", ["i0"], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 1, 0, 1],
                                                         "ceil_mode": 1})],
                      [((2, 2, 7, 7), "float32", False)], lambda: [f32(2, 2, 7, 7)], {"owtile": 1}),
    "pool_max_unpadded": ("pool", [("MaxPool", ["i0"], {"kernel_shape": [2, 2], "strides": [2, 2]})],
                          [((1, 2, 6, 6), "float32", False)], lambda: [f32(1, 2, 6, 6)], {}),
}


def _garbage(buf) -> np.ndarray:
    a = np.empty(buf.shape, buf.dtype)
    a.fill(np.nan if a.dtype.kind == "f" else np.iinfo(a.dtype).min)
    return a


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_pickles_and_needs_no_workspace_content(name):
    template_name, ops, ins, arrays, code = CASES[name]
    arrays = arrays()
    wl = make_wl(ops, ins, arrays)
    t = get_template(template_name)
    assert t.matches(wl), name
    cfg = t.space(wl).validate({**t.default_config(wl).to_json(), **code})
    lowered = t.lower(wl, cfg)
    assert isinstance(lowered, Lowered) and isinstance(lowered.launch, Launch)
    lowered = pickle.loads(pickle.dumps(lowered))   # code, launch and tables travel as they are
    kernel = Kernel(wl, t.name, cfg, lowered, get_backend().compile(lowered.module))
    want = wl.reference(arrays)
    bound = kernel.bind(arrays)
    for _ in range(2):   # fresh garbage each call, and a second call on the same bound kernel
        work = {b.name: _garbage(b) for b in bound.workspaces}
        out = np.full(wl.output_shape, np.nan, wl.output_dtype)
        bound(arrays, out, work=work)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_the_cases_use_workspaces():
    """The garbage test means something: the padded pool and the data-started slice have workspaces."""
    for name in ("pool_max_padded", "pool_avg_ceil", "elementwise_slice_data_starts"):
        template_name, ops, ins, arrays, code = CASES[name]
        wl = make_wl(ops, ins, arrays())
        t = get_template(template_name)
        low = t.lower(wl, t.space(wl).validate({**t.default_config(wl).to_json(), **code}))
        assert low.launch.workspaces, name

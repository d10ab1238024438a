"""pool template: MaxPool / AveragePool windows (pads, strides, dilations, ceil_mode,
count_include_pad) agree with the NumPy reference."""
from __future__ import annotations

import pytest

from schedules import get_template
from tests.template_cases import check, make_wl

POOL = get_template("pool")


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("algo", ["window", "separable"])
@pytest.mark.parametrize("attrs,owtile,unroll", [
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 8, True),             # ResNet's
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 8, False),            # its default
    ({"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 0], "ceil_mode": 1,
      "dilations": [1, 2], "count_include_pad": 1}, 1, False),
    ({"kernel_shape": [3, 2], "strides": [1, 3], "dilations": [2, 1], "ceil_mode": 1}, 4, False),   # no pads
])
def test_windows_match_numpy(op, algo, attrs, owtile, unroll):
    if op == "MaxPool":
        attrs = {k: v for k, v in attrs.items() if k != "count_include_pad"}
    else:
        attrs = {k: v for k, v in attrs.items() if k != "dilations"}
    for shape in [(1, 3, 11, 9), (2, 1, 5, 6)]:
        wl = make_wl([(op, ["i0"], attrs)], [(shape, "float32", False)])
        assert POOL.matches(wl)
        cfg = POOL.space(wl).validate({**POOL.default_config(wl).to_json(), "algo": algo, "owtile": owtile, "unroll": unroll,
                                       "PB": 1 if shape[0] == 2 else 4})
        check(POOL, wl, cfg)


def test_default_is_separable_for_windows_of_9_or_more_pixels():
    """The default follows the measurements: windows of 9+ pixels (YOLO's SPPF 5x5/1, 3x3/1,
    ResNet's 3x3/2 at any row width) reduce rows first, read in place; 2x2 windows keep the
    window loops. The separable default of ResNet-18-at-224's MaxPool computes what NumPy does,
    and so does a pool whose every window row but the middle one lies in the pads."""
    def algo(attrs, op="MaxPool", size=12):
        wl = make_wl([(op, ["i0"], attrs)], [((1, 4, size, size), "float32", False)])
        return POOL.default_config(wl)["algo"]
    assert algo({"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2] * 4}) == "separable"
    assert algo({"kernel_shape": [3, 3], "pads": [1] * 4}, "AveragePool") == "separable"
    assert algo({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4}, size=8) == "separable"
    assert algo({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4}, size=112) == "separable"
    assert algo({"kernel_shape": [2, 2], "strides": [1, 1]}) == "window"
    assert algo({"kernel_shape": [2, 2], "strides": [2, 2]}, size=224) == "window"
    wl = make_wl([("MaxPool", ["i0"], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4})],
                 [((1, 3, 112, 112), "float32", False)])
    check(POOL, wl, POOL.default_config(wl))
    for op in ("MaxPool", "AveragePool"):   # 1-row planes: only the middle row of each window is inside
        wl = make_wl([(op, ["i0"], {"kernel_shape": [3, 3], "pads": [1] * 4})], [((2, 3, 1, 5), "float32", False)])
        check(POOL, wl, POOL.default_config(wl))


def test_max_windows_in_the_pads_read_a_row_inside_or_give_the_fill():
    """The separable max reads a window's rows that lie in the pad as its first row inside: with
    dilated rows that is a row of the window, not the first row of the plane, and a window wholly
    in the pad (pads as wide as the kernel) is -inf, as NumPy's."""
    for attrs in ({"kernel_shape": [2, 2], "pads": [2, 2, 2, 2]},
                  {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2, 1, 2, 1], "strides": [2, 1]},
                  {"kernel_shape": [3, 2], "dilations": [3, 1], "pads": [2, 0, 2, 0], "ceil_mode": 1, "strides": [2, 2]}):
        wl = make_wl([("MaxPool", ["i0"], attrs)], [((1, 2, 5, 6), "float32", False)])
        for algo in ("window", "separable"):
            check(POOL, wl, POOL.space(wl).validate({**POOL.default_config(wl).to_json(), "algo": algo}))


def test_sppf_block_through_runtime_matches_onnxruntime():
    """A YOLO SPPF block (three chained MaxPool 5x5/1 pad 2 and a Concat), loaded by the
    runtime with default configs (separable pools), against onnxruntime."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import runtime
    nodes = [helper.make_node("MaxPool", [a], [b], kernel_shape=[5, 5], strides=[1, 1], pads=[2] * 4)
             for a, b in (("x", "p1"), ("p1", "p2"), ("p2", "p3"))]
    nodes.append(helper.make_node("Concat", ["x", "p1", "p2", "p3"], ["y"], axis=1))
    g = helper.make_graph(nodes, "sppf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 13, 13])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32, 13, 13])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((2, 8, 13, 13)).astype(np.float32)
    cm = runtime.load(model, dims={"batch": (1, 4)})
    got = cm(x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(np.asarray(got), want)
    steps = [s for s in cm.program({"batch": 2}).steps if s.kernel is not None]
    assert [s.kernel.kernel.config["algo"] for s in steps if s.kernel.kernel.template == "pool"] == ["separable"] * 3

"""Resize: the NumPy reference agrees with onnxruntime over modes, coordinate transforms,
nearest modes, antialias, exclude_outside, scales or sizes (opsets 10-19, Upsample); the
elementwise template's index-map kernel agrees with the reference; a YOLO-style neck (Resize +
Concat + Sigmoid, sizes from Shape) runs through `runtime.load` at two shapes on compiled kernels
only; symbolic output shapes."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import runtime
from ir import import_onnx, simplify
from ir.errors import TensortuneError
from ir.graph import Node
from ir.ops import OPS
from schedules import get_template
from tests.template_cases import check, make_wl

ort = pytest.importorskip("onnxruntime")
EW = get_template("elementwise")
TRANSFORMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize",
              "half_pixel_symmetric"]
OUT_DIMS = ["o0", "o1", "o2", "o3"]   # declared output: a hint only
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def _attrs(draw):
    mode = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    attrs = {"mode": mode, "coordinate_transformation_mode": draw(st.sampled_from(TRANSFORMS)),
             "extrapolation_value": -2.0}
    if mode == "nearest":
        attrs["nearest_mode"] = draw(st.sampled_from(NEAREST))
    else:
        attrs["antialias"] = draw(st.sampled_from([0, 1]))
        if mode == "cubic" or attrs["antialias"]:   # onnxruntime allows exclude_outside only there
            attrs["exclude_outside"] = draw(st.sampled_from([0, 1]))
        attrs["cubic_coeff_a"] = draw(st.sampled_from([-0.75, -0.5]))
    return attrs


@st.composite
def resize_case(draw):
    """(attrs, x, roi, scales or None, sizes or None): 4-D NCHW, H and W resized."""
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    attrs = _attrs(draw)
    factors = [draw(st.sampled_from([0.5, 0.6, 1.0, 1.5, 2.0, 3.0])) for _ in range(2)]
    if draw(st.booleans()):
        sizes = np.array(list(shape[:2]) + [max(1, int(d * f)) for d, f in zip(shape[2:], factors)], np.int64)
        scales = None
    else:
        factors = [f if int(d * f) >= 1 else 1.0 for d, f in zip(shape[2:], factors)]
        scales, sizes = np.array([1, 1] + factors, np.float32), None
    roi = np.array([0, 0, draw(st.sampled_from([0.0, 0.1, -0.2])), 0.2, 1, 1, draw(st.sampled_from([1.0, 0.8, 1.3])), 0.9],
                   np.float32)
    x = np.random.default_rng(draw(st.integers(0, 99))).standard_normal(shape).astype(np.float32)
    return attrs, x, roi, scales, sizes


def _model(attrs, x_shape, roi, scales, sizes, opset=19, dynamic=False):
    names = ["x", "roi", "scales" if scales is not None else "", "sizes" if sizes is not None else ""]
    while not names[-1]:
        names.pop()
    inits = [nh.from_array(v, k) for k, v in (("roi", roi), ("scales", scales), ("sizes", sizes)) if v is not None]
    dims = ["N", "C", "H", "W"] if dynamic else list(x_shape)
    g = h.make_graph([h.make_node("Resize", names, ["y"], **attrs)], "resize",
                     [h.make_tensor_value_info("x", TP.FLOAT, dims)], [h.make_tensor_value_info("y", TP.FLOAT, OUT_DIMS)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def _ort(model, x):
    return ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]


def _ref(attrs, x, roi, scales, sizes):
    names = ("x", "roi", "scales" if scales is not None else "", "sizes" if sizes is not None else "")
    return OPS["Resize"].ref(Node("Resize", names, ("y",), dict(attrs), "r"), [x, roi, scales, sizes])[0]


def _tie_case(attrs, scales):
    """half_pixel_symmetric + nearest at a fractional scale: a source coordinate lands within one
    float32 ulp of an integer and onnxruntime rounds it the other way (its evaluation order)."""
    return (attrs["mode"] == "nearest" and attrs["coordinate_transformation_mode"] == "half_pixel_symmetric"
            and scales is not None)


@settings(max_examples=120, deadline=None)
@given(case=resize_case())
def test_reference_matches_onnxruntime(case):
    attrs, x, roi, scales, sizes = case
    if _tie_case(attrs, scales):
        return
    want = _ort(_model(attrs, x.shape, roi, scales, sizes), x)
    got = _ref(attrs, x, roi, scales, sizes)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@settings(max_examples=8, deadline=None)
@given(case=resize_case(), then=st.sampled_from([None, "Relu", "Sigmoid"]), vector=st.sampled_from(["flat", "last"]))
def test_kernel_matches_reference(case, then, vector):
    """The index-map kernel (tables of source indices and weights) vs the per-axis NumPy reference,
    with an elementwise op fused after it."""
    attrs, x, roi, scales, sizes = case
    operand = scales if scales is not None else sizes
    ops = [("Resize", ["i0", "i1", "i2"], attrs)] + ([(then, ["t0"], {})] if then else [])
    wl = make_wl(ops, [(x.shape, "float32", False), ((8,), "float32", True), ((4,), str(operand.dtype), True)],
                 [x, roi, operand])
    assert EW.matches(wl)
    check(EW, wl, EW.space(wl).validate({**EW.default_config(wl).to_json(), "vector": vector}), arrays=[x, roi, operand])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_opset10_resize_and_upsample_match_onnxruntime(mode):
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    scales = np.array([1, 1, 2, 1.5], np.float32)
    for op, opset in (("Resize", 10), ("Upsample", 9)):
        g = h.make_graph([h.make_node(op, ["x", "scales"], ["y"], mode=mode)], "r",
                         [h.make_tensor_value_info("x", TP.FLOAT, x.shape)], [h.make_tensor_value_info("y", TP.FLOAT, OUT_DIMS)],
                         [nh.from_array(scales, "scales")])
        model = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
        want = _ort(model, x)
        got = runtime.load(model)(x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{op} opset {opset}")


def test_symbolic_output_shapes():
    scales = np.array([1, 1, 2, 0.5], np.float32)
    g = simplify(import_onnx(_model({"mode": "nearest"}, None, np.zeros(0, np.float32), scales, None, dynamic=True)))
    n, c, hh, w = (sympy.Symbol(s, integer=True, positive=True) for s in "NCHW")
    out = g.type_of("y").shape
    assert out[:3] == (n, c, 2 * hh) and sympy.simplify(out[3] - sympy.floor(w / 2)) == 0


def test_bad_attributes_are_one_clear_error():
    x = np.zeros((1, 1, 2, 2), np.float32)
    model = _model({"mode": "bicubic"}, x.shape, np.zeros(0, np.float32), np.array([1, 1, 2, 2], np.float32), None)
    with pytest.raises(TensortuneError, match="mode 'bicubic' is not one of"):
        runtime.load(model)


def _neck():
    """A YOLO/FPN neck as torch exports it: SiLU, nearest x2 upsample, Concat with the skip, 1x1
    Conv, then a bilinear Resize to sizes computed from Shape (F.interpolate(size=...)), Sigmoid."""
    rng = np.random.default_rng(0)
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        h.make_node("Sigmoid", ["c1"], ["s1"]), h.make_node("Mul", ["c1", "s1"], ["a1"]),
        h.make_node("Resize", ["a1", "", "scales"], ["up"], mode="nearest",
                    coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        h.make_node("Concat", ["up", "x"], ["cat"], axis=1),
        h.make_node("Conv", ["cat", "w2"], ["c2"]),
        h.make_node("Shape", ["x"], ["shp"]), h.make_node("Gather", ["shp", "i23"], ["hw"]),
        h.make_node("Shape", ["c2"], ["shp2"]), h.make_node("Slice", ["shp2", "s0", "s1e"], ["nc"]),
        h.make_node("Concat", ["nc", "hw"], ["sz0"], axis=0), h.make_node("Mul", ["sz0", "two"], ["sz"]),
        h.make_node("Resize", ["c2", "", "", "sz"], ["up2"], mode="linear"),
        h.make_node("Sigmoid", ["up2"], ["out"]),
    ]
    inits = {"w1": rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3,
             "w2": rng.standard_normal((3, 8, 1, 1)).astype(np.float32) * 0.3,
             "scales": np.array([1, 1, 2, 2], np.float32), "i23": np.array([2, 3]), "s0": np.array([0]),
             "s1e": np.array([2]), "two": np.array([1, 1, 2, 2])}
    g = h.make_graph(nodes, "neck", [h.make_tensor_value_info("x", TP.FLOAT, ["N", 4, "H", "W"])],
                     [h.make_tensor_value_info("out", TP.FLOAT, ["N", 3, "h", "w"])],
                     [nh.from_array(v, k) for k, v in inits.items()])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_yolo_style_neck_runs_on_compiled_kernels_at_two_shapes():
    model = _neck()
    m = runtime.load(model)
    sess = ort.InferenceSession(model.SerializeToString())
    for shape in ((1, 4, 8, 8), (2, 4, 10, 6)):
        x = np.random.default_rng(shape[0]).standard_normal(shape).astype(np.float32)
        want = sess.run(None, {"x": x})[0]
        got = m(x)
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    cov = m.coverage()
    assert cov.share("reference") == 0 and cov.share("view") == 0, str(cov)
    assert any("Resize + Concat" in s.name for p in m._programs.values() for s in p.steps if s.kernel is not None)


@pytest.mark.parametrize("attrs,factors,then", [
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, (2, 2), None),
    ({"mode": "nearest", "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_ceil"}, (1, 3), "Sigmoid"),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel"}, (2, 2), "Add"),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, (2, 2), None),   # not periodic: tables
    ({"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"}, (2, 3), None),
])
def test_integer_scale_factors_read_the_last_axis_in_closed_form(attrs, factors, then):
    """Integer upscaling of the last axis (YOLO/UNet 2x): the rows' interior reads input j + offset
    with constant weights (a loop LLVM vectorizes), the edge columns through the tables; both agree
    with the reference, also with an op fused after the Resize (Add reads its input at j)."""
    from codegen.source import render
    x = np.random.default_rng(3).standard_normal((1, 2, 5, 19)).astype(np.float32)
    scales = np.array([1, 1, *factors], np.float32)
    roi = np.zeros(0, np.float32)
    ops = [("Resize", ["i0", "i1", "i2"], attrs)]
    inputs = [(x.shape, "float32", False), ((0,), "float32", True), ((4,), "float32", True)]
    arrays = [x, roi, scales]
    if then == "Add":
        out_w = 19 * factors[1]
        ops.append(("Add", ["t0", "i3"], {}))
        inputs.append(((out_w,), "float32", False))
        arrays.append(np.arange(out_w, dtype=np.float32))
    elif then:
        ops.append((then, ["t0"], {}))
    wl = make_wl(ops, inputs, arrays)
    cfg = EW.space(wl).validate({**EW.default_config(wl).to_json(), "vector": "last"})
    closed = "for jx in range(" in render(EW.lower(wl, cfg).module)
    assert closed == (attrs["coordinate_transformation_mode"] != "align_corners")
    check(EW, wl, cfg, arrays=arrays)

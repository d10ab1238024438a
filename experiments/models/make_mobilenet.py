"""Write a MobileNetV2-style CNN as ONNX (dynamic batch): a 3x3/2 stem, inverted residual
blocks (1x1 expand, 3x3 depthwise, 1x1 project; Conv + BatchNormalization + Clip(0, 6) as
PyTorch exports ReLU6, residual Add where shapes allow), a 1x1 head conv, global average
pooling, a linear classifier. Kept small (96x96 image, 5 blocks) so tuning fits minutes on
2 cores.

Run: python experiments/models/make_mobilenet.py   (writes mobilenetv2.onnx beside this file; do not commit it)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from models import _Builder  # noqa: E402

# (expansion, output channels, stride) per block: MobileNetV2's first stages, one block each
BLOCKS = ((1, 16, 1), (6, 24, 2), (6, 24, 1), (6, 32, 2), (6, 32, 1))


def _conv_bn(b: _Builder, x, cin, cout, k, stride, groups=1, relu6=True, name=""):
    w = b.weight(f"{name}.w", (cout, cin // groups, k, k), cin // groups * k * k)
    y = b.op("Conv", [x, w], name=f"{name}.conv", kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
             group=groups)
    bn = [b.const(f"{name}.bn.{p}", v.astype(np.float32)) for p, v in (
        ("scale", 1 + 0.1 * b.rng.standard_normal(cout)), ("bias", 0.1 * b.rng.standard_normal(cout)),
        ("mean", 0.1 * b.rng.standard_normal(cout)), ("var", 1 + 0.1 * b.rng.random(cout)))]
    y = b.op("BatchNormalization", [y] + bn, name=f"{name}.bn", epsilon=1e-5)
    if relu6:
        y = b.op("Clip", [y, "zero6", "six"], name=f"{name}.relu6")
    return y


def make_mobilenet(image=96, classes=100, head=160, seed=0) -> onnx.ModelProto:
    b = _Builder(seed)
    b.const("zero6", np.asarray(0.0, np.float32))
    b.const("six", np.asarray(6.0, np.float32))
    x, cin = _conv_bn(b, "image", 3, 32, 3, 2, name="stem"), 32
    for k, (t, cout, stride) in enumerate(BLOCKS):
        name, hidden = f"block{k}", cin * t
        y = _conv_bn(b, x, cin, hidden, 1, 1, name=f"{name}.expand") if t != 1 else x
        y = _conv_bn(b, y, hidden, hidden, 3, stride, groups=hidden, name=f"{name}.dw")
        y = _conv_bn(b, y, hidden, cout, 1, 1, relu6=False, name=f"{name}.project")
        x = b.op("Add", [x, y], name=f"{name}.add") if stride == 1 and cin == cout else y
        cin = cout
    x = _conv_bn(b, x, cin, head, 1, 1, name="head")
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x], name="gap")], name="flatten", axis=1)
    w = b.weight("fc.w", (classes, head), head)
    b.op("Gemm", [x, w, b.const("fc.b", np.zeros(classes, np.float32))], name="logits", transB=1)
    return b.model("mobilenetv2", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, image, image])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(Path(__file__).with_name("mobilenetv2.onnx")))
    args = ap.parse_args()
    onnx.save(make_mobilenet(), args.out)
    print(f"wrote {args.out}")

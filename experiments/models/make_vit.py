"""Write a ViT-small-style image transformer as ONNX (dynamic batch): patch embedding by a
strided Conv, pre-norm encoder layers (LayerNormalization, 3-head attention, Gelu MLP in
its Erf form), mean over tokens, a linear head. Kept small (dim 192, 4 layers, 64x64 image,
16x16 patches: 16 tokens) so tuning it fits minutes on 2 cores.

Run: python experiments/models/make_vit.py   (writes vit_small.onnx beside this file; do not commit it)
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from models import _Builder  # noqa: E402


def make_vit(image=64, patch=16, dim=192, heads=3, layers=4, mlp=768, classes=100, seed=0) -> onnx.ModelProto:
    b = _Builder(seed)
    tokens, dh = (image // patch) ** 2, dim // heads

    def f32(name, v):
        return b.const(name, np.asarray(v, dtype=np.float32))

    def i64(name, v):
        return b.const(name, np.asarray(v, dtype=np.int64))

    def dense(x, fin, fout, name):
        w = f32(f"{name}.w", b.rng.standard_normal((fin, fout)) / math.sqrt(fin))
        return b.op("Add", [b.op("MatMul", [x, w], name=f"{name}.mm"), f32(f"{name}.b", 0.02 * b.rng.standard_normal(fout))],
                    name=f"{name}.bias")

    def norm(x, name):
        return b.op("LayerNormalization", [x, f32(f"{name}.g", 1 + 0.1 * b.rng.standard_normal(dim)),
                                           f32(f"{name}.b", 0.1 * b.rng.standard_normal(dim))], name=name, axis=-1,
                    epsilon=1e-6)

    w = b.weight("patch.w", (dim, 3, patch, patch), 3 * patch * patch)
    x = b.op("Conv", ["image", w, f32("patch.b", np.zeros(dim))], name="patch", kernel_shape=[patch, patch],
             strides=[patch, patch])
    x = b.op("Transpose", [b.op("Reshape", [x, i64("flat", [0, dim, tokens])], name="patch.flat")], name="patch.t",
             perm=[0, 2, 1])
    x = b.op("Add", [x, f32("pos", 0.02 * b.rng.standard_normal((tokens, dim)))], name="pos_add")
    split_shape = i64("split", [0, tokens, heads, dh])
    merge_shape = i64("merge", [0, tokens, dim])
    for l in range(layers):
        p = f"l{l}"
        h = norm(x, f"{p}.ln1")

        def split(y, perm, name):
            return b.op("Transpose", [b.op("Reshape", [y, split_shape], name=f"{name}.split")], name=f"{name}.t", perm=perm)

        q = split(dense(h, dim, dim, f"{p}.q"), [0, 2, 1, 3], f"{p}.q")
        k = split(dense(h, dim, dim, f"{p}.k"), [0, 2, 3, 1], f"{p}.k")
        v = split(dense(h, dim, dim, f"{p}.v"), [0, 2, 1, 3], f"{p}.v")
        s = b.op("Div", [b.op("MatMul", [q, k], name=f"{p}.qk"), f32(f"{p}.scale", math.sqrt(dh))], name=f"{p}.scaled")
        probs = b.op("Softmax", [s], name=f"{p}.softmax", axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [probs, v], name=f"{p}.ctx")], name=f"{p}.ctx.t", perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx, merge_shape], name=f"{p}.merge")
        x = b.op("Add", [dense(ctx, dim, dim, f"{p}.o"), x], name=f"{p}.res1")
        u = dense(norm(x, f"{p}.ln2"), dim, mlp, f"{p}.fc1")
        erf = b.op("Erf", [b.op("Div", [u, f32(f"{p}.sqrt2", math.sqrt(2))], name=f"{p}.gelu.div")], name=f"{p}.gelu.erf")
        gelu = b.op("Mul", [b.op("Mul", [u, b.op("Add", [erf, f32(f"{p}.one", 1.0)], name=f"{p}.gelu.add")],
                                 name=f"{p}.gelu.mul"), f32(f"{p}.half", 0.5)], name=f"{p}.gelu")
        x = b.op("Add", [dense(gelu, mlp, dim, f"{p}.fc2"), x], name=f"{p}.res2")
    pooled = b.op("ReduceMean", [norm(x, "final_ln"), i64("tok_axis", [1])], name="pool", keepdims=0)
    dense(pooled, dim, classes, "head")
    b.nodes[-1].output[0] = "logits"
    return b.model("vit_small", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, image, image])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])], opset=18)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(Path(__file__).with_name("vit_small.onnx")))
    args = ap.parse_args()
    onnx.save(make_vit(), args.out)
    print(f"wrote {args.out}")

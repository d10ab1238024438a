"""Model builders for tests and experiments (onnx.helper, no torch): MLP, ResNet-18, BERT encoder.

Weights are random but well scaled (He init, positive BN variances) so outputs stay O(1)
and rtol/atol 1e-4 comparisons against onnxruntime are meaningful.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.k = [], [], 0

    def const(self, name, array):
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, name, shape, fan_in):
        return self.const(name, (self.rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)).astype(np.float32))

    def op(self, op, inputs, name=None, n_out=1, **attrs):
        self.k += 1
        name = name or f"{op.lower()}_{self.k}"
        outs = [name] if n_out == 1 else [f"{name}:{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, name, inputs, outputs, opset=17):
        g = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def make_mlp(width=256, layers=3, seed=0) -> onnx.ModelProto:
    """Gemm(transB=1) + Relu layers, dynamic batch."""
    b = _Builder(seed)
    x = "x"
    for k in range(layers):
        w = b.weight(f"w{k}", (width, width), width)
        bias = b.const(f"b{k}", (0.1 * b.rng.standard_normal(width)).astype(np.float32))
        x = b.op("Relu", [b.op("Gemm", [x, w, bias], name=f"fc{k}", transB=1)], name="y" if k == layers - 1 else None)
    return b.model("mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])])


def _conv_bn(b: _Builder, x, cin, cout, k, stride, relu=True, name=""):
    w = b.weight(f"{name}.w", (cout, cin, k, k), cin * k * k)
    y = b.op("Conv", [x, w], name=f"{name}.conv", kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    bn = [b.const(f"{name}.bn.{p}", v.astype(np.float32)) for p, v in (
        ("scale", 1 + 0.1 * b.rng.standard_normal(cout)), ("bias", 0.1 * b.rng.standard_normal(cout)),
        ("mean", 0.1 * b.rng.standard_normal(cout)), ("var", 1 + 0.1 * b.rng.random(cout)))]
    y = b.op("BatchNormalization", [y] + bn, name=f"{name}.bn", epsilon=1e-5)
    return b.op("Relu", [y], name=f"{name}.relu") if relu else y


def make_resnet18(image=64, classes=1000, seed=0) -> onnx.ModelProto:
    """ResNet-18 (torchvision layer shapes): dynamic batch, `image` x `image` input."""
    b = _Builder(seed)
    x = _conv_bn(b, "image", 3, 64, 7, 2, name="stem")
    x = b.op("MaxPool", [x], name="stem.pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512), 1):
        for block in range(2):
            stride = 2 if stage > 1 and block == 0 else 1
            name = f"layer{stage}.{block}"
            y = _conv_bn(b, x, cin, cout, 3, stride, name=f"{name}.a")
            y = _conv_bn(b, y, cout, cout, 3, 1, relu=False, name=f"{name}.b")
            short = _conv_bn(b, x, cin, cout, 1, stride, relu=False, name=f"{name}.down") if stride != 1 or cin != cout else x
            x = b.op("Relu", [b.op("Add", [y, short], name=f"{name}.add")], name=f"{name}.relu")
            cin = cout
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x], name="gap")], name="flatten", axis=1)
    w = b.weight("fc.w", (classes, 512), 512)
    bias = b.const("fc.b", np.zeros(classes, np.float32))
    b.op("Gemm", [x, w, bias], name="logits", transB=1)
    return b.model("resnet18", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, image, image])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])])


def make_bert(layers=4, hidden=256, heads=4, ffn=1024, vocab=1000, max_pos=512, seed=0) -> onnx.ModelProto:
    """BERT encoder as PyTorch exports it: Gather embeddings, Shape->Gather->Concat->Reshape head
    splits, additive attention mask, Softmax, LayerNormalization, Gelu in its Erf form."""
    b = _Builder(seed)
    dh = hidden // heads

    def i64(name, v):
        return b.const(name, np.asarray(v, dtype=np.int64))

    def f32(name, v):
        return b.const(name, np.asarray(v, dtype=np.float32))

    def dense(x, fin, fout, name):
        w = b.const(f"{name}.w", (b.rng.standard_normal((fin, fout)) / math.sqrt(fin)).astype(np.float32))
        return b.op("Add", [b.op("MatMul", [x, w], name=f"{name}.mm"), f32(f"{name}.b", 0.02 * b.rng.standard_normal(fout))],
                    name=f"{name}.bias")

    def layer_norm(x, name):
        return b.op("LayerNormalization", [x, f32(f"{name}.g", 1 + 0.1 * b.rng.standard_normal(hidden)),
                                           f32(f"{name}.b", 0.1 * b.rng.standard_normal(hidden))],
                    name=name, axis=-1, epsilon=1e-12)

    shape = b.op("Shape", ["input_ids"], name="ids_shape")
    batch = b.op("Unsqueeze", [b.op("Gather", [shape, i64("zero", 0)], name="batch_dim", axis=0), i64("ax0", [0])], name="batch_1d")
    seq = b.op("Unsqueeze", [b.op("Gather", [shape, i64("one", 1)], name="seq_dim", axis=0), i64("ax0b", [0])], name="seq_1d")
    words = b.op("Gather", [f32("word_emb", 0.5 * b.rng.standard_normal((vocab, hidden))), "input_ids"], name="word_gather", axis=0)
    pos = b.op("Slice", [f32("pos_emb", 0.5 * b.rng.standard_normal((max_pos, hidden))), i64("s0", [0]), seq, i64("a0", [0])],
               name="pos_slice")
    emb = b.op("Add", [b.op("Add", [words, pos], name="emb_add"), f32("type_emb", 0.5 * b.rng.standard_normal(hidden))],
               name="emb_add_type")
    h = layer_norm(emb, "emb_ln")
    mask = b.op("Cast", [b.op("Unsqueeze", ["attention_mask", i64("ax12", [1, 2])], name="mask_unsq")], name="mask_cast", to=1)
    mask = b.op("Mul", [b.op("Sub", [f32("one_f", 1.0), mask], name="mask_inv"), f32("neg", -10000.0)], name="mask_add")
    heads_shape = b.op("Concat", [batch, seq, i64("heads", [heads]), i64("dh", [dh])], name="heads_shape", axis=0)
    for l in range(layers):
        p = f"l{l}"

        def split(x, perm, name):
            return b.op("Transpose", [b.op("Reshape", [x, heads_shape], name=f"{name}.split")], name=f"{name}.t", perm=perm)

        q = split(dense(h, hidden, hidden, f"{p}.q"), [0, 2, 1, 3], f"{p}.q")
        k = split(dense(h, hidden, hidden, f"{p}.k"), [0, 2, 3, 1], f"{p}.k")
        v = split(dense(h, hidden, hidden, f"{p}.v"), [0, 2, 1, 3], f"{p}.v")
        s = b.op("Div", [b.op("MatMul", [q, k], name=f"{p}.qk"), f32(f"{p}.scale", math.sqrt(dh))], name=f"{p}.scaled")
        probs = b.op("Softmax", [b.op("Add", [s, mask], name=f"{p}.masked")], name=f"{p}.softmax", axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [probs, v], name=f"{p}.ctx")], name=f"{p}.ctx.t", perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx, i64(f"{p}.merge_shape", [0, 0, -1])], name=f"{p}.merge")
        h = layer_norm(b.op("Add", [dense(ctx, hidden, hidden, f"{p}.o"), h], name=f"{p}.res1"), f"{p}.ln1")
        u = dense(h, hidden, ffn, f"{p}.ffn1")
        erf = b.op("Erf", [b.op("Div", [u, f32(f"{p}.sqrt2", math.sqrt(2))], name=f"{p}.gelu.div")], name=f"{p}.gelu.erf")
        gelu = b.op("Mul", [b.op("Mul", [u, b.op("Add", [erf, f32(f"{p}.one", 1.0)], name=f"{p}.gelu.add")], name=f"{p}.gelu.mul"),
                            f32(f"{p}.half", 0.5)], name=f"{p}.gelu")
        h = layer_norm(b.op("Add", [dense(gelu, ffn, hidden, f"{p}.ffn2"), h], name=f"{p}.res2"),
                       "hidden" if l == layers - 1 else f"{p}.ln2")
    return b.model("bert", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
                            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
                   [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", hidden])])

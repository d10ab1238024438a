"""Regenerates the committed test models of tests/real_models/ with REAL exporters.

Tiny random-weight versions of the architectures users bring (GPT-2, BERT, ViT from
transformers configs; a MobileNetV3-style CNN, a YOLO/FPN-style detector and an sdpa block
written here), exported by torch.onnx.export exactly as a user calls it, with dynamic
axes. Two onnx.helper models mimic the conventions of paddle2onnx and tf2onnx, which
need Paddle / TensorFlow that this project does not install.

CI has no torch: the tests read the committed .onnx files. Run this only to refresh them
(`python tests/real_models/make_models.py [--out DIR] [--only NAME,...]`), then update
README.md beside it (it prints the versions and each model's op counts).

Every model is checked here against the torch forward pass through onnxruntime at a
second shape, so a broken export never gets committed.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
INT64_MAX = 2**63 - 1


# ---------------------------------------------------------------------------- torch models
def _torch():
    import torch
    torch.manual_seed(0)
    return torch


def _export(model, args, path: Path, input_names, output_names, dynamic_axes, exporter: str):
    """torch.onnx.export as a user calls it: `dynamo` is torch 2.13's default
    (torch.export + onnxscript), `torchscript` the legacy tracer (`dynamo=False`)."""
    torch = _torch()
    model.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            prog = torch.onnx.export(model, args, input_names=input_names, output_names=output_names,
                                     dynamic_axes=dynamic_axes, dynamo=True, external_data=False,
                                     verbose=False)
            prog.save(str(path), external_data=False)
        else:
            torch.onnx.export(model, args, str(path), input_names=input_names, output_names=output_names,
                              dynamic_axes=dynamic_axes, dynamo=False)


def _check(model, path: Path, feeds: dict, output_names):
    """onnxruntime on the exported file vs torch's forward at feeds (another shape than the export's)."""
    import onnxruntime as ort
    torch = _torch()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    with torch.no_grad():
        ref = model(*[torch.from_numpy(v) for v in feeds.values()])
    if hasattr(ref, "to_tuple"):
        ref = ref.to_tuple()
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    for name, r, g in zip(output_names, ref, got):
        r = r.numpy()
        assert r.shape == g.shape, f"{path.name}:{name}: torch {r.shape} vs onnxruntime {g.shape}"
        err = float(np.max(np.abs(r - g))) / max(float(np.max(np.abs(r))), 1e-6)
        assert err < 1e-4, f"{path.name}:{name}: relative error {err:.2e}"


def gpt2(exporter: str):
    torch = _torch()
    from transformers import GPT2Config, GPT2LMHeadModel

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cfg = GPT2Config(vocab_size=96, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                             use_cache=False, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
            self.m = GPT2LMHeadModel(cfg)

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    m = LM().eval()
    ids = torch.randint(0, 96, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[0, 5:] = 0   # right padding (left padding leaves fully masked rows, whose values torch leaves undefined)
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "logits": {0: "batch", 1: "sequence"}}
    mask2 = np.ones((3, 11), np.int64)
    mask2[1, 7:] = 0
    return (m, (ids, mask), ["input_ids", "attention_mask"], ["logits"], axes,
            {"input_ids": np.random.default_rng(1).integers(0, 96, (3, 11)), "attention_mask": mask2})


def bert(exporter: str):
    torch = _torch()
    from transformers import BertConfig, BertModel

    class Enc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cfg = BertConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=128, max_position_embeddings=64, type_vocab_size=2)
            self.m = BertModel(cfg)

        def forward(self, input_ids, attention_mask):
            out = self.m(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    m = Enc().eval()
    ids = torch.randint(0, 96, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[1, 5:] = 0
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "last_hidden_state": {0: "batch", 1: "sequence"}, "pooler_output": {0: "batch"}}
    rng = np.random.default_rng(2)
    mask2 = np.ones((3, 12), np.int64)
    mask2[0, 9:] = 0
    mask2[2, 4:] = 0
    return (m, (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"], axes,
            {"input_ids": rng.integers(0, 96, (3, 12)), "attention_mask": mask2})


def vit(exporter: str):
    torch = _torch()
    from transformers import ViTConfig, ViTForImageClassification

    class Cls(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=128, num_labels=10)
            self.m = ViTForImageClassification(cfg)

        def forward(self, pixel_values):
            return self.m(pixel_values=pixel_values).logits

    m = Cls().eval()
    x = torch.randn(2, 3, 32, 32)
    axes = {"pixel_values": {0: "batch"}, "logits": {0: "batch"}}
    return m, (x,), ["pixel_values"], ["logits"], axes, {"pixel_values": _image(3, 32, 32, 3)}


def _image(n, h, w, seed, c=3):
    return np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)


def _randomize_bn(model):
    """Non-trivial BatchNorm statistics, so folding them (or not) is actually checked."""
    torch = _torch()
    g = torch.Generator().manual_seed(5)
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            with torch.no_grad():
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
                mod.weight.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
                mod.bias.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
    return model


def mobilenetv3(exporter: str):
    """MobileNetV3-small-style: HardSwish stem, inverted residuals with depthwise convs and
    squeeze-excite (HardSigmoid gate), global pool head."""
    torch = _torch()
    nn = torch.nn

    def cbn(cin, cout, k, s, groups=1, act=None):
        layers = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, act) if act is not None else nn.Sequential(*layers)

    class SE(nn.Module):
        def __init__(self, c, r=4):
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)
            self.gate = nn.Hardsigmoid()

        def forward(self, x):
            return x * self.gate(self.fc2(torch.relu(self.fc1(self.pool(x)))))

    class Block(nn.Module):
        def __init__(self, cin, exp, cout, k, s, se, act):
            super().__init__()
            self.expand = cbn(cin, exp, 1, 1, act=act)
            self.dw = cbn(exp, exp, k, s, groups=exp, act=act)
            self.se = SE(exp) if se else nn.Identity()
            self.project = cbn(exp, cout, 1, 1)
            self.residual = s == 1 and cin == cout

        def forward(self, x):
            y = self.project(self.se(self.dw(self.expand(x))))
            return x + y if self.residual else y

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = cbn(3, 16, 3, 2, act=nn.Hardswish())
            self.blocks = nn.Sequential(
                Block(16, 16, 16, 3, 2, True, nn.ReLU()),
                Block(16, 48, 24, 3, 2, False, nn.ReLU()),
                Block(24, 72, 24, 3, 1, False, nn.ReLU()),
                Block(24, 96, 40, 5, 2, True, nn.Hardswish()),
                Block(40, 120, 40, 5, 1, True, nn.Hardswish()),
            )
            self.head = cbn(40, 96, 1, 1, act=nn.Hardswish())
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Sequential(nn.Linear(96, 128), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(128, 10))

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.head(self.blocks(self.stem(x)))), 1))

    m = _randomize_bn(Net()).eval()
    axes = {"x": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}}
    return m, (torch.randn(2, 3, 64, 64),), ["x"], ["logits"], axes, {"x": _image(3, 48, 80, 4)}


def detector(exporter: str):
    """YOLOv8/FPN-style: Conv-BN-SiLU backbone with C2f blocks (Split + Concat) and an SPPF
    block (three chained MaxPool 5x5/1), a top-down neck upsampling by Resize (nearest, and
    bilinear in one branch), decoupled heads with Sigmoid class scores, anchors of all levels
    concatenated."""
    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional

    def conv(cin, cout, k=3, s=1):
        return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU())

    class C2f(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.c = cout // 2
            self.cv1, self.cv2 = conv(cin, 2 * self.c, 1), conv(3 * self.c, cout, 1)
            self.m = nn.Sequential(conv(self.c, self.c), conv(self.c, self.c))

        def forward(self, x):
            a, b = self.cv1(x).split((self.c, self.c), 1)
            return self.cv2(torch.cat([a, b, self.m(b)], 1))

    class SPPF(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.cv1, self.cv2 = conv(c, c // 2, 1), conv(2 * c, c, 1)
            self.m = nn.MaxPool2d(5, 1, 2)

        def forward(self, x):
            y = [self.cv1(x)]
            for _ in range(3):
                y.append(self.m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class Net(nn.Module):
        def __init__(self, nc=4):
            super().__init__()
            self.nc = nc
            self.stem = conv(3, 8, 3, 2)                                      # /2
            self.s3 = nn.Sequential(conv(8, 16, 3, 2), C2f(16, 16))           # /4
            self.s4 = nn.Sequential(conv(16, 24, 3, 2), C2f(24, 24))          # /8
            self.s5 = nn.Sequential(conv(24, 32, 3, 2), C2f(32, 32), SPPF(32))  # /16
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.n4, self.n3 = C2f(32 + 24, 24), C2f(24 + 16, 16)
            self.heads = nn.ModuleList(nn.Conv2d(c, 4 + nc, 1) for c in (16, 24, 32))

        def forward(self, x):
            c3 = self.s3(self.stem(x))
            c4 = self.s4(c3)
            c5 = self.s5(c4)
            p4 = self.n4(torch.cat([self.up(c5), c4], 1))
            p3 = self.n3(torch.cat([F.interpolate(p4, size=c3.shape[2:], mode="bilinear", align_corners=False),
                                    c3], 1))
            outs = []
            for head, p in zip(self.heads, (p3, p4, c5)):
                y = head(p).flatten(2)                      # [N, 4 + nc, h*w]
                box, cls = y.split((4, self.nc), 1)
                outs.append(torch.cat([box, cls.sigmoid()], 1))
            return torch.cat(outs, 2)

    m = _randomize_bn(Net()).eval()
    axes = {"images": {0: "batch", 2: "height", 3: "width"}, "detections": {0: "batch", 2: "anchors"}}
    return m, (torch.randn(1, 3, 64, 64),), ["images"], ["detections"], axes, {"images": _image(2, 48, 80, 6)}


def sdpa(exporter: str):
    """A pre-norm attention block written with F.scaled_dot_product_attention and a boolean
    padding mask (torch's exporters emit IsNaN/Where guards for fully masked rows)."""
    torch = _torch()
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, d=32, heads=4):
            super().__init__()
            self.h = heads
            self.norm = nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

        def forward(self, x, mask):
            b, s, d = x.shape
            q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4).unbind(0)
            keep = mask[:, None, None, :]                   # [B, 1, 1, S] bool
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
            return x + self.mlp(x)

    m = Block().eval()
    x = torch.randn(2, 6, 32)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    axes = {"x": {0: "batch", 1: "sequence"}, "mask": {0: "batch", 1: "sequence"}, "y": {0: "batch", 1: "sequence"}}
    mask2 = np.ones((3, 9), bool)
    mask2[2, 3:] = False
    return (m, (x, mask), ["x", "mask"], ["y"], axes,
            {"x": np.random.default_rng(7).standard_normal((3, 9, 32)).astype(np.float32), "mask": mask2})


# (file stem, builder, exporter). dynamo is what torch 2.13 users get by default;
# the TorchScript exporter is still what most published ONNX files were made with.
TORCH_MODELS = [
    ("gpt2_dynamo", gpt2, "dynamo"),
    ("gpt2_torchscript", gpt2, "torchscript"),
    ("bert_dynamo", bert, "dynamo"),
    ("bert_torchscript", bert, "torchscript"),
    ("vit_dynamo", vit, "dynamo"),
    ("mobilenetv3_dynamo", mobilenetv3, "dynamo"),
    ("mobilenetv3_torchscript", mobilenetv3, "torchscript"),
    ("detector_dynamo", detector, "dynamo"),
    ("detector_torchscript", detector, "torchscript"),
    ("sdpa_dynamo", sdpa, "dynamo"),
    ("sdpa_torchscript", sdpa, "torchscript"),
]


# --------------------------------------------------------------- onnx.helper mimics (no torch)
class _G:
    """A tiny graph builder (names, nodes, initializers) for the exporter mimics."""

    def __init__(self, seed):
        self.rng, self.nodes, self.inits, self.k = np.random.default_rng(seed), [], [], 0

    def const(self, name, a):
        self.inits.append(numpy_helper.from_array(np.asarray(a), name))
        return name

    def w(self, name, shape):
        fan_in = int(np.prod(shape[1:])) or 1
        return self.const(name, (self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))

    def op(self, op, inputs, n_out=1, name=None, **attrs):
        self.k += 1
        name = name or f"{op.lower()}_{self.k}"
        outs = [f"{name}.out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, name, inputs, outputs, opset, producer, value_info=()):
        g = helper.make_graph(self.nodes, name, inputs, outputs, self.inits, value_info=list(value_info))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name=producer[0],
                              producer_version=producer[1])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def paddle_det():
    """paddle2onnx DBNet-style text detector head: input `x` [-1, 3, -1, -1] as dim_value -1;
    Conv+BN folded, hard_swish written as HardSwish and as x*HardSigmoid (alpha 1/6),
    an FPN Resize with `scales` (nearest, asymmetric), a Resize with `sizes` from Shape
    (bilinear, half_pixel), a Sigmoid probability map."""
    b = _G(11)
    c1 = b.op("Conv", ["x", b.w("conv1_w", [8, 3, 3, 3]), b.const("conv1_b", np.zeros(8, np.float32))],
              kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    h1 = b.op("HardSwish", [c1])
    dw = b.op("Conv", [h1, b.w("dw_w", [8, 1, 3, 3])], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
              group=8)
    hs = b.op("Mul", [dw, b.op("HardSigmoid", [dw], alpha=1 / 6, beta=0.5)])
    c3 = b.op("Conv", [hs, b.w("pw_w", [16, 8, 1, 1])], kernel_shape=[1, 1])
    r3 = b.op("Relu", [c3])
    up = b.op("Resize", [r3, "", b.const("up_scales", np.array([1, 1, 2, 2], np.float32))], mode="nearest",
              coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    lat = b.op("Conv", [h1, b.w("lat_w", [16, 8, 1, 1])], kernel_shape=[1, 1])
    fuse = b.op("Add", [up, lat])
    p = b.op("Conv", [fuse, b.w("prob_w", [1, 16, 3, 3]), b.const("prob_b", np.zeros(1, np.float32))],
             kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    shape = b.op("Shape", ["x"])
    hw = b.op("Slice", [shape, b.const("s2", np.array([2], np.int64)), b.const("s4", np.array([4], np.int64))])
    nc = b.op("Slice", [b.op("Shape", [p]), b.const("s0", np.array([0], np.int64)), b.const("s2b", np.array([2], np.int64))])
    sizes = b.op("Concat", [nc, hw], axis=0)
    full = b.op("Resize", [p, "", "", sizes], mode="linear", coordinate_transformation_mode="half_pixel")
    prob = b.op("Sigmoid", [full], name="sigmoid_0")
    # helper writes an int dim as dim_value, so -1 lands as `dim_value: -1`, as paddle2onnx writes it
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, -1, -1])
    y = helper.make_tensor_value_info(prob, TensorProto.FLOAT, [-1, 1, -1, -1])
    return b.model("paddle_det", [x], [y], 14, ("PaddlePaddle", "1.2.3"))


def paddle_rec():
    """paddle2onnx SVTR/CRNN-style recognizer with two inputs whose dims are all named `?`:
    image `x` [?, 3, ?, ?] (H ≠ W at run time) and a per-sample `valid_ratio` [?, ?];
    Conv stride (2,1), ReduceMean over H, Transpose to [N, W, C], MatMul, Softmax."""
    b = _G(12)
    c = b.op("Conv", ["x", b.w("c1_w", [16, 3, 3, 3]), b.const("c1_b", np.zeros(16, np.float32))],
             kernel_shape=[3, 3], strides=[2, 1], pads=[1, 1, 1, 1])
    hs = b.op("HardSwish", [c])
    pooled = b.op("ReduceMean", [hs], axes=[2], keepdims=0)                 # [N, 16, W]
    seq = b.op("Transpose", [pooled], perm=[0, 2, 1])                       # [N, W, 16]
    scale = b.op("Unsqueeze", ["valid_ratio", b.const("ax2", np.array([2], np.int64))])                    # [N, 1, 1]
    seq = b.op("Mul", [seq, scale])
    logits = b.op("Add", [b.op("MatMul", [seq, b.w("fc_w", [16, 12])]), b.const("fc_b", np.zeros(12, np.float32))])
    prob = b.op("Softmax", [logits], axis=2, name="softmax_0")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["?", 3, "?", "?"])
    r = helper.make_tensor_value_info("valid_ratio", TensorProto.FLOAT, ["?", "?"])
    y = helper.make_tensor_value_info(prob, TensorProto.FLOAT, ["?", "?", 12])
    return b.model("paddle_rec", [x, r], [y], 14, ("PaddlePaddle", "1.2.3"))


def tf2onnx_cnn():
    """tf2onnx Keras-style CNN: NHWC input [unk__12, unk__13, unk__14, 3], Transposes to NCHW
    around each Conv, StridedSlice as Slice with INT64_MAX / 1e9 ends (and a reverse with
    INT64_MIN), Flatten as Reshape to Concat(Slice(Shape), [-1]), value_info with unk__ dims."""
    b = _G(13)
    nchw = b.op("Transpose", ["input_1"], perm=[0, 3, 1, 2])
    c1 = b.op("Relu", [b.op("Conv", [nchw, b.w("k1", [8, 3, 3, 3]), b.const("b1", np.zeros(8, np.float32))],
                                   kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])])
    nhwc = b.op("Transpose", [c1], perm=[0, 2, 3, 1])
    # x[:, 1:, :, ::-1][0:1e9]: tf's "to the end" ends as INT64_MAX and 1e9, a reverse to INT64_MIN
    crop = b.op("Slice", [nhwc, b.const("st_a", np.array([1], np.int64)), b.const("en_a", np.array([INT64_MAX], np.int64)),
                          b.const("ax_a", np.array([1], np.int64))])
    rev = b.op("Slice", [crop, b.const("st_r", np.array([-1], np.int64)), b.const("en_r", np.array([-(2**63)], np.int64)),
                         b.const("ax_r", np.array([3], np.int64)), b.const("sp_r", np.array([-1], np.int64))])
    batch = b.op("Slice", [rev, b.const("st_b", np.array([0, 0], np.int64)),
                           b.const("en_b", np.array([1000000000, 1000000000], np.int64)),
                           b.const("ax_b", np.array([0, 2], np.int64))])
    c2in = b.op("Transpose", [batch], perm=[0, 3, 1, 2])
    c2 = b.op("Conv", [c2in, b.w("k2", [8, 8, 3, 3]), b.const("b2", np.zeros(8, np.float32))], kernel_shape=[3, 3],
              strides=[2, 2], pads=[0, 0, 1, 1])
    pool = b.op("GlobalAveragePool", [b.op("Relu", [c2])])
    pooled = b.op("Transpose", [pool], perm=[0, 2, 3, 1])
    n = b.op("Slice", [b.op("Shape", [pooled]), b.const("z", np.array([0], np.int64)), b.const("o", np.array([1], np.int64))])
    target = b.op("Concat", [n, b.const("minus1", np.array([-1], np.int64))], axis=0)
    flat = b.op("Reshape", [pooled, target])
    logits = b.op("Add", [b.op("MatMul", [flat, b.w("dense_w", [8, 5])]), b.const("dense_b", np.zeros(5, np.float32))],
                  name="dense")
    x = helper.make_tensor_value_info("input_1", TensorProto.FLOAT, ["unk__12", "unk__13", "unk__14", 3])
    y = helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["unk__15", 5])
    vi = [helper.make_tensor_value_info(nhwc, TensorProto.FLOAT, ["unk__16", "unk__17", "unk__18", 8]),
          helper.make_tensor_value_info(crop, TensorProto.FLOAT, ["unk__19", "unk__20", "unk__21", 8])]
    return b.model("tf2onnx", [x], [y], 13, ("tf2onnx", "1.16.1 15c810"), vi)


HELPER_MODELS = {
    "paddle_det": (paddle_det, {"x": _image(1, 32, 48, 21)}),
    "paddle_rec": (paddle_rec, {"x": _image(2, 16, 40, 22), "valid_ratio": np.array([[1.0], [0.5]], np.float32)}),
    "tf2onnx_cnn": (tf2onnx_cnn, {"input_1": np.random.default_rng(23).standard_normal((2, 12, 16, 3)).astype(np.float32)}),
}


def _summary(path: Path) -> str:
    m = onnx.load(str(path))
    ops: dict[str, int] = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    top = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1]))
    return (f"{path.name}: {path.stat().st_size / 1024:.0f} KB, opset {opset}, {len(m.graph.node)} nodes, "
            f"producer {m.producer_name} {m.producer_version}; {top}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE), help="folder for the .onnx files")
    ap.add_argument("--only", default="", help="comma-separated stems to (re)make")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, args.only.split(",")))
    failed = []
    for stem, (build, feeds) in HELPER_MODELS.items():
        if only and stem not in only:
            continue
        path = out / f"{stem}.onnx"
        onnx.save(build(), str(path))
        import onnxruntime as ort
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
        print(_summary(path))
    for stem, build, exporter in TORCH_MODELS:
        if only and stem not in only:
            continue
        path = out / f"{stem}.onnx"
        try:
            model, ex_args, ins, outs, axes, feeds = build(exporter)
            _export(model, ex_args, path, ins, outs, axes, exporter)
            _check(model, path, feeds, outs)
        except Exception as e:  # report every model, then fail
            failed.append(stem)
            print(f"{stem}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}", file=sys.stderr)
            continue
        print(_summary(path))
    import torch
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, onnx {onnx.__version__}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The committed real-exporter models and the two input shapes each is checked at.

Used by tests/test_real_models.py and experiments/real_models/bench.py; needs no torch.
The second shape differs from the first in every dynamic dim (H ≠ W where the
exporter convention under test would tie them).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Case:
    name: str
    exporter: str
    arch: str
    shapes: tuple            # two dicts: input name -> (kind, shape); kind float | ids | mask | bool
    vocab: int = 96

    @property
    def path(self) -> Path:
        return HERE / f"{self.name}.onnx"

    def feeds(self, k: int, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs at shape point k (0 or 1), deterministic."""
        rng = np.random.default_rng(seed + 17 * k)
        out = {}
        for name, (kind, shape) in self.shapes[k].items():
            if kind == "float":
                out[name] = rng.standard_normal(shape).astype(np.float32)
            elif kind == "ids":
                out[name] = rng.integers(0, self.vocab, shape).astype(np.int64)
            elif kind in ("mask", "bool"):   # right padding: row r keeps max(1, S - r) tokens
                m = np.ones(shape, bool)
                for r in range(shape[0]):
                    m[r, max(1, shape[1] - 2 * r):] = False
                out[name] = m if kind == "bool" else m.astype(np.int64)
            elif kind == "ratio":
                out[name] = rng.uniform(0.5, 1.0, shape).astype(np.float32)
            else:
                raise ValueError(kind)
        return out

    def with_fixed_dims(self, k: int):
        """The model with every input dim fixed to shape point k and the exporter's value_info and
        output dims dropped: what a static export would be (separates shape bugs from op/kernel ones)."""
        import onnx
        m = onnx.load(str(self.path))
        shapes = {name: shape for name, (_, shape) in self.shapes[k].items()}
        for vi in m.graph.input:
            for d, v in zip(vi.type.tensor_type.shape.dim, shapes.get(vi.name, ())):
                d.Clear()
                d.dim_value = v
        del m.graph.value_info[:]
        for vi in m.graph.output:
            for d in vi.type.tensor_type.shape.dim:
                d.Clear()
        return m


def _text(batch, seq):
    return {"input_ids": ("ids", (batch, seq)), "attention_mask": ("mask", (batch, seq))}


def _image(name, n, h, w, c=3):
    return {name: ("float", (n, c, h, w))}


CASES = [
    Case("gpt2_dynamo", "torch.onnx dynamo", "GPT-2", (_text(1, 8), _text(3, 13))),
    Case("gpt2_torchscript", "torch.onnx TorchScript", "GPT-2", (_text(1, 8), _text(3, 13))),
    Case("bert_dynamo", "torch.onnx dynamo", "BERT", (_text(2, 8), _text(3, 13))),
    Case("bert_torchscript", "torch.onnx TorchScript", "BERT", (_text(2, 8), _text(3, 13))),
    Case("vit_dynamo", "torch.onnx dynamo", "ViT", (_image("pixel_values", 1, 32, 32), _image("pixel_values", 3, 32, 32))),
    # 64x80: every depthwise layer's rows of >= 8 output pixels (dw_plane on AVX-512, strides 1 and 2, 3x3 and 5x5)
    Case("mobilenetv3_dynamo", "torch.onnx dynamo", "MobileNetV3-style CNN",
         (_image("x", 1, 32, 32), _image("x", 2, 64, 80))),
    Case("mobilenetv3_torchscript", "torch.onnx TorchScript", "MobileNetV3-style CNN",
         (_image("x", 1, 32, 32), _image("x", 2, 64, 80))),
    Case("detector_dynamo", "torch.onnx dynamo", "YOLO/FPN-style detector",
         (_image("images", 1, 32, 32), _image("images", 2, 48, 64))),
    Case("detector_torchscript", "torch.onnx TorchScript", "YOLO/FPN-style detector",
         (_image("images", 1, 32, 32), _image("images", 2, 48, 64))),
    Case("sdpa_dynamo", "torch.onnx dynamo", "sdpa attention block",
         ({"x": ("float", (2, 6, 32)), "mask": ("bool", (2, 6))}, {"x": ("float", (3, 11, 32)), "mask": ("bool", (3, 11))})),
    Case("sdpa_torchscript", "torch.onnx TorchScript", "sdpa attention block",
         ({"x": ("float", (2, 6, 32)), "mask": ("bool", (2, 6))}, {"x": ("float", (3, 11, 32)), "mask": ("bool", (3, 11))})),
    Case("paddle_det", "onnx.helper (paddle2onnx conventions)", "DBNet-style detector",
         (_image("x", 1, 32, 32), _image("x", 2, 24, 40))),
    Case("paddle_rec", "onnx.helper (paddle2onnx conventions)", "SVTR/CRNN-style recognizer",
         ({**_image("x", 1, 16, 16), "valid_ratio": ("ratio", (1, 1))},
          {**_image("x", 2, 16, 48), "valid_ratio": ("ratio", (2, 1))})),
    Case("tf2onnx_cnn", "onnx.helper (tf2onnx conventions)", "Keras-style NHWC CNN",
         ({"input_1": ("float", (1, 12, 12, 3))}, {"input_1": ("float", (2, 10, 18, 3))})),
]

BY_NAME = {c.name: c for c in CASES}

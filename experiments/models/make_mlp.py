"""Build the bundled example `mlp.onnx`: 3 x (Gemm + Relu), 256 wide, dynamic batch.

Run: python experiments/models/make_mlp.py   (writes mlp.onnx beside this file)
"""
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_mlp(width: int = 256, layers: int = 3, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for k in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        b = (0.1 * rng.standard_normal(width)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
        # torch.nn.Linear exports Gemm with transB=1 (weight stored [out, in])
        nodes.append(helper.make_node("Gemm", [x, f"w{k}", f"b{k}"], [f"h{k}"], transB=1, name=f"fc{k}"))
        y = "y" if k == layers - 1 else f"a{k}"
        nodes.append(helper.make_node("Relu", [f"h{k}"], [y], name=f"relu{k}"))
        x = y
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    out = Path(__file__).with_name("mlp.onnx")
    onnx.save(make_mlp(), out)
    print(f"wrote {out}")

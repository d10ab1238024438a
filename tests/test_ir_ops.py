"""Registry entries: every elementwise `expr` agrees with its NumPy reference, kinds are right,
and Workload FLOPs count Conv."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ir.graph import Node
from ir.ops import ANCHOR, BROADCAST, ELEMWISE, INJECTIVE, OPS, REDUCE

REQUIRED = ("Conv BatchNormalization Relu LeakyRelu Clip Sigmoid HardSigmoid HardSwish Tanh Erf Gelu Softplus Exp Log "
            "Sqrt Pow Neg Reciprocal Abs Add Sub Mul Div Max Min Where Equal Less Greater Not Cast MatMul Gemm MaxPool "
            "AveragePool GlobalAveragePool ReduceMean ReduceSum ReduceMax Softmax LogSoftmax LayerNormalization Reshape "
            "Flatten Transpose Squeeze Unsqueeze Concat Split Slice Gather Expand Shape ConstantOfShape Range Identity "
            "Dropout Pad").split()

ATTRS = {"LeakyRelu": {"alpha": 0.1}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4}, "Gelu": {},
         "Cast": {"to": 1}, "QuantizeDequantize": {"scale": 0.05, "zero_point": 3, "lo": -128, "hi": 127}}


def test_required_ops_are_registered():
    assert [op for op in REQUIRED if op not in OPS] == []
    assert OPS["Conv"].kind == OPS["MatMul"].kind == ANCHOR
    assert OPS["Softmax"].kind == OPS["LayerNormalization"].kind == OPS["ReduceMean"].kind == REDUCE
    assert OPS["Reshape"].kind == OPS["Transpose"].kind == INJECTIVE
    assert OPS["Add"].kind == BROADCAST and OPS["Erf"].kind == ELEMWISE


def _eval_expr(expr: str, args):
    env = {"math": math, "np": np, "max": max, "min": min, "abs": abs}
    env.update({f"a{k}": v for k, v in enumerate(args)})
    return eval(expr, env)


@pytest.mark.parametrize("op", sorted(op for op, d in OPS.items() if d.expr is not None and d.kind in (ELEMWISE, BROADCAST)))
def test_expr_matches_reference(op):
    rng = np.random.default_rng(0)
    arity = {"Where": 3, "Clip": 3}.get(op, 1 if OPS[op].kind == ELEMWISE else 2)
    xs = [(rng.uniform(0.1, 2.0, 7) * (1 if op in ("Log", "Sqrt", "Pow") else rng.choice([-1, 1], 7))).astype(np.float32)
          for _ in range(arity)]   # float32, as generated code computes
    if op == "Where":
        xs[0] = xs[0] > 0
    if op == "Clip":
        xs[1], xs[2] = np.float32(-0.5), np.float32(0.7)
    if op in ("Not", "And", "Or", "Xor"):
        xs = [x > 0 for x in xs]
    if op.startswith("Bitwise") or op == "BitShift":   # integer ops: small non-negative ints
        xs = [(np.abs(x) * 3).astype(np.int32) for x in xs]
    if op in ("Asin", "Acos", "Atanh"):  # keep inside each op's domain
        xs = [x / np.float32(2.5) for x in xs]
    if op == "Acosh":
        xs = [1 + np.abs(x) for x in xs]
    node = Node(op, tuple(f"i{k}" for k in range(arity)), ("y",), ATTRS.get(op, {}))
    want = OPS[op].ref(node, xs)[0]
    expr = OPS[op].expr(node, [f"a{k}" for k in range(arity)])
    for j in range(7):
        got = _eval_expr(expr, [x[j] if np.ndim(x) else x for x in xs])
        np.testing.assert_allclose(float(got), float(want[j]), rtol=1e-5, atol=1e-6, err_msg=f"{op}: {expr}")


def test_workload_flops_counts_conv():
    from ir import import_onnx, make_workload, partition, simplify
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.zeros((8, 2, 3, 3), np.float32), "w")
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1])], "c",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 5, 5])], [w]),
        opset_imports=[helper.make_opsetid("", 17)])
    g = simplify(import_onnx(m))
    wl = make_workload(g, partition(g)[0], {"N": 2})
    assert wl.flops() == 2 * (2 * 8 * 5 * 5) * (2 * 3 * 3)

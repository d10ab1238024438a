"""Small model builders shared by foundation tests (onnx.helper, no torch), and `within`."""
from __future__ import annotations

import threading

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def dense_model(m, k, n, epilogue=("bias", "relu"), dynamic_batch=False, seed=0) -> onnx.ModelProto:
    """x[m, k] @ w[k, n] (+ bias) (+ relu) (+ residual input r[m, n])."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y0"])]
    cur, inputs = "y0", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch" if dynamic_batch else m, k])]
    for i, step in enumerate(epilogue):
        out = f"y{i + 1}"
        if step == "bias":
            inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
            nodes.append(helper.make_node("Add", [cur, "b"], [out]))
        elif step == "relu":
            nodes.append(helper.make_node("Relu", [cur], [out]))
        elif step == "residual":
            inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["batch" if dynamic_batch else m, n]))
            nodes.append(helper.make_node("Add", [cur, "r"], [out]))
        elif step == "sigmoid":
            nodes.append(helper.make_node("Sigmoid", [cur], [out]))
        cur = out
    nodes[-1].output[0] = "out"
    g = helper.make_graph(nodes, "dense", inputs,
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch" if dynamic_batch else m, n])],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def within(seconds, fn, what="the call"):
    """fn() on a daemon thread: a lost wake-up fails the test instead of hanging the run."""
    failed = []

    def run():
        try:
            fn()
        except BaseException as e:
            failed.append(e)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(seconds)
    assert not th.is_alive(), f"{what} hung for {seconds} s"
    if failed:
        raise failed[0]


def all_finish(caller, seeds, seconds=60) -> bool:
    """caller(seed) on one thread per seed, at once: whether every one finished in `seconds`."""
    threads = [threading.Thread(target=caller, args=(s,)) for s in seeds]
    for th in threads:
        th.start()
    for th in threads:
        th.join(seconds)
    return not any(th.is_alive() for th in threads)

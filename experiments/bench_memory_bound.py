"""Memory-bound templates: Softmax and LayerNormalization rows of (128, 256) and (128, 1024),
and a long elementwise chain, in GB/s (bytes read + written / time) vs a NumPy copy of the same
bytes (np.copyto of an array of the input's size: the bandwidth ceiling), plus onnxruntime
(one-node models, same threads) for the same op.

Run: python experiments/bench_memory_bound.py   (writes experiments/bench_memory_bound.md)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.pop("OPENBLAS_CORETYPE", None)
os.environ.pop("OPENBLAS_L2_SIZE", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from codegen import compile_kernel  # noqa: E402
from bench_conv import machine, timeit  # noqa: E402
from schedules import get_template  # noqa: E402
from ir.settings import Settings, current, use  # noqa: E402
from tests.template_cases import make_wl, precompile  # noqa: E402

CHAIN = [("Mul", "i1"), ("Add", "i2"), ("Tanh", None), ("Mul", "i1"), ("Sub", "i2"), ("Relu", None),
         ("Mul", "i1"), ("Add", "i2"), ("Sigmoid", None), ("Mul", "i1"), ("Add", "i2"), ("Abs", None)]


def cases():
    out = []
    for rows, cols in ((128, 256), (128, 1024)):
        out.append((f"Softmax {rows}x{cols}", "reduce", make_wl([("Softmax", ["i0"], {"axis": -1})], [((rows, cols), "float32", False)]),
                    [{"lanes": l, "cache": c} for l in (8, 16) for c in (True, False)]))
        out.append((f"LayerNorm {rows}x{cols}", "reduce", make_wl(
            [("LayerNormalization", ["i0", "i1", "i2"], {"axis": -1})],
            [((rows, cols), "float32", False), ((cols,), "float32", True), ((cols,), "float32", True)]),
            [{"lanes": l, "cache": c} for l in (8, 16) for c in (True, False)]))
    ops, prev = [], "i0"
    for k, (op, arg) in enumerate(CHAIN):
        ops.append((op, [prev] + ([arg] if arg else []), {}))
        prev = f"t{k}"
    out.append((f"{len(CHAIN)}-op elementwise chain 4Mi", "elementwise", make_wl(
        ops, [((2048, 2048), "float32", False), ((), "float32", True), ((), "float32", True)]),
        [{"vector": v, "unroll": u} for v in ("flat",) for u in (1, 8)]))
    return out


def ort_session(wl, arrays, threads):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    names = {f"i{k}": f"x{k}" for k in range(len(wl.inputs))}
    nodes, inits = [], []
    for k, o in enumerate(wl.ops):
        nodes.append(helper.make_node(o["op"], [names.get(r, r) for r in o["in"]], [f"t{k}"], **o["attrs"]))
    for k, spec in enumerate(wl.inputs[1:], start=1):
        inits.append(numpy_helper.from_array(arrays[k], f"x{k}"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, list(wl.inputs[0]["shape"]))],
                          [helper.make_tensor_value_info(f"t{len(wl.ops) - 1}", TensorProto.FLOAT, None)], inits)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main():
    use(Settings.from_env())
    threads = current().num_threads
    rows = []
    all_cases = cases()
    pairs = []
    for name, tname, wl, codes in all_cases:
        t = get_template(tname)
        pairs += [(wl, t.space(wl).validate({**t.default_config(wl).to_json(), **c})) for c in codes]
    by_template = {}
    for (wl, cfg), (_, tname, _, _) in zip(pairs, [c for c in all_cases for _ in c[3]]):
        by_template.setdefault(tname, []).append((wl, cfg))
    for tname, ps in by_template.items():
        precompile(tname, ps)
    for name, tname, wl, codes in all_cases:
        t = get_template(tname)
        arrays = wl.random_inputs(0)
        out = np.empty(wl.output_shape, np.float32)
        nbytes = arrays[0].nbytes + out.nbytes
        best = (float("inf"), "")
        for c in codes:
            for rb in t.space(wl).knobs[3].options:
                cfg = t.space(wl).validate({**t.default_config(wl).to_json(), **c, "RB": rb})
                run = compile_kernel(t, wl, cfg).bind(arrays)
                run(arrays, out)
                np.testing.assert_allclose(out, wl.reference(arrays), rtol=1e-4, atol=1e-4)
                tm = timeit(lambda: run(arrays, out), min_time=0.1)
                best = min(best, (tm, " ".join(f"{k}={v}" for k, v in {**c, "RB": rb}.items())), key=lambda x: x[0])
        src, dst = arrays[0], np.empty_like(arrays[0])
        t_copy = timeit(lambda: np.copyto(dst, src), min_time=0.1)
        sess = ort_session(wl, arrays, threads)
        t_ort = timeit(lambda: sess.run(None, {"x0": arrays[0]}), min_time=0.1)
        rows.append((name, nbytes / 1e6, best[0] * 1e6, nbytes / best[0] / 1e9, nbytes / t_copy / 1e9,
                     t_copy / best[0], nbytes / t_ort / 1e9, best[1]))
        print(rows[-1], flush=True)
    lines = ["# Memory-bound templates: GB/s vs a NumPy copy of the same bytes", "", machine(), "",
             f"GB/s = (input + output bytes) / median time. `copy` = np.copyto of an array of the input's size "
             f"(same bytes moved, one thread). onnxruntime: one-node model, intra_op_num_threads={threads}. "
             f"Ours: best of the listed code configs x run-time RB, parallel=True.", "",
             "| workload | MB moved | ours us | ours GB/s | copy GB/s | ours / copy | ORT GB/s | best config |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r[0]} | {r[1]:.2f} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:.1f} | {r[5]:.2f} | {r[6]:.1f} | {r[7]} |" for r in rows]
    Path(__file__).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

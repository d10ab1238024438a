"""MaxPool / AveragePool layers: the pool template's `window` and `separable` code side by side
with onnxruntime, 1 thread, CPU time of the calling thread, interleaved rounds (`bench_conv.interleaved`), medians.

    python experiments/bench_pool.py [--rounds 7]

Layers: ResNet-18's MaxPool 3x3/2 (64 ch at a 64x64 and a 224x224 image), YOLO's SPPF MaxPool
5x5/1 (256 ch @ 20, 128 @ 40), a 3x3/1 MaxPool and AveragePool, a 2x2/2 MaxPool.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]

import numpy as np  # noqa: E402

from bench_conv import interleaved  # noqa: E402
from codegen import compile_kernel  # noqa: E402
from codegen.backend import get_backend  # noqa: E402
from ir.settings import Settings, use  # noqa: E402
from schedules import get_template  # noqa: E402
from tests.template_cases import make_wl  # noqa: E402

# (channels, input size, op, kernel, stride, pad)
LAYERS = [(64, 32, "MaxPool", 3, 2, 1), (64, 112, "MaxPool", 3, 2, 1), (256, 20, "MaxPool", 5, 1, 2),
          (128, 40, "MaxPool", 5, 1, 2), (64, 56, "MaxPool", 3, 1, 1), (64, 32, "AveragePool", 3, 1, 1),
          (64, 28, "MaxPool", 2, 2, 0)]


def ort_pool(op: str, attrs: dict, shape: tuple):
    import onnxruntime as ort
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "pool",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    return ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                                so, providers=["CPUExecutionProvider"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    settings = Settings.from_env().with_(threads=1)
    use(settings)
    pool, backend = get_template("pool"), get_backend(None, settings)
    names = ["window", "separable", "default", "onnxruntime"]
    print("| layer | " + " | ".join(f"{n} us" for n in names) + " | separable / window | default / onnxruntime |")
    print("|---|" + "---:|" * (len(names) + 2), flush=True)
    for c, h, op, k, s, p in LAYERS:
        attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4}
        wl = make_wl([(op, ["i0"], attrs)], [((1, c, h, h), "float32", False)])
        a = wl.random_inputs(0)
        y = np.empty(wl.output_shape, np.float32)
        ref = wl.reference(a)
        default = pool.default_config(wl)
        fns = {}
        for name in names[:3]:
            cfg = default if name == "default" else pool.space(wl).validate({**default.to_json(), "algo": name})
            run = compile_kernel(pool, wl, cfg).bind([None], backend)
            run(a, y)
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
            fns[name] = (lambda run: lambda: run(a, y))(run)
        sess = ort_pool(op, attrs, (1, c, h, h))
        fns["onnxruntime"] = lambda: sess.run(None, {"x": a[0]})
        med = {n: statistics.median(v) * 1e6 for n, v in interleaved(fns, args.rounds).items()}
        print(f"| {op} {k}x{k}/{s} {c} ch @{h} ({default['algo']}) | " + " | ".join(f"{med[n]:.1f}" for n in names)
              + f" | {med['separable'] / med['window']:.2f} | {med['default'] / med['onnxruntime']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

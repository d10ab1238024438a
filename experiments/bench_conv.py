"""Every distinct ResNet-18 conv (batch 1, 224x224, + bias + Relu) with the conv2d template vs
onnxruntime, same thread count. Each layer's time is the best of a small config sweep (no tuner):
a few code shapes (compiled in parallel) x run-time block knobs; median of repeated runs.

Run: python experiments/bench_conv.py [--quick]   (writes experiments/bench_conv.md)
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.pop("OPENBLAS_CORETYPE", None)   # this process only: compare against an untuned NumPy/ORT
os.environ.pop("OPENBLAS_L2_SIZE", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from codegen import compile_kernel  # noqa: E402
from schedules import get_template  # noqa: E402
from ir.settings import Settings, current, use  # noqa: E402
from tests.template_cases import conv_wl, precompile  # noqa: E402

# (C, H, OC, kernel, stride, pad): every distinct conv of ResNet-18 at 224x224
LAYERS = [(3, 224, 64, 7, 2, 3), (64, 56, 64, 3, 1, 1), (64, 56, 128, 3, 2, 1), (64, 56, 128, 1, 2, 0),
          (128, 28, 128, 3, 1, 1), (128, 28, 256, 3, 2, 1), (128, 28, 256, 1, 2, 0), (256, 14, 256, 3, 1, 1),
          (256, 14, 512, 3, 2, 1), (256, 14, 512, 1, 2, 0), (512, 7, 512, 3, 1, 1)]
CODE = [("direct", "4x32", "oc_px"), ("im2col", "4x32", "oc_px"), ("direct", "8x16", "oc_px")]
RUNTIME = [dict(OCB=o, PB=p) for o in (1, 4) for p in (1, 4)]


def timeit(fn, min_time=0.2, repeat=7):
    fn()
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_time / repeat or n >= 1000:
            break
        n *= 2
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


def ort_session(c, h, oc, k, s, p, w, b, threads):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    g = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y0"], strides=[s, s], pads=[p] * 4),
                           helper.make_node("Relu", ["y0"], ["y"])], "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def machine() -> str:
    import numba
    import onnxruntime
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), platform.processor())
    try:
        from threadpoolctl import threadpool_info
        blas = ", ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})" for i in threadpool_info())
    except ImportError:
        blas = "threadpoolctl not installed"
    return (f"{cpu}, {len(os.sched_getaffinity(0))} cores usable, threads used: {current().num_threads}; Python {platform.python_version()}, "
            f"numba {numba.__version__}, onnxruntime {onnxruntime.__version__}; BLAS: {blas}. "
            f"Other work shared the cores while this ran: ratios are more reliable than absolute numbers.")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="first code shape and run-time config only")
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = ap.parse_args()
    use(Settings.from_env())
    conv = get_template("conv2d")
    threads = current().num_threads
    code = CODE[:1] if args.quick else CODE
    runtime = RUNTIME[:1] if args.quick else RUNTIME
    wls = [conv_wl(1, c, h, h, oc, k=k, s=s, p=p, epi=("relu",)) for c, h, oc, k, s, p in LAYERS]

    def cfg(wl, a, r, o, rt):
        return conv.space(wl).validate({"algo": a, "regtile": r, "order": o, "parallel": True, **rt})

    t0 = time.time()
    precompile("conv2d", [(wl, cfg(wl, *cs, runtime[0])) for wl in wls for cs in code])
    print(f"compiled in {time.time() - t0:.0f} s", flush=True)
    rows = []
    for (c, h, oc, k, s, p), wl in zip(LAYERS, wls):
        arrays = wl.random_inputs(0)
        out = np.empty(wl.output_shape, np.float32)
        best = (float("inf"), None)
        for cs in code:
            for rt in runtime:
                kern = compile_kernel(conv, wl, cfg(wl, *cs, rt))
                run = kern.bind([None, arrays[1], arrays[2]])
                run(arrays, out)
                np.testing.assert_allclose(out, wl.reference(arrays), rtol=1e-3, atol=1e-3)
                t = timeit(lambda: run(arrays, out))
                best = min(best, (t, f"{cs[0]} {cs[1]} {cs[2]} OCB={rt['OCB']} PB={rt['PB']}"), key=lambda x: x[0])
        sess = ort_session(c, h, oc, k, s, p, arrays[1], arrays[2], threads)
        t_ort = timeit(lambda: sess.run(None, {"x": arrays[0]}))
        gf = wl.flops() / 1e9
        rows.append((f"{c}->{oc} {k}x{k}/{s} @{h}", gf * 1e3, best[0] * 1e3, gf / best[0], t_ort * 1e3, gf / t_ort,
                     t_ort / best[0], best[1]))
        print(rows[-1], flush=True)
    ratios = sorted(r[6] for r in rows)
    med = statistics.median(ratios)
    lines = ["# conv2d template vs onnxruntime: ResNet-18 convs, batch 1", "", machine(), "",
             f"Each row: Conv + bias + Relu, the best of {len(code)} code shapes x {len(runtime)} run-time configs "
             f"(median of 7 repeats), vs onnxruntime (intra_op_num_threads={threads}).", "",
             "| layer | MFLOP | ours ms | ours GFLOP/s | ORT ms | ORT GFLOP/s | speed vs ORT | best config |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r[0]} | {r[1]:.0f} | {r[2]:.3f} | {r[3]:.1f} | {r[4]:.3f} | {r[5]:.1f} | {r[6]:.2f}x | {r[7]} |" for r in rows]
    lines += ["", f"Median speed vs onnxruntime over the {len(rows)} layers: **{med:.2f}x** "
              f"(min {ratios[0]:.2f}x, max {ratios[-1]:.2f}x). Total wall time {time.time() - t0:.0f} s.", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

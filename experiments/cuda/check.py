"""Device check of the cuda backend (issue 12): one command on a machine with an NVIDIA GPU.

    pip install -e '.[cuda]'          # numba-cuda (and nothing else) on top of the project
    python experiments/cuda/check.py  # about 5-8 minutes; writes experiments/cuda/results.md

Tunes a 2048^3 float32 dense and a ResNet-18 3x3 conv layer (64 channels, 56x56, batch 1,
+ bias + ReLU) with the tuner's Python API for a small budget, deploys each from the
database with `runtime.load(..., target="cuda")`, and reports GFLOP/s of the default and
the best config, the ratio to cuBLAS/cuDNN (through CuPy or torch, whichever is
importable: the report says which, or that neither is), the error against NumPy, and the
device. With `--resnet` it also tunes ResNet-18 end to end (batch 1, 224) and compares it
with onnxruntime's CUDA provider when that is installed. Nothing is downloaded.

`--tiny` runs the same steps on tiny sizes, for numba-cuda's simulator
(NUMBA_ENABLE_CUDASIM=1): that is how the script itself is tested on machines without a GPU.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def dense_model(n: int):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], f"dense{n}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), 2 * n ** 3


def conv_model(c: int, hw: int):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
                           helper.make_node("Relu", ["y"], ["z"])], f"conv{c}x{hw}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, c, hw, hw])], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), 2 * c * c * 9 * hw * hw


def _median(ts: list[float]) -> float:
    ts = sorted(ts)
    return ts[len(ts) // 2]


def deployed(path: str, db, settings, runs: int) -> tuple[float, np.ndarray, dict, object]:
    """(median seconds per call incl. the input upload and output download, output, feeds, model)."""
    import runtime
    from runtime.cli import random_feeds
    m = runtime.load(path, db=db, target="cuda", settings=settings)
    feeds = random_feeds(m.graph, {}, 0)
    out = m.run(feeds)
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        m.run(feeds)
        ts.append(time.perf_counter() - t0)
    return _median(ts), list(out.values())[0], feeds, m


def vendor_dense(n: int, runs: int):
    """(seconds, library) of an n^3 float32 matmul in cuBLAS through CuPy or torch; (None, why) otherwise."""
    try:
        import cupy as cp
        a, b = cp.random.rand(n, n, dtype=cp.float32), cp.random.rand(n, n, dtype=cp.float32)
        return _events(lambda: a @ b, runs, cp.cuda.Event, lambda s, e: cp.cuda.get_elapsed_time(s, e)), "cuBLAS (CuPy)"
    except Exception as e:
        why = f"CuPy: {type(e).__name__}"
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA in torch")
        torch.backends.cuda.matmul.allow_tf32 = False
        a, b = torch.rand(n, n, device="cuda"), torch.rand(n, n, device="cuda")
        return _events(lambda: a @ b, runs, lambda: torch.cuda.Event(enable_timing=True),
                       lambda s, e: s.elapsed_time(e)), "cuBLAS (torch, TF32 off)"
    except Exception as e:
        return None, f"neither CuPy nor torch with CUDA ({why}; torch: {type(e).__name__})"


def vendor_conv(c: int, hw: int, runs: int):
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA in torch")
        torch.backends.cudnn.allow_tf32 = False
        x, w, b = (torch.rand(1, c, hw, hw, device="cuda"), torch.rand(c, c, 3, 3, device="cuda"),
                   torch.rand(c, device="cuda"))
        f = lambda: torch.relu(torch.nn.functional.conv2d(x, w, b, padding=1))  # noqa: E731
        return _events(f, runs, lambda: torch.cuda.Event(enable_timing=True), lambda s, e: s.elapsed_time(e)), \
            "cuDNN (torch, TF32 off)"
    except Exception as e:
        return None, f"torch with CUDA not available ({type(e).__name__})"


def _events(fn, runs: int, event, elapsed_ms) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(runs):
        s, e = event(), event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(elapsed_ms(s, e) / 1000.0)
    return _median(ts)


def tune_and_report(name: str, model, flops: int, reference, args, settings, lines: list, vendor) -> None:
    import onnx
    from database import Database
    from tuner.tune import TuneOptions, tune_model
    work = Path(tempfile.mkdtemp(prefix="tt_cuda_"))
    path = str(work / f"{name}.onnx")
    onnx.save(model, path)
    db = Database(f"sqlite:///{work / 'tuning.db'}")
    t0 = time.perf_counter()
    opts = TuneOptions(trials=args.trials, strategy="xgb", time_budget=args.time_budget, progress=False,
                       repeat=3, min_repeat_ms=args.min_repeat_ms)
    _, _, reports, _ = tune_model(path, db, opts, settings=settings)
    tune_s = time.perf_counter() - t0
    lat, out, feeds, m = deployed(path, db, settings, args.runs)
    expected = reference(feeds)
    err = float(np.max(np.abs(out - expected)) / max(1e-30, float(np.max(np.abs(expected)))))
    main = max(reports, key=lambda r: r.task.flops) if reports else None
    vend_s, vend_name = vendor
    cells = {"default": main.default if main else None, "best": main.best if main else None}
    gf = {k: (flops / v / 1e9 if v else None) for k, v in cells.items()}
    ratio = (vend_s / cells["best"]) if (vend_s and cells["best"]) else None
    fmt = lambda v, f="{:.4g}": "-" if v is None else f.format(v)  # noqa: E731
    lines.append(f"| {name} | {len(reports)} | {sum(r.trials for r in reports)} | {tune_s:.0f} | "
                 f"{fmt(gf['default'])} | {fmt(gf['best'])} | "
                 f"{fmt(vend_s and flops / vend_s / 1e9)} ({vend_name}) | {fmt(ratio, '{:.2f}')}x | "
                 f"{lat * 1e3:.3f} | {err:.1e} | {m.coverage()} |")
    print(lines[-1], flush=True)


def resnet_e2e(args, settings, lines: list) -> None:
    import onnx
    from database import Database
    from models import make_resnet18
    from tuner.tune import TuneOptions, tune_model
    work = Path(tempfile.mkdtemp(prefix="tt_cuda_resnet_"))
    path = str(work / "resnet18.onnx")
    onnx.save(make_resnet18(image=224), path)
    db = Database(f"sqlite:///{work / 'tuning.db'}")
    opts = TuneOptions(trials=args.resnet_trials, strategy="xgb", time_budget=args.resnet_budget, progress=False,
                       repeat=3, min_repeat_ms=args.min_repeat_ms)
    tune_model(path, db, opts, dims=None, shapes={"batch": [1]}, settings=settings)
    import runtime
    from runtime.cli import random_feeds
    m = runtime.load(path, db=db, target="cuda", settings=settings)
    feeds = random_feeds(m.graph, {"batch": 1}, 0)
    m.run(feeds)
    ours = _median([_timed(lambda: m.run(feeds)) for _ in range(args.runs)])
    try:
        import onnxruntime as ort
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError("onnxruntime has no CUDA provider here")
        sess = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
        sess.run(None, feeds)
        theirs = _median([_timed(lambda: sess.run(None, feeds)) for _ in range(args.runs)])
        vs = f"{theirs * 1e3:.2f} ms, ratio {ours / theirs:.2f}x"
    except Exception as e:
        vs = f"not measured: {e}"
    lines.append(f"\nResNet-18 (224, batch 1) end to end, tuned {args.resnet_trials} trials / "
                 f"{args.resnet_budget:.0f} s: **{ours * 1e3:.2f} ms**; onnxruntime CUDA provider: {vs}. "
                 f"Coverage: {m.coverage()}")
    print(lines[-1], flush=True)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200, help="tuning trials per problem (default 200)")
    ap.add_argument("--time-budget", type=float, default=120.0, help="seconds of tuning per problem (default 120)")
    ap.add_argument("--min-repeat-ms", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=20, help="deployed calls timed (median)")
    ap.add_argument("--resnet", action="store_true", help="also tune and time ResNet-18 end to end")
    ap.add_argument("--resnet-trials", type=int, default=400)
    ap.add_argument("--resnet-budget", type=float, default=150.0)
    ap.add_argument("--tiny", action="store_true", help="tiny sizes, for numba-cuda's simulator")
    ap.add_argument("--problems", default="dense,conv", help="which of dense,conv to run (default both)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("results.md")))
    args = ap.parse_args(argv)
    from codegen import get_backend
    from codegen.cuda import simulator
    from ir.settings import Settings
    settings = Settings.from_env().with_(backend="cuda")
    target = get_backend("cuda", settings).target()   # no GPU and no simulator: one clear line
    n, c, hw = (12, 3, 4) if args.tiny else (2048, 64, 56)
    if args.tiny:
        args.trials, args.time_budget = min(args.trials, 4), min(args.time_budget, 60)
        args.runs, args.min_repeat_ms = min(args.runs, 2), 1.0
    t_start = time.perf_counter()
    device = (f"{target.name}, compute capability {target.cc}, {target.sm_count or '?'} SMs, "
              f"numba-cuda {target.numba_cuda}" + (" (simulator)" if simulator() else ""))
    lines = ["# cuda backend device check\n", f"Device: {device}. Target key `{target.key}`.\n",
             f"Tuning: xgb, {args.trials} trials / {args.time_budget:.0f} s per problem; "
             f"deployed latency = median of {args.runs} `model.run` calls incl. upload and download.\n",
             "| problem | tasks | trials | tune s | default GFLOP/s | best GFLOP/s | vendor GFLOP/s | best / vendor "
             "| deployed ms | max rel err | coverage |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    problems = {p.strip() for p in args.problems.split(",")}
    if "dense" in problems:
        model, flops = dense_model(n)
        w = np.asarray(__import__("onnx").numpy_helper.to_array(model.graph.initializer[0]))
        vendor = (None, "simulator") if simulator() else vendor_dense(n, args.runs)
        tune_and_report(f"dense {n}^3", model, flops, lambda f: f["x"] @ w, args, settings, lines, vendor)
    if "conv" in problems:
        model, flops = conv_model(c, hw)
        from ir import import_onnx
        from ir.reference import run_reference
        g = import_onnx(model)
        vendor = (None, "simulator") if simulator() else vendor_conv(c, hw, args.runs)
        tune_and_report(f"conv3x3 {c}ch {hw}x{hw}", model, flops, lambda f: run_reference(g, f)[g.outputs[0]],
                        args, settings, lines, vendor)
    if args.resnet and not args.tiny:
        resnet_e2e(args, settings, lines)
    lines.append(f"\nTotal {time.perf_counter() - t_start:.0f} s.")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from ir.errors import TensortuneError
    try:
        sys.exit(main())
    except TensortuneError as e:
        print(f"check: error: {e}", file=sys.stderr)
        sys.exit(2)

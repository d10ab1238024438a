"""Issue-2 figures on the bundled MLP: a real `tune` run of N trials, then
best vs default latency of the dense task, GFLOP/s vs NumPy on the same shape and
threads, candidates measured per minute, numba compile time per candidate.

Run: python experiments/foundation/bench_mlp.py [--trials 64]   (writes results.md here)
"""
import os

for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(var, None)

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from codegen import host_target  # noqa: E402
from database import Database  # noqa: E402
from tuner.tune import TuneOptions, tune_model  # noqa: E402

HERE = Path(__file__).parent
MLP = HERE.parent / "models" / "mlp.onnx"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        from ir.settings import current, use
        use(current().with_(cache_dir=d))  # cold kernel cache: compile times are real
        db = Database(f"sqlite:///{d}/t.db")
        t0 = time.perf_counter()
        _, _, reports, _ = tune_model(MLP, db, TuneOptions(trials=args.trials, progress=False))
        wall = time.perf_counter() - t0
        recs = db.records()
    rep = reports[0]
    wl = rep.task.workload
    m, k = wl.inputs[0]["shape"]
    n = wl.inputs[1]["shape"][1]
    x, w, b = wl.random_inputs(0)
    timings = {}
    for threads in (1, 2):
        with threadpool_limits(threads, user_api="blas"):
            def f():
                y = x @ w
                y += b
                np.maximum(y, 0, out=y)
            f()
            ts = []
            for _ in range(7):
                t1 = time.perf_counter()
                for _ in range(200):
                    f()
                ts.append((time.perf_counter() - t1) / 200)
            timings[threads] = float(np.median(ts))
    compiles = [r.compile_s for r in recs if r.compile_s and r.compile_s > 0.2]  # cache loads take ~20 ms
    ok = [r for r in recs if r.status == "ok"]
    threads_best = 2 if rep.best_config.get("parallel") else 1
    t = host_target()
    flops = wl.flops()
    lines = ["# Foundation figures: the bundled MLP (3 x Gemm+Relu, 256 wide, batch 32)", "",
             f"Machine: {t.cpu} ({t.cpu_name}, {t.cores} cores); numba {t.numba}. One `tune` run of "
             f"{args.trials} trials (random search) with a cold kernel cache.", "",
             "| figure | value |", "|---|---|",
             f"| dense task | {wl.describe()} x{rep.task.weight} |",
             f"| default config latency | {rep.default * 1e6:.1f} us |",
             f"| best latency after {rep.trials} trials | {rep.best * 1e6:.1f} us ({flops / rep.best / 1e9:.1f} GFLOP/s) |",
             f"| speedup best / default | {rep.default / rep.best:.2f}x |",
             f"| NumPy x@w+b, relu, 1 thread | {timings[1] * 1e6:.1f} us ({flops / timings[1] / 1e9:.1f} GFLOP/s) |",
             f"| NumPy x@w+b, relu, 2 threads | {timings[2] * 1e6:.1f} us ({flops / timings[2] / 1e9:.1f} GFLOP/s) |",
             f"| best / NumPy on the same threads ({threads_best}) | {timings[threads_best] / rep.best:.2f}x |",
             f"| best config | `{rep.best_config}` |",
             f"| candidates measured per minute | {len(recs) / wall * 60:.1f} ({len(recs)} in {wall:.0f} s, {len(ok)} ok) |",
             f"| numba compile time per compiled candidate | median {np.median(compiles):.2f} s, max {max(compiles):.2f} s "
             f"({len(compiles)} of {len(recs)} candidates needed a compile; the rest shared a compiled kernel) |"]
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

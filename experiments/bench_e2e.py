"""End-to-end latency: tensortune (default configs, and tuned ones with --db/--plan) vs
onnxruntime at the same intra-op thread count, on MLP, ResNet-18 and BERT.

    python experiments/bench_e2e.py [--db URL | --plan FILE] [--threads 1 2] [--out experiments/bench_e2e.md]

Each case: load, one warm-up run (compiles what the kernel cache lacks), then timed runs
until `--reps` runs or `--budget` seconds; the median is reported. Writes a Markdown table.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.pop("OPENBLAS_CORETYPE", None)   # both slow NumPy's BLAS (FACTS.md); before numpy loads
os.environ.pop("OPENBLAS_L2_SIZE", None)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

MODELS = ROOT / "experiments" / "models"
CASES = [  # (name, file, writer script, sizes per batch)
    ("MLP", "mlp.onnx", None, lambda b: {"batch": b}),
    ("ResNet-18 (224)", "resnet18.onnx", "make_resnet.py", lambda b: {"batch": b}),
    ("BERT-style (4 layers, 256 hidden, seq 128)", "bert.onnx", "make_bert.py", lambda b: {"batch": b, "seq": 128}),
]


def ensure(file: str, writer: str | None) -> Path:
    path = MODELS / file
    if not path.exists() and writer:
        subprocess.run([sys.executable, str(MODELS / writer)], check=True)
    return path


def timed(fn, reps: int, budget: float) -> tuple[float, int]:
    lat, start = [], time.perf_counter()
    while len(lat) < reps and (len(lat) < 3 or time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t0)
    return float(np.median(lat)), len(lat)


def bench_case(path: Path, sizes: dict, threads: int, args, source: dict) -> dict:
    import onnxruntime as ort
    from threadpoolctl import threadpool_limits
    import runtime
    from runtime.cli import random_feeds
    from ir.settings import current, use
    use(current().with_(threads=threads))
    row = {}
    with threadpool_limits(threads):
        t0 = time.perf_counter()
        model = runtime.load(path, **source)
        feeds = random_feeds(model.graph, sizes, seed=0)
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ours = model.run(feeds)
        row["first_s"] = time.perf_counter() - t0
        row["load_s"] = load_s
        model.program(sizes).steps  # noqa: B018  (built above)
        row["tt_ms"], row["tt_n"] = (x * 1e3 if i == 0 else x for i, x in enumerate(
            timed(lambda: model.run(feeds), args.reps, args.budget)))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
        row["ort_ms"], row["ort_n"] = (x * 1e3 if i == 0 else x for i, x in enumerate(
            timed(lambda: sess.run(None, feeds), args.reps, args.budget)))
        got = [ours[o.name] for o in sess.get_outputs()]
        row["max_abs_out"] = max(float(np.abs(b).max()) for b in ref)
        row["max_abs_err"] = max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(got, ref))
    cov = model.coverage(sizes)
    row["coverage"] = ", ".join(f"{k} {cov.share(k):.0%}" for k in ("tuned", "nearest", "default", "reference")
                                if cov.counts.get(k))
    row["ref_time"] = cov.time_share("reference")
    mem = model.memory(sizes)
    row["mem"] = f"{_size(mem.arena_bytes)} / {_size(mem.no_reuse_bytes)} ({mem.ratio:.2f}x)"
    return row


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def machine() -> str:
    from threadpoolctl import threadpool_info
    import numba
    import onnxruntime
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    blas = ", ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')})" for i in threadpool_info()
                     if i.get("user_api") == "blas")
    return (f"{cpu}, {len(os.sched_getaffinity(0))} cores available (shared with other work), Python "
            f"{platform.python_version()}, numba {numba.__version__}, onnxruntime {onnxruntime.__version__}, "
            f"NumPy BLAS: {blas or '?'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--db", help="tuning database URL: tuned configs where it has them")
    src.add_argument("--plan", help="plan file written by `tune --plan`")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--models", nargs="+", default=[c[0].split()[0] for c in CASES],
                    help="which of MLP ResNet-18 BERT-style")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget", type=float, default=4.0, help="seconds of timed runs per case and runtime")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "bench_e2e.md"))
    args = ap.parse_args(argv)
    from ir.settings import Settings, use
    use(Settings.from_env())   # a command line: reads the environment like the CLIs
    source = {"db": args.db} if args.db else {"plan": args.plan} if args.plan else {}
    label = "tuned (db)" if args.db else "tuned (plan)" if args.plan else "untuned (default configs)"
    rows, t_start = [], time.perf_counter()
    for name, file, writer, sizes_of in CASES:
        if name.split()[0] not in args.models:
            continue
        path = ensure(file, writer)
        for batch in args.batches:
            for threads in args.threads:
                r = bench_case(path, sizes_of(batch), threads, args, source)
                r.update(model=name, batch=batch, threads=threads)
                rows.append(r)
                print(f"{name} b{batch} t{threads}: tensortune {r['tt_ms']:.2f} ms, onnxruntime {r['ort_ms']:.2f} ms "
                      f"({r['tt_ms'] / r['ort_ms']:.2f}x), {r['coverage']}, first run {r['first_s']:.2f} s", flush=True)
    total = time.perf_counter() - t_start
    lines = [
        "# End-to-end latency: tensortune vs onnxruntime",
        "",
        f"Written by `python experiments/bench_e2e.py{' --db …' if args.db else ''}{' --plan …' if args.plan else ''}` "
        f"in {total:.0f} s. Kernels: **{label}**.",
        "",
        f"Machine: {machine()}. `OPENBLAS_CORETYPE`/`OPENBLAS_L2_SIZE` unset in the process.",
        "Both runtimes get the same thread count (onnxruntime `intra_op_num_threads`, tensortune "
        "`Settings.threads` and the NumPy BLAS pool via threadpoolctl). Medians of up to "
        f"{args.reps} runs ({args.budget:.0f} s budget per case); ratio = tensortune / onnxruntime (lower is better).",
        "",
        "| model | batch | threads | tensortune ms | onnxruntime ms | ratio | kernels (share of nodes) | reference share of time | activations planned / no reuse | max abs err (of max abs output) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['threads']} | {r['tt_ms']:.2f} | {r['ort_ms']:.2f} | "
                     f"{r['tt_ms'] / r['ort_ms']:.2f} | {r['coverage']} | {r['ref_time']:.0%} | {r['mem']} | "
                     f"{r['max_abs_err']:.1e} (of {r['max_abs_out']:.2g}) |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

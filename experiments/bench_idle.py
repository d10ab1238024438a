"""A call after an idle gap: how much slower than back to back, untuned tensortune vs onnxruntime.

    python experiments/bench_idle.py [--models resnet18 bert vit mobilenetv2] [--threads 1 2] [--gaps 0 2 20]

A server that answers one request now and then calls the model after its cores have idled. On a
2-vCPU KVM guest (Intel Xeon, 2026-12-04) a call 20 ms after the last one took up to twice as long
as one right after it, on one thread too: the idle vCPU halts, and what it held in its caches and
its clock speed are not there when the next call starts. This measures it per model, thread
count and gap, for tensortune's untuned model and onnxruntime, in one process, in interleaved
rounds (each round: every runtime, thread count and gap in turn; medians of the rounds' medians).
Writes a Markdown table to --out (default experiments/bench_idle.md).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("OPENBLAS_CORETYPE", None)
os.environ.pop("OPENBLAS_L2_SIZE", None)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
sys.path.insert(0, str(ROOT / "experiments" / "models"))
sys.path.insert(0, str(ROOT / "tests"))


def median_call_ms(call, gap_s: float, calls: int) -> float:
    ts = []
    for _ in range(calls):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def bench(name: str, build, sizes: dict, threads: list[int], gaps: list[float], rounds: int, work: Path) -> dict:
    import onnx
    import onnxruntime as ort
    import runtime
    from ir.settings import Settings
    from runtime.cli import random_feeds
    path = work / f"{name}.onnx"
    onnx.save(build(), path)
    runtimes = {}
    for t in threads:
        m = runtime.load(str(path), settings=Settings.from_env().with_(threads=t))
        feeds = random_feeds(m.graph, sizes, seed=0)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = t, 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        runtimes[("tensortune", t)] = (lambda m=m, f=feeds: m.run(f))
        runtimes[("onnxruntime", t)] = (lambda s=sess, f=feeds: s.run(None, f))
    for call in runtimes.values():
        for _ in range(5):
            call()
    res: dict = {}
    for _ in range(rounds):
        for key, call in runtimes.items():
            for g in gaps:
                res.setdefault((*key, g), []).append(median_call_ms(call, g, 30 if g == 0 else 8))
    return {k: statistics.median(v) for k, v in res.items()}


def main(argv=None) -> int:
    from bench_tuned import _models, machine
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=None)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--gaps", type=float, nargs="+", default=[0, 2, 20], help="idle gaps before a call, ms")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "bench_idle.md"))
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits
    models = _models()
    gaps = [g / 1e3 for g in args.gaps]
    lines = ["# A call after an idle gap vs back to back", "",
             f"Written by `python experiments/bench_idle.py` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). "
             f"Machine: {machine()}.", "",
             "Median wall ms per call; in brackets the ratio to the same runtime's back-to-back calls. "
             "tensortune: untuned (default configs).", "",
             "| model | runtime | threads | " + " | ".join(f"gap {g:g} ms" for g in args.gaps) + " |",
             "| --- | --- | ---: | " + " | ".join("---:" for _ in args.gaps) + " |"]
    with tempfile.TemporaryDirectory(prefix="bench_idle_") as tmp, threadpool_limits(1, user_api="blas"):
        for name in args.models or list(models):
            label, build, sizes = models[name]
            r = bench(name, build, sizes, args.threads, gaps, args.rounds, Path(tmp))
            for who in ("tensortune", "onnxruntime"):
                for t in args.threads:
                    base = r[(who, t, gaps[0])]
                    cells = [f"{r[(who, t, g)]:.3f}" + ("" if g == gaps[0] else f" ({r[(who, t, g)] / base:.2f})")
                             for g in gaps]
                    lines.append(f"| {label} | {who} | {t} | " + " | ".join(cells) + " |")
                    print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

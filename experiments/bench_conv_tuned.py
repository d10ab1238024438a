"""The issue's per-layer target as a user meets it: each conv layer (Conv + bias + Relu, batch 1)
saved as a one-layer ONNX model, tuned with `tune`'s own loop (`tune_model`, its in-model check
included) for at most `--trials` candidates into a fresh database, then the deployed layer, the
untuned layer (default config) and onnxruntime timed in turns on the same input
(`bench_tuned.bench`: rounds of blocks of calls, the order rotating; 1 thread: the calling
thread's CPU time, which preemption does not inflate). Also the tuner's throughput on conv
tasks (candidates a minute, compiles included, on the cores this process has).

    python experiments/bench_conv_tuned.py [--only "3x3/2,1x1/1 @7"] [--trials 64] [--threads 1]
        [--time-budget 240] [--out experiments/bench_conv_tuned.md]

`--only` takes substrings of bench_conv.py's layer labels ("64->128 3x3/2 @56"); the default is
the layers where the default config was under onnxruntime alone (bench_conv.md, Zen 3).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.pop("OPENBLAS_CORETYPE", None)
os.environ.pop("OPENBLAS_L2_SIZE", None)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import numpy as np  # noqa: E402

from bench_conv import LAYERS, layer_label, layer_proto  # noqa: E402
from bench_tuned import bench, machine  # noqa: E402

WEAKEST = ("64->128 3x3/2 @56,128->256 3x3/2 @28,256->512 3x3/2 @14,160->960 1x1/1 @7,960->320 1x1/1 @7,"
           "320->1280 1x1/1 @7")


def layer_model(c, h, oc, k, s, p, g):
    """A builder of the layer as an ONNX model (weights seeded by the geometry)."""
    def build():
        rng = np.random.default_rng(c * 7919 + oc * 31 + h)
        w = (rng.standard_normal((oc, c // g, k, k)) / np.sqrt(c // g * k * k)).astype(np.float32)
        b = rng.standard_normal(oc).astype(np.float32) * 0.1
        return layer_proto(c, h, oc, k, s, p, g, w, b)
    return build


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=WEAKEST, help="comma-separated substrings of the layer labels")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--time-budget", type=float, default=240.0, metavar="SECONDS", help="per layer")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--strategy", default="xgb")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--block", type=int, default=None)
    ap.add_argument("--min-round-s", type=float, default=0.25)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--verify-runs", type=int, default=10)
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "bench_conv_tuned.md"))
    args = ap.parse_args(argv)
    if args.block is None:
        from tuner.verify import BLOCK
        args.block = BLOCK
    from ir.settings import Settings, use
    use(Settings.from_env())
    wanted = [o for o in args.only.split(",") if o]
    layers = [(net, layer_label(c, h, oc, k, s, g), (c, h, oc, k, s, p, g)) for net, c, h, oc, k, s, p, g in LAYERS]
    layers = [x for x in dict((x[1], x) for x in layers).values() if any(o in x[1] for o in wanted)]
    if not layers:
        print(f"no layer matches --only {args.only!r}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for net, lb, geo in layers:
            for threads in args.threads:
                name = lb.replace("->", "_").replace(" ", "_").replace("/", "s").replace("@", "at")
                r = bench(name, f"{net} {lb}", layer_model(*geo), {}, threads, args, Path(tmp))
                rows.append(r)
                print(f"{r['model']:36s} {threads}T tuned {r['tuned_vs_ms'] * 1e3:8.1f} us  untuned "
                      f"{r['untuned_vs_ms'] * 1e3:8.1f}  onnxruntime {r['ort_ms'] * 1e3:8.1f}  ort/tuned "
                      f"{r['ort_ms'] / r['tuned_vs_ms']:.2f}x  ort/untuned {r['ort_ms'] / r['untuned_vs_ms']:.2f}x  "
                      f"{r['candidates']} candidates, {r['per_min']:.0f}/min", flush=True)
    import subprocess
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = ["# Each conv layer tuned alone (`tune`, at most --trials) against onnxruntime", "",
             f"Machine: {machine()}. Code: {rev or 'unknown'}.", "",
             f"Per layer: `tune_model` for at most {args.trials} trials or {args.time_budget:.0f} s, then the deployed "
             f"layer, the untuned layer and onnxruntime in turns ({args.rounds} rounds; 1 thread: CPU time of the "
             "calling thread, medians; more: wall time's 20th percentile). Conv + bias + Relu, batch 1.", "",
             "A one-layer model's output is the conv's: our call copies it out of the program's buffer (a "
             "model's conv writes into its arena instead), onnxruntime's writes it in place. The step columns "
             "are the conv's step alone inside our call (medians of the same calls).", "",
             "| layer | threads | tuned us | untuned us | onnxruntime us | onnxruntime / tuned | onnxruntime / untuned "
             "| tuned step us | untuned step us | candidates | a minute | tuned config differs |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['threads']} | {r['tuned_vs_ms'] * 1e3:.1f} | {r['untuned_vs_ms'] * 1e3:.1f} "
                     f"| {r['ort_ms'] * 1e3:.1f} | **{r['ort_ms'] / r['tuned_vs_ms']:.2f}x** "
                     f"| {r['ort_ms'] / r['untuned_vs_ms']:.2f}x | {r['tuned_ms'] * 1e3:.1f} | {r['untuned_ms'] * 1e3:.1f} "
                     f"| {r['candidates']} | {r['per_min']:.0f} | {'yes' if r['differ'] else 'no'} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real-exporter models (tests/real_models/): import time, load + first call with a cold and a
warm kernel cache, coverage, and untuned latency vs onnxruntime at one thread.

    python experiments/real_models/bench.py [--models NAME ...] [--out experiments/real_models/results.md]

Each model runs in fresh processes: once with an empty kernel cache (cold), once more
with the cache the first left (warm; this one also times). A model that fails is
reported with the stage and the error's first line. Writes a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments"), str(ROOT / "tests")]
ONE_THREAD = {"TENSORTUNE_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
              "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_one(name: str, fixed: bool, timing: bool, reps: int, budget: float) -> dict:
    """Everything measured for one model in this process (its kernel cache is the env's). `fixed`:
    the model with its dims fixed at the timing shape (cases.Case.with_fixed_dims)."""
    import numpy as np
    import onnxruntime as ort

    import runtime
    from bench_e2e import timed
    from real_models.cases import BY_NAME
    case = BY_NAME[name]
    feeds = case.feeds(1)
    source = case.with_fixed_dims(1) if fixed else str(case.path)
    row, stage = {"model": name, "nodes_in": _node_count(case.path)}, "load"
    try:
        t0 = time.perf_counter()
        model = runtime.load(source)   # import, simplify, partition (kernels compile at the first call)
        row["load_s"] = time.perf_counter() - t0
        row["nodes"], row["subgraphs"] = len(model.graph.nodes), len(model.subgraphs)
        stage = "first call"
        t0 = time.perf_counter()
        ours = model.run(feeds)
        row["first_call_s"] = time.perf_counter() - t0
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
        proto = source.SerializeToString() if fixed else source
        sess = ort.InferenceSession(proto, opts, providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
        row["rel_err"] = max(float(np.max(np.abs(ours[o.name].astype(np.float64) - r), initial=0))
                             / max(float(np.max(np.abs(r), initial=0)), 1e-30) for o, r in zip(sess.get_outputs(), ref))
        if timing:
            stage = "timing"
            row["tt_ms"] = timed(lambda: model.run(feeds), reps, budget)[0] * 1e3
            row["ort_ms"] = timed(lambda: sess.run(None, feeds), reps, budget)[0] * 1e3
        cov = model.coverage()
        row["shares"] = {k: cov.share(k) for k in cov.counts}
        row["ref_time"] = cov.time_share("reference")
        row["ref_ops"] = sorted({n.op for s in model.prepare(feeds).steps if s.kind == "reference"
                                 for n in s.subgraph.nodes})
        row["onnx_reference_ops"] = cov.fallback_ops
    except Exception as e:
        row["error"] = f"{stage}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
    return row


def _node_count(path) -> int:
    import onnx
    return len(onnx.load(str(path), load_external_data=False).graph.node)


def _child(name: str, cache: str, fixed: bool, timing: bool, args) -> dict:
    env = {**os.environ, **ONE_THREAD, "TENSORTUNE_CACHE": cache, "PYTHONPATH": str(ROOT)}
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    cmd = [sys.executable, __file__, "--one", name, "--reps", str(args.reps), "--budget", str(args.budget)]
    cmd += ["--timing"] * timing + ["--fixed"] * fixed
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "error": f"timed out after {args.timeout} s"}
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return {"model": name, "error": f"process exited {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1]}"}
    row = json.loads(lines[-1])
    row["process_s"] = time.perf_counter() - t0
    return row


def _fmt(v, spec=".2f", none="–"):
    return none if v is None else format(v, spec)


def table(rows: list[tuple]) -> list[str]:
    """Two lines per model: its dynamic export as written, and the same with its dims fixed."""
    out = ["| model | dims | nodes (file → simplified) | import s | load + first call s, cold | same, warm | "
           "coverage (share of nodes) | on the reference path | tensortune ms | onnxruntime ms | ratio | rel. err |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for cold, warm, fixed in rows:
        for label, first, timed_row in (("dynamic", cold, warm), ("fixed", fixed, fixed)):
            head = f"| {cold['model'] if label == 'dynamic' else ''} | {label} | {first['nodes_in']} → {first.get('nodes', '?')} |"
            err = first.get("error") or timed_row.get("error")
            if err:
                out.append(f"{head} {_fmt(first.get('load_s'))} | **fails**: {err} | | | | | | | |")
                continue
            cov = ", ".join(f"{k} {v:.0%}" for k, v in sorted(timed_row["shares"].items(), key=lambda kv: -kv[1]))
            ops = ", ".join(timed_row["ref_ops"]) or "none"
            if timed_row["onnx_reference_ops"]:
                ops += f" (onnx.reference: {', '.join(timed_row['onnx_reference_ops'])})"
            ops += f"; {timed_row['ref_time']:.0%} of time" if timed_row["ref_ops"] else ""
            ratio = timed_row["tt_ms"] / timed_row["ort_ms"]
            cold_s = f"{first['load_s'] + first['first_call_s']:.1f}" if label == "dynamic" else "–"
            out.append(f"{head} {first['load_s']:.2f} | {cold_s} | "
                       f"{timed_row['load_s'] + timed_row['first_call_s']:.1f} | {cov} | {ops} | "
                       f"{timed_row['tt_ms']:.2f} | {timed_row['ort_ms']:.3f} | {ratio:.1f}x | {timed_row['rel_err']:.1e} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", help="stems from tests/real_models/cases.py (default: all)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("results.md")))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timed runs per model and runtime")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per model and process")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--timing", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--fixed", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from ir.settings import Settings, use
    use(Settings.from_env())   # a command line: reads the environment like the CLIs
    if args.one:
        print(json.dumps(run_one(args.one, args.fixed, args.timing, args.reps, args.budget)))
        return 0
    from bench_e2e import machine
    from real_models.cases import CASES
    names = args.models or [c.name for c in CASES]
    rows, t_start = [], time.perf_counter()
    for name in names:
        with tempfile.TemporaryDirectory(prefix="tt_bench_cache_") as cache:
            cold = _child(name, cache, False, False, args)
            warm = _child(name, cache, False, True, args) if "error" not in cold else cold
            fixed = _child(name, cache, True, True, args)
        rows.append((cold, warm, fixed))
        print("\n".join(table([rows[-1]])[2:]), flush=True)
    import subprocess as sp
    commit = sp.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    lines = ["# Real-exporter models: import, first call, coverage, untuned latency", "",
             f"Written by `python experiments/real_models/bench.py` at commit {commit} in "
             f"{time.perf_counter() - t_start:.0f} s.", "",
             f"Machine: {machine()}.",
             "One thread for both runtimes (onnxruntime intra/inter-op 1; TENSORTUNE_NUM_THREADS, NUMBA_NUM_THREADS "
             "and BLAS 1). Kernels: **untuned** (default configs). Latency: the median of up to "
             f"{args.reps} runs ({args.budget:.0f} s budget) at each model's second test shape (tests/real_models/cases.py); "
             "ratio = tensortune / onnxruntime (lower is better).",
             "import s = `runtime.load` (import, simplify, partition; kernels compile at the first call); load + first "
             "call: in a fresh process with an empty kernel cache (cold) or the one the cold run left (warm). "
             "Row `fixed`: the same model with its input dims fixed at the timing shape and the exporter's value_info "
             "dropped (`Case.with_fixed_dims`), run after the dynamic runs (so warm only as far as those got): it separates shape/import bugs from "
             "op and kernel gaps. Coverage: share of nodes by kind in the program of that call (static = shape "
             "arithmetic folded once per shape; view = reshapes run as views; reference = NumPy/onnx.reference at "
             "every call).",
             "", *table(rows), ""]
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Before/after the backend redesign (issue 11): the same models, the same kernel configs,
two versions of tensortune side by side in one run.

    python experiments/bench_redesign.py [--old 7c17065] [--threads 1 2] [--out experiments/bench_redesign.md]

1. Tunes each model once with this tree (`tune --trials/--time-budget`, one database) and
   writes its plan: the "tuned" configs.
2. For each (model, batch, threads, kernels = default | tuned) times both versions, each in a
   fresh subprocess with its own tree on PYTHONPATH (the old one checked out with
   `git worktree` into a temporary directory), interleaved old/new/old/new so drift hits both;
   the plan's target is rewritten to the child's own target key, so both run the same configs.
3. Writes a Markdown table: median ms of each version, new/old ratio (1.00 = unchanged).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "experiments" / "models"
CASES = [  # (name, file, writer, tune shapes, batches, other sizes, tuning trials, tuning budget s)
    ("MLP", "mlp.onnx", "make_mlp.py", ["batch=1,8"], (1, 8), {}, 48, 120),
    ("ResNet-18 (224)", "resnet18.onnx", "make_resnet.py", ["batch=1"], (1,), {}, 200, 300),
    ("BERT-style (4 layers, 256 hidden, seq 128)", "bert.onnx", "make_bert.py", ["batch=1", "seq=128"], (1,),
     {"seq": 128}, 200, 300),
]

CHILD = r"""
import json, os, sys, time
import numpy as np
try:
    from ir.settings import Settings, use
    use(Settings.from_env())
except ImportError:
    pass   # the old version reads the environment itself
import runtime
from runtime.cli import random_feeds
from runtime.plan import Plan
from codegen import host_target
from threadpoolctl import threadpool_limits
path, sizes, plan_path, reps = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
kw = {}
if plan_path:
    plan = Plan.load(plan_path)
    plan.target = host_target().describe()   # same configs, this version's target key
    kw["plan"] = plan
with threadpool_limits(int(os.environ["TENSORTUNE_NUM_THREADS"])):
    m = runtime.load(path, **kw)
    feeds = random_feeds(m.graph, sizes, seed=0)
    m.run(feeds)
    m.run(feeds)
    lat = []
    for _ in range(reps):
        t0 = time.perf_counter(); m.run(feeds); lat.append(time.perf_counter() - t0)
print(json.dumps({"median": float(np.median(lat)), "coverage": str(m.coverage())}))
"""


def ensure(file: str, writer: str) -> Path:
    path = MODELS / file
    if not path.exists():
        subprocess.run([sys.executable, str(MODELS / writer)], check=True)
    return path


def old_tree(commit: str) -> Path:
    d = Path(tempfile.gettempdir()) / f"tensortune_old_{commit}"
    if not d.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(d), commit], check=True,
                       capture_output=True)
    return d


def child(tree: Path, model: Path, sizes: dict, plan: str, threads: int, cache: str, reps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "TENSORTUNE_NUM_THREADS": str(threads),
           "TENSORTUNE_CACHE": cache, "OMP_NUM_THREADS": str(threads)}
    env.pop("OPENBLAS_CORETYPE", None)
    out = subprocess.run([sys.executable, "-c", CHILD, str(model), json.dumps(sizes), plan, str(reps)], env=env,
                         cwd=str(tree), capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{tree.name}: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default="7c17065", help="commit before the redesign")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2, help="old/new pairs per case (medians of the rounds)")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="scales the tuning budgets")
    ap.add_argument("--work", default=None, help="work directory to reuse (plans tuned there are not tuned again)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "bench_redesign.md"))
    args = ap.parse_args()
    t_start = time.time()
    old = old_tree(args.old)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tt_redesign_"))
    caches = {"old": str(work / "cache_old"), "new": str(work / "cache_new")}
    for c in caches.values():
        os.makedirs(c, mode=0o700, exist_ok=True)
    db = f"sqlite:///{work / 'tuning.db'}"
    rows, tuning = [], []
    for name, file, writer, shapes, batches, other, trials, budget in CASES:
        model = ensure(file, writer)
        plan = work / f"{file}.plan.json"
        cmd = [sys.executable, "-m", "tuner.cli", "--model", str(model), "--db", db, "--trials", str(trials),
               "--time-budget", str(budget * args.budget_scale), "--plan", str(plan), "--no-progress",
               "--measure-runs", "1"]
        for s in shapes:
            cmd += ["--shape", s]
        t0 = time.time()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TENSORTUNE_CACHE": caches["new"]}
        if not plan.exists():
            subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=str(ROOT))
        tuning.append(f"{name}: `tune --trials {trials} --time-budget {budget * args.budget_scale:.0f}`"
                      + (f" ({time.time() - t0:.0f} s)" if time.time() - t0 > 1 else " (plan reused)"))
        for batch in batches:
            sizes = {"batch": batch, **other}
            for threads in args.threads:
                for kernels, plan_arg in (("default", ""), ("tuned", str(plan))):
                    res = {"old": [], "new": []}
                    for _ in range(args.rounds):
                        for version, tree in (("old", old), ("new", ROOT)):
                            res[version].append(child(tree, model, sizes, plan_arg, threads, caches[version],
                                                      args.reps))
                    med = {v: sorted(r["median"] for r in rs)[len(rs) // 2] for v, rs in res.items()}
                    rows.append((name, batch, threads, kernels, med["old"] * 1e3, med["new"] * 1e3,
                                 med["new"] / med["old"], res["new"][-1]["coverage"]))
                    print(rows[-1], flush=True)
    write(args, rows, tuning, time.time() - t_start)


def machine() -> str:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {len(os.sched_getaffinity(0))} cores available, Python {platform.python_version()}"


def write(args, rows, tuning, seconds: float) -> None:
    lines = ["# Backend redesign: before vs after, same configs", "",
             f"Written by `python experiments/bench_redesign.py --old {args.old}` in {seconds / 60:.0f} min. "
             f"Old = commit {args.old} (before issue 11), new = this tree. Each cell: median of "
             f"{args.rounds} fresh processes per version (interleaved old/new), each the median of {args.reps} "
             "runs after two warm-up runs; tuned = the plan of one tuning run by the new version, deployed by "
             "both. Ratio new/old: 1.00 is unchanged, lower is faster.", "",
             f"Machine: {machine()}. Tuning: " + "; ".join(tuning) + ".", "",
             "| model | batch | threads | kernels | old ms | new ms | new/old | coverage (new) |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    for name, batch, threads, kernels, o, n, r, cov in rows:
        lines.append(f"| {name} | {batch} | {threads} | {kernels} | {o:.3f} | {n:.3f} | {r:.2f} | {cov} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Convergence benchmark: best latency vs trials for random, ga, xgb and xgb with
transfer learning, 3 seeds each, same budget, on recorded dense tables (replayed:
the strategies see exactly the latencies real kernels had), plus an optional short
real tuning run for candidates measured per minute and where the time goes.

    python experiments/convergence/bench.py                # replay part -> results.md, convergence.png
    python experiments/convergence/bench.py --real 240     # + a real 240 s xgb run on dense 128x256x1024
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from database import Database  # noqa: E402
from tests.simulated import DATA, SHAPES, TARGET, replay, table, trials_to_reach  # noqa: E402
from tuner.tune import TuneOptions, tune_tasks  # noqa: E402

HERE = Path(__file__).resolve().parent
VARIANTS = {"random": dict(strategy="random"), "ga": dict(strategy="ga"),
            "xgb": dict(strategy="xgb", transfer=False), "xgb+transfer": dict(strategy="xgb", transfer=True)}
PRIOR_TRIALS = 200   # random-search records of each *other* shape in the database for xgb+transfer
CONV = "conv2d_resnet18_layer1"   # recorded by record_dataset.py --resnet-conv (no other conv shape: no transfer)
WORKLOADS = list(SHAPES) + ([CONV] if (DATA / f"{CONV}.json").exists() else [])
TITLES = {**{s: f"dense {s} (MxKxN, +bias)" for s in SHAPES}, CONV: "ResNet-18 conv 3x3 64->64 56x56 (+ReLU)"}


def prior_records(shape: str) -> list:
    db = Database("sqlite:///:memory:")
    for other in SHAPES if shape in SHAPES else ():
        if other != shape:
            tasks, b, r = replay([other])
            tune_tasks(tasks, db, TuneOptions(trials=PRIOR_TRIALS, strategy="random", seed=99, progress=False),
                       TARGET, b, r)
    return db.records()


def replay_runs(trials: int, seeds: int) -> dict:
    out = {}
    for shape in WORKLOADS:
        prior = prior_records(shape)
        for name, kw in VARIANTS.items():
            if name == "xgb+transfer" and not prior:
                continue
            for seed in range(seeds):
                db = Database("sqlite:///:memory:")
                if name == "xgb+transfer":
                    db.add_many(prior)
                tasks, b, r = replay([shape])
                t0 = time.perf_counter()
                reps = tune_tasks(tasks, db, TuneOptions(trials=trials, seed=seed, progress=False, **kw),
                                  TARGET, b, r)
                out[(shape, name, seed)] = {"history": reps[0].history, "wall_s": time.perf_counter() - t0,
                                            "model_s": reps.timing.model_s}
                print(f"{shape} {name} seed {seed}: best {reps[0].best * 1e6:.1f} us, "
                      f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if a == a and b == b else "-"


def report(runs: dict, trials: int, seeds: int) -> str:
    lines = ["| workload | recorded configs | best (us) | " +
             " | ".join(f"{n}: trials to 95%" for n in VARIANTS) + " | xgb / random | xgb+transfer / random |",
             "|---" * (5 + len(VARIANTS)) + "|"]
    summary = {}
    for shape in WORKLOADS:
        t = table(shape)
        best_any = min(min(h for h in v["history"] if h is not None) for (s, _, _), v in runs.items() if s == shape)
        goal = best_any / 0.95
        need = {}
        for name in VARIANTS:
            if (shape, name, 0) not in runs:
                need[name] = (float("nan"), 0)
                continue
            ts = [trials_to_reach(runs[(shape, name, s)]["history"], goal) for s in range(seeds)]
            reached = [x for x in ts if x is not None]
            # a seed that never reached the goal counts as the whole budget + 1 (a lower bound)
            need[name] = (np.mean([x if x is not None else trials + 1 for x in ts]), len(reached))
        summary[shape] = need
        cells = [f"{m:.0f} ({k}/{seeds})" if m == m else "-" for m, k in need.values()]
        lines.append(f"| {TITLES[shape]} | {len(t.space)} | {best_any * 1e6:.0f} | " + " | ".join(cells) +
                     f" | {_ratio(need['xgb'][0], need['random'][0])} | {_ratio(need['xgb+transfer'][0], need['random'][0])} |")
    model = {n: np.mean([v["model_s"] for (s, m, _), v in runs.items() if m == n]) for n in VARIANTS}
    lines.append("")
    lines.append("Cells: mean trials (over seeds) until the best-so-far latency is within 5% of the best any "
                 "strategy found on that workload; (k/n): seeds that got there within the budget "
                 f"({trials} trials; a seed that did not counts as {trials + 1}).")
    lines.append("")
    lines.append("Search/model seconds per run of " + str(trials) + " trials (replayed, so nothing else costs time): "
                 + ", ".join(f"{n} {s:.1f} s" for n, s in model.items()))
    return "\n".join(lines), summary


def plot(runs: dict, trials: int, seeds: int, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(5 * len(WORKLOADS), 4), sharey=True)
    for ax, shape in zip(axes, WORKLOADS):
        best_any = min(min(h for h in v["history"] if h is not None) for (s, _, _), v in runs.items() if s == shape)
        for name in VARIANTS:
            if (shape, name, 0) not in runs:
                continue
            curves = []
            for s in range(seeds):
                h = [x if x is not None else np.nan for x in runs[(shape, name, s)]["history"]]
                h += [h[-1]] * (trials - len(h))
                curves.append(np.array(h[:trials]) / best_any)
            ax.plot(np.arange(1, trials + 1), np.nanmean(curves, axis=0), label=name)
        ax.axhline(1 / 0.95, color="grey", ls=":", lw=1)
        ax.set_title(TITLES[shape], fontsize=10)
        ax.set_xlabel("trials")
        ax.set_xscale("log")
        ax.set_ylim(0.95, 3)
    axes[0].set_ylabel("best latency / best found (mean of seeds)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def real_run(seconds: float) -> dict:
    """A real xgb tuning run on dense 128x256x1024+bias with a fresh kernel cache."""
    from codegen import host_target
    from record_dataset import dense_workload
    from schedules import get_template
    from tuner.task import Task
    from ir.settings import current, use
    use(current().with_(cache_dir=tempfile.mkdtemp(prefix="tt_bench_cache_")))
    wl = dense_workload(128, 256, 1024)
    task = Task(wl, get_template("dense"), 1, "dense:128x256x1024+bias")
    log = Path(tempfile.mkdtemp()) / "real.jsonl"
    opts = TuneOptions(trials=100_000, strategy="xgb", batch_size=16, time_budget=seconds, progress=False,
                       repeat=3, min_repeat_ms=10, log_file=str(log), transfer=False)
    reps = tune_tasks([task], Database("sqlite:///:memory:"), opts, host_target())
    events = [json.loads(x) for x in log.read_text().splitlines()]
    # per batch: its wall time (round event to round event), candidates, and compiles
    batches, last = [], next(e["time"] for e in events if e["event"] == "start")
    for e in events:
        if e["event"] == "round":
            batches.append((e["time"] - last, e["candidates"], e["compiles"]))
            last = e["time"]
    warm = [(dt, n) for dt, n, c in batches if c == 0]
    compiles = [e["compile_s"] for e in events if e["event"] == "measure" and e["compile_s"] > 0.05]
    t = reps.timing.to_json()
    t.update(best_us=round(reps[0].best * 1e6, 1), gflops=round(reps[0].gflops, 1), batches=len(batches),
             batches_without_compile=len(warm),
             per_minute_without_compile=round(60 * sum(n for _, n in warm) / sum(dt for dt, _ in warm), 1)
             if warm else None,
             median_compile_s=round(float(np.median(compiles)), 2) if compiles else 0.0,
             distinct_code_shapes=len({(e["config"]["regtile"], e["config"]["order"])
                                       for e in events if e["event"] == "measure"}))
    return t


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=400)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--real", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--no-replay", action="store_true", help="only the real run")
    a = p.parse_args()
    if a.real and a.no_replay:
        r = real_run(a.real)
        (HERE / "real_run.json").write_text(json.dumps(r, indent=1))
        print(json.dumps(r, indent=1))
        return
    t0 = time.time()
    runs = replay_runs(a.trials, a.seeds)
    text, summary = report(runs, a.trials, a.seeds)
    plotted = plot(runs, a.trials, a.seeds, HERE / "convergence.png")
    replay_s = time.time() - t0
    (HERE / "replay_results.md").write_text(text + f"\n\nReplay part: {replay_s:.0f} s of machine time."
                                            + ("\n\n![convergence](convergence.png)\n" if plotted else "\n"))
    print(text)
    if a.real:
        r = real_run(a.real)
        (HERE / "real_run.json").write_text(json.dumps(r, indent=1))
        print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()

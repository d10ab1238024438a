"""Tuned vs untuned vs onnxruntime, end to end, on ResNet-18, BERT-small, ViT-small and a
MobileNetV2-style CNN, at 1 and 2 threads, in one process.

    python experiments/bench_tuned.py --time-budget 60 [--trials 2000] [--threads 1 2] [--models resnet18 bert ...]

Per model and thread count: `tune_model` (the `tune` command's loop, with its in-model
check) spends `--trials` or `--time-budget` seconds, whichever ends first, into a fresh
database; then the model deployed from that database, the untuned model (default
configs) and onnxruntime take turns on the same inputs (blocks of `--block` calls in a row,
as deployed: each with its own data in the caches), `--runs` times, at that thread
count, and their medians are compared. Writes experiments/bench_tuned.md and .png.

Exits 1, with a line naming the model, when the tuned model is slower than the untuned
one beyond the noise on any model: the calls run in `--rounds` interleaved rounds, each
round gives a tuned/untuned ratio of medians, and the noise is twice the robust
standard deviation of those ratios (at least `--tolerance`); see `beyond_noise`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("OPENBLAS_CORETYPE", None)   # both slow NumPy's BLAS (FACTS.md); before numpy loads
os.environ.pop("OPENBLAS_L2_SIZE", None)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments" / "models"))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402


EXTRA_MODELS = ("resnet18_224",)   # run when named (--models), not by default


def _models() -> dict:
    """name -> (label, builder of the ONNX model, dim sizes to tune and run at)."""
    from make_mobilenet import make_mobilenet
    from make_vit import make_vit
    from models import make_bert, make_resnet18
    return {
        "resnet18": ("ResNet-18 (64x64 image)", lambda: make_resnet18(image=64), {"batch": 1}),
        "bert": ("BERT-small (2 layers, hidden 128, seq 32)", lambda: make_bert(layers=2, hidden=128, heads=2, ffn=512),
                 {"batch": 1, "seq": 32}),
        "vit": ("ViT-small (4 layers, dim 192, 64x64 image, 16 tokens)", make_vit, {"batch": 1}),
        "mobilenetv2": ("MobileNetV2-style (5 blocks, 96x96 image)", make_mobilenet, {"batch": 1}),
        # the conv layers at their own sizes (winograd's 3x3 convs): not in the default set
        "resnet18_224": ("ResNet-18 (224x224 image)", lambda: make_resnet18(image=224), {"batch": 1}),
    }


def machine() -> str:
    import platform
    import numba
    import onnxruntime
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    load = os.getloadavg()[0]
    return (f"{cpu}, {len(os.sched_getaffinity(0))} cores available, shared with other work (load average "
            f"{load:.1f} when the run ended), Python {platform.python_version()}, numba {numba.__version__}, "
            f"onnxruntime {onnxruntime.__version__}")


def compare(tuned, untuned, sess, feeds: dict, runs: int, rounds: int, block: int):
    """The three runtimes take turns, `rounds` rounds of `runs` timed calls each (rounded up
    to whole blocks), in blocks of `block` calls of one runtime in a row after an untimed
    call, as `tuner.verify.interleaved` times the in-model check: a deployed model is called
    again and again with its own data in the caches, and alternating the runtimes call by
    call (block 1) measured BERT-small 46 % slower than back to back. Returns (tuned measured
    as `tuner.verify.Measured` with the untuned over all calls, each round's tuned / untuned
    latency as `step_sum`s, and per runtime (tuned, untuned, onnxruntime) the wall and the
    calling thread's CPU seconds of each call)."""
    from tuner.verify import measured_pair, step_sum, step_times, take_turns
    for m in (tuned, untuned):
        m.run(feeds)
    sess.run(None, feeds)
    t_per, d_per, ratios = [], [], []
    wall = {"tuned": [], "untuned": [], "ort": []}
    cpu = {"tuned": [], "untuned": [], "ort": []}

    def timed(name, call):
        def run():
            c0, t0 = time.thread_time(), time.perf_counter()
            out = call()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
            return out
        return run
    order = [timed("tuned", lambda: t_per.append(step_times(tuned, feeds)[1])),
             timed("untuned", lambda: d_per.append(step_times(untuned, feeds)[1])),
             timed("ort", lambda: sess.run(None, feeds))]
    warm = [lambda: tuned.run(feeds), lambda: untuned.run(feeds), lambda: sess.run(None, feeds)]
    n = 0
    for _ in range(rounds):   # the order rotates: on a loaded machine a fixed order biases by position
        n = take_turns(list(zip(warm, order)), runs, block)
        ratios.append(step_sum(wall["tuned"][-n:], t_per[-n:]) /
                      step_sum(wall["untuned"][-n:], d_per[-n:]))
    timed_runs = [(wall["tuned"], np.asarray(t_per)), (wall["untuned"], np.asarray(d_per))]
    return measured_pair(tuned, untuned, feeds, n * rounds, timed_runs), ratios, wall, cpu


def versus_ort(wall: dict, cpu: dict, threads: int) -> dict:
    """Seconds per call of each runtime for the comparison with onnxruntime.
    On one thread every runtime computes in the calling thread: its CPU time per call
    (median), which preemption does not inflate (measured on the loaded machine: 16 ms
    lost in 58 % of 2 ms BERT calls, wall medians 4x the CPU time for ViT). On more
    threads the wall time's 20th percentile, the least preempted calls."""
    if threads == 1:
        return {k: float(np.median(v)) for k, v in cpu.items()}
    return {k: float(np.percentile(v, 20)) for k, v in wall.items()}


def themselves(tuned, untuned, feeds: dict, runs: int, block: int) -> tuple[float, float]:
    """(tuned, untuned) step sums in ms, the two taking turns without onnxruntime. On more threads
    onnxruntime's pool spins ~40 ms after each call; on the 2-vCPU KVM guests that costs the next
    runtime its second vCPU even after `settle` saw it idle (measured on Zen 4: tuned ResNet-18
    4.1 ms in turns with the untuned model alone, 5.2 ms with onnxruntime's turns between; 4.3 ms
    with onnxruntime's spinning off, which made onnxruntime 8 % slower). A deployed model does not
    run beside onnxruntime: this is its latency on its own, beside the turns with onnxruntime."""
    from tuner.verify import interleaved, step_sum
    (t_tot, t_per), (d_tot, d_per) = interleaved([tuned, untuned], feeds, runs, block)
    return step_sum(t_tot, t_per) * 1e3, step_sum(d_tot, d_per) * 1e3


def beyond_noise(ratios: list[float], floor: float) -> tuple[bool, float, float]:
    """(tuned slower than untuned beyond the noise?, median round ratio, noise). The noise is
    measured: twice the robust standard deviation (1.4826 x the median absolute deviation)
    of the rounds' tuned/untuned ratios, at least `floor`; slower means the median ratio
    exceeds 1 + noise."""
    r = np.asarray(ratios, dtype=float)
    med = float(np.median(r))
    noise = max(floor, 2 * 1.4826 * float(np.median(np.abs(r - med))))
    return med > 1 + noise, med, noise


def bench(name: str, label: str, proto, sizes: dict, threads: int, args, work: Path) -> dict:
    import onnx
    import onnxruntime as ort
    from threadpoolctl import threadpool_limits
    import runtime
    from codegen import host_target
    from database import Database
    from ir.settings import Settings, use
    from runtime.cli import random_feeds
    from tuner.tune import TuneOptions, tune_model
    from tuner.verify import deployed_estimate, runs_to_span
    path = work / f"{name}.onnx"
    if not path.exists():
        onnx.save(proto(), path)
    settings = Settings.from_env().with_(threads=threads)
    use(settings)
    db = Database(f"sqlite:///{work / f'{name}_t{threads}.db'}")
    shapes = {k: [v] for k, v in sizes.items()}
    opts = TuneOptions(trials=args.trials, time_budget=args.time_budget, verify_runs=args.verify_runs,
                       progress=False, strategy=args.strategy)
    t0 = time.perf_counter()
    with threadpool_limits(threads):
        graph, points, reports, _ = tune_model(str(path), db, opts, shapes=shapes, settings=settings)
        tune_s = time.perf_counter() - t0
        tuned = runtime.load(graph, db=db, settings=settings)
        untuned = runtime.load(graph, settings=settings)
        feeds = random_feeds(tuned.graph, dict(points[0]), seed=0)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        runs = runs_to_span([tuned, untuned], feeds, args.runs, args.min_round_s)
        measured, ratios, wall, cpu = compare(tuned, untuned, sess, feeds, runs, args.rounds, args.block)
        vs = versus_ort(wall, cpu, threads)
        by_themselves = themselves(tuned, untuned, feeds, runs * args.rounds, args.block) if threads > 1 else None
        differ = sum(a.kernel is not None and b.kernel is not None and a.kernel.kernel.config != b.kernel.kernel.config
                     for a, b in zip(tuned.prepare(feeds).steps, untuned.prepare(feeds).steps))
        ref = sess.run(None, feeds)[0]
        got = tuned.run(feeds)[tuned.graph.outputs[0]]
    key = host_target(settings.backend, settings).key
    est = deployed_estimate(reports, db, key, measured, reports.verification)
    alone = deployed_estimate(reports, db, key, measured, reports.verification, in_model=False)
    slower, ratio, noise = beyond_noise(ratios, args.tolerance)
    v = reports.verification
    timing = reports.timing
    cov = tuned.coverage(points[0])
    return {"model": label, "threads": threads, "tuned_ms": measured.tuned_steps_s * 1e3,
            "untuned_ms": measured.default_steps_s * 1e3, "tuned_e2e_ms": measured.tuned_s * 1e3,
            "untuned_e2e_ms": measured.default_s * 1e3, "ort_e2e_ms": float(np.median(wall["ort"])) * 1e3,
            "tuned_vs_ms": vs["tuned"] * 1e3, "untuned_vs_ms": vs["untuned"] * 1e3, "ort_ms": vs["ort"] * 1e3, "est_ms": est * 1e3 if est else None, "alone_ms": alone * 1e3 if alone else None,
            "themselves_ms": by_themselves, "round_ratio": ratio, "noise": noise, "slower": slower, "tune_s": tune_s,
            "candidates": timing.candidates, "per_min": timing.per_minute, "compiles": timing.compiles,
            "tasks": len(reports), "tasks_measured": sum(r.best is not None for r in reports),
            "differ": differ, "verdicts": len(v.verdicts) if v else 0, "rejected": len(v.rejected) if v else 0,
            "coverage": ", ".join(f"{k} {cov.share(k):.0%}" for k in ("tuned", "nearest", "default", "reference")
                                  if cov.counts.get(k)),
            "err": float(np.abs(got.astype(np.float64) - ref).max()), "out": float(np.abs(ref).max())}


def write_png(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    x = np.arange(len(rows))
    for k, (key, lab) in enumerate((("untuned_vs_ms", "untuned"), ("tuned_vs_ms", "tuned"), ("ort_ms", "onnxruntime"))):
        ax.bar(x + (k - 1) * 0.27, [r[key] / r["ort_ms"] for r in rows], 0.27, label=lab)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, [f"{r['model'].split(' (')[0]}\n{r['threads']} thr" for r in rows], fontsize=8)
    ax.set_ylabel("latency / onnxruntime (lower is better)")
    ax.set_title("tensortune untuned and tuned vs onnxruntime, end to end, batch 1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(rows: list[dict], args, names: list[str], total: float, done: bool) -> list[dict]:
    """The Markdown table and the PNG of the rows so far; returns the rows where tuned is slower."""
    out = Path(args.out)
    # where every deployed config is the default, the two models are the same: a difference is noise
    slower = [r for r in rows if r["differ"] and r["slower"]]
    lines = [
        "# Tuned vs untuned vs onnxruntime, end to end",
        "",
        f"Written by `python experiments/bench_tuned.py --time-budget {args.time_budget:g}"
        f"{' --models ' + ' '.join(names) if args.models else ''}` in {total / 60:.0f} min"
        f"{'' if done else ' (interrupted: the models not listed did not run)'}. "
        f"Each model was tuned for at most {args.time_budget:g} s per thread count ({args.trials} trials at most, "
        f"strategy {args.strategy}), far less than `--trials 2000`: the budget that fitted the time available. "
        "Tuning runs the in-model check (`tuner.verify`): each tuned subgraph timed inside the model against "
        "its default config, the faster deployed.",
        "",
        f"Machine: {machine()}. The cores were shared with other jobs while this ran: absolute times are noisy; "
        f"the three runtimes took turns ({args.rounds} rounds of {args.runs} calls each or as many as fill "
        f"{args.min_round_s:g} s, in blocks of {args.block} "
        "calls of one runtime in a row after an untimed call, medians), so their "
        "ratios are comparable.",
        "",
        "| model | threads | untuned ms | tuned ms | onnxruntime ms | tuned / untuned (rounds, noise) | "
        "tuned / onnxruntime | without onnxruntime's turns: tuned, untuned ms (tuned / onnxruntime) | tune estimate ms | estimate / measured | kernels alone: estimate / measured | "
        "candidates (per min) | tasks measured | rejected in model | steps not on the default config | kernels | "
        "max abs err |",
        "| --- " + "| ---: " * 14 + "| --- | ---: |",
    ]
    for r in rows:
        ts = r["tuned_ms"]
        est = f"{r['est_ms']:.2f} | {r['est_ms'] / ts:.2f} ({r['est_ms'] / r['tuned_e2e_ms']:.2f})" if r["est_ms"] \
            else "- | -"
        alone = f"{r['alone_ms'] / ts:.2f}" if r["alone_ms"] else "-"
        own = r.get("themselves_ms")
        own = f"{own[0]:.2f}, {own[1]:.2f} ({own[0] / r['ort_ms']:.2f})" if own else "-"
        lines.append(f"| {r['model']} | {r['threads']} | {r['untuned_ms']:.2f} ({r['untuned_e2e_ms']:.2f}) | "
                     f"{ts:.2f} ({r['tuned_e2e_ms']:.2f}) | {r['ort_ms']:.2f} ({r['ort_e2e_ms']:.2f}) | "
                     f"{ts / r['untuned_ms']:.2f} ({r['round_ratio']:.2f}, ±{r['noise']:.0%}) | "
                     f"{r['tuned_vs_ms'] / r['ort_ms']:.2f} | {own} | "
                     f"{est} | {alone} | {r['candidates']} ({r['per_min']:.0f}) | {r['tasks_measured']}/{r['tasks']} | "
                     f"{r['rejected']}/{r['verdicts']} | {r['differ']} | {r['coverage']} | {r['err']:.1e} (of {r['out']:.2g}) |")
    lines += ["", "untuned ms, tuned ms: the sum over steps of each step's 25th percentile plus that of the time "
              "outside steps (`tuner.verify.step_sum`: a preemption only adds time, and on this machine most "
              "ResNet-18 steps of 1-5 ms were preempted in a third to half of the calls); in brackets the median end-to-end "
              "call. On a loaded machine most calls are preempted somewhere (measured: 16 ms lost in 58 % of 2 ms "
              "BERT calls at load 10), which inflates end-to-end medians, not step sums. onnxruntime ms and tuned / "
              "onnxruntime: at 1 thread each runtime's median CPU time of the calling thread (all three compute in "
              "it), at more threads the 20th percentile of wall time; the wall median in brackets. estimate / "
              "measured: against the step sum (against the end-to-end median in brackets). Without onnxruntime's "
              "turns (more threads only): the same step sums with tuned and untuned taking turns by themselves "
              "(`themselves`: onnxruntime's pool spins ~40 ms after each call, and on 2-vCPU KVM guests the next "
              "runtime then finds its second vCPU slow), against onnxruntime's time in its own turns.",
              "", "tune estimate: Σ over the kernel workloads of the program the model runs (not over the tasks: "
              "shape computations that are tasks but fold at load do not count) of occurrences × the deployed "
              "config's time per occurrence inside the model as tune's in-model check measured it (each step's "
              "25th percentile; alone where the check did not time it), plus the time outside kernels the check "
              "measured in the model (the other steps' and the executor loop's: `tuner.verify.deployed_estimate`). "
              "It is measured during `tune`, before the columns beside it: on a shared machine a change of load "
              "in between moves the ratio. "
              "'kernels alone': the same with every kernel at the tuner's median timed alone (what the search "
              "optimized); its ratio shows how much slower the kernels run inside the model.",
              "", f"tuned / untuned (rounds, noise): the ratio of step sums over all calls; in brackets the "
              f"median over {args.rounds} interleaved rounds ({args.runs} calls of each runtime per round, the order "
              "rotating) of each round's ratio of step sums, and the noise: twice the robust standard deviation "
              "(1.4826 × MAD) of the round ratios, at "
              f"least --tolerance {args.tolerance:.0%}. A model counts as slower when the median round ratio "
              "exceeds 1 + noise.",
              "", "Rows whose tuned model deploys only default configs (0 steps not on the default config) compare "
              "two identical models: their difference is the noise of the machine.",
              "", "Tuned slower than untuned (beyond the noise): "
              + (", ".join(f"{r['model']} at {r['threads']} thread(s)" for r in slower)
                                            if slower else "none.")]
    out.write_text("\n".join(lines) + "\n")
    write_png(rows, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return slower


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-budget", type=float, required=True, metavar="SECONDS",
                    help="tuning seconds per model and thread count")
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--strategy", default="xgb")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--models", nargs="+", default=None, help="of: resnet18 bert vit mobilenetv2 (default: these four), resnet18_224")
    ap.add_argument("--runs", type=int, default=10, help="timed calls of each runtime per round, in turn")
    ap.add_argument("--block", type=int, default=None,
                    help="calls of one runtime in a row, after an untimed one, before the next takes its turn "
                         "(default tuner.verify.BLOCK; 1: alternate call by call, caches cold from the others)")
    ap.add_argument("--min-round-s", type=float, default=0.25, metavar="SECONDS",
                    help="more than --runs calls per round where they take less than this long (a 0.8 ms model: "
                         "15 calls are 12 ms, which one burst of a neighbour's work moves as a whole)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of --runs calls: their ratios give the noise")
    ap.add_argument("--verify-runs", type=int, default=10, help="runs of the in-model check after tuning")
    ap.add_argument("--tolerance", type=float, default=0.03,
                    help="the least noise: tuned may exceed untuned by the measured noise of the rounds' ratios, "
                         "and at least this fraction, before the run fails")
    ap.add_argument("--work", default=None, help="folder for the models and databases (default: a new temp folder)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "bench_tuned.md"))
    args = ap.parse_args(argv)
    if args.block is None:
        from tuner.verify import BLOCK
        args.block = BLOCK
    from ir.settings import Settings, use
    use(Settings.from_env())
    models = _models()
    names = args.models or [n for n in models if n not in EXTRA_MODELS]
    unknown = [n for n in names if n not in models]
    if unknown:
        print(f"bench_tuned: error: unknown model(s) {unknown} (choose from: {', '.join(models)})", file=sys.stderr)
        return 2
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_tuned_"))
    work.mkdir(parents=True, exist_ok=True)
    rows, t_start = [], time.perf_counter()
    for name in names:
        label, proto, sizes = models[name]
        for threads in args.threads:
            r = bench(name, label, proto, sizes, threads, args, work)
            rows.append(r)
            print(f"{label} t{threads}: untuned {r['untuned_ms']:.2f} ms, tuned {r['tuned_ms']:.2f} ms "
                  f"(estimated {r['est_ms'] or float('nan'):.2f}), onnxruntime {r['ort_ms']:.2f} ms; "
                  f"{r['candidates']} candidates in {r['tune_s']:.0f} s, {r['rejected']}/{r['verdicts']} rejected "
                  "in the model", flush=True)
            write_results(rows, args, names, time.perf_counter() - t_start, done=False)
    slower = write_results(rows, args, names, time.perf_counter() - t_start, done=True)
    for r in slower:
        print(f"bench_tuned: FAIL: tuned {r['model']} at {r['threads']} thread(s) is slower than untuned: "
              f"{r['tuned_ms']:.2f} ms vs {r['untuned_ms']:.2f} ms (median round ratio {r['round_ratio']:.2f}, "
              f"noise ±{r['noise']:.0%})", file=sys.stderr)
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())

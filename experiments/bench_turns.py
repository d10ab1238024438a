"""Untuned models of one or more source trees and onnxruntime, each in a process of its own,
taking turns: what a change does to end-to-end latency on a host whose speed drifts.

    python experiments/bench_turns.py [--trees . /tmp/old] [--models resnet18 mobilenetv2 vit bert]
        [--threads 1 2] [--rounds 9] [--calls 60] [--steps] [--out experiments/bench_turns.md]

A guest whose host runs other work changes speed by 1.5-2x within minutes (Emerald Rapids KVM
guests, 2026-12-06): runtimes timed one after the other compare the host's minutes, not the
code. Here every runtime (`tree:ours` per tree, and onnxruntime from the first tree's Python)
loads its model once in its own process, then the processes run `--calls` timed calls each in
turn, `--rounds` times, the order reversed every other round; only one runs at a time (the
others block on a pipe, their pool threads asleep; `SETTLE_S` between turns). Per runtime: the median of its rounds'
median wall times, and the median over rounds of its ratio to onnxruntime's median in the same
round (with the rounds' quartiles), so a slow minute slows both sides of a ratio. The trees
are checkouts (`git worktree add /tmp/old <commit>`); their kernel caches are shared, so a
tree's first load may compile.

`--steps` also times each of our steps inside the model (`run_timed`, the same number of calls
per turn, after the wall-time calls) and prints, per model and thread count, the steps of every
tree side by side with the median over rounds of each step's ratio to the first tree's: what a
change did to which step, in the model rather than alone (a kernel repeated alone keeps its
inputs in its core's caches, so on two threads it misses what reading another core's output
costs: 2026-12-06, `bench_turns.md`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTLE_S = 0.1
"""Pause before each turn: onnxruntime's pool threads spin ~40 ms after its last call, and on a
2-vCPU guest the runtime whose turn came next lost its second vCPU to them (measured: the
process after onnxruntime's turn ran MobileNetV2 at 2 threads 1.59x onnxruntime in one round
order and 1.40x in the other; with the pause, both)."""


def child(tree: str, model: str, threads: int, who: str, steps: bool = False) -> None:
    """One runtime in this process: load, warm up, say 'ready', then per line read from stdin
    (a call count) time that many calls and print their median wall seconds as JSON ({"s": ...});
    with `steps` (ours only) that many timed calls more, their steps' median seconds and names."""
    sys.path[:0] = [tree, str(Path(tree) / "experiments" / "models"), str(Path(tree) / "tests")]
    import numpy as np
    sys.path.insert(0, str(Path(tree) / "experiments"))
    from bench_tuned import _models
    from runtime.cli import random_feeds
    label, build, sizes = _models()[model]
    proto = build()
    if who == "ours":
        import runtime
        from ir.settings import Settings
        m = runtime.load(proto, settings=Settings.from_env().with_(threads=threads))
        feeds = random_feeds(m.graph, dict(sizes), seed=0)
        call = lambda: m.run(feeds)   # noqa: E731
        prog = m.prepare(feeds)
        names = [st.name for st in prog.steps] if steps else None
        owners = {"nodes": {n.name: k for k, st in enumerate(prog.steps) for n in st.subgraph.nodes},
                  "values": {o: k for k, st in enumerate(prog.steps) for n in st.subgraph.nodes for o in n.outputs if o}}
        profiler = None
    else:
        import onnxruntime as ort
        from ir import import_onnx
        from runtime.profile import OrtProfiler
        feeds = random_feeds(import_onnx(proto), dict(sizes), seed=0)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        call = lambda: sess.run(None, feeds)   # noqa: E731
        profiler = OrtProfiler(proto, feeds, threads) if steps else None   # its nodes, in a session of their own
    for _ in range(20):
        call()
    print("ready", flush=True)
    first = True
    for line in sys.stdin:
        for _ in range(3):   # after its turn's wait: caches and pool threads warm again
            call()
        times = []
        for _ in range(int(line)):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        out = {"s": float(np.median(times))}
        if steps and profiler is None:
            per = np.median([m.run_timed(feeds)[1] for _ in range(int(line))], axis=0)
            out.update(steps=[float(v) for v in per], names=names)
            if first:
                out.update(owners)
        elif profiler is not None:
            for k in range(int(line) + 1):   # the first brings its session's data back into the caches
                profiler.session.run(None, profiler.feeds)
                profiler.timed.append(k > 0)
        first = False
        print(json.dumps(out), flush=True)
    if profiler is not None:   # its stdin closed: its nodes' medians over all rounds
        got = profiler.finish(0)
        print(json.dumps({"by_node": got.by_node, "outputs": got.outputs, "source_outputs": got.source_outputs}),
              flush=True)


def turns(specs: list[tuple[str, str]], model: str, threads: int, rounds: int, calls: int,
          steps: bool = False) -> list[list[dict]]:
    """Per (tree, who): its rounds' results (`child`'s JSON), the processes taking turns."""
    procs = []
    try:
        for tree, who in specs:
            p = subprocess.Popen([sys.executable, __file__, "--child", tree, model, str(threads), who]
                                 + (["--steps"] if steps else []),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs.append(p)
            if p.stdout.readline().strip() != "ready":
                raise SystemExit(f"{who} of {tree} on {model} did not start")
        res: list[list[dict]] = [[] for _ in specs]
        for r in range(rounds):
            order = range(len(specs)) if r % 2 == 0 else reversed(range(len(specs)))
            for i in order:
                time.sleep(SETTLE_S)
                procs[i].stdin.write(f"{calls}\n")
                procs[i].stdin.flush()
                res[i].append(json.loads(procs[i].stdout.readline()))
        for p in procs:
            p.stdin.close()
        if steps:   # onnxruntime's node profile (the first process), attributed to our first tree's steps
            res[0][0]["ort_steps"] = ort_steps(json.loads(procs[0].stdout.readline()), res[1][0])
        return res
    finally:
        for p in procs:
            if p.stdin and not p.stdin.closed:
                p.stdin.close()
            p.wait(timeout=60)


def ort_steps(prof: dict, ours: dict) -> list[float]:
    """onnxruntime's seconds per step of ours (`runtime.profile`'s attribution of its nodes to the
    steps computing them); the last entry: its nodes no step computes."""
    from types import SimpleNamespace
    from runtime.profile import _owner
    view = SimpleNamespace(outputs=prof["outputs"], source_outputs=prof["source_outputs"])
    got = [0.0] * (len(ours["names"]) + 1)
    for name, (_op, secs) in prof["by_node"].items():
        k = _owner(name, view, ours["nodes"], ours["values"])
        got[-1 if k is None else k] += secs
    return got


def step_table(model: str, threads: int, names: list[str], got: list[list[dict]], ort: list[float]) -> list[str]:
    """Our trees' steps side by side: per tree the median over rounds of a step's seconds (us),
    and for the others the median over rounds of its ratio to the first tree's in that round;
    first onnxruntime's time on the same nodes (its own profiler, in the same rounds) and the
    first tree's ratio to it."""
    import numpy as np
    step_names = got[0][0]["names"]
    if any(len(r[0]["steps"]) != len(step_names) for r in got):
        return ["", f"{model}, {threads} thread(s): the trees' programs differ in their steps; no step table."]
    per = [np.asarray([r["steps"] for r in rounds]) * 1e6 for rounds in got]
    ort_us = np.asarray(ort) * 1e6
    out = ["", f"{model}, {threads} thread(s), each step inside the model, us (median of rounds) "
           f"[median ratio to {names[0]}]; onnxruntime: its profiler's time on the step's nodes "
           f"(x: {names[0]} / onnxruntime):", "",
           "| step | onnxruntime | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    def cells(columns: list, digits: int) -> str:   # one row: per tree its rounds' values of it
        return " | ".join([f"{np.median(columns[0]):.{digits}f}"] + [
            f"{np.median(c):.{digits}f} [{np.median(c / columns[0]):.2f}]" for c in columns[1:]])
    def theirs(v: float, ours: float) -> str:
        return f"{v:.1f} ({ours / v:.2f}x)" if v > 0 else "-"
    for k, name in enumerate(step_names):
        out.append(f"| {k} {name} | {theirs(ort_us[k], np.median(per[0][:, k]))} | {cells([p[:, k] for p in per], 1)} |")
    out.append(f"| sum | {theirs(ort_us.sum(), np.median(per[0].sum(axis=1)))} | {cells([p.sum(axis=1) for p in per], 0)} |")
    if ort_us[-1] > 0:
        out.append(f"| (onnxruntime nodes no step computes) | {ort_us[-1]:.1f} | |")
    return out


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], "--steps" in sys.argv[6:])
        return 0
    import numpy as np
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="+", default=[str(ROOT)])
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenetv2", "vit", "bert"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--steps", action="store_true", help="also each step inside the model, tree by tree")
    ap.add_argument("--out", default=None, help="also write the Markdown table here")
    args = ap.parse_args(argv)
    trees = [str(Path(t).resolve()) for t in args.trees]
    specs = [(trees[0], "ort")] + [(t, "ours") for t in trees]
    names = ["onnxruntime"] + [Path(t).name + (" (this tree)" if t == str(ROOT) else "") for t in trees]
    sys.path.insert(0, str(ROOT))
    from codegen import host_target
    t = host_target()
    lines = [f"Machine: {t.cpu} (`{t.cpu_name}`, {t.cores} cores available); load average "
             f"{os.getloadavg()[0]:.2f} at the start. {args.rounds} rounds of {args.calls} calls per runtime, "
             "processes taking turns; wall ms per call (median of the rounds' medians), and the median "
             "over rounds of the ratio to onnxruntime's round [quartiles].", "",
             "| model | threads | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    rows, steps_lines = [], []
    for model in args.models:
        for threads in args.threads:
            got = turns(specs, model, threads, args.rounds, args.calls, args.steps)
            res = np.asarray([[r["s"] for r in rs] for rs in got]) * 1e3
            cells = [f"{np.median(res[0]):.3f}"]
            for i in range(1, len(specs)):
                r = res[i] / res[0]
                cells.append(f"{np.median(res[i]):.3f} ({np.median(r):.3f}x [{np.percentile(r, 25):.3f}, "
                             f"{np.percentile(r, 75):.3f}])")
            lines.append(f"| {model} | {threads} | " + " | ".join(cells) + " |")
            rows.append({"model": model, "threads": threads, "ms": {n: res[i].tolist() for i, n in enumerate(names)}})
            print(lines[-1], flush=True)
            if args.steps:
                steps_lines += step_table(model, threads, names[1:], got[1:], got[0][0]["ort_steps"])
    text = "\n".join(lines + steps_lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Candidates per minute: the local pool vs Ray on 1, 2 and 3 local nodes of one core each.

Every setting tunes the same candidates (random strategy, one seed) of one small
elementwise task into a fresh database with a fresh kernel cache, so every
candidate really compiles. Reported per setting: wall time of `tune_tasks`
(cluster start and actor creation excluded, shown apart), candidates per minute,
and the driver-visible overhead per candidate: wall time per candidate minus
the compile and run seconds the workers measured and the driver's own search and
database time (for the local pool this is its pipes and processes; for Ray, its
tasks, actors and object transfers too). Local compiles run on all cores in
parallel, then timing is exclusive; Ray compiles inside the node's actor, so a
node compiles and times in turn, nodes in parallel.

    PYTHONPATH=. python experiments/ray/bench_throughput.py [--candidates 24] [--out experiments/ray/results.md]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

for _k, _v in {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}.items():
    os.environ.setdefault(_k, _v)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def dense_model() -> onnx.ModelProto:
    """x[32, 256] @ w[256, 256] + b, relu: register-tile knobs change the code, so compiles dominate."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import dense_model as make
    return make(32, 256, 256)


def elementwise_model(n=512) -> onnx.ModelProto:
    b = numpy_helper.from_array(np.arange(n, dtype=np.float32), "b")
    nodes = [helper.make_node("Add", ["x", "b"], ["y"]), helper.make_node("Relu", ["y"], ["out"])]
    g = helper.make_graph(nodes, "ew", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, n])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [128, n])], [b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


MODELS = {"elementwise": elementwise_model, "dense": dense_model}


class Busy:
    """Seconds the workers report per result: compile (in the actor, for Ray) and the timed call."""

    def __init__(self):
        from tuner.callbacks import MeasureCallback
        busy = self

        class Collect(MeasureCallback):
            def on_result(self, ctx, i, r):
                busy.compile_s += r.compile_s
                busy.run_s += r.run_s
        self.compile_s = self.run_s = 0.0
        self.callback = Collect()


def one_setting(name: str, model: str, candidates: int, make_stages, settings, nodes: int = 0) -> dict:
    from database import Database
    from ir import import_onnx, simplify
    from tuner.task import extract_tasks, shape_points
    from tuner.tune import TuneOptions, tune_tasks
    g = simplify(import_onnx(MODELS[model]()))
    tasks = extract_tasks(g, shape_points(g.dims, None))[0]
    t0 = time.perf_counter()
    builder, runner, target = make_stages()
    setup_s = time.perf_counter() - t0
    try:
        with tempfile.TemporaryDirectory() as d:
            opts = TuneOptions(trials=candidates, batch_size=4, strategy="random", progress=False, repeat=3,
                               min_repeat_ms=5)
            db = Database(f"sqlite:///{d}/bench.db")
            busy = Busy()
            reports = tune_tasks(tasks[:1], db, opts, target, builder, runner, settings=settings,
                                 callbacks=[busy.callback])
            recs = db.records()
    finally:
        runner.close()
        builder.close()
    t = reports.timing
    per = t.wall_s / max(1, t.candidates)
    measured = [r for r in recs if r.status == "ok"]
    # the compile seconds the workers reported, per candidate
    compile_per = sum(r.compile_s or 0.0 for r in recs) / max(1, len(recs))
    n = max(1, t.candidates)
    if nodes == 0:     # local: builds (parallel) then timings (serial), as the loop waited for them
        overhead = (t.wall_s - t.build_s - busy.run_s - t.model_s - t.db_s) / n
    elif nodes == 1:   # one actor compiles and times in turn: the rest is Ray's
        overhead = (t.wall_s - busy.compile_s - busy.run_s - t.model_s - t.db_s) / n
    else:              # nodes overlap: no single latency to subtract
        overhead = None
    return {"name": name, "model": model, "overhead_s": overhead, "setup_s": setup_s, "wall_s": t.wall_s, "candidates": t.candidates,
            "per_minute": t.per_minute, "ok": len(measured), "per_candidate_s": per, "compile_per_s": compile_per,
            "run_wait_s": t.run_s / max(1, t.candidates), "build_s": t.build_s, "model_db_s": t.model_s + t.db_s,
            "targets": sorted({r.target["key"] for r in recs})}


def local_stages(settings):
    from tuner.measure import LocalBuilder, LocalRunner
    return lambda: (LocalBuilder(settings=settings), LocalRunner(repeat=3, min_repeat_ms=5, settings=settings), None)


def ray_stages(settings, holder):
    def make():
        from tuner.measure.ray import RayBuilder, RayRunner
        runner = RayRunner(repeat=3, min_repeat_ms=5, settings=settings)
        holder["runner"] = runner
        return RayBuilder(settings=settings), runner, runner.target
    return make


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--candidates", default="elementwise=24,dense=12", help="MODEL=N,... (models: elementwise, dense)")
    p.add_argument("--nodes", default="1,2,3")
    p.add_argument("--out", default=str(ROOT / "experiments" / "ray" / "results.md"))
    args = p.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    from codegen.cpu import _host
    from ir.settings import Settings
    rows = []
    for spec in args.candidates.split(","):
        model, _, count = spec.partition("=")
        with tempfile.TemporaryDirectory() as cache:
            rows.append(one_setting("local pool (2 build workers, 1 runner)", model, int(count),
                                    local_stages(Settings(cache_dir=f"{cache}/local")), None))
            print(rows[-1], flush=True)
            for n in [int(x) for x in args.nodes.split(",")]:
                t0 = time.perf_counter()
                c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80_000_000,
                                                                   "include_dashboard": False})
                try:
                    for _ in range(n - 1):
                        c.add_node(num_cpus=1, object_store_memory=80_000_000)
                    ray.init(address=c.address, log_to_driver=False)
                    start_s = time.perf_counter() - t0
                    settings = Settings(cache_dir=f"{cache}/ray{n}")
                    row = one_setting(f"Ray, {n} node(s) x 1 CPU", model, int(count), ray_stages(settings, {}),
                                      settings, nodes=n)
                    row["cluster_start_s"] = start_s
                    rows.append(row)
                    print(row, flush=True)
                finally:
                    ray.shutdown()
                    c.shutdown()
    host = _host()
    lines = ["# Ray vs local measurement throughput", "",
             f"Machine: {host['cpu']} ({host['cpu_name']}), {os.cpu_count()} cores, Python "
             f"{platform.python_version()}, numba {host['numba']}, Ray {ray.__version__}. Shared with other work: "
             "times are rough. Ray nodes are `ray.cluster_utils` nodes on this one machine, one CPU each; **3 "
             "one-core nodes oversubscribe the 2 cores** (their compiles and timings share cores, so the 3-node "
             "figures show Ray's scheduling, not a third core).", "",
             "Tasks: *elementwise* relu(x + b), x 128x512 float32 (few distinct sources: most knobs are run-time); "
             "*dense* x[32,256] @ w[256,256] + b, relu (register-tile knobs: most candidates compile, 1-7 s each). "
             "Random candidates (same seed in every setting), batches of 4, 3 timing repeats of >= 5 ms; a fresh "
             "kernel cache per setting.", "",
             "| task | setting | candidates | candidates/min | wall s | compile s per candidate (workers) | "
             "driver overhead s per candidate | cluster start + actors s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        start = (f"{r['cluster_start_s']:.1f} + {r['setup_s']:.1f}" if "cluster_start_s" in r else "-")
        over = "overlapped" if r["overhead_s"] is None else f"{r['overhead_s']:.3f}"
        lines.append(f"| {r['model']} | {r['name']} | {r['candidates']} | {r['per_minute']:.1f} | {r['wall_s']:.1f} | "
                     f"{r['compile_per_s']:.2f} | {over} | {start} |")
    lines += ["", "*Driver overhead per candidate*: wall time minus what the workers reported (compile and timed call "
              "seconds) minus the driver's search and database time, per candidate. Local: wall − build wall − "
              "timing calls (as the driver saw them); Ray on 1 node: wall − the actor's compile and timing calls, i.e. "
              "what Ray adds per candidate (actor call, object transfer, ray.wait). With 2+ nodes the nodes work "
              "at once, so there is no single latency to subtract. Cluster start and actor creation (each actor "
              "starts a worker child that imports numba) are paid once per run, not per candidate.", ""]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

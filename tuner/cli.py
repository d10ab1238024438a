"""`tune`: tune an ONNX model's kernels into the database (and optionally a plan)."""
from __future__ import annotations

import argparse
import sys

from ir.errors import CliParser, TensortuneError, redact, run_cli


def _parser() -> argparse.ArgumentParser:
    p = CliParser(prog="tune", description="Tune the kernels of an ONNX model on this machine. "
                                "`tune inspect MODEL` prints the model's partition without tuning.")
    p.add_argument("--model", required=True, help="ONNX model file")
    p.add_argument("--trials", type=int, default=64, help="measurements for the whole model (default 64)")
    p.add_argument("--target", default=None, metavar="BACKEND",
                   help="the backend to tune kernels for: cpu (numba; default, or $TENSORTUNE_BACKEND), cuda "
                        "(numba-cuda on this machine's GPU: pip install '.[cuda]'), or one a plugin registers")
    p.add_argument("--db", default=None, help="SQLAlchemy URL (default $TENSORTUNE_DB or sqlite:///tuning.db)")
    p.add_argument("--dim", action="append", metavar="NAME=LO:HI", help="declare a dynamic dim's range")
    p.add_argument("--shape", action="append", metavar="NAME=V1,V2", help="dim sizes to tune for (default 32)")
    p.add_argument("--strategy", default="xgb",
                   help="search strategy: random, grid, ga (genetic), xgb (cost-model guided); default xgb")
    p.add_argument("--cost-model", default="xgb",
                   help="model of --strategy xgb: xgb (rank:pairwise), xgb-reg (squared error), random")
    p.add_argument("--no-transfer", action="store_true",
                   help="do not warm-start the cost model from records of other shapes of the same template")
    p.add_argument("--scheduler", default="gradient",
                   help="how trials are split across tasks: gradient (cut the model latency fastest), round-robin")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop starting new batches after this many seconds")
    p.add_argument("--batch-size", type=int, default=8, help="candidates per measurement batch")
    p.add_argument("--compile-share", type=float, default=0.5, metavar="F",
                   help="cost-aware batches (random, xgb): compiling new code shapes takes about this share of the "
                        "tuning time, the rest measures run-time variants of built kernels (default 0.5; 0: no "
                        "limit, every proposal may be a new code shape)")
    p.add_argument("--seed", type=int, default=0, help="makes the proposal sequence reproducible")
    p.add_argument("--early-stopping", type=int, default=None, metavar="N",
                   help="stop a task after N trials without improvement")
    p.add_argument("--resume", dest="resume", action="store_true", default=True,
                   help="skip configs the database already holds for this target (default)")
    p.add_argument("--no-resume", dest="resume", action="store_false",
                   help="re-measure configs the database already holds")
    p.add_argument("--number", type=int, default=None, help="calls per timing repeat (default: fill --min-repeat-ms)")
    p.add_argument("--repeat", type=int, default=5, help="timing repeats; the median is kept (default 5)")
    p.add_argument("--min-repeat-ms", type=float, default=20.0, help="minimum length of one repeat (default 20)")
    p.add_argument("--flush-cache", action="store_true", help="evict the CPU caches before every timing repeat")
    p.add_argument("--measure-runs", type=int, default=10, metavar="N",
                   help="after tuning, time the whole model at least N times with its tuned kernels, and untuned, "
                        "in turn, as many as fill 0.25 s (0: skip)")
    p.add_argument("--verify-runs", type=int, default=10, metavar="N",
                   help="after tuning, time each tuned subgraph inside the model against its default config N runs "
                        "and deploy the faster (0: skip; default 10)")
    p.add_argument("--plan", default=None, metavar="FILE", help="also write the deploy plan (JSON) here")
    p.add_argument("--log-file", default=None, help="machine-readable progress (JSON lines)")
    p.add_argument("--build-timeout", type=float, default=120.0)
    p.add_argument("--run-timeout", type=float, default=30.0)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--show-graph", action="store_true", help="print the partition and exit")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE (name or .py path) first: it registers custom ops/templates; the tuner's "
                        "workers import it too (also $TENSORTUNE_PLUGINS, comma-separated)")
    p.add_argument("--fallback", default=None, metavar="onnxruntime",
                   help="ops tensortune cannot run go to onnxruntime when the whole model is timed")
    p.add_argument("--runner", default="local", metavar="NAME",
                   help="what checks and times candidates: local (a worker process on this machine; default), "
                        "ray (one runner actor per node of a Ray cluster; see --ray)")
    p.add_argument("--builder", default="local", metavar="NAME",
                   help="what compiles candidates: local (worker processes on every core; default), ray (on the "
                        "cluster: inside the actor that times each kernel; the default with --runner ray)")
    p.add_argument("--ray", default=None, metavar="auto|ADDRESS",
                   help="the Ray cluster to measure on: auto (the one `ray start` began on this machine) or the "
                        "head's HOST:PORT; implies --runner ray (default with --runner ray: auto)")
    p.add_argument("--target-key", default=None, metavar="KEY",
                   help="with --runner ray: measure only on nodes whose target key is KEY (one kind of node); "
                        "the keys of the cluster's nodes are listed when none matches")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="at the end, write the convergence plot here: best latency per task and estimated model "
                        "latency vs trials (needs matplotlib: pip install 'tensortune[plot]')")
    return p


def inspect_text(model, dims=None, shapes=None) -> str:
    from ir import import_onnx, partition, simplify
    from ir.workload import make_workload
    from codegen.backend import template_kind
    from ir.settings import current
    from schedules import find_template
    from tuner.task import shape_points
    kind = template_kind(current().backend)
    g = simplify(import_onnx(model, dims))
    sgs = partition(g)
    points = shape_points(g.dims, shapes)
    lines = [f"model {g.name}: {len(g.nodes)} nodes after passes, {len(sgs)} fused subgraphs"]
    if g.dims:
        lines.append("dynamic dims: " + ", ".join(str(r) for r in g.dims.values()) +
                     f"; shown at {points[0]}")
    groups: dict[str, list] = {}
    from ir.shapes import UnboundDimsError
    for sg in sgs:
        try:
            wl = make_workload(g, sg, points[0])
        except UnboundDimsError:  # after an op whose output sizes only its run tells
            groups.setdefault(f"runtime:{sg}", []).append((sg, None))
            continue
        groups.setdefault(wl.signature, []).append((sg, wl))
    for sig, members in groups.items():
        sg, wl = members[0]
        if wl is None:
            lines.append(f"  {len(members)}x {sg}  [{sg.kind}]  -> {g.type_of(sg.output)}  "
                         "shapes known at run time (reference path)")
            continue
        t = find_template(wl, kind)
        shapes_txt = ", ".join(str(g.type_of(i)) for i in sg.inputs)
        lines.append(f"  {len(members)}x {sg}  [{sg.kind}]  in: {shapes_txt}  -> {g.type_of(sg.output)}  "
                     f"{wl.flops() / 1e6:.2f} MFLOP  template: {t.name if t else 'none (reference fallback)'}")
    return "\n".join(lines)


def ray_defaults(args, argv=None) -> None:
    """`--ray ADDRESS` implies `--runner ray`; the Ray runner builds with the Ray builder (in
    the actor that times each kernel) unless `--builder` was given: the local one would
    compile on this machine's cores, which may be a cluster node's."""
    given = set(getattr(args, "_given", ()) if argv is None else _flags(argv))
    if args.ray and "--runner" not in given and args.runner == "local":
        args.runner = "ray"
    if args.runner == "ray" and "--builder" not in given and args.builder == "local":
        args.builder = "ray"


def _flags(argv) -> set:
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["inspect"]:
        argv = ["--show-graph", "--model"] + argv[1:] if len(argv) > 1 and not argv[1].startswith("-") else \
            ["--show-graph"] + argv[1:]
    args = _parser().parse_args(argv)
    args._given = _flags(argv)
    return run_cli("tune", _run, args,
                   interrupted="every finished measurement is in the database (run again to resume)")


def _run(args) -> int:
    from ir.custom import load_plugins
    from ir.settings import current
    from ir.shapes import parse_dim_ranges, parse_shape_points
    from runtime.fallback import check_fallback
    settings = current()   # run_cli installed what the environment asks for
    load_plugins(list(args.plugin) + list(settings.plugins))
    if args.target:
        from ir.settings import use
        from codegen import get_backend
        settings = settings.with_(backend=args.target)
        get_backend(args.target, settings).target()   # an unknown backend or a missing GPU: one line, now
        use(settings)   # the measurement stages and their workers build for it
    check_fallback(args.fallback)
    dims = parse_dim_ranges(args.dim)
    shapes = parse_shape_points(args.shape)
    if args.show_graph:
        print(inspect_text(args.model, dims, shapes))
        return 0
    if args.trials <= 0:
        raise TensortuneError(f"--trials must be a positive number, got {args.trials}")
    for flag, v in (("--batch-size", args.batch_size), ("--repeat", args.repeat), ("--number", args.number),
                    ("--early-stopping", args.early_stopping), ("--time-budget", args.time_budget),
                    ("--build-timeout", args.build_timeout), ("--run-timeout", args.run_timeout)):
        if v is not None and not v > 0:  # `not >`: NaN too
            raise TensortuneError(f"{flag} must be a positive number, got {v}")
    for flag, v in (("--min-repeat-ms", args.min_repeat_ms), ("--measure-runs", args.measure_runs),
                    ("--verify-runs", args.verify_runs),
                    ("--seed", args.seed)):
        if not v >= 0:
            raise TensortuneError(f"{flag} must be >= 0, got {v}")
    if not 0 <= args.compile_share < 1:
        raise TensortuneError(f"--compile-share must be >= 0 and < 1 (0: no limit), got {args.compile_share}")
    from tuner.search import STRATEGIES
    if args.strategy not in STRATEGIES:  # validate names before any work
        raise TensortuneError(f"unknown --strategy '{args.strategy}' (choose from: {', '.join(sorted(STRATEGIES))})")
    from tuner.cost_model import COST_MODELS
    if args.cost_model not in COST_MODELS:
        raise TensortuneError(f"unknown --cost-model '{args.cost_model}' (choose from: {', '.join(COST_MODELS)})")
    from tuner.scheduler import SCHEDULERS
    if args.scheduler not in SCHEDULERS:
        raise TensortuneError(f"unknown --scheduler '{args.scheduler}' (choose from: {', '.join(SCHEDULERS)})")
    from tuner.measure import builder_names, runner_names
    ray_defaults(args)
    if args.runner != "ray" and (args.ray or args.target_key):
        raise TensortuneError(f"{'--ray' if args.ray else '--target-key'} picks cluster nodes: it goes with "
                              f"--runner ray, not --runner {args.runner}")
    if args.runner not in runner_names():
        raise TensortuneError(f"unknown --runner '{args.runner}' (choose from: {', '.join(runner_names())})")
    if args.builder not in builder_names():
        raise TensortuneError(f"unknown --builder '{args.builder}' (choose from: {', '.join(builder_names())})")
    if args.plot:
        _check_plot_path(args.plot)
    from ir import import_onnx, simplify
    graph = simplify(import_onnx(args.model, dims))  # read once; fails on a bad model before anything opens
    from codegen import cache_dir, host_target
    cache_dir(settings)  # a kernel cache we may not use fails here, not as a compile_error per candidate
    from database import Database
    from tuner.tune import (TuneOptions, agreement_line, estimated_latency, measure_deployed, summary_table,
                            tune_model, unusable_warnings, verification_lines)
    from tuner.verify import deployed_estimate
    db = Database(args.db)
    opts = TuneOptions(trials=args.trials, strategy=args.strategy, batch_size=args.batch_size, seed=args.seed,
                       early_stopping=args.early_stopping, resume=args.resume,
                       progress=not args.no_progress, log_file=args.log_file,
                       build_timeout=args.build_timeout, run_timeout=args.run_timeout, number=args.number,
                       repeat=args.repeat, min_repeat_ms=args.min_repeat_ms, flush_cache=args.flush_cache,
                       scheduler=args.scheduler, time_budget=args.time_budget, cost_model=args.cost_model,
                       transfer=not args.no_transfer, fallback=args.fallback, builder=args.builder,
                       runner=args.runner, plot=args.plot, ray=args.ray, target_key=args.target_key,
                       verify_runs=args.verify_runs, compile_share=args.compile_share or None)
    builder = runner = target = None
    if args.runner == "ray":   # the cluster answers (and has a matching node) before anything is tuned
        from tuner.measure import make_builder, make_runner
        from tuner.tune import builder_options, runner_options
        runner = make_runner("ray", **runner_options(opts, settings))
        target = runner.target
        print(f"measuring on {runner.capacity} Ray node(s): " +
              ", ".join(sorted({f"{t.key} ({t})" for t in runner.targets})))
        try:
            builder = make_builder(args.builder, **builder_options(opts, settings))
        except BaseException:
            runner.close()
            raise
    try:
        graph, points, reports, uncovered = tune_model(graph, db, opts, shapes=shapes, target=target,
                                                       builder=builder, runner=runner, settings=settings)
    finally:
        for stage in (builder, runner):
            if stage is not None:
                stage.close()
    print(summary_table(reports))
    if getattr(reports, "stopped", "") and reports.stopped != "trials":
        print(f"stopped: {reports.stopped}")
    for line in unusable_warnings(reports):
        print(f"tune: warning: {line}", file=sys.stderr)
    nothing_usable = bool(reports) and all(r.best is None for r in reports)
    for line in verification_lines(reports):
        print(line)
    est = estimated_latency(reports)
    if args.measure_runs > 0 and target is not None:
        print("end-to-end latency not measured here: the kernels were tuned for the cluster's nodes "
              f"(target {target.key}); run `tune-run` on one of them")
    elif args.measure_runs > 0 and reports and not nothing_usable:
        try:
            deployed = measure_deployed(graph, db, points[0], runs=args.measure_runs, fallback=args.fallback,
                                        settings=settings)
        except Exception as e:  # tuning results are stored; a failing model run must not hide that
            print(f"end-to-end latency not measured: {type(e).__name__}: {redact(e)}", file=sys.stderr)
            deployed = None
        if deployed is not None:
            # the deployed configs' in-model times (the check's), plus the model's time outside its kernels
            est = deployed_estimate(reports, db, host_target(settings.backend, settings).key, deployed,
                                    reports.verification)
            print(f"end-to-end at {points[0] or 'static shape'}: "
                  f"{agreement_line(est, deployed.tuned_steps_s, deployed.default_steps_s)} (whole model deployed "
                  f"from the database and untuned, in turn, {deployed.runs} runs: each step's median, summed)")
            if args.log_file:
                import json
                import time
                with open(args.log_file, "a") as f:
                    f.write(json.dumps({"time": time.time(), "event": "model_latency", "estimated": est,
                                        "measured": deployed.tuned_s, "untuned": deployed.default_s,
                                        "sizes": points[0]}) + "\n")
    if uncovered and settings.backend != "cpu":
        print(f"{len(uncovered)} subgraph(s) have no {settings.backend} template (they run CPU kernels, or fold or run "
              "as views as on the CPU): " + ", ".join(sorted({str(sg) for sg in uncovered})))
    elif uncovered:
        print(f"{len(uncovered)} subgraph(s) have no template (shape computations fold once per shape at run time, reshapes run as views, anything else on the NumPy reference path): "
              + ", ".join(sorted({str(sg) for sg in uncovered})))
    print(f"results in {redact(db.url)}")
    if args.plot:
        print(f"convergence plot written to {args.plot}")
    if args.plan:
        from runtime import build_plan
        target = target or host_target(settings.backend, settings)
        plan = build_plan(graph, db, points, target.key, graph.name, target=target)
        plan.save(args.plan)
        print(f"plan with {len(plan.entries)} entries written to {args.plan}")
    if nothing_usable:
        print("tune: error: every candidate failed: nothing usable was found (see the warnings above)",
              file=sys.stderr)
        return 1
    return 0


def _check_plot_path(path: str) -> None:
    """--plot needs matplotlib and a folder to write into: both known before tuning starts."""
    import os
    from tuner.plot import PlotError, require_matplotlib
    require_matplotlib()
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise PlotError(f"--plot {path}: no folder {folder}")


if __name__ == "__main__":
    sys.exit(main())

"""`tune`: tune an ONNX model's kernels into the database (and optionally a plan)."""
from __future__ import annotations

import argparse
import os
import sys

from ir.errors import TensortuneError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tune", description="Tune the kernels of an ONNX model on this machine. "
                                "`tune inspect MODEL` prints the model's partition without tuning.")
    p.add_argument("--model", required=True, help="ONNX model file")
    p.add_argument("--trials", type=int, default=64, help="measurements for the whole model (default 64)")
    p.add_argument("--db", default=None, help="SQLAlchemy URL (default $TENSORTUNE_DB or sqlite:///tuning.db)")
    p.add_argument("--dim", action="append", metavar="NAME=LO:HI", help="declare a dynamic dim's range")
    p.add_argument("--shape", action="append", metavar="NAME=V1,V2", help="dim sizes to tune for (default 32)")
    p.add_argument("--strategy", default="random", help="search strategy (default random)")
    p.add_argument("--batch-size", type=int, default=8, help="candidates per measurement batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--early-stopping", type=int, default=None, metavar="N",
                   help="stop a task after N trials without improvement")
    p.add_argument("--no-resume", action="store_true", help="re-measure configs the database already holds")
    p.add_argument("--plan", default=None, metavar="FILE", help="also write the deploy plan (JSON) here")
    p.add_argument("--log-file", default=None, help="machine-readable progress (JSON lines)")
    p.add_argument("--build-timeout", type=float, default=120.0)
    p.add_argument("--run-timeout", type=float, default=30.0)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--show-graph", action="store_true", help="print the partition and exit")
    return p


def inspect_text(model, dims=None, shapes=None) -> str:
    from ir import import_onnx, partition, simplify
    from ir.workload import make_workload
    from schedules import find_template
    from tuner.task import shape_points
    g = simplify(import_onnx(model, dims))
    sgs = partition(g)
    points = shape_points(g.dims, shapes)
    lines = [f"model {g.name}: {len(g.nodes)} nodes after passes, {len(sgs)} fused subgraphs"]
    if g.dims:
        lines.append("dynamic dims: " + ", ".join(str(r) for r in g.dims.values()) +
                     f"; shown at {points[0]}")
    groups: dict[str, list] = {}
    for sg in sgs:
        wl = make_workload(g, sg, points[0])
        groups.setdefault(wl.signature, []).append((sg, wl))
    for sig, members in groups.items():
        sg, wl = members[0]
        t = find_template(wl)
        shapes_txt = ", ".join(str(g.type_of(i)) for i in sg.inputs)
        lines.append(f"  {len(members)}x {sg}  [{sg.kind}]  in: {shapes_txt}  -> {g.type_of(sg.output)}  "
                     f"{wl.flops() / 1e6:.2f} MFLOP  template: {t.name if t else 'none (reference fallback)'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["inspect"]:
        argv = ["--show-graph", "--model"] + argv[1:] if len(argv) > 1 and not argv[1].startswith("-") else \
            ["--show-graph"] + argv[1:]
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except TensortuneError as e:
        print(f"tune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tune: interrupted; every finished measurement is in the database (run again to resume)",
              file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("TENSORTUNE_DEBUG"):
            raise
        print(f"tune: internal error: {type(e).__name__}: {e} (set TENSORTUNE_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1


def _run(args) -> int:
    from ir.shapes import parse_dim_ranges, parse_shape_points
    dims = parse_dim_ranges(args.dim)
    shapes = parse_shape_points(args.shape)
    if args.show_graph:
        print(inspect_text(args.model, dims, shapes))
        return 0
    if args.trials <= 0:
        raise TensortuneError(f"--trials must be a positive number, got {args.trials}")
    if args.batch_size <= 0:
        raise TensortuneError(f"--batch-size must be a positive number, got {args.batch_size}")
    from ir import load_onnx
    load_onnx(args.model)  # fail on a bad model before opening anything else
    from database import Database
    from tuner.tune import TuneOptions, summary_table, tune_model
    db = Database(args.db)
    opts = TuneOptions(trials=args.trials, strategy=args.strategy, batch_size=args.batch_size, seed=args.seed,
                       early_stopping=args.early_stopping, resume=not args.no_resume,
                       progress=not args.no_progress, log_file=args.log_file,
                       build_timeout=args.build_timeout, run_timeout=args.run_timeout)
    from tuner.search import make_strategy  # validate the name before any work
    from schedules.space import ConfigSpace
    make_strategy(args.strategy, ConfigSpace([]))
    graph, points, reports, uncovered = tune_model(args.model, db, opts, dims, shapes)
    print(summary_table(reports))
    if uncovered:
        print(f"{len(uncovered)} subgraph(s) have no template and run on the reference path: "
              + ", ".join(sorted({str(sg) for sg in uncovered})))
    print(f"results in {db.url}")
    if args.plan:
        from codegen import host_target
        from runtime import build_plan
        plan = build_plan(graph, db, points, host_target().key, graph.name)
        plan.save(args.plan)
        print(f"plan with {len(plan.entries)} entries written to {args.plan}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

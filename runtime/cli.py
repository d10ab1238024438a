"""`tune-run`: run a model with its tuned kernels; check against onnxruntime, benchmark."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np

from ir.errors import CliParser, TensortuneError, redact, run_cli


def _parser():
    p = CliParser(prog="tune-run", description="Run an ONNX model with tuned kernels.")
    p.add_argument("--model", required=True)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--db", default=None, help="database URL (default $TENSORTUNE_DB or sqlite:///tuning.db if it exists)")
    src.add_argument("--plan", default=None, help="plan file written by `tune --plan`")
    p.add_argument("--dim", action="append", metavar="NAME=LO:HI")
    p.add_argument("--shape", action="append", metavar="NAME=V", help="dynamic dim sizes to run at (default 32)")
    p.add_argument("--target", default=None, metavar="BACKEND",
                   help="the backend to run kernels on: cpu (default, or $TENSORTUNE_BACKEND), cuda (this machine's "
                        "GPU; subgraphs without a GPU kernel run on the CPU, shown as cpu-fallback)")
    p.add_argument("--check", action="store_true", help="compare outputs with onnxruntime")
    p.add_argument("--bench", type=int, default=0, metavar="N", help="time N runs; print p50/p95/p99")
    p.add_argument("--profile", action="store_true",
                   help="time every step over --profile-runs runs; print where the time goes by template or kind "
                        "(executor overhead = total - sum of steps)")
    p.add_argument("--profile-runs", type=int, default=10, metavar="N", help="runs a --profile times (default 10)")
    p.add_argument("--vs-onnxruntime", action="store_true",
                   help="with --profile: onnxruntime's own profile of the same inputs beside each row, run in turn")
    p.add_argument("--strict", action="store_true",
                   help="fail if any subgraph would run on the reference path or in onnxruntime")
    p.add_argument("--fallback", default=None, metavar="onnxruntime",
                   help="run ops tensortune cannot in onnxruntime (one session per unsupported region)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE first: it registers custom ops/templates (also $TENSORTUNE_PLUGINS, comma-separated)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    return p


def random_feeds(graph, sizes: dict, seed: int = 0) -> dict:
    """Random inputs at `sizes`: normal floats; int ids below the size of the table they
    index where the input feeds a Gather of a constant table, else in [0, 2) (masks)."""
    from ir.shapes import bind
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        t = graph.type_of(name)
        shape = bind(t.shape, sizes)
        if t.dtype.startswith("float"):
            feeds[name] = rng.standard_normal(shape).astype(t.dtype)
        elif t.dtype == "bool":
            feeds[name] = rng.random(shape) < 0.5
        else:
            feeds[name] = rng.integers(0, id_bound(graph, name), size=shape).astype(t.dtype)
    return feeds


def id_bound(graph, name: str) -> int:
    """Exclusive upper bound for valid values of int input `name`: the smallest table it indexes."""
    bounds = []
    for n in graph.nodes:
        if n.op == "Gather" and len(n.inputs) > 1 and n.inputs[1] == name and n.inputs[0] in graph.constants:
            table = graph.constants[n.inputs[0]]
            axis = int(n.attrs.get("axis", 0))
            if table.ndim:
                bounds.append(int(table.shape[axis % table.ndim]))
    return max(1, min(bounds)) if bounds else 2


def cli_plugins(flags: list[str]) -> list[str]:
    """--plugin modules, then those of $TENSORTUNE_PLUGINS (read into the settings by `run_cli`)."""
    from ir.settings import current
    return list(flags or []) + list(current().plugins)


def main(argv=None) -> int:
    return run_cli("tune-run", _run, _parser().parse_args(argv))


def _default_db(args):
    if args.db or args.plan:
        return args.db
    from database import default_url
    url = default_url()
    if url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///"):]):
        return None
    return url


def _run(args) -> int:
    for flag, v in (("--bench", args.bench), ("--seed", args.seed)):
        if v < 0:
            raise TensortuneError(f"{flag} must be >= 0, got {v}")
    if args.profile_runs < 1:
        raise TensortuneError(f"--profile-runs must be >= 1, got {args.profile_runs}")
    if args.vs_onnxruntime and not args.profile:
        raise TensortuneError("--vs-onnxruntime compares a profile: add --profile")
    with warnings.catch_warnings(record=True) as caught:  # every warning goes in the report
        warnings.simplefilter("always")
        report, cov, mem, prof = _report(args)
    report["warnings"] = list(dict.fromkeys(redact(w.message) for w in caught))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print_text(args, report, cov, mem)
        if prof is not None:
            print(prof.table())
    if "check" in report and not report["check"]["ok"]:
        return 3
    return 0


def _report(args):
    """(the JSON report, kernel coverage, memory plan, profile or None) of loading and running the model."""
    import runtime
    from ir.shapes import parse_dim_ranges, parse_shape_points
    dims = parse_dim_ranges(args.dim)
    t0 = time.perf_counter()
    from ir.settings import current
    model = runtime.load(args.model, db=_default_db(args), plan=args.plan, dims=dims, strict=args.strict,
                          fallback=args.fallback, plugins=cli_plugins(args.plugin),
                          target=args.target or current().backend)
    load_s = time.perf_counter() - t0
    sizes = runtime.default_sizes(model.graph.dims, parse_shape_points(args.shape))
    feeds = random_feeds(model.graph, sizes, args.seed)
    t0 = time.perf_counter()
    outs = model.run(feeds)
    first_s = time.perf_counter() - t0
    report = {"model": args.model, "sizes": sizes, "load_s": load_s, "first_run_s": first_s}
    if args.check:
        report["check"] = _check(args.model, feeds, outs, model.graph, sizes)
    if args.bench:
        lat = []
        for _ in range(args.bench):
            t0 = time.perf_counter()
            model.run(feeds)
            lat.append(time.perf_counter() - t0)
        report["latency_ms"] = {f"p{q}": float(np.percentile(lat, q) * 1e3) for q in (50, 95, 99)}
    prof = None
    if args.profile:
        prof = model.profile(feeds, runs=args.profile_runs, onnx_model=args.model if args.vs_onnxruntime else None)
        report["profile"] = prof.to_json()
    cov = model.coverage(sizes)
    report["coverage"] = cov.to_json()
    mem = model.memory(sizes)
    report["memory"] = mem.to_json()
    return report, cov, mem, prof


def _print_text(args, report, cov, mem) -> None:
    for w in report["warnings"]:
        print(f"warning: {w}")
    print(f"model {args.model} at {report['sizes']}: loaded in {report['load_s']:.2f} s, "
          f"first run {report['first_run_s'] * 1e3:.1f} ms")
    print(f"kernels: {cov}")
    print(f"memory: {mem}")
    if cov.fallback_ops:
        print(f"ops on onnx.reference: {', '.join(cov.fallback_ops)}")
    if cov.counts.get("onnxruntime"):
        print(f"fallback to onnxruntime: {cov.share('onnxruntime'):.0%} of nodes, "
              f"{cov.time_share('onnxruntime'):.0%} of time")
    if "check" in report:
        c = report["check"]
        print(f"check vs onnxruntime: max abs error {c['max_abs_error']:.3g}, max rel error "
              f"{c['max_rel_error']:.3g} -> {'OK' if c['ok'] else 'MISMATCH'}")
        if not c["ok"]:
            print(f"  {c['error']}")
    if "latency_ms" in report:
        l = report["latency_ms"]
        print(f"latency over {args.bench} runs: p50 {l['p50']:.3f} ms, p95 {l['p95']:.3f} ms, p99 {l['p99']:.3f} ms")


def _check(model_path, feeds, outs, graph=None, sizes=None) -> dict:
    """Our outputs vs onnxruntime's, element-wise under `ir.accuracy`'s rule (the tuner's):
    the tolerance per output follows its dtype and the longest chain of reductions behind it."""
    from ir.accuracy import compare, graph_reductions
    try:
        import onnxruntime as ort
    except ImportError:
        raise TensortuneError("--check needs onnxruntime: pip install 'tensortune[check]'") from None
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(None, feeds)))
    reductions = graph_reductions(graph, sizes or {}) if graph is not None else {}
    abs_err, rel_err, per_output, errors = 0.0, 0.0, {}, []
    for name, want in ref.items():
        c = compare(outs[name], want, reductions.get(name, 1))
        abs_err, rel_err = max(abs_err, c.max_abs_error), max(rel_err, c.max_rel_error)
        per_output[name] = {"ok": c.ok, "reduction": reductions.get(name, 1), "rtol": c.tolerance.rtol,
                            "atol": c.tolerance.atol, "bad_elements": c.bad, "worst": c.worst}
        if not c.ok:
            errors.append(c.message(f"output '{name}'") + " vs onnxruntime")
    report = {"max_abs_error": abs_err, "max_rel_error": rel_err, "ok": not errors, "outputs": per_output}
    if errors:
        report["error"] = errors[0]
    return report


if __name__ == "__main__":
    sys.exit(main())

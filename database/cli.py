"""`tune-db`: look into the tuning database from the shell (best kernels, workloads,
history, stats), move records between machines (export/import), and prune it."""
from __future__ import annotations

import argparse
import json
import os
import sys

from database.errors import DatabaseError
from database.record import Record
from database.store import Database, default_url

PROG = "tune-db"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage + exiting: errors stay one line."""

    def error(self, message):
        raise _UsageError(message)


# -- formatting -----------------------------------------------------------------------------

def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def fmt_gflops(flops: int | None, median: float | None) -> str:
    if not (flops and median):
        return "-"
    g = flops / median / 1e9
    return f"{g:.1f}" if g >= 10 else f"{g:.3g}"


def describe(workload: dict) -> str:
    try:
        from ir.workload import Workload

        return Workload.from_json(workload).describe()
    except Exception:  # a workload this version cannot read: still list the record
        return "?"


def short_config(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(config.items()))


def table(headers: list[str], rows: list[list], right: set[int] = frozenset()) -> str:
    """Aligned plain text; columns in `right` (numbers) are right-aligned."""
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def rec_json(r: Record) -> dict:
    return {**r.to_json(), "id": r.id, "config_hash": r.config_hash}


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


# -- subcommands ----------------------------------------------------------------------------

def cmd_best(db: Database, a) -> None:
    recs = db.best_per_workload(target_key=a.target, family=a.family, template=a.template)
    if a.k > 1:
        recs = [r for b in recs for r in db.best(b.workload_key, b.target_key, a.k)]
    if a.json:
        return _print_json([rec_json(r) for r in recs])
    if not recs:
        print("no successful records")
        return
    rows = [[r.workload_key, r.family, describe(r.workload), r.template, r.target_key, fmt_time(r.median),
             fmt_gflops(r.flops, r.median), short_config(r.config)] for r in recs]
    print(table(["workload", "family", "shapes", "template", "target", "median", "GFLOP/s", "config"], rows,
                right={5, 6}))


def cmd_workloads(db: Database, a) -> None:
    ws = db.workloads(family=a.family, template=a.template)
    if a.json:
        return _print_json(ws)
    if not ws:
        print("no workloads")
        return
    rows = [[w["key"], w["family"], w["template"], w["version"], describe_shapes(w["shapes"]),
             f"{w['flops'] / 1e6:.4g}" if w["flops"] else "-", w["n_records"], fmt_time(w["best_median"]),
             fmt_gflops(w["flops"], w["best_median"])] for w in ws]
    print(table(["workload", "family", "template", "v", "input shapes", "MFLOP", "records", "best", "GFLOP/s"], rows,
                right={3, 5, 6, 7, 8}))


def describe_shapes(shapes: list) -> str:
    return ", ".join("x".join(map(str, s)) for s in shapes)


def _resolve_key(db: Database, key: str) -> str:
    """A workload key or a unique prefix of one (as git does with hashes)."""
    keys = [w["key"] for w in db.workloads()]
    if key in keys:
        return key
    hits = [k for k in keys if k.startswith(key)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise DatabaseError(f"workload key prefix {key!r} is ambiguous: {', '.join(hits[:5])}")
    raise DatabaseError(f"no workload with key {key!r} in {db!r}")


def cmd_history(db: Database, a) -> None:
    key = _resolve_key(db, a.key)
    recs = db.history(key, a.target)
    if a.json:
        return _print_json([rec_json(r) for r in recs])
    best, rows = None, []
    for n, r in enumerate(recs, 1):
        if r.status == "ok" and (best is None or r.median < best):
            best = r.median
        err = r.error.strip().splitlines()[0][:60] if r.error.strip() else ""
        rows.append([n, r.created_at.strftime("%Y-%m-%d %H:%M:%S"), r.target_key, r.status, fmt_time(r.median),
                     fmt_time(best), short_config(r.config), err])
    print(f"workload {key}: {describe(recs[0].workload) if recs else ''}, {len(recs)} records")
    if rows:
        print(table(["#", "time (UTC)", "target", "status", "median", "best so far", "config", "error"], rows,
                    right={0, 4, 5}))


def _single_target(groups: list, target: str | None) -> list:
    """Best-so-far curves of several machines mixed would be meaningless: one target only."""
    if target:
        return groups
    keys = sorted({r.target_key for _, _, recs in groups for r in recs})
    if len(keys) > 1:
        raise DatabaseError(f"the records are of {len(keys)} targets: give --target KEY (one of {', '.join(keys)})")
    return groups


def cmd_plot(db: Database, a) -> None:
    from tuner.plot import draw, from_records, records_for_model, require_matplotlib
    require_matplotlib()
    if a.model:
        groups = records_for_model(db, a.model, a.dim, a.shape, a.target)
        title = f"{a.model}: {len(groups)} tasks"
    elif a.key:
        key = _resolve_key(db, a.key)
        recs = db.records(workload_key=key, target_key=a.target)
        groups = [(describe(recs[0].workload) if recs else key, 1, recs)]
        title = f"workload {key}"
    else:
        raise _UsageError("plot: give a workload KEY or --model MODEL.onnx")
    groups = _single_target(groups, a.target)
    n = sum(len(recs) for _, _, recs in groups)
    if not n:
        raise DatabaseError("no records to plot" + (f" for target {a.target}" if a.target else ""))
    draw(from_records(groups), a.out, title)
    print(f"convergence of {n} trials ({len(groups)} task{'s' * (len(groups) != 1)}) written to {a.out}")


def cmd_stats(db: Database, a) -> None:
    st = db.stats()
    if a.json:
        return _print_json({"url": _masked(db), **st})
    rows = [["database", _masked(db)], ["workloads", st["workloads"]], ["targets", st["targets"]],
            ["records", st["records"]]]
    rows += [[f"  {s}", n] for s, n in st["by_status"].items()]
    rows += [["compile time", f"{st['compile_s']:.1f} s"], ["first record", st["first"] or "-"],
             ["last record", st["last"] or "-"]]
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))


def _masked(db: Database) -> str:
    return _masked_url(db.url)


def _masked_url(url: str) -> str:
    from database.engine import mask

    return mask(url)


def cmd_export(db: Database, a) -> None:
    n = db.export_jsonl(a.file)
    print(f"exported {n} records to {a.file}")


def cmd_import(db: Database, a) -> None:
    added, skipped = db.import_jsonl(a.file)
    print(f"imported {added} records from {a.file} ({skipped} duplicates skipped)")


def cmd_prune(db: Database, a) -> None:
    n = db.prune(keep_top_k=a.keep, failures_older_than_days=a.failures_older_than)
    print(f"pruned {n} records")


# -- parser -------------------------------------------------------------------------------

def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s!r} must be >= 1")
    return v


def _days(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number of days") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{s!r} must be >= 0 days")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__)
    p.add_argument("--db", metavar="URL", help=f"database URL (default: $TENSORTUNE_DB or {_masked_url(default_url())!r})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def filters(sp, target=True):
        sp.add_argument("--family", help="only this op family (dense, conv2d, ...)")
        sp.add_argument("--template", help="only this schedule template")
        if target:
            sp.add_argument("--target", metavar="KEY", help="only records of this target")

    s = sub.add_parser("best", help="the fastest config of each workload")
    filters(s)
    s.add_argument("-k", type=_positive_int, default=1, help="the k fastest distinct configs of each")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_best)
    s = sub.add_parser("workloads", help="every workload with its record count and best time")
    filters(s, target=False)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_workloads)
    s = sub.add_parser("history", help="every measurement of one workload, in time order")
    s.add_argument("key", metavar="KEY", help="workload key (or a unique prefix)")
    s.add_argument("--target", metavar="KEY")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_history)
    s = sub.add_parser("plot", help="draw best latency vs trials of a workload, or of a model's tasks with its "
                                    "estimated latency (needs matplotlib)")
    s.add_argument("key", nargs="?", metavar="KEY", help="workload key (or a unique prefix)")
    s.add_argument("--model", metavar="MODEL", help="every task of this ONNX model, and the model's estimated latency")
    s.add_argument("--dim", action="append", metavar="NAME=LO:HI", help="with --model: a dynamic dim's range")
    s.add_argument("--shape", action="append", metavar="NAME=V1,V2", help="with --model: the tuned dim sizes")
    s.add_argument("--target", metavar="KEY", help="only records of this target")
    s.add_argument("--out", required=True, metavar="FILE.png")
    s.set_defaults(func=cmd_plot)
    s = sub.add_parser("stats", help="counts, statuses, compile time, time range")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_stats)
    s = sub.add_parser("export", help="write every record as JSON lines")
    s.add_argument("file", metavar="FILE")
    s.set_defaults(func=cmd_export)
    s = sub.add_parser("import", help="add the records of a JSON-lines file (validated, all or nothing)")
    s.add_argument("file", metavar="FILE")
    s.set_defaults(func=cmd_import)
    s = sub.add_parser("prune", help="delete all but the best records, or old failures")
    s.add_argument("--keep", metavar="K", type=_positive_int, help="keep the K best ok records per workload/target")
    s.add_argument("--failures-older-than", metavar="DAYS", type=_days, help="delete failures older than DAYS")
    s.set_defaults(func=cmd_prune)
    return p


def _require_existing(url: str) -> None:
    """Reading a SQLite file that is not there is a typo, not a wish for an empty database."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except Exception:
        return  # Database() reports the bad URL
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:" \
            and not u.database.startswith("file:") and not os.path.exists(u.database):
        raise DatabaseError(f"no database file {u.database!r} (give --db URL or set TENSORTUNE_DB)")


def _fail(msg: str) -> int:
    from ir.errors import one_line

    print(f"{PROG}: error: {one_line(msg)}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    from ir.errors import TensortuneError
    from ir.settings import Settings, current, use

    settings, before = None, current()
    try:
        settings = Settings.from_env()   # the one place the environment is read (as run_cli does)
        use(settings)
        a = build_parser().parse_args(argv)
        if a.command == "prune" and a.keep is None and a.failures_older_than is None:
            raise _UsageError("prune: give --keep K and/or --failures-older-than DAYS")
        url = a.db or default_url()
        if a.command != "import":
            _require_existing(url)
        with Database(url) as db:
            a.func(db, a)
        return 0
    except (_UsageError, TensortuneError) as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"{getattr(e, 'filename', '') or ''} {e.strerror or e}".strip())
    except KeyboardInterrupt:
        return _fail("interrupted")
    except Exception as e:  # a bug: still one line, but say so (TENSORTUNE_DEBUG=1 shows the traceback)
        if settings is not None and settings.debug:
            raise
        return _fail(f"internal error: {type(e).__name__}: {e}")
    finally:
        use(before)   # an in-process caller (a test) gets its own settings back


if __name__ == "__main__":
    sys.exit(main())

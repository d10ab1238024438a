"""`tune-db` subcommands: output, --json, and one-line errors with exit code 2."""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest

from database import Database
from database.cli import fmt_gflops, fmt_time, main
try:  # tests/ as a package or as a plain rootdir-inserted folder
    from tests.test_database import GPU, fake_templates, rec, workload  # noqa: F401  (fixture re-used)
except ImportError:
    from test_database import GPU, fake_templates, rec, workload  # noqa: F401


@pytest.fixture
def url(tmp_path):
    """A SQLite database with two workloads, failures and two targets."""
    u = f"sqlite:///{tmp_path / 'cli.db'}"
    old = datetime.now(timezone.utc) - timedelta(days=30)
    with Database(u) as db:
        db.add_many([rec(workload(8), 2e-3, tile=1, compile_s=1.0), rec(workload(8), 1e-3, tile=2, compile_s=2.0),
                     rec(workload(8), 5e-4, tile=4), rec(workload(8), None, tile=8, status="compile_error",
                                                         error="numba: bad\nsecond line", created_at=old),
                     rec(workload(32), 3e-3), rec(workload(32), 2e-6, target=GPU, template="other")])
    return u


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_formatting():
    assert fmt_time(2.5) == "2.5 s" and fmt_time(1.5e-3) == "1.5 ms" and fmt_time(2e-6) == "2 us"
    assert fmt_time(None) == "-"
    assert fmt_gflops(20_000_000_000, 1.0) == "20.0" and fmt_gflops(65_536, 1e-3) == "0.0655" and fmt_gflops(0, 1.0) == "-" and fmt_gflops(10, None) == "-"


def test_best(capsys, url):
    code, out, err = run(capsys, "--db", url, "best")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["workload", "family", "shapes"] and set(lines[1]) <= {"-", " "}
    assert len(lines) == 5                                  # header, rule, 3 (workload, target) pairs
    w8 = next(line for line in lines if line.startswith(workload(8).key))
    assert "500 us" in w8 and "tile=4" in w8
    assert fmt_gflops(workload(8).flops(), 5e-4) in w8.split()   # GFLOP/s from flops / median
    assert "2 us" in out and "gpu-test" in out


def test_best_filters_k_and_json(capsys, url):
    code, out, _ = run(capsys, "--db", url, "best", "--template", "fake_dense", "--target", "cpu-test-2c",
                       "-k", "2", "--json")
    data = json.loads(out)
    assert code == 0 and len(data) == 3
    assert [(d["workload_key"], d["median"]) for d in data] == sorted(
        [(workload(8).key, 5e-4), (workload(8).key, 1e-3), (workload(32).key, 3e-3)])
    assert all(d["config_hash"] and d["id"] for d in data)
    code, out, _ = run(capsys, "--db", url, "best", "--family", "conv2d")
    assert code == 0 and "no successful records" in out


def test_workloads(capsys, url):
    code, out, _ = run(capsys, "--db", url, "workloads")
    assert code == 0
    assert workload(8).key in out and "8x64, 64x32" in out and "32x64, 64x32" in out
    row = next(line for line in out.splitlines() if line.startswith(workload(8).key))
    assert row.split()[1:4] == ["dense", "fake_dense", "1"] and " 4 " in row and "500 us" in row
    code, out, _ = run(capsys, "--db", url, "workloads", "--json", "--family", "dense")
    data = {d["key"]: d for d in json.loads(out)}
    assert data[workload(8).key]["n_records"] == 4 and data[workload(32).key]["best_median"] == 2e-6


def test_history(capsys, url):
    key = workload(8).key
    code, out, _ = run(capsys, "--db", url, "history", key[:6])      # a unique prefix is enough
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"workload {key}: MatMul(8x64, 64x32(const)), 4 records")
    assert "compile_error" in lines[3] and "numba: bad" in lines[3] and "second line" not in out  # oldest first
    assert "500 us" in lines[-1] and "order=ij tile=4" in lines[-1]
    code, out, _ = run(capsys, "--db", url, "history", key, "--json")
    data = json.loads(out)
    assert code == 0 and [d["status"] for d in data][0] == "compile_error" and len(data) == 4
    code, _, err = run(capsys, "--db", url, "history", "zzzz")
    assert code == 2 and err.startswith("tune-db: error: no workload with key 'zzzz'")


def _pairs(out: str) -> dict:
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in out.splitlines())


def test_stats(capsys, url):
    code, out, _ = run(capsys, "--db", url, "stats")
    assert code == 0
    st = _pairs(out)
    assert st["records"] == "6" and st["compile_error"] == "1" and st["ok"] == "5"
    assert st["compile time"] == "3.0 s" and st["database"] == url
    code, out, _ = run(capsys, "--db", url, "stats", "--json")
    st = json.loads(out)
    assert st["records"] == 6 and st["workloads"] == 2 and st["targets"] == 2 and st["by_status"]["ok"] == 5


def test_export_import(capsys, url, tmp_path, fake_templates):
    path = tmp_path / "all.jsonl"
    code, out, _ = run(capsys, "--db", url, "export", str(path))
    assert code == 0 and out.strip() == f"exported 6 records to {path}"
    other = f"sqlite:///{tmp_path / 'other.db'}"
    # "other" template is unknown to the registry: the whole file is refused
    code, out, err = run(capsys, "--db", other, "import", str(path))
    assert code == 2 and out == "" and "all.jsonl:6: bad record: unknown template 'other'" in err
    assert len(err.strip().splitlines()) == 1
    path.write_text("\n".join(line for line in path.read_text().splitlines() if '"other"' not in line) + "\n")
    code, out, _ = run(capsys, "--db", other, "import", str(path))
    assert code == 0 and out.strip() == f"imported 5 records from {path} (0 duplicates skipped)"
    code, out, _ = run(capsys, "--db", other, "import", str(path))
    assert out.strip() == f"imported 0 records from {path} (5 duplicates skipped)"


def test_prune(capsys, url):
    code, _, err = run(capsys, "--db", url, "prune")
    assert code == 2 and "give --keep" in err
    code, out, _ = run(capsys, "--db", url, "prune", "--keep", "1")
    assert code == 0 and out.strip() == "pruned 2 records"
    code, out, _ = run(capsys, "--db", url, "prune", "--failures-older-than", "7")
    assert code == 0 and out.strip() == "pruned 1 records"
    with Database(url) as db:
        assert db.stats()["records"] == 3


@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required: COMMAND"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["best", "-k", "0"], "must be >= 1"),
    (["prune", "--failures-older-than", "soon"], "not a number of days"),
    (["--db", "nosuch://x", "stats"], "cannot open database nosuch://x"),
    (["--db", "postgresql+psycopg://me:hunter2@127.0.0.1:1/db", "stats"], "cannot open database"),
    (["--db", "sqlite:////nonexistent/dir/x.db", "stats"], "no database file"),
    (["import", "/nonexistent/file.jsonl"], "cannot read /nonexistent/file.jsonl"),
])
def test_errors_are_one_line(capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.setenv("TENSORTUNE_DB", f"sqlite:///{tmp_path / 'e.db'}")
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith("tune-db: error: ") and message in err and err.count("\n") == 1
    assert "hunter2" not in err and "Traceback" not in err


def test_not_a_database_file(capsys, tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_text("hello, I am a text file\n" * 200)
    code, _, err = run(capsys, "--db", f"sqlite:///{junk}", "stats")
    assert code == 2 and "file is not a database" in err and err.count("\n") == 1


def test_postgres_backend(capsys, db_url):
    """The CLI is backend-agnostic; one round trip through PostgreSQL (and SQLite) proves the wiring."""
    with Database(db_url) as db:
        db.add_many([rec(median=1e-3), rec(median=2e-3, tile=2)])
    code, out, _ = run(capsys, "--db", db_url, "best", "--json")
    assert code == 0 and [d["median"] for d in json.loads(out)] == [1e-3]
    code, out, _ = run(capsys, "--db", db_url, "stats")
    assert code == 0 and _pairs(out)["records"] == "2"

"""database.Database on SQLite and PostgreSQL (the `db_url` fixture runs each test on both)."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import types
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from database import Database, DatabaseError, Record, default_url
from database.engine import current_revision, head_revision, make_engine, upgrade
from ir.workload import Workload
from schedules.space import Config, ConfigSpace, Knob

try:  # tests/ as a package or as a plain rootdir-inserted folder
    from tests.pg_server import fresh_database
except ImportError:
    from pg_server import fresh_database

CPU = {"key": "cpu-test-2c", "kind": "cpu", "model": "Test CPU", "cores": 2}
GPU = {"key": "gpu-test", "kind": "cuda"}
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def workload(batch: int = 8, n: int = 32, op: str = "MatMul") -> Workload:
    return Workload.from_json({
        "ops": [{"op": op, "in": ["i0", "i1"], "attrs": {}}],
        "inputs": [{"shape": [batch, 64], "sym": ["batch", 64], "dtype": "float32", "const": False},
                   {"shape": [64, n], "sym": [64, n], "dtype": "float32", "const": True}],
        "output_shape": [batch, n], "output_dtype": "float32"})


def rec(w: Workload | None = None, median=1e-3, tile=4, order="ij", status="ok", target=CPU,
        template="fake_dense", created_at=None, **kw) -> Record:
    w = w or workload()
    return Record(workload=w.to_json(), workload_key=w.key, signature=w.signature, family=w.family,
                  template=template, template_version=1, target=dict(target),
                  config={"tile": tile, "order": order}, status=status,
                  latencies=[median] * 3 if median is not None else [], median=median,
                  created_at=created_at, **kw)


class FakeTemplate:
    version = 1

    def space(self, w):
        return ConfigSpace([Knob("tile", (1, 2, 4, 8)), Knob("order", ("ij", "ji"))])


@pytest.fixture
def fake_templates(monkeypatch):
    """Validation on import asks schedules.registry; give it a template with a known space."""
    def get_template(name):
        if name != "fake_dense":
            raise KeyError(f"no template named {name!r}")
        return FakeTemplate()

    try:
        from schedules import registry
        monkeypatch.setattr(registry, "get_template", get_template)
    except ImportError:
        import schedules
        mod = types.ModuleType("schedules.registry")
        mod.get_template = get_template
        monkeypatch.setitem(sys.modules, "schedules.registry", mod)
        monkeypatch.setattr(schedules, "registry", mod, raising=False)


@pytest.fixture
def db(db_url):
    d = Database(db_url)
    yield d
    d.close()


# -- basics -------------------------------------------------------------------------------

def test_add_roundtrip(db):
    r = rec(spread=0.02, compile_s=1.5, strategy="random", error="")
    rid = db.add(r)
    assert rid == r.id and r.created_at is not None
    (got,) = db.records()
    assert got.id == rid and got.workload == workload().to_json() and got.target == CPU
    assert got.config == {"tile": 4, "order": "ij"} and got.latencies == [1e-3] * 3
    assert got.spread == 0.02 and got.compile_s == 1.5 and got.strategy == "random"
    assert got.flops == workload().flops() > 0            # filled in from the workload
    assert got.config_hash == Config(got.config).hash
    assert got.created_at == r.created_at and got.created_at.tzinfo is not None
    assert got.version


def test_default_url(monkeypatch):
    """From the settings (the CLIs read $TENSORTUNE_DB into them), never from the environment itself."""
    from ir.settings import Settings
    monkeypatch.setenv("TENSORTUNE_DB", "sqlite:///env.db")
    assert default_url(Settings()) == "sqlite:///tuning.db"
    assert default_url(Settings(db_url="sqlite:///x.db")) == "sqlite:///x.db"
    assert default_url(Settings.from_env()) == "sqlite:///env.db"


def test_best_orders_dedupes_and_skips_failures(db):
    db.add_many([rec(median=3e-3, tile=1), rec(median=1e-3, tile=2), rec(median=2e-3, tile=4),
                 rec(median=0.5e-3, tile=2),                     # same config again, faster
                 rec(median=None, tile=8, status="compile_error", error="boom"),
                 rec(median=1e-4, tile=8, target=GPU)])
    key = workload().key
    best = db.best(key, "cpu-test-2c", k=3)
    assert [(r.config["tile"], r.median) for r in best] == [(2, 0.5e-3), (4, 2e-3), (1, 3e-3)]
    assert db.best(key)[0].target == GPU                          # no target: across targets
    assert db.best("nope") == []


def test_best_per_workload_filters(db):
    w1, w2 = workload(8), workload(8, op="Gemm")
    db.add_many([rec(w1, 2e-3), rec(w1, 1e-3, tile=2), rec(w2, 5e-3, template="other"),
                 rec(w1, 1e-5, target=GPU)])
    allbest = db.best_per_workload()
    assert len(allbest) == 3
    cpu = db.best_per_workload(target_key="cpu-test-2c")
    assert {(r.workload_key, r.median) for r in cpu} == {(w1.key, 1e-3), (w2.key, 5e-3)}
    assert [r.template for r in db.best_per_workload(template="other")] == ["other"]
    assert db.best_per_workload(family="conv2d") == []


def test_nearest_by_log2_distance(db):
    ws = {b: workload(b) for b in (1, 8, 32)}
    assert len({w.signature for w in ws.values()}) == 1 and len({w.key for w in ws.values()}) == 3
    db.add_many([rec(ws[1], 1e-3), rec(ws[8], 4e-3), rec(ws[32], 3e-3),
                 rec(ws[8], 1e-9, status="wrong_result")])
    sig = ws[1].signature
    assert db.nearest(sig, {"batch": 2}).workload_key == ws[1].key
    assert db.nearest(sig, {"batch": 8}).workload_key == ws[8].key
    assert db.nearest(sig, {"batch": 64}).workload_key == ws[32].key
    assert db.nearest(sig, {"batch": 16}).workload_key == ws[32].key      # tie 8 vs 32: lower median
    assert db.nearest(sig, {"batch": 16}, target_key="gpu-test") is None
    assert db.nearest(sig, {"batch": 16}, template="other") is None
    assert db.nearest("no-such-signature", {"batch": 2}) is None
    assert db.nearest(sig, {"seq": 2}) is None                           # dims it does not have


def test_measured_maps_config_hash(db):
    db.add_many([rec(median=2e-3, tile=1), rec(median=1e-3, tile=1), rec(median=None, tile=2, status="run_timeout"),
                 rec(median=None, tile=4, status="worker_died"), rec(median=5e-4, tile=4)])
    m = db.measured(workload().key, "cpu-test-2c")
    h = {t: Config({"tile": t, "order": "ij"}).hash for t in (1, 2, 4)}
    assert m == {h[1]: 1e-3, h[2]: None, h[4]: 5e-4}
    assert db.measured(workload().key, "gpu-test") == {}


def test_retryable_are_transient_failures_tried_once(db):
    db.add_many([rec(median=None, tile=1, status="worker_died", error="run: worker process died"),
                 rec(median=None, tile=2, status="runtime_error", error="MemoryError: out of memory"),
                 rec(median=None, tile=4, status="run_timeout"), rec(median=None, tile=4, status="run_timeout"),
                 rec(median=None, tile=8, status="compile_error", error="TypingError"),
                 rec(median=None, tile=1, order="ji", status="wrong_result"),
                 rec(median=None, tile=2, order="ji", status="build_timeout"), rec(median=1e-3, tile=2, order="ji")])
    got = db.retryable(workload().key, "cpu-test-2c")
    assert got == {Config({"tile": t, "order": "ij"}).hash: ({"tile": t, "order": "ij"}, 1) for t in (1, 2)}
    assert db.retryable(workload().key, "gpu-test") == {}


def test_records_history_workloads_stats(db):
    w1, w2 = workload(8), workload(32)
    db.add_many([rec(w1, 2e-3, created_at=T0 + timedelta(hours=2), compile_s=1.0),
                 rec(w1, 1e-3, tile=2, created_at=T0, compile_s=2.0),
                 rec(w1, None, tile=8, status="compile_error", created_at=T0 + timedelta(hours=1)),
                 rec(w2, 3e-3, created_at=T0 + timedelta(hours=3))])
    assert len(db.records()) == 4 and len(db.records(limit=2)) == 2
    assert len(db.records(workload_key=w1.key, status="ok")) == 2
    assert db.records(template="nope") == [] and db.records(target_key="gpu-test") == []
    assert [r.created_at for r in db.history(w1.key)] == [T0, T0 + timedelta(hours=1), T0 + timedelta(hours=2)]
    wl = {d["key"]: d for d in db.workloads()}
    assert wl[w1.key]["n_records"] == 3 and wl[w1.key]["best_median"] == 1e-3
    assert wl[w1.key]["shapes"] == [[8, 64], [64, 32]] and wl[w1.key]["family"] == "dense"
    assert wl[w1.key]["version"] == 1 and wl[w1.key]["flops"] == w1.flops()
    assert db.workloads(family="conv2d") == [] and len(db.workloads(template="fake_dense")) == 2
    st = db.stats()
    assert st["workloads"] == 2 and st["targets"] == 1 and st["records"] == 4
    assert st["by_status"] == {"compile_error": 1, "ok": 3} and st["compile_s"] == 3.0
    assert st["first"] == T0.isoformat() and st["last"] == (T0 + timedelta(hours=3)).isoformat()


def test_add_rejects_bad_records(db):
    with pytest.raises(DatabaseError, match="status"):
        db.add(rec(status="fine"))
    with pytest.raises(DatabaseError, match="no median"):
        db.add(rec(median=None))
    assert db.records() == []


# -- import / export ----------------------------------------------------------------------

def test_export_import_roundtrip(db, tmp_path, fake_templates):
    db.add_many([rec(median=1e-3, spread=0.1), rec(median=None, tile=8, status="compile_error", error="x\ny"),
                 rec(workload(32), 2e-3, target=GPU)])
    path = tmp_path / "out.jsonl"
    assert db.export_jsonl(path) == 3
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["workload_key"] for line in lines)
    other = Database(f"sqlite:///{tmp_path / 'other.db'}")
    assert other.import_jsonl(path) == (3, 0)
    assert other.import_jsonl(path) == (0, 3)                             # duplicates skipped
    strip = lambda rs: sorted((json.dumps({**r.to_json(), "version": ""}, sort_keys=True) for r in rs))
    assert strip(other.records()) == strip(db.records())
    other.close()
    assert db.import_jsonl(path) == (0, 3)


def _good_line(**changes) -> str:
    d = rec(created_at=T0).to_json()
    d.update(changes)
    return json.dumps(d)


BAD_LINES = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    (_good_line(evil="__import__('os').system('x')"), "unknown field"),
    (_good_line(median=float("nan")).replace("NaN", "NaN"), "NaN"),
    (_good_line(status="great"), "status"),
    (_good_line(latencies="fast"), "latencies"),
    (_good_line(template_version="1"), "template_version"),
    (_good_line(config={"tile": 3, "order": "ij"}), "config does not fit"),
    (_good_line(config={"tile": 4, "order": "ij", "x": 1}), "config does not fit"),
    (_good_line(template="nope"), "unknown template"),
    (_good_line(workload_key="0" * 20), "does not match"),
    (_good_line(created_at="yesterday"), "created_at"),
    (_good_line(target={"kind": "cpu"}), "target.key"),
]


@pytest.mark.parametrize("line, problem", BAD_LINES, ids=[p for _, p in BAD_LINES])
def test_import_rejects_bad_line(tmp_path, fake_templates, line, problem):
    """Validation happens before any write, so SQLite alone covers every case."""
    db = Database(f"sqlite:///{tmp_path / 'v.db'}")
    _import_bad(db, tmp_path, line, problem)
    db.close()


def test_import_is_all_or_nothing(db, tmp_path, fake_templates):
    _import_bad(db, tmp_path, *BAD_LINES[7])
    path = tmp_path / "dup.jsonl"                                         # a duplicate is skipped, not fatal
    path.write_text(_good_line() + "\n" + _good_line() + "\n")
    assert db.import_jsonl(path) == (1, 1)


def _import_bad(db, tmp_path, line, problem):
    path = tmp_path / "in.jsonl"
    path.write_text(_good_line() + "\n\n" + line + "\n" + _good_line(created_at=None) + "\n")
    with pytest.raises(DatabaseError, match=rf"in\.jsonl:3: bad record: .*{problem}"):
        db.import_jsonl(path)
    assert db.records() == []


def test_import_missing_file(db, tmp_path):
    with pytest.raises(DatabaseError, match="cannot read"):
        db.import_jsonl(tmp_path / "missing.jsonl")


# -- maintenance --------------------------------------------------------------------------

def test_prune(db):
    old = datetime.now(timezone.utc) - timedelta(days=30)
    w2 = workload(32)
    db.add_many([rec(median=m, tile=t) for m, t in ((1e-3, 1), (2e-3, 2), (3e-3, 4), (4e-3, 8))]
                + [rec(median=None, status="compile_error", created_at=old),
                   rec(median=None, status="runtime_error"),
                   rec(w2, None, status="run_timeout", created_at=old)])
    assert db.prune(keep_top_k=2) == 2
    assert sorted(r.median for r in db.records(status="ok")) == [1e-3, 2e-3]
    assert db.prune(failures_older_than_days=7) == 2
    assert [r.status for r in db.records(status=None) if r.status != "ok"] == ["runtime_error"]
    assert [w["key"] for w in db.workloads()] == [workload().key]         # orphan workload removed
    db.add(rec(w2, 1e-3))                                                # caches were reset
    assert db.best(w2.key)[0].median == 1e-3


# -- schema and migrations ----------------------------------------------------------------

def test_v1_database_upgraded_with_data_kept(db_url):
    read, write = make_engine(db_url)
    upgrade(read, write, "0001")
    with write.begin() as c:
        assert current_revision(c) == "0001"
        assert "spread" not in {col["name"] for col in sa.inspect(c).get_columns("records")}
        c.execute(sa.text("INSERT INTO targets (key, kind, description) VALUES ('cpu-old', 'cpu', :d)"),
                  {"d": json.dumps({"key": "cpu-old", "kind": "cpu"})})
        w = workload()
        c.execute(sa.text("INSERT INTO workloads (key, signature, family, template, template_version, json, "
                          "shapes, dims, dtype, flops) VALUES (:k, :s, 'dense', 'fake_dense', 1, :j, '[]', "
                          ":dims, 'float32', 100)"),
                  {"k": w.key, "s": w.signature, "j": json.dumps(w.to_json()), "dims": json.dumps(w.dims)})
        c.execute(sa.text("INSERT INTO records (workload_id, target_id, template, template_version, config, "
                          "config_hash, latencies, median, status, error, strategy, created_at, version) "
                          "VALUES ((SELECT id FROM workloads), (SELECT id FROM targets), 'fake_dense', 1, '{\"tile\": 2}', 'h', '[0.001]', 0.001, 'ok', '', "
                          "'grid', :t, '0.0.1')"), {"t": T0.replace(tzinfo=None)})
    read.dispose(), write.dispose()
    db = Database(db_url)
    try:
        (r,) = db.records()
        assert r.median == 0.001 and r.spread is None and r.config == {"tile": 2} and r.version == "0.0.1"
        assert r.created_at == T0 and r.target["key"] == "cpu-old"
        db.add(rec(spread=0.5))
        assert db.best(workload().key, "cpu-test-2c")[0].spread == 0.5
        with db._read.connect() as c:
            assert current_revision(c) == head_revision() == "0003"
    finally:
        db.close()


def test_v2_database_gains_claims_with_records_kept(db_url):
    from alembic import command

    from database.engine import alembic_config
    d = Database(db_url)
    d.add(rec())
    d.close()
    read, write = make_engine(db_url)
    with write.begin() as c:                 # back to v2, records in it
        command.downgrade(alembic_config(c), "0002")
    with write.begin() as c:
        assert current_revision(c) == "0002" and "claims" not in sa.inspect(c).get_table_names()
    read.dispose(), write.dispose()
    db = Database(db_url)
    try:
        (r,) = db.records()
        assert r.median == 1e-3
        with db._read.connect() as c:
            assert current_revision(c) == "0003" and "claims" in sa.inspect(c).get_table_names()
        assert db.claim(r.workload_key, r.target_key, ["x"], "me", 60) == ["x"]
    finally:
        db.close()


def test_models_match_migrations(db):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from database.models import Base

    with db._read.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c, opts={"compare_type": True}), Base.metadata)
    assert diff == []


def test_reopen_is_idempotent(db_url):
    Database(db_url).close()
    d = Database(db_url)
    d.add(rec())
    d.close()
    assert len(Database(db_url).records()) == 1


# -- errors -------------------------------------------------------------------------------

def test_bad_urls_give_one_line_errors(tmp_path):
    with pytest.raises(DatabaseError, match="cannot open database nosuchdialect://x") as e:
        Database("nosuchdialect://x")
    with pytest.raises(DatabaseError, match="cannot open database") as e:
        Database("postgresql+psycopg://tuner:s3cret@127.0.0.1:1/tt")
    msg = str(e.value)
    assert "s3cret" not in msg and "***" in msg and "\n" not in msg
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database, just some text" * 100)
    with pytest.raises(DatabaseError, match=r"junk\.db.*not a database"):
        Database(f"sqlite:///{junk}")
    with pytest.raises(DatabaseError, match="database URL 'not a url at all' is malformed"):
        Database("not a url at all")


# -- concurrency and durability -----------------------------------------------------------

def _writer(urls: list[str], n: int, proc: int) -> None:
    """Add records one by one, then die without closing: every committed record must survive."""
    dbs = [Database(u) for u in urls]
    for i in range(n):
        for d in dbs:
            d.add(rec(median=1e-3 + i * 1e-6, tile=(1, 2, 4, 8)[i % 4], strategy=f"p{proc}"))
    os._exit(0)


@contextmanager
def _nothing():
    yield None


def test_two_processes_write_one_database(tmp_path, request):
    """Two spawned tuners x 200 commits into one SQLite file (and one PostgreSQL database): all 400 land.

    One test covers both backends, so the costly process start-up is paid once.
    """
    urls = [f"sqlite:///{tmp_path / 'shared.db'}"]
    try:
        pg = request.getfixturevalue("pg_url")
    except pytest.skip.Exception:
        pg = None
    with (fresh_database(pg) if pg else _nothing()) as pg_db:
        urls += [pg_db] if pg_db else []
        for url in urls:
            Database(url).close()                             # schema first, as a tuner would
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_writer, args=(urls, 200, p)) for p in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0, 0]
        for url in urls:
            d = Database(url)
            try:
                recs = d.records()
                assert len(recs) == 400, url
                assert {r.strategy for r in recs} == {"p0", "p1"}
                assert d.stats()["workloads"] == 1 and d.stats()["targets"] == 1
            finally:
                d.close()

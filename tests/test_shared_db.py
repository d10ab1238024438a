"""A shared database under load: three batch jobs of the same two models run at once
against one database (PostgreSQL, and SQLite in WAL mode) lose no record, measure no
config twice and split the work; a tuner started after them gets their results as
transfer data (it skips the configs they measured, its cost model gets their records of
the other shapes as prior rows). Measurements are replayed, so the load is the
database's, not the CPU's."""
from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

from database import Database
from tuner.callbacks import MeasureCallback
from tuner.measure import ReplayRunner
from tuner.tune import TuneOptions, tune_tasks

try:  # tests/ as a package or as a plain rootdir-inserted folder
    from tests.pg_server import fresh_database
    from tests.simulated import TARGET, replay
    from tests.test_batch import two_models
except ImportError:
    from pg_server import fresh_database
    from simulated import TARGET, replay
    from test_batch import two_models

TUNERS, TRIALS, BATCH = 3, 16, 4     # shares: 8 configs for each of the 3 distinct tasks


class SlowReplay(ReplayRunner):
    """Replay that takes a little time per candidate, so the tuners overlap."""

    def stream(self, inputs, builds):
        for r in self.run(inputs, builds):
            time.sleep(0.01)
            yield r


def _batch_job(urls: list[str], outs: list[str], barrier) -> None:
    """The same batch on each database in turn, starting together with the other jobs;
    what it measured goes to `outs` (to check against the database)."""
    from tuner.batch import tune_batch
    for url, out in zip(urls, outs):
        jobs, builder, runner = two_models()
        db = Database(url)
        barrier.wait(120)
        seen = _Seen()
        rep = tune_batch(jobs, db, TuneOptions(trials=TRIALS, batch_size=BATCH, strategy="random", progress=False),
                         target=TARGET, builder=builder, runner=SlowReplay(list(runner.tables.values())),
                         callbacks=[seen])
        db.close()
        Path(out).write_text(json.dumps({"measured": rep.measured, "configs": seen.configs}))


class _Seen(MeasureCallback):
    """(workload, config hash) of every result this tuner stored."""

    def __init__(self):
        self.configs = []

    def on_result(self, ctx, i, result):
        self.configs.append([result.input.workload.key, result.input.config.hash])


class _Strategies(MeasureCallback):
    """Keeps the late tuner's strategies as they start: what they were told of the database."""

    def on_start(self, ctx):
        self.measured = [set(s.measured) for s in ctx.strategies]
        self.prior = [list(getattr(s, "prior", ())) for s in ctx.strategies]


@contextmanager
def _databases(tmp_path, request):
    urls = [f"sqlite:///{tmp_path / 'shared.db'}"]
    try:
        pg = request.getfixturevalue("pg_url")
    except pytest.skip.Exception:
        pg = None
    if pg is None:
        yield urls
        return
    with fresh_database(pg) as url:
        yield urls + [url]


def test_concurrent_batch_jobs_share_one_database(tmp_path, request):
    with _databases(tmp_path, request) as urls:
        for url in urls:
            Database(url).close()                        # schema first, as a tuner would
        import sqlite3
        with sqlite3.connect(tmp_path / "shared.db") as c:
            assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(TUNERS)
        outs = [[str(tmp_path / f"{k}-{p}.json") for k in range(len(urls))] for p in range(TUNERS)]
        procs = [ctx.Process(target=_batch_job, args=(urls, outs[p], barrier)) for p in range(TUNERS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(240)
        assert [p.exitcode for p in procs] == [0] * TUNERS
        for k, url in enumerate(urls):
            with Database(url) as db:
                recs = db.records()
                done = [json.loads(Path(outs[p][k]).read_text()) for p in range(TUNERS)]
                # nothing lost: every result a tuner stored is there, and nothing else
                stored = Counter((r.workload_key, r.config_hash) for r in recs)
                told = Counter(tuple(c) for d in done for c in d["configs"])
                assert stored == told and sum(d["measured"] for d in done) == len(recs), url
                # no config measured twice, per (workload, target, config)
                assert max(Counter((r.workload_key, r.target_key, r.config_hash) for r in recs).values()) == 1, url
                # the jobs split the work: each task got its share, plus at most the batches
                # other jobs had in flight when it filled up
                per_workload = Counter(r.workload_key for r in recs)
                assert len(per_workload) == 3, url
                assert all(8 <= n <= 8 + (TUNERS - 1) * BATCH for n in per_workload.values()), (url, per_workload)
                assert sum(1 for d in done if d["measured"]) >= 2, f"{url}: one job did all the work"
                assert db.claims() == []
                _late_tuner_learns_from_the_others(db, recs)


def _late_tuner_learns_from_the_others(db, recs) -> None:
    """A tuner started after the others: xgb on the shared task (needs xgboost)."""
    tasks, builder, runner = replay(("128x256x1024",))
    key = tasks[0].workload.key
    before = {r.config_hash for r in recs if r.workload_key == key}
    others = [r for r in recs if r.workload_key != key]
    seen = _Strategies()
    tune_tasks(tasks, db, TuneOptions(trials=8, batch_size=4, strategy="xgb", progress=False), TARGET, builder,
               runner, callbacks=[seen])
    assert before <= seen.measured[0]                  # the configs they measured: known, not proposed
    assert len(seen.prior[0]) == len(others) > 0        # their records of the other shapes: prior rows
    after = db.records(workload_key=key)
    assert len(after) == len(before) + 8
    assert len({r.config_hash for r in after}) == len(after)

"""Nothing measured is lost: results committed one by one (SIGKILL, Ctrl-C, SIGTERM of a
real `tune` mid-batch), concurrent tuners never measure a config twice (SQLite and
PostgreSQL), transient failures retried once, a worker that writes to fd 1 or outlives
its parent, read-only databases, a run in which every candidate fails."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

from database import Database, DatabaseError
from ir import import_onnx, make_workload, partition, simplify
from schedules import get_template
from tuner.measure import MeasureResult, ReplayRunner
from tuner.measure.worker import Worker
from tuner.tune import TuneOptions, owner_alive, tune_tasks, unusable_warnings

try:  # tests/ as a package or as a plain rootdir-inserted folder
    from tests import durability_jobs
    from tests.pg_server import fresh_database
    from tests.simulated import TARGET, replay
except ImportError:
    import durability_jobs
    from pg_server import fresh_database
    from simulated import TARGET, replay

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "experiments" / "models" / "mlp.onnx"
SHAPE = "128x256x1024"


def opts(**kw):
    return TuneOptions(**{"trials": 32, "progress": False, **kw})


@pytest.fixture(scope="module")
def mlp_workload():
    g = simplify(import_onnx(MLP))
    return make_workload(g, partition(g)[0], {"batch": 8})


# -- results stream into the database one by one ------------------------------------------

class StopsMidBatch(ReplayRunner):
    """Replays, and raises KeyboardInterrupt (Ctrl-C) after `after` results of batch `batch`."""

    def __init__(self, tables, batch: int, after: int):
        super().__init__(tables)
        self.batches, self.batch, self.after = 0, batch, after

    def stream(self, inputs, builds):
        self.batches += 1
        for k, r in enumerate(self.run(inputs, builds)):
            if self.batches == self.batch and k == self.after:
                raise KeyboardInterrupt
            yield r


def test_interrupt_mid_batch_keeps_the_finished_candidates_of_that_batch():
    tasks, b, r = replay([SHAPE])
    r = StopsMidBatch(list(r.tables.values()), batch=2, after=3)
    db = Database("sqlite:///:memory:")
    with pytest.raises(KeyboardInterrupt):
        tune_tasks(tasks, db, opts(strategy="random", batch_size=8), TARGET, b, r)
    assert len(db.records()) == 8 + 3
    assert db.claims() == []   # the 5 claimed but unmeasured configs are free again


BATCH = 8   # one batch; each candidate is timed for >= 0.5 s, so a kill lands mid-batch


class SignalsMidBatch(ReplayRunner):
    """Replays; sends `sig` to this process after the 3rd result of the 2nd batch."""

    def __init__(self, tables, sig):
        super().__init__(tables)
        self.batches, self.sig = 0, sig

    def stream(self, inputs, builds):
        self.batches += 1
        for k, r in enumerate(self.run(inputs, builds)):
            if self.batches == 2 and k == 3:
                os.kill(os.getpid(), self.sig)
            yield r


def test_sigterm_stops_the_run_like_ctrl_c_and_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    tasks, b, r = replay([SHAPE])
    db = Database("sqlite:///:memory:")
    with pytest.raises(KeyboardInterrupt):
        tune_tasks(tasks, db, opts(strategy="random", batch_size=8), TARGET, b,
                   SignalsMidBatch(list(r.tables.values()), signal.SIGTERM))
    assert len(db.records()) == 8 + 3 and db.claims() == []
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_during_a_commit_waits_for_it(monkeypatch):
    """Ctrl-C that lands inside the database write: the record is stored, then the run stops."""
    tasks, b, r = replay([SHAPE])
    db = Database("sqlite:///:memory:")
    real, calls = db.add_many, []

    def add_many(recs, owner=None):
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)     # the handler runs here, inside the commit
        return real(recs, owner=owner)

    monkeypatch.setattr(db, "add_many", add_many)
    with pytest.raises(KeyboardInterrupt):
        tune_tasks(tasks, db, opts(strategy="random", batch_size=8), TARGET, b, r)
    assert len(db.records()) == 5


def _tune_cmd(url: str, log: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", "--model", str(MLP), "--db", url, "--trials", str(BATCH),
            "--batch-size", str(BATCH), "--strategy", "random", "--repeat", "5", "--min-repeat-ms", "100",
            "--measure-runs", "0", "--no-progress", "--log-file", str(log), *extra]


def _count(db_path: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5) as c:
            return c.execute("SELECT count(*) FROM records").fetchone()[0]
    except sqlite3.Error:
        return 0


@contextmanager
def _tuner_stopped_mid_batch(tmp_path):
    """A real `tune` of one batch, running until 2 results are stored."""
    db_path, log = tmp_path / "t.db", tmp_path / "log.jsonl"
    proc = subprocess.Popen(_tune_cmd(f"sqlite:///{db_path}", log), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 300
        while _count(db_path) < 2:
            assert proc.poll() is None, f"tuner exited early: {proc.communicate()[1][-2000:]}"
            assert time.time() < deadline, "tuner stored no 2 results in time"
            time.sleep(0.1)
        yield proc, db_path, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _logged(log: Path) -> list[str]:
    """Config hashes of the measure events (each written right after its commit)."""
    from schedules.space import Config
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert not any(e["event"] == "round" for e in events), "the batch finished before the kill"
    return [Config(e["config"]).hash for e in events if e["event"] == "measure"]


def _alive_in_session(sid: int) -> list[int]:
    """Processes (not zombies) of session `sid`: the tuner and its workers."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                out.append(int(d.name))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_mid_batch_keeps_every_stored_result(tmp_path):
    with _tuner_stopped_mid_batch(tmp_path) as (proc, db_path, log):
        assert len(_alive_in_session(proc.pid)) >= 3      # the tuner, its build workers, its run worker
        os.kill(proc.pid, signal.SIGKILL)                 # the tuner only: its workers must follow it
        proc.wait(30)
        t0 = time.time()
        while _alive_in_session(proc.pid) and time.time() - t0 < 5:
            time.sleep(0.05)
        assert _alive_in_session(proc.pid) == [], "workers outlived the killed tuner"
    db = Database(f"sqlite:///{db_path}")
    recs = db.records()
    stored = Counter(r.config_hash for r in recs)
    logged = Counter(_logged(log))
    # every measurement the tuner finished (logged after its commit) is there; a kill between a
    # commit and its log line leaves at most one more
    assert 2 <= len(recs) < BATCH and not logged - stored and len(recs) - sum(logged.values()) <= 1
    # the killed tuner's claims on the rest of its batch are stale: another tuner gets them at once
    left = [c["config_hash"] for c in db.claims()]
    assert len(left) == BATCH - len(recs) and not set(left) & set(stored)
    wl, tk = recs[0].workload_key, recs[0].target_key
    assert db.claim(wl, tk, left, "someone-else", 60, alive=owner_alive) == left
    db.close()


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGINT, marks=pytest.mark.slow),
                                 pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_mid_batch_stores_exactly_the_finished_results(tmp_path, sig):
    with _tuner_stopped_mid_batch(tmp_path) as (proc, db_path, log):
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)        # Ctrl-C reaches the workers too: they must ignore it
        else:
            os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted; every finished measurement is in the database" in err
    db = Database(f"sqlite:///{db_path}")
    recs = db.records()
    assert 2 <= len(recs) < BATCH
    assert Counter(r.config_hash for r in recs) == Counter(_logged(log))
    assert not any("KeyboardInterrupt" in r.error for r in recs)
    assert db.claims() == []
    db.close()


# -- concurrent tuners claim configs --------------------------------------------------------

class SlowReplay(ReplayRunner):
    """Replay that takes a little time per candidate, so two tuners overlap."""

    def stream(self, inputs, builds):
        for r in self.run(inputs, builds):
            time.sleep(0.01)
            yield r


def _concurrent_tuner(urls: list[str], logs: list[str], barrier) -> None:
    """Tune on each database in turn, starting together with the other tuner process."""
    tasks, b, r = replay([SHAPE])
    for url, log in zip(urls, logs):
        db = Database(url)
        barrier.wait(120)
        tune_tasks(tasks, db, opts(strategy="random", trials=40, batch_size=8, log_file=log), TARGET, b,
                   SlowReplay(list(r.tables.values())))
        db.close()


def test_two_concurrent_tuners_never_measure_a_config_twice(tmp_path, request):
    """Same strategy, same seed: without claims they would measure the same 40 configs.
    One pair of processes covers both backends, so the costly start-up is paid once."""
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
        barrier = ctx.Barrier(2)
        logs = [[str(tmp_path / f"{k}-{p}.jsonl") for k in range(len(urls))] for p in range(2)]
        procs = [ctx.Process(target=_concurrent_tuner, args=(urls, logs[p], barrier)) for p in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(240)
        assert [p.exitcode for p in procs] == [0, 0]
        for k, url in enumerate(urls):
            db = Database(url)
            try:
                hashes = [r.config_hash for r in db.records()]
                assert len(hashes) == 80 and len(set(hashes)) == 80, url
                per_tuner = [sum(1 for line in Path(logs[p][k]).read_text().splitlines()
                                 if json.loads(line)["event"] == "measure") for p in range(2)]
                assert per_tuner == [40, 40], url
                assert db.claims() == []
            finally:
                db.close()


@contextmanager
def _nothing():
    yield None


def test_claims_expire_and_dead_owners_lose_them(db_url):
    db = Database(db_url)
    try:
        assert db.claim("w", "t", ["a", "b"], "tuner-1", ttl_s=60) == ["a", "b"]
        assert db.claim("w", "t", ["b", "c"], "tuner-2", ttl_s=60) == ["c"]
        assert db.claim("w", "t", ["a"], "tuner-2", ttl_s=60, alive=lambda o: True) == []
        assert db.claim("w", "t", ["a"], "tuner-2", ttl_s=60, alive=lambda o: o != "tuner-1") == ["a"]
        assert db.claim("w", "t", ["d"], "tuner-1", ttl_s=-1) == ["d"]          # expired at once
        assert db.claim("w", "t", ["d"], "tuner-2", ttl_s=60) == ["d"]
        assert db.claim("w", "other-target", ["a"], "tuner-1", ttl_s=60) == ["a"]
        assert db.release("tuner-2") == 3 and [c["config_hash"] for c in db.claims()] == ["a"]
    finally:
        db.close()


def test_claim_refuses_a_config_measured_meanwhile(db_url):
    try:
        from tests.test_database import rec
    except ImportError:
        from test_database import rec
    db = Database(db_url)
    try:
        r = rec()
        h, wk, tk = r.config_hash, r.workload_key, r.target_key
        assert db.claim(wk, tk, [h], "tuner-1", 60, known={h: 0}) == [h]
        db.add_many([r], owner="tuner-1")                  # the record and the end of the claim: one commit
        assert db.claims() == []
        assert db.claim(wk, tk, [h], "tuner-2", 60, known={h: 0}) == []   # it knew of no record: stale
        assert db.claim(wk, tk, [h], "tuner-2", 60, known={h: 1}) == [h]  # a retry that knew of it
        assert db.claim(wk, tk, [h], "tuner-3", 60) == []                 # held by tuner-2
    finally:
        db.close()


def test_owner_alive():
    import socket
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    assert owner_alive(f"{host}:{os.getpid()}:x")
    assert not owner_alive(f"{host}:{dead.pid}:x")
    assert owner_alive(f"another-host-{host}:{dead.pid}:x")   # nothing known about other hosts


# -- transient failures are retried once -----------------------------------------------------

class FailsFirst(ReplayRunner):
    """Replays; the first few candidates of the first run fail with the given (status, error)s."""

    def __init__(self, tables, failures):
        super().__init__(tables)
        self.failures = list(failures)

    def run(self, inputs, builds):
        out = super().run(inputs, builds)
        for k, r in enumerate(out):
            if self.failures:
                status, err = self.failures.pop(0)
                out[k] = MeasureResult(r.input, status, error=err)
        return out


FAILURES = [("worker_died", "run: worker process died (exit code -9)"), ("run_timeout", "run: no answer within 30 s"),
            ("runtime_error", "MemoryError: cannot allocate"), ("build_timeout", "build: no answer within 120 s"),
            ("compile_error", "TypingError: bad"), ("wrong_result", "max abs error 3 vs NumPy reference"),
            ("runtime_error", "ZeroDivisionError: x")]


def test_transient_failures_are_retried_once_on_resume_and_others_never():
    db = Database("sqlite:///:memory:")
    tasks, b, r = replay([SHAPE])
    tune_tasks(tasks, db, opts(strategy="random", trials=8, batch_size=8), TARGET, b,
               FailsFirst(list(r.tables.values()), FAILURES))
    first = {x.config_hash: x.status for x in db.records()}
    transient = [h for h, (s, e) in zip(first, FAILURES) if s.endswith(("died", "timeout")) or "Memory" in e]
    assert len(transient) == 4
    for _ in range(2):   # the first resume retries each once (failing again); the next one new configs only
        tasks, b, r = replay([SHAPE])
        tune_tasks(tasks, db, opts(strategy="random", trials=4, batch_size=8), TARGET, b,
                   FailsFirst(list(r.tables.values()), FAILURES[:4]))
    counts = Counter(x.config_hash for x in db.records())
    assert {h for h, n in counts.items() if n > 1} == set(transient) and max(counts.values()) == 2
    assert len(counts) == 8 + 4


# -- the worker protocol --------------------------------------------------------------------

def test_a_kernel_that_writes_to_fd_1_still_gets_a_result(mlp_workload):
    from codegen import compile_kernel
    dense = get_template("dense")
    req = {"kernel": compile_kernel(dense, mlp_workload, dense.default_config(mlp_workload)), "repeat": 2,
           "min_repeat_ms": 1}
    w = Worker({"NUMBA_NUM_THREADS": "1"})
    try:
        status, reply = w.call(durability_jobs.noisy_run, req, 300)[:2]
        assert status == "ok" and len(reply["latencies"]) == 2 and "wrong" not in reply
        status, reply = w.call(durability_jobs.noisy_run, req, 300)[:2]    # the same worker, again
        assert status == "ok" and len(reply["latencies"]) == 2
    finally:
        w.close()


def test_killing_a_worker_from_another_thread_ends_its_call_at_once(tmp_path):
    """What an interrupted build does: the main thread closes the builder while a builder
    thread waits on a hung job; the thread must see the death at once, not at its timeout."""
    import threading
    w, marker, out = Worker(), tmp_path / "started", {}

    def call():
        try:
            w.call(durability_jobs.hang, {"marker": str(marker), "how": "sleep"}, 600)
        except Exception as e:
            out["error"] = e

    t = threading.Thread(target=call)
    t.start()
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    t0 = time.time()
    w.kill()
    t.join(10)
    assert not t.is_alive() and time.time() - t0 < 10 and "died" in str(out.get("error"))
    assert w.proc is None and w._from_child == -1          # the calling thread cleaned up
    w.close()


_PARENT = """
import sys
from tests import durability_jobs
from tuner.measure.worker import Worker
w = Worker()
w.call(durability_jobs.hang, {"marker": sys.argv[1], "how": sys.argv[2]}, 10**6)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")   # a zombie waits for a reaper only: it runs nothing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", [pytest.param("sleep", marks=pytest.mark.slow), "gil"])
def test_a_hung_worker_dies_with_its_killed_parent(tmp_path, how):
    marker = tmp_path / "started"
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(marker), how], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    try:
        deadline = time.time() + 120
        while not marker.exists() or not marker.read_text():
            assert parent.poll() is None and time.time() < deadline, "the worker never started its job"
            time.sleep(0.1)
        worker = int(marker.read_text())
        time.sleep(0.5)
        assert not _gone(worker)
        parent.kill()                           # SIGKILL: no cleanup code of the parent runs
        parent.wait()
        t0 = time.time()
        while not _gone(worker) and time.time() - t0 < 5:
            time.sleep(0.05)
        assert _gone(worker), f"worker {worker} outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        if marker.exists() and marker.read_text() and not _gone(int(marker.read_text())):
            os.kill(int(marker.read_text()), signal.SIGKILL)


# -- read-only databases --------------------------------------------------------------------

def _stored_db(tmp_path) -> tuple[Path, Database]:
    try:
        from tests.test_database import rec
    except ImportError:
        from test_database import rec
    path = tmp_path / "ro.db"
    db = Database(f"sqlite:///{path}")
    db.add(rec())
    return path, db


def test_a_read_only_url_reads_and_refuses_writes_before_measuring(tmp_path):
    path, db = _stored_db(tmp_path)
    db.close()
    ro = Database(f"sqlite:///file:{path}?mode=ro&uri=true")
    assert ro.readonly and ro.stats()["records"] == 1 and len(ro.records()) == 1
    assert ro.best(ro.records()[0].workload_key)
    with pytest.raises(DatabaseError, match="read-only: cannot write to it"):
        ro.add(ro.records()[0])
    tasks, b, r = replay([SHAPE])
    with pytest.raises(DatabaseError, match=r"is read-only: cannot store measurements$"):
        tune_tasks(tasks, ro, opts(), TARGET, b, r)
    assert r.calls == 0 and ro.stats()["records"] == 1
    ro.close()


_KILLED_WRITER = """
import os, sys
from database import Database
from tests.test_database import rec
Database("sqlite:///" + sys.argv[1]).add(rec(tile=8))
os._exit(0)
"""


def _without_write_access(cmd: list[str]) -> list[str]:
    """Run cmd unable to write a file whose mode says so (root bypasses modes: drop the capabilities)."""
    if os.geteuid() != 0:
        return cmd
    capsh = shutil.which("capsh")
    if capsh is None:
        pytest.skip("running as root without capsh: cannot take write access away")
    return [capsh, "--drop=cap_dac_override,cap_dac_read_search,cap_fowner", "--", "-c", shlex.join(cmd)]


@pytest.mark.slow   # the CLIs in subprocesses (~40 s); the in-process read-only test above stays in the default run
def test_a_read_only_file_can_be_read_by_every_cli_and_tune_refuses_it_at_once(tmp_path):
    path, db = _stored_db(tmp_path)
    wl = db.records()[0].workload_key
    db.close()
    url = f"sqlite:///{path}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], check=True, env=env, cwd=ROOT, timeout=120)
    assert (tmp_path / "ro.db-wal").exists()       # as a killed tuner leaves it
    for p in tmp_path.glob("ro.db*"):
        p.chmod(0o444)
    run = lambda *a: subprocess.run(_without_write_access([sys.executable, "-m", *a]), capture_output=True,
                                    text=True, env=env, cwd=ROOT, timeout=300)
    r = run("database.cli", "--db", url, "stats")      # WAL mode, with a killed writer's -wal and -shm
    assert r.returncode == 0 and "records       2" in r.stdout, r.stderr
    path.chmod(0o644)
    with sqlite3.connect(path) as c:                   # a rollback-journal file (as copies and other tools
        c.execute("PRAGMA journal_mode=DELETE")        # make): switching it to WAL would be a write
    path.chmod(0o444)
    r = run("database.cli", "--db", url, "best")
    assert r.returncode == 0 and wl[:12] in r.stdout, r.stderr
    r = run("runtime.cli", "--model", str(MLP), "--db", url, "--shape", "batch=2")
    assert r.returncode == 0, r.stderr
    t0 = time.time()
    r = run("tuner.cli", "--model", str(MLP), "--db", url, "--trials", "4", "--no-progress")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and "is read-only: cannot store measurements" in err[0], r.stderr
    assert time.time() - t0 < 60
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
        assert c.execute("SELECT count(*) FROM records").fetchone() == (2,)


# -- a run in which every candidate fails ---------------------------------------------------

class AllFail(ReplayRunner):
    def run(self, inputs, builds):
        return [MeasureResult(r.input, "compile_error", error="TypingError: nope") for r in super().run(inputs, builds)]


def test_every_candidate_failing_is_a_warning_naming_the_failures():
    tasks, b, r = replay([SHAPE])
    reps = tune_tasks(tasks, Database("sqlite:///:memory:"), opts(trials=8), TARGET, b,
                      AllFail(list(r.tables.values())))
    [line] = unusable_warnings(reps)
    assert "no candidate gave a usable result" in line and "8 compile_error" in line and SHAPE in line


def test_tune_exits_nonzero_when_nothing_usable_was_found(tmp_path):
    """Every build overruns its timeout: a real run of the CLI that finds nothing usable."""
    url = f"sqlite:///{tmp_path / 'fail.db'}"
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "--model", str(MLP), "--db", url, "--trials", "3",
                        "--build-timeout", "0.001", "--measure-runs", "0", "--no-progress"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 1, r.stderr
    assert "tune: warning: task" in r.stderr and "build_timeout" in r.stderr
    assert "every candidate failed: nothing usable was found" in r.stderr
    assert Database(url).stats()["by_status"] == {"build_timeout": 3}

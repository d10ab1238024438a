"""A throwaway PostgreSQL 15 server for tests.

`pg_server()` is a context manager yielding a `postgresql+psycopg://` URL.
`TENSORTUNE_TEST_PG=<url>` uses that server instead of starting one. If no
server can be started the tests that need it are skipped, unless `CI` is set:
there a missing PostgreSQL is a failure, not a silent skip.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

PG_BIN = Path(os.environ.get("TENSORTUNE_PG_BIN", "/usr/lib/postgresql/15/bin"))


class PgUnavailable(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(*cmd: str, **kw) -> subprocess.CompletedProcess:
    """PostgreSQL refuses to run as root: run its programs as the postgres user."""
    if os.geteuid() == 0:
        cmd = ("runuser", "-u", "postgres", "--", *cmd)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


@contextmanager
def start_server():
    """Start initdb + pg_ctl in a temp dir; stop and delete it on exit. Raises PgUnavailable."""
    if not (PG_BIN / "initdb").exists():
        raise PgUnavailable(f"no PostgreSQL programs in {PG_BIN}")
    root = Path(tempfile.mkdtemp(prefix="tt-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    started = False
    try:
        r = _as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                         "--no-sync")
        if r.returncode:
            raise PgUnavailable(f"initdb failed: {r.stderr.strip()[-500:]}")
        port = _free_port()
        opts = (f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off")
        r = _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"), "-w", "start")
        if r.returncode:
            log = (root / "log").read_text(errors="replace")[-500:] if (root / "log").exists() else ""
            raise PgUnavailable(f"pg_ctl start failed: {r.stderr.strip()[-300:]} {log}")
        started = True
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    except (OSError, subprocess.SubprocessError) as e:
        raise PgUnavailable(f"cannot run PostgreSQL: {e}") from e
    finally:
        if started:
            _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def pg_server():
    """The URL of a usable server (env override, else a throwaway one), or skip / fail under CI."""
    if os.environ.get("TENSORTUNE_TEST_PG"):
        yield os.environ["TENSORTUNE_TEST_PG"]
        return
    try:
        cm = start_server()
        url = cm.__enter__()
    except PgUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL test server unavailable under CI: {e}")
        pytest.skip(f"PostgreSQL test server unavailable: {e}")
    try:
        yield url
    finally:
        cm.__exit__(None, None, None)


def admin_execute(url: str, sql: str) -> None:
    """Run one statement outside a transaction (CREATE/DROP DATABASE need that)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as c:
            c.exec_driver_sql(sql)
    finally:
        engine.dispose()


@contextmanager
def fresh_database(server_url: str):
    """A new, empty database on the server for one test; dropped afterwards."""
    from sqlalchemy.engine import make_url

    name = f"tt_{uuid.uuid4().hex[:12]}"
    admin_execute(server_url, f'CREATE DATABASE "{name}" STRATEGY = FILE_COPY')
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        admin_execute(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

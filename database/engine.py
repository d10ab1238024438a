"""Engines and schema migrations.

SQLite: WAL + busy_timeout + synchronous=NORMAL so several tuner processes can
write one file; transactions are begun by us (pysqlite's own handling breaks
savepoints and transactional DDL), and write transactions take the lock up
front with BEGIN IMMEDIATE, which busy_timeout can wait for (a deferred
transaction that upgrades to a write would fail at once with SQLITE_BUSY).
PostgreSQL: migrations run under an advisory lock, so two processes opening a
fresh database at once do not both create the tables.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from database.errors import DatabaseError
from ir.errors import redact, remember_secret

MIGRATIONS = Path(__file__).parent / "migrations"
_PG_MIGRATION_LOCK = 0x7475_6E65  # "tune"


def mask(url: str) -> str:
    """The URL as it may be shown: password hidden (the one rule, `ir.errors.redact`)."""
    return redact(url)


def parse_url(url: str):
    """The parsed URL, its password remembered for masking; a DatabaseError if malformed."""
    try:
        u = make_url(url)
    except Exception as e:
        raise DatabaseError(f"database URL {mask(str(url))!r} is malformed: {e} "
                            "(expected e.g. sqlite:///tuning.db or postgresql+psycopg://user@host/db)") from None
    remember_secret(u.password)
    if u.host and "@" in u.host:
        raise DatabaseError(f"database URL {mask(url)!r}: its password holds an '@' (write it as %40)")
    return u


def sqlite_readonly(url: str) -> bool:
    """An SQLite URL this process cannot write: `mode=ro`, or an existing file without write access."""
    u = parse_url(url)
    if u.get_backend_name() != "sqlite":
        return False
    if u.query.get("mode") == "ro":
        return True
    db = u.database or ""
    if not db or db == ":memory:" or db.startswith("file:"):
        return False
    path = Path(db).expanduser()
    return path.exists() and not os.access(path, os.W_OK)


def make_engine(url: str, readonly: bool = False) -> tuple[Engine, Engine]:
    """(engine for reads, engine for writes): on SQLite the writer begins IMMEDIATE.
    `readonly` (SQLite): opened with mode=ro and no journal-mode change, which would be a write."""
    u = parse_url(url)
    if u.get_backend_name() == "sqlite":
        if readonly and u.database and not u.database.startswith("file:"):
            path = quote(str(Path(u.database).expanduser().resolve()))
            u = make_url(f"sqlite:///file:{path}?mode=ro&uri=true")
        elif u.database and u.database != ":memory:" and not u.database.startswith("file:"):
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(u, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see module doc)
            cur = dbapi_conn.cursor()
            if not readonly:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("tt_write") else "BEGIN")

        return engine, engine.execution_options(tt_write=True)
    connect_args = {"connect_timeout": 10} if u.get_backend_name() == "postgresql" else {}
    engine = create_engine(u, connect_args=connect_args, pool_pre_ping=True)
    return engine, engine


def alembic_config(connection=None):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


@lru_cache(maxsize=1)
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(conn) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def upgrade(read_engine: Engine, write_engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`, atomically (DDL is transactional on both backends)."""
    if revision == "head":
        with read_engine.connect() as conn:
            if current_revision(conn) == head_revision():
                return  # the common case: no Alembic machinery on every open
    from alembic import command

    with write_engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        command.upgrade(alembic_config(conn), revision)

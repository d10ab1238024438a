"""Shared fixtures. `pg_url`: a PostgreSQL server for the session; `db_url`: a fresh,
empty database per test, on SQLite and on PostgreSQL."""
from __future__ import annotations

import uuid

import pytest

try:  # tests/ as a package or as a plain rootdir-inserted folder
    from tests.pg_server import admin_execute, pg_server
except ImportError:
    from pg_server import admin_execute, pg_server


@pytest.fixture(scope="session")
def pg_url():
    with pg_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tuning.db'}"
        return
    from sqlalchemy.engine import make_url

    server = request.getfixturevalue("pg_url")
    name = f"tt_{uuid.uuid4().hex[:12]}"
    admin_execute(server, f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        admin_execute(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

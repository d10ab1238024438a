"""Tuning records in SQL: SQLite by default, PostgreSQL for clusters; `tune-db` is its CLI."""
from database.errors import DatabaseError
from database.record import Record
from database.store import Database, default_url

__all__ = ["Database", "Record", "DatabaseError", "default_url"]

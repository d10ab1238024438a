"""Tuning records in SQL: SQLite by default, PostgreSQL for clusters; `tune-db` is its CLI.

Names load on first use, so `database.record` (the status list, which measurement
workers import) does not pay for SQLAlchemy.
"""
from ir.lazy import lazy_exports

_EXPORTS = {"Database": "database.store", "default_url": "database.store", "Record": "database.record",
            "DatabaseError": "database.errors"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

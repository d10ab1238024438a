"""TRANSITIONAL: threads for templates that still launch by themselves (see codegen.cpu)."""
from __future__ import annotations

from codegen.cpu import parallel_for  # noqa: F401
from ir.settings import current


def num_threads() -> int:
    return current().num_threads

"""Shared fixtures. `pg_url`: a PostgreSQL server for the session; `db_url`: a fresh,
empty database per test, on SQLite and on PostgreSQL."""
from __future__ import annotations

import os

# numba-cuda's simulator runs the CUDA backend's kernels on the CPU, so the cuda templates are
# tested on every machine. numba reads the variable when it is first imported: set it first.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import pytest  # noqa: E402

try:  # tests/ as a package or as a plain rootdir-inserted folder
    from tests.pg_server import fresh_database, pg_server
except ImportError:
    from pg_server import fresh_database, pg_server


@pytest.fixture(scope="session")
def pg_url():
    with pg_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tuning.db'}"
        return
    with fresh_database(request.getfixturevalue("pg_url")) as url:
        yield url


@pytest.fixture(scope="session", autouse=True)
def kernel_cache(tmp_path_factory):
    """Compiled kernels go to one cache per test session (unless TENSORTUNE_CACHE is set),
    so tests share compiles with each other but never with an earlier run."""
    import os
    if "TENSORTUNE_CACHE" not in os.environ:
        os.environ["TENSORTUNE_CACHE"] = str(tmp_path_factory.mktemp("kernel_cache"))
    from ir.settings import Settings, use
    use(Settings.from_env())   # what the CLIs do; in-process tests get the same cache as their subprocesses
    yield os.environ["TENSORTUNE_CACHE"]


# CI draws the same property-test examples on every run (a red CI must be reproducible);
# local runs keep drawing new ones, which is how they find bugs.
import os as _os  # noqa: E402

from hypothesis import settings as _settings  # noqa: E402

_settings.register_profile("ci", derandomize=True, print_blob=True)
if _os.environ.get("CI"):
    _settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    """`long` tests (a local Ray cluster, a virtual environment with installs, the real exported
    models' compiles) guard real behaviour but take minutes: CI runs them (CI set), a local
    default run leaves them out so it stays under 15 minutes; `-m long` runs just them."""
    if _os.environ.get("CI") or config.option.markexpr not in ("not slow", ""):
        return
    keep, left = [], []
    for item in items:
        (left if item.get_closest_marker("long") else keep).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = keep

"""Builders and runners by name: `make_builder("local", **opts)`, `make_runner("local", **opts)`.

`local` (worker processes on this machine) is built in. Another measurement
backend registers its factory (a class, a callable, or "module:attr", imported
only when chosen): the Ray runner is `register_runner("ray", "tuner.measure.ray:RayRunner")`.

Factories take keyword options; the tuning loop passes the ones of `TuneOptions`
(`builder_options` / `runner_options` in tuner/tune.py: timeouts, repeat, number,
min_repeat_ms, flush_cache, and `settings`), plus whatever the caller adds.
"""
from __future__ import annotations

from ir.errors import TensortuneError
from ir.lazy import load_object
from tuner.measure.base import Builder, Runner

_BUILDERS: dict[str, object] = {"local": "tuner.measure.local:LocalBuilder", "ray": "tuner.measure.ray:RayBuilder"}
_RUNNERS: dict[str, object] = {"local": "tuner.measure.local:LocalRunner", "ray": "tuner.measure.ray:RayRunner"}


class MeasureStageError(TensortuneError):
    """A builder or runner name that is not registered, or whose module cannot be imported."""


def register_builder(name: str, factory) -> None:
    """Make `make_builder(name)` call `factory` (a class, a callable, or "module:attr")."""
    _BUILDERS[name] = factory


def register_runner(name: str, factory) -> None:
    """Make `make_runner(name)` call `factory` (a class, a callable, or "module:attr")."""
    _RUNNERS[name] = factory


def builder_names() -> list[str]:
    return sorted(_BUILDERS)


def runner_names() -> list[str]:
    return sorted(_RUNNERS)


def _make(kind: str, table: dict, name: str, opts: dict):
    if name not in table:
        raise MeasureStageError(f"unknown {kind} '{name}' (choose from: {', '.join(sorted(table))})")
    try:
        factory = load_object(table[name])
    except (ImportError, AttributeError) as e:
        raise MeasureStageError(f"{kind} '{name}' cannot be loaded: {e}") from None
    return factory(**opts)


def make_builder(name: str, **opts) -> Builder:
    return _make("builder", _BUILDERS, name, opts)


def make_runner(name: str, **opts) -> Runner:
    return _make("runner", _RUNNERS, name, opts)

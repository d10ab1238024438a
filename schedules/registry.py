"""Templates by name, and the lookup from a workload to the template that covers it."""
from __future__ import annotations

from ir.workload import Workload
from schedules.space import ConfigError
from schedules.template import Template

_TEMPLATES: dict[str, Template] = {}
_builtins_loaded = False


def register_template(t: Template) -> Template:
    """Add a template (a plugin's: after the built-in ones, which are loaded first)."""
    _load()
    _TEMPLATES[t.name] = t
    return t


def get_template(name: str) -> Template:
    _load()
    if name not in _TEMPLATES:
        raise ConfigError(f"unknown template '{name}' (known: {', '.join(sorted(_TEMPLATES))})")
    return _TEMPLATES[name]


def find_template(wl: Workload, kind: str = "cpu") -> Template | None:
    """The first registered template for backends of `kind` (`Backend.template_kind`) that
    matches `wl`, or None (another backend or the reference path runs it)."""
    _load()
    for t in _TEMPLATES.values():
        if t.kind == kind and t.matches(wl):
            return t
    return None


def all_templates() -> list[Template]:
    _load()
    return list(_TEMPLATES.values())


def _load() -> None:
    global _builtins_loaded
    if not _builtins_loaded:  # not "if empty": a plugin may register before the built-ins load
        _builtins_loaded = True
        import schedules.templates  # noqa: F401  (registers every template module)

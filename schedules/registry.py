"""Templates by name, and the lookup from a workload to the template that covers it."""
from __future__ import annotations

from ir.workload import Workload
from schedules.space import ConfigError
from schedules.template import Template

_TEMPLATES: dict[str, Template] = {}


def register_template(t: Template) -> Template:
    _TEMPLATES[t.name] = t
    return t


def get_template(name: str) -> Template:
    _load()
    if name not in _TEMPLATES:
        raise ConfigError(f"unknown template '{name}' (known: {', '.join(sorted(_TEMPLATES))})")
    return _TEMPLATES[name]


def find_template(wl: Workload) -> Template | None:
    """The first registered template that matches `wl`, or None (reference fallback)."""
    _load()
    for t in _TEMPLATES.values():
        if t.matches(wl):
            return t
    return None


def all_templates() -> list[Template]:
    _load()
    return list(_TEMPLATES.values())


def _load() -> None:
    if not _TEMPLATES:
        import schedules.templates  # noqa: F401  (registers every template module)

"""Per subgraph and concrete shape, the kernel to run: the exact tuned config →
the config tuned for the nearest shape of the same signature → the template's
default config → the NumPy reference (no template covers it)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from ir.workload import Workload
from schedules import Config, ConfigError, Template, find_template
from runtime.plan import Plan

TUNED, NEAREST, DEFAULT, REFERENCE = "tuned", "nearest", "default", "reference"


@dataclass
class Choice:
    kind: str
    template: Template | None
    config: Config | None


class Chooser:
    """Looks configs up in a plan or a database for one target."""

    def __init__(self, plan: Plan | None = None, db=None, target_key: str | None = None):
        self.plan, self.db, self.target_key = plan, db, target_key

    def _lookup(self, wl: Workload):
        if self.plan is not None:
            e = self.plan.exact(wl.key)
            if e is not None:
                return TUNED, e.template, e.config
            e = self.plan.nearest(wl.signature, wl.dims)
            if e is not None:
                return NEAREST, e.template, e.config
        if self.db is not None:
            best = self.db.best(wl.key, self.target_key, 1)
            if best:
                return TUNED, best[0].template, best[0].config
            near = self.db.nearest(wl.signature, wl.dims, self.target_key)
            if near is not None:
                return NEAREST, near.template, near.config
        return None

    def choose(self, wl: Workload) -> Choice:
        template = find_template(wl)
        if template is None:
            return Choice(REFERENCE, None, None)
        found = self._lookup(wl)
        if found is not None:
            kind, name, cfg = found
            if name == template.name:
                try:
                    return Choice(kind, template, template.space(wl).validate(cfg))
                except ConfigError as e:
                    warnings.warn(f"stored config for {wl.describe()} does not fit this shape ({e}); using the default")
        return Choice(DEFAULT, template, template.default_config(wl))

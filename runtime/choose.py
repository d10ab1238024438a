"""Per subgraph and concrete shape, the kernel to run: the exact tuned config →
the config tuned for the nearest shape of the same signature → the template's
default config → the NumPy reference (no template covers it).

A stored record that no longer fits (its template is gone or at another version,
its config is not in the template's space) is never run: it is reported with a
warning and the default config is used — or, with `strict`, a `StaleRecordError`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from ir.errors import TensortuneError
from ir.workload import Workload
from schedules import Config, ConfigError, Template, find_template
from runtime.plan import Plan

TUNED, NEAREST, DEFAULT, REFERENCE = "tuned", "nearest", "default", "reference"
CPU_FALLBACK = "cpu-fallback"   # a GPU model's subgraph that no GPU template covers: a CPU kernel runs it
KINDS = (TUNED, NEAREST, DEFAULT, CPU_FALLBACK, REFERENCE)
# the strategy of records `tune` measured inside the deployed model (tuner.verify): its verdicts
IN_MODEL = "in-model"
# a key of a stored config that is not a knob: the kernel runs on every thread, however small (the
# in-model check timed it faster so: `tuner.verify`); only the exact workload's record carries it
SPLIT = "@split"
# the other way: the kernel runs on one thread, however large (the in-model check timed it faster so)
ONE = "@one"


class StaleRecordError(TensortuneError):
    """A plan entry or database record that does not fit the current template."""


@dataclass
class Choice:
    kind: str
    template: Template | None
    config: Config | None
    backend: str | None = None   # None: the model's backend; "cpu" for a CPU_FALLBACK
    split: bool = False          # run on every thread whatever its size (`SPLIT`)
    one: bool = False            # run on one thread whatever its size (`ONE`)


@dataclass
class _Found:
    kind: str
    template: str
    version: int | None
    config: dict
    where: str


class Chooser:
    """Looks configs up in a plan or a database for one target."""

    def __init__(self, plan: Plan | None = None, db=None, target_key: str | None = None, strict: bool = False,
                 kind: str = "cpu", use_verdicts: bool = True):
        self.plan, self.db, self.target_key, self.strict = plan, db, target_key, strict
        self.kind = kind   # the templates of the model's backend (`Backend.template_kind`)
        self.use_verdicts = use_verdicts
        self._warned: set = set()

    def _lookup(self, wl: Workload) -> _Found | None:
        if self.plan is not None:
            e = self.plan.exact(wl.key)
            kind = TUNED
            if e is None:
                e, kind = self.plan.nearest(wl.signature, wl.dims), NEAREST
            if e is not None:
                where = f"plan entry {self.plan.entries.index(e)} (workload {e.workload_key})"
                return _Found(kind, e.template, e.template_version, e.config, where)
        if self.db is not None:
            r = deployed_record(self.db, wl.key, self.target_key) if self.use_verdicts else \
                next(iter(self.db.best(wl.key, self.target_key, 1)), None)
            kind = TUNED
            if r is None:
                r, kind = self.db.nearest(wl.signature, wl.dims, self.target_key), NEAREST
            if r is not None:
                return _Found(kind, r.template, getattr(r, "template_version", None), r.config,
                              f"database record {getattr(r, 'id', '?')}")
        return None

    def _stale(self, wl: Workload, found: _Found, why: str) -> None:
        msg = f"{found.where} for {wl.describe()} is not usable: {why}"
        if self.strict:
            raise StaleRecordError(msg)
        if msg not in self._warned:
            self._warned.add(msg)
            warnings.warn(msg + "; running the default config")

    def choose(self, wl: Workload) -> Choice:
        template = find_template(wl, self.kind)
        if template is None:
            host = find_template(wl, "cpu") if self.kind != "cpu" else None
            if host is not None:   # no GPU kernel for it: the CPU backend runs its default config
                return Choice(CPU_FALLBACK, host, host.default_config(wl), backend="cpu")
            return Choice(REFERENCE, None, None)
        found = self._lookup(wl)
        if found is not None:
            if found.template != template.name:
                self._stale(wl, found, f"it names template '{found.template}', this workload is served by "
                                       f"'{template.name}'")
            elif found.version is not None and found.version != template.version:
                self._stale(wl, found, f"it was tuned with {template.name} v{found.version}, this is "
                                       f"v{template.version}")
            else:
                config = dict(found.config)
                split, one = (bool(config.pop(k, False)) and found.kind == TUNED for k in (SPLIT, ONE))
                try:
                    return Choice(found.kind, template, template.space(wl).validate(config), split=split, one=one)
                except ConfigError as e:
                    self._stale(wl, found, f"its config does not fit the template's space ({e})")
        return Choice(DEFAULT, template, template.default_config(wl))


def deployed_record(db, workload_key: str, target_key: str | None):
    """The record whose config deploys for this exact workload: the fastest stored, unless
    `tune` timed it inside the model (`IN_MODEL` records, `tuner.verify`) against other
    configs: then the one of those that ran fastest there. None when nothing is stored."""
    best = db.best(workload_key, target_key, 1)
    if not best:
        return None
    checked = {}
    for r in db.records(workload_key=workload_key, target_key=target_key, status="ok"):
        if r.strategy == IN_MODEL and r.median is not None:
            checked[r.config_hash] = r   # the latest verdict per config (records come in id order)
    if best[0].config_hash not in checked:
        return best[0]   # a new best since the last check (or never checked): deployed as measured
    return min(checked.values(), key=lambda r: (r.median, -(r.id or 0)))

"""`Plan`: the serializable choice of template + config per subgraph workload and
tuned shape, with the target it was tuned on. Deploys without the database."""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ir.errors import TensortuneError
from ir.keys import shape_distance

PLAN_FORMAT = "tensortune-plan"
PLAN_VERSION = 1


class PlanError(TensortuneError):
    """A plan file that is missing, corrupt, or of an unknown version."""


@dataclass
class PlanEntry:
    workload_key: str
    signature: str
    template: str
    template_version: int
    dims: dict
    config: dict
    median: float | None = None


@dataclass
class Plan:
    target: dict
    dims: dict = field(default_factory=dict)        # declared ranges: name -> [lo, hi]
    entries: list[PlanEntry] = field(default_factory=list)
    model: str = ""

    def exact(self, key: str) -> PlanEntry | None:
        return next((e for e in self.entries if e.workload_key == key), None)

    def nearest(self, signature: str, dims: dict[str, int]) -> PlanEntry | None:
        """The entry of the same signature whose dynamic dims are closest on a log scale
        (`ir.keys.shape_distance`, as `Database.nearest`); the faster one on a tie."""
        scored = [(shape_distance(dims, e.dims), e.median or math.inf, k) for k, e in enumerate(self.entries)
                  if e.signature == signature]
        scored = [x for x in scored if x[0] != math.inf]
        return self.entries[min(scored)[2]] if scored else None

    def to_json(self) -> dict:
        return {"format": PLAN_FORMAT, "version": PLAN_VERSION, "model": self.model, "target": self.target,
                "dims": self.dims, "entries": [e.__dict__ for e in self.entries]}

    def save(self, path) -> None:
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=".plan_")
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_json(), f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path) -> "Plan":
        try:
            with open(path) as f:
                d = json.load(f)
        except FileNotFoundError:
            raise PlanError(f"plan file '{path}' does not exist") from None
        except IsADirectoryError:
            raise PlanError(f"plan file '{path}' is a directory") from None
        except (OSError, ValueError) as e:
            raise PlanError(f"plan file '{path}' is not valid JSON: {e}") from None
        except RecursionError:
            raise PlanError(f"plan file '{path}' is nested too deeply to be a plan") from None
        return cls.from_json(d, str(path))

    @classmethod
    def from_json(cls, d, where: str = "<plan>") -> "Plan":
        if not isinstance(d, dict) or d.get("format") != PLAN_FORMAT:
            raise PlanError(f"plan '{where}' is not a tensortune plan (missing format '{PLAN_FORMAT}')")
        if d.get("version") != PLAN_VERSION:
            raise PlanError(f"plan '{where}' has version {d.get('version')!r}; this tensortune reads version {PLAN_VERSION}")
        target = d.get("target")
        if not isinstance(target, dict) or not isinstance(target.get("key"), str):
            raise PlanError(f"plan '{where}': 'target' must be an object with a 'key' string")
        dims = d.get("dims", {})
        if not isinstance(dims, dict) or not all(_is_range(v) for v in dims.values()):
            raise PlanError(f"plan '{where}': 'dims' must map each dim to [lo, hi] with 1 <= lo <= hi, got {dims!r}")
        if not isinstance(d.get("entries"), list):
            raise PlanError(f"plan '{where}': 'entries' must be a list")
        entries = []
        for k, e in enumerate(d["entries"]):
            try:
                entry = PlanEntry(**e) if isinstance(e, dict) else None
                if entry is None:
                    raise TypeError("an entry must be an object")
                _check_entry(entry)
            except TypeError as err:
                raise PlanError(f"plan '{where}': entry {k} is malformed: {err}") from None
            entries.append(entry)
        return cls(target, {n: list(v) for n, v in dims.items()}, entries, str(d.get("model", "")))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_range(v) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_int(x) for x in v) and 1 <= v[0] <= v[1]


def _check_entry(e: PlanEntry) -> None:
    for name in ("workload_key", "signature", "template"):
        if not isinstance(getattr(e, name), str) or not getattr(e, name):
            raise TypeError(f"'{name}' must be a non-empty string")
    if not _is_int(e.template_version):
        raise TypeError("'template_version' must be an integer")
    if not isinstance(e.config, dict):
        raise TypeError("'config' must be an object")
    for knob, v in e.config.items():
        # a knob's value is a string, an integer or a boolean; whether it is one of the
        # template's options (type included: 8.0 is not 8) is checked at deploy
        if not (isinstance(v, (str, int)) or isinstance(v, float) and math.isfinite(v)):
            raise TypeError(f"config knob '{knob}' = {v!r}: a knob value must be a string, a number or a boolean")
    if not isinstance(e.dims, dict) or not all(_is_int(v) and v >= 1 for v in e.dims.values()):
        raise TypeError(f"'dims' must map dims to positive integers, got {e.dims!r}")
    if e.median is not None and not (isinstance(e.median, (int, float)) and e.median >= 0):
        raise TypeError(f"'median' must be a non-negative number or null, got {e.median!r}")

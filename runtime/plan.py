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
        """The entry of the same signature whose dynamic dims are closest on a log scale."""
        cands = [e for e in self.entries if e.signature == signature and set(e.dims) >= set(dims)]
        if not cands:
            return None
        return min(cands, key=lambda e: (sum(abs(math.log2(e.dims[d]) - math.log2(v)) for d, v in dims.items()),
                                         e.median or math.inf))

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
        except (OSError, ValueError) as e:
            raise PlanError(f"plan file '{path}' is not valid JSON: {e}") from None
        return cls.from_json(d, str(path))

    @classmethod
    def from_json(cls, d, where: str = "<plan>") -> "Plan":
        if not isinstance(d, dict) or d.get("format") != PLAN_FORMAT:
            raise PlanError(f"plan '{where}' is not a tensortune plan (missing format '{PLAN_FORMAT}')")
        if d.get("version") != PLAN_VERSION:
            raise PlanError(f"plan '{where}' has version {d.get('version')!r}; this tensortune reads version {PLAN_VERSION}")
        try:
            entries = [PlanEntry(**e) for e in d["entries"]]
            for e in entries:
                if not (isinstance(e.config, dict) and isinstance(e.dims, dict) and isinstance(e.workload_key, str)):
                    raise TypeError("config and dims must be objects, workload_key a string")
            return cls(d["target"], d.get("dims", {}), entries, d.get("model", ""))
        except (KeyError, TypeError) as e:
            raise PlanError(f"plan '{where}' has a malformed entry: {e}") from None

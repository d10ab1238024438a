"""`Record`: one measurement as plain data, the unit of add/query/export."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from functools import lru_cache

from ir.keys import config_hash

# What a measurement can end in: the one list (the tuner's `MeasureResult.status` takes these)
OK = "ok"
COMPILE_ERROR = "compile_error"
RUNTIME_ERROR = "runtime_error"
BUILD_TIMEOUT = "build_timeout"
RUN_TIMEOUT = "run_timeout"
WRONG_RESULT = "wrong_result"
WORKER_DIED = "worker_died"
STATUSES = (OK, COMPILE_ERROR, RUNTIME_ERROR, BUILD_TIMEOUT, RUN_TIMEOUT, WRONG_RESULT, WORKER_DIED)
# failures of the moment, not of the config (a killed or overloaded worker): measured again once
TRANSIENT_STATUSES = (WORKER_DIED, RUN_TIMEOUT, BUILD_TIMEOUT)
MEASURE_TRIES = 2


def is_transient(status: str, error: str = "") -> bool:
    """True for a failure that says nothing about the config: worth one more try."""
    return status in TRANSIENT_STATUSES or (status != OK and (error or "").startswith("MemoryError"))


@lru_cache(maxsize=1)
def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("tensortune")
    except Exception:  # not installed (running from a checkout)
        return "0.1.0"


@dataclass
class Record:
    workload: dict  # Workload.to_json()
    workload_key: str
    signature: str
    family: str
    template: str
    template_version: int
    target: dict  # {"key": str, "kind": "cpu", ...description}
    config: dict
    status: str
    latencies: list[float]
    median: float | None
    spread: float | None = None
    error: str = ""
    compile_s: float | None = None
    strategy: str = ""
    flops: int = 0
    created_at: datetime | None = None  # set by the database when added (UTC)
    version: str = field(default_factory=package_version)
    id: int | None = None

    @property
    def config_hash(self) -> str:
        return config_hash(self.config)

    @property
    def target_key(self) -> str:
        return self.target["key"]

    def to_json(self) -> dict:
        """JSON-able dict (created_at as ISO 8601), without the database id: the export line."""
        d = asdict(self)
        d.pop("id")
        d["created_at"] = self.created_at.isoformat() if self.created_at else None
        return d


FIELD_NAMES = tuple(f.name for f in fields(Record))


def to_utc_naive(t: datetime) -> datetime:
    """Stored form of a time: naive UTC, so SQLite and PostgreSQL round-trip it exactly."""
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc).replace(tzinfo=None)
    return t


def from_utc_naive(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)

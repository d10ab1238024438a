"""`Settings`: what a run is configured with, as one explicit object.

Environment variables are read in one place, `Settings.from_env`, which only the
command-line entry points call; the library itself never looks at `os.environ`
for its own configuration. A Python user passes `Settings(...)` (or installs one
as the process default with `use`), and the tuner hands the same object to its
worker processes, so a worker never depends on what environment it inherited.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ENV = {  # variable -> field, the whole list of what the CLIs read
    "TENSORTUNE_CACHE": "cache_dir",
    "TENSORTUNE_NUM_THREADS": "threads",
    "TENSORTUNE_BACKEND": "backend",
    "TENSORTUNE_PLUGINS": "plugins",
    "TENSORTUNE_DB": "db_url",
    "TENSORTUNE_DEBUG": "debug",
    "TENSORTUNE_CUDA_ARCH": "cuda_arch",
}


def _affinity() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class Settings:
    cache_dir: str = ""          # kernel cache root; "" = ~/.cache/tensortune
    threads: int = 0             # kernel threads; 0 = the cores this process may run on
    backend: str = "cpu"         # the backend kernels are built for (codegen.backend)
    plugins: tuple[str, ...] = ()
    db_url: str = ""             # "" = sqlite:///tuning.db (the CLIs' default)
    debug: bool = False          # full tracebacks instead of one-line errors
    cuda_arch: str = ""          # a compute capability ("8.0") declared where no GPU answers (codegen.cuda)

    def __post_init__(self):
        from ir.errors import TensortuneError
        if not (isinstance(self.threads, int) and self.threads >= 0):
            raise TensortuneError(f"threads must be an integer >= 0 (0: all cores), got {self.threads!r}")

    @property
    def cache_root(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else Path.home() / ".cache" / "tensortune"

    @property
    def num_threads(self) -> int:
        return self.threads or _affinity()

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)

    def to_json(self) -> dict:
        d = asdict(self)
        d["plugins"] = list(self.plugins)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Settings":
        d = dict(d)
        d["plugins"] = tuple(d.get("plugins") or ())
        return cls(**d)

    @classmethod
    def from_env(cls, environ=None) -> "Settings":
        """The settings the environment asks for (CLIs only); a bad value is one clear error."""
        from ir.errors import TensortuneError
        env = os.environ if environ is None else environ
        kw: dict = {}
        if env.get("TENSORTUNE_CACHE"):
            kw["cache_dir"] = env["TENSORTUNE_CACHE"]
        if env.get("TENSORTUNE_NUM_THREADS"):
            v = env["TENSORTUNE_NUM_THREADS"].strip()
            if not v.isdigit() or int(v) < 1:
                raise TensortuneError(f"TENSORTUNE_NUM_THREADS must be a positive integer, got {v!r}")
            kw["threads"] = int(v)
        if env.get("TENSORTUNE_BACKEND"):
            kw["backend"] = env["TENSORTUNE_BACKEND"].strip()
        if env.get("TENSORTUNE_PLUGINS"):
            from ir.custom import plugins_from_env
            kw["plugins"] = tuple(plugins_from_env(env["TENSORTUNE_PLUGINS"]))
        if env.get("TENSORTUNE_DB"):
            kw["db_url"] = env["TENSORTUNE_DB"]
        if env.get("TENSORTUNE_CUDA_ARCH"):
            kw["cuda_arch"] = env["TENSORTUNE_CUDA_ARCH"].strip()
        kw["debug"] = bool(env.get("TENSORTUNE_DEBUG"))
        return cls(**kw)


_current = [Settings()]


def current() -> Settings:
    """The process default: `Settings()` unless a CLI (or the user) installed others with `use`."""
    return _current[0]


def use(settings: Settings) -> Settings:
    """Make `settings` the process default; returns the previous one."""
    old, _current[0] = _current[0], settings
    return old


def resolve(settings: Settings | None) -> Settings:
    return settings if settings is not None else current()


__all__ = ["ENV", "Settings", "current", "use", "resolve", "field"]

"""The target a kernel is compiled and timed for. Its `key` keeps records from
other machines (another CPU or GPU, another thread count, another compiler
version) from ever being mixed up.

A target is a kind (the backend's name) plus the properties its backend says
change timings; `codegen.cpu.CpuBackend.target` lists the CPU's.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    kind: str
    props: tuple = ()   # ((name, value), ...), sorted by name

    @classmethod
    def make(cls, kind: str, **props) -> "Target":
        return cls(kind, tuple(sorted(props.items())))

    @classmethod
    def from_json(cls, d: dict) -> "Target":
        return cls.make(d["kind"], **{k: v for k, v in d.items() if k not in ("kind", "key")})

    def get(self, name: str, default=None):
        return dict(self.props).get(name, default)

    def __getattr__(self, name: str):
        # cpu/cpu_name/numba/... read as attributes; only called for names that are not fields
        if name.startswith("__"):
            raise AttributeError(name)
        props = dict(object.__getattribute__(self, "props"))
        if name in props:
            return props[name]
        raise AttributeError(f"target '{self.kind}' has no property '{name}'")

    @property
    def key(self) -> str:
        return self.kind + "-" + hashlib.sha256(json.dumps(self.describe(False), sort_keys=True).encode()).hexdigest()[:12]

    def describe(self, with_key: bool = True) -> dict:
        d = {"kind": self.kind, **dict(self.props)}
        if with_key:
            d["key"] = self.key
        return d

    def __str__(self) -> str:
        p = dict(self.props)
        name = p.get("cpu") or p.get("name") or "?"
        extra = ", ".join(f"{k} {p[k]}" for k in ("threads", "numba") if k in p)
        return f"{self.kind}: {name}" + (f" ({extra})" if extra else "")


def host_target(kind: str | None = None, settings=None) -> Target:
    """The target of backend `kind` (default: the settings' backend) on this machine."""
    from codegen.backend import get_backend
    return get_backend(kind, settings).target()

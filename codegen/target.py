"""The target a kernel is compiled and timed for. Its `key` keeps records from
other machines (other CPU, other numba) from ever being mixed up."""
from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Target:
    kind: str
    cpu: str
    cpu_name: str
    features: str
    cores: int
    numba: str
    llvmlite: str

    @property
    def key(self) -> str:
        return self.kind + "-" + hashlib.sha256(json.dumps(self.describe(False), sort_keys=True).encode()).hexdigest()[:12]

    def describe(self, with_key: bool = True) -> dict:
        d = {"kind": self.kind, "cpu": self.cpu, "cpu_name": self.cpu_name, "features": self.features,
             "cores": self.cores, "numba": self.numba, "llvmlite": self.llvmlite}
        if with_key:
            d["key"] = self.key
        return d

    def __str__(self) -> str:
        return f"{self.kind}: {self.cpu} ({self.cpu_name}, {self.cores} cores), numba {self.numba}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=None)
def host_target(kind: str = "cpu") -> Target:
    if kind != "cpu":
        from ir.errors import TensortuneError
        raise TensortuneError(f"target '{kind}' is not available (supported: cpu)")
    import llvmlite
    import llvmlite.binding as ll
    import numba
    feats = ll.get_host_cpu_features()
    simd = ",".join(sorted(k for k, v in feats.items() if v and any(s in k for s in ("avx", "fma", "sse4", "neon", "sve"))))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Target("cpu", _cpu_model(), ll.get_host_cpu_name(), simd, int(cores or 1),
                  numba.__version__, llvmlite.__version__)

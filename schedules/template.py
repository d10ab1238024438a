"""The template interface: a family of loop schedules for one kind of workload."""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ir.workload import Workload
from schedules.loopnest import LoopModule
from schedules.space import Config, ConfigSpace

# prepare(functions, arrays with None at non-constant positions) -> state (packed weights...)
PrepareFn = Callable[[dict, list], Any]
# launch(functions, state, arrays, out) -> None; writes `out`
LaunchFn = Callable[[dict, Any, list, np.ndarray], None]


@dataclass
class Lowered:
    """A config applied to a workload: the code to compile, and how to call it."""

    module: LoopModule
    prepare: PrepareFn
    launch: LaunchFn


class Template(abc.ABC):
    name: str = ""
    version: int = 1

    @abc.abstractmethod
    def matches(self, wl: Workload) -> bool:
        """True if this template can compute `wl` (any shape of its signature)."""

    @abc.abstractmethod
    def space(self, wl: Workload) -> ConfigSpace:
        """Knobs; every config is valid for every shape of `wl.signature`."""

    @abc.abstractmethod
    def default_config(self, wl: Workload) -> Config:
        """A good untuned config: used when the database knows nothing."""

    @abc.abstractmethod
    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        """Apply `cfg`: code-shape knobs shape the module, run-time knobs go to launch."""

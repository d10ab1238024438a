"""The template interface: a family of loop schedules for one kind of workload."""
from __future__ import annotations

import abc
from dataclasses import dataclass

from ir.workload import Workload
from schedules.launch import Launch
from schedules.loopnest import LoopModule
from schedules.space import Config, ConfigSpace


@dataclass(frozen=True)
class Lowered:
    """A config applied to a workload, as data: the code to compile and how to run it
    (`schedules.launch`). It pickles, so it travels to workers with the artifact."""

    module: LoopModule
    launch: Launch

    def __post_init__(self):
        if isinstance(self.launch, Launch):
            self.launch.validate(f.name for f in self.module.functions)


class Template(abc.ABC):
    name: str = ""
    version: int = 1
    kind: str = "cpu"   # the backends it writes code for (`Backend.template_kind`): "cpu" or "cuda"

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
        """Apply `cfg`: the loop module, and a launch description whose run-time knobs are
        scalar arguments (candidates that differ only in them share one compile)."""


"""`Kernel`: a compiled (workload, config) with its source; `bind` packs constants once."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from codegen.build import CompiledModule, build
from codegen.target import Target
from ir.workload import Workload
from schedules.space import Config
from schedules.template import Lowered, Template


@dataclass
class Kernel:
    workload: Workload
    template: str
    config: Config
    lowered: Lowered
    compiled: CompiledModule

    @property
    def source(self) -> str:
        return self.compiled.source

    def bind(self, arrays: list) -> "BoundKernel":
        """Prepare with the constant inputs (others may be None): weight packing happens here, once."""
        return BoundKernel(self, self.lowered.prepare(self.compiled.functions, arrays))


class BoundKernel:
    def __init__(self, kernel: Kernel, state):
        self.kernel, self.state = kernel, state

    def __call__(self, arrays: list, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            wl = self.kernel.workload
            out = np.empty(wl.output_shape, dtype=wl.output_dtype)
        self.kernel.lowered.launch(self.kernel.compiled.functions, self.state, arrays, out)
        return out


def compile_kernel(template: Template, wl: Workload, cfg: Config, target: Target | None = None) -> Kernel:
    lowered = template.lower(wl, cfg)
    return Kernel(wl, template.name, cfg, lowered, build(lowered.module, target))

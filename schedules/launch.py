"""The launch description: how a lowered kernel is run, as data.

A template's `lower` returns a loop module (the code) and a `Launch` (how to
call it). Templates describe; they never start threads or allocate. A backend
and the executor interpret the description (`codegen.kernel.BoundKernel`):

- `prepare` steps run once per (subgraph, config) with the constant inputs, and
  write the `packed` buffers (packed weights). Their result is shared by the
  programs of every shape, so packed buffers must not depend on dynamic dims.
- `steps` run on every call, in order. A `Call` runs one function of the loop
  module over `items` work items: on the CPU, T threads run copies, copy t of T
  taking its contiguous share of the items (`loopnest.thread_share`; the function's
  last two parameters are t and T); `parallel=False` runs one copy. A `Library` step calls a routine the
  backend provides by name (BLAS matmul, as TVM's extern calls). `Repeat` runs
  its body once per value of a loop variable (`Var` arguments read it).
- `workspaces` are scratch buffers live only during this kernel's steps: the
  executor places them in its memory plan like every other buffer, so their
  content is undefined when the steps start (a template that needs zeros writes
  them).
- Arguments name what to pass: an input (`In`, viewed as a contiguous array of
  the kernel's dtype and given shape, optionally broadcast first), the output
  (`Out`), a workspace (`Work`), a packed buffer (`Packed`), a constant table
  computed while lowering (`Table`: index maps, interpolation weights), a
  scalar (`Scalar`) or a `Repeat` variable (`Var`).

Workloads are concrete (every size known when lowering), so every shape here
is a tuple of ints.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import numpy as np


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class In:
    """Input `index` as a C-contiguous array of `dtype` (None: the workload's), broadcast to
    `broadcast` first when given, then reshaped to `shape` (None: as it is). Views of
    constant inputs are made once, at bind time."""
    index: int
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    broadcast: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Out:
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Work:
    name: str


@dataclass(frozen=True)
class Packed:
    name: str


@dataclass(frozen=True)
class Table:
    name: str


@dataclass(frozen=True)
class Scalar:
    value: Union[int, float, bool]
    type: str = "int64"


@dataclass(frozen=True)
class Var:
    name: str


Arg = Union[In, Out, Work, Packed, Table, Scalar, Var]


@dataclass(frozen=True)
class Call:
    function: str
    args: tuple
    items: int = 1
    parallel: bool = False
    # GPU backends: launch geometry (blocks, threads per block); CPU backends ignore it
    grid: tuple[int, ...] = ()
    block: tuple[int, ...] = ()


@dataclass(frozen=True)
class Library:
    routine: str          # a name the backend knows: "matmul" (out = a @ b)
    args: tuple


@dataclass(frozen=True)
class Repeat:
    var: str
    count: int
    body: tuple


Step = Union[Call, Library, Repeat]


@dataclass(frozen=True)
class Launch:
    steps: tuple
    prepare: tuple = ()
    packed: tuple[Buffer, ...] = ()
    workspaces: tuple[Buffer, ...] = ()
    tables: dict = field(default_factory=dict, hash=False, compare=False)   # name -> np.ndarray

    def functions(self) -> list[str]:
        """Names of the loop-module functions the launch calls (prepare and steps)."""
        return list(dict.fromkeys(s.function for s in walk(self.prepare + self.steps) if isinstance(s, Call)))

    def workspace_bytes(self) -> int:
        return sum(b.nbytes for b in self.workspaces)

    def validate(self, function_names) -> None:
        """A template bug caught at lowering time, not at the first call: names that do not resolve."""
        names = set(function_names)
        bufs = {b.name for b in self.workspaces}, {b.name for b in self.packed}, set(self.tables)
        for s in walk(self.prepare + self.steps):
            if isinstance(s, Call) and s.function not in names:
                raise ValueError(f"launch calls '{s.function}', which the loop module does not define")
            for a in getattr(s, "args", ()):
                for kind, known in zip((Work, Packed, Table), bufs):
                    if isinstance(a, kind) and a.name not in known:
                        raise ValueError(f"launch argument {a} names no declared {kind.__name__.lower()} buffer")
        for s in walk(self.prepare):
            if any(isinstance(a, (Out, Work)) for a in getattr(s, "args", ())):
                raise ValueError("prepare steps see only constant inputs, packed buffers and tables")


def walk(steps) -> list:
    """Every step, the bodies of `Repeat`s included (depth first)."""
    out = []
    for s in steps:
        out.append(s)
        if isinstance(s, Repeat):
            out += walk(s.body)
    return out

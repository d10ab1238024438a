"""The loop-nest IR: what a template produces and codegen prints.

Statements form a tree (functions → loops → assignments); expressions are
numba-compatible Python expression strings built by the templates. Loop kinds
say how codegen emits a loop: `serial` (range), `parallel` (prange; only the
outermost loop of a function), `unrolled` (the body is repeated with the loop
variable replaced by constants).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

SERIAL, PARALLEL, UNROLLED = "serial", "parallel", "unrolled"


@dataclass(frozen=True)
class For:
    var: str
    start: str
    stop: str
    body: tuple
    kind: str = SERIAL
    step: str = "1"


@dataclass(frozen=True)
class Assign:
    """`target = value` (op="") or `target op= value` (op="+", "-", ...)."""

    target: str
    value: str
    op: str = ""


@dataclass(frozen=True)
class If:
    cond: str
    then: tuple
    orelse: tuple = ()


@dataclass(frozen=True)
class Alloc:
    """A local buffer (e.g. a register tile or a packing panel). On a GPU, `scope` says
    where it lives: "local" (per thread: registers or local memory) or "shared" (per
    block); both need constant shapes there. The CPU allocates every scope the same way."""

    name: str
    shape: tuple[str, ...]
    dtype: str = "float32"
    scope: str = "local"


@dataclass(frozen=True)
class Call:
    """A call to another function of the same module, or any expression statement."""

    expr: str


@dataclass(frozen=True)
class Comment:
    text: str


Stmt = Union[For, Assign, If, Alloc, Call, Comment]


@dataclass(frozen=True)
class Param:
    name: str
    type: str   # numba type string: "float32[:, ::1]", "int64"


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[Param, ...]
    body: tuple
    parallel: bool = False
    nogil: bool = True   # lets `codegen.cpu.parallel_for` run copies on threads
    device: bool = False  # GPU: a device function the kernels of the module call (not launched)
    fastmath: tuple[str, ...] = ("nnan", "ninf", "nsz", "arcp", "contract", "afn")


@dataclass(frozen=True)
class LoopModule:
    """One compile unit: the functions a kernel needs (packing, main)."""

    functions: tuple[Function, ...]
    doc: str = ""
    meta: dict = field(default_factory=dict, hash=False, compare=False)

    def function(self, name: str) -> Function:
        return next(f for f in self.functions if f.name == name)


def loops(stmts, kind: str | None = None) -> list[For]:
    """All loops in a statement tree (outer first), optionally of one kind."""
    out = []
    for s in stmts:
        if isinstance(s, For):
            if kind is None or s.kind == kind:
                out.append(s)
            out += loops(s.body, kind)
        elif isinstance(s, If):
            out += loops(s.then, kind) + loops(s.orelse, kind)
    return out


def thread_share(var: str, total: str, body: tuple) -> For:
    """`for var in` copy t of T's share of range(total): one contiguous run of work items
    (t and T are the function's last two parameters; the backend runs its copies). Not items
    t, t+T, ...: the output blocks of neighbouring items lie side by side, and two cores
    writing interleaved blocks of one buffer took each other's lines (the L2 prefetchers
    reach into the next block): a 1x1 conv whose copies wrote alternate 512-byte blocks ran
    2x slower on each of two threads than alone, 1.4x faster than one thread in runs
    (Emerald Rapids, 2 vCPUs)."""
    return For(var, f"t * ({total}) // T", f"(t + 1) * ({total}) // T", body)


def unflatten(index: str, digits: tuple, last: str) -> tuple:
    """Statements splitting a flat work-item `index` into mixed-radix digits, fastest first:
    `digits` = ((name, count), ...), and `last` takes what is left (the slowest digit)."""
    out, rest = [], index
    for name, count in digits:
        out += [Assign(name, f"{rest} % {count}")]
        if (name, count) == digits[-1]:
            out += [Assign(last, f"{rest} // {count}")]
        else:
            out += [Assign("rest", f"{rest} // {count}")]
            rest = "rest"
    return tuple(out)

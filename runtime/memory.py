"""Memory planning: liveness of a program's intermediate tensors → offsets in one arena.

Every intermediate value (produced by a step, neither a graph input, a constant nor
a graph output) gets a byte range in one arena per concrete shape. Two values share
bytes only if their live intervals (producing step .. last reading step) do not
overlap. A step may write its output over an input that dies at that step
(`inplace`), which merges the two into one buffer. Offsets are assigned greedily
by size, largest first, each into the smallest gap that fits (TFLite's
"greedy by size" strategy).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from codegen.backend import ALIGN   # offsets in the arena, itself allocated at ALIGN


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class Buffer:
    values: list[str]
    nbytes: int
    first: int          # step that writes it first
    last: int           # step that reads it last
    offset: int = -1


@dataclass
class MemoryPlan:
    offsets: dict[str, int]            # value -> byte offset in the arena
    nbytes: dict[str, int]             # value -> size
    arena_bytes: int                   # planned peak: the arena's size
    no_reuse_bytes: int                # every intermediate in its own buffer
    live_peak_bytes: int               # lower bound: most bytes live at one step
    inplace: list[tuple[str, str]] = field(default_factory=list)  # (input, output) sharing bytes

    @property
    def ratio(self) -> float:
        return self.arena_bytes / self.no_reuse_bytes if self.no_reuse_bytes else 1.0

    def to_json(self) -> dict:
        return {"planned_bytes": self.arena_bytes, "no_reuse_bytes": self.no_reuse_bytes,
                "live_peak_bytes": self.live_peak_bytes, "ratio": round(self.ratio, 4),
                "buffers": len(self.offsets), "inplace": len(self.inplace)}

    def __str__(self) -> str:
        return (f"activations {self.arena_bytes / 2**20:.2f} MiB planned vs {self.no_reuse_bytes / 2**20:.2f} MiB "
                f"without reuse ({self.ratio:.2f}x; live peak {self.live_peak_bytes / 2**20:.2f} MiB)")


def plan_memory(sizes: dict[str, int], defs: dict[str, int], uses: dict[str, int],
                inplace: dict[str, str] | None = None) -> MemoryPlan:
    """sizes: value -> bytes; defs: value -> producing step; uses: value -> last reading step
    (absent: never read); inplace: output value -> input value it may overwrite (the input's
    last use must be the output's producing step)."""
    inplace = dict(inplace or {})
    owner: dict[str, Buffer] = {}
    buffers: list[Buffer] = []
    done_inplace = []
    for v in sorted(sizes, key=lambda v: defs[v]):
        first, last = defs[v], max(uses.get(v, defs[v]), defs[v])
        src = inplace.get(v)
        if src is not None and src in owner and sizes[src] == sizes[v] and uses.get(src) == first \
                and owner[src].last == first:
            b = owner[src]
            b.values.append(v)
            b.last = last
            owner[v] = b
            done_inplace.append((src, v))
            continue
        b = Buffer([v], _align(sizes[v]), first, last)
        buffers.append(b)
        owner[v] = b
    _assign_offsets(buffers)
    n_steps = max([b.last for b in buffers], default=-1) + 1
    live = [0] * n_steps
    for b in buffers:
        for s in range(b.first, b.last + 1):
            live[s] += b.nbytes
    return MemoryPlan({v: owner[v].offset for v in sizes}, dict(sizes),
                      max((b.offset + b.nbytes for b in buffers), default=0),
                      sum(_align(n) for n in sizes.values()), max(live, default=0), done_inplace)


def _assign_offsets(buffers: list[Buffer]) -> None:
    placed: list[Buffer] = []
    for b in sorted(buffers, key=lambda b: (-b.nbytes, b.first)):
        busy = sorted((p.offset, p.offset + p.nbytes) for p in placed if p.first <= b.last and b.first <= p.last)
        best, best_gap, at = None, None, 0
        for lo, hi in busy:
            gap = lo - at
            if gap >= b.nbytes and (best_gap is None or gap < best_gap):
                best, best_gap = at, gap
            at = max(at, hi)
        b.offset = best if best is not None else at
        placed.append(b)

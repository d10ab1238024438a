"""Symbolic dims: sympy symbols with declared ranges, and binding them to sizes.

A dim left symbolic by the model (`batch`, `N`) becomes `sympy.Symbol(name,
integer=True, positive=True)`; its range defaults to [1, inf) until declared.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import sympy

from ir.errors import ShapeError

Dim = Union[int, sympy.Expr]
Shape = tuple  # of Dim

UNBOUNDED = 2**31 - 1


@dataclass(frozen=True)
class DimRange:
    name: str
    lo: int = 1
    hi: int = UNBOUNDED

    def check(self, value: int, where: str = "") -> None:
        if not (self.lo <= value <= self.hi):
            hi = "inf" if self.hi >= UNBOUNDED else str(self.hi)
            raise ShapeError(f"{where}dim '{self.name}' = {value} is outside its declared range [{self.lo}, {hi}]")

    def __str__(self) -> str:
        hi = "inf" if self.hi >= UNBOUNDED else str(self.hi)
        return f"{self.name} in [{self.lo}, {hi}]"


def symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, positive=True)


def simplify_dim(d) -> Dim:
    if isinstance(d, sympy.Expr):
        d = sympy.simplify(d)
        if d.is_Integer:
            return int(d)
        return d
    return int(d)


def is_static(shape: Shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def free_dims(shape: Shape) -> set[str]:
    names: set[str] = set()
    for d in shape:
        if isinstance(d, sympy.Expr):
            names |= {s.name for s in d.free_symbols}
    return names


def bind(shape: Shape, sizes: dict[str, int]) -> tuple[int, ...]:
    """Evaluate a symbolic shape at concrete dim sizes."""
    out = []
    for d in shape:
        if isinstance(d, sympy.Expr):
            v = d.subs({symbol(k): v for k, v in sizes.items()})
            if not v.is_Integer:
                raise ShapeError(f"shape {format_shape(shape)} cannot be evaluated: unbound dims {sorted(free_dims((v,)))}")
            out.append(int(v))
        else:
            out.append(int(d))
    return tuple(out)


def format_shape(shape: Shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def parse_dim_ranges(specs: list[str] | None) -> dict[str, DimRange]:
    """Parse `--dim batch=1:64` flags."""
    out = {}
    for spec in specs or []:
        try:
            name, rng = spec.split("=")
            lo, hi = rng.split(":")
            out[name] = DimRange(name, int(lo), int(hi))
        except ValueError:
            raise ShapeError(f"bad --dim '{spec}': expected NAME=LO:HI, e.g. batch=1:64") from None
        if out[name].lo < 1 or out[name].hi < out[name].lo:
            raise ShapeError(f"bad --dim '{spec}': need 1 <= LO <= HI")
    return out


def parse_shape_points(specs: list[str] | None) -> dict[str, list[int]]:
    """Parse `--shape batch=1,8,32` flags: the sizes to tune for."""
    out = {}
    for spec in specs or []:
        try:
            name, vals = spec.split("=")
            out[name] = [int(v) for v in vals.split(",")]
        except ValueError:
            raise ShapeError(f"bad --shape '{spec}': expected NAME=V1,V2,..., e.g. batch=1,8,32") from None
        if any(v < 1 for v in out[name]):
            raise ShapeError(f"bad --shape '{spec}': sizes must be >= 1")
    return out

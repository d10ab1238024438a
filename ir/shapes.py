"""Symbolic dims: sympy symbols with declared ranges, and binding them to sizes.

A dim left symbolic by the model (`batch`, `N`) becomes `sympy.Symbol(name,
integer=True, positive=True)`; its range defaults to [1, inf) until declared.

Expressions are kept in one cheap canonical form (`simplify_dim`): sympy's automatic
form after `expand`, plus a few cached rules for the floor/ceiling of conv and pool
output sizes. No `sympy.simplify` (40 ms a dim: minutes on a real model).

A *runtime dim* (`runtime_symbol`) is one nothing binds from the graph's inputs: an
output dim of an op without a shape function, or a data-dependent one (NonZero). It is
known once the op has run at concrete shapes; until then `bind` raises
`UnboundDimsError`, and the executor runs such steps with the actual arrays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Union

import numpy as np
import sympy

from ir.errors import ShapeError

Dim = Union[int, sympy.Expr]
Shape = tuple  # of Dim

UNBOUNDED = 2**31 - 1
MAX_DIM = 2**31               # a bound dim above this is a misread model, never a real size
MAX_TENSOR_BYTES = 2**34      # ... and so is a tensor above 16 GiB
TO_THE_END = 2**29            # Slice bounds this large (1e9, INT32_MAX, INT64_MAX) mean "to the end"
RUNTIME_PREFIX = "rt_"        # names of runtime dims


class UnboundDimsError(ShapeError):
    """A shape holds dims that are known only once the graph runs (runtime dims)."""


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


@lru_cache(maxsize=None)
def symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, positive=True)


@lru_cache(maxsize=None)
def runtime_symbol(name: str) -> sympy.Symbol:
    """A runtime dim (may be 0: NonZero of an all-zero tensor)."""
    return sympy.Symbol(name if name.startswith(RUNTIME_PREFIX) else RUNTIME_PREFIX + name,
                        integer=True, nonnegative=True)


def is_runtime_dim(name: str) -> bool:
    return name.startswith(RUNTIME_PREFIX)


# -- canonical form ---------------------------------------------------------------------
def _integer_terms(a):
    """(const, [(int coeff, integer-valued monomial)]) of an integer-coefficient polynomial, or None."""
    const, terms = 0, []
    for t in sympy.Add.make_args(a):
        c, m = t.as_coeff_Mul()
        if not c.is_Integer:
            return None
        if m == 1:
            const += int(c)
        else:
            terms.append((int(c), m))
    return const, terms


@lru_cache(maxsize=65536)
def _floor_div(a, n: int):
    """floor(a / n) for an integer-valued polynomial a, built flat (never floor(floor(...)/n)):
    whole multiples of n leave the floor, and floor((floor(p/m) + r)/n) = floor((p + r m)/(m n))."""
    split = _integer_terms(a)
    if split is None:
        return sympy.floor(a / n)
    const, terms = split
    whole = sum((c // n) * m for c, m in terms) + const // n
    rest = [(c % n, m) for c, m in terms if c % n]
    r0 = const % n
    whole = sympy.expand(whole)
    if not rest:
        return whole
    if len(rest) == 1 and rest[0][0] == 1 and isinstance(rest[0][1], sympy.floor):
        inner = rest[0][1].args[0]
        den = _denominator(inner)
        p = sympy.expand(inner * den)
        if _integer_terms(p) is not None:
            return whole + _floor_div(sympy.expand(p + r0 * den), den * n)
    frac = sympy.Add(*[sympy.Rational(c, n) * m for c, m in rest]) + sympy.Rational(r0, n)
    return whole + sympy.floor(frac, evaluate=False)  # already reduced: skip sympy's slow eval


def _denominator(arg) -> int:
    n = 1
    for t in sympy.Add.make_args(arg):
        c = t.as_coeff_Mul()[0]
        if c.is_Rational:
            n = math.lcm(n, int(c.q))
    return n


def floor_div(a: Dim, n: int) -> Dim:
    """floor(a / n), a a dim and n a positive int (conv/pool output sizes); cached."""
    if isinstance(a, int):
        return a // n
    r = _floor_div(simplify_dim(a), int(n))
    return int(r) if r.is_Integer else r


def ceil_div(a: Dim, n: int) -> Dim:
    if isinstance(a, int):
        return -(-a // n)
    return floor_div(a + (n - 1), n)


def _canon_floor(e):
    """floor(p/n) and ceiling(p/n) in the one flat form floor_div builds."""
    arg = e.args[0]
    n = _denominator(arg)
    p = sympy.expand(arg * n)
    if _integer_terms(p) is None:
        return e
    return _floor_div(p, n) if isinstance(e, sympy.floor) else _floor_div(sympy.expand(p + n - 1), n)


@lru_cache(maxsize=65536)
def _dim_max(a, b):
    args = []
    for x in (a, b):
        args += list(x.args) if isinstance(x, sympy.Max) else [x]
    args = list(dict.fromkeys(args))
    # Max(S, Min(S, 1024)) = S: a Min holding another argument never wins
    args = [x for x in args if not (isinstance(x, sympy.Min) and any(y in x.args for y in args if y is not x))]
    if len(args) == 1:
        return args[0]
    return sympy.Max(*sorted(args, key=_expr_str), evaluate=False)  # sympy's eval: 15 ms a call


def dim_max(a: Dim, b: Dim) -> Dim:
    """Max of two dims (what broadcasting two symbols gives), cheap and cached."""
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if isinstance(a, int) or isinstance(b, int):
        return simplify_dim(sympy.Max(a, b))
    return _dim_max(a, b)


def _rewrite(e):
    if e.is_Atom:
        return e
    args = tuple(_rewrite(a) for a in e.args)
    if args != e.args:
        e = e.func(*args)
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        e = _canon_floor(e)
    return e


@lru_cache(maxsize=65536)
def _canonical(d: sympy.Expr):
    e = sympy.expand(d, deep=not d.has(sympy.Max, sympy.Min))  # rebuilding a Max re-runs its slow eval
    if e.has(sympy.floor, sympy.ceiling):
        e = sympy.expand(_rewrite(e))
    return int(e) if e.is_Integer else e


def simplify_dim(d) -> Dim:
    """The canonical form of a dim (int, or a sympy expression); cached, cheap."""
    if isinstance(d, sympy.Expr):
        return _canonical(d)
    if isinstance(d, (float, np.floating)) and not float(d).is_integer():
        raise ShapeError(f"dim {d} is not a whole number")
    return int(d)


canonical = simplify_dim


def dims_equal(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return simplify_dim(a - b) == 0


def is_static(shape: Shape) -> bool:
    return all(isinstance(d, int) for d in shape)


@lru_cache(maxsize=65536)
def _symbols(d: sympy.Expr) -> tuple:
    return tuple(sorted(d.free_symbols, key=lambda s: s.name))


def free_dims(shape: Shape) -> set[str]:
    names: set[str] = set()
    for d in shape:
        if isinstance(d, sympy.Expr):
            names |= {s.name for s in _symbols(d)}
    return names


@lru_cache(maxsize=262144)
def _evaluate(d: sympy.Expr, values: tuple):
    v = d.xreplace({s: sympy.Integer(x) for s, x in zip(_symbols(d), values)})
    return int(v) if v.is_Integer else None


def bind_dim(d, sizes: dict[str, int], shape: Shape | None = None) -> int:
    if not isinstance(d, sympy.Expr):
        return int(d)
    syms = _symbols(d)
    missing = [s.name for s in syms if s.name not in sizes]
    if missing:
        raise UnboundDimsError(f"shape {format_shape(shape if shape is not None else (d,))} cannot be evaluated: "
                               f"unbound dims {missing}")
    v = _evaluate(d, tuple(int(sizes[s.name]) for s in syms))
    if v is None:
        raise ShapeError(f"shape {format_shape(shape if shape is not None else (d,))} is not whole at {sizes}")
    return v


def bind(shape: Shape, sizes: dict[str, int]) -> tuple[int, ...]:
    """Evaluate a symbolic shape at concrete dim sizes (cached per expression and sizes)."""
    return tuple(bind_dim(d, sizes, shape) for d in shape)


def unify(shape: Shape, concrete, sizes: dict[str, int], where: str = "") -> dict[str, int]:
    """Bind the runtime dims of `shape` that stand alone on an axis from an array's actual
    shape (`concrete`) into `sizes` (in place, also returned); ShapeError on a mismatch."""
    concrete = tuple(int(c) for c in concrete)
    if len(shape) != len(concrete):
        raise ShapeError(f"{where}expected rank {len(shape)} {format_shape(shape)}, got shape {list(concrete)}")
    for d, c in zip(shape, concrete):
        if isinstance(d, sympy.Symbol) and d.name not in sizes:
            sizes[d.name] = c
    for axis, (d, c) in enumerate(zip(shape, concrete)):
        try:
            v = bind_dim(d, sizes, shape)
        except UnboundDimsError:
            continue  # a compound expression of a dim no axis binds: not checkable here
        if v != c:
            raise ShapeError(f"{where}axis {axis} is {c} but its shape {format_shape(shape)} says {v} at {sizes}")
    return sizes


def check_size(shape: tuple, dtype: str, where: str, sym: Shape | None = None) -> None:
    """The guard against misread dims: a dim or a tensor no real model has is an error
    naming the value, never an allocation attempt (a batch read as 1e9 asked for 1.85 PiB)."""
    def which():
        if sym is None:
            return ""
        bad = [f"axis {k} = {s}" for k, (v, s) in enumerate(zip(shape, sym)) if v > MAX_DIM or v < 0]
        if not bad:
            k = int(np.argmax(shape))
            bad = [f"largest dim axis {k} = {sym[k]}"]
        return " (" + ", ".join(bad) + ")"
    for v in shape:
        if v < 0 or v > MAX_DIM:
            raise ShapeError(f"{where}: shape {list(shape)}{which()} has a dim outside [0, 2**31]; "
                             "a dim of the model was misread or a --shape is wrong")
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        itemsize = 8
    nbytes = math.prod(shape) * itemsize
    if nbytes > MAX_TENSOR_BYTES:
        raise ShapeError(f"{where}: shape {list(shape)}{which()} would need {nbytes / 2**30:.1f} GiB "
                         f"(more than 2**34 bytes); a dim of the model was misread or a --shape is wrong")


@lru_cache(maxsize=65536)
def _expr_str(d) -> str:
    return str(d)


def dim_str(d) -> str:
    """str() of a dim, cached (sympy's printer orders terms: 1 ms for a floor expression)."""
    return str(d) if isinstance(d, int) else _expr_str(d)


def format_shape(shape: Shape) -> str:
    return "[" + ", ".join(dim_str(d) for d in shape) + "]"


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

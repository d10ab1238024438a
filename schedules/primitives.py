"""Schedule primitives: rewrites of a loop nest (a tuple of statements) into another.

Each primitive names loops by their variable and returns a new statement tuple;
the IR is immutable, so a schedule is a replayable list of calls. Templates use
them where that reads better than writing the final nest by hand:

- `split(stmts, var, factor, outer, inner, tail)`: var -> outer * factor + inner, with the
  remainder handled by a bounded inner loop (`tail="min"`) or a guard (`tail="guard"`,
  needed when the inner loop is then unrolled: unrolled loops have constant bounds).
- `reorder(stmts, outer, inner)`: swap two perfectly nested loops.
- `fuse(stmts, outer, inner, fused)`: two perfectly nested loops from 0 -> one loop.
- `parallel(stmts, var, mode)`: copy t of T takes its contiguous share (copies run by
  the cpu backend's `parallel_for`) or `prange`.
- `unroll(stmts, var)`: codegen repeats the body with the variable replaced by constants.
- `cache_write(stmts, var, target, acc)`: accumulate `target` in a local scalar
  across loop `var`, store once after it.
- `compute_inline(stmts, array, epilogue)`: every store to `array[...]` runs the
  elementwise epilogue first (compute_at of an epilogue at its producer's store).
- `compute_at(stmts, var, new, where)`: put statements at the start or end of loop `var`'s body.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Callable

from schedules.loopnest import PARALLEL, UNROLLED, Assign, For, If

# epilogue(value expr, store target) -> (assignments [(name, expr)], result expr)
EpilogueFn = Callable[[str, str], tuple]


class ScheduleError(ValueError):
    """A primitive applied where it does not fit (no such loop, not perfectly nested...)."""


def _map(stmts, var: str, fn) -> tuple:
    """Replace the loop over `var` (anywhere in the tree) by fn(loop) -> tuple of statements."""
    out, found = [], False

    def walk(ss):
        nonlocal found
        res = []
        for s in ss:
            if isinstance(s, For) and s.var == var:
                found = True
                res.extend(fn(s))
            elif isinstance(s, For):
                res.append(replace(s, body=walk(s.body)))
            elif isinstance(s, If):
                res.append(replace(s, then=walk(s.then), orelse=walk(s.orelse)))
            else:
                res.append(s)
        return tuple(res)

    out = walk(stmts)
    if not found:
        raise ScheduleError(f"no loop over '{var}'")
    return out


def find(stmts, var: str) -> For:
    for s in stmts:
        if isinstance(s, For):
            if s.var == var:
                return s
            try:
                return find(s.body, var)
            except ScheduleError:
                pass
        elif isinstance(s, If):
            for branch in (s.then, s.orelse):
                try:
                    return find(branch, var)
                except ScheduleError:
                    pass
    raise ScheduleError(f"no loop over '{var}'")


def split(stmts, var: str, factor: int, outer: str | None = None, inner: str | None = None,
          tail: str = "min") -> tuple:
    outer, inner = outer or f"{var}_o", inner or f"{var}_i"

    def rewrite(loop: For):
        if loop.step != "1":
            raise ScheduleError(f"split of '{var}': only unit-step loops")
        n = f"({loop.stop} - {loop.start})"
        base = f"{loop.start} + {outer} * {factor}"
        bind = Assign(var, f"{base} + {inner}")
        if tail == "min":
            inner_loop = For(inner, "0", f"min({factor}, {loop.stop} - ({base}))", (bind,) + loop.body)
        elif tail == "guard":
            inner_loop = For(inner, "0", str(factor), (bind, If(f"{var} < {loop.stop}", loop.body)))
        else:
            raise ScheduleError(f"split tail must be 'min' or 'guard', not {tail!r}")
        return (For(outer, "0", f"({n} + {factor - 1}) // {factor}", (inner_loop,), loop.kind),)

    return _map(stmts, var, rewrite)


def _only_loop(loop: For) -> For:
    if len(loop.body) != 1 or not isinstance(loop.body[0], For):
        raise ScheduleError(f"loop '{loop.var}' is not perfectly nested")
    return loop.body[0]


def reorder(stmts, outer: str, inner: str) -> tuple:
    def rewrite(loop: For):
        child = _only_loop(loop)
        if child.var != inner:
            raise ScheduleError(f"'{inner}' is not directly inside '{outer}'")
        if re.search(rf"\b{outer}\b", child.start + child.stop + child.step):
            raise ScheduleError(f"bounds of '{inner}' depend on '{outer}'")
        return (replace(child, body=(replace(loop, body=child.body),)),)

    return _map(stmts, outer, rewrite)


def fuse(stmts, outer: str, inner: str, fused: str | None = None) -> tuple:
    fused = fused or f"{outer}_{inner}"

    def rewrite(loop: For):
        child = _only_loop(loop)
        if child.var != inner or "0" != loop.start or "0" != child.start or loop.step != "1" or child.step != "1":
            raise ScheduleError(f"fuse needs '{inner}' directly inside '{outer}', both from 0 with step 1")
        body = (Assign(outer, f"{fused} // ({child.stop})"), Assign(inner, f"{fused} % ({child.stop})")) + child.body
        return (For(fused, "0", f"({loop.stop}) * ({child.stop})", body, loop.kind),)

    return _map(stmts, outer, rewrite)


def parallel(stmts, var: str, mode: str = "threads", t: str = "t", T: str = "T") -> tuple:
    """mode="threads": copy t of T runs its contiguous share of the iterations (the function
    takes t and T; the backend runs its copies; see `loopnest.thread_share`);
    mode="prange": numba's prange (outermost loop of a parallel=True function)."""
    def rewrite(loop: For):
        if mode == "prange":
            return (replace(loop, kind=PARALLEL),)
        if loop.step != "1":
            raise ScheduleError(f"parallel '{var}': only unit-step loops")
        n = f"(({loop.stop}) - ({loop.start}))"
        return (replace(loop, start=f"{loop.start} + {t} * {n} // {T}", stop=f"{loop.start} + ({t} + 1) * {n} // {T}"),)

    return _map(stmts, var, rewrite)


def unroll(stmts, var: str) -> tuple:
    def rewrite(loop: For):
        try:
            int(loop.start), int(loop.stop), int(loop.step)
        except ValueError:
            raise ScheduleError(f"unroll '{var}': bounds must be constants, not {loop.start}..{loop.stop}") from None
        return (replace(loop, kind=UNROLLED),)

    return _map(stmts, var, rewrite)


def _rename_target(stmts, target: str, acc: str) -> tuple:
    out = []
    for s in stmts:
        if isinstance(s, Assign) and s.target == target:
            s = Assign(acc, s.value, s.op)
        elif isinstance(s, For):
            s = replace(s, body=_rename_target(s.body, target, acc))
        elif isinstance(s, If):
            s = replace(s, then=_rename_target(s.then, target, acc), orelse=_rename_target(s.orelse, target, acc))
        if isinstance(s, Assign):
            s = Assign(s.target, re.sub(re.escape(target), acc, s.value), s.op)
        out.append(s)
    return tuple(out)


def cache_write(stmts, var: str, target: str, acc: str, init: str | None = "np.float32(0.0)",
                op: str = "") -> tuple:
    """Inside loop `var`, `target` (e.g. "C[i, j]") becomes the local `acc`: `acc = init`
    (or a load of target when init is None) before the loop, `target op= acc` after it."""
    def rewrite(loop: For):
        first = Assign(acc, target if init is None else init)
        return (first, replace(loop, body=_rename_target(loop.body, target, acc)), Assign(target, acc, op))

    return _map(stmts, var, rewrite)


def compute_inline(stmts, array: str, epilogue: EpilogueFn, tmp: str = "v") -> tuple:
    """Every plain store `array[idx] = value` becomes `tmp = value; <epilogue>; array[idx] = result`."""
    out = []
    for s in stmts:
        if isinstance(s, Assign) and s.op == "" and s.target.startswith(array + "["):
            assigns, result = epilogue(tmp, s.target)
            out.append(Assign(tmp, s.value))
            out.extend(Assign(n, e) for n, e in assigns)
            out.append(Assign(s.target, result))
            continue
        if isinstance(s, For):
            s = replace(s, body=compute_inline(s.body, array, epilogue, tmp))
        elif isinstance(s, If):
            s = replace(s, then=compute_inline(s.then, array, epilogue, tmp),
                        orelse=compute_inline(s.orelse, array, epilogue, tmp))
        out.append(s)
    return tuple(out)


def compute_at(stmts, var: str, new: tuple, where: str = "end") -> tuple:
    def rewrite(loop: For):
        body = loop.body + tuple(new) if where == "end" else tuple(new) + loop.body
        return (replace(loop, body=body),)

    return _map(stmts, var, rewrite)

"""Loop-nest IR → Python source for numba. Pure text: no numba import here."""
from __future__ import annotations

import re

from schedules.loopnest import (PARALLEL, UNROLLED, Alloc, Assign, Call, Comment, For, Function, If,
                                LoopModule)

HEADER = "import math\nimport numpy as np\nfrom numba import njit, prange\n"


def _subst(text: str, var: str, value: int) -> str:
    return re.sub(rf"\b{re.escape(var)}\b", str(value), text)


def _substitute(stmt, var: str, value: int):
    if isinstance(stmt, For):
        return For(stmt.var, _subst(stmt.start, var, value), _subst(stmt.stop, var, value),
                   tuple(_substitute(s, var, value) for s in stmt.body), stmt.kind, _subst(stmt.step, var, value))
    if isinstance(stmt, Assign):
        return Assign(_subst(stmt.target, var, value), _subst(stmt.value, var, value), stmt.op)
    if isinstance(stmt, If):
        return If(_subst(stmt.cond, var, value), tuple(_substitute(s, var, value) for s in stmt.then),
                  tuple(_substitute(s, var, value) for s in stmt.orelse))
    if isinstance(stmt, Call):
        return Call(_subst(stmt.expr, var, value))
    if isinstance(stmt, Alloc):
        return Alloc(stmt.name, tuple(_subst(d, var, value) for d in stmt.shape), stmt.dtype, stmt.scope)
    return stmt


def _host_alloc(s: Alloc) -> str:
    return f"np.empty(({', '.join(s.shape)},), dtype=np.{s.dtype})"


def _emit(stmts, indent: int, out: list[str], alloc=_host_alloc) -> None:
    pad = "    " * indent
    for s in stmts:
        if isinstance(s, For):
            if s.kind == UNROLLED:
                start, stop = int(s.start), int(s.stop)  # unrolled loops need constant bounds
                for v in range(start, stop, int(s.step)):
                    _emit([_substitute(b, s.var, v) for b in s.body], indent, out, alloc)
                continue
            rng = "prange" if s.kind == PARALLEL else "range"
            step = "" if s.step == "1" else f", {s.step}"
            out.append(f"{pad}for {s.var} in {rng}({s.start}, {s.stop}{step}):")
            _emit(s.body or (Call("pass"),), indent + 1, out, alloc)
        elif isinstance(s, Assign):
            out.append(f"{pad}{s.target} {s.op}= {s.value}")
        elif isinstance(s, If):
            out.append(f"{pad}if {s.cond}:")
            _emit(s.then or (Call("pass"),), indent + 1, out, alloc)
            if s.orelse:
                out.append(f"{pad}else:")
                _emit(s.orelse, indent + 1, out, alloc)
        elif isinstance(s, Alloc):
            out.append(f"{pad}{s.name} = {alloc(s)}")
        elif isinstance(s, Call):
            out.append(f"{pad}{s.expr}")
        elif isinstance(s, Comment):
            out.append(f"{pad}# {s.text}")
        else:
            raise TypeError(f"unknown statement {s!r}")


def signature(fn: Function) -> str:
    return "void(" + ", ".join(p.type for p in fn.params) + ")"


def numba_decorator(fn: Function) -> str:
    """The `@njit(...)` line numba compiles `fn` with (explicit signature, cached)."""
    flags = "{" + ", ".join(repr(f) for f in sorted(fn.fastmath)) + "}" if fn.fastmath else "False"
    return (f'@njit("{signature(fn)}", cache=True, fastmath={flags}, parallel={fn.parallel}, nogil={fn.nogil}, '
            'error_model="numpy")')


def render_function(fn: Function, decorator=numba_decorator, alloc=_host_alloc) -> str:
    """`fn` as Python source; `decorator(fn)` is the line above the `def` ("" for none), so a
    backend that runs the code some other way (an interpreter, a GPU) renders the same body;
    `alloc(stmt)` is the expression that allocates an `Alloc` (GPUs: by its scope)."""
    line = decorator(fn)
    lines = ([line] if line else []) + [f"def {fn.name}({', '.join(p.name for p in fn.params)}):"]
    _emit(fn.body or (Call("pass"),), 1, lines, alloc)
    return "\n".join(lines) + "\n"


def render(module: LoopModule, banner: str = "", header: str = HEADER, decorator=numba_decorator,
           alloc=_host_alloc) -> str:
    """The module's source: banner comment, docstring, `header` (the imports the bodies
    use), then every function rendered with `decorator`."""
    parts = []
    if banner:
        parts.append("".join(f"# {line}\n" for line in banner.splitlines()))
    if module.doc:
        parts.append('"""' + module.doc + '"""\n')
    parts.append(header)
    for fn in module.functions:
        parts.append("\n\n" + render_function(fn, decorator, alloc))
    return "".join(parts)

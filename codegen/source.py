"""Loop-nest IR → Python source for numba. Pure text: no numba import here.

`render(..., lean=True)` (the CPU backend's source) also writes the text so that
numba's passes, whose cost grows with the statements they see, have less to do,
without changing what the code computes (experiments/bench_compile.md):
- a typed constant call repeated in a function (`np.float32(0.0)` for each of a
  register tile's accumulators: a global lookup, an attribute and a typed call
  each) is computed once at the top of the function and read from a local;
- a local 2-D buffer indexed by a constant row (`ct[2, 5] = c2_5`, a register
  tile's stores) is written through one row view per row (`ct_row2[5] = c2_5`):
  a 1-D store is about half the IR of a 2-D one.
"""
from __future__ import annotations

import re

from schedules.loopnest import (PARALLEL, UNROLLED, Alloc, Assign, Call, Comment, For, Function, If,
                                LoopModule)

HEADER = ("import math\nimport numpy as np\nfrom numba import njit, prange\n"
          "from codegen.numba_pipeline import LeanCompiler\nfrom codegen.checks import index_in\n")


def helper_imports(text: str) -> str:
    """Import lines for the compiled helpers that `text` calls (`codegen.vector_tile`'s
    intrinsics), each naming the helper's version: numba's cache does not track the helper's
    file, so a new version must change the source (hence its cache key). Imported only
    when used, so that other sources (and this module) stay free of numba."""
    names = ("tile_fma", "regroup_channels", "row_taps", "block_taps", "residual_rows", "plane_taps", "wino_in_tiles",
             "wino_out_tiles")
    used = [name for name in names if re.search(rf"\b{name}\(", text)]
    if not used:
        return ""
    from codegen.vector_tile import VERSION
    return f"from codegen.vector_tile import {', '.join(used)}  # vector_tile v{VERSION}\n"


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
            'error_model="numpy", no_cfunc_wrapper=True, pipeline_class=LeanCompiler)')


# np.<dtype>(<number literal or ±np.inf>): a typed constant, the same value wherever it is
_TYPED_CONST = re.compile(r"\bnp\.(?:float16|float32|float64|u?int(?:8|16|32|64))"
                          r"\((?:-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|np\.inf))\)")
MAX_ROW_VIEWS = 32   # rows of a local 2-D buffer written through views (a register tile has a few)


def _fresh(prefix: str, text: str) -> str:
    """`prefix`, with underscores added until no word of `text` starts with it."""
    while re.search(rf"\b{re.escape(prefix)}", text):
        prefix = "_" + prefix
    return prefix


def _hoist_constants(body: list[str], first: int) -> None:
    """Typed constants used more than once in `body[first:]` read from locals set at `first`."""
    text = "\n".join(body[first:])
    seen: dict[str, int] = {}
    for m in _TYPED_CONST.finditer(text):
        seen[m.group(0)] = seen.get(m.group(0), 0) + 1
    repeated = [c for c, n in seen.items() if n > 1]
    if not repeated:
        return
    prefix = _fresh("_k", text)
    names = {c: f"{prefix}{i}" for i, c in enumerate(repeated)}
    for i in range(first, len(body)):
        if "np." in body[i]:
            body[i] = _TYPED_CONST.sub(lambda m: names.get(m.group(0), m.group(0)), body[i])
    body[first:first] = [f"    {n} = {c}" for c, n in names.items()]


def _row_views(fn: Function, body: list[str], first: int, alloc) -> None:
    """Constant-row accesses `buf[r, ...]` of a local 2-D buffer allocated once at the top level
    of `fn` go through views `buf_row{r} = buf[r]` made right after its allocation."""
    for s in fn.body:
        if not (isinstance(s, Alloc) and len(s.shape) == 2 and s.shape[0].isdigit()
                and int(s.shape[0]) <= MAX_ROW_VIEWS):
            continue
        decl = f"    {s.name} = {alloc(s)}"
        assigned = re.compile(rf"^\s*{re.escape(s.name)}\s*=[^=]")
        where = [i for i in range(first, len(body)) if assigned.match(body[i])]
        if len(where) != 1 or body[where[0]] != decl:
            continue   # also assigned elsewhere: a view made here could be stale there
        at = where[0]
        access = re.compile(rf"\b{re.escape(s.name)}\[(\d+), ")
        rows = sorted({int(r) for line in body[at + 1:] for r in access.findall(line)})
        if not rows:
            continue
        prefix = _fresh(f"{s.name}_row", "\n".join(body[first:]))
        for i in range(at + 1, len(body)):
            body[i] = access.sub(lambda m: f"{prefix}{m.group(1)}[", body[i])
        body[at + 1:at + 1] = [f"    {prefix}{r} = {s.name}[{r}]" for r in rows]


def render_function(fn: Function, decorator=numba_decorator, alloc=_host_alloc, lean: bool = False) -> str:
    """`fn` as Python source; `decorator(fn)` is the line above the `def` ("" for none), so a
    backend that runs the code some other way (an interpreter, a GPU) renders the same body;
    `alloc(stmt)` is the expression that allocates an `Alloc` (GPUs: by its scope).
    `lean`: the text numba compiles faster (module docstring), same computation."""
    line = decorator(fn)
    lines = ([line] if line else []) + [f"def {fn.name}({', '.join(p.name for p in fn.params)}):"]
    first = len(lines)
    _emit(fn.body or (Call("pass"),), 1, lines, alloc)
    if lean:
        _row_views(fn, lines, first, alloc)
        _hoist_constants(lines, first)
    return "\n".join(lines) + "\n"


def render(module: LoopModule, banner: str = "", header: str = HEADER, decorator=numba_decorator,
           alloc=_host_alloc, lean: bool = False, helpers=helper_imports) -> str:
    """The module's source: banner comment, docstring, `header` (the imports the bodies
    use), then every function rendered with `decorator` (and `lean`, see `render_function`).
    `helpers(bodies)`: the import lines of the compiled helpers the bodies call (a backend
    that defines its own versions of them in `header` passes one that returns "")."""
    parts = []
    if banner:
        parts.append("".join(f"# {line}\n" for line in banner.splitlines()))
    if module.doc:
        parts.append('"""' + module.doc + '"""\n')
    bodies = ["\n\n" + render_function(fn, decorator, alloc, lean) for fn in module.functions]
    parts.append(header + helpers("".join(bodies)))
    return "".join(parts + bodies)

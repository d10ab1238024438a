"""The MR x NR register tile, written once for every GEMM-like template (dense, conv2d,
batch_matmul).

The tile is MR*NR scalar locals `c{r}_{c}`, fully unrolled: per k, MR loads of A
(`a{r}`), NR loads of B (`b{c}`) and MR*NR multiply-adds `c{r}_{c} += a{r} * b{c}`.
LLVM's SLP pass turns exactly this pattern into vector FMAs along NR (FACTS.md);
an array accumulator or a loop over the tile would stay scalar. Two ways to store:
`register_tile` spills the accumulators into a small array `ct[r, c]` and stores from
it in a compact loop over the tile's rows (conv2d; it stays scalar code);
`register_tile_in_place` (dense, batch_matmul) stores a full tile straight from the
accumulators at unsigned indices (vector moves), with a short epilogue applied in
registers, and keeps the `ct` loop for tiles cut by the output's edges.

What differs between templates is passed in: how one A and one B element is read
at k (`a_load(r)`, `b_load(c)`: expressions), how the k loops wrap the body
(`k_loops(body)`: one `For` over k, or conv's loops over channels and the kernel
window), and the body of the store loop over r (`store`, which reads `ct[r, c]`).

The same tile can instead be one call of `codegen.vector_tile.tile_fma` (`vector_tile`,
knob value "vec<lanes>" of `tile_codes`): the k loop as LLVM vector IR, which spills
less and compiles in a fraction of the time (experiments/dense/results.md).
"""
from __future__ import annotations

from typing import Callable

from schedules.loopnest import Assign, Call, Comment, For, If

F0 = "np.float32(0.0)"


def vector_shape(target=None) -> tuple[int, int]:
    """(float32 lanes per vector, vector registers) of the target a kernel is built for:
    what register tiles are sized by. `target` is a `Target` or its description (a dict,
    as records carry it); None means this machine's CPU (the CPU templates' code runs there,
    a GPU model's CPU fallback included).
    Targets that do not say (other backends, records from before) get AVX2's (8, 16)."""
    if target is None:
        from codegen.target import host_target
        target = host_target("cpu")
    bits = target.get("vector_bits") or 256
    return max(int(bits) // 32, 1), int(target.get("vector_registers") or 16)


def pick_tiles(tables: dict, lanes: int, registers: int) -> tuple:
    """The entry of `tables` ({(lanes, registers): tiles}) for this vector shape, or the
    nearest one (same lanes first, then fewer registers)."""
    if (lanes, registers) in tables:
        return tables[(lanes, registers)]
    key = min(tables, key=lambda lr: (abs(lr[0] - lanes), lr[1] > registers, abs(lr[1] - registers)))
    return tables[key]


def k_range(start: str, stop: str, var: str = "k") -> Callable[[tuple], tuple]:
    """The common `k_loops`: one loop `for k in range(start, stop)` around the body."""
    return lambda body: (For(var, start, stop, body),)


def _accumulators(mr: int, nr: int) -> list:
    return [[f"c{r}_{c}" for c in range(nr)] for r in range(mr)]


def _k_body(mr: int, nr: int, a_load: Callable[[int], str], b_load: Callable[[int], str]) -> tuple:
    acc = _accumulators(mr, nr)
    return tuple(Assign(f"a{r}", a_load(r)) for r in range(mr)) \
        + tuple(Assign(f"b{c}", b_load(c)) for c in range(nr)) \
        + tuple(Assign(acc[r][c], f"a{r} * b{c}", "+") for r in range(mr) for c in range(nr))


def register_tile(mr: int, nr: int, a_load: Callable[[int], str], b_load: Callable[[int], str],
                  k_loops: Callable[[tuple], tuple], store: tuple, comment: str | None = None,
                  tile: str = "ct") -> tuple:
    """Statements: zero the accumulators, accumulate over k, spill to `tile[r, c]`,
    then `for r in range(mr): store`. The caller allocates `tile` (MR x NR, once per
    function) and defines whatever `a_load`, `b_load` and `store` read."""
    acc = _accumulators(mr, nr)
    return tuple(Assign(acc[r][c], F0) for r in range(mr) for c in range(nr)) \
        + ((Comment(comment),) if comment else ()) \
        + tuple(k_loops(_k_body(mr, nr, a_load, b_load))) \
        + tuple(Assign(f"{tile}[{r}, {c}]", acc[r][c]) for r in range(mr) for c in range(nr)) \
        + (For("r", "0", str(mr), tuple(store)),)


def unsigned(index: str) -> str:
    """`index` cast to uint64: numba indexes with it as it is, without the select that wraps
    a negative index around (LLVM cannot prove most tile indices non-negative, and with
    the selects neither strength-reduces the addressing nor sees that a row's elements are
    contiguous, which SLP needs). Slicing a view per tile instead costs an NRT incref and
    decref call each (~13 per 6x16 tile, measured 25 % of a K block of 256)."""
    return f"np.uint64({index})"


# epilogues up to this many flops per element (bias, scale, mask, residual, ReLU) are applied
# to the accumulators, unrolled (MR x NR copies of the code); longer ones (GELU, erf: 8-10)
# run as a loop over the stored tile, so compile time does not grow with them
REGISTER_EPILOGUE_FLOPS = 4


def register_epilogue(epi, mr: int, nr: int, row: Callable[[int], str], col0: str,
                      extra_rows: Callable[[int], dict] | None = None):
    """finish(r, c) -> statements applying the fused epilogue `epi` to the accumulator
    c{r}_{c} in place, or None when the epilogue is too long (REGISTER_EPILOGUE_FLOPS) or
    reads a channel-indexed extra. `row(r)`: the output row of tile row r, as the extras
    index it; `extra_rows(r)`: extra param -> its own row of tile row r, where it differs
    (`Epilogue.emit`); `col0`: the tile's first column. Extras are read at unsigned indices, so
    that those read along N are contiguous loads for SLP."""
    from ir.ops import OPS
    if not epi.steps or sum(OPS[op["op"]].flops_per_elem for op, _ in epi.steps) > REGISTER_EPILOGUE_FLOPS \
            or any(e.mode == "chan" for e in epi.extras):
        return None

    def finish(r: int, c: int) -> tuple:
        rows = {p: unsigned(x) for p, x in extra_rows(r).items()} if extra_rows else None
        assigns, result = epi.emit(f"c{r}_{c}", unsigned(row(r)), unsigned(f"{col0} + {c}"), f"e{r}_{c}", rows=rows)
        return tuple(Assign(n, x) for n, x in assigns) + (Assign(f"c{r}_{c}", result),)
    return finish


def register_tile_in_place(mr: int, nr: int, a_load: Callable[[int], str], b_load: Callable[[int], str],
                           k_loops: Callable[[tuple], tuple], out: str, row0: str, col0: str,
                           full: str | None = None, accumulate: str | None = None, edge_store: tuple = (),
                           after: tuple = (), epilogue=None, finish_when: str | None = None,
                           comment: str | None = None, tile: str = "ct") -> tuple:
    """The register tile, stored straight from its accumulators where it lies wholly
    inside the output.

    The tile's corner is (`row0`, `col0`) of the 2-D array `out`. Where `full` holds (None:
    every tile the caller runs is full) the accumulators are stored to `out` there, else to
    the scratch tile `tile` (MR x NR, allocated by the caller, of out's type), through
    `dst[di + r, dj + c]` at unsigned indices (`unsigned`): contiguous along c, so LLVM's
    SLP pass turns each row into NR / lanes vector moves. (Storing the tile to the output
    in a loop stays scalar: LLVM cannot tell the tile and the output apart, nor vectorize
    the loop once it has unrolled it.)

    Where `full` and `accumulate` hold (None: never) the accumulators start from the
    output tile, else from 0. On a full tile, where `finish_when` holds (None: always),
    `epilogue` (`register_epilogue`'s finish, or None) is applied to the accumulators
    before the store, and `after` (e.g. a loop applying a long epilogue to the stored
    tile) runs after it. A tile cut by the output's edges then runs
    `for r in range(mr): edge_store` (which reads `tile` and writes what lies inside)."""
    acc = _accumulators(mr, nr)
    rows = range(mr)
    at = (lambda r, c: f"{out}[{unsigned(f'{row0} + {r}')}, {unsigned(f'{col0} + {c}')}]")
    zero = tuple(Assign(acc[r][c], F0) for r in rows for c in range(nr))
    load = tuple(Assign(acc[r][c], at(r, c)) for r in rows for c in range(nr))
    init = zero if accumulate is None else \
        (If(accumulate if full is None else f"({full}) and ({accumulate})", load, zero),)
    finish = ()
    if epilogue is not None:
        finish = tuple(a for r in rows for c in range(nr) for a in epilogue(r, c))
        finish = (If(finish_when, finish),) if finish_when is not None else finish
    store = finish + tuple(Assign(at(r, c), acc[r][c]) for r in rows for c in range(nr)) + tuple(after)
    if full is not None:   # separate stores: one array for both (a phi of out and the tile) made LLVM spill in the k loop
        spill = tuple(Assign(f"{tile}[{r}, {c}]", acc[r][c]) for r in rows for c in range(nr)) \
            + (For("r", "0", str(mr), tuple(edge_store)),)
        store = (If(full, store, spill),)
    return init + ((Comment(comment),) if comment else ()) \
        + tuple(k_loops(_k_body(mr, nr, a_load, b_load))) + store


def tile_codes(target=None) -> tuple[str, str]:
    """How the register tile's code can be written, for `target` (as `vector_shape`): "slp" (the
    scalar locals above, vectorized by LLVM's SLP pass) or "vec<lanes>" (`codegen.vector_tile`:
    the k loop as explicit LLVM vector IR of the target's float lanes, e.g. "vec8" on AVX2,
    "vec16" on AVX-512). The lanes are in the value so that lowering needs no target."""
    return ("slp", f"vec{vector_shape(target)[0]}")


def tile_lanes(code: str, nr: int) -> int | None:
    """The vector lanes of tile code `code` for an NR-column tile (halved until they divide NR),
    or None for "slp"."""
    if code == "slp":
        return None
    lanes = int(code.removeprefix("vec"))
    while nr % lanes:
        lanes //= 2
    return lanes


def vector_tile(a: str, a_offsets: list[str] | str, a_kstride: str, b: str, b_offset: str, b_kstride: str, n_k: str,
                out: str, c_offset: str, c_rowstride: str, accumulate: str, nr: int, lanes: int) -> Call:
    """The statement calling `codegen.vector_tile.tile_fma` (see there): an MR x NR tile
    (MR = len(a_offsets)) of `a`'s rows times `b` over n_k steps of k, stored or added to
    `out` (all arrays); `a_offsets`: one expression per row, or the name of a tuple of them.
    Offsets and strides are int64 element counts (not `unsigned`: uint64 * int64 is a float
    in numba)."""
    rows = a_offsets if isinstance(a_offsets, str) else f"({', '.join(a_offsets)},)"
    return Call(f"tile_fma({a}, {rows}, {a_kstride}, {b}, {b_offset}, {b_kstride}, {n_k}, "
                f"{out}, {c_offset}, {c_rowstride}, {accumulate}, {nr}, {lanes})")


def vector_tile_shape(expr: str) -> tuple[int, int] | None:
    """(MR, NR) of a `vector_tile` call with its row offsets written out (`expr` of the
    statement), else None: what the cost model's loop-nest features count for such a tile,
    as they count the accumulators of a scalar one."""
    if not expr.startswith("tile_fma(") or "(" not in expr[9:]:
        return None
    rest, depth, commas = expr[expr.index("(", 9) + 1:], 1, 0
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        commas += ch == "," and depth == 1
        if depth == 0:
            break
    args = [a.strip() for a in expr.rstrip(")").rsplit(",", 2)[1:]]
    return (commas, int(args[0])) if commas and args[0].isdigit() else None

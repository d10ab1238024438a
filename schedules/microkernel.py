"""The MR x NR register tile, written once for every GEMM-like template (dense, conv2d,
batch_matmul).

The tile is MR*NR scalar locals `c{r}_{c}`, fully unrolled: per k, MR loads of A
(`a{r}`), NR loads of B (`b{c}`) and MR*NR multiply-adds `c{r}_{c} += a{r} * b{c}`.
LLVM's SLP pass turns exactly this pattern into vector FMAs along NR (FACTS.md);
an array accumulator or a loop over the tile would stay scalar. After the k loops
the accumulators are spilled into a small array `ct[r, c]` so that the store (with
its bounds checks and fused epilogue) is a compact loop over the tile's rows
instead of MR*NR unrolled copies.

What differs between templates is passed in: how one A and one B element is read
at k (`a_load(r)`, `b_load(c)`: expressions), how the k loops wrap the body
(`k_loops(body)`: one `For` over k, or conv's loops over channels and the kernel
window), and the body of the store loop over r (`store`, which reads `ct[r, c]`).
"""
from __future__ import annotations

from typing import Callable

from schedules.loopnest import Assign, Comment, For

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


def register_tile(mr: int, nr: int, a_load: Callable[[int], str], b_load: Callable[[int], str],
                  k_loops: Callable[[tuple], tuple], store: tuple, comment: str | None = None,
                  tile: str = "ct") -> tuple:
    """Statements: zero the accumulators, accumulate over k, spill to `tile[r, c]`,
    then `for r in range(mr): store`. The caller allocates `tile` (MR x NR, once per
    function) and defines whatever `a_load`, `b_load` and `store` read."""
    acc = [[f"c{r}_{c}" for c in range(nr)] for r in range(mr)]
    k_body = tuple(Assign(f"a{r}", a_load(r)) for r in range(mr)) \
        + tuple(Assign(f"b{c}", b_load(c)) for c in range(nr)) \
        + tuple(Assign(acc[r][c], f"a{r} * b{c}", "+") for r in range(mr) for c in range(nr))
    return tuple(Assign(acc[r][c], F0) for r in range(mr) for c in range(nr)) \
        + ((Comment(comment),) if comment else ()) \
        + tuple(k_loops(k_body)) \
        + tuple(Assign(f"{tile}[{r}, {c}]", acc[r][c]) for r in range(mr) for c in range(nr)) \
        + (For("r", "0", str(mr), tuple(store)),)

"""Batched MatMul of two activations: C[b..., M, N] = A[b..., M, K] @ B[b..., K, N]
(NumPy broadcasting of the batch dims, e.g. attention scores [b,h,s,d] @ [b,h,d,s]),
with a fused elementwise epilogue (scale, mask add...).

Like dense, full MR x NR tiles run a register tile of scalar locals (SLP-vectorized
along N, where B rows are contiguous) or, with `tile_code` "vec<lanes>", as LLVM vector
IR (`codegen.vector_tile`); neither operand is constant, so nothing is
packed: A is read in place, B rows directly. Tiles cut by M or N run the same
register tile (A's rows past M read row M - 1; B's last partial panel from a zero-padded
copy made once per work item) into a scratch tile, stored where it lies inside the output. Batch-broadcast index maps are tables computed while lowering.
Knobs: `regtile` (code); row tiles per work item `MB` and threading (run-time).
"""
from __future__ import annotations

import numpy as np

from ir.workload import Workload
from schedules.epilogue import Epilogue, parse_epilogue
from schedules.launch import Call, In, Launch, Out, Scalar, Table
from schedules.loopnest import Alloc, Assign, For, Function, If, LoopModule, Param, thread_share
from schedules.microkernel import (F0, pick_tiles, register_epilogue, register_tile_in_place,
                                   tile_codes, tile_lanes, unsigned, vector_shape, vector_tile)
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Lowered, Template

# per (float lanes, vector registers) of the target, as dense's; NR divides the attention
# widths (head dim 64, sequence 128); other widths (ViT's 197) end in an edge tile
REG_TILES = {
    (8, 16): ("2x16", "4x16", "4x32", "8x16"),                  # AVX2
    (8, 32): ("2x16", "4x16", "4x32", "8x16", "12x16"),         # AVX-512, 256-bit vectors kept
    (16, 32): ("2x16", "4x16", "8x16", "4x32", "8x32", "6x32"),  # AVX-512
    (4, 16): ("2x16", "4x16", "4x8", "8x8"),                    # 128-bit vectors
}
DEFAULT_TILE = {(8, 16): "4x16", (8, 32): "8x16", (16, 32): "8x32", (4, 16): "4x8"}
# the untuned tile_code stays "slp": on the attention matmuls (K = 64..197, B read in place) the
# vector-IR 4x16 measured 0.83-1.0x of the SLP one on AVX2 (2026-12-01), vec16 8x32 0.5x on the
# scores matmul and 0.96-1.06x on the context one on Zen 5 (2026-12-02, experiments/dense/results.md):
# its epilogue runs over the stored tile, the SLP one in registers
DEFAULT_VECTOR_IR = False


def _epilogue(wl: Workload) -> Epilogue | None:
    return parse_epilogue(wl, 2, wl.output_shape, broadcast_full=True)


class BatchMatmulTemplate(Template):
    name = "batch_matmul"
    version = 3   # v2: edge tiles run the register tile (row clamping, a padded B panel), no scalar remainder;
                  # v3: a full extra broadcast over batches is read through a batch table, not copied per call

    def matches(self, wl: Workload) -> bool:
        if not wl.ops or wl.ops[0]["op"] != "MatMul" or wl.ops[0]["in"] != ["i0", "i1"]:
            return False
        a, b = wl.inputs[0], wl.inputs[1]
        if a["dtype"] != "float32" or b["dtype"] != "float32" or wl.output_dtype != "float32":
            return False
        if len(a["shape"]) < 2 or len(b["shape"]) < 2 or len(wl.output_shape) < 2:
            return False
        return _epilogue(wl) is not None

    def space(self, wl: Workload, target=None) -> ConfigSpace:
        """Register tiles follow the vector shape of `target` (default: this machine's)."""
        return ConfigSpace([
            Knob("regtile", pick_tiles(REG_TILES, *vector_shape(target))),
            Knob("parallel", (True, False), code_shape=False),
            Knob("MB", (1, 2, 4, 8, 16), code_shape=False),
            Knob("tile_code", tile_codes(target), before="slp"),
        ])

    def default_config(self, wl: Workload, target=None) -> Config:
        tile = pick_tiles(DEFAULT_TILE, *vector_shape(target))
        return self.space(wl, target).validate({"regtile": tile, "parallel": True, "MB": 4,
                                                       "tile_code": tile_codes(target)[1 if DEFAULT_VECTOR_IR else 0]})

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        epi = _epilogue(wl)
        bcast = _bcast_params(wl, epi)
        mr, nr = (int(v) for v in cfg["regtile"].split("x"))
        lanes = tile_lanes(cfg.get("tile_code", "slp"), nr)   # configs recorded before the knob: slp, as they ran
        module = LoopModule((_kernel(mr, nr, epi, lanes, bcast),), doc=f"batch_matmul kernel: regtile={mr}x{nr}, "
                            + (f"tile_code={cfg['tile_code']}, " if lanes else "") +
                            f"epilogue {[st[0]['op'] for st in epi.steps]}", meta={"template": f"batch_matmul v{self.version}"})
        a_shape, b_shape = (tuple(int(d) for d in wl.inputs[i]["shape"]) for i in (0, 1))
        out_shape = tuple(int(d) for d in wl.output_shape)
        M, K = a_shape[-2:]
        N = b_shape[-1]
        batch = out_shape[:-2]
        nb = _prod(batch)
        # which A and B matrix each output batch reads (NumPy broadcasting of the batch dims)
        tables = {"ia": _batch_index(a_shape[:-2], batch), "ib": _batch_index(b_shape[:-2], batch)}
        extras = []
        for e in epi.extras:   # an extra [.., M, N] broadcast over batches (a causal mask) is read
            shape = tuple(int(d) for d in wl.inputs[e.input_index]["shape"])   # through a table, not copied
            if e.param in bcast:
                tables[f"ie_{e.param}"] = _batch_index(((1,) * (len(out_shape) - len(shape)) + shape)[:-2], batch)
                extras.append(In(e.input_index, (_prod(shape[:-2]) * bcast[e.param], N), "bool" if e.dtype == "bool" else "float32"))
            else:
                extras.append(e.arg(wl, nb * M, N, out_shape))
        n_row_tiles = -(-M // mr)
        n_ib = -(-n_row_tiles // cfg["MB"])
        call = Call("bmm", (In(0, (_prod(a_shape[:-2]), M, K), "float32"), In(1, (_prod(b_shape[:-2]), K, N), "float32"),
                            Table("ia"), Table("ib"), *(Table(f"ie_{p}") for p in bcast), *extras, Out((nb * M, N)),
                            *(Scalar(v) for v in (nb, M, N, K, cfg["MB"]))),
                    items=nb * n_ib, parallel=cfg["parallel"])
        return Lowered(module, Launch((call,), tables=tables))


def _batch_broadcast(e, shape: tuple, out_shape: tuple) -> int | None:
    """The rows of each matrix (M, or 1: a row every output row reads) of a full extra whose
    matrices are the output's [M, N] or [1, N] and whose batch dims broadcast, else None. Each
    output batch reads one of its matrices (table `ie_<param>`), where a pre-broadcast copy per call
    made its step read the extra through Python (GPT-2's causal mask [1, 1, S, S]; an sdpa
    export's padding mask [B, 1, 1, S]: `Calls.dynamic`)."""
    if e.mode != "full" or len(out_shape) < 2:
        return None
    s = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    ok = s != tuple(out_shape) and s[-1] == out_shape[-1] and s[-2] in (1, out_shape[-2])
    return s[-2] if ok else None


def _bcast_params(wl: Workload, epi: Epilogue) -> dict:
    """{param: rows of each of its matrices} of the extras read through a batch table (`_batch_broadcast`)."""
    out_shape = tuple(int(d) for d in wl.output_shape)
    rows = {e.param: _batch_broadcast(e, tuple(int(d) for d in wl.inputs[e.input_index]["shape"]), out_shape)
            for e in epi.extras}
    return {p: r for p, r in rows.items() if r is not None}


def _bcast_rows(bcast: dict, i: str) -> dict:
    """The row of each table-read extra that output row `i` of batch `bt` reads."""
    return {p: f"ie_{p}[bt]" if rows == 1 else f"ie_{p}[bt] * M + {i}" for p, rows in bcast.items()}


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _batch_index(dims: tuple, batch: tuple) -> np.ndarray:
    """For each batch of the output (flattened), the flat index of the operand's matrix
    (a writeable copy: numba signatures take no read-only arrays)."""
    return np.array(np.broadcast_to(np.arange(_prod(dims)).reshape(dims), batch).reshape(-1), np.int64)


def _store(epi: Epilogue, value: str, bcast: dict) -> tuple:
    """out[bt * M + i, j] = the epilogue of `value`, at unsigned indices (`unsigned`: with numba's
    wraparound selects an edge tile's loop stayed scalar)."""
    assigns, result = epi.emit("v", "ru", "ju", "e", rows={p: unsigned(r) for p, r in _bcast_rows(bcast, "i").items()})
    return (Assign("v", value), Assign("ru", unsigned("bt * M + i")), Assign("ju", unsigned("j"))) \
        + tuple(Assign(n, e) for n, e in assigns) + (Assign("out[ru, ju]", result),)


def _edge_store(nr: int, epi: Epilogue, bcast: dict) -> tuple:
    """The body of the loop over r that stores row r of the scratch tile `ct` (a tile cut by
    M or N) where it lies inside `out`, with the epilogue."""
    return (Assign("i", "i0 + r"), If("i < M", (For("c", "0", f"min({nr}, N - j0)", (
        Assign("j", "j0 + c"),) + _store(epi, "ct[r, c]", bcast)),)),)


def _pack_edge(nr: int, bt: str) -> tuple:
    """Copy B's last, partial NR-column panel (columns n_full_j * NR .. N - 1) into the scratch
    panel `bt` (K x NR, zero past N), once per work item, so that the edge tile reads whole
    NR-wide rows as the full tiles do (B is read in place: past N there is the next row, or
    past the last matrix nothing)."""
    return (If("n_jt > n_full_j", (For("k", "0", "K", (For("c", "0", str(nr), (
        Assign("j", f"n_full_j * {nr} + c"),
        If("j < N", (Assign(f"{bt}k, c]", "Bb[k, j]"),), (Assign(f"{bt}k, c]", F0),)),
    )),)),)),)


def _kernel(mr: int, nr: int, epi: Epilogue, lanes: int | None, bcast: dict) -> Function:
    """`lanes`: the tiles as LLVM vector IR of that width (`codegen.vector_tile`), reading
    A and B in place by element offsets; None: scalar locals for LLVM's SLP pass. `bcast`: the
    extras read through a batch table (`_batch_broadcast`).

    Every tile, the edges too, runs the register tile (a scalar remainder loop, its K-long
    dependent chain of adds, cost 2-3x the whole vector part at M or N = 197, 1 thread): a
    tile's rows past M read A's row M - 1 again, the column edge reads B's last panel from a
    zero-padded copy (`_pack_edge`); a tile cut by M or N is stored to the scratch tile `ct`
    and what lies inside `out` is stored from there with the epilogue (`_edge_store`)."""
    # the tile goes to out from registers (vector stores); a short epilogue is applied to the
    # accumulators before, a long one (or any, after a vector-IR tile) runs over the stored tile after
    in_registers = register_epilogue(epi, mr, nr, lambda r: f"bt * M + i0 + {r}", "j0",
                                     lambda r: _bcast_rows(bcast, f"i0 + {r}")) if lanes is None else None
    after = (For("r", "0", str(mr), (Assign("i", "i0 + r"), For("q", "0", str(nr), (
        Assign("j", "j0 + q"),) + _store(epi, "out[bt * M + i, j]", bcast)))),) if epi.steps and not in_registers else ()
    full = f"i0 + {mr} <= M and j0 + {nr} <= N"
    if lanes is None:
        def k_loops(body: tuple) -> tuple:
            return tuple(Assign(f"ar{r}", unsigned(f"min(i0 + {r}, M - 1)")) for r in range(mr)) \
                + (For("k", "0", "K", (Assign("ku", unsigned("k")),) + body),)
        tile = (Assign("j0", f"jt * {nr}"),
                If(f"j0 + {nr} <= N", (Assign("Bs", "Bb"), Assign("jb", "j0")), (Assign("Bs", "Bt"), Assign("jb", "0"))),
                ) + register_tile_in_place(
            mr, nr, lambda r: f"Ab[ar{r}, ku]", lambda q: f"Bs[ku, {unsigned(f'jb + {q}')}]", k_loops,
            "out", "bt * M + i0", "j0", full=full, edge_store=_edge_store(nr, epi, bcast), after=after, epilogue=in_registers,
            comment=f"{mr}x{nr} register tile (rows x columns), SLP-vectorized along the contiguous B rows")
        scratch = (Alloc("Bt", ("K", str(nr))),)
        pack = _pack_edge(nr, "Bt[")
    else:
        tile = (Assign("j0", f"jt * {nr}"), Assign("full", full),
                If(f"j0 + {nr} <= N", (Assign("Bs", "B"), Assign("b_off", "ib[bt] * K * N + j0"), Assign("b_ks", "N")),
                   (Assign("Bs", "Bt"), Assign("b_off", "0"), Assign("b_ks", str(nr)))),
                If("full", (Assign("dst", "out"), Assign("c_off", "(bt * M + i0) * N + j0"), Assign("c_rs", "N")),
                   (Assign("dst", "ct"), Assign("c_off", "0"), Assign("c_rs", str(nr)))),
                vector_tile("A", [f"(ia[bt] * M + min(i0 + {r}, M - 1)) * K" for r in range(mr)], "1", "Bs", "b_off",
                            "b_ks", "K", "dst", "c_off", "c_rs", "False", nr, lanes),
                If("full", after, (For("r", "0", str(mr), _edge_store(nr, epi, bcast)),)) if after
                else If("not full", (For("r", "0", str(mr), _edge_store(nr, epi, bcast)),)))
        scratch = (Alloc("Bt", ("1", "K", str(nr))),)
        pack = _pack_edge(nr, "Bt[0, ")
    body = (
        Assign("n_it", f"(M + {mr - 1}) // {mr}"), Assign("n_ib", "(n_it + MB - 1) // MB"),
        Assign("n_full_j", f"N // {nr}"), Assign("n_jt", f"(N + {nr - 1}) // {nr}"),
        Alloc("ct", (str(mr), str(nr))),
    ) + scratch + (
        thread_share("item", "nb * n_ib", body=(
            Assign("bt", "item // n_ib"), Assign("blk", "item % n_ib"),
            Assign("Ab", "A[ia[bt]]"), Assign("Bb", "B[ib[bt]]"),
        ) + pack + (
            For("it", "blk * MB", "min(n_it, blk * MB + MB)", (
                Assign("i0", f"it * {mr}"),
                For("jt", "0", "n_jt", tile),
            )),
        )),
    )
    params = (Param("A", "float32[:, :, ::1]"), Param("B", "float32[:, :, ::1]"),
              Param("ia", "int64[::1]"), Param("ib", "int64[::1]")) + tuple(Param(f"ie_{p}", "int64[::1]") for p in bcast) \
        + tuple(Param(n, t) for n, t in epi.params()) \
        + (Param("out", "float32[:, ::1]"),) + tuple(Param(n, "int64") for n in ("nb", "M", "N", "K", "MB", "t", "T"))
    return Function("bmm", params, epi.prelude() + body)


register_template(BatchMatmulTemplate())

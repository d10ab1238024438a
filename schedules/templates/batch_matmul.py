"""Batched MatMul of two activations: C[b..., M, N] = A[b..., M, K] @ B[b..., K, N]
(NumPy broadcasting of the batch dims, e.g. attention scores [b,h,s,d] @ [b,h,d,s]),
with a fused elementwise epilogue (scale, mask add...).

Like dense, full MR x NR tiles run a register tile of scalar locals (SLP-vectorized
along N, where B rows are contiguous) or, with `tile_code` "vec<lanes>", as LLVM vector
IR (`codegen.vector_tile`); neither operand is constant, so nothing is
packed: A is read in place, B rows directly. Remainder rows and columns run a
scalar loop (guarded tail). Batch-broadcast index maps are tables computed while lowering.
Knobs: `regtile` (code); row tiles per work item `MB` and threading (run-time).
"""
from __future__ import annotations

import numpy as np

from ir.workload import Workload
from schedules.epilogue import Epilogue, parse_epilogue
from schedules.launch import Call, In, Launch, Out, Scalar, Table
from schedules.loopnest import Assign, For, Function, If, LoopModule, Param
from schedules.microkernel import (F0, k_range, pick_tiles, register_epilogue, register_tile_in_place,
                                   tile_codes, tile_lanes, vector_shape, vector_tile)
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Lowered, Template

# per (float lanes, vector registers) of the target, as dense's; NR divides the attention
# widths (head dim 64, sequence 128) so the scalar remainder loop rarely runs
REG_TILES = {
    (8, 16): ("2x16", "4x16", "4x32", "8x16"),                  # AVX2
    (8, 32): ("2x16", "4x16", "4x32", "8x16", "12x16"),         # AVX-512, 256-bit vectors kept
    (16, 32): ("2x16", "4x16", "8x16", "4x32", "8x32", "6x32"),  # AVX-512
    (4, 16): ("2x16", "4x16", "4x8", "8x8"),                    # 128-bit vectors
}
DEFAULT_TILE = {(8, 16): "4x16", (8, 32): "8x16", (16, 32): "8x32", (4, 16): "4x8"}
# the untuned tile_code stays "slp": on the attention matmuls (K = 64..197, B read in place) the
# vector-IR 4x16 measured 0.83-1.0x of the SLP one, 1 thread (experiments/dense/results.md,
# 2026-12-01): its epilogue runs over the stored tile, the SLP one in registers
DEFAULT_VECTOR_IR = False


def _epilogue(wl: Workload) -> Epilogue | None:
    return parse_epilogue(wl, 2, wl.output_shape, broadcast_full=True)


class BatchMatmulTemplate(Template):
    name = "batch_matmul"
    version = 1

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
        mr, nr = (int(v) for v in cfg["regtile"].split("x"))
        lanes = tile_lanes(cfg.get("tile_code", "slp"), nr)   # configs recorded before the knob: slp, as they ran
        module = LoopModule((_kernel(mr, nr, epi, lanes),), doc=f"batch_matmul kernel: regtile={mr}x{nr}, "
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
        extras = tuple(e.arg(wl, nb * M, N, out_shape) for e in epi.extras)
        n_row_tiles = -(-M // mr)
        n_ib = -(-n_row_tiles // cfg["MB"])
        call = Call("bmm", (In(0, (_prod(a_shape[:-2]), M, K), "float32"), In(1, (_prod(b_shape[:-2]), K, N), "float32"),
                            Table("ia"), Table("ib"), *extras, Out((nb * M, N)),
                            *(Scalar(v) for v in (nb, M, N, K, cfg["MB"]))),
                    items=nb * n_ib, parallel=cfg["parallel"])
        return Lowered(module, Launch((call,), tables=tables))


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _batch_index(dims: tuple, batch: tuple) -> np.ndarray:
    """For each batch of the output (flattened), the flat index of the operand's matrix
    (a writeable copy: numba signatures take no read-only arrays)."""
    return np.array(np.broadcast_to(np.arange(_prod(dims)).reshape(dims), batch).reshape(-1), np.int64)


def _store(epi: Epilogue, value: str) -> tuple:
    assigns, result = epi.emit("v", "row", "j", "e")
    return (Assign("v", value), Assign("row", "bt * M + i")) + tuple(Assign(n, e) for n, e in assigns) \
        + (Assign("out[row, j]", result),)


def _kernel(mr: int, nr: int, epi: Epilogue, lanes: int | None = None) -> Function:
    """`lanes`: the full tiles as LLVM vector IR of that width (`codegen.vector_tile`), reading
    A and B in place by element offsets; None: scalar locals for LLVM's SLP pass."""
    # the tile goes to out from registers (vector stores); a short epilogue is applied to the
    # accumulators before, a long one (or any, after a vector-IR tile) runs over the stored tile after
    in_registers = register_epilogue(epi, mr, nr, lambda r: f"bt * M + i0 + {r}", "j0") if lanes is None else None
    after = (For("r", "0", str(mr), (Assign("i", "i0 + r"), For("q", "0", str(nr), (
        Assign("j", "j0 + q"),) + _store(epi, "out[bt * M + i, j]")))),) if epi.steps and not in_registers else ()
    if lanes is None:
        tile = (Assign("j0", f"jt * {nr}"),) + register_tile_in_place(
            mr, nr, lambda r: f"Ab[i0 + {r}, k]", lambda q: f"Bb[k, j0 + {q}]", k_range("0", "K"),
            "out", "bt * M + i0", "j0", after=after, epilogue=in_registers,
            comment=f"{mr}x{nr} register tile (rows x columns), SLP-vectorized along the contiguous B rows")
    else:
        tile = (Assign("j0", f"jt * {nr}"), vector_tile(
            "A", [f"a_row0 + {r} * K" for r in range(mr)], "1", "B", "b_base + j0", "N", "K",
            "out", "(bt * M + i0) * N + j0", "N", "False", nr, lanes)) + after
    scalar = (
        Assign("s", F0),
        For("k", "0", "K", (Assign("s", "Ab[i, k] * Bb[k, j]", "+"),)),
    ) + _store(epi, "s")
    body = (
        Assign("n_it", f"(M + {mr - 1}) // {mr}"), Assign("n_ib", "(n_it + MB - 1) // MB"),
        Assign("n_full_j", f"N // {nr}"),
        For("item", "t", "nb * n_ib", step="T", body=(
            Assign("bt", "item // n_ib"), Assign("blk", "item % n_ib"),
            Assign("Ab", "A[ia[bt]]"), Assign("Bb", "B[ib[bt]]"),
            For("it", "blk * MB", "min(n_it, blk * MB + MB)", (
                Assign("i0", f"it * {mr}"),
                If(f"i0 + {mr} <= M", (
                    *((Assign("a_row0", "(ia[bt] * M + i0) * K"), Assign("b_base", "ib[bt] * K * N")) if lanes else ()),
                    For("jt", "0", "n_full_j", tile),
                    For("i", "i0", f"i0 + {mr}", (For("j", f"n_full_j * {nr}", "N", scalar),)),
                ), (
                    For("i", "i0", "M", (For("j", "0", "N", scalar),)),
                )),
            )),
        )),
    )
    params = (Param("A", "float32[:, :, ::1]"), Param("B", "float32[:, :, ::1]"),
              Param("ia", "int64[::1]"), Param("ib", "int64[::1]")) + tuple(Param(n, t) for n, t in epi.params()) \
        + (Param("out", "float32[:, ::1]"),) + tuple(Param(n, "int64") for n in ("nb", "M", "N", "K", "MB", "t", "T"))
    return Function("bmm", params, body)


register_template(BatchMatmulTemplate())

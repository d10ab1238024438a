"""Dense: C[M, N] = A[..., M, K] @ B[K, N] with a fused elementwise epilogue.

The schedule that reaches the FMA peak with numba (FACTS.md): B packed into
NR-column panels (`Bp[jt, k, 0:NR]`; a constant B once, at prepare time), A read
in place by MR rows, an MR x NR register tile stored straight from registers, cache
blocking of the tile loops and of K, and a parallel loop over blocks: one parallel
call per dense op. The tile is written either as LLVM vector IR (`tile_code`
"vec<lanes>", `codegen.vector_tile`: the default) or as scalar locals that LLVM's SLP
pass vectorizes ("slp"). The register tile, its code, loop order and parallelism
change the code; block sizes are run-time arguments, so candidates that differ only
in them share one compile.

The register tiles offered depend on the target the kernel is built for: its float
lanes per vector and vector registers (`vector_bits`, `vector_registers` of the cpu
target, `codegen.cpu`): AVX2's 8-float tiles with 16 registers, AVX-512's 16-float tiles
with up to 28 of its 32 registers as accumulators.
"""
from __future__ import annotations

from ir.workload import Workload, work_estimate
from schedules.epilogue import Epilogue, parse_epilogue
from schedules.launch import Buffer, Call, In, Launch, Library, Out, Packed, Scalar, Work
from schedules.loopnest import Alloc, Assign, For, Function, If, LoopModule, Param, thread_share
from schedules.microkernel import (pick_tiles, register_epilogue, register_tile_in_place, tile_codes, tile_lanes,
                                   unsigned, vector_shape, vector_tile)
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob, split_options
from schedules.template import Lowered, Template

# MR x NR register tiles, per (float lanes, vector registers) of the target: NR a multiple
# of the vector, MR * NR / lanes accumulators plus NR / lanes B vectors and one broadcast A
# held in registers (a few tiles at the edge spill a little; the tuner measures which wins).
# "blas": library dispatch (NumPy's BLAS matmul) then the generated epilogue, as TVM's cblas.
REG_TILES = {
    # AVX2: 16 ymm registers of 8 floats
    (8, 16): ("1x8", "1x16", "1x32", "2x16", "2x32", "3x16", "3x24", "4x8", "4x16", "4x24",
              "6x16", "8x8", "8x16", "12x8", "1x64", "blas"),
    # AVX-512 with LLVM's prefer-256-bit kept (TENSORTUNE_PREFER_256=1): 32 ymm registers
    (8, 32): ("2x16", "3x24", "4x16", "4x24", "6x16", "8x16", "6x24", "8x24", "12x16", "14x16",
              "6x32", "blas"),
    # AVX-512: 32 zmm registers of 16 floats, up to 28 accumulators
    (16, 32): ("4x16", "8x16", "12x16", "16x16", "4x32", "6x32", "8x32", "12x32", "14x32",
               "4x48", "6x48", "4x64", "1x64", "1x128", "2x64", "1x256", "blas"),
    # 128-bit vectors (SSE, NEON)
    (4, 16): ("2x8", "4x4", "4x8", "4x12", "6x8", "8x4", "4x16", "blas"),
}
# the untuned tile per vector shape (AVX-512 timed nowhere yet), written as LLVM vector IR
# (`tile_code` "vec<lanes>", codegen.vector_tile). AVX2: 4x24 (12 accumulators + 3 B vectors + one
# broadcast: 16 ymm, no spill in the k loop) measured 0.90-1.08x OpenBLAS (1 thread, 1024^3 and
# BERT/ViT shapes) where the SLP tiles reached 0.77-0.96x (4x16; 6x16 and 4x24 as SLP code spill:
# LLVM keeps every broadcast live), and compiles in about a third of the time
# (experiments/dense/results.md, 2026-12-01). AVX-512: 8x32 as vector IR cross-compiled for
# sapphirerapids: 16 zmm FMAs per k, no spill; then 4x64 with KB = 512 (16 accumulators again, half
# the broadcasts per FMA, B's panel 128 KB in L2) beat it 1.06-1.24x at 1024^3 and the BERT/ViT
# shapes on Ice Lake and Zen 4 (1.02-1.19x OpenBLAS; 2026-12-03, bench_knobs.py). (With 6x16 the recorded-table transfer-learning
# test in tests/test_cost_model.py once needed more trials with transfer than without: not understood.)
DEFAULT_TILE = {(8, 16): "4x24", (8, 32): "8x24", (16, 32): "4x64", (4, 16): "4x8"}
# the untuned K block per vector shape (else 256): what the default tile was measured with
DEFAULT_KB = {(16, 32): 512}
DEFAULT_VECTOR_IR = True   # the untuned tile_code: the vector IR ("vec<lanes>"), not "slp"
# the untuned tile for a few rows (a classifier head or a decoder step at batch 1-4: a GEMV, bound
# by streaming B), per vector shape: {most rows: tile}. MR = M computes no duplicated rows (the
# 8x32 default computed 8 for one) and 8 accumulators of one row keep the FMA chains busy: 1x128
# 1.4-1.8x faster than 8x32 at M = 1 (K x N = 512x1000, 768x768, 768x3072, 1280x1000) and within
# 0.93-1.07x of OpenBLAS's sgemv on one thread; M = 2: 2x64 1.3-1.5x, M = 3-4: 4x64 1.2-1.4x
# (Xeon Ice Lake, AVX-512). AVX2 (haswell code, same Xeon): 1x64 1.1-1.4x, 2x32 1.2-1.4x vs 4x24
# (2026-12-03, experiments/dense/defaults.md)
SMALL_M_TILES = {(16, 32): {1: "1x128", 2: "2x64", 4: "4x64"}, (8, 16): {1: "1x64", 2: "2x32"}}
# tiles only the vector IR writes: as SLP code their 64-256 scalar accumulators take minutes to compile
VECTOR_IR_TILES = ("1x64", "1x128", "2x64", "1x256")
BLOCKS = (1, 2, 4, 8, 16, 32, 64)
F0 = "np.float32(0.0)"


def _problem(wl: Workload):
    """(A shape, B shape, out shape, B constant?) or None if wl is not a dense workload."""
    if not wl.ops or wl.ops[0]["op"] != "MatMul" or wl.ops[0]["in"] != ["i0", "i1"]:
        return None
    a, b = wl.inputs[0], wl.inputs[1]
    if len(a["shape"]) < 2 or len(b["shape"]) != 2 or a["dtype"] != "float32" or b["dtype"] != "float32" \
            or wl.output_dtype != "float32":
        return None
    return a, b


DENSE_SPLIT_WORK = 2.5e6
"""A dense layer of less work (`ir.workload.work_estimate`: FLOPs + bytes, what the backend's
size rule counts) runs on one thread by default. With threads splitting kernels from 256 K work units (`codegen.cpu.MIN_WORK_PER_THREAD`)
BERT-small's 32x128x128 projections (1.1 M) ran 5.8 -> 10.0 us on two threads, and ViT-small's
17x192x192 ones (1.4 M) gained 10 % but slowed the single-thread steps after them as much; its
MLP layers (5.6 M) and BERT's (4.5 M) gain, and so does ResNet-18's 512 -> 1000 classifier, a
GEMV that streams 2 MB of weights (3.1 M): 72 -> 43 us. 2 threads, Emerald Rapids, 2026-12-06."""


class DenseTemplate(Template):
    name = "dense"
    version = 1   # (new tiles or defaults alone leave it: records of the old space still run as they did)

    def matches(self, wl: Workload) -> bool:
        return _problem(wl) is not None and parse_epilogue(wl, 2, wl.output_shape) is not None

    def space(self, wl: Workload, target=None) -> ConfigSpace:
        """Register tiles follow the vector shape of `target` (default: this machine's)."""
        a, b = _problem(wl)
        k_static = isinstance(a["sym"][-1], int)
        k_opts = split_options(b["shape"][0], lo=16) if k_static else (64, 128, 256, 512, 1024, 1 << 30)
        return ConfigSpace([
            Knob("regtile", pick_tiles(REG_TILES, *vector_shape(target))),
            Knob("order", ("ij", "ji")),
            Knob("parallel", (True, False), code_shape=False),
            Knob("MB", BLOCKS, code_shape=False),
            Knob("NB", BLOCKS, code_shape=False),
            Knob("KB", k_opts, code_shape=False),
            Knob("tile_code", tile_codes(target), before="slp"),
        ], constraint=_slp_tiles)

    def default_config(self, wl: Workload, target=None) -> Config:
        space, shape = self.space(wl, target), vector_shape(target)
        kb = min(space.knobs[5].options, key=lambda v: abs(v - DEFAULT_KB.get(shape, 256)))
        # BLIS's order: a B micro-panel (KB x NR, 16 KB at KB = 256) stays in L1 across up to
        # 32 row tiles of A (~100-200 KB: L2) before the next column tile; with M <= ~200
        # (transformer layers) one block holds all of A's rows, so B streams through once
        # (ij with MB = 4 re-read B 5x for M = 128: 0.55-0.6x NumPy at 128x3072x768, ji 0.95x)
        m = _prod(_problem(wl)[0]["shape"][:-1])
        small = [t for rows, t in sorted(SMALL_M_TILES.get(shape, {}).items()) if m <= rows]
        tile = small[0] if small and DEFAULT_VECTOR_IR else pick_tiles(DEFAULT_TILE, *shape)
        # parallel: the backend's size rule (`codegen.cpu.threads_for`) decides how many threads
        # a call gets, so a small kernel still runs on one (this was flops >= 5e7 while a pool
        # thread took 20 us to wake: ViT-small's 5 M-flop MLP layers then never split). Where
        # all rows fit one block (M up to 32 row tiles: transformer layers at batch 1), a block
        # is one column tile, so threads share N's tiles: ViT-small at 2 threads 0.83 -> 0.73 ms,
        # BERT-small 0.254 -> 0.239; at 1 thread within 1 % (Intel Xeon, AVX-512, 2026-12-04).
        # Under DENSE_SPLIT_WORK one thread: threads share N, and the row-wise steps after it
        # (LayerNorm, a head split) then read half the output from the other core.
        mr = int(tile.split("x")[0])
        return space.validate({"regtile": tile, "order": "ji", "parallel": work_estimate(wl) >= DENSE_SPLIT_WORK,
                               "MB": 32, "NB": 1 if m <= 32 * mr else 4, "KB": kb,
                               "tile_code": tile_codes(target)[1 if DEFAULT_VECTOR_IR else 0]})

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        a, b = _problem(wl)
        K, N = b["shape"]
        M = _prod(a["shape"][:-1])
        epi = parse_epilogue(wl, 2, wl.output_shape)
        extras = tuple(e.arg(wl, M, N) for e in epi.extras)
        if cfg["regtile"] == "blas":
            return self._lower_blas(cfg, epi, extras, M, K, N)
        mr, nr = (int(x) for x in cfg["regtile"].split("x"))
        lanes = tile_lanes(cfg.get("tile_code", "slp"), nr)   # configs recorded before the knob: slp, as they ran
        module = LoopModule((_pack_b(nr), _blocks(mr, nr, cfg["order"], epi, lanes)),
                            doc=f"dense kernel: regtile={mr}x{nr} order={cfg['order']}"
                                + (f" tile_code={cfg['tile_code']}" if lanes else "")
                                + f", epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"dense v{self.version}"})
        MB, NB, KB = cfg["MB"], cfg["NB"], cfg["KB"]
        n_mt, n_nt = -(-M // mr), -(-N // nr)
        par = cfg["parallel"]
        bp = Buffer("Bp", (n_nt, K, nr))
        pack_b = Call("pack_b", (In(1, (K, N), "float32"), Packed("Bp") if b["const"] else Work("Bp"),
                                 Scalar(K), Scalar(N)), items=n_nt, parallel=par)
        # one parallel call per dense op: A is read in place (see _a_rows), so there is no
        # packing pass to wait for (a second dispatch to the threads costs tens of us)
        blocks = Call("blocks", (In(0, (M, K), "float32"), pack_b.args[1], *extras, Out((M, N)),
                                 *(Scalar(v) for v in (M, N, K, MB, NB, KB))),
                      items=-(-n_mt // MB) * -(-n_nt // NB), parallel=par)
        if b["const"]:   # packed once, at prepare: shared by every shape of the signature
            return Lowered(module, Launch((blocks,), prepare=(pack_b,), packed=(bp,)))
        return Lowered(module, Launch((pack_b, blocks), workspaces=(bp,)))

    def _lower_blas(self, cfg: Config, epi: Epilogue, extras: tuple, M: int, K: int, N: int) -> Lowered:
        fns = (_epilogue_rows(epi),) if epi.steps else ()
        module = LoopModule(fns, doc=f"dense via BLAS, epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"dense v{self.version}"})
        steps = (Library("matmul", (In(0, (M, K), "float32"), In(1, (K, N), "float32"), Out((M, N)))),)
        if epi.steps:
            steps += (Call("epilogue", (Out((M, N)), *extras, Scalar(M), Scalar(N)), items=M,
                           parallel=cfg["parallel"]),)
        return Lowered(module, Launch(steps))


def _slp_tiles(values: dict) -> str | None:
    if values.get("regtile") in VECTOR_IR_TILES and values.get("tile_code", "slp") == "slp":
        return f"the GEMV tiles ({', '.join(VECTOR_IR_TILES)}) are vector IR only (tile_code='vec<lanes>')"
    return None


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _epilogue_rows(epi: Epilogue) -> Function:
    """The fused epilogue as its own pass over out[M, N] (after a library matmul)."""
    assigns, result = epi.emit("v", "i", "j", "e")
    body = (thread_share("i", "M", body=(
        For("j", "0", "N", (Assign("v", "out[i, j]"),) + tuple(Assign(n, e) for n, e in assigns)
            + (Assign("out[i, j]", result),)),
    )),)
    params = (Param("out", "float32[:, ::1]"),) + tuple(Param(n, t) for n, t in epi.params()) \
        + (Param("M", "int64"), Param("N", "int64"), Param("t", "int64"), Param("T", "int64"))
    return Function("epilogue", params, epi.prelude() + body)


def _pack_b(nr: int) -> Function:
    """Pack B into NR-column panels; thread t of T packs its share of the panels"""
    body = (
        Assign("n_nt", f"(N + {nr - 1}) // {nr}"),
        thread_share("jt", "n_nt", body=(
            For("k", "0", "K", (
                For("c", "0", str(nr), (
                    Assign("j", f"jt * {nr} + c"),
                    If("j < N", (Assign("Bp[jt, k, c]", "B[k, j]"),), (Assign("Bp[jt, k, c]", F0),)),
                )),
            )),
        )),
    )
    return Function("pack_b", (Param("B", "float32[:, ::1]"), Param("Bp", "float32[:, :, ::1]"),
                               Param("K", "int64"), Param("N", "int64"), Param("t", "int64"), Param("T", "int64")), body)


def _edge_store(nr: int, epi: Epilogue) -> tuple:
    """The body of the loop over r that adds row r of the scratch tile `ct` (a tile cut by M
    or N) to what lies inside `out`, with the epilogue on the last K block. `out` at unsigned
    indices, as the full tiles' epilogue (`_stored_tile_epilogue`): with numba's wraparound
    selects the loop stayed scalar, and GPT-2's (39 x 256) MatMul + Gelu spent more on its edge
    tiles' GELU than on all the full tiles'."""
    assigns, result = epi.emit("v", "iu", "ju", "e")
    epilogue = tuple(Assign(n, e) for n, e in assigns) + (Assign("out[iu, ju]", result),)
    return (
        Assign("i", "i0 + r"),
        If("i < M", (
            Assign("iu", unsigned("i")),
            For("c", "0", f"min({nr}, N - j0)", (
                Assign("ju", unsigned("j0 + c")),
                Assign("v", "ct[r, c]"),
                If("kb > 0", (Assign("v", "out[iu, ju]", "+"),)),
                If("kb < n_kb - 1", (Assign("out[iu, ju]", "v"),), epilogue),
            )),
        )),
    )


def _stored_tile_epilogue(mr: int, nr: int, epi: Epilogue) -> tuple:
    """On the last K block, the epilogue as a loop over a full tile's stored rows at unsigned
    indices (with numba's wraparound selects on j the loop stayed scalar: GELU cost ~7 ns per
    element)."""
    if not epi.steps:
        return ()
    row_assigns, row_result = epi.emit("v", "iu", "ju", "e")
    return (If("kb == n_kb - 1", (For("r", "0", str(mr), (
        Assign("iu", unsigned("i0 + r")), For("c", "0", str(nr), (
            Assign("ju", unsigned("j0 + c")), Assign("v", "out[iu, ju]"))
            + tuple(Assign(n, e) for n, e in row_assigns) + (Assign("out[iu, ju]", row_result),)))),)),)


def _micro_kernel(mr: int, nr: int, epi: Epilogue) -> tuple:
    """Register tile over one K block. Partial sums of earlier K blocks are accumulated in
    `out` itself (no M x N scratch buffer to pull through the caches): a full tile loads
    them into its accumulators and stores them back from registers (vector moves); a tile
    cut by M or N stores into `ct` and adds that to `out` in a scalar loop. On the last K
    block a short epilogue is applied to the accumulators before the store
    (`register_epilogue`), a long one in a loop over the stored tile after it."""
    in_registers = register_epilogue(epi, mr, nr, lambda r: f"i0 + {r}", "j0")
    after = _stored_tile_epilogue(mr, nr, epi) if not in_registers else ()
    return (Assign("i0", f"it * {mr}"), Assign("j0", f"jt * {nr}")) + register_tile_in_place(
        mr, nr, lambda r: f"A[ar{r}, ku]", lambda c: f"Bp[jtu, ku, {c}]", _k_block_loop(mr),
        "out", "i0", "j0", full=f"i0 + {mr} <= M and j0 + {nr} <= N", accumulate="kb > 0",
        edge_store=_edge_store(nr, epi), after=after, epilogue=in_registers, finish_when="kb == n_kb - 1",
        comment=f"{mr}x{nr} register tile: scalar accumulators that LLVM's SLP pass vectorizes")


def _vector_micro_kernel(mr: int, nr: int, epi: Epilogue, lanes: int) -> tuple:
    """`_micro_kernel` with the tile's k loop as LLVM vector IR (`codegen.vector_tile`): a
    full tile adds its K block's sums to `out` (stores them on the first K block), then on
    the last one the epilogue runs over the stored tile; a tile cut by M or N goes through
    `ct` as there. One call for both (its IR is inlined: once, not twice, for LLVM to
    optimize; the tile is stored after its k loop, so choosing the destination costs the
    loop nothing). A's rows past M read row M - 1 again (never stored)."""
    a_rows = [f"min(i0 + {r}, M - 1) * K + k0" for r in range(mr)]
    return (Assign("i0", f"it * {mr}"), Assign("j0", f"jt * {nr}"),
            Assign("full", f"i0 + {mr} <= M and j0 + {nr} <= N"),
            If("full", (Assign("dst", "out"), Assign("c_off", "i0 * N + j0"), Assign("c_rs", "N")),
               (Assign("dst", "ct"), Assign("c_off", "0"), Assign("c_rs", str(nr)))),
            vector_tile("A", a_rows, "1", "Bp", f"(jt * K + k0) * {nr}", str(nr), "k1 - k0",
                        "dst", "c_off", "c_rs", "full and kb > 0", nr, lanes),
            If("full", _stored_tile_epilogue(mr, nr, epi), (For("r", "0", str(mr), _edge_store(nr, epi)),)))


def _k_block_loop(mr: int):
    """The k loop over one K block, indexing at unsigned indices (`unsigned`): MR rows of A,
    read in place (a tile's rows past M read row M - 1 again; those results are never
    stored), and the B micro-panel. LLVM then strength-reduces the addressing to pointer
    bumps (and unrolls by 2); indexing `Ap[it, k, r]` with k from k0 kept ~13 integer ops
    (two imuls, numba's wraparound selects) per k beside the 12 FMAs of a 6x16 tile.
    Packing A into MR-row panels first (as BLIS does) measured no faster here (A's rows
    are MR sequential streams, broadcast-loaded) and cost a pass over A and a second
    parallel call."""
    def loops(body: tuple) -> tuple:
        return tuple(Assign(f"ar{r}", unsigned(f"min(i0 + {r}, M - 1)")) for r in range(mr)) \
            + (Assign("jtu", unsigned("jt")), For("k", "k0", "k1", (Assign("ku", unsigned("k")),) + body))
    return loops


def _blocks(mr: int, nr: int, order: str, epi: Epilogue, lanes: int | None = None) -> Function:
    """Copy t of T's share of the blocks of (ib, jb) tiles (a block: up to MB row tiles x NB column tiles,
    the tiles split evenly between the blocks: with M = 197 and MB x MR = 192 rows, two
    blocks of 17 and 16 row tiles, not 32 and 1, which in order "ji" gave one thread all
    the big blocks), each over all K blocks, so the block's output stays in cache between its K blocks (with K
    blocks outermost, every K block pulls all of C through the caches again: tried, slower).
    Order "ij": blocks row-major, row tiles outside column tiles (an A micro-panel in L1
    across NB B micro-panels); "ji": blocks column-major, column tiles outside (a B
    micro-panel in L1 across MB A micro-panels, consecutive blocks share a B column block).
    Serial code with nogil: threads run copies of it (numba's parallel=True would compile
    it ~3x slower). `lanes`: the tile as LLVM vector IR of that width (None: SLP's scalars)."""
    tile = _micro_kernel(mr, nr, epi) if lanes is None else _vector_micro_kernel(mr, nr, epi, lanes)
    tiles_i = ("it", "ib * n_mt // n_ib", "(ib + 1) * n_mt // n_ib")
    tiles_j = ("jt", "jb * n_nt // n_jb", "(jb + 1) * n_nt // n_jb")
    outer, inner = (tiles_i, tiles_j) if order == "ij" else (tiles_j, tiles_i)
    split = (Assign("ib", "blk // n_jb"), Assign("jb", "blk % n_jb")) if order == "ij" \
        else (Assign("jb", "blk // n_ib"), Assign("ib", "blk % n_ib"))
    body = _counts(mr, nr) + (
        Alloc("ct", (str(mr), str(nr))),
        thread_share("blk", "n_ib * n_jb", body=split + (
            For("kb", "0", "n_kb", (
                Assign("k0", "kb * KB"), Assign("k1", "min(K, k0 + KB)"),
                For(*outer, body=(For(*inner, body=tile),)),
            )),
        )),
    )
    return Function("blocks", _params(epi) + (Param("t", "int64"), Param("T", "int64")), epi.prelude() + body)


def _counts(mr: int, nr: int) -> tuple:
    return (Assign("n_mt", f"(M + {mr - 1}) // {mr}"), Assign("n_nt", f"(N + {nr - 1}) // {nr}"),
            Assign("n_ib", "(n_mt + MB - 1) // MB"), Assign("n_jb", "(n_nt + NB - 1) // NB"),
            Assign("n_kb", "(K + KB - 1) // KB"))


def _params(epi: Epilogue) -> tuple:
    return (Param("A", "float32[:, ::1]"), Param("Bp", "float32[:, :, ::1]")) \
        + tuple(Param(n, t) for n, t in epi.params()) \
        + (Param("out", "float32[:, ::1]"),) \
        + tuple(Param(n, "int64") for n in ("M", "N", "K", "MB", "NB", "KB"))


register_template(DenseTemplate())

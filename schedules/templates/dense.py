"""Dense: C[M, N] = A[..., M, K] @ B[K, N] with a fused elementwise epilogue.

The schedule that reaches the FMA peak with numba (FACTS.md): A and B packed
into panels (`Ap[it, k, 0:MR]`, `Bp[jt, k, 0:NR]`), an MR x NR register tile of
scalar locals (SLP-vectorized), cache blocking of the tile loops and of K, and
a parallel loop over blocks. The register tile, loop order and parallelism
change the code; block sizes are run-time arguments, so candidates that differ
only in them share one compile. Constant B is packed once, at prepare time.

The register tiles offered depend on the target the kernel is built for: its float
lanes per vector and vector registers (`vector_bits`, `vector_registers` of the cpu
target, `codegen.cpu`): AVX2's 8-float tiles with 16 registers, AVX-512's 16-float tiles
with up to 28 of its 32 registers as accumulators.
"""
from __future__ import annotations

from ir.workload import Workload
from schedules.epilogue import Epilogue, parse_epilogue
from schedules.launch import Buffer, Call, In, Launch, Library, Out, Packed, Scalar, Work
from schedules.loopnest import Alloc, Assign, For, Function, If, LoopModule, Param
from schedules.microkernel import k_range, pick_tiles, register_tile, vector_shape
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
              "6x16", "8x8", "8x16", "12x8", "blas"),
    # AVX-512 with LLVM's prefer-256-bit kept (TENSORTUNE_PREFER_256=1): 32 ymm registers
    (8, 32): ("2x16", "3x24", "4x16", "4x24", "6x16", "8x16", "6x24", "8x24", "12x16", "14x16",
              "6x32", "blas"),
    # AVX-512: 32 zmm registers of 16 floats, up to 28 accumulators
    (16, 32): ("4x16", "8x16", "12x16", "16x16", "4x32", "6x32", "8x32", "12x32", "14x32",
               "4x48", "6x48", "4x64", "blas"),
    # 128-bit vectors (SSE, NEON)
    (4, 16): ("2x8", "4x4", "4x8", "4x12", "6x8", "8x4", "4x16", "blas"),
}
# the untuned tile per vector shape (AVX-512 unmeasured). AVX2 keeps 4x16: 6x16 measured a
# little faster in experiments/dense, but with it the recorded-table test of transfer learning
# (tests/test_cost_model.py) needed more trials with transfer than without: not understood yet
DEFAULT_TILE = {(8, 16): "4x16", (8, 32): "8x24", (16, 32): "8x32", (4, 16): "4x8"}
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


class DenseTemplate(Template):
    name = "dense"
    version = 1

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
        ])

    def default_config(self, wl: Workload, target=None) -> Config:
        space = self.space(wl, target)
        kb = min(space.knobs[5].options, key=lambda v: abs(v - 256))
        # threads pay off only when each gets real work (~1 ms of it): waking one costs ~20 us
        return space.validate({"regtile": pick_tiles(DEFAULT_TILE, *vector_shape(target)), "order": "ij",
                               "parallel": wl.flops() >= 50_000_000,
                               "MB": 4, "NB": 4, "KB": kb})

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        a, b = _problem(wl)
        K, N = b["shape"]
        M = _prod(a["shape"][:-1])
        epi = parse_epilogue(wl, 2, wl.output_shape)
        extras = tuple(e.arg(wl, M, N) for e in epi.extras)
        if cfg["regtile"] == "blas":
            return self._lower_blas(cfg, epi, extras, M, K, N)
        mr, nr = (int(x) for x in cfg["regtile"].split("x"))
        module = LoopModule((_pack_a(mr), _pack_b(nr), _blocks(mr, nr, cfg["order"], epi)),
                            doc=f"dense kernel: regtile={mr}x{nr} order={cfg['order']}, epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"dense v{self.version}"})
        MB, NB, KB = cfg["MB"], cfg["NB"], cfg["KB"]
        n_mt, n_nt = -(-M // mr), -(-N // nr)
        par = cfg["parallel"]
        bp = Buffer("Bp", (n_nt, K, nr))
        pack_b = Call("pack_b", (In(1, (K, N), "float32"), Packed("Bp") if b["const"] else Work("Bp"),
                                 Scalar(K), Scalar(N)), items=n_nt, parallel=par)
        work = (Buffer("Ap", (n_mt, K, mr)),)
        steps = (
            Call("pack_a", (In(0, (M, K), "float32"), Work("Ap"), Scalar(M), Scalar(K)), items=n_mt, parallel=par),
            Call("blocks", (Work("Ap"), pack_b.args[1], *extras, Out((M, N)),
                            *(Scalar(v) for v in (M, N, K, MB, NB, KB))),
                 items=-(-n_mt // MB) * -(-n_nt // NB), parallel=par),
        )
        if b["const"]:   # packed once, at prepare: shared by every shape of the signature
            return Lowered(module, Launch(steps, prepare=(pack_b,), packed=(bp,), workspaces=work))
        return Lowered(module, Launch((pack_b,) + steps, workspaces=(bp,) + work))

    def _lower_blas(self, cfg: Config, epi: Epilogue, extras: tuple, M: int, K: int, N: int) -> Lowered:
        fns = (_epilogue_rows(epi),) if epi.steps else ()
        module = LoopModule(fns, doc=f"dense via BLAS, epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"dense v{self.version}"})
        steps = (Library("matmul", (In(0, (M, K), "float32"), In(1, (K, N), "float32"), Out((M, N)))),)
        if epi.steps:
            steps += (Call("epilogue", (Out((M, N)), *extras, Scalar(M), Scalar(N)), items=M,
                           parallel=cfg["parallel"]),)
        return Lowered(module, Launch(steps))


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _epilogue_rows(epi: Epilogue) -> Function:
    """The fused epilogue as its own pass over out[M, N] (after a library matmul)."""
    assigns, result = epi.emit("v", "i", "j", "e")
    body = (For("i", "t", "M", step="T", body=(
        For("j", "0", "N", (Assign("v", "out[i, j]"),) + tuple(Assign(n, e) for n, e in assigns)
            + (Assign("out[i, j]", result),)),
    )),)
    params = (Param("out", "float32[:, ::1]"),) + tuple(Param(n, t) for n, t in epi.params()) \
        + (Param("M", "int64"), Param("N", "int64"), Param("t", "int64"), Param("T", "int64"))
    return Function("epilogue", params, body)


def _pack_a(mr: int) -> Function:
    """Pack A into MR-row panels; thread t of T packs panels t, t+T, ..."""
    body = (
        Assign("n_mt", f"(M + {mr - 1}) // {mr}"),
        For("it", "t", "n_mt", step="T", body=(
            For("r", "0", str(mr), body=(
                Assign("i", f"it * {mr} + r"),
                If("i < M",
                   (For("k", "0", "K", (Assign("Ap[it, k, r]", "A[i, k]"),)),),
                   (For("k", "0", "K", (Assign("Ap[it, k, r]", F0),)),)),
            )),
        )),
    )
    return Function("pack_a", (Param("A", "float32[:, ::1]"), Param("Ap", "float32[:, :, ::1]"),
                               Param("M", "int64"), Param("K", "int64"), Param("t", "int64"), Param("T", "int64")), body)


def _pack_b(nr: int) -> Function:
    """Pack B into NR-column panels; thread t of T packs panels t, t+T, ..."""
    body = (
        Assign("n_nt", f"(N + {nr - 1}) // {nr}"),
        For("jt", "t", "n_nt", step="T", body=(
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


def _micro_kernel(mr: int, nr: int, epi: Epilogue) -> tuple:
    """Register tile over one K block, then a compact (not unrolled) store loop: partial
    sums of earlier K blocks are accumulated in `out` itself (no M x N scratch buffer to
    pull through the caches), the epilogue runs on the last K block."""
    assigns, result = epi.emit("v", "i", "j", "e")
    store = (
        Assign("i", "i0 + r"),
        If("i < M", (
            For("c", "0", f"min({nr}, N - j0)", (
                Assign("j", "j0 + c"),
                Assign("v", "ct[r, c]"),
                If("kb > 0", (Assign("v", "out[i, j]", "+"),)),
                If("kb < n_kb - 1", (Assign("out[i, j]", "v"),),
                   tuple(Assign(n, e) for n, e in assigns) + (Assign("out[i, j]", result),)),
            )),
        )),
    )
    return (Assign("i0", f"it * {mr}"), Assign("j0", f"jt * {nr}")) + register_tile(
        mr, nr, lambda r: f"Ap[it, k, {r}]", lambda c: f"Bp[jt, k, {c}]", k_range("k0", "k1"), store,
        comment=f"{mr}x{nr} register tile: scalar accumulators that LLVM's SLP pass vectorizes")


def _blocks(mr: int, nr: int, order: str, epi: Epilogue) -> Function:
    """Blocks t, t+T, ... of (ib, jb) tiles (a block: MB row tiles x NB column tiles), each
    over all K blocks, so the block's output stays in cache between its K blocks (with K
    blocks outermost, every K block pulls all of C through the caches again: tried, slower).
    Order "ij": blocks row-major, row tiles outside column tiles (an A micro-panel in L1
    across NB B micro-panels); "ji": blocks column-major, column tiles outside (a B
    micro-panel in L1 across MB A micro-panels, consecutive blocks share a B column block).
    Serial code with nogil: threads run copies of it (numba's parallel=True would compile
    it ~3x slower)."""
    tiles_i = ("it", "ib * MB", "min(n_mt, ib * MB + MB)")
    tiles_j = ("jt", "jb * NB", "min(n_nt, jb * NB + NB)")
    outer, inner = (tiles_i, tiles_j) if order == "ij" else (tiles_j, tiles_i)
    split = (Assign("ib", "blk // n_jb"), Assign("jb", "blk % n_jb")) if order == "ij" \
        else (Assign("jb", "blk // n_ib"), Assign("ib", "blk % n_ib"))
    body = _counts(mr, nr) + (
        Alloc("ct", (str(mr), str(nr))),
        For("blk", "t", "n_ib * n_jb", step="T", body=split + (
            For("kb", "0", "n_kb", (
                Assign("k0", "kb * KB"), Assign("k1", "min(K, k0 + KB)"),
                For(*outer, body=(For(*inner, body=_micro_kernel(mr, nr, epi)),)),
            )),
        )),
    )
    return Function("blocks", _params(epi) + (Param("t", "int64"), Param("T", "int64")), body)


def _counts(mr: int, nr: int) -> tuple:
    return (Assign("n_mt", f"(M + {mr - 1}) // {mr}"), Assign("n_nt", f"(N + {nr - 1}) // {nr}"),
            Assign("n_ib", "(n_mt + MB - 1) // MB"), Assign("n_jb", "(n_nt + NB - 1) // NB"),
            Assign("n_kb", "(K + KB - 1) // KB"))


def _params(epi: Epilogue) -> tuple:
    return (Param("Ap", "float32[:, :, ::1]"), Param("Bp", "float32[:, :, ::1]")) \
        + tuple(Param(n, t) for n, t in epi.params()) \
        + (Param("out", "float32[:, ::1]"),) \
        + tuple(Param(n, "int64") for n in ("M", "N", "K", "MB", "NB", "KB"))


register_template(DenseTemplate())

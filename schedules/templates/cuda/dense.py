"""Dense on the GPU: C[M, N] = A[..., M, K] @ B[K, N] with a fused elementwise epilogue,
as a shared-memory tiled SGEMM kernel (numba-cuda).

Each block computes a BM x BN tile of C with (BM/TM) * (BN/TN) threads; each thread
holds a TM x TN register tile of scalar accumulators. The K loop walks BK-wide slices:
the block's threads load the A slice (BM x BK) and the B slice (BK x BN) cooperatively
into shared memory -- consecutive threads read consecutive addresses of a row (A along
K, B along N), so a warp's loads coalesce -- then `syncthreads`, the register-tile
multiply-adds over the slice, `syncthreads` again before the slice is overwritten.
A is stored transposed (As[k, m]) with its rows padded so the transposing stores hit
distinct banks; threads own the rows ty + i * (BM/TM) and the columns tx + j * (BN/TN)
of the tile (interleaved, not blocked), so the reads of Bs are conflict-free and each
store instruction of C writes consecutive columns across a warp.

Knobs (all change the code: tile sizes are shared-array shapes): BM, BN (block tile),
BK, TM, TN (thread tile), WN (warp tile: a warp's 32 threads as WN along N by 32/WN along
M, so one warp computes a (32/WN*TM) x (WN*TN) tile of C: fewer distinct shared-memory
words per k for square warp tiles, wider coalesced stores for wide ones), `vec` (consecutive elements of a row each thread loads per
cooperative load; numba-cuda emits scalar loads either way -- NVVM cannot prove the
alignment a 64/128-bit load needs -- so vec > 1 trades a warp's one contiguous
128-byte run per instruction for fewer index computations), `unroll` of the slice's k loop, and
`double` (double-buffered shared memory: the next slice is fetched into registers while
the current one is multiplied, one `syncthreads` per slice). M, N, K are run-time
arguments: every shape of a signature (a dynamic batch) shares one compile. Edges are
bounds-checked (loads outside A or B read zero, stores outside C are skipped); a config
is pruned when its block does not fit the device (`schedules.gpu`).

The kernel builder `gemm_kernel` is shared with the batched template (cuda/batch_matmul).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ir.workload import Workload
from schedules import gpu
from schedules.epilogue import Epilogue, parse_epilogue
from schedules.launch import Call, In, Launch, Out, Scalar
from schedules.loopnest import Alloc, Assign, Call as Stmt, Comment, For, Function, If, LoopModule, Param
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Lowered, Template
from schedules.templates.dense import DenseTemplate, _problem, _prod

F0 = "np.float32(0.0)"
SYNC = Stmt("cuda.syncthreads()")
BASE_REGS = 24       # indices, pointers, loop counters: what every thread holds besides the tiles


def gemm_knobs() -> list[Knob]:
    """The knobs of the tiled GEMM kernel (dense and batch_matmul share them)."""
    return [
        Knob("BM", (16, 32, 64, 128)), Knob("BN", (16, 32, 64, 128)), Knob("BK", (4, 8, 16, 32)),
        Knob("TM", (1, 2, 4, 8)), Knob("TN", (1, 2, 4, 8)),
        Knob("vec", (1, 2, 4)), Knob("unroll", (1, 2, 4, 8, 16, 32)), Knob("double", (False, True)),
        Knob("WN", (4, 8, 16, 32)),
    ]


@dataclass(frozen=True)
class Tiling:
    """A config of the GEMM kernel, and the arithmetic of its block."""
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    vec: int
    unroll: int
    double: bool
    wn: int = 32   # warp tile: a warp's threads are WN along N by 32/WN along M

    @classmethod
    def of(cls, cfg) -> "Tiling":
        return cls(*(cfg[k] for k in ("BM", "BN", "BK", "TM", "TN", "vec", "unroll", "double", "WN")))

    @property
    def warp_tile(self) -> tuple[int, int]:
        """(rows, columns) of C one warp computes: (32/WN * TM) x (WN * TN). Its shape decides
        how many distinct As/Bs words a warp reads per k (WN of Bs, 32/WN of As: the rest are
        broadcasts) and how wide each warp's stores of C are."""
        return (32 // self.wn) * self.tm, self.wn * self.tn

    def thread_coords(self) -> tuple:
        """tx (along N), ty (along M) of thread `tid`: warps tile the block in WN x 32/WN groups."""
        if self.wn >= self.tx:   # one warp spans whole rows of threads: the row-major order
            return Assign("tx", f"tid % {self.tx}"), Assign("ty", f"tid // {self.tx}")
        warps_n, rows = self.tx // self.wn, 32 // self.wn
        return (Assign("lane", "tid % 32"), Assign("warp", "tid // 32"),
                Assign("tx", f"(warp % {warps_n}) * {self.wn} + lane % {self.wn}"),
                Assign("ty", f"(warp // {warps_n}) * {rows} + lane // {self.wn}"))

    @property
    def tx(self) -> int:          # threads along N
        return self.bn // self.tn

    @property
    def ty(self) -> int:          # threads along M
        return self.bm // self.tm

    @property
    def threads(self) -> int:
        return self.tx * self.ty

    @property
    def a_pad(self) -> int:
        """Padding of As rows: the transposing stores of one warp (32 // (BK/vec) rows of A
        per k) then fall in distinct banks."""
        rows_per_warp = max(1, 32 // (self.bk // self.vec))
        return (rows_per_warp - self.bm) % 32

    @property
    def buffers(self) -> int:
        return 2 if self.double else 1

    @property
    def shared_bytes(self) -> int:
        return 4 * self.buffers * self.bk * (self.bm + self.a_pad + self.bn)

    def loads(self, rows: int, cols: int) -> int:
        """Cooperative loads per thread for a rows x cols slice (vec elements each)."""
        return -(-(rows * cols // self.vec) // self.threads)

    @property
    def regs(self) -> int:
        """Registers per thread, estimated high. Fitted to ptxas -v (sm_80) on the kernels
        numba-cuda 0.30 makes of 17 random configs (40 to 192 registers; the estimate is
        0-30% above each): per accumulator ~2.8 (its fragments and 64-bit addressing
        scale with it), per cooperative load ~4 + ~3.5 per element (64-bit indices, values
        in flight), the prefetched slice when double-buffered, and a base."""
        loads = self.loads(self.bm, self.bk) + self.loads(self.bk, self.bn)
        staged = loads * self.vec if self.double else 0
        return 3 * self.tm * self.tn + 4 * loads + 4 * loads * self.vec + staged + BASE_REGS

    def why_not(self) -> str | None:
        """Configs that are legal for the device but not sensible kernels."""
        if self.unroll > self.bk:
            return f"unroll {self.unroll} exceeds the k slice BK={self.bk}"
        if self.threads < 32:
            return f"{self.threads} threads per block: less than a warp"
        if self.wn > self.tx:   # the same code as WN = the threads along N: one config for it
            return f"warp tile WN={self.wn} is wider than the block's {self.tx} threads along N"
        if self.wn < self.tx and (self.tx % self.wn or self.ty % (32 // self.wn)):
            return f"warp tile {self.wn}x{32 // self.wn} does not tile the {self.tx}x{self.ty} threads of the block"
        return None


def gemm_constraint(template, wl: Workload):
    """The space's constraint: a sensible kernel (`Tiling.why_not`) that fits the device."""
    fit = gpu.constraint(template, wl)
    return lambda values: Tiling.of(values).why_not() or fit(values)


def gemm_resources(t: Tiling, nb: int, M: int, N: int, K: int, extra_bytes: int = 0) -> gpu.Resources:
    n_bm, n_bn = gpu.blocks_for(M, t.bm), gpu.blocks_for(N, t.bn)
    moved = 4 * nb * (M * K * n_bn + K * N * n_bm + M * N) + extra_bytes   # A per column tile, B per row tile
    return gpu.Resources(threads=t.threads, blocks=nb * n_bm * n_bn, shared_bytes=t.shared_bytes,
                         regs_per_thread=t.regs, bytes_moved=moved, flops=2 * nb * M * N * K)


def gemm_default(space: ConfigSpace, nb: int, M: int, N: int) -> Config:
    """64x64 tiles of 4x4 per thread when the grid still has enough blocks to fill a GPU,
    smaller tiles (more, shorter-lived blocks) for small problems."""
    base = {"BK": 8, "vec": 1, "unroll": 8}
    # WN = the threads along N: warps span whole rows of the block's threads (row-major)
    if nb * gpu.blocks_for(M, 64) * gpu.blocks_for(N, 64) >= 128:
        return space.validate({**base, "BM": 64, "BN": 64, "TM": 4, "TN": 4, "double": True, "WN": 16})
    if nb * gpu.blocks_for(M, 32) * gpu.blocks_for(N, 32) >= 64:
        return space.validate({**base, "BM": 32, "BN": 32, "TM": 2, "TN": 2, "double": True, "WN": 16})
    return space.validate({**base, "BM": 16, "BN": 16, "TM": 2, "TN": 2, "double": False, "WN": 8})


@dataclass(frozen=True)
class Operands:
    """How the kernel reaches its operands: `a(m, k)`, `b(k, n)` and the output row `row(m)`
    as expressions, and the statements that set up a block's batch (none for dense)."""
    a: object
    b: object
    row: object
    batch_setup: tuple = ()
    batched: bool = False


def _plus(expr: str, n: int) -> str:
    return f"{expr} + {n}" if n else expr


def _cooperative(t: Tiling, side: str, rows: int, cols: int) -> tuple:
    """Per-load row and column of this thread in a rows x cols slice (loop-invariant):
    load l of thread tid covers run tid + l * threads, runs of `vec` along the row."""
    runs_per_row = cols // t.vec
    out = []
    for ld in range(t.loads(rows, cols)):
        run = f"({_plus('tid', ld * t.threads)})" if ld else "tid"
        out.append(Assign(f"{side}r{ld}", f"{run} // {runs_per_row}"))
        out.append(Assign(f"{side}c{ld}", f"({run} % {runs_per_row})" + (f" * {t.vec}" if t.vec > 1 else "")))
    return tuple(out)


def _guarded(t: Tiling, rows: int, cols: int, ld: int, body: tuple) -> tuple:
    """`body` only for the threads whose load `ld` lies in the slice (a last, partial round)."""
    left = rows * cols // t.vec - ld * t.threads
    return body if left >= t.threads else (If(f"tid < {left}", body),)


def _slice_loads(t: Tiling, ops: Operands, k0: str, into) -> tuple:
    """Statements reading the A and B slices at k0 from global memory; `into(side, ld, v,
    value_stmt_maker)` says where each element goes (shared memory, or registers)."""
    out = []
    for ld in range(t.loads(t.bm, t.bk)):
        body = [Assign("gm", f"bm0 + ar{ld}")]
        for v in range(t.vec):
            body += [Assign("gk", _plus(f"{k0} + ac{ld}", v)),
                     *into("a", ld, v, ops.a("gm", "gk"), "gm < M and gk < K")]
        out += _guarded(t, t.bm, t.bk, ld, tuple(body))
    for ld in range(t.loads(t.bk, t.bn)):
        body = [Assign("gk", f"{k0} + br{ld}")]
        for v in range(t.vec):
            body += [Assign("gn", _plus(f"bn0 + bc{ld}", v)),
                     *into("b", ld, v, ops.b("gk", "gn"), "gk < K and gn < N")]
        out += _guarded(t, t.bk, t.bn, ld, tuple(body))
    return tuple(out)


def _shared_slot(side: str, ld: int, v: int, buf: str) -> str:
    # As is transposed: As[buf, k, m]; Bs[buf, k, n]
    return f"As[{buf}, {_plus(f'ac{ld}', v)}, ar{ld}]" if side == "a" else f"Bs[{buf}, br{ld}, {_plus(f'bc{ld}', v)}]"


def _to_shared(buf: str):
    def into(side, ld, v, value, cond):
        return (If(cond, (Assign(_shared_slot(side, ld, v, buf), value),),
                   (Assign(_shared_slot(side, ld, v, buf), F0),)),)
    return into


def _to_registers(side, ld, v, value, cond):
    reg = f"p{side}{ld}_{v}"
    return (If(cond, (Assign(reg, value),), (Assign(reg, F0),)),)


def _commit(t: Tiling, buf: str) -> tuple:
    """The prefetched registers into shared buffer `buf`."""
    out = []
    for side, rows, cols in (("a", t.bm, t.bk), ("b", t.bk, t.bn)):
        for ld in range(t.loads(rows, cols)):
            body = tuple(Assign(_shared_slot(side, ld, v, buf), f"p{side}{ld}_{v}") for v in range(t.vec))
            out += _guarded(t, rows, cols, ld, body)
    return tuple(out)


def _multiply(t: Tiling, buf: str) -> tuple:
    """The register tile's multiply-adds over one staged slice, its k loop unrolled by `unroll`."""
    def step(kk: str) -> tuple:
        return tuple(Assign(f"a{i}", f"As[{buf}, {kk}, {_plus('ty', i * t.ty)}]") for i in range(t.tm)) \
            + tuple(Assign(f"b{j}", f"Bs[{buf}, {kk}, {_plus('tx', j * t.tx)}]") for j in range(t.tn)) \
            + tuple(Assign(f"c{i}_{j}", f"a{i} * b{j}", "+") for i in range(t.tm) for j in range(t.tn))
    if t.unroll >= t.bk:
        return tuple(s for kk in range(t.bk) for s in step(str(kk)))
    body = tuple(s for u in range(t.unroll) for s in step(_plus("kk", u)))
    return (For("kk", "0", str(t.bk), body, step=str(t.unroll)),)


def _store(t: Tiling, ops: Operands, epi: Epilogue) -> tuple:
    """The register tile through the epilogue into C, edges skipped."""
    assigns, result = epi.emit("v", "row", "gj", "e")
    out = []
    for i in range(t.tm):
        cols = []
        for j in range(t.tn):
            cols += [Assign("gj", _plus("bn0 + tx", j * t.tx)),
                     If("gj < N", (Assign("v", f"c{i}_{j}"),) + tuple(Assign(n, e) for n, e in assigns)
                        + (Assign("out[row, gj]", result),))]
        out += [Assign("gi", _plus("bm0 + ty", i * t.ty)),
                If("gi < M", (Assign("row", ops.row("gi")),) + tuple(cols))]
    return tuple(out)


def gemm_kernel(name: str, t: Tiling, ops: Operands, epi: Epilogue, params: tuple) -> Function:
    """The tiled GEMM kernel over a 1-D grid of (batch, row tile, column tile) blocks."""
    # as `gpu.blocks_for` counts them on the host: at least one block per dimension
    grid = (Assign("n_bm", f"max(1, (M + {t.bm - 1}) // {t.bm})"), Assign("n_bn", f"max(1, (N + {t.bn - 1}) // {t.bn})"),
            Assign("blk", "cuda.blockIdx.x"))
    if ops.batched:
        grid += (Assign("bt", "blk // (n_bm * n_bn)"), Assign("blk", "blk % (n_bm * n_bn)")) + ops.batch_setup
    body = grid + (
        Assign("bm0", f"(blk // n_bn) * {t.bm}"), Assign("bn0", f"(blk % n_bn) * {t.bn}"),
        Assign("tid", "cuda.threadIdx.x"), *t.thread_coords(),
        Alloc("As", (str(t.buffers), str(t.bk), str(t.bm + t.a_pad)), scope="shared"),
        Alloc("Bs", (str(t.buffers), str(t.bk), str(t.bn)), scope="shared"),
    ) + _cooperative(t, "a", t.bm, t.bk) + _cooperative(t, "b", t.bk, t.bn) \
        + tuple(Assign(f"c{i}_{j}", F0) for i in range(t.tm) for j in range(t.tn)) \
        + (Assign("n_kt", f"(K + {t.bk - 1}) // {t.bk}"),)
    if t.double:
        body += tuple(Assign(f"p{side}{ld}_{v}", F0) for side, rows, cols in (("a", t.bm, t.bk), ("b", t.bk, t.bn))
                      for ld in range(t.loads(rows, cols)) for v in range(t.vec))
        body += (Comment("double buffering: slice kt+1 is fetched into registers while slice kt is multiplied"),) \
            + _slice_loads(t, ops, "0", _to_shared("0")) + (SYNC,) + (
            For("kt", "0", "n_kt", (
                Assign("cur", "kt % 2"),
                *_slice_loads(t, ops, f"(kt + 1) * {t.bk}", _to_registers),   # past K: zeros, never read
                *_multiply(t, "cur"),
                *_commit(t, "1 - cur"),
                SYNC,
            )),)
    else:
        body += (For("kt", "0", "n_kt", (
            Assign("k0", f"kt * {t.bk}"),
            *_slice_loads(t, ops, "k0", _to_shared("0")),
            SYNC,
            *_multiply(t, "0"),
            SYNC,
        )),)
    body += _store(t, ops, epi)
    return Function(name, params, epi.prelude() + body)


def tiling_doc(t: Tiling) -> str:
    return (f"block {t.bm}x{t.bn}, BK={t.bk}, thread tile {t.tm}x{t.tn} ({t.threads} threads), "
            f"warp tile {t.warp_tile[0]}x{t.warp_tile[1]}, vec={t.vec}, "
            f"unroll={t.unroll}, {'double' if t.double else 'single'}-buffered shared memory")


@lru_cache(maxsize=256)
def _sizes(wl: Workload) -> tuple[int, int, int, int]:
    """(M, N, K, bytes of the epilogue's inputs): asked once per config when a space is pruned."""
    a, b = _problem(wl)
    extras = parse_epilogue(wl, 2, wl.output_shape).extras
    return (_prod(a["shape"][:-1]), int(b["shape"][1]), int(b["shape"][0]),
            sum(4 * _prod(wl.inputs[e.input_index]["shape"]) for e in extras))


class CudaDenseTemplate(Template):
    name = "cuda_dense"
    version = 1
    kind = "cuda"

    def matches(self, wl: Workload) -> bool:
        return DenseTemplate.matches(self, wl)   # exactly the CPU dense's workloads

    def _mnk(self, wl: Workload) -> tuple[int, int, int]:
        return _sizes(wl)[:3]

    def space(self, wl: Workload) -> ConfigSpace:
        return ConfigSpace(gemm_knobs(), constraint=gemm_constraint(self, wl))

    def resources(self, wl: Workload, cfg) -> gpu.Resources:
        M, N, K, extra_bytes = _sizes(wl)
        return gemm_resources(Tiling.of(cfg), 1, M, N, K, extra_bytes)

    def default_config(self, wl: Workload) -> Config:
        M, N, _ = self._mnk(wl)
        return gemm_default(self.space(wl), 1, M, N)

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        t = Tiling.of(cfg)
        M, N, K = self._mnk(wl)
        epi = parse_epilogue(wl, 2, wl.output_shape)
        ops = Operands(a=lambda m, k: f"A[{m}, {k}]", b=lambda k, n: f"B[{k}, {n}]", row=lambda m: m)
        params = (Param("A", "float32[:, ::1]"), Param("B", "float32[:, ::1]")) \
            + tuple(Param(n, ty) for n, ty in epi.params()) \
            + (Param("out", "float32[:, ::1]"),) + tuple(Param(n, "int64") for n in ("M", "N", "K"))
        module = LoopModule((gemm_kernel("dense", t, ops, epi, params),),
                            doc=f"cuda dense kernel: {tiling_doc(t)}, epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"cuda_dense v{self.version}"})
        blocks = gpu.blocks_for(M, t.bm) * gpu.blocks_for(N, t.bn)
        call = Call("dense", (In(0, (M, K), "float32"), In(1, (K, N), "float32"),
                              *(e.arg(wl, M, N) for e in epi.extras), Out((M, N)),
                              Scalar(M), Scalar(N), Scalar(K)),
                    items=blocks, grid=(blocks,), block=(t.threads,))
        return Lowered(module, Launch((call,) if M * N else ()))   # an empty output: nothing to launch


register_template(CudaDenseTemplate())

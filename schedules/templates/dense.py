"""Dense: C[M, N] = A[..., M, K] @ B[K, N] with a fused elementwise epilogue.

The schedule that reaches the FMA peak with numba (FACTS.md): A and B packed
into panels (`Ap[it, k, 0:MR]`, `Bp[jt, k, 0:NR]`), an MR x NR register tile of
scalar locals (SLP-vectorized), cache blocking of the tile loops and of K, and
a parallel loop over blocks. The register tile, loop order and parallelism
change the code; block sizes are run-time arguments, so candidates that differ
only in them share one compile. Constant B is packed once, at prepare time.
"""
from __future__ import annotations

import numpy as np

from ir.workload import Workload
from schedules.parallel import num_threads, parallel_for
from schedules.epilogue import Epilogue, as_kernel_array, parse_epilogue
from schedules.loopnest import Alloc, Assign, Comment, For, Function, If, LoopModule, Param
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob, split_options
from schedules.template import Lowered, Template

# MR x NR register tiles (NR a multiple of the 8-float AVX2 vector), or "blas": library
# dispatch (NumPy's BLAS matmul) followed by the generated epilogue, as TVM's cblas extern.
REG_TILES = ("1x8", "1x16", "1x32", "2x16", "2x32", "3x16", "3x24", "4x8", "4x16", "4x24",
             "6x16", "8x8", "8x16", "12x8", "blas")
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

    def space(self, wl: Workload) -> ConfigSpace:
        a, b = _problem(wl)
        k_static = isinstance(a["sym"][-1], int)
        k_opts = split_options(b["shape"][0], lo=16) if k_static else (64, 128, 256, 512, 1024, 1 << 30)
        return ConfigSpace([
            Knob("regtile", REG_TILES),
            Knob("order", ("ij", "ji")),
            Knob("parallel", (True, False), code_shape=False),
            Knob("MB", BLOCKS, code_shape=False),
            Knob("NB", BLOCKS, code_shape=False),
            Knob("KB", k_opts, code_shape=False),
        ])

    def default_config(self, wl: Workload) -> Config:
        space = self.space(wl)
        kb = min(space.knobs[5].options, key=lambda v: abs(v - 256))
        # threads pay off only when each gets real work (~1 ms of it): waking one costs ~20 us
        return space.validate({"regtile": "4x16", "order": "ij", "parallel": wl.flops() >= 50_000_000,
                               "MB": 4, "NB": 4, "KB": kb})

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        a, b = _problem(wl)
        K, N = b["shape"]
        epi = parse_epilogue(wl, 2, wl.output_shape)
        if cfg["regtile"] == "blas":
            return self._lower_blas(wl, cfg, epi, K, N)
        mr, nr = (int(x) for x in cfg["regtile"].split("x"))
        threads = num_threads() if cfg["parallel"] else 1
        module = LoopModule((_pack_a(mr), _pack_b(nr), _blocks(mr, nr, cfg["order"], epi)),
                            doc=f"dense kernel: regtile={mr}x{nr} order={cfg['order']}, epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"dense v{self.version}"})
        MB, NB, KB = cfg["MB"], cfg["NB"], cfg["KB"]
        b_const = b["const"]

        def pack_b(funcs, B):
            B = as_kernel_array(B)
            Bp = np.empty((-(-N // nr), K, nr), np.float32)
            funcs["pack_b"](B, Bp, K, N)
            return Bp

        def prepare(funcs, arrays):
            return {"Bp": pack_b(funcs, arrays[1]) if b_const else None, **_const_extras(wl, epi, arrays)}

        def launch(funcs, state, arrays, out):
            A = as_kernel_array(arrays[0]).reshape(-1, K)
            M = A.shape[0]
            n_mt, n_nt = -(-M // mr), -(-N // nr)
            Ap = np.empty((n_mt, K, mr), np.float32)
            Bp = state["Bp"] if b_const else pack_b(funcs, arrays[1])
            extras = _extras(epi, state, arrays, M, N)
            Cp = np.empty((M, N) if KB < K else (1, 1), np.float32)
            parallel_for(funcs["pack_a"], (A, Ap, M, K), threads, n_mt)
            parallel_for(funcs["blocks"], (Ap, Bp, *extras, out.reshape(M, N), Cp, M, N, K, MB, NB, KB), threads,
                         -(-n_mt // MB) * -(-n_nt // NB))

        return Lowered(module, prepare, launch)

    def _lower_blas(self, wl: Workload, cfg: Config, epi: Epilogue, K: int, N: int) -> Lowered:
        threads = num_threads() if cfg["parallel"] else 1
        fns = (_epilogue_rows(epi),) if epi.steps else ()
        module = LoopModule(fns, doc=f"dense via BLAS, epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"dense v{self.version}"})

        def prepare(funcs, arrays):
            return {"B": as_kernel_array(arrays[1]) if wl.inputs[1]["const"] else None,
                    **_const_extras(wl, epi, arrays)}

        def launch(funcs, state, arrays, out):
            A = as_kernel_array(arrays[0]).reshape(-1, K)
            M = A.shape[0]
            B = state["B"] if state["B"] is not None else as_kernel_array(arrays[1])
            out2 = out.reshape(M, N)
            np.matmul(A, B, out=out2)
            if epi.steps:
                extras = _extras(epi, state, arrays, M, N)
                parallel_for(funcs["epilogue"], (out2, *extras, M, N), threads, M)

        return Lowered(module, prepare, launch)


def _const_extras(wl: Workload, epi: Epilogue, arrays) -> dict:
    """Constant epilogue operands whose kernel view does not depend on M (bias, scalars),
    converted once at prepare time instead of on every call."""
    return {e.param: e.view(arrays[e.input_index], 0, 0) for e in epi.extras
            if wl.inputs[e.input_index]["const"] and e.mode in ("row", "scalar")}


def _extras(epi: Epilogue, state: dict, arrays, M: int, N: int) -> list:
    return [state[e.param] if e.param in state else e.view(arrays[e.input_index], M, N) for e in epi.extras]


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
    body = (
        Assign("n_nt", f"(N + {nr - 1}) // {nr}"),
        For("jt", "0", "n_nt", body=(
            For("k", "0", "K", (
                For("c", "0", str(nr), (
                    Assign("j", f"jt * {nr} + c"),
                    If("j < N", (Assign("Bp[jt, k, c]", "B[k, j]"),), (Assign("Bp[jt, k, c]", F0),)),
                )),
            )),
        )),
    )
    return Function("pack_b", (Param("B", "float32[:, ::1]"), Param("Bp", "float32[:, :, ::1]"),
                               Param("K", "int64"), Param("N", "int64")), body)


def _micro_kernel(mr: int, nr: int, epi: Epilogue) -> tuple:
    """Register tile over one K block, then a compact (not unrolled) store loop:
    partial sums of earlier K blocks live in Cp, the epilogue runs on the last block."""
    acc = [[f"c{r}_{c}" for c in range(nr)] for r in range(mr)]
    k_body = tuple(Assign(f"a{r}", f"Ap[it, k, {r}]") for r in range(mr)) \
        + tuple(Assign(f"b{c}", f"Bp[jt, k, {c}]") for c in range(nr)) \
        + tuple(Assign(acc[r][c], f"a{r} * b{c}", "+") for r in range(mr) for c in range(nr))
    assigns, result = epi.emit("v", "i", "j", "e")
    store = (
        Assign("i", "i0 + r"),
        If("i < M", (
            For("c", "0", f"min({nr}, N - j0)", (
                Assign("j", "j0 + c"),
                Assign("v", "ct[r, c]"),
                If("kb > 0", (Assign("v", "Cp[i, j]", "+"),)),
                If("kb < n_kb - 1", (Assign("Cp[i, j]", "v"),),
                   tuple(Assign(n, e) for n, e in assigns) + (Assign("out[i, j]", result),)),
            )),
        )),
    )
    return (
        Assign("i0", f"it * {mr}"), Assign("j0", f"jt * {nr}"),
    ) + tuple(Assign(acc[r][c], F0) for r in range(mr) for c in range(nr)) + (
        Comment(f"{mr}x{nr} register tile: scalar accumulators that LLVM's SLP pass vectorizes"),
        For("k", "k0", "k1", k_body),
    ) + tuple(Assign(f"ct[{r}, {c}]", acc[r][c]) for r in range(mr) for c in range(nr)) + (
        For("r", "0", str(mr), store),
    )


def _blocks(mr: int, nr: int, order: str, epi: Epilogue) -> Function:
    """Blocks t, t+T, ... of (ib, jb) tiles, each over all K blocks. Serial code with
    nogil: threads run copies of it (numba's parallel=True would compile it ~3x slower)."""
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
        + (Param("out", "float32[:, ::1]"), Param("Cp", "float32[:, ::1]")) \
        + tuple(Param(n, "int64") for n in ("M", "N", "K", "MB", "NB", "KB"))


register_template(DenseTemplate())

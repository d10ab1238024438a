"""Conv2d on the GPU: implicit GEMM (NCHW or NHWC), and a direct kernel for depthwise.

The workloads are exactly those of the CPU `conv2d` template (its `matches`, geometry and
epilogue parser are imported): NCHW float32 Conv (+ bias) with strides, pads, dilations,
groups, and a fused elementwise epilogue.

Implicit GEMM: the output pixels of all images are the GEMM's M (M = N*OH*OW), the output
channels of a group its N, the reduction K = C/G * KH * KW. A block computes a BM x BN
tile of the output; per K slice of BK, its threads gather the BK x BM slice of the input
(im2col on the fly: each element's (channel, kh, kw) and pixel are decoded from its index,
out-of-image taps read zero) and the BK x BN slice of the weights into shared memory, then
each thread accumulates a TM x TN register tile. A thread's pixels and channels are strided
by the block's thread grid (tm + i*BM/TM, tn + j*BN/TN): consecutive threads read
consecutive shared words (no bank conflicts) and store consecutive pixels (coalesced NCHW
stores). Weights are re-laid out once, at prepare time, into Wt[G, K, OCg] (channels
contiguous: the B loads are coalesced). `prefetch` loads the next K slice from global memory
into registers while the current one is multiplied (register double buffering: the loads'
latency hides behind the FMAs, one shared buffer still suffices).

`layout`: NCHW gathers the input as it is (consecutive threads take consecutive pixels:
consecutive addresses for stride-1 rows); NHWC first transposes the input per call into a
workspace Xt[N, H*W, C] (a 32x32 shared-memory tiled transposition, coalesced both ways)
and orders K as (kh, kw, channel), so consecutive threads gather consecutive channels: the
better layout where the image is small and channels many (late layers).

Depthwise (one input channel per group: G == C) is a direct kernel: each thread computes
`opt` outputs of one row (strided by the row's thread count, so a warp's loads and stores
are coalesced), its KH*KW weights read once for all of them.

Kernel size, strides, dilations and tile sizes are code constants; the tensors' sizes and
pads are run-time arguments, so every shape of a signature shares one compile.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ir.workload import Workload
from schedules import gpu
from schedules.epilogue import Epilogue, Extra
from schedules.launch import Buffer, Call, In, Launch, Out, Packed, Scalar, Table, Work
from schedules.loopnest import UNROLLED, Alloc, Assign, Call as Stmt, Comment, For, Function, If, LoopModule, Param
from schedules.microkernel import F0
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.templates.conv2d import Conv2dTemplate, _epilogue, _geometry
from schedules.template import Lowered, Template

_CPU = Conv2dTemplate()
SIZES = ("N", "C", "H", "W", "OC", "G", "OH", "OW", "PT", "PL")
PACK_THREADS = 256
TILE = 32          # the transposition's tile (TILE x TILE elements, TILE x 8 threads)


@dataclass(frozen=True)
class _Broadcast(Extra):
    """An epilogue input broadcast to the output (e.g. [1, OC, OH, 1]), read in place as a
    4-D array at the output's (n, oc, oh, ow), its size-1 axes at 0: no broadcast copy."""
    dims: tuple = ()

    @property
    def type(self) -> str:
        return ("boolean" if self.dtype == "bool" else "float32") + "[:, :, :, ::1]"

    def load(self, i: str, j: str, c: str | None = None) -> str:
        idx = ("0" if d == 1 else v for v, d in zip(("n", "oc", "oh", "ow"), self.dims))
        return f"{self.param}[{', '.join(idx)}]"


def _gpu_epilogue(wl: Workload) -> tuple[Epilogue, tuple]:
    """The CPU parser's epilogue, with full extras of another shape read by broadcast indexing
    (the GPU gets no host-side broadcast), and the launch argument of each extra."""
    epi = _epilogue(wl)
    out = tuple(int(d) for d in wl.output_shape)
    N, OC, OH, OW = out
    extras, args = [], []
    for e in epi.extras:
        shape = tuple(int(d) for d in wl.inputs[e.input_index]["shape"])
        dims = (1,) * (4 - len(shape)) + shape
        if e.mode == "full" and dims != out:
            e = _Broadcast(e.input_index, e.mode, e.param, e.dtype, dims)
            args.append(In(e.input_index, dims, "bool" if e.dtype == "bool" else "float32"))
        else:
            args.append(e.arg(wl, N * OC, OH * OW))
        extras.append(e)
    return Epilogue(epi.steps, tuple(extras)), tuple(args)


def _store(epi: Epilogue, acc: str) -> tuple:
    """out[n, oc, oh, ow] = epilogue(acc + bias[oc]) (n, oc, oh, ow defined by the caller)."""
    assigns, result = epi.emit("v", "n * OC + oc", "oh * OW + ow", "e", c="oc")
    return (Assign("v", f"{acc} + bias[oc]"),) + tuple(Assign(n, e) for n, e in assigns) + (
        Assign("out[n, oc, oh, ow]", result),)


def _tail_params(epi: Epilogue) -> tuple:
    return (Param("bias", "float32[::1]"),) + tuple(Param(n, t) for n, t in epi.params()) + (
        Param("out", "float32[:, :, :, ::1]"),) + tuple(Param(n, "int64") for n in SIZES)


_PROBLEMS: dict = {}


def _problem(wl: Workload) -> dict:
    """Geometry (CPU parser) and the GEMM view of `wl`; remembered per workload, since pruning
    a space asks for it once per config."""
    p = _PROBLEMS.get(wl.key)
    if p is None:
        if len(_PROBLEMS) > 256:
            _PROBLEMS.clear()
        p = _PROBLEMS[wl.key] = _parse(wl)
    return p


def _parse(wl: Workload) -> dict:
    geo = dict(_geometry(wl))
    N, C, H, W = (int(d) for d in wl.inputs[0]["shape"])
    OC = int(wl.inputs[1]["shape"][0])
    OH, OW = (int(d) for d in wl.output_shape[2:])
    G = geo["G"]
    geo.update(N=N, C=C, H=H, W=W, OC=OC, OH=OH, OW=OW, Cg=C // G, OCg=OC // G, M=N * OH * OW,
               K=C // G * geo["KH"] * geo["KW"])
    return geo


def _depthwise(p: dict) -> bool:
    return p["Cg"] == 1


class CudaConv2dTemplate(Template):
    name = "cuda_conv2d"
    kind = "cuda"
    version = 1

    def matches(self, wl: Workload) -> bool:
        return _CPU.matches(wl)

    # -- knobs -------------------------------------------------------------------------
    def space(self, wl: Workload) -> ConfigSpace:
        if _depthwise(_problem(wl)):
            knobs = [Knob("threads", (64, 128, 256, 512)), Knob("opt", (1, 2, 4)), Knob("unroll", (True, False))]
        else:
            knobs = [Knob("BM", (16, 32, 64, 128)), Knob("BN", (16, 32, 64, 128)), Knob("BK", (8, 16, 32)),
                     Knob("TM", (2, 4, 8)), Knob("TN", (2, 4, 8)), Knob("layout", ("NCHW", "NHWC")),
                     Knob("unroll", (True, False)), Knob("prefetch", (True, False))]
        device = gpu.constraint(self, wl)

        def why(values: dict) -> str | None:
            threads = self._threads(values)
            if threads < 32:
                return f"{threads} threads per block: less than a warp"
            return device(values)
        return ConfigSpace(knobs, constraint=why)

    def default_config(self, wl: Workload) -> Config:
        """256 threads, 8-16 KiB of shared memory: fits every device, for every shape (sizes
        are run-time); the channel tile follows the output channels (a weight dimension)."""
        p = _problem(wl)
        if _depthwise(p):
            return self.space(wl).validate({"threads": 256, "opt": 2, "unroll": True})
        ocg = p["OCg"]
        bm, bn, tn = (64, 64, 4) if ocg >= 64 else (128, 32, 4) if ocg > 16 else (128, 16, 2)
        return self.space(wl).validate({"BM": bm, "BN": bn, "BK": 16, "TM": 4, "TN": tn, "layout": "NCHW",
                                        "unroll": True, "prefetch": True})

    @staticmethod
    def _threads(cfg) -> int:
        if cfg.get("threads") is not None:   # a Config or the constraint's dict
            return int(cfg["threads"])
        return (cfg["BM"] // cfg["TM"]) * (cfg["BN"] // cfg["TN"])

    def resources(self, wl: Workload, cfg) -> gpu.Resources:
        p = _problem(wl)
        flops = 2 * p["M"] * p["OC"] * p["K"]
        out_bytes = 4 * p["M"] * p["OC"]
        if _depthwise(p):
            rows = p["N"] * p["OC"] * p["OH"] * -(-p["OW"] // cfg["opt"])
            return gpu.Resources(cfg["threads"], gpu.blocks_for(rows, cfg["threads"]), 0, 24 + 2 * cfg["opt"],
                                 4 * (p["N"] * p["C"] * p["H"] * p["W"] + p["OC"] * p["K"]) + out_bytes, flops)
        threads = self._threads(cfg)
        bm, bn, bk, tm, tn = (cfg[k] for k in ("BM", "BN", "BK", "TM", "TN"))
        gm, gn = gpu.blocks_for(p["M"], bm), gpu.blocks_for(p["OCg"], bn)
        shared = 4 * bk * (_row(bm, cfg["layout"]) + bn)
        slots_a, slots_b = -(-bm * bk // threads), -(-bn * bk // threads)
        regs = tm * tn + tm + tn + 4 * slots_a + 2 * slots_b + 24
        if cfg["prefetch"]:   # the next slice's values wait in registers
            regs += slots_a + slots_b
        moved = 4 * p["G"] * (gn * p["M"] * p["K"] + gm * p["K"] * p["OCg"]) + out_bytes
        if cfg["layout"] == "NHWC":
            moved += 8 * p["N"] * p["C"] * p["H"] * p["W"]
        return gpu.Resources(threads, gm * gn * p["G"], shared, regs, moved, flops)

    # -- lowering ----------------------------------------------------------------------
    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        p = _problem(wl)
        epi, extra_args = _gpu_epilogue(wl)
        tables = {}
        if len(wl.ops[0]["in"]) == 3:
            bias = In(2, (p["OC"],), "float32")
        else:   # one code for convs with and without bias: these add zeros
            tables["bias0"] = np.zeros(p["OC"], np.float32)
            bias = Table("bias0")
        sizes = tuple(Scalar(p[n]) for n in SIZES)
        x = In(0, (p["N"], p["C"], p["H"], p["W"]), "float32")
        w = In(1, (p["OC"], p["K"]), "float32")
        geo = f"kernel {p['KH']}x{p['KW']} stride {p['SH']}x{p['SW']} dilation {p['DH']}x{p['DW']}"
        if _depthwise(p):
            threads, opt = cfg["threads"], cfg["opt"]
            rows = p["N"] * p["OC"] * p["OH"] * -(-p["OW"] // opt)
            fn = _direct(p, epi, threads, opt, cfg["unroll"])
            step = Call("conv_dw", (x, w, bias, *extra_args, Out(), *sizes),
                        grid=(gpu.blocks_for(rows, threads),), block=(threads,))
            module = LoopModule((fn,), doc=f"cuda conv2d, depthwise direct: {geo}, threads={threads} opt={opt}",
                                meta={"template": f"{self.name} v{self.version}"})
            return Lowered(module, Launch((step,), tables=tables))

        layout = cfg["layout"]
        G, K, OCg = p["G"], p["K"], p["OCg"]
        wt = Buffer("Wt", (G, K, OCg))
        w_const = wl.inputs[1]["const"]
        n_w = G * K * OCg
        pack = Call("pack_w", (w, Packed("Wt") if w_const else Work("Wt"), Scalar(G), Scalar(OCg), Scalar(p["Cg"])),
                    grid=(gpu.blocks_for(n_w, PACK_THREADS),), block=(PACK_THREADS,))
        steps, work = [], []
        if not w_const:
            steps.append(pack)
            work.append(wt)
        funcs = [_pack_w(p, layout)]
        if layout == "NHWC":
            hw = p["H"] * p["W"]
            work.append(Buffer("Xt", (p["N"], hw, p["C"])))
            funcs.append(_transpose())
            steps.append(Call("to_nhwc", (In(0, (p["N"], p["C"], hw), "float32"), Work("Xt"),
                                          Scalar(p["C"]), Scalar(hw)),
                              grid=(gpu.blocks_for(hw, TILE), gpu.blocks_for(p["C"], TILE), p["N"]), block=(TILE, 8)))
            x = Work("Xt")
        funcs.append(_gemm(p, epi, cfg))
        bm, bn = cfg["BM"], cfg["BN"]
        steps.append(Call("conv_gemm", (x, pack.args[1], bias, *extra_args, Out(), *sizes),
                          grid=(gpu.blocks_for(p["M"], bm), gpu.blocks_for(OCg, bn), G), block=(self._threads(cfg),)))
        module = LoopModule(tuple(funcs), doc=f"cuda conv2d, implicit GEMM {layout}: {geo}, "
                            f"block {bm}x{bn}x{cfg['BK']} thread {cfg['TM']}x{cfg['TN']} unroll={cfg['unroll']}, "
                            f"epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"{self.name} v{self.version}"})
        return Lowered(module, Launch(tuple(steps), prepare=(pack,) if w_const else (),
                                      packed=(wt,) if w_const else (), workspaces=tuple(work), tables=tables))


def _row(bm: int, layout: str) -> int:
    """The A tile's row length in shared memory: NHWC stores it transposed (threads run along
    k), so its rows get one word of padding against bank conflicts."""
    return bm + 1 if layout == "NHWC" else bm


def _tap(layout: str, s: int, base: str, khw: int, kw: int) -> tuple:
    """(c, kh, kw) of gather slot s in the K slice starting at `base`, and `kok`: inside K.
    NCHW orders K as (c, kh, kw) and decodes k = base + akk by constant divisors; NHWC orders it (kh, kw, c)
    and keeps (ar, ac) = divmod(k, Cg) per slot, advanced by `_advance` (no run-time division
    per element and slice)."""
    if layout == "NCHW":
        head = (Assign("k", f"{base} + akk{s}"), Assign("kok", "k < K"), Assign("c", f"k // {khw}"),
                Assign("r", f"k - c * {khw}"))
    else:
        head = (Assign("kok", f"ar{s} < {khw}"), Assign("c", f"ac{s}"), Assign("r", f"ar{s}"))
    return head + (Assign("kh", f"r // {kw}"), Assign("kw", f"r - kh * {kw}"))


def _advance(s: int, bk: int) -> tuple:
    """NHWC slot s to the next K slice: k += BK, as (ar, ac) = divmod(k, Cg); the division runs
    only where the slice crosses a channel boundary (once per Cg/BK slices)."""
    return (Assign(f"ac{s}", str(bk), "+"),
            If(f"ac{s} >= Cg", (Assign("q", f"ac{s} // Cg"), Assign(f"ar{s}", "q", "+"), Assign(f"ac{s}", "q * Cg", "-"))))


def _pack_w(p: dict, layout: str) -> Function:
    """W[OC, C/G*KH*KW] into Wt[g, k, oc] (k in the layout's K order), one element a thread:
    consecutive threads write consecutive channels."""
    khw = p["KH"] * p["KW"]
    if layout == "NCHW":
        src_k = (Assign("ks", "k"),)
    else:
        src_k = (Assign("rr", "k // Cg"), Assign("cc", "k - rr * Cg"), Assign("ks", f"cc * {khw} + rr"))
    body = (
        Assign("i", f"int64(cuda.blockIdx.x) * {PACK_THREADS} + cuda.threadIdx.x"),
        Assign("K", f"Cg * {khw}"),
        If("i < G * K * OCg", (
            Assign("ocl", "i % OCg"), Assign("rest", "i // OCg"), Assign("k", "rest % K"), Assign("g", "rest // K"),
            *src_k,
            Assign("Wt[g, k, ocl]", "Wsrc[g * OCg + ocl, ks]"),
        )),
    )
    params = (Param("Wsrc", "float32[:, ::1]"), Param("Wt", "float32[:, :, ::1]"),
              Param("G", "int64"), Param("OCg", "int64"), Param("Cg", "int64"))
    return Function("pack_w", params, body)


def _transpose() -> Function:
    """X[n, C, HW] -> Xt[n, HW, C] through a TILE x (TILE+1) shared tile (the padding column
    keeps the transposed reads free of bank conflicts): reads and writes both coalesced."""
    rows = TILE // 8
    load = tuple(
        (Assign("c", f"c0 + ty + {r * 8}"), Assign("q", "q0 + tx"),
         If("c < C and q < HW", (Assign(f"tile[ty + {r * 8}, tx]", "X[n, c, q]"),))) for r in range(rows))
    save = tuple(
        (Assign("q", f"q0 + ty + {r * 8}"), Assign("c", "c0 + tx"),
         If("q < HW and c < C", (Assign("Xt[n, q, c]", f"tile[tx, ty + {r * 8}]"),))) for r in range(rows))
    body = (
        Alloc("tile", (str(TILE), str(TILE + 1)), "float32", scope="shared"),
        Assign("tx", "cuda.threadIdx.x"), Assign("ty", "cuda.threadIdx.y"),
        Assign("q0", f"int64(cuda.blockIdx.x) * {TILE}"), Assign("c0", f"int64(cuda.blockIdx.y) * {TILE}"),
        Assign("n", "cuda.blockIdx.z"),
        *(s for grp in load for s in grp),
        Stmt("cuda.syncthreads()"),
        *(s for grp in save for s in grp),
    )
    params = (Param("X", "float32[:, :, ::1]"), Param("Xt", "float32[:, :, ::1]"), Param("C", "int64"),
              Param("HW", "int64"))
    return Function("to_nhwc", params, body)


def _gemm(p: dict, epi: Epilogue, cfg: Config) -> Function:
    bm, bn, bk, tm, tn = (cfg[k] for k in ("BM", "BN", "BK", "TM", "TN"))
    layout = cfg["layout"]
    tms, tns = bm // tm, bn // tn
    threads = tms * tns
    khw, KW = p["KH"] * p["KW"], p["KW"]
    slots_a, slots_b = -(-bm * bk // threads), -(-bn * bk // threads)

    # per-thread gather slots, fixed for the whole K loop: element e = tid + s*threads of the
    # tile; NCHW runs threads along pixels, NHWC along k (channels): the contiguous axis
    setup = []
    for s in range(slots_a):
        guard = (s + 1) * threads > bm * bk
        mm, kk = ("e % {0}".format(bm), "e // {0}".format(bm)) if layout == "NCHW" else \
            ("e // {0}".format(bk), "e % {0}".format(bk))
        setup += [Assign("e", f"tid + {s * threads}"), Assign(f"amm{s}", mm), Assign(f"akk{s}", kk),
                  Assign("am", f"m0 + amm{s}"),
                  Assign(f"aok{s}", f"am < M and e < {bm * bk}" if guard else "am < M"),
                  Assign("am", f"am if aok{s} else 0"),
                  Assign(f"an{s}", "am // P"), Assign("ap", f"am - an{s} * P"),
                  Assign("aoh", "ap // OW"), Assign("aow", "ap - aoh * OW"),
                  Assign(f"aih{s}", f"aoh * {p['SH']} - PT"), Assign(f"aiw{s}", f"aow * {p['SW']} - PL")]
        if guard:   # rows past the tile load nothing
            setup += [Assign(f"akk{s}", f"akk{s} if e < {bm * bk} else 0"),
                      Assign(f"amm{s}", f"amm{s} if e < {bm * bk} else 0")]
        if layout == "NHWC":
            setup += [Assign(f"ar{s}", f"akk{s} // Cg"), Assign(f"ac{s}", f"akk{s} - ar{s} * Cg")]
    for s in range(slots_b):
        guard = (s + 1) * threads > bn * bk
        setup += [Assign("e", f"tid + {s * threads}"), Assign(f"bnn{s}", f"e % {bn}"), Assign(f"bkk{s}", f"e // {bn}"),
                  Assign(f"bok{s}", f"n0 + bnn{s} < OCg and e < {bn * bk}" if guard else f"n0 + bnn{s} < OCg")]
        if guard:
            setup += [Assign(f"bkk{s}", f"bkk{s} if e < {bn * bk} else 0")]

    read = "X[an{s}, g * Cg + c, ih, iw]" if layout == "NCHW" else "X[an{s}, ih * W + iw, g * Cg + c]"

    def gather(base: str) -> list:
        """The K slice at `base` of this thread's slots into registers pa{s} (input), pb{s} (weights)."""
        out = []
        for s in range(slots_a):
            out += [*_tap(layout, s, base, khw, KW),
                    Assign("ih", f"aih{s} + kh * {p['DH']}"), Assign("iw", f"aiw{s} + kw * {p['DW']}"),
                    Assign(f"pa{s}", F0),
                    If(f"aok{s} and kok and ih >= 0 and ih < H and iw >= 0 and iw < W",
                       (Assign(f"pa{s}", read.format(s=s)),))]
            if layout == "NHWC":
                out += _advance(s, bk)
        for s in range(slots_b):
            out += [Assign("k", f"{base} + bkk{s}"), Assign(f"pb{s}", F0),
                    If(f"bok{s} and k < K", (Assign(f"pb{s}", f"Wt[g, k, n0 + bnn{s}]"),))]
        return out

    puts = []   # registers -> shared tiles (slots past a tile's end store nothing)
    for tile, reg, slots, size, idx in (("As", "pa", slots_a, bm * bk, "akk{s}, amm{s}"),
                                        ("Bs", "pb", slots_b, bn * bk, "bkk{s}, bnn{s}")):
        for s in range(slots):
            put = Assign(f"{tile}[{idx.format(s=s)}]", f"{reg}{s}")
            puts.append(If(f"tid + {s * threads} < {size}", (put,)) if (s + 1) * threads > size else put)

    acc = [[f"c{i}_{j}" for j in range(tn)] for i in range(tm)]
    fma = tuple(Assign(f"a{i}", f"As[kk, tm + {i * tms}]") for i in range(tm)) + \
        tuple(Assign(f"b{j}", f"Bs[kk, tn + {j * tns}]") for j in range(tn)) + \
        tuple(Assign(acc[i][j], f"a{i} * b{j}", "+") for i in range(tm) for j in range(tn))
    compute = For("kk", "0", str(bk), fma, UNROLLED if cfg["unroll"] else "serial")
    if cfg["prefetch"]:   # the next slice's global loads are in flight while this one is multiplied
        prologue = gather("0")
        k_body = (*puts, Stmt("cuda.syncthreads()"), If(f"k0 + {bk} < K", tuple(gather(f"k0 + {bk}"))),
                  compute, Stmt("cuda.syncthreads()"))
    else:
        prologue = []
        k_body = (*gather("k0"), *puts, Stmt("cuda.syncthreads()"), compute, Stmt("cuda.syncthreads()"))
    k_loop = For("k0", "0", "K", step=str(bk), body=k_body)
    store = []
    for i in range(tm):
        cols = []
        for j in range(tn):
            cols.append(Assign("ocl", f"n0 + tn + {j * tns}"))
            cols.append(If("ocl < OCg", (Assign("oc", "g * OCg + ocl"),) + _store(epi, acc[i][j])))
        store += [Assign("m", f"m0 + tm + {i * tms}"),
                  If("m < M", (Assign("n", "m // P"), Assign("q", "m - n * P"), Assign("oh", "q // OW"),
                               Assign("ow", "q - oh * OW"), *cols))]
    body = (
        Alloc("As", (str(bk), str(_row(bm, layout))), "float32", scope="shared"),
        Alloc("Bs", (str(bk), str(bn)), "float32", scope="shared"),
        Assign("tid", "int64(cuda.threadIdx.x)"),
        Assign("m0", f"int64(cuda.blockIdx.x) * {bm}"), Assign("n0", f"int64(cuda.blockIdx.y) * {bn}"),
        Assign("g", "int64(cuda.blockIdx.z)"),
        Assign("Cg", "C // G"), Assign("OCg", "OC // G"), Assign("K", f"Cg * {khw}"),
        Assign("P", "OH * OW"), Assign("M", "N * P"),
        Assign("tm", f"tid % {tms}"), Assign("tn", f"tid // {tms}"),
        Comment("gather slots (fixed over the K loop)"),
        *setup,
        *(Assign(a, F0) for row in acc for a in row),
        *prologue,
        Comment(f"K loop: stage a {bk}-deep slice of the input ({layout}) and of the weights, then "
                f"a {tm}x{tn} register tile per thread"),
        k_loop,
        Comment("epilogue: bias and the fused ops, coalesced NCHW stores"),
        *store,
    )
    x_type = "float32[:, :, :, ::1]" if layout == "NCHW" else "float32[:, :, ::1]"
    params = (Param("X", x_type), Param("Wt", "float32[:, :, ::1]")) + _tail_params(epi)
    return Function("conv_gemm", params, epi.prelude() + body)


def _direct(p: dict, epi: Epilogue, threads: int, opt: int, unroll: bool) -> Function:
    """One input channel per group: thread = `opt` outputs of one output row, at ow = j + r*Q
    (Q threads per row), so neighbouring threads read and write neighbouring pixels."""
    kind = UNROLLED if unroll else "serial"
    taps = tuple(
        (Assign("iw", f"(j + {r} * Q) * {p['SW']} - PL + kw * {p['DW']}"),
         If("iw >= 0 and iw < W", (Assign(f"acc{r}", "X[n, ci, ih, iw] * wv", "+"),))) for r in range(opt))
    loops = For("kh", "0", str(p["KH"]), (
        Assign("ih", f"oh * {p['SH']} - PT + kh * {p['DH']}"),
        If("ih >= 0 and ih < H", (
            For("kw", "0", str(p["KW"]), (
                Assign("wv", f"Wd[oc, kh * {p['KW']} + kw]"),
                *(s for tap in taps for s in tap),
            ), kind),
        )),
    ), kind)
    store = tuple(
        s for r in range(opt) for s in (
            Assign("ow", f"j + {r} * Q"), If("ow < OW", _store(epi, f"acc{r}"))))
    body = (
        Assign("gid", f"int64(cuda.blockIdx.x) * {threads} + cuda.threadIdx.x"),
        Assign("Q", f"(OW + {opt - 1}) // {opt}"),
        If("gid < N * OC * OH * Q", (
            Assign("j", "gid % Q"), Assign("rest", "gid // Q"), Assign("oh", "rest % OH"), Assign("rest", "rest // OH"),
            Assign("oc", "rest % OC"), Assign("n", "rest // OC"),
            Assign("ci", "oc // (OC // G)"),
            *(Assign(f"acc{r}", F0) for r in range(opt)),
            loops,
            *store,
        )),
    )
    params = (Param("X", "float32[:, :, :, ::1]"), Param("Wd", "float32[:, ::1]")) + _tail_params(epi)
    return Function("conv_dw", params, epi.prelude() + body)


register_template(CudaConv2dTemplate())

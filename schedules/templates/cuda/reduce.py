"""Reductions on the GPU: the workloads of the CPU `reduce` template (Softmax, LogSoftmax,
LayerNormalization with a fused elementwise prologue, Reduce{Sum,Mean,Max,Min} over
contiguous axes, GlobalAverage/MaxPool), matched by its own parser.

The input is viewed as [rows, L, inner] (L: the reduced extent), as on the CPU.

inner == 1: one block (`mode="block"`) or one warp (`mode="warp"`) per row at a time,
rows in a grid-stride loop. Threads stride over the row (coalesced: consecutive threads
read consecutive columns), each keeping a partial result; a warp combines its partials
with `cuda.shfl_down_sync` (full mask: every lane of the warp reaches it), and a block
combines its warps' results in shared memory (one slot per warp, then warp 0, with a
`cuda.syncthreads()` between the phases; the result goes to its own slot, so a second
reduction needs no extra barrier). Softmax = max pass, sum-of-exp pass, write pass;
LayerNormalization = mean pass, variance pass (two passes: no cancellation), normalize
with scale and bias. Each thread keeps the values of its first `cache` columns in
registers (computed once, in the first pass); columns beyond them are recomputed from the
inputs in each pass (re-read from L1/L2). Inputs broadcast against the reduced value are
indexed, never materialized.

inner > 1 (a middle axis): one thread per output element, looping over L (consecutive
threads read consecutive addresses).

Knobs: `mode` (code: block or warp reduction), `cache` (code: columns per thread kept in
registers, 0/4/8), `threads` (run-time: threads per block, multiples of 32) and `rows_per_block` (run-time: rows one block (or warp) handles, i.e.
the grid's size; inner > 1: outputs per thread, and `mode`/`cache` do not apply).
"""
from __future__ import annotations

import math

import numpy as np

from ir.graph import Node
from ir.ops import OPS
from ir.workload import Workload
from schedules import gpu
from schedules.launch import Call, In, Launch, Out, Scalar, Table
from schedules.loopnest import UNROLLED, Alloc, Assign, Call as Stmt, For, Function, If, LoopModule, Param
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Lowered, Template
from schedules.templates.elementwise import _strides
from schedules.templates.reduce import (REDUCE_OPS, ROW_OPS, ReduceTemplate, _anchor, _input_mode, _norm_shape, _row_inputs,
                                       _x_shape)

_CPU = ReduceTemplate()   # its `matches` says which workloads the family covers (not registered twice)
FULL = "0xffffffff"
F0, F1 = "np.float32(0.0)", "np.float32(1.0)"
IDENTITY = {"sum": F0, "max": "np.float32(-np.inf)", "min": "np.float32(np.inf)"}
COMBINE = {"sum": "{a} + {b}", "max": "max({a}, {b})", "min": "min({a}, {b})"}
UNSUPPORTED_PROLOGUE = {"Floor", "Ceil", "Round"}   # their CPU expressions use ufuncs numba-cuda lacks


def _broadcast_index(flat: str, full, shape) -> str:
    """Index into an input of `shape` (right-aligned, size-1 dims broadcast) of element `flat`
    of a C-ordered array of shape `full`."""
    s = (1,) * (len(full) - len(shape)) + tuple(shape)
    if s == tuple(full):
        return flat
    terms = []
    for d, (fd, fs, sd, ss) in enumerate(zip(full, _strides(full), s, _strides(s))):
        if sd == 1:
            continue
        coord = f"({flat})" if d == 0 else f"(({flat}) % {fd * fs})"
        coord = coord if fs == 1 else f"({coord} // {fs})"
        terms.append(coord if ss == 1 else f"{coord} * {ss}")
    return " + ".join(terms) or "0"


def _warp_function(kind: str) -> Function:
    """warp_<kind>(v): the warp's combined value, in every lane (shuffle tree, then lane 0's)."""
    steps = tuple(Assign("v", COMBINE[kind].format(a="v", b=f"cuda.shfl_down_sync({FULL}, v, {d})"))
                  for d in (16, 8, 4, 2, 1))
    return Function(f"warp_{kind}", (Param("v", "float32"),),
                    steps + (Stmt(f"return cuda.shfl_sync({FULL}, v, 0)"),), device=True)


def _block_function(kind: str) -> Function:
    """block_<kind>(v, sh): the block's combined value, in every thread. Warps combine in
    registers, warp 0 combines the warps' values from shared memory; the result has its own
    slot (sh[32]), so consecutive calls need no barrier between them."""
    return Function(f"block_{kind}", (Param("v", "float32"), Param("sh", "float32[::1]")), (
        Assign("lane", "cuda.threadIdx.x % 32"), Assign("warp", "cuda.threadIdx.x // 32"),
        Assign("nw", "(cuda.blockDim.x + 31) // 32"),
        Assign("v", f"warp_{kind}(v)"),
        If("lane == 0", (Assign("sh[warp]", "v"),)),
        Stmt("cuda.syncthreads()"),
        If("warp == 0", (
            Assign("w", f"sh[lane] if lane < nw else {IDENTITY[kind]}"),
            Assign("w", f"warp_{kind}(w)"),
            If("lane == 0", (Assign("sh[32]", "w"),)),
        )),
        Stmt("cuda.syncthreads()"),
        Stmt("return sh[32]"),
    ), device=True)


class CudaReduceTemplate(Template):
    name = "cuda_reduce"
    version = 1
    kind = "cuda"

    def matches(self, wl: Workload) -> bool:
        if not _CPU.matches(wl) or _anchor(wl) is None:   # the CPU-only forms: strided axes, Prod, L2...
            return False
        return not any(o["op"] in UNSUPPORTED_PROLOGUE for o in wl.ops)

    def space(self, wl: Workload) -> ConfigSpace:
        return ConfigSpace([
            Knob("mode", ("block", "warp")),
            Knob("cache", (0, 4, 8)),
            Knob("threads", (32, 64, 128, 256, 512, 1024), code_shape=False),
            Knob("rows_per_block", (1, 2, 4, 8), code_shape=False),
        ], constraint=gpu.constraint(self, wl))

    def default_config(self, wl: Workload) -> Config:
        _, rows, L, inner = _anchor(wl)
        # short rows: a warp each (no barriers); long rows: a block each
        mode = "warp" if inner == 1 and L <= 512 else "block"
        return self.space(wl).validate({"mode": mode, "cache": 4, "threads": 128 if mode == "warp" else 256,
                                         "rows_per_block": 1})

    def resources(self, wl: Workload, cfg: Config) -> gpu.Resources:
        k, rows, L, inner = _anchor(wl)
        threads, rpb = cfg["threads"], cfg["rows_per_block"]
        size = rows * L * inner
        op = wl.ops[k]["op"]
        passes = 3 if op in ("Softmax", "LogSoftmax", "LayerNormalization") else 1
        per_row = 32 if cfg["mode"] == "warp" else threads
        if inner == 1 and L <= cfg["cache"] * per_row:   # the row stays in registers: read once
            passes = 1
        reads = sum(math.prod(i["shape"]) for i in wl.inputs) * 4
        moved = passes * reads + math.prod(wl.output_shape) * 4
        flops = passes * size * (len(wl.ops) + 1)
        regs = 24 + 2 * len(wl.ops) + cfg["cache"]
        if inner > 1:
            return gpu.Resources(threads, gpu.blocks_for(rows * inner, threads * rpb), 0, regs, moved, flops)
        if cfg["mode"] == "warp":
            return gpu.Resources(threads, gpu.blocks_for(rows, threads // 32 * rpb), 0, regs, moved, flops)
        return gpu.Resources(threads, gpu.blocks_for(rows, rpb), 33 * 4, regs, moved, flops)

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        k, rows, L, inner = _anchor(wl)
        op = wl.ops[k]
        xshape = _x_shape(wl, k)
        refs = _row_inputs(wl, k)
        kind = op["op"] if op["op"] in ROW_OPS else REDUCE_OPS[op["op"]]
        res = self.resources(wl, cfg)
        xs = tuple(In(int(r[1:]), (math.prod(wl.inputs[int(r[1:])]["shape"]),), "float32") for r in refs)
        out = Out((math.prod(wl.output_shape),))
        tables = {}
        if inner > 1:
            fns = (_middle(kind, f"x{refs[0][1:]}"),)
            args = xs + (out, Scalar(rows), Scalar(L), Scalar(inner))
        else:
            ln = op["op"] == "LayerNormalization"
            norm = _norm_shape(xshape, L)
            affine = []
            if ln:   # scale and bias over the normalized dims (absent: 1 and 0)
                for idx, name, default in ((1, "scale", 1.0), (2, "shift", 0.0)):
                    if len(op["in"]) > idx:
                        ref = op["in"][idx]
                        shape = tuple(wl.inputs[int(ref[1:])]["shape"])
                        affine.append((name, _broadcast_index("c", norm, shape)))
                        xs += (In(int(ref[1:]), (math.prod(shape),), "float32"),)
                    else:
                        tables[name] = np.full(L, default, np.float32)
                        affine.append((name, "c"))
                        xs += (Table(name),)
            fns = _rows(wl, k, refs, xshape, L, kind, cfg["mode"], cfg["cache"], affine)
            eps = float(op["attrs"].get("epsilon", 1e-5))
            args = xs + (out, Scalar(rows), Scalar(L), Scalar(eps, "float32"))
        module = LoopModule(fns, doc=f"cuda reduce kernel: {'+'.join(o['op'] for o in wl.ops)} "
                                     f"{'middle axis' if inner > 1 else cfg['mode'] + ' per row'}",
                            meta={"template": f"cuda_reduce v{self.version}"})
        step = Call("reduce", args, items=res.blocks, grid=(res.blocks,), block=(cfg["threads"],))
        return Lowered(module, Launch((step,), tables=tables))


def _rows(wl, k, refs, xshape, L: int, kind: str, mode: str, cache: int, affine) -> tuple:
    """The kernel (and its device functions) reducing each row of [rows, L] in passes."""
    loads, per_row = {}, []
    for slot, r in enumerate(refs):
        shape = tuple(wl.inputs[int(r[1:])]["shape"])
        m, p = _input_mode(shape, xshape, L), f"x{r[1:]}"
        if m == "scalar":
            loads[r] = f"{p}[0]"
        elif m == "per":   # a trailing-dims input: row r reads its row r % (size // L)
            per_row.append(Assign(f"pb{slot}", f"(r % {math.prod(shape) // L}) * L"))
            loads[r] = f"{p}[pb{slot} + c]"
        elif tuple((1,) * (len(xshape) - len(shape)) + shape) == tuple(xshape):
            loads[r] = f"{p}[base + c]"
        else:   # broadcast against x: indexed from x's flat index
            loads[r] = f"{p}[{_broadcast_index('base + c', xshape, shape)}]"

    def value() -> tuple:
        """Statements computing the (prologue) value v at column c of row r."""
        if k == 0:
            return (Assign("v", loads[refs[0]]),)
        stmts, env = [], {}
        for m, o in enumerate(wl.ops[:k]):
            node = Node(o["op"], tuple(o["in"]), ("_",), dict(o["attrs"]))
            stmts.append(Assign(f"p{m}", OPS[o["op"]].expr(node, [env[r] if r.startswith("t") else loads[r] for r in o["in"]])))
            env[f"t{m}"] = f"p{m}"
        return tuple(stmts) + (Assign("v", f"np.float32({env[f't{k - 1}']})"),)

    lane, step = ("lane", "32") if mode == "warp" else ("tx", "bs")
    used = []

    def combine(red: str, acc: str) -> str:
        used.append(red)
        return f"warp_{red}({acc})" if mode == "warp" else f"block_{red}({acc}, sh)"

    passes = [0]

    def columns(then: tuple) -> tuple:
        """`then` for each column c of this thread, with v its value: the first `cache` columns
        from registers (the first pass computes and keeps them), the rest recomputed."""
        first = passes[0] == 0
        passes[0] += 1
        if not cache:
            return (For("c", lane, "L", value() + then, step=step),)
        kept = value() + (Assign("buf[cq]", "v"),) if first else (Assign("v", "buf[cq]"),)
        return (For("cq", "0", str(cache), kind=UNROLLED, body=(
                    Assign("c", f"{lane} + cq * {step}"), If("c < L", kept + then))),
                For("c", f"{lane} + {cache} * {step}", "L", value() + then, step=step))

    def sweep(init: str, update: tuple, red: str, result: str) -> tuple:
        """One pass over the row: each thread's partial s, then the combined `result`."""
        return (Assign("s", init), *columns(update), Assign(result, combine(red, "s")))

    def write(expr: str) -> tuple:
        return columns((Assign("out[base + c]", expr),))

    body = []
    if kind in ("Softmax", "LogSoftmax", "max"):
        body += sweep(IDENTITY["max"], (Assign("s", "max(s, v)"),), "max", "m")
    elif kind == "min":
        body += sweep(IDENTITY["min"], (Assign("s", "min(s, v)"),), "min", "m")
    else:
        body += sweep(F0, (Assign("s", "v", "+"),), "sum", "m")
    if kind in ("Softmax", "LogSoftmax"):
        body += sweep(F0, (Assign("s", "np.float32(math.exp(v - m))", "+"),), "sum", "tot")
        if kind == "Softmax":
            body += [Assign("inv", f"{F1} / tot"), *write("np.float32(math.exp(v - m)) * inv")]
        else:
            body += [Assign("ls", "m + np.float32(math.log(tot))"), *write("v - ls")]
    elif kind == "LayerNormalization":
        (_, sc), (_, sh_) = affine
        body += [Assign("mean", "m / np.float32(L)"),
                 *sweep(F0, (Assign("d", "v - mean"), Assign("s", "d * d", "+")), "sum", "var"),
                 Assign("inv", f"{F1} / np.float32(math.sqrt(var / np.float32(L) + eps))"),
                 *write(f"(v - mean) * inv * scale[{sc}] + shift[{sh_}]")]
    else:
        res = "m / np.float32(L)" if kind == "mean" else "m"
        body += [If(f"{lane} == 0", (Assign("out[r]", res),))]
    row = (Assign("base", "r * L"), *per_row, *body)
    if mode == "warp":   # warp w of the block takes row g * W + w: a warp-uniform guard, no barrier
        loop = (Assign("W", "bs // 32"),
                For("g", "cuda.blockIdx.x", "(rows + W - 1) // W", step="cuda.gridDim.x", body=(
                    Assign("r", "g * W + warp"), If("r < rows", row))))
    else:    # the whole block takes row r: the loop is block-uniform, so are its barriers
        loop = (Alloc("sh", ("33",), "float32", scope="shared"),
                For("r", "cuda.blockIdx.x", "rows", step="cuda.gridDim.x", body=row))
    params = tuple(Param(f"x{r[1:]}", "float32[::1]") for r in refs)
    if kind == "LayerNormalization":
        params += (Param("scale", "float32[::1]"), Param("shift", "float32[::1]"))
    params += (Param("out", "float32[::1]"), Param("rows", "int64"), Param("L", "int64"), Param("eps", "float32"))
    kernel = Function("reduce", params, (
        Assign("tx", "cuda.threadIdx.x"), Assign("bs", "cuda.blockDim.x"),
        Assign("lane", "tx % 32"), Assign("warp", "tx // 32"),
        *((Alloc("buf", (str(cache),), "float32"),) if cache else ()), *loop))
    reds = sorted(set(used))
    helpers = tuple(_warp_function(r) for r in reds)
    if mode == "block":
        helpers += tuple(_block_function(r) for r in reds)
    return helpers + (kernel,)


def _middle(kind: str, x: str) -> Function:
    """Reduce the middle axis of [rows, L, inner]: a thread per output element (r, i), which
    loops over L; consecutive threads read consecutive addresses."""
    red = "sum" if kind == "mean" else kind
    fin = (Assign("acc", "acc / np.float32(L)"),) if kind == "mean" else ()
    body = (
        Assign("bs", "cuda.blockDim.x"),
        For("o", "cuda.blockIdx.x * bs + cuda.threadIdx.x", "rows * inner", step="cuda.gridDim.x * bs", body=(
            Assign("r", "o // inner"), Assign("src", "r * L * inner + (o - r * inner)"),
            Assign("acc", IDENTITY[red]),
            For("l", "0", "L", (Assign("acc", COMBINE[red].format(a="acc", b=f"{x}[src + l * inner]")),)),
            *fin, Assign("out[o]", "acc"),
        )),
    )
    params = (Param(x, "float32[::1]"), Param("out", "float32[::1]"),
              Param("rows", "int64"), Param("L", "int64"), Param("inner", "int64"))
    return Function("reduce", params, body)


register_template(CudaReduceTemplate())

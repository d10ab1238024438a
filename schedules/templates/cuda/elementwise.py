"""Elementwise / injective chains on the GPU: the workloads of the CPU `elementwise` template
(broadcasting arithmetic, comparisons, Where, Cast, Transpose, Reshape, Expand, Slice,
Gather, Concat, Resize..., any element type numba has), as one numba-cuda kernel.

The per-element expression is the CPU template's (`schedules.templates.elementwise._Emitter`:
each op maps the output index to its inputs' indices, nothing in between is materialized);
only the loop around it differs. Threads walk the flat output in a grid-stride loop: a
block covers a tile of `threads * ept * vector` elements per step; thread `tx` computes, for
each of its `ept` chunks `u`, the `vector` consecutive elements at
`base + (u * threads + tx) * vector`, so a warp's loads and stores of one chunk are
contiguous (coalesced). The output index is split into coordinates (divisions by code
constants) unless every input is read at the flat index (the CPU's `flat` case). Tables
(Slice starts and steps, Resize taps and weights) are launch `Table`s, uploaded to device
memory once per bound kernel; Slice starts that are data are clamped by a one-thread
kernel into a workspace first.

Knobs: `vector` (code: consecutive elements per thread, 1/2/4), `ept` (code: chunks per
thread per grid step, unrolled), `threads` (run-time: threads per block) and `max_blocks`
(run-time: the grid's size cap; beyond it the grid-stride loop takes over).
"""
from __future__ import annotations

import math
import re

import numpy as np

from ir.ops.elementwise import NAN_AWARE, NUMBA_TYPES
from ir.workload import Workload
from schedules import gpu
from schedules.launch import Buffer, Call, In, Launch, Out, Scalar, Table, Work
from schedules.loopnest import UNROLLED, Assign, Call as Stmt, For, Function, If, LoopModule, Param
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Lowered, Template
from schedules.templates.elementwise import (MOVES, _at, _check, _consts, _Emitter, _resize_params, _slice_function,
                                             _slice_starts_steps)

# numpy ufuncs the CPU expressions use that numba-cuda does not compile (checked with
# `cuda.compile_ptx`): device functions of the same float32 semantics replace them
_ROUNDING = {"np.floor": "tt_floor", "np.ceil": "tt_ceil", "np.rint": "tt_rint"}
_ROUNDING_OPS = {"Floor", "Ceil", "Round"}
_EXACT = "np.float32(8388608.0)"   # 2**23: float32s this large (and inf) have no fraction


class _GpuEmitter(_Emitter):
    """The CPU emitter, with nothing hoisted out of a row: on the GPU every element is
    computed on its own (table loads are per element, from L1/L2)."""

    def hoisted(self, expr: str, index: str) -> str:
        return expr

    def index(self, g: str, size) -> str:
        """A kernel cannot raise on the GPU: an index out of range is clamped into its axis
        (negative ones count from the end), so no read leaves the array."""
        return f"min(max(({g} + {size} if {g} < 0 else {g}), 0), {size} - 1)"


def _rounding_functions(used: set) -> tuple:
    """Device functions for np.floor / np.ceil / np.rint over float32 (NaN, inf and values
    without a fraction are returned as they are)."""
    one, half = "np.float32(1.0)", "np.float32(0.5)"
    keep = If(f"v != v or abs(v) >= {_EXACT}", (Stmt("return v"),))
    bodies = {
        "tt_floor": (keep, Stmt("return np.float32(math.floor(v))")),
        "tt_ceil": (keep, Stmt("return np.float32(math.ceil(v))")),
        "tt_rint": (keep, Assign("f", "np.float32(math.floor(v))"), Assign("d", "v - f"),   # half to even, as ONNX
                    If(f"d > {half} or (d == {half} and math.fmod(f, np.float32(2.0)) != np.float32(0.0))",
                       (Stmt(f"return f + {one}"),)),
                    Stmt("return f")),
    }
    return tuple(Function(name, (Param("v", "float32"),), bodies[name], device=True) for name in sorted(used))


def _gpu_math(text: str, used: set) -> str:
    for np_name, fn in _ROUNDING.items():
        if np_name + "(" in text:
            used.add(fn)
            text = re.sub(rf"\b{re.escape(np_name)}\(", fn + "(", text)
    return text


def _delinearize(var: str, shape) -> tuple:
    """o0..o{R-1} of flat index `var` over `shape` (C order), by constant divisions."""
    out, rest = [], var
    for a in range(len(shape) - 1, -1, -1):
        d = shape[a]
        out.append(Assign(f"o{a}", "0" if d == 1 else (rest if a == 0 else f"{rest} % {d}")))
        if a and d != 1:
            out.append(Assign("q", f"{rest} // {d}"))
            rest = "q"
    return tuple(out)


class CudaElementwiseTemplate(Template):
    name = "cuda_elementwise"
    version = 1
    kind = "cuda"

    def matches(self, wl: Workload) -> bool:
        got = _check(wl)
        if got is None:
            return False
        types = got[0]
        # Floor/Ceil/Round are coded for float32 only here (see _rounding_functions)
        return all(types[o["in"][0]][1] == "float32" for o in wl.ops if o["op"] in _ROUNDING_OPS)

    def space(self, wl: Workload) -> ConfigSpace:
        return ConfigSpace([
            Knob("vector", (1, 2, 4)),
            Knob("ept", (1, 2, 4, 8)),
            Knob("threads", (32, 64, 128, 256, 512, 1024), code_shape=False),
            Knob("max_blocks", (8, 128, 2048, 1 << 20), code_shape=False),
        ], constraint=gpu.constraint(self, wl))

    def default_config(self, wl: Workload) -> Config:
        return self.space(wl).validate({"vector": 1, "ept": 4, "threads": 256, "max_blocks": 1 << 20})

    def resources(self, wl: Workload, cfg: Config) -> gpu.Resources:
        total = math.prod(wl.output_shape)
        per_thread = cfg["vector"] * cfg["ept"]
        blocks = min(cfg["max_blocks"], gpu.blocks_for(total, cfg["threads"] * per_thread))
        moved = sum(math.prod(i["shape"]) * np.dtype(i["dtype"]).itemsize for i in wl.inputs if "value" not in i)
        moved += total * np.dtype(wl.output_dtype).itemsize
        # index arithmetic (~2 per axis) and one value per input per element in flight
        regs = 16 + 2 * len(wl.output_shape) + per_thread * (1 + len(wl.inputs))
        return gpu.Resources(threads=cfg["threads"], blocks=blocks, regs_per_thread=min(255, regs),
                             bytes_moved=moved, flops=total * len(wl.ops))

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        types, loaded, resizes = _check(wl)
        plans = {k: plan for k, (plan, _) in resizes.items()}
        shapes = {r: t[0] for r, t in types.items()}
        out_shape = tuple(wl.output_shape)
        R, total = len(out_shape), math.prod(out_shape)
        flat = R <= 1 or (all(o["op"] not in MOVES for o in wl.ops) and all(
            shapes[r] == out_shape or math.prod(shapes[r]) == 1 for r in loaded))
        last = f"t{len(wl.ops) - 1}"
        if flat and R > 1:   # every input full-shape or a scalar: read at the flat index i
            em = _GpuEmitter(wl, types, plans, flat=True)
            value, coords = em.load(last, None), ()
        else:
            em = _GpuEmitter(wl, types, plans)
            value = em.load(last, ["i"] if R == 1 else [f"o{a}" for a in range(R)])
            coords = () if R <= 1 else _delinearize("i", out_shape)
        used: set = set()
        value = _gpu_math(value, used)
        pre = tuple(Assign(a.target, _gpu_math(a.value, used)) for a in em.pre)
        V, E = cfg["vector"], cfg["ept"]
        element = (
            Assign("i", f"base + (eu * bs + tx) * {V} + ev" if V > 1 else "base + eu * bs + tx"),
            If("i < n", coords + pre + (Assign(_at("out", "i"), value),)),
        )
        body = (
            *em.top.values(),
            Assign("tx", "cuda.threadIdx.x"), Assign("bs", "cuda.blockDim.x"), Assign("tile", f"bs * {E * V}"),
            For("base", "cuda.blockIdx.x * tile", "n", step="cuda.gridDim.x * tile", body=(
                For("eu", "0", str(E), kind=UNROLLED, body=(
                    For("ev", "0", str(V), kind=UNROLLED, body=element),)),
            )),
        )
        nodes = wl.nodes()
        slices = [k for k, o in enumerate(wl.ops) if o["op"] == "Slice"]
        params = tuple(Param(f"x{r[1:]}", f"{NUMBA_TYPES[types[r][1]]}[::1]") for r in loaded)
        params += tuple(Param(f"sl{k}", "int64[::1]") for k in slices) + _resize_params(nodes, plans)
        params += (Param("out", f"{NUMBA_TYPES[wl.output_dtype]}[::1]"), Param("n", "int64"))
        # IsNaN / IsInf must see NaN and inf: no fastmath for them
        fast = {} if not any(o["op"] in NAN_AWARE for o in wl.ops) else {"fastmath": ()}
        functions = [*_rounding_functions(used), Function("injective", params, body, **fast)]
        tables, steps, work, sl_args = {}, [], [], []
        consts = _consts(wl)
        for k in slices:
            in_shape = shapes[nodes[k].inputs[0]]
            known = _slice_starts_steps(nodes[k], in_shape, consts)
            if known is not None:
                tables[f"sl{k}"] = known
                sl_args.append(Table(f"sl{k}"))
                continue
            fn, args = _slice_function(nodes[k], k, in_shape, tables)
            # the CPU function strides over work items t, T: one GPU thread runs its one item
            functions.append(Function(fn.name, fn.params[:-2], (Assign("t", "0"), Assign("T", "1")) + fn.body))
            work.append(Buffer(f"sl{k}", (2 * len(in_shape),), "int64"))
            steps.append(Call(fn.name, args + (Work(f"sl{k}"),), grid=(1,), block=(1,)))
            sl_args.append(Work(f"sl{k}"))
        rz_args = []
        for k, (_, arrays) in resizes.items():
            for name, a in arrays:
                tables[name] = a
                rz_args.append(Table(name))
        module = LoopModule(tuple(functions),
                            doc=f"cuda elementwise kernel: {'+'.join(o['op'] for o in wl.ops)} "
                                f"{'flat' if flat else 'indexed'} vector={V} ept={E}",
                            meta={"template": f"cuda_elementwise v{self.version}"})
        xs = tuple(In(int(r[1:]), (math.prod(shapes[r]),), types[r][1]) for r in loaded)
        res = self.resources(wl, cfg)
        steps.append(Call("injective", xs + tuple(sl_args) + tuple(rz_args) + (Out((total,)), Scalar(total)),
                          items=res.blocks, grid=(res.blocks,), block=(cfg["threads"],)))
        return Lowered(module, Launch(tuple(steps), workspaces=tuple(work), tables=tables))


register_template(CudaElementwiseTemplate())

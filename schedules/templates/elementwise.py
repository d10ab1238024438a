"""Elementwise / injective chains: broadcasting arithmetic, Cast, Transpose, Reshape/Flatten/
Squeeze/Unsqueeze, Expand, Slice, Gather, Concat — one loop over the output index space.

Every output element is one expression: each op turns the index it is read at
into the index of its inputs (broadcast: 0 on size-1 dims; Transpose: permute;
Reshape: linearize/delinearize; Slice: start + step * i, with starts and steps
read at run time; Gather: an index loaded from the indices tensor; Concat: a
select by offset). Nothing in between is materialized. Shapes are code constants.

Knobs: `vector` (code) — `flat`: one flat loop over all elements (used when every
input is read at the output's flat index or is a scalar, otherwise the same as
`last`); `last`: rows of the output's last axis, the contiguous inner loop;
`unroll` (code) — the inner loop in chunks of 1/4/8 with a guarded tail; `RB`
(run-time) — elements (flat, x1024) or rows per work item; `parallel` (run-time).
"""
from __future__ import annotations

import math

import numpy as np

from ir.graph import Node, TensorType
from ir.ops import BROADCAST, ELEMWISE, OPS
from ir.workload import Workload
from schedules.epilogue import as_kernel_array
from schedules.loopnest import Assign, For, Function, If, LoopModule, Param
from schedules.parallel import num_threads, parallel_for
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Lowered, Template

MOVES = {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Slice", "Gather", "Concat", "Identity"}
SHAPE_ARGS = {"Reshape": {1}, "Squeeze": {1}, "Unsqueeze": {1}, "Expand": {1}, "Slice": {1, 2, 3, 4}}


def _shapes(wl: Workload):
    """Concrete shape of every value (i*, t*), forward by the ops' shape functions, then backward
    through Transpose/unary ops for the ones whose shape needs constant values; None if unknown."""
    shapes = {f"i{k}": tuple(i["shape"]) for k, i in enumerate(wl.inputs)}
    nodes = wl.nodes()
    for k, n in enumerate(nodes):
        try:
            types = [TensorType(shapes[r], "float32") if shapes.get(r) is not None else None for r in n.inputs]
            out = OPS[n.op].infer(n, types, [None] * len(types))[0].shape
            shapes[f"t{k}"] = tuple(int(d) for d in out)
        except Exception:
            shapes[f"t{k}"] = None
    last = f"t{len(nodes) - 1}"
    shapes[last] = tuple(wl.output_shape)
    for k in range(len(nodes) - 1, -1, -1):
        n, o = nodes[k], shapes[f"t{k}"]
        src = n.inputs[0]
        if o is None or not src.startswith("t") or shapes[src] is not None:
            continue
        if n.op == "Transpose":
            perm = list(n.attrs.get("perm") or reversed(range(len(o))))
            inv = [0] * len(perm)
            for a, p in enumerate(perm):
                inv[p] = o[a]
            shapes[src] = tuple(inv)
        elif OPS[n.op].kind == ELEMWISE and len(n.inputs) == 1:
            shapes[src] = o
    return shapes if all(v is not None for v in shapes.values()) else None


def _strides(shape):
    out, s = [], 1
    for d in reversed(shape):
        out.insert(0, s)
        s *= d
    return out


class _Emitter:
    """Builds the expression of a value at an index (a list of index expressions)."""

    def __init__(self, wl: Workload, shapes: dict):
        self.wl, self.shapes, self.nodes = wl, shapes, wl.nodes()
        self.pre: list[Assign] = []
        self.n_tmp = 0

    def flat(self, ref: str, idx) -> str:
        terms = [f"({i}) * {s}" if s != 1 else f"({i})" for i, s, d in zip(idx, _strides(self.shapes[ref]), self.shapes[ref])
                 if d != 1 and i != "0"]
        return " + ".join(terms) or "0"

    def load(self, ref: str, idx) -> str:
        shape = self.shapes[ref]
        if ref.startswith("i"):
            return f"x{ref[1:]}[{self.flat(ref, idx)}]"
        k = int(ref[1:])
        n = self.nodes[k]
        if n.op in MOVES:
            return getattr(self, n.op.lower())(n, k, idx, shape)
        args = []
        for a in n.inputs:
            sa = self.shapes[a]
            off = len(shape) - len(sa)
            args.append(self.load(a, ["0" if d == 1 else idx[off + b] for b, d in enumerate(sa)]))
        return "(" + OPS[n.op].expr(n, args) + ")"

    def _reshape(self, n, idx, shape):
        src = n.inputs[0]
        ins = self.shapes[src]
        if [d for d in ins if d != 1] == [d for d in shape if d != 1]:   # only size-1 dims move
            live = iter(i for i, d in zip(idx, shape) if d != 1)
            return self.load(src, [next(live) if d != 1 else "0" for d in ins])
        f = self.flat_name(self.flat_expr(idx, shape))
        return self.load(src, [f"(({f}) // {s}) % {d}" if d != 1 else "0" for s, d in zip(_strides(ins), ins)])

    def flat_expr(self, idx, shape):
        return " + ".join(f"({i}) * {s}" for i, s, d in zip(idx, _strides(shape), shape) if d != 1) or "0"

    def flat_name(self, expr):
        name = f"f{self.n_tmp}"
        self.n_tmp += 1
        self.pre.append(Assign(name, expr))
        return name

    def reshape(self, n, k, idx, shape):
        return self._reshape(n, idx, shape)

    flatten = squeeze = unsqueeze = reshape

    def identity(self, n, k, idx, shape):
        return self.load(n.inputs[0], idx)

    def transpose(self, n, k, idx, shape):
        perm = list(n.attrs.get("perm") or reversed(range(len(shape))))
        src = [None] * len(perm)
        for a, p in enumerate(perm):
            src[p] = idx[a]
        return self.load(n.inputs[0], src)

    def expand(self, n, k, idx, shape):
        sa = self.shapes[n.inputs[0]]
        off = len(shape) - len(sa)
        return self.load(n.inputs[0], ["0" if d == 1 else idx[off + b] for b, d in enumerate(sa)])

    def slice(self, n, k, idx, shape):
        return self.load(n.inputs[0], [f"sl{k}[{2 * a}] + sl{k}[{2 * a + 1}] * ({i})" for a, i in enumerate(idx)])

    def gather(self, n, k, idx, shape):
        data, ind = n.inputs[0], n.inputs[1]
        ds, gs = self.shapes[data], self.shapes[ind]
        axis = int(n.attrs.get("axis", 0)) % len(ds)
        g = f"g{self.n_tmp}"
        self.n_tmp += 1
        self.pre.append(Assign(g, self.load(ind, idx[axis:axis + len(gs)])))
        self.pre.append(Assign(g, f"{g} + {ds[axis]} if {g} < 0 else {g}"))
        return self.load(data, list(idx[:axis]) + [g] + list(idx[axis + len(gs):]))

    def concat(self, n, k, idx, shape):
        axis = int(n.attrs["axis"]) % len(shape)
        parts, off = [], 0
        for a in n.inputs:
            d = self.shapes[a][axis]
            parts.append((off, off + d, a))
            off += d
        expr = None
        for lo, hi, a in reversed(parts):
            sub = list(idx)
            sub[axis] = f"({idx[axis]}) - {lo}" if lo else idx[axis]
            e = self.load(a, sub)
            expr = e if expr is None else f"({e} if ({idx[axis]}) < {hi} else {expr})"
        return expr


def _check(wl: Workload):
    """None, or (shapes, loaded input refs)."""
    if wl.output_dtype != "float32" or not wl.ops:
        return None
    shapes = _shapes(wl)
    if shapes is None:
        return None
    loaded = set()
    for k, o in enumerate(wl.ops):
        d = OPS.get(o["op"])
        if d is None:
            return None
        if o["op"] not in MOVES and (d.kind not in (ELEMWISE, BROADCAST) or d.expr is None):
            return None
        skip = SHAPE_ARGS.get(o["op"], set())
        for a, r in enumerate(o["in"]):
            if a in skip:
                if not r.startswith("i"):
                    return None
                continue
            if r.startswith("i"):
                dt = wl.inputs[int(r[1:])]["dtype"]
                ok = dt == "float32" or (dt in ("int64", "int32") and (o["op"] == "Cast" or (o["op"] == "Gather" and a == 1)))
                if not ok:
                    return None
                loaded.add(r)
    if any(o["op"] == "Concat" for o in wl.ops) and any(o["op"] == "Gather" for o in wl.ops):
        return None  # a gathered index inside a concat branch would be read unconditionally
    return shapes, sorted(loaded, key=lambda r: int(r[1:]))


class ElementwiseTemplate(Template):
    name = "elementwise"
    version = 1

    def matches(self, wl: Workload) -> bool:
        return _check(wl) is not None

    def space(self, wl: Workload) -> ConfigSpace:
        return ConfigSpace([
            Knob("vector", ("flat", "last")),
            Knob("unroll", (1, 4, 8)),
            Knob("parallel", (True, False), code_shape=False),
            Knob("RB", (1, 4, 16, 64), code_shape=False),
        ])

    def default_config(self, wl: Workload) -> Config:
        return self.space(wl).validate({"vector": "flat", "unroll": 1, "parallel": True, "RB": 16})

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        shapes, loaded = _check(wl)
        out_shape = tuple(wl.output_shape)
        total = math.prod(out_shape)
        flat_ok = all(o["op"] not in MOVES for o in wl.ops) and all(
            shapes[r] == out_shape or math.prod(shapes[r]) == 1 for r in loaded)
        flat = cfg["vector"] == "flat" and flat_ok or len(out_shape) <= 1
        em = _Emitter(wl, shapes)
        last = f"t{len(wl.ops) - 1}"
        unroll = cfg["unroll"]
        if flat:
            value = em.load(last, ["i"] * len(out_shape)) if len(out_shape) <= 1 else None
            if value is None:   # every input is full-shape or a scalar: read at the flat index
                value = _flat_value(wl, shapes, out_shape)
            inner = (*em.pre, Assign("out[i]", value))
            body = (
                Assign("CH", "RB * 1024"),
                For("blk", "t", "(n + CH - 1) // CH", step="T", body=(
                    Assign("i0", "blk * CH"), Assign("i1", "min(n, i0 + CH)"),
                    *_inner("i", "i0", "i1", inner, unroll),
                )),
            )
        else:
            R = len(out_shape)
            idx = [f"o{a}" for a in range(R - 1)] + ["j"]
            value = em.load(last, idx)
            inner = (*em.pre, Assign("out[base + j]", value))
            rows = math.prod(out_shape[:-1])
            split = []
            rest = "row"
            for a in range(R - 2, -1, -1):
                split += [Assign(f"o{a}", f"{rest} % {out_shape[a]}")]
                if a:
                    split += [Assign("rest", f"{rest} // {out_shape[a]}")]
                    rest = "rest"
            body = (
                For("blk", "t", f"({rows} + RB - 1) // RB", step="T", body=(
                    For("row", "blk * RB", f"min({rows}, blk * RB + RB)", (
                        *split, Assign("base", f"row * {out_shape[-1]}"),
                        *_inner("j", "0", str(out_shape[-1]), inner, unroll),
                    )),
                )),
            )
        slices = [k for k, o in enumerate(wl.ops) if o["op"] == "Slice"]
        in_params = tuple(Param(f"x{r[1:]}", f"{wl.inputs[int(r[1:])]['dtype']}[::1]") for r in loaded)
        params = in_params + tuple(Param(f"sl{k}", "int64[::1]") for k in slices) + (
            Param("out", "float32[::1]"), Param("n", "int64"), Param("RB", "int64"), Param("t", "int64"), Param("T", "int64"))
        module = LoopModule((Function("injective", params, body),),
                            doc=f"elementwise kernel: {'+'.join(o['op'] for o in wl.ops)} vector={'flat' if flat else 'last'} unroll={unroll}",
                            meta={"template": f"elementwise v{self.version}"})
        threads = num_threads() if cfg["parallel"] else 1
        RB = cfg["RB"]
        nodes = wl.nodes()

        def slice_params(arrays, k):
            n = nodes[k]
            ins = shapes[n.inputs[0]]
            vals = [None if not r.startswith("i") else arrays[int(r[1:])] for r in n.inputs]
            from ir.ops.tensor import _slice_params
            starts, ends, axes, steps = _slice_params(n, len(ins), vals)
            sl = np.zeros(2 * len(ins), np.int64)
            sl[1::2] = 1
            for s, e, a, st in zip(starts, ends, axes, steps):
                start, _, step = slice(int(s), int(e), int(st)).indices(ins[a])
                sl[2 * a], sl[2 * a + 1] = start, step
            return sl

        const_slices = all(wl.inputs[int(r[1:])]["const"] for k in slices for r in wl.ops[k]["in"][1:])

        def prepare(funcs, arrays):  # slice bounds from constants are read once; others per call
            return {"sl": [slice_params(arrays, k) for k in slices] if const_slices else None}

        def launch(funcs, state, arrays, out):
            xs = tuple(np.ascontiguousarray(arrays[int(r[1:])]).reshape(-1) if wl.inputs[int(r[1:])]["dtype"] != "float32"
                       else as_kernel_array(arrays[int(r[1:])]).reshape(-1) for r in loaded)
            xs = tuple(a if a.flags.writeable else a.copy() for a in xs)
            n_ = total if flat else 0
            sl = state["sl"] if state["sl"] is not None else [slice_params(arrays, k) for k in slices]
            parallel_for(funcs["injective"], xs + tuple(sl) + (out.reshape(-1), n_, RB), threads)

        return Lowered(module, prepare, launch)


def _flat_value(wl: Workload, shapes: dict, out_shape) -> str:
    env = {}
    for k, (o, n) in enumerate(zip(wl.ops, wl.nodes())):
        args = []
        for r in o["in"]:
            if r.startswith("t"):
                args.append(env[r])
            else:
                args.append(f"x{r[1:]}[0]" if math.prod(shapes[r]) == 1 else f"x{r[1:]}[i]")
        env[f"t{k}"] = "(" + OPS[o["op"]].expr(n, args) + ")"
    return env[f"t{len(wl.ops) - 1}"]


def _inner(var: str, lo: str, hi: str, body: tuple, unroll: int) -> tuple:
    """for var in lo..hi: body — in chunks of `unroll` copies with a guarded tail."""
    if unroll == 1:
        return (For(var, lo, hi, body),)
    from schedules.primitives import split, unroll as unroll_
    nest = split((For(var, lo, hi, body),), var, unroll, outer=f"{var}_o", inner=f"{var}_u", tail="guard")
    return unroll_(nest, f"{var}_u")


register_template(ElementwiseTemplate())

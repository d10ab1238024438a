"""Elementwise / injective chains: broadcasting arithmetic, comparisons, Where, Cast, Transpose,
Reshape/Flatten/Squeeze/Unsqueeze, Expand, Slice, Gather, Concat, Resize — one loop over the
output index space, over any of the element types numba has (float32, int64, int32, bool...).

Every output element is one expression: each op turns the index it is read at
into the index of its inputs (broadcast: 0 on size-1 dims; Transpose: permute;
Reshape: linearize/delinearize; Slice: start + step * i, with starts and steps
from a table built while lowering (where they are data, a generated function
computes them first); Gather: an index loaded from the indices tensor; Concat: a
select by offset; Resize: per resized axis T source indices and weights read from
tables built while lowering from the op's attributes and roi/scales/sizes, which
the workload holds — nearest 1 tap, linear 2, cubic 4, see `ir.ops.resize`).
Nothing in between is materialized. Shapes are
code constants. Values are typed: each op's code comes from `typed_expr` for the
element types of its operands (int64 shape arithmetic, bool masks, float32 math).

Knobs: `vector` (code) — `flat`: one flat loop over all elements (used when every
input is read at the output's flat index or is a scalar, otherwise the same as
`last`); `last`: rows of the output's last axis, the contiguous inner loop;
`unroll` (code) — the inner loop in chunks of 1/4/8 with a guarded tail; `RB`
(run-time) — elements (flat, x1024) or rows per work item; `parallel` (run-time).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ir.graph import TensorType
from ir.ops import BROADCAST, ELEMWISE, OPS
from ir.ops.elementwise import DTYPE_EXPRS, NAN_AWARE, NUMBA_TYPES, VECTOR_MATH, literal, op_assigns, typed_expr
from ir.ops import resize as rz
from ir.workload import Workload
from schedules.launch import Buffer, Call, In, Launch, Out, Scalar, Table, Work
from schedules.loopnest import Alloc, Assign, Call as Stmt, For, Function, If, LoopModule, Param, thread_share
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Lowered, Template

RESIZES = {"Resize", "Upsample"}
MOVES = {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Slice", "Gather", "Concat",
         "Identity", "GatherElements", "GatherND", "Trilu"} | RESIZES
SHAPE_ARGS = {"Reshape": {1}, "Squeeze": {1}, "Unsqueeze": {1}, "Expand": {1}, "Slice": {1, 2, 3, 4},
              "Resize": {1, 2, 3}, "Upsample": {1}, "Trilu": {1}}   # operands read at launch or code constants


def _consts(wl: Workload) -> dict:
    return {f"i{k}": np.array(i["value"], dtype=i["dtype"]).reshape(i["shape"]) for k, i in enumerate(wl.inputs)
            if "value" in i}


def _types(wl: Workload):
    """(shape, dtype) of every value (i*, t*): forward by the ops' shape functions (with the small
    int constants the workload holds), then backward through Transpose, unary ops and Concat for
    the ones whose shape needs values the workload does not hold; None if any stays unknown."""
    shapes = {f"i{k}": tuple(i["shape"]) for k, i in enumerate(wl.inputs)}
    dtypes = {f"i{k}": i["dtype"] for k, i in enumerate(wl.inputs)}
    consts = _consts(wl)
    nodes = wl.nodes()
    for k, n in enumerate(nodes):
        t = f"t{k}"
        try:
            types = [TensorType(shapes[r], dtypes[r]) if shapes.get(r) is not None else None for r in n.inputs]
            out = OPS[n.op].infer(n, types, [consts.get(r) for r in n.inputs])[0]
            shapes[t], dtypes[t] = tuple(int(d) for d in out.shape), out.dtype
        except Exception:
            shapes[t], dtypes[t] = None, dtypes.get(n.inputs[0]) if n.op in MOVES else None
    last = f"t{len(nodes) - 1}"
    shapes[last], dtypes[last] = tuple(wl.output_shape), wl.output_dtype
    for k in range(len(nodes) - 1, -1, -1):
        n, o = nodes[k], shapes[f"t{k}"]
        if o is None:
            continue
        if n.op == "Concat":
            unknown = [r for r in n.inputs if shapes[r] is None]
            if len(unknown) == 1:
                axis = int(n.attrs["axis"]) % len(o)
                rest = sum(shapes[r][axis] for r in n.inputs if r != unknown[0])
                shapes[unknown[0]] = tuple(o[axis] - rest if a == axis else d for a, d in enumerate(o))
            continue
        src = n.inputs[0]
        if not src.startswith("t") or shapes[src] is not None:
            continue
        if n.op == "Transpose":
            perm = list(n.attrs.get("perm") or reversed(range(len(o))))
            inv = [0] * len(perm)
            for a, p in enumerate(perm):
                inv[p] = o[a]
            shapes[src] = tuple(inv)
        elif OPS[n.op].kind == ELEMWISE and len(n.inputs) == 1:
            shapes[src] = o
    if any(v is None for v in shapes.values()) or any(dtypes.get(r) is None for r in shapes):
        return None
    return {r: (shapes[r], dtypes[r]) for r in shapes}


def _at(array: str, index: str) -> str:
    """array[index] with an unsigned index: every index here is >= 0 by construction, and numba's
    check for negative (wrap-around) signed indices blocks LLVM's vectorizer (measured 6x on a
    broadcast Add row loop)."""
    return f"{array}[{index}]" if index.isdigit() else f"{array}[np.uint64({index})]"


def _strides(shape):
    out, s = [], 1
    for d in reversed(shape):
        out.insert(0, s)
        s *= d
    return out


def _div(x: str, d: int) -> str:
    """x // d for an index x >= 0: a shift for a power of two (LLVM then folds a split and its
    merge back into x; a signed floor division it keeps)."""
    return x if d == 1 else f"({x} >> {d.bit_length() - 1})" if d & (d - 1) == 0 else f"({x} // {d})"


def _mod(x: str, d: int) -> str:
    """x % d for an index x >= 0: a mask for a power of two."""
    return f"({x} & {d - 1})" if d & (d - 1) == 0 else f"({x} % {d})"


def _reshape_groups(ins, outs):
    """A Reshape's axes in groups of equal size, (input axes, output axes) each, from the
    outermost: an output index maps into its group alone (a split of one input axis needs no
    division; several input axes divide only the group's own index), not through the whole
    flat index, whose divisions by non-constant-folded sizes kept a head split's copy scalar
    (ViT's q/k/v Reshape + Transpose: 7 us for 12 KB). None when a size is not a number."""
    if not all(isinstance(d, int) for d in (*ins, *outs)):
        return None
    groups, i, j = [], 0, 0
    while i < len(ins) or j < len(outs):
        gi, gj, pi, pj = [], [], 1, 1
        while True:
            if i < len(ins) and (pi < pj or not gi or (pi == pj and ins[i] == 1)):
                gi.append(i); pi *= ins[i]; i += 1
            elif j < len(outs) and (pj < pi or not gj or (pi == pj and outs[j] == 1)):
                gj.append(j); pj *= outs[j]; j += 1
            else:
                break
        if pi != pj:
            return None
        groups.append((gi, gj))
    return groups


def _axis_groups(axes, joins) -> list[list[int]]:
    """`axes` in runs of adjacent ones: axis a joins the run before it where `joins(run, a)`."""
    groups: list[list[int]] = []
    for a in axes:
        if groups and joins(groups[-1], a):
            groups[-1].append(a)
        else:
            groups.append([a])
    return groups


def _merged_shape(shape, groups) -> tuple:
    return tuple(math.prod(shape[a] for a in g) for g in groups)


def _merged_axes(types: dict, out_shape: tuple) -> dict:
    """`types` with the output's axes merged where every value agrees: adjacent axes that each
    value (right-aligned to the output) holds whole in both or broadcasts in both read as one, and
    axes of size 1 go. A pointwise chain indexes by shape alone, so this renames nothing; the rows
    get longer and the index splits fewer: MobileNetV3's squeeze-excite Mul (2,96,4,5) x (2,96,1,1)
    ran rows of 5 with three divisions each, now (192, 20) x (192, 1)."""
    R = len(out_shape)
    padded = {r: (1,) * (R - len(sh)) + tuple(sh) for r, (sh, _) in types.items()}
    groups = _axis_groups([a for a in range(R) if out_shape[a] != 1],
                          lambda run, a: all((p[a] == 1) == (p[run[-1]] == 1) for p in padded.values()))
    if len(groups) == R:
        return types
    return {r: (_merged_shape(padded[r], groups), dt) for r, (_, dt) in types.items()}


def _merged_copy(wl: Workload, types: dict) -> Workload | None:
    """For a copy made of Slices (starts and steps the workload holds, steps > 0) and Concats: the
    same copy over fewer axes, or None. Adjacent axes merge where no Slice cuts or steps the inner
    one and no Concat joins along it (the outer may be cut, at step 1, and may be a Concat's
    axis): the starts scale by the merged inner size. A CSP block's channel split and re-join,
    (2, 16, 12, 16) -> (2, 8, 12, 16), then runs 2 rows of 1536 where it ran 192 rows of 16.
    The inputs keep their positions (the Slices' operands are rewritten in place), so the kernel
    binds the caller's arrays as the workload's."""
    nodes = wl.nodes()
    if not nodes or any(n.op not in ("Slice", "Concat") for n in nodes):
        return None
    consts, R = _consts(wl), len(wl.output_shape)
    data = {r for n in nodes for r in (n.inputs[:1] if n.op == "Slice" else n.inputs)} | {f"t{k}" for k in range(len(nodes))}
    if any(len(types[r][0]) != R for r in data):
        return None
    no_inner, no_outer, params = set(), set(), {}
    for k, n in enumerate(nodes):
        if n.op == "Concat":
            no_inner.add(int(n.attrs["axis"]) % R)
            continue
        shape_in, shape_out = types[n.inputs[0]][0], types[f"t{k}"][0]
        known = _slice_starts_steps(n, shape_in, consts)
        if known is None or len(n.inputs) < 3 or "starts" in n.attrs or any(
                not r.startswith("i") or r not in consts or sum(r in m.inputs for m in nodes) > 1 for r in n.inputs[1:]):
            return None   # operands that are data or shared with another op stay as they are
        for a in range(R):
            start, step = int(known[2 * a]), int(known[2 * a + 1])
            if step < 1:
                return None
            if (start, step, shape_in[a]) != (0, 1, shape_out[a]):
                no_inner.add(a)
                if step != 1:
                    no_outer.add(a)
        params[k] = known
    groups = _axis_groups(range(R), lambda run, a: a not in no_inner and run[0] not in no_outer)
    if len(groups) == R:
        return None

    def merged(shape):
        return list(_merged_shape(shape, groups))
    inputs = [dict(i) for i in wl.inputs]
    for r in data:
        if r.startswith("i"):
            spec = inputs[int(r[1:])]
            spec["shape"] = spec["sym"] = merged(spec["shape"])
    ops = [dict(o) for o in wl.ops]
    for k, n in enumerate(nodes):
        if n.op == "Concat":
            c = int(n.attrs["axis"]) % R
            ops[k]["attrs"] = {**n.attrs, "axis": next(gi for gi, g in enumerate(groups) if g[0] == c)}
            continue
        shape_in, known = types[n.inputs[0]][0], params[k]
        starts = [int(known[2 * g[0]]) * math.prod(shape_in[a] for a in g[1:]) for g in groups]
        steps = [int(known[2 * g[0] + 1]) for g in groups]
        ends = [st + sp * d for st, sp, d in zip(starts, steps, merged(types[f"t{k}"][0]))]
        for pos, vals in zip(range(1, len(n.inputs)), (starts, ends, list(range(len(groups))), steps)):
            inputs[int(n.inputs[pos][1:])].update(shape=[len(groups)], sym=[len(groups)], value=vals)
    return Workload(tuple(ops), tuple(inputs), tuple(merged(wl.output_shape)), wl.output_dtype)


class _Emitter:
    """Builds the expression of a value at an index (a list of index expressions)."""

    def __init__(self, wl: Workload, types: dict, resize_plans: dict, flat: bool = False):
        self.wl, self.types, self.nodes = wl, types, wl.nodes()
        self.resize_plans = resize_plans  # per Resize op: taps per axis (None: left as it is)
        self.shapes = {r: t[0] for r, t in types.items()}
        self.flat_mode = flat   # every input read at the flat output index `i` (or a scalar)
        self.consts = _consts(wl)
        self.pre: list[Assign] = []
        self.row_pre: list[Assign] = []   # loads that depend on the row only (the `last` path): hoisted
        self.top: dict[str, Assign] = {}  # loads of the whole call (a Slice's starts): before the loops
        self.branch = 0                   # > 0 inside a Concat branch: nothing there may be hoisted
        self.n_tmp = 0
        self.closed: dict = {}            # Resize op -> `_closed_form` of its last axis, used while
        self.phase: int | None = None     # `phase` is set: output s * jx + phase, read at jx + offset
        self.row_temp: set = set()        # Resize ops interpolated vertically first, into a row buffer
        self.row_buffers: dict = {}       # their buffers: name -> length (input columns + padding)
        self.row_pad: dict = {}           # Resize op -> edge values repeated on each side of its buffer

    def dtype(self, ref: str) -> str:
        return self.types[ref][1]

    def flat(self, ref: str, idx) -> str:
        terms = [f"({i}) * {s}" if s != 1 else f"({i})" for i, s, d in zip(idx, _strides(self.shapes[ref]), self.shapes[ref])
                 if d != 1 and i != "0"]
        return " + ".join(terms) or "0"

    def load(self, ref: str, idx) -> str:
        shape = self.shapes[ref]
        if ref.startswith("i"):
            if self.flat_mode:
                return f"x{ref[1:]}[0]" if math.prod(shape) == 1 else _at(f"x{ref[1:]}", "i")
            return _at(f"x{ref[1:]}", self.flat(ref, idx))
        k = int(ref[1:])
        n = self.nodes[k]
        if n.op in MOVES:
            return getattr(self, n.op.lower())(n, k, idx, shape)
        args = []
        for a in n.inputs:
            sa = self.shapes[a]
            off = len(shape) - len(sa)
            args.append(self.load(a, None if self.flat_mode else ["0" if d == 1 else idx[off + b] for b, d in enumerate(sa)]))
        in_dtypes, out_dtype = [self.dtype(a) for a in n.inputs], self.dtype(ref)
        if self.branch:   # inside a Concat branch nothing may move out of it
            return "(" + typed_expr(n, args, in_dtypes, out_dtype) + ")"
        # each op's value (and its intermediates: see `op_assigns`) a temporary of the loop body:
        # a nested expression would repeat its argument's code at every use
        name = f"v{self.n_tmp}"
        self.n_tmp += 1
        self.pre += [Assign(t, e) for t, e in op_assigns(n, args, name, in_dtypes, out_dtype)]
        return name

    def _reshape(self, n, idx, shape):
        src = n.inputs[0]
        ins = self.shapes[src]
        if [d for d in ins if d != 1] == [d for d in shape if d != 1]:   # only size-1 dims move
            live = iter(i for i, d in zip(idx, shape) if d != 1)
            return self.load(src, [next(live) if d != 1 else "0" for d in ins])
        groups = _reshape_groups(ins, shape)
        if groups is None:   # symbolic sizes: the flat index, split again
            f = self.flat_name(self.flat_expr(idx, shape))
            return self.load(src, [f"(({f}) // {s}) % {d}" if d != 1 else "0" for s, d in zip(_strides(ins), ins)])
        at = ["0"] * len(ins)
        for in_axes, out_axes in groups:
            flat = self.flat_expr([idx[a] for a in out_axes], [shape[a] for a in out_axes])
            live = [a for a in in_axes if ins[a] != 1]
            if len(live) <= 1:   # one input axis: the output axes' index within the group, no division
                if live:
                    at[live[0]] = flat
                continue
            f = self.flat_name(flat)
            strides = _strides([ins[a] for a in in_axes])
            for k, (a, st) in enumerate(zip(in_axes, strides)):
                if ins[a] != 1:   # the group's outermost axis: its quotient is already below its size
                    at[a] = _mod(_div(f"({f})", st), ins[a]) if k else _div(f"({f})", st)
        return self.load(src, at)

    def flat_expr(self, idx, shape):
        return " + ".join(f"({i}) * {s}" for i, s, d in zip(idx, _strides(shape), shape) if d != 1) or "0"

    def flat_name(self, expr):
        """A temporary for index arithmetic; an expression that loads (a gathered index) stays
        inline, so that a Concat branch never reads memory for an element of another branch."""
        if "[" in expr:
            return expr
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
        """start + step * i per axis: the starts read from the kernel's table once a call (read
        in the row loop, every store to `out` might have changed them: LLVM kept the loop scalar),
        the steps code constants where the workload holds them (read at run time, they made the
        loads gathers). A CSP block's channel split (2,16,12,16) -> (2,8,12,16): 6.2 -> 1.1 us."""
        known = _slice_starts_steps(n, self.shapes[n.inputs[0]], self.consts)
        for a in range(2 * len(idx)):
            self.top.setdefault(f"sl{k}_{a}", Assign(f"sl{k}_{a}", f"sl{k}[{a}]"))
        steps = [str(int(known[2 * a + 1])) if known is not None else f"sl{k}_{2 * a + 1}" for a in range(len(idx))]
        return self.load(n.inputs[0], [f"sl{k}_{2 * a} + ({i})" if st == "1" else f"sl{k}_{2 * a} + {st} * ({i})"
                                       for a, (i, st) in enumerate(zip(idx, steps))])

    def gather(self, n, k, idx, shape):
        data, ind = n.inputs[0], n.inputs[1]
        ds, gs = self.shapes[data], self.shapes[ind]
        axis = int(n.attrs.get("axis", 0)) % len(ds)
        g = self.index(self.load(ind, idx[axis:axis + len(gs)]), ds[axis])
        return self.load(data, list(idx[:axis]) + [g] + list(idx[axis + len(gs):]))

    def index(self, g: str, size) -> str:
        """The index `g` read from a tensor, checked against its axis of `size` (negative ones
        count from the end; out of range raises IndexError: `codegen.checks.index_in`)."""
        return f"index_in({g}, {size})"

    def _index(self, ind, at, size):
        return self.index(self.load(ind, at), size)

    def gatherelements(self, n, k, idx, shape):
        data, ind = n.inputs[0], n.inputs[1]
        ds = self.shapes[data]
        axis = int(n.attrs.get("axis", 0)) % len(ds)
        return self.load(data, list(idx[:axis]) + [self._index(ind, idx, ds[axis])] + list(idx[axis + 1:]))

    def gathernd(self, n, k, idx, shape):
        data, ind = n.inputs[0], n.inputs[1]
        ds, gs = self.shapes[data], self.shapes[ind]
        b, r = int(n.attrs.get("batch_dims", 0)), len(gs) - 1
        picked = [self._index(ind, list(idx[:r]) + [str(j)], ds[b + j]) for j in range(gs[-1])]
        return self.load(data, list(idx[:b]) + picked + list(idx[r:]))

    def trilu(self, n, k, idx, shape):
        diag = int(self.consts[n.inputs[1]].reshape(-1)[0]) if len(n.inputs) > 1 else 0
        keep = f"({idx[-1]}) - ({idx[-2]}) {'>=' if n.attrs.get('upper', 1) else '<='} {diag}"
        return f"({self.load(n.inputs[0], idx)} if {keep} else {literal(0, self.dtype(f't{k}'))})"

    def concat(self, n, k, idx, shape):
        axis = int(n.attrs["axis"]) % len(shape)
        parts, off = [], 0
        for a in n.inputs:
            d = self.shapes[a][axis]
            parts.append((off, off + d, a))
            off += d
        expr = None
        self.branch += 1
        for lo, hi, a in reversed(parts):
            if lo == hi:
                continue   # an empty input contributes nothing
            sub = list(idx)
            sub[axis] = f"({idx[axis]}) - {lo}" if lo else idx[axis]
            e = self.load(a, sub)
            expr = e if expr is None else f"({e} if ({idx[axis]}) < {hi} else {expr})"
        self.branch -= 1
        return expr

    def hoisted(self, expr: str, index: str) -> str:
        """`expr` (a table load at `index`) as a temporary computed once per row, where `index`
        does not vary along the row's inner loop (and no Concat branch guards it)."""
        if self.flat_mode or self.branch or "j" in index.replace("np.uint64", ""):
            return expr
        name = f"h{self.n_tmp}"
        self.n_tmp += 1
        self.row_pre.append(Assign(name, expr))
        return name

    def resize(self, n, k, idx, shape):
        plan = self.resize_plans[k]
        spec = rz.spec_of(n)
        axes = [a for a, p in enumerate(plan) if p is not None]
        closed = self.closed.get(k) if self.phase is not None else None
        if k in self.row_temp:
            return self._row_temp_taps(n, k, idx, shape, closed)
        e = self._resize_taps(n, k, idx, shape, axes, closed)
        if spec.transform == "tf_crop_and_resize":
            out = " | ".join(_at(f"rzo{k}_{a}", idx[a]) for a in axes)
            e = f"({literal(spec.extrapolation_value, self.dtype(f't{k}'))} if ({out}) else {e})"
        return e

    upsample = resize

    def _resize_taps(self, n, k, idx, shape, axes, closed):
        """The Resize's value at idx as the weighted sum of its taps over `axes`."""
        src, plan, spec = n.inputs[0], self.resize_plans[k], rz.spec_of(n)

        def taps(sub, rest):
            if not rest:
                return self.load(src, sub)
            a, T = rest[0], plan[rest[0]]
            parts = []
            if closed is not None and a == len(shape) - 1:   # the inner loop's axis, in closed form
                for t in range(T):
                    off = closed.offset[self.phase][t]
                    inner = taps(sub[:a] + [f"jx + {off}" if off > 0 else f"jx - {-off}" if off else "jx"] + sub[a + 1:],
                                 rest[1:])
                    parts.append(inner if spec.mode == "nearest" else f"{literal(closed.weight[self.phase][t], 'float32')} * {inner}")
                return "(" + " + ".join(parts) + ")"
            for t in range(T):
                pos = f"({idx[a]}) * {T} + {t}" if T > 1 else idx[a]
                src_index = self.hoisted(_at(f"rzi{k}_{a}", pos), idx[a])
                inner = taps(sub[:a] + [src_index] + sub[a + 1:], rest[1:])
                parts.append(inner if spec.mode == "nearest" else f"{self.hoisted(_at(f'rzw{k}_{a}', pos), idx[a])} * {inner}")
            return "(" + " + ".join(parts) + ")"
        return taps(list(idx), axes)

    def _row_temp_taps(self, n, k, idx, shape, closed):
        """A Resize interpolated along its other axes first, once per output row, into the row
        buffer rt{k} (input columns `jr`, a contiguous loop), then along the last axis from that
        buffer: a 2x linear upscale reads 2 values and does 2 FMAs per output where the nested
        taps read 4 and did 6 (and the row's vertical work is done for half as many columns)."""
        plan, a = self.resize_plans[k], len(shape) - 1
        name, width, pad = f"rt{k}", self.shapes[n.inputs[0]][-1], self.row_pad.get(k, 0)
        if name not in self.row_buffers:
            saved, self.pre = self.pre, []
            others = [b for b, p in enumerate(plan) if p is not None and b != a]
            value = self._resize_taps(n, k, list(idx[:-1]) + ["jr"], shape, others, None)
            self.row_pre.append(For("jr", "0", str(width), (*self.pre, Assign(_at(name, f"jr + {pad}" if pad else "jr"), value))))
            for q in range(pad):   # the edge values repeated: clamped reads in closed form
                self.row_pre += [Assign(_at(name, str(q)), _at(name, str(pad))),
                                 Assign(_at(name, str(pad + width + q)), _at(name, str(pad + width - 1)))]
            self.pre = saved
            self.row_buffers[name] = width + 2 * pad
        T, parts = plan[a], []
        for t in range(T):
            if closed is not None:
                off = closed.offset[self.phase][t] + pad
                at = f"jx + {off}" if off > 0 else f"jx - {-off}" if off else "jx"
                parts.append(f"{literal(closed.weight[self.phase][t], 'float32')} * {_at(name, at)}")
            else:
                pos = f"({idx[a]}) * {T} + {t}"
                at = _at(f'rzi{k}_{a}', pos)
                parts.append(f"{_at(f'rzw{k}_{a}', pos)} * {_at(name, f'{at} + {pad}' if pad else at)}")
        return "(" + " + ".join(parts) + ")"


def _check(wl: Workload):
    """None, or (types, loaded input refs, resize tables (`_resizes`))."""
    if wl.output_dtype not in NUMBA_TYPES or not wl.ops:
        return None
    types = _types(wl)
    if types is None or any(dt not in NUMBA_TYPES for _, dt in types.values()):
        return None
    loaded = set()
    for k, o in enumerate(wl.ops):
        d = OPS.get(o["op"])
        if d is None:
            return None
        if o["op"] not in MOVES and (d.kind not in (ELEMWISE, BROADCAST) or (d.expr is None and o["op"] not in DTYPE_EXPRS)):
            return None
        if o["op"] in RESIZES:
            try:
                spec = rz.spec_of(wl.nodes()[k])
            except Exception:
                return None
            if spec.mode != "nearest" and types[f"t{k}"][1] != "float32":
                return None   # interpolating integers rounds: left to the reference
        if o["op"] == "Trilu" and len(o["in"]) > 1 and (not o["in"][1].startswith("i")
                                                         or "value" not in wl.inputs[int(o["in"][1][1:])]):
            return None   # the diagonal offset is a code constant
        if o["op"] == "GatherND" and len(types[o["in"][1]][0]) < 1:
            return None
        skip = set(range(1, len(o["in"]))) if o["op"] in RESIZES else SHAPE_ARGS.get(o["op"], set())
        for a, r in enumerate(o["in"]):
            if a in skip:
                if not r.startswith("i"):
                    return None
                continue
            if r.startswith("i"):
                loaded.add(r)
    resizes = _resizes(wl, types)
    if resizes is None:
        return None
    return types, sorted(loaded, key=lambda r: int(r[1:])), resizes


class ElementwiseTemplate(Template):
    name = "elementwise"
    version = 8

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
        types, loaded, resizes = _check(wl)
        merged = _merged_copy(wl, types)
        if merged is not None:
            wl = merged
            types, loaded, resizes = _check(wl)
        rows = _row_gather(wl, types)
        if rows is not None:
            return _row_gather_lowered(wl, types, cfg, rows, self.version)
        plans = {k: plan for k, (plan, _) in resizes.items()}
        if not any(o["op"] in MOVES or "axis" in o["attrs"] or "axes" in o["attrs"] for o in wl.ops):
            types = _merged_axes(types, tuple(wl.output_shape))
        shapes = {r: t[0] for r, t in types.items()}
        out_shape = types[f"t{len(wl.ops) - 1}"][0]
        total = math.prod(out_shape)
        flat_ok = all(o["op"] not in MOVES for o in wl.ops) and all(
            shapes[r] == out_shape or math.prod(shapes[r]) == 1 for r in loaded)
        flat = cfg["vector"] == "flat" and flat_ok or len(out_shape) <= 1
        last = f"t{len(wl.ops) - 1}"
        unroll = cfg["unroll"]
        nodes = wl.nodes()
        if flat:
            if len(out_shape) <= 1:
                em = _Emitter(wl, types, plans)
                value = em.load(last, ["i"] * len(out_shape))
            else:   # every input is full-shape or a scalar: read at the flat index
                em = _Emitter(wl, types, plans, flat=True)
                value = em.load(last, None)
            inner = (*em.pre, Assign(_at("out", "i"), value))
            streams = _streams_for(wl, loaded, shapes) if unroll == 1 else 1
            body = (
                *em.top.values(),
                Assign("CH", "RB * 1024"),
                thread_share("blk", "(n + CH - 1) // CH", body=(
                    Assign("i0", "blk * CH"), Assign("i1", "min(n, i0 + CH)"),
                    *(_interleaved("i", "i0", "i1", inner, streams) if streams > 1 else _inner("i", "i0", "i1", inner, unroll)),
                )),
            )
        else:
            em = _Emitter(wl, types, plans)
            R = len(out_shape)
            idx = [f"o{a}" for a in range(R - 1)] + ["j"]
            # a Resize whose output is a row's value (the kernel's, only elementwise ops after it; or
            # one input of a Concat along an outer axis): its last axis in closed form where the tables
            # repeat (integer factors), the edges through them; interpolating along other axes too,
            # it does those first into a row buffer
            forms: dict = {}
            if any(o["op"] in RESIZES for o in wl.ops):
                _resizes(wl, types, forms)

            def rows_of(ref: str, at: list, k_rz: int | None, span=("0", "n")) -> tuple:
                """The loops that write `ref` at index `at` (its last entry `j`) to out[base + j] for
                j in `span`; k_rz: a Resize that produces `ref` (elementwise ops after it allowed)."""
                if k_rz is not None and _row_temp_pays(nodes[k_rz], plans[k_rz]):
                    em.row_temp.add(k_rz)
                    form = forms.get(k_rz)
                    if form is not None and form.clamped:   # the whole row in closed form, from a padded buffer
                        em.row_pad[k_rz] = max(abs(o) for row in form.offset for o in row)
                em.pre = []
                value = em.load(ref, at)
                inner = (*em.pre, Assign(_at("out", "base + j"), value))
                # the row's length as the run-time `n` (= out_shape[-1]): a literal trip count let LLVM
                # unroll the loop fully before vectorizing, and the unrolled copy stayed scalar (out and
                # the inputs may alias: SLP has no run-time check); Transpose 0213 rows of 64 2.1x faster
                closed = forms.get(k_rz) if k_rz is not None else None
                if closed is not None and closed.hi - closed.lo < MIN_CLOSED and k_rz not in em.row_pad:
                    closed = None   # a short run between edges read through the tables
                if closed is None:
                    return _inner("j", *span, inner, unroll)
                em.closed[k_rz] = closed
                s, lo, hi = closed.factor, closed.lo, closed.hi
                stmts = []
                for p in range(s):
                    em.pre, em.phase = [], p
                    v = em.load(ref, at)   # other inputs are read at j
                    stmts += [Assign("j", f"{s} * jx + {p}"), *em.pre, Assign(_at("out", "base + j"), v)]
                em.phase = None
                if k_rz in em.row_pad:
                    lo, hi = 0, shapes[nodes[k_rz].inputs[0]][-1]
                return (*(_inner("j", "0", str(s * lo), inner, unroll) if lo else ()),
                        For("jx", str(lo), str(hi), tuple(stmts)),
                        *(_inner("j", str(s * hi), str(out_shape[-1]), inner, unroll) if s * hi < out_shape[-1] else ()))

            rz_ops = [k for k, o in enumerate(wl.ops) if o["op"] in RESIZES]
            k_last = rz_ops[0] if len(rz_ops) == 1 and shapes[f"t{rz_ops[0]}"] == out_shape and all(
                o["op"] not in MOVES for o in wl.ops[rz_ops[0] + 1:]) else None
            row_branches = _row_branches(nodes[-1], R, shapes)
            if row_branches is None:
                row_loops = rows_of(last, idx, k_last)
            elif row_branches[0] == R - 1:   # a Concat along the rows: one loop per input's run of the row
                row_loops = ()
                for lo, hi, a in row_branches[1]:
                    sub = idx[:-1] + [f"(j) - {lo}" if lo else "j"]
                    row_loops += rows_of(a, sub, None, (str(lo), str(hi)))
            else:   # a Concat along an outer axis: each row is one input's, chosen once a row
                axis, row_loops = row_branches[0], ()
                for lo, hi, a in reversed(row_branches[1]):
                    em.row_pre = []
                    sub = list(idx)
                    sub[axis] = f"({idx[axis]}) - {lo}" if lo else idx[axis]
                    k_rz = int(a[1:]) if a.startswith("t") and wl.ops[int(a[1:])]["op"] in RESIZES else None
                    loops = rows_of(a, sub, k_rz)
                    loops = (*em.row_pre, *loops)
                    row_loops = (If(f"{idx[axis]} < {hi}", loops, row_loops),) if row_loops else loops
                em.row_pre = []
            rows = math.prod(out_shape[:-1])
            split = []
            rest = "row"
            for a in range(R - 2, -1, -1):
                split += [Assign(f"o{a}", f"{rest} % {out_shape[a]}")]
                if a:
                    split += [Assign("rest", f"{rest} // {out_shape[a]}")]
                    rest = "rest"
            body = (
                *em.top.values(),
                *(Alloc(b, (str(w),)) for b, w in em.row_buffers.items()),
                thread_share("blk", f"({rows} + RB - 1) // RB", body=(
                    For("row", "blk * RB", f"min({rows}, blk * RB + RB)", (
                        *split, Assign("base", f"row * {out_shape[-1]}"), *em.row_pre, *row_loops,
                    )),
                )),
            )
        slices = [k for k, o in enumerate(wl.ops) if o["op"] == "Slice"]
        in_params = tuple(Param(f"x{r[1:]}", f"{NUMBA_TYPES[types[r][1]]}[::1]") for r in loaded)
        params = in_params + tuple(Param(f"sl{k}", "int64[::1]") for k in slices) + _resize_params(nodes, plans) + (
            Param("out", f"{NUMBA_TYPES[wl.output_dtype]}[::1]"), Param("n", "int64"), Param("RB", "int64"),
            Param("t", "int64"), Param("T", "int64"))
        # IsNaN / IsInf must see NaN and inf: LLVM may fold them away under nnan / ninf
        fast = {} if not any(o["op"] in NAN_AWARE for o in wl.ops) else {"fastmath": ("nsz", "arcp", "contract", "afn")}
        functions = [Function("injective", params, body, **fast)]
        # slice starts and steps, resize tables: tables built now (the workload holds their operands),
        # except the starts/steps of a Slice that are data: a generated function reads them first
        tables, pre, work, sl_args = {}, [], [], []
        consts = _consts(wl)
        for k in slices:
            known = _slice_starts_steps(nodes[k], shapes[nodes[k].inputs[0]], consts)
            if known is not None:
                tables[f"sl{k}"] = known
                sl_args.append(Table(f"sl{k}"))
                continue
            fn, args = _slice_function(nodes[k], k, shapes[nodes[k].inputs[0]], tables)
            functions.append(fn)
            work.append(Buffer(f"sl{k}", (2 * len(shapes[nodes[k].inputs[0]]),), "int64"))
            pre.append(Call(fn.name, args + (Work(f"sl{k}"),), items=1))
            sl_args.append(Work(f"sl{k}"))
        rz_args = []
        for k, (_, arrays) in resizes.items():
            for name, a in arrays:
                tables[name] = a
                rz_args.append(Table(name))
        module = LoopModule(tuple(functions),
                            doc=f"elementwise kernel: {'+'.join(o['op'] for o in wl.ops)} vector={'flat' if flat else 'last'} unroll={unroll}",
                            meta={"template": f"elementwise v{self.version}"})
        xs = tuple(In(int(r[1:]), (math.prod(shapes[r]),), types[r][1]) for r in loaded)
        RB = cfg["RB"]
        items = -(-total // (RB * 1024)) if flat else -(-math.prod(out_shape[:-1]) // RB)
        step = Call("injective", xs + tuple(sl_args) + tuple(rz_args) + (
            Out((total,)), Scalar(total if flat else out_shape[-1]), Scalar(RB)), items=items, parallel=cfg["parallel"])
        return Lowered(module, Launch(tuple(pre) + (step,), workspaces=tuple(work), tables=tables))


ROW_GATHER_MIN = 8   # gathered rows at least this long are copied whole (shorter: the index loop)


def _row_branches(node, rank: int, shapes: dict):
    """(axis, [(lo, hi, input)]) where the kernel's last op is a Concat (the `last` path): along
    an axis other than the rows', each output row comes from one input, so the choice is made once
    a row and each input's loads run unguarded, their row-constant table loads hoisted (`hoisted`),
    instead of a select per element (the detector's Resize + Concat (2,24,6,8) -> (2,40,12,16):
    21 -> 17 us in the model); along the rows, each input fills its run of the row in a loop of
    its own. None otherwise."""
    if node.op != "Concat":
        return None
    axis = int(node.attrs["axis"]) % rank
    parts, off = [], 0
    for a in node.inputs:
        d = shapes[a][axis]
        if d:
            parts.append((off, off + d, a))
        off += d
    return axis, parts


def _row_gather(wl: Workload, types: dict):
    """(outer, D, G, S) for a lone Gather of whole contiguous rows, or None: data viewed as
    [outer, D, S] (D: the gathered axis), G indices; output row (o, g) is data row (o, ids[g])."""
    if len(wl.ops) != 1 or wl.ops[0]["op"] != "Gather":
        return None
    n = wl.nodes()[0]
    ds, gs = types[n.inputs[0]][0], types[n.inputs[1]][0]
    axis = int(n.attrs.get("axis", 0)) % len(ds)
    S = math.prod(ds[axis + 1:])
    if S < ROW_GATHER_MIN or 0 in ds or 0 in gs:
        return None
    return math.prod(ds[:axis]), ds[axis], math.prod(gs), S


def _row_gather_lowered(wl: Workload, types: dict, cfg: Config, rows, version: int) -> Lowered:
    """The row gather as row copies: each index read and checked once per row (negative ones
    count from the end; out of range raises IndexError, as the reference's np.take does), then
    a contiguous copy loop over the row, which LLVM turns into vector moves."""
    outer, D, G, S = rows
    data, ind = wl.ops[0]["in"]
    x, ids = f"x{data[1:]}", f"x{ind[1:]}"
    body = (
        thread_share("blk", f"({outer * G} + RB - 1) // RB", body=(
            For("row", "blk * RB", f"min({outer * G}, blk * RB + RB)", (
                Assign("o", f"row // {G}"),
                Assign("g", _at(ids, f"row - o * {G}")),
                If("g < 0", (Assign("g", f"g + {D}"),)),
                If(f"g < 0 or g >= {D}", (Stmt("raise IndexError('Gather: an index is out of range')"),)),
                Assign("src", f"(o * {D} + g) * {S}"), Assign("dst", f"row * {S}"),
                For("j", "0", "n", (Assign(_at("out", "dst + j"), _at(x, "src + j")),)),   # n = S at run time (see lower)
            )),
        )),
    )
    params = tuple(Param(f"x{r[1:]}", f"{NUMBA_TYPES[types[r][1]]}[::1]") for r in sorted({data, ind}, key=lambda r: int(r[1:])))
    params += (Param("out", f"{NUMBA_TYPES[wl.output_dtype]}[::1]"), Param("n", "int64"), Param("RB", "int64"),
               Param("t", "int64"), Param("T", "int64"))
    module = LoopModule((Function("injective", params, body),), doc="elementwise kernel: Gather of whole rows (row copies)",
                        meta={"template": f"elementwise v{version}"})
    xs = tuple(In(int(r[1:]), (math.prod(types[r][0]),), types[r][1]) for r in sorted({data, ind}, key=lambda r: int(r[1:])))
    step = Call("injective", xs + (Out((outer * G * S,)), Scalar(S), Scalar(cfg["RB"])),
                items=-(-outer * G // cfg["RB"]), parallel=cfg["parallel"])
    return Lowered(module, Launch((step,)))


def _resizes(wl: Workload, types: dict, closed: dict | None = None):
    """{op index: (taps per axis or None, [(table name, array)])} for the Resize ops, or None if
    one of them cannot be coded: an operand (roi, scales, sizes) the workload does not hold.
    `closed`, when given, gets {op index: `_closed_form` of its last axis} where there is one."""
    consts = _consts(wl)
    out = {}
    for k, (n, o) in enumerate(zip(wl.nodes(), wl.ops)):
        if o["op"] not in RESIZES:
            continue
        if any(r not in consts for r in n.inputs[1:]):
            return None
        try:
            got, tabs = rz.tables(n, types[n.inputs[0]][0], *rz.operands_of(n, [None] + [consts[r] for r in n.inputs[1:]]))
        except Exception:
            return None
        if tuple(got) != tuple(types[f"t{k}"][0]):
            return None
        spec = rz.spec_of(n)
        plan, arrays = [], []
        for a, tab in enumerate(tabs):
            plan.append(None if tab is None else tab.index.shape[1])
            if tab is None:
                continue
            arrays.append((f"rzi{k}_{a}", np.ascontiguousarray(tab.index.reshape(-1), np.int64)))
            if spec.mode != "nearest":
                arrays.append((f"rzw{k}_{a}", np.ascontiguousarray(tab.weight.reshape(-1), np.float32)))
            if spec.transform == "tf_crop_and_resize":
                o_ = tab.index.shape[0]
                arrays.append((f"rzo{k}_{a}", np.zeros(o_, bool) if tab.outside is None else np.ascontiguousarray(tab.outside, bool)))
        last = tabs[-1] if tabs else None
        if closed is not None and last is not None and spec.transform != "tf_crop_and_resize":
            form = _closed_form(last.index, np.float32(last.weight) if spec.mode != "nearest" else None,
                                types[n.inputs[0]][0][-1])
            if form is not None:
                closed[k] = form
        out[k] = (plan, arrays)
    return out


@dataclass(frozen=True)
class ClosedForm:
    """An axis resized by an integer factor s: output s * j + p reads input j + offset[p][t]
    with weight[p][t] (float32) for every j in [lo, hi) -- no table, contiguous loads, so the
    loop vectorizes (through table gathers it stayed scalar: Resize 2x linear 0.2x copy)."""
    factor: int
    lo: int
    hi: int
    offset: tuple
    weight: tuple | None
    clamped: bool = False   # every j: the tables read input clip(j + offset, 0, n_in - 1) (a row padded with its edge values)


MIN_CLOSED = 8   # input columns in closed form worth a loop of their own


def _closed_form(index: np.ndarray, weight: np.ndarray | None, n_in: int) -> ClosedForm | None:
    """The closed form of one axis's tables (`ClosedForm`), found where the tables repeat with
    period s around the middle; None when the output is not s times the input or the run is short.
    The weights are the tables' own float32 values: both forms give the same bits."""
    n_out, T = index.shape
    s = n_out // max(n_in, 1)
    if n_in < MIN_CLOSED or s < 2 or n_out != s * n_in:
        return None
    idx = index.reshape(n_in, s, T) - np.arange(n_in)[:, None, None]
    mid = n_in // 2
    same = (idx == idx[mid]).all(axis=(1, 2))
    if weight is not None:
        w = weight.reshape(n_in, s, T)
        same &= (w == w[mid]).all(axis=(1, 2))
    lo, hi = mid, mid + 1
    while lo > 0 and same[lo - 1]:
        lo -= 1
    while hi < n_in and same[hi]:
        hi += 1
    js = np.arange(n_in)[:, None, None]
    clamped = bool((np.clip(js + idx[mid], 0, n_in - 1) == idx + js).all()
                   and (weight is None or (w == w[mid]).all()))
    if hi - lo < MIN_CLOSED and not clamped:   # clamped: the whole row from a padded buffer (`rows_of`)
        return None
    return ClosedForm(s, lo, hi, tuple(tuple(int(v) for v in row) for row in idx[mid]),
                      None if weight is None else tuple(tuple(float(v) for v in row) for row in w[mid]), clamped)


def _slice_starts_steps(node, in_shape, consts):
    """[start0, step0, start1, step1, ...] (int64, one pair per input axis) of a Slice whose
    starts, axes and steps the workload holds (its ends do not matter: the output shape is
    known), else None."""
    from ir.ops.tensor import _slice_params
    vals = [consts.get(r) for r in node.inputs]
    if any(p < len(node.inputs) and vals[p] is None for p in (1, 3, 4)):
        return None
    starts, _, axes, steps = _slice_params(node, len(in_shape), vals)
    sl = np.zeros(2 * len(in_shape), np.int64)
    sl[1::2] = 1
    for s, a, st in zip(starts, axes, steps):
        start, _, step = slice(int(s), 0, int(st)).indices(in_shape[a])
        sl[2 * a], sl[2 * a + 1] = start, step
    return sl


def _slice_function(node, k: int, in_shape, tables):
    """A Slice's starts/steps from operands that are data: a generated function clamps them as
    Python's slice.indices does, into the kernel's [start, step] pairs. (function, launch args)."""
    R = len(in_shape)
    tables[f"sld{k}"] = np.asarray(in_shape, np.int64)
    n_in = len(node.inputs)
    params, args = [Param("starts", "int64[::1]")], [In(int(node.inputs[1][1:]), None, "int64")]
    ax = f"axes[j] % {R}" if n_in > 3 else "j"
    if n_in > 3:
        params.append(Param("axes", "int64[::1]"))
        args.append(In(int(node.inputs[3][1:]), None, "int64"))
    if n_in > 4:
        params.append(Param("steps", "int64[::1]"))
        args.append(In(int(node.inputs[4][1:]), None, "int64"))
    params += [Param("dims", "int64[::1]"), Param("sl", "int64[::1]"), Param("t", "int64"), Param("T", "int64")]
    args.append(Table(f"sld{k}"))
    body = (thread_share("w", "1", body=(
        For("a", "0", str(R), (Assign("sl[2 * a]", "0"), Assign("sl[2 * a + 1]", "1"))),
        For("j", "0", "starts.shape[0]", (
            Assign("a", ax), Assign("d", "dims[a]"), Assign("st", "steps[j]" if n_in > 4 else "1"),
            Assign("lo", "0 if st > 0 else -1"), Assign("hi", "d if st > 0 else d - 1"), Assign("s", "starts[j]"),
            If("s < 0", (Assign("s", "max(s + d, lo)"),), (Assign("s", "min(s, hi)"),)),
            Assign("sl[2 * a]", "s"), Assign("sl[2 * a + 1]", "st"),
        )),
    )),)
    return Function(f"slice{k}", tuple(params), body), tuple(args)


def _row_temp_pays(node, plan) -> bool:
    """Whether a Resize is interpolated along its other axes first, into a row buffer: an
    interpolating mode (nearest reads one tap: nothing to share), the last axis resized, and
    some other axis with more than one tap (tf_crop_and_resize's outside flags are per output
    element: left to the nested taps)."""
    spec = rz.spec_of(node)
    if spec.mode == "nearest" or spec.transform == "tf_crop_and_resize" or not plan or plan[-1] is None or plan[-1] < 2:
        return False
    return any(p is not None and p > 1 for p in plan[:-1])


def _resize_params(nodes, resizes) -> tuple:
    """Kernel parameters of the resize tables: per coded axis its indices, weights (not for
    nearest) and outside flags (tf_crop_and_resize)."""
    out = []
    for k, plan in resizes.items():
        spec = rz.spec_of(nodes[k])
        for a, T in enumerate(plan):
            if T is None:
                continue
            out.append(Param(f"rzi{k}_{a}", "int64[::1]"))
            if spec.mode != "nearest":
                out.append(Param(f"rzw{k}_{a}", "float32[::1]"))
            if spec.transform == "tf_crop_and_resize":
                out.append(Param(f"rzo{k}_{a}", "boolean[::1]"))
    return tuple(out)


STREAMS = 4   # independent parts of a flat block whose statements are interleaved (see `_interleaved`)


def _streams_for(wl: Workload, loaded: list, shapes: dict) -> int:
    """How many parts of a flat block run interleaved: `STREAMS` for a chain with a vectorizable
    polynomial (Exp, Tanh, Sigmoid, Erf, Gelu, Log) over one full-size input, else 1. Such a body is
    one long dependent chain per vector (the 12-op Tanh/Sigmoid chain: ~45 ops deep, the constants
    re-broadcast each iteration): one chain at a time leaves Zen 3's FP scheduler full of waiting
    ops; four chains interleaved statement by statement ran 1.55x faster (two: 1.4x), same bits.
    More full-size inputs would multiply LLVM's run-time alias checks (4 streams each): one only."""
    if not any(o["op"] in VECTOR_MATH for o in wl.ops) or wl.output_dtype != "float32":
        return 1
    full = [r for r in loaded if math.prod(shapes[r]) != 1]
    return STREAMS if len(full) == 1 else 1


def _interleaved(var: str, lo: str, hi: str, body: tuple, streams: int) -> tuple:
    """for var in lo..hi: body — as `streams` parts of (hi - lo) // streams elements, the part k at
    var + k * hh, their statements interleaved one by one in one loop (each part's temporaries
    renamed), then the remainder. Only plain assignments; anything else runs as one loop."""
    if not all(isinstance(st, Assign) for st in body):
        return (For(var, lo, hi, body),)
    names = [st.target for st in body if re.fullmatch(r"[A-Za-z_]\w*", st.target)]
    word = re.compile(r"\b(" + "|".join(map(re.escape, [var] + names)) + r")\b")

    def part(e: str, k: int) -> str:
        return e if k == 0 else word.sub(lambda m: f"{m.group(1)}_p{k}", e)
    starts = tuple(Assign(f"{var}_p{k}", f"{var} + {k} * hh") for k in range(1, streams))
    mixed = tuple(Assign(part(st.target, k), part(st.value, k), st.op) for st in body for k in range(streams))
    return (Assign("hh", f"({hi} - {lo}) // {streams}"),
            For(var, lo, f"{lo} + hh", starts + mixed),
            For(var, f"{lo} + {streams} * hh", hi, body))


def _inner(var: str, lo: str, hi: str, body: tuple, unroll: int) -> tuple:
    """for var in lo..hi: body — in chunks of `unroll` copies with a guarded tail."""
    if unroll == 1:
        return (For(var, lo, hi, body),)
    from schedules.primitives import split, unroll as unroll_
    nest = split((For(var, lo, hi, body),), var, unroll, outer=f"{var}_o", inner=f"{var}_u", tail="guard")
    return unroll_(nest, f"{var}_u")


register_template(ElementwiseTemplate())

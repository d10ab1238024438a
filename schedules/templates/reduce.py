"""Reductions with a fused elementwise prologue: Softmax, LogSoftmax, LayerNormalization,
Reduce{Sum,Mean,Max,Min,Prod,SumSquare,L1,L2,LogSum,LogSumExp} over any axes, GlobalAverage/MaxPool.

The input is viewed as [rows, L, inner] (L: the reduced extent); axes that are not one run
go through offset tables (`_plan`: no prologue then). With inner == 1
each row is reduced in passes over L: reductions in V partial accumulators (`lanes`:
the fastmath flags exclude reassociation, so a single accumulator would never
vectorize), elementwise passes as plain loops (Softmax's exp is a vectorizable
polynomial written to the output, then summed and scaled). Softmax, LogSoftmax and
LayerNorm after plain arithmetic (`_one_pass`) are compiled with `reassoc` instead: their
sums have one accumulator, fused into the pass that makes the summands (e^(v - m); v - v[0]
and its square), and LLVM's vectorizer splits them into lanes. The prologue (e.g. BERT's
Add + Add before LayerNormalization) is computed once per element and kept in a row
buffer (`cache=True`; without a prologue the input row is read again instead) or
recomputed in each pass. Indices are unsigned: numba's check for negative indices
kept the row loops scalar. With inner > 1 (middle axes) the output row is the
accumulator and the inner loop runs contiguously. Rows per work item and threading
are run-time.
"""
from __future__ import annotations

import math

import numpy as np

from ir.graph import Node
from ir.ops import BROADCAST, ELEMWISE, OPS
from ir.ops.registry import f32
from ir.ops.elementwise import LOG2E, exp2_build, op_assigns
from ir.ops.reduce import _axes
from ir.workload import Workload
from schedules.launch import Call, In, Launch, Out, Scalar, Table
from schedules.microkernel import vector_shape
from schedules.loopnest import Alloc, Assign, Comment, For, Function, If, LoopModule, Param, thread_share
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Lowered, Template

ROW_OPS = ("Softmax", "LogSoftmax", "LayerNormalization")
REDUCE_OPS = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
              "GlobalAveragePool": "mean", "GlobalMaxPool": "max"}
NEG_INF, POS_INF = "np.float32(-np.inf)", "np.float32(np.inf)"
LANES = (1, 4, 8, 16, 32, 64)


def default_lanes(L: int, target=None) -> int:
    """Partial results of a row reduction: two vectors of the target's width (AVX2: 16 floats),
    so that two vector add chains overlap (one vector waits out the add's latency on each step:
    LayerNorm 128x1024 1.4x slower with 8; 32 no faster than 16, its lanes folded in a longer
    chain per row), at most the row's length."""
    want = 2 * vector_shape(target)[0]
    return max([n for n in LANES if n <= max(want, 1) and n <= max(L, 1)] or [1])


# reductions beyond the classic four (the CUDA family does not cover them)
MORE_REDUCE_OPS = {"ReduceProd": "prod", "ReduceSumSquare": "sumsq", "ReduceL2": "l2", "ReduceL1": "l1",
                   "ReduceLogSum": "logsum", "ReduceLogSumExp": "logsumexp"}
EXACT = ("nsz", "arcp", "contract", "afn")   # LogSumExp tests for infinite maxima: no nnan/ninf
# Softmax and LayerNorm sum with one accumulator under `reassoc`, which lets LLVM's loop vectorizer
# split the sum into vector lanes itself (interleaved, folded by halves at the end of the row)
# and fuse it with the pass that makes the summands; prologues of these ops only (reassoc folds
# the rounding constant of the exp/tanh-style polynomials, see exp_build)
REASSOC = ("nnan", "ninf", "nsz", "arcp", "contract", "afn", "reassoc")
REASSOC_SAFE = {"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "Max", "Min", "Identity"}
# one-pass LayerNorm: a row whose E[d]^2 (d = v - v[0]) is over this many times its var, whose
# float32 E[d^2] - E[d]^2 then cancels (1 + 3 * 8)-fold or more, is read again for sum (v - mean)^2
SHIFT_FALLBACK = 8.0
F0_, F1_ = "np.float32(0.0)", "np.float32(1.0)"
KINDS = {   # kind: (identity, update of s by v, result from m of n elements)
    "sum": (F0_, "{s} + {v}", "{m}"),
    "mean": (F0_, "{s} + {v}", "{m} / np.float32({n})"),
    "max": (NEG_INF, "max({s}, {v})", "{m}"),
    "min": (POS_INF, "min({s}, {v})", "{m}"),
    "prod": (F1_, "{s} * {v}", "{m}"),
    "sumsq": (F0_, "{s} + {v} * {v}", "{m}"),
    "l2": (F0_, "{s} + {v} * {v}", "np.float32(math.sqrt({m}))"),
    "l1": (F0_, "{s} + abs({v})", "{m}"),
    "logsum": (F0_, "{s} + {v}", "np.float32(math.log({m}))"),
}


def _reduced_axes(wl: Workload, k: int, rank: int):
    """The reduced axes of op k, normalized; None where they are unknown at lowering."""
    op = wl.ops[k]
    if op["op"] in ("Softmax", "LogSoftmax"):
        axis = int(op["attrs"].get("axis", -1 if op["attrs"].get("_opset", 13) >= 13 else 1)) % rank
        if op["attrs"].get("_opset", 13) >= 13 and axis != rank - 1:
            return None
        return list(range(axis, rank))
    if op["op"] == "LayerNormalization":
        return list(range(int(op["attrs"].get("axis", -1)) % rank, rank))
    if op["op"].startswith("Global"):
        return list(range(2, rank))
    consts = [None]
    if len(op["in"]) > 1:   # axes given as an input (opset 18): known when stored by value
        spec = wl.inputs[int(op["in"][1][1:])] if op["in"][1].startswith("i") else {}
        if "value" not in spec:
            return None
        consts = [None, np.asarray(spec["value"], np.int64)]
    try:
        return _axes(wl.nodes()[k], rank, consts)
    except Exception:   # out-of-range axes: the reference path raises the clear error
        return None


def _groups(shape, axes):
    """x's dims merged into runs of equal kind, size-1 dims dropped: [(size, reduced)]."""
    groups = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        if groups and groups[-1][1] == (d in axes):
            groups[-1] = (groups[-1][0] * n, d in axes)
        else:
            groups.append((n, d in axes))
    return groups


def _offsets(groups, strides) -> np.ndarray:
    """Row-major offsets of every index of `groups` (the element offsets of their strides)."""
    offs = np.zeros(1, np.int64)
    for (n, _), st in zip(groups, strides):
        offs = (offs[:, None] + np.arange(n, dtype=np.int64) * st).reshape(-1)
    return offs


def _plan(wl: Workload):
    """How the reduction runs, or None: {k, kind, rows, L, inner} plus, for a reduction over
    axes that are not one contiguous run, the offset tables `base` (of each output row) and
    `off` (of each reduced row). inner > 1: the last dims are kept, and output rows of `inner`
    contiguous elements accumulate the input rows at base[r] + off[l]. inner == 1: each output
    element reduces J rows of L contiguous elements at base[r] + off[j] (J = 1, no tables, when
    the reduced axes are the trailing run)."""
    k = next((i for i, o in enumerate(wl.ops) if o["op"] in ROW_OPS or o["op"] in REDUCE_OPS
              or o["op"] in MORE_REDUCE_OPS), None)
    if k is None or k != len(wl.ops) - 1:
        return None  # nothing after the reduction is fused here
    op = wl.ops[k]
    shape = _x_shape(wl, k)
    if shape is None or len(shape) == 0 or 0 in shape:
        return None
    axes = _reduced_axes(wl, k, len(shape))
    if not axes:
        return None
    kind = op["op"] if op["op"] in ROW_OPS else {**REDUCE_OPS, **MORE_REDUCE_OPS}[op["op"]]
    plan = {"k": k, "kind": kind}
    if axes == list(range(axes[0], axes[-1] + 1)):   # one run: [rows, L, inner], no tables
        a0, a1 = axes[0], axes[-1] + 1
        return {**plan, "rows": math.prod(shape[:a0]), "L": math.prod(shape[a0:a1]),
                "inner": math.prod(shape[a1:]), "J": 1}
    if k > 0 or op["op"] in ROW_OPS:
        return None
    groups = _groups(shape, axes)
    strides = [math.prod(n for n, _ in groups[g + 1:]) for g in range(len(groups))]
    kept = [g for g in range(len(groups)) if not groups[g][1]]
    red = [g for g in range(len(groups)) if groups[g][1]]
    pick = lambda gs: ([groups[g] for g in gs], [strides[g] for g in gs])  # noqa: E731
    if not red or groups[-1][1]:   # the last run is reduced: rows of L contiguous elements
        L = groups[-1][0] if red else 1
        outer = red[:-1] if red else []
        return {**plan, "rows": math.prod(groups[g][0] for g in kept), "L": L, "inner": 1,
                "J": math.prod(groups[g][0] for g in outer), "base": _offsets(*pick(kept)),
                "off": _offsets(*pick(outer))}
    return {**plan, "rows": math.prod(groups[g][0] for g in kept[:-1]), "L": math.prod(groups[g][0] for g in red),
            "inner": groups[-1][0], "J": 1, "base": _offsets(*pick(kept[:-1])), "off": _offsets(*pick(red))}


def _anchor(wl: Workload):
    """(index of the reduce op, rows, L, inner) for the classic form (Softmax, LogSoftmax,
    LayerNorm, Reduce{Sum,Mean,Max,Min} over one contiguous run of axes), or None. The CUDA
    family covers these."""
    p = _plan(wl)
    if p is None or "base" in p or wl.ops[p["k"]]["op"] in MORE_REDUCE_OPS:
        return None
    return p["k"], p["rows"], p["L"], p["inner"]


def _x_shape(wl: Workload, k: int):
    """Shape of the reduced value: the broadcast of the prologue's inputs (or the input itself)."""
    ref = wl.ops[k]["in"][0]
    if ref.startswith("i"):
        return tuple(wl.inputs[int(ref[1:])]["shape"])
    shapes = [tuple(wl.inputs[int(r[1:])]["shape"]) for o in wl.ops[:k] for r in o["in"] if r.startswith("i")]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _prologue_ok(wl: Workload, k: int) -> bool:
    for m, o in enumerate(wl.ops[:k]):
        d = OPS.get(o["op"])
        if d is None or d.kind not in (ELEMWISE, BROADCAST) or d.expr is None or o["op"] == "Cast":
            return False
        for r in o["in"]:
            if r.startswith("i") and wl.inputs[int(r[1:])]["dtype"] != "float32":
                return False
    if k and wl.ops[k]["in"][0] != f"t{k - 1}":
        return False
    reads = wl.ops[k]["in"] if wl.ops[k]["op"] in ROW_OPS else wl.ops[k]["in"][:1]   # a Reduce's axes are int64
    return all(wl.inputs[int(r[1:])]["dtype"] == "float32" for r in reads if r.startswith("i"))


def _input_mode(shape, xshape, L: int):
    """How element (r, c) of x's [rows, L] view reads an input: scalar, full, or 'per'
    (a trailing-dims input whose size is a multiple of L: row r reads its row r % (size // L))."""
    size = math.prod(shape)
    if size == 1:
        return "scalar"
    s = (1,) * (len(xshape) - len(shape)) + tuple(shape)
    if s == tuple(xshape):
        return "full"
    q = next(q for q in range(len(s) + 1) if all(d == 1 for d in s[:q]) and (q == len(s) or s[q] != 1))
    if s[q:] == tuple(xshape[q:]) and size % L == 0:
        return "per"
    return "full"  # materialized by broadcasting at launch


def _one_pass(wl: Workload, k: int) -> bool:
    """Whether row op k (Softmax, LogSoftmax, LayerNorm) sums in one vectorized pass with the
    values it sums (`_rows`' reassoc form): its prologue is plain arithmetic."""
    return wl.ops[k]["op"] in ROW_OPS and all(o["op"] in REASSOC_SAFE for o in wl.ops[:k])


def _row_inputs(wl: Workload, k: int) -> list[str]:
    """The workload inputs the row loop reads: the prologue's before op k, or op k's own input."""
    return sorted({r for o in wl.ops[:k] for r in o["in"] if r.startswith("i")} |
                  ({wl.ops[k]["in"][0]} if k == 0 else set()), key=lambda r: int(r[1:]))


class ReduceTemplate(Template):
    name = "reduce"
    version = 7

    def matches(self, wl: Workload) -> bool:
        p = _plan(wl)
        if p is None or wl.output_dtype != "float32" or not _prologue_ok(wl, p["k"]):
            return False
        if p["inner"] > 1 and (p["k"] > 0 or wl.ops[p["k"]]["op"] in ROW_OPS):
            return False
        return True

    def space(self, wl: Workload) -> ConfigSpace:
        if _plan(wl)["inner"] > 1:   # output rows accumulate `unroll` input rows per pass
            return ConfigSpace([
                Knob("unroll", (1, 2, 4, 8)),
                Knob("parallel", (True, False), code_shape=False),
                Knob("RB", (1, 4, 16, 64), code_shape=False),
            ])
        k = _plan(wl)["k"]
        if _one_pass(wl, k) and wl.ops[k]["op"] == "LayerNormalization":
            # LLVM's lanes; a prologue always buffered: values recomputed under reassoc may round
            # apart from the first pass's, and 1 / std (up to 1 / sqrt(eps)) scales the difference
            return ConfigSpace([Knob("parallel", (True, False), code_shape=False),
                                Knob("RB", (1, 4, 16, 64), code_shape=False)])
        if _one_pass(wl, k):   # Softmax/LogSoftmax: LLVM's lanes too (a `lanes` knob would only rename the code)
            return ConfigSpace([Knob("cache", (True, False)),
                                Knob("parallel", (True, False), code_shape=False),
                                Knob("RB", (1, 4, 16, 64), code_shape=False)])
        return ConfigSpace([
            Knob("lanes", LANES),
            Knob("cache", (True, False)),
            Knob("parallel", (True, False), code_shape=False),
            Knob("RB", (1, 4, 16, 64), code_shape=False),
        ])

    def default_config(self, wl: Workload, target=None) -> Config:
        p = _plan(wl)
        if p["inner"] > 1:
            return self.space(wl).validate({"unroll": 4, "parallel": True, "RB": 4})
        space = self.space(wl)
        names = {k.name for k in space.knobs}
        code = ({"lanes": default_lanes(p["L"], target)} if "lanes" in names else {}) | (
            {"cache": True} if "cache" in names else {})
        return space.validate({**code, "parallel": True, "RB": 4})

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        plan = _plan(wl)
        k, rows, L, inner = plan["k"], plan["rows"], plan["L"], plan["inner"]
        op = wl.ops[k]
        xshape = _x_shape(wl, k)
        refs = _row_inputs(wl, k)
        modes = {r: _input_mode(wl.inputs[int(r[1:])]["shape"], xshape, L) for r in refs}
        params = {r: f"x{r[1:]}" for r in refs}
        kind = plan["kind"]
        strided = "base" in plan
        if inner > 1:
            fn = _middle(params[refs[0]], kind, cfg["unroll"])
            what = f"unroll={cfg['unroll']}"
        else:
            lanes, cache = cfg.get("lanes", 1), cfg.get("cache", True)
            fn = _rows(wl, k, refs, modes, params, kind, lanes, cache, strided, _one_pass(wl, k))
            what = (f"lanes={lanes} " if "lanes" in cfg.to_json() else "one pass ") + f"cache={cache}" + (" strided" if strided else "")
        module = LoopModule((fn,), doc=f"reduce kernel: {'+'.join(o['op'] for o in wl.ops)} {what}",
                            meta={"template": f"reduce v{self.version}"})
        ln = op["op"] == "LayerNormalization"
        eps = float(op["attrs"].get("epsilon", 1e-5))
        size = math.prod(xshape)
        xs = []
        for r in refs:
            shape = tuple(wl.inputs[int(r[1:])]["shape"])
            if modes[r] == "full" and math.prod(shape) != size:   # broadcast to x's shape first (a copy per call)
                xs.append(In(int(r[1:]), (size,), "float32", tuple(xshape)))
            else:
                xs.append(In(int(r[1:]), (math.prod(shape),), "float32"))
        tables = {}
        if ln:   # scale and bias over the normalized dims (absent: 1 and 0)
            for idx, name, default in ((1, "scale", 1.0), (2, "shift", 0.0)):
                if len(op["in"]) > idx:
                    xs.append(In(int(op["in"][idx][1:]), (L,), "float32", _norm_shape(xshape, L)))
                else:
                    tables[name] = np.full(L, default, np.float32)
                    xs.append(Table(name))
        rb = cfg["RB"]
        out = Out((math.prod(wl.output_shape),))
        if inner > 1:
            tables["base"] = plan.get("base", np.arange(rows, dtype=np.int64) * (L * inner))
            tables["off"] = plan.get("off", np.arange(L, dtype=np.int64) * inner)
            args = tuple(xs) + (Table("base"), Table("off"), out, Scalar(rows), Scalar(L), Scalar(inner), Scalar(rb))
        elif strided:   # rows of L contiguous elements at base[r] + off[j], j < J
            tables["base"], tables["off"] = plan["base"], plan["off"]
            args = tuple(xs) + (Table("base"), Table("off"), out, Scalar(rows), Scalar(L), Scalar(plan["J"]),
                                Scalar(rb))
        else:
            # row r of a 'per' input starts at (r % per) * L: per = its size // L
            tables["per"] = np.asarray([a.shape[0] // L if a.shape[0] % L == 0 else 0 for a in xs[:len(refs)]],
                                       np.int64)
            args = tuple(xs) + (out, Scalar(rows), Scalar(L), Table("per"), Scalar(eps, "float64"), Scalar(rb))
        step = Call("reduce", args, items=-(-rows // rb), parallel=cfg["parallel"])
        return Lowered(module, Launch((step,), tables=tables))


def _norm_shape(xshape, L):
    """LayerNormalization's scale/bias are broadcast over the normalized (trailing) dims."""
    tail, size = [], 1
    for d in reversed(xshape):
        if size >= L and tail:
            break
        tail.insert(0, d)
        size *= d
    return tuple(tail)


def _u(index: str) -> str:
    """An unsigned index: numba's wrap-around check for negative signed indices keeps LLVM from
    vectorizing (every index here is >= 0)."""
    return f"np.uint64({index})"


I32 = "np.int32"


def _key(b: str) -> str:
    """The float32 bits b (an int32) as an int32 that orders as the floats do, and back (its own
    inverse): negative floats' magnitude bits flipped. One-pass Softmax takes the row's max of
    these: an integer max reduction, which LLVM's loop vectorizer splits into vector lanes and
    folds as a tree; the float max is a lane-order chain of scalar maxes (the vectorizer needs
    no-NaNs as a function attribute, which numba does not set): 32 of them per row, 1.4x of
    Softmax 128x256's time on AVX-512."""
    return f"{I32}({b} ^ {I32}({I32}({b} >> {I32}(31)) & {I32}(0x7FFFFFFF)))"


def _load(ref, modes, params, slot):
    p, m = params[ref], modes[ref]
    if m == "scalar":
        return f"{p}[0]"
    if m == "full":
        return f"{p}[{_u('base + c')}]"
    return f"{p}[{_u(f'pb{slot} + c')}]"   # periodic: pb = (r % (size // L)) * L, or c % size when size < L


def _rows(wl, k, refs, modes, params, kind, lanes, cache, strided=False, one_pass=False) -> Function:
    """One function; per row: the first reduction (max or sum) over the prologue's values, in
    `lanes` partial results; then the passes of the op, each a plain loop over the row (no
    loop-carried value: LLVM vectorizes it) or a lane-split reduction.

    Softmax: out = e^(v - m) (one exp per element, vectorized polynomial), the sum of out in
    lanes, out *= 1 / sum. LogSoftmax: likewise, then out = v - (m + ln sum). LayerNorm: mean,
    variance of (v - mean) in lanes, out = (v - mean) * inv * scale + shift. Reduce*: one
    lane-split pass (`KINDS`); `strided`: over J rows of L at base[r] + off[j] into the same lanes.

    `one_pass` (`_one_pass`: the function is compiled with `reassoc`): the sums have one
    accumulator, which LLVM vectorizes and interleaves, in the pass that makes the summands.
    Softmax: out = e^(v - m) and its sum in one pass (LogSoftmax sums without storing);
    LayerNorm: one pass sums d = v - v[0] and d^2 (var = E[d^2] - E[d]^2: shifted by a value of
    the row, (v[0] - mean)^2 <= L var bounds the cancellation), then normalizes. 128x256 rows
    1.2x (Softmax) and 1.8x (LayerNorm) faster than three lane-split passes."""
    slots = {r: i for i, r in enumerate(refs)}
    loads = {r: _load(r, modes, params, slots[r]) for r in refs}
    cache = cache and k > 0   # without a prologue, x itself is the row

    def value(u: int) -> tuple:
        """Statements computing the prologue value v{u} at column c{u}."""
        sub = lambda s: s.replace("+ c)]", f"+ c{u})]")  # noqa: E731
        if k == 0:
            return (Assign(f"v{u}", sub(loads[refs[0]])),)
        stmts, env = [], {}
        for m, o in enumerate(wl.ops[:k]):
            node = Node(o["op"], tuple(o["in"]), ("_",), dict(o["attrs"]))
            args = [env[r] if r.startswith("t") else sub(loads[r]) for r in o["in"]]
            name = f"p{m}_{u}"
            stmts += [Assign(t, e) for t, e in op_assigns(node, args, name)]
            env[f"t{m}"] = name
        stmts.append(Assign(f"v{u}", f"np.float32({env[f't{k - 1}']})"))
        return tuple(stmts)

    def read(u: int) -> tuple:
        return (Assign(f"v{u}", f"buf[{_u(f'c{u}')}]"),) if cache else value(u)

    def lane_pass(elem, load) -> tuple:
        """elem(u) -> statements for lane u at column c{u} after load(u); lanes unrolled, then a tail."""
        main = For("c0", "0", "nv", step=str(lanes), body=tuple(
            s for u in range(lanes) for s in (Assign(f"c{u}", f"c0 + {u}"),) + load(u) + elem(u)))
        tail = For("c0", "nv", "L", load(0) + elem(0)) if lanes > 1 else None
        return (main,) + ((tail,) if tail else ())

    def row_pass(stmts) -> For:
        """A loop over the row with no loop-carried value."""
        return For("c0", "0", "L", stmts)

    def keep(u):
        return (Assign(f"buf[{_u(f'c{u}')}]", f"v{u}"),) if cache else ()

    def init(val):
        return tuple(Assign(f"s{u}", val) for u in range(lanes))

    def combine(fn, into):
        """Statements folding the lanes into `into`, in lane order: what LLVM's SLP pass turns
        into vector ops in the row loop (folds by halves or by vectors made it pair the lanes
        wrongly: scalar loads and shuffles in the row loop, 1.6x slower)."""
        expr = "s0"
        for u in range(1, lanes):
            expr = f"{fn}({expr}, s{u})" if fn not in ("", "*") else f"{expr} {fn or '+'} s{u}"
        return (Assign(into, f"({expr})"),)

    def out_at(u):
        return f"out[{_u(f'base + c{u}')}]"

    def exp_of(arg: str, reassoc: bool = False) -> tuple:
        """2^arg for arg <= 0 into `e` (vectorizable polynomial; 2^-126 ~ 1e-38 stands for 0)."""
        stmts = []

        def bind(x):
            stmts.append(Assign(f"e_{len(stmts)}", x))
            return stmts[-1].target
        e = exp2_build(bind, arg, reassoc=reassoc)
        return tuple(stmts) + (Assign("e", e),)

    F0 = "np.float32(0.0)"
    body = []
    def second_row(stmts) -> tuple:
        """Statements of lane 1 read from the next row (base2, pb{slot}b, buf2)."""
        def move(e: str) -> str:
            e = e.replace("[np.uint64(base + c", "[np.uint64(base2 + c").replace("buf[", "buf2[")
            for slot in slots.values():
                e = e.replace(f"[np.uint64(pb{slot} + c", f"[np.uint64(pb{slot}b + c")
            return e
        return tuple(Assign(move(a.target), move(a.value), a.op) for a in stmts)

    def ln_rows(n: int) -> list:
        """One-pass LayerNorm of n rows (1 or 2: a pair shares its loops, scale and shift loads
        and the per-row latency of sqrt and the division, 1.2x at 256 and 1024 floats), in float32.
        var = E[d^2] - E[d]^2 of d = v - v[0] cancels (1 + 3 E[d]^2 / var)-fold: where that is
        over SHIFT_FALLBACK (the first value far out, ~0.5 % of normal rows) the row is read
        again for the sum of (v - mean)^2 (two passes, no cancellation). float64 sums (reduce v6)
        were 1.2-1.4x slower, and two float32 passes for every row 1.3x."""
        sfx = ["", "2"][:n]
        row = [lambda st: st, second_row][:n]
        stats, norm, first, fin = [], [], [], []
        for u, (x, mv) in enumerate(zip(sfx, row)):
            first += [Assign(f"c{u}", "0"), *mv(value(u)), Assign(f"k{x}", f"v{u}"), Assign(f"s{x}", F0),
                      Assign(f"q{x}", F0)]
            stats += [*((Assign(f"c{u}", "c0"),) if u else ()), *mv(value(u) + keep(u)),
                      Assign(f"d{u}", f"v{u} - k{x}"), Assign(f"s{x}", f"d{u}", "+"), Assign(f"q{x}", f"d{u} * d{u}", "+")]
            again = (*((Assign(f"c{u}", "c0"),) if u else ()), *mv(read(u)), Assign(f"d{u}", f"v{u} - mean{x}"),
                     Assign(f"q{x}", f"d{u} * d{u}", "+"))
            fin += [Assign(f"ms{x}", f"s{x} / np.float32(L)"), Assign(f"mean{x}", f"k{x} + ms{x}"),
                    Assign(f"var{x}", f"q{x} / np.float32(L) - ms{x} * ms{x}"),
                    If(f"ms{x} * ms{x} > np.float32({SHIFT_FALLBACK}) * var{x}",
                       (Assign(f"q{x}", F0), row_pass(again), Assign(f"var{x}", f"q{x} / np.float32(L)"))),
                    Assign(f"inv{x}", f"np.float32(1.0) / np.float32(math.sqrt(var{x} + eps))")]
            norm += [*((Assign(f"c{u}", "c0"),) if u else ()), *mv(read(u)),
                     Assign(mv((Assign(out_at(u), ""),))[0].target, f"(v{u} - mean{x}) * inv{x} * g + b")]
        return [*first, row_pass(tuple(stats)), *fin,
                row_pass((Assign("g", "scale[np.uint64(c0)]"), Assign("b", "shift[np.uint64(c0)]"), *norm))]

    if one_pass and kind == "LayerNormalization":
        body += ln_rows(1)
    elif kind in ("Softmax", "LogSoftmax") and one_pass:   # the max as an integer reduction (`_key`)
        body += [Assign("mk", f"{I32}(-2147483648)"),
                 row_pass(value(0) + keep(0) + (Assign("b0", "np.float32(v0).view(np.int32)"),
                                                Assign("mk", f"{I32}(max(mk, {_key('b0')}))"))),
                 Assign("m", f"{_key('mk')}.view(np.float32)")]
    elif kind in ("Softmax", "LogSoftmax"):
        body += [*init(NEG_INF), *lane_pass(lambda u: keep(u) + (Assign(f"s{u}", f"max(s{u}, v{u})"),), value),
                 *combine("max", "m")]
    elif kind == "LayerNormalization" and not one_pass:  # a sum first
        body += [*init(F0), *lane_pass(lambda u: keep(u) + (Assign(f"s{u}", f"v{u}", "+"),), value),
                 *combine("", "m")]
    elif kind == "logsumexp":   # the max m, then log(sum e^(v - m')) + m', m' = 0 where m is infinite
        passes = [lane_pass(lambda u: (Assign(f"s{u}", f"max(s{u}, v{u})"),), value),
                  lane_pass(lambda u: (Assign(f"s{u}", f"s{u} + np.float32(math.exp(v{u} - mm))"),), value)]
        if strided:
            passes = [(For("j", "0", "J", (Assign("base", "rb + off[np.uint64(j)]"),) + tuple(p)),) for p in passes]
        body += [*init(NEG_INF), *passes[0], *combine("max", "m"),
                 Assign("mm", f"m if abs(m) < np.float32(np.inf) else {F0}"),
                 *init(F0), *passes[1], *combine("", "s"), Assign("out[r]", "np.float32(math.log(s)) + mm")]
    else:   # Reduce*: identity, update, fold (KINDS), over one row or J strided rows
        ident, update, _ = KINDS[kind]
        upd = lambda u: (Assign(f"s{u}", update.format(s=f"s{u}", v=f"v{u}")),)  # noqa: E731
        passes = tuple(lane_pass(upd, value))
        if strided:
            passes = (For("j", "0", "J", (Assign("base", "rb + off[np.uint64(j)]"),) + passes),)
        body += [*init(ident), *passes, *combine({"max": "max", "min": "min", "prod": "*"}.get(kind, ""), "m")]
    if kind in ("Softmax", "LogSoftmax") and one_pass:
        # Softmax: 2^(v c - m c') with c' the float next to c = log2(e) away from zero: reassoc
        # factors v c - m c into (v - m) c, a subtraction and a multiply where this is one FMA
        # (Softmax does not depend on the shift; m c' >= m c keeps the argument <= 0). LogSoftmax
        # adds the shift back: m c would round by ulp(m c) there, so it keeps (v - m) c.
        lo, hi = (f32(float(np.nextafter(np.float32(LOG2E), np.float32(d)))) for d in (0, 2))
        cm = f"{hi} if m > {F0} else {lo}" if kind == "Softmax" else f32(LOG2E)
        body += [Assign("cm", cm), Assign("ml", "m * cm"), Assign("s", F0),
                 row_pass(read(0) + exp_of(f"v0 * {f32(LOG2E)} - ml", reassoc=True)
                          + ((Assign(out_at(0), "e"),) if kind == "Softmax" else ()) + (Assign("s", "e", "+"),))]
        if kind == "Softmax":
            body += [Assign("inv", "np.float32(1.0) / s"), row_pass((Assign(out_at(0), "inv", "*"),))]
        else:
            body += [Assign("ls", "m + np.float32(math.log(s))"), row_pass(read(0) + (Assign(out_at(0), "v0 - ls"),))]
    elif kind in ("Softmax", "LogSoftmax"):
        # e^(v - m) = 2^(v log2(e) - m log2(e)): one FMA for the argument
        body += [Assign("ml", f"m * {f32(LOG2E)}"),
                 row_pass(read(0) + exp_of(f"v0 * {f32(LOG2E)} - ml") + (Assign(out_at(0), "e"),)),
                 *init(F0), *lane_pass(lambda u: (Assign(f"s{u}", out_at(u), "+"),), lambda u: ()),
                 *combine("", "s")]
        if kind == "Softmax":
            body += [Assign("inv", "np.float32(1.0) / s"), row_pass((Assign(out_at(0), "inv", "*"),))]
        else:
            body += [Assign("ls", "m + np.float32(math.log(s))"), row_pass(read(0) + (Assign(out_at(0), "v0 - ls"),))]
    elif kind == "LayerNormalization" and not one_pass:
        body += [Assign("mean", "m / np.float32(L)"), *init(F0),
                 *lane_pass(lambda u: (Assign(f"d{u}", f"v{u} - mean"), Assign(f"s{u}", f"d{u} * d{u}", "+")), read),
                 *combine("", "var"), Assign("var", "var / np.float32(L)"),
                 Assign("inv", "np.float32(1.0) / np.float32(math.sqrt(var + eps))"),
                 row_pass(read(0) + (Assign(out_at(0), "(v0 - mean) * inv * scale[np.uint64(c0)] + shift[np.uint64(c0)]"),))]
    elif kind in KINDS:
        body += [Assign("out[r]", KINDS[kind][2].format(m="m", n="L * J" if strided else "L"))]
    per_row = tuple(Assign(f"pb{slots[r]}", f"(r % per[{slots[r]}]) * L")
                    for r in refs if modes[r] == "per")
    rows_loop = (For("r", "blk * RB", "min(rows, blk * RB + RB)",
                     (Assign("rb", "base_of[np.uint64(r)]") if strided else Assign("base", "r * L"),) + per_row + tuple(body)),)
    if one_pass and kind == "LayerNormalization":   # pairs of rows, then the block's odd row
        per_row2 = tuple(Assign(f"pb{slots[r]}b", f"((r + 1) % per[{slots[r]}]) * L")
                         for r in refs if modes[r] == "per")
        rows_loop = (Assign("r0", "blk * RB"), Assign("r1", "min(rows, blk * RB + RB)"),
                     Assign("rm", "r0 + ((r1 - r0) // 2) * 2 if paired else r0"),
                     For("r", "r0", "rm", step="2", body=(Assign("base", "r * L"), Assign("base2", "base + L"))
                         + per_row + per_row2 + tuple(ln_rows(2))),
                     For("r", "rm", "r1", (Assign("base", "r * L"),) + per_row + tuple(body)))
    if one_pass and kind == "LayerNormalization":
        # pairs only where the rows start on cache lines: with the arrays 16 or 48 bytes past one (as
        # np.empty's large arrays are) the pairs were 1.2-1.6x slower than single rows on AVX-512,
        # aligned 1.15x faster (128x256, 128x1024)
        lines = " | ".join([f"{params[r]}.ctypes.data" for r in refs if modes[r] != "scalar"] + ["out.ctypes.data"])
        rows_loop = (Assign("paired", f"(({lines}) & 63) == 0"),) + rows_loop
    loop = (
        Assign("nv", f"(L // {lanes}) * {lanes}"),
    ) + ((Alloc("buf", ("L",)),) if cache else ()) + ((Alloc("buf2", ("L",)),) if cache and one_pass and kind == "LayerNormalization" else ()) + (
        thread_share("blk", "(rows + RB - 1) // RB", body=rows_loop),
    )
    params = tuple(Param(params[r], "float32[::1]") for r in refs)
    if kind == "LayerNormalization":
        params += (Param("scale", "float32[::1]"), Param("shift", "float32[::1]"))
    if strided:
        params += (Param("base_of", "int64[::1]"), Param("off", "int64[::1]"), Param("out", "float32[::1]"),
                   Param("rows", "int64"), Param("L", "int64"), Param("J", "int64"), Param("RB", "int64"),
                   Param("t", "int64"), Param("T", "int64"))
        return Function("reduce", params, loop, **({"fastmath": EXACT} if kind == "logsumexp" else {}))
    params += (Param("out", "float32[::1]"), Param("rows", "int64"), Param("L", "int64"),
               Param("per", "int64[::1]"), Param("eps", "float64"), Param("RB", "int64"),
               Param("t", "int64"), Param("T", "int64"))
    return Function("reduce", params, loop, **({"fastmath": REASSOC} if one_pass else {}))


def _middle(x: str, kind: str, unroll: int) -> Function:
    """Reduce the kept-last-dims form: output row r (inner contiguous elements) is the accumulator
    of the input rows at base[r] + off[l], l < L, `unroll` of them per pass over the row (the
    output row is loaded and stored once per pass; the inner loop, unsigned indices and no
    loop-carried value, is what LLVM vectorizes)."""
    ident, update, final = KINDS["max" if kind == "logsumexp" else kind]
    u = _u

    def rows_pass(n: int) -> tuple:
        acc = "o"
        for q in range(n):
            acc = update.format(s=f"({acc})", v=f"{x}[{u(f'src{q} + i')}]")
        return (For("i", "0", "inner", (Assign("o", f"out[{u('ob + i')}]"), Assign(f"out[{u('ob + i')}]", acc))),)

    def sources(l: str, n: int) -> tuple:
        return tuple(Assign(f"src{q}", f"b + off[{u(f'{l} + {q}')}]") for q in range(n))

    post = final.format(m=f"out[{u('ob + i')}]", n="L")
    lse = ()
    if kind == "logsumexp":   # out holds the max: then acc = sum e^(x - m'), out = log(acc) + m'
        o, a = f"out[{u('ob + i')}]", f"acc[{u('i')}]"
        lse = (For("i", "0", "inner", (Assign(o, f"{o} if abs({o}) < np.float32(np.inf) else np.float32(0.0)"),
                                       Assign(a, "np.float32(0.0)"))),
               For("l", "0", "L", (Assign("src0", f"b + off[{u('l')}]"), For("i", "0", "inner", (
                   Assign(a, f"{a} + np.float32(math.exp({x}[{u('src0 + i')}] - {o}))"),)))),
               For("i", "0", "inner", (Assign(o, f"np.float32(math.log({a})) + {o}"),)))
    body = ((Alloc("acc", ("inner",)),) if lse else ()) + (
        Assign("nl", f"(L // {unroll}) * {unroll}"),
        thread_share("blk", "(rows + RB - 1) // RB", body=(
            For("r", "blk * RB", "min(rows, blk * RB + RB)", (
                Assign("ob", "r * inner"), Assign("b", f"base[{u('r')}]"),
                For("i", "0", "inner", (Assign(f"out[{u('ob + i')}]", ident),)),
                For("l", "0", "nl", step=str(unroll), body=sources("l", unroll) + rows_pass(unroll)),
            ) + ((For("l", "nl", "L", sources("l", 1) + rows_pass(1)),) if unroll > 1 else ()) + (
                (For("i", "0", "inner", (Assign(f"out[{u('ob + i')}]", post),)),) if final != "{m}" else ()) + lse),
        )),
    )
    params = (Param(x, "float32[::1]"), Param("base", "int64[::1]"), Param("off", "int64[::1]"),
              Param("out", "float32[::1]")) + tuple(Param(n, "int64") for n in ("rows", "L", "inner", "RB", "t", "T"))
    return Function("reduce", params, (Comment("output rows are the accumulators; the inner loop is contiguous"),) + body,
                    **({"fastmath": EXACT} if kind == "logsumexp" else {}))


register_template(ReduceTemplate())

"""When a computed tensor counts as right: one rule for the tuner's check of every
candidate kernel (`tuner.measure.jobs`), the template tests and `tune-run --check`.

Element-wise, `|got - ref| <= atol + rtol * |ref|`, with the tolerance derived from
the output dtype and the reduction length K (the longest chain of summed terms
behind an output element: K for a K-long dot product, plus one per elementwise op):

    rtol = SAFETY * eps(dtype) * sqrt(K)        atol = rtol * rms(ref)

A sum of K terms in another order differs by about eps * sqrt(K) * (the sum's
typical magnitude, ~ rms(ref) for terms of mixed sign): `atol` covers outputs that
cancel to ~0, `rtol` the ones that are large. Unlike a tolerance scaled by the
output's *max*, an error of 1e-3 on O(1) outputs of a short reduction is caught.
Integer and bool outputs must be exact. Reference elements that are not finite are
not judged (kernels compile with fast-math: no NaN/inf semantics).

Candidates are checked on several input sets (`check_inputs`): the workload's
uniform [-1, 1) inputs and a wider set with negative and large values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SAFETY = 16   # margin over the expected rounding difference (~2-3x at its largest)
WIDE_SCALE, OUTLIER_EVERY, OUTLIER_SCALE = 2.0, 8, 8.0   # the wide input set: N(0, 2), 1 in 8 values x8


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float

    @property
    def exact(self) -> bool:
        return self.rtol == 0.0 and self.atol == 0.0

    def __str__(self) -> str:
        return "exact" if self.exact else f"atol {self.atol:.3g} + rtol {self.rtol:.3g}"


def tolerance(dtype, reduction: int, scale: float) -> Tolerance:
    """The tolerance for outputs of `dtype` behind a `reduction`-long chain of terms,
    whose typical magnitude is `scale` (the reference's rms)."""
    dt = np.dtype(dtype)
    if dt.kind not in "fc":
        return Tolerance(0.0, 0.0)
    rtol = SAFETY * float(np.finfo(dt).eps) * math.sqrt(max(1, int(reduction)))
    return Tolerance(rtol, rtol * float(scale))


@dataclass(frozen=True)
class Comparison:
    ok: bool
    tolerance: Tolerance
    bad: int = 0                 # elements outside the tolerance
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    worst: str = ""              # the element that is furthest outside (index, got, want, allowed)

    def message(self, what: str = "output") -> str:
        if self.ok:
            return f"{what} matches ({self.tolerance})"
        if self.worst.startswith("shape"):
            return f"{what}: {self.worst}"
        return (f"{what}: {self.bad} element(s) outside {self.tolerance}; worst {self.worst}; "
                f"max abs error {self.max_abs_error:.3g}")


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0


def compare(got, want, reduction: int = 1) -> Comparison:
    """Element-wise check of `got` against the reference `want` (see the module docstring)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return Comparison(False, Tolerance(0.0, 0.0), want.size, math.inf, math.inf,
                          f"shape {list(got.shape)} vs reference {list(want.shape)}")
    if want.dtype.kind not in "fc":
        diff = got != want
        bad = int(np.count_nonzero(diff))
        worst = ""
        if bad:
            i = np.unravel_index(int(np.argmax(diff)), want.shape)
            worst = f"at {list(map(int, i))}: {got[i]!r} vs {want[i]!r}"
        err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if bad else 0.0
        return Comparison(bad == 0, Tolerance(0.0, 0.0), bad, err, err, worst)
    w = want.astype(np.float64).ravel()
    g = got.astype(np.float64).ravel()
    judged = np.isfinite(w)
    if not judged.all():
        w, g = w[judged], g[judged]
    tol = tolerance(want.dtype, reduction, _rms(w))
    err = np.abs(g - w)
    allowed = tol.atol + tol.rtol * np.abs(w)
    outside = ~(err <= allowed)          # NaN/inf in `got` counts as outside
    bad = int(np.count_nonzero(outside))
    finite_err = np.where(np.isfinite(err), err, np.inf)
    max_abs = float(finite_err.max()) if finite_err.size else 0.0
    with np.errstate(over="ignore"):
        max_rel = float((finite_err / np.maximum(np.abs(w), np.finfo(np.float64).tiny)).max()) if finite_err.size else 0.0
    worst = ""
    if bad:
        k = int(np.argmax(np.where(outside, np.nan_to_num(err / np.maximum(allowed, 1e-300), nan=np.inf), -1.0)))
        idx = np.unravel_index(int(np.flatnonzero(judged)[k]), want.shape)
        worst = f"at {list(map(int, idx))}: {g[k]:.7g} vs {w[k]:.7g} (allowed +-{allowed[k]:.3g})"
    return Comparison(bad == 0, tol, bad, max_abs, max_rel, worst)


# -- reduction length -------------------------------------------------------------------

_LINALG = ("MatMul", "Gemm", "Conv", "ConvTranspose")
_POOLS = ("MaxPool", "AveragePool", "LpPool")
_TO_THE_END = ("Softmax", "LogSoftmax", "LayerNormalization", "Hardmax")


def node_reduction(op: str, attrs: dict, in_shapes: list, out_shape) -> int:
    """How many terms op `op` combines into one output element: K of a dot product,
    C/g*kh*kw of a convolution, the reduced extent of a reduction, 1 for elementwise
    arithmetic, 0 for ops that only move data. Shapes may be None where unknown."""
    from ir.ops import BROADCAST, ELEMWISE, INJECTIVE, OPS

    def elems(s):
        return math.prod(s) if s is not None else None

    a = in_shapes[0] if in_shapes else None
    bias = int(op in ("Gemm", "Conv", "ConvTranspose") and len(in_shapes) > 2)   # a bias input: one more term
    if op in ("MatMul", "Gemm") and a:
        return int(a[0] if op == "Gemm" and attrs.get("transA") and len(a) == 2 else a[-1]) + bias
    if op in ("Conv", "ConvTranspose") and len(in_shapes) > 1 and in_shapes[1]:
        w = in_shapes[1]
        if op == "Conv":
            return max(1, math.prod(w[1:])) + bias
        return max(1, w[0] // max(1, int(attrs.get("group", 1))) * math.prod(w[2:])) + bias
    if op in _POOLS and attrs.get("kernel_shape"):
        return max(1, math.prod(int(k) for k in attrs["kernel_shape"]))
    if op in _TO_THE_END and a:
        axis = int(attrs.get("axis", -1)) % len(a)
        return max(1, math.prod(a[axis:]))
    kind = OPS[op].kind if op in OPS else None
    if kind == INJECTIVE:
        return 0
    if kind in (ELEMWISE, BROADCAST):
        return 1
    sizes = [elems(s) for s in in_shapes if s is not None]
    out = elems(out_shape)
    if sizes and out:
        return max(1, max(sizes) // out)   # Reduce*, Global*Pool, ... (and a guess for opaque ops)
    return 1


def workload_reduction(wl) -> int:
    """The reduction length behind the output of workload `wl`, from its ops and shapes."""
    from ir.graph import TensorType
    from ir.ops import OPS

    types = {f"i{k}": TensorType(tuple(i["shape"]), i["dtype"]) for k, i in enumerate(wl.inputs)}
    consts = {f"i{k}": np.array(i["value"]) for k, i in enumerate(wl.inputs) if "value" in i}
    depth = {r: 0 for r in types}
    nodes = wl.nodes()
    for k, n in enumerate(nodes):
        ins = [types.get(i) for i in n.inputs]
        last = k == len(nodes) - 1
        out = TensorType(tuple(wl.output_shape), wl.output_dtype) if last else None
        if out is None and n.op in OPS and all(t is not None for t in ins):
            try:
                out = OPS[n.op].infer(n, ins, [consts.get(i) for i in n.inputs])[0]
            except Exception:   # a shape that needs values we do not have: unknown
                out = None
        if out is not None:
            types[n.outputs[0]] = out
        shapes = [tuple(t.shape) if t is not None and all(isinstance(d, int) for d in t.shape) else None for t in ins]
        out_shape = tuple(out.shape) if out is not None and all(isinstance(d, int) for d in out.shape) else None
        depth[n.outputs[0]] = max((depth.get(i, 0) for i in n.inputs), default=0) + \
            node_reduction(n.op, n.attrs, shapes, out_shape)
    return max(1, depth.get(nodes[-1].outputs[0], 1)) if nodes else 1


def graph_reductions(graph, sizes: dict) -> dict[str, int]:
    """Per graph output, the longest chain of reductions behind it (at dim sizes `sizes`)."""
    from ir.shapes import bind

    def shape(name):
        try:
            s = tuple(int(d) for d in bind(graph.type_of(name).shape, sizes))
            return s
        except Exception:
            return None

    depth: dict[str, int] = {}
    for n in graph.nodes:
        k = node_reduction(n.op, n.attrs, [shape(i) if i else None for i in n.inputs],
                           shape(n.outputs[0]) if n.outputs and n.outputs[0] else None)
        d = max((depth.get(i, 0) for i in n.inputs if i), default=0) + k
        for o in n.outputs:
            if o:
                depth[o] = d
    return {o: max(1, depth.get(o, 1)) for o in graph.outputs}


# -- check inputs -----------------------------------------------------------------------

def check_inputs(wl, seed: int) -> list[list[np.ndarray]]:
    """The input sets a candidate is checked on: the workload's uniform [-1, 1) inputs
    (also the ones it is timed on), then a wide set: normal values of scale 2 with one in
    eight scaled x8 more (negative and large), bools drawn 50/50, ints in {-1, 0} (valid
    indices into any axis). Small int constants stored in the workload keep their value;
    where the wide ints make the reference fail (an int that is not an index), they are
    kept too."""
    first = wl.random_inputs(seed)
    rng = np.random.default_rng(seed + 1)
    wide, ints = [], []
    for a, spec in zip(first, wl.inputs):
        if "value" in spec:
            wide.append(a)
        elif a.dtype.kind == "f":
            x = np.asarray(rng.standard_normal(a.shape) * WIDE_SCALE)
            x[rng.random(a.shape) < 1 / OUTLIER_EVERY] *= OUTLIER_SCALE
            wide.append(x.astype(a.dtype))
        elif a.dtype == bool:
            wide.append(np.asarray(rng.random(a.shape) < 0.5))
        else:
            ints.append(len(wide))
            wide.append(np.asarray(rng.integers(-1, 1, size=a.shape)).astype(a.dtype))
    if ints:
        try:
            with np.errstate(all="ignore"):
                wl.reference(wide)
        except Exception:
            wide = [first[k] if k in ints else x for k, x in enumerate(wide)]
    return [first, wide]


def reference(wl, arrays) -> np.ndarray:
    """The workload's NumPy reference, without warnings for overflow or NaN (not judged)."""
    with np.errstate(all="ignore"):
        return wl.reference(arrays)

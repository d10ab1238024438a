"""Run a graph on NumPy through the registry's references: the correctness oracle.

Ops without a reference fall back, node by node, to `onnx.reference.ReferenceEvaluator`
(a one-node model); the report says which ops did and what share of nodes/time they took.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import onnx
import sympy
from onnx import helper, numpy_helper

from ir.errors import ShapeError, UnsupportedOpError
from ir.graph import Graph, Node
from ir.ops import OPS
from ir.dtypes import ONNX_TYPES as _ONNX_TYPES
from ir.graph import Graph as _Graph, split_outer
from ir.shapes import DimRange, bind, check_size, format_shape, unify


@dataclass
class FallbackReport:
    nodes: int = 0
    fallback_nodes: list = field(default_factory=list)   # (node name, op)
    seconds: float = 0.0
    fallback_seconds: float = 0.0

    @property
    def fallback_ops(self) -> list[str]:
        return sorted({op for _, op in self.fallback_nodes})

    @property
    def node_rate(self) -> float:
        return len(self.fallback_nodes) / self.nodes if self.nodes else 0.0

    @property
    def time_share(self) -> float:
        return self.fallback_seconds / self.seconds if self.seconds else 0.0

    def __str__(self) -> str:
        if not self.fallback_nodes:
            return f"{self.nodes} nodes, none fell back"
        return (f"{len(self.fallback_nodes)}/{self.nodes} nodes fell back to onnx.reference "
                f"({self.node_rate:.0%} of nodes, {self.time_share:.0%} of time): {', '.join(self.fallback_ops)}")


class ReferenceResult(dict):
    """Output name -> array, plus `.report` (a `FallbackReport`) and `.sizes` (bound dims)."""
    report: FallbackReport
    sizes: dict


def bind_inputs(g: Graph, feeds: dict[str, np.ndarray]) -> dict[str, int]:
    """Bind the graph's dynamic dims from the fed arrays; ShapeError naming input, dim, value, range."""
    sizes: dict[str, int] = {}
    for name in g.inputs:
        if name not in feeds:
            raise ShapeError(f"missing input '{name}' (expected {g.type_of(name)})")
        shape, want = np.shape(feeds[name]), g.type_of(name).shape
        if len(shape) != len(want):
            raise ShapeError(f"input '{name}': got rank {len(shape)} {list(shape)}, expected {format_shape(want)}")
        for axis, (d, v) in enumerate(zip(want, shape)):
            if isinstance(d, int):
                if d != v:
                    raise ShapeError(f"input '{name}' axis {axis}: got {v}, expected {d}")
            elif isinstance(d, sympy.Symbol):
                dim = d.name
                if dim in sizes and sizes[dim] != v:
                    raise ShapeError(f"input '{name}' axis {axis}: dim '{dim}' = {v} but another input "
                                     f"bound it to {sizes[dim]}")
                g.dims.get(dim, DimRange(dim)).check(v, where=f"input '{name}' axis {axis}: ")
                sizes[dim] = int(v)
    for name in g.inputs:  # compound dims (2*N) can be checked once all symbols are bound
        want = g.type_of(name).shape
        try:
            got = bind(want, sizes)
        except ShapeError:
            continue
        if tuple(got) != tuple(np.shape(feeds[name])):
            raise ShapeError(f"input '{name}': got shape {list(np.shape(feeds[name]))}, expected "
                             f"{format_shape(want)} = {list(got)} at {sizes}")
    for c in g.constraints:
        a, b, where = c
        try:
            va, vb = bind((a,), sizes)[0], bind((b,), sizes)[0]
        except ShapeError:
            continue
        if not (c.holds(va, vb) if hasattr(c, "holds") else va == vb):
            also = " (or one of them be 1)" if getattr(c, "broadcast", False) else ""
            raise ShapeError(f"node '{where}': dims {a} = {va} and {b} = {vb} must agree{also} (sizes {sizes})")
    return sizes


def run_reference(g: Graph, feeds: dict[str, np.ndarray]) -> ReferenceResult:
    sizes = bind_inputs(g, feeds)
    env = dict(g.constants)
    env.update({k: np.asarray(v) for k, v in feeds.items()})
    report = FallbackReport(nodes=len(g.nodes))
    t_start = time.perf_counter()
    # nodes whose outputs bind runtime dims, or whose types came from annotations: checked
    tells = set(g.runtime_dims.values()) | {n.name for n in g.nodes if n.op not in OPS}
    for n in g.nodes:
        _guard_outputs(g, n, sizes)
        t0 = time.perf_counter()
        args = [env[i] if i else None for i in n.inputs]
        outs = None
        if n.op in OPS and "_domain" not in n.attrs:
            try:
                outs = OPS[n.op].ref(n, args)
            except UnsupportedOpError:
                outs = None
        if outs is None:
            outs = _run_onnx_node(g, n, args)
            report.fallback_nodes.append((n.name, n.op))
            report.fallback_seconds += time.perf_counter() - t0
        for o, v in zip(n.outputs, outs):
            if o:
                env[o] = np.asarray(v)
                if n.name in tells and o in g.types:
                    unify(g.types[o].shape, env[o].shape, sizes, f"node '{n.name}' ({n.op}) output '{o}': ")
    report.seconds = time.perf_counter() - t_start
    result = ReferenceResult({o: env[o] for o in g.outputs})
    result.report, result.sizes = report, sizes
    return result


def _guard_outputs(g: Graph, n: Node, sizes: dict) -> None:
    """A misread dim fails here, naming the node, not as a huge allocation in its reference."""
    for o in n.outputs:
        t = g.types.get(o) if o else None
        if t is None:
            continue
        try:
            shape = bind(t.shape, sizes)
        except ShapeError:
            continue  # runtime dims not known yet
        check_size(shape, t.dtype, f"node '{n.name}' ({n.op}): output '{o}'", t.shape)


def onnx_attribute(name, value):
    """An IR attribute as an ONNX AttributeProto (bodies as their GraphProto, arrays as tensors)."""
    if isinstance(value, _Graph):
        return helper.make_attribute(name, value.proto)
    if isinstance(value, list) and value and all(isinstance(v, _Graph) for v in value):
        return helper.make_attribute(name, [v.proto for v in value])
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    return helper.make_attribute(name, value)


def _run_onnx_node(g: Graph, n: Node, args: list) -> list:
    """One node through onnx.reference (ops with no NumPy reference of ours)."""
    from onnx.reference import ReferenceEvaluator
    own_args, outer = split_outer(n, list(n.inputs))  # a control-flow body reads `outer` by name
    own = len(own_args)
    names = [f"in{k}" if i else "" for k, i in enumerate(own_args)] + list(outer)
    outs = [f"out{k}" if o else "" for k, o in enumerate(n.outputs)]
    domain = n.attrs.get("_domain", "")
    node = helper.make_node(n.op, names[:own], outs, domain=domain)
    node.attribute.extend(onnx_attribute(k, v) for k, v in n.attrs.items() if not k.startswith("_"))
    inputs = [helper.make_tensor_value_info(nm, _ONNX_TYPES.get(str(a.dtype), onnx.TensorProto.FLOAT), list(a.shape))
              for nm, a in zip(names, args) if nm]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs if o]
    opsets = [helper.make_opsetid("", g.opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph([node], "fallback", inputs, outputs), opset_imports=opsets)
    try:
        res = ReferenceEvaluator(model).run(None, {nm: a for nm, a in zip(names, args) if nm})
    except Exception as e:
        raise UnsupportedOpError(f"op '{n.op}' (node '{n.name}') has no reference in tensortune and "
                                 f"onnx.reference failed on it: {type(e).__name__}: {e}") from None
    it = iter(res)
    return [next(it) if o else None for o in outs]

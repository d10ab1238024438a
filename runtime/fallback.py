"""Opt-in fallback: what tensortune cannot run goes to onnxruntime, one session per region.

A node is *unsupported* when no op definition covers it (an op of the default domain
we do not register, or an op of another domain no plugin registered), or when its
reference failed on a call. `regions` replaces the subgraphs holding such nodes by
maximal connected regions of them (merged only where that creates no cycle through
other subgraphs), and `OrtRegion` runs one region as one `onnxruntime.InferenceSession`
built from a sub-model: the region's nodes, its boundary inputs as graph inputs, the
constants it reads as initializers, every value it hands on as a graph output.

Sessions depend on no dim size: a region is built once per `CompiledModel` and serves
every shape.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ir.custom import has_definition
from ir.errors import TensortuneError
from ir.fusion import FusedSubgraph, topo_order
from ir.graph import Graph, Node
from ir.ops import OPS
from ir.reference import onnx_attribute

ONNXRUNTIME = "onnxruntime"
FALLBACKS = (ONNXRUNTIME,)


class FallbackUnavailable(TensortuneError):
    """onnxruntime is missing, or refuses a region it was asked to run."""


def check_fallback(name: str | None) -> str | None:
    if name not in (None, "", *FALLBACKS):
        raise TensortuneError(f"unknown fallback '{name}' (choose from: {', '.join(FALLBACKS)})")
    return name or None


def unsupported_nodes(g: Graph) -> set[str]:
    """Names of the nodes no op definition covers (If/Loop/Scan run their bodies natively)."""
    from runtime.control_flow import is_control_flow
    return {n.name for n in g.nodes if not has_definition(n) and not is_control_flow(n)}


def _single(g: Graph, n: Node) -> FusedSubgraph:
    kind = OPS[n.op].kind if has_definition(n) else "opaque"
    return FusedSubgraph([n], [], next((o for o in n.outputs if o), ""), kind)


def regions(g: Graph, subgraphs: list[FusedSubgraph], unsupported: set[str]) -> list[FusedSubgraph]:
    """`subgraphs` with every unsupported node moved into a region (a fused group that held
    one is split into single nodes first), in dependency order.

    A region is a connected component of unsupported nodes when no path leaves it and comes
    back (it runs as one step); a component with such a path is split greedily instead."""
    if not unsupported:
        return subgraphs
    members: list[list[Node]] = []
    split: set[str] = set()
    for comp in _components(g, unsupported):
        if _convex(g, {n.name for n in comp}):
            members.append(comp)
        else:
            split |= {n.name for n in comp}
    members += _greedy(g, split)
    kept: list[FusedSubgraph] = []
    for sg in subgraphs:
        if any(n.name in unsupported for n in sg.nodes):
            kept += [_single(g, n) for n in sg.nodes if n.name not in unsupported]
        else:
            kept.append(sg)
    kept += [FusedSubgraph(nodes, [], nodes[-1].outputs[0], "opaque") for nodes in members]
    for sg in kept:
        made = {o for n in sg.nodes for o in n.outputs if o}
        sg.inputs = list(dict.fromkeys(i for n in sg.nodes for i in n.inputs if i and i not in made))
    return topo_order(g, kept)


def _components(g: Graph, names: set[str]) -> list[list[Node]]:
    """Connected components of the nodes `names` (edges: one's output feeds the other)."""
    parent = {n: n for n in names}

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a
    producer = g.producers()
    for n in g.nodes:
        if n.name in names:
            for i in n.inputs:
                p = producer.get(i) if i else None
                if p is not None and p.name in names:
                    parent[find(p.name)] = find(n.name)
    comps: dict[str, list[Node]] = {}
    for n in g.nodes:
        if n.name in names:
            comps.setdefault(find(n.name), []).append(n)
    return list(comps.values())


def _convex(g: Graph, names: set[str]) -> bool:
    """No path from the component through nodes outside it back into it."""
    consumers = g.consumers()
    frontier = [c for n in g.nodes if n.name in names for o in n.outputs if o
                for c in consumers.get(o, []) if c.name not in names]
    seen: set[str] = set()
    while frontier:
        c = frontier.pop()
        if c.name in seen:
            continue
        seen.add(c.name)
        for o in c.outputs:
            for d in consumers.get(o, []) if o else []:
                if d.name in names:
                    return False
                frontier.append(d)
    return True


def _greedy(g: Graph, names: set[str]) -> list[list[Node]]:
    """Regions of `names`, in graph order: a node joins the region of one of its producers
    unless another of its inputs depends on that region through nodes outside it."""
    owner: dict[str, int] = {}       # node name -> region index
    members: list[list[Node]] = []
    after: dict[str, set] = {}       # node name -> regions it depends on, transitively
    producer = g.producers()

    def reach(q: Node) -> set:
        return after[q.name] | ({owner[q.name]} if q.name in owner else set())
    for n in g.nodes:
        ins = [producer.get(i) if i else None for i in n.inputs]
        deps: set[int] = set().union(*(reach(q) for q in ins if q is not None))
        if n.name in names:
            target = next((owner[p.name] for p in ins if p is not None and p.name in owner
                           and all(q is None or owner.get(q.name) == owner[p.name] or owner[p.name] not in reach(q)
                                   for q in ins)), None)
            if target is None:
                target = len(members)
                members.append([])
            members[target].append(n)
            owner[n.name] = target
        after[n.name] = deps
    return members


def _elem_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class OrtRegion:
    """One region as one onnxruntime session. Called with the arrays of the region's
    non-constant inputs, returns {value: array} for every value it hands on."""

    def __init__(self, g: Graph, sg: FusedSubgraph, outputs: list[str]):
        try:
            import onnxruntime as ort
        except ImportError:
            raise FallbackUnavailable("--fallback onnxruntime needs onnxruntime: pip install onnxruntime") from None
        self.outputs = list(outputs)
        self.feeds = [i for i in sg.inputs if i not in g.constants]
        self.label = ", ".join(f"'{n.name}' ({n.op})" for n in sg.nodes[:3]) + (
            f" and {len(sg.nodes) - 3} more" if len(sg.nodes) > 3 else "")
        self.model = self._model(g, sg)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(self.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise FallbackUnavailable(f"onnxruntime cannot run node(s) {self.label}: {_first_line(e)}") from None

    def _model(self, g: Graph, sg: FusedSubgraph) -> onnx.ModelProto:
        nodes, domains = [], {}
        for n in sg.nodes:
            domain = n.attrs.get("_domain", "")
            if domain:
                domains[domain] = 1
            outer = list(n.attrs.get("_outer", ()))  # values a body reads by name (see ir.graph)
            own = len(n.inputs) - len(outer)
            for name, v in zip(outer, n.inputs[own:]):
                if name != v:
                    nodes.append(helper.make_node("Identity", [v], [name]))
            proto = helper.make_node(n.op, list(n.inputs[:own]), list(n.outputs), name=n.name, domain=domain or None)
            proto.attribute.extend(onnx_attribute(k, v) for k, v in n.attrs.items() if not k.startswith("_"))
            nodes.append(proto)
        inputs = []
        for i in self.feeds:
            t = g.type_of(i)
            inputs.append(helper.make_tensor_value_info(i, _elem_type(t.dtype), [None] * t.rank))
        outputs = []
        for o in self.outputs:  # untyped: onnxruntime infers them, our types may be hints only
            vi = onnx.ValueInfoProto()
            vi.name = o
            outputs.append(vi)
        inits = [numpy_helper.from_array(np.asarray(g.constants[i]), i) for i in sg.inputs if i in g.constants]
        graph = helper.make_graph(nodes, f"fallback_{sg.name}", inputs, outputs, inits)
        opsets = [helper.make_opsetid("", g.opset)] + [helper.make_opsetid(d, v) for d, v in domains.items()]
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = 10
        return model

    def __call__(self, arrays: list) -> dict[str, np.ndarray]:
        try:
            res = self.session.run(self.outputs, dict(zip(self.feeds, arrays)))
        except Exception as e:
            raise FallbackUnavailable(f"onnxruntime failed on node(s) {self.label}: {_first_line(e)}") from None
        return dict(zip(self.outputs, res))


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__

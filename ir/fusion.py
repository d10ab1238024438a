"""Fusion partitioner: groups nodes into `FusedSubgraph`s by TVM's pattern kinds.

An anchor (MatMul, Conv: out-elemwise-fusable) absorbs the elementwise/broadcast
ops that follow it; a chain of elementwise ops fuses into one subgraph; other
ops stand alone. A node joins a group only if the group's output feeds nothing
else, so no value is computed twice and every boundary value is materialized.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ir.graph import Graph, Node
from ir.ops import ANCHOR, BROADCAST, ELEMWISE, INJECTIVE, OPS, REDUCE
from ir.shapes import simplify_dim

_FUSABLE_EPILOGUE = (ELEMWISE, BROADCAST)


@dataclass
class FusedSubgraph:
    nodes: list[Node]
    inputs: list[str]   # boundary values read (graph inputs, constants or other subgraphs' outputs)
    output: str         # the one value it produces
    kind: str           # pattern kind of its first node (anchor, elemwise, injective, ...)

    @property
    def ops(self) -> list[str]:
        return [n.op for n in self.nodes]

    @property
    def name(self) -> str:
        return self.nodes[0].name

    def __str__(self) -> str:
        return " + ".join(self.ops)


def _kind(n: Node) -> str:
    from ir.custom import has_definition  # an op of another domain is not the built-in of that name
    return OPS[n.op].kind if has_definition(n) else "opaque"


def _casts_to_half(n: Node) -> bool:
    """The Cast back to float16/bfloat16 at an output (ir.precision) stands alone: kernels
    write float32, so fused into the group before it, it would keep that group uncompiled."""
    return n.op == "Cast" and int(n.attrs.get("to", 1)) in (10, 16)


def _can_extend(g: Graph, grp: FusedSubgraph | None, value: str, consumers, outputs) -> bool:
    """`value` is grp's output and nobody else reads it, so the next node may join grp."""
    return grp is not None and len(consumers.get(value, [])) == 1 and value not in outputs


def partition(g: Graph) -> list[FusedSubgraph]:
    """Greedy, in topological order:

    - an anchor (MatMul, Conv) or elementwise group absorbs a following elemwise /
      broadcast op of the same output shape (bias, BN scale, activation, residual Add);
    - a reduction (Softmax, LayerNorm, Reduce*, pooling) absorbs the elementwise group
      that feeds its data input (prologue); the group's kind becomes "reduce";
    - injective ops (Reshape, Transpose, Slice...) fuse into chains of injective ops;
    - everything else (opaque, multi-output) stands alone.
    """
    consumers = g.consumers()
    outputs = set(g.outputs)
    groups: list[FusedSubgraph] = []
    open_group: dict[str, FusedSubgraph] = {}  # value -> group whose current output it is
    for n in g.nodes:
        kind = _kind(n)
        target, new_kind = None, None
        single = len([o for o in n.outputs if o]) == 1
        if kind in _FUSABLE_EPILOGUE and single and not _casts_to_half(n):
            for i in n.inputs:
                grp = open_group.get(i)
                if _can_extend(g, grp, i, consumers, outputs) and grp.kind in (ANCHOR, ELEMWISE, BROADCAST) \
                        and g.type_of(n.outputs[0]).shape == g.type_of(i).shape:
                    target = grp
                    break
        elif kind == REDUCE and single and n.inputs:
            grp = open_group.get(n.inputs[0])
            if _can_extend(g, grp, n.inputs[0], consumers, outputs) and grp.kind in (ELEMWISE, BROADCAST):
                target, new_kind = grp, REDUCE
        elif kind == INJECTIVE and single and n.inputs:
            grp = open_group.get(n.inputs[0])
            if _can_extend(g, grp, n.inputs[0], consumers, outputs) and grp.kind == INJECTIVE:
                target = grp
        if target is not None:
            open_group.pop(target.output)
            target.nodes.append(n)
            target.output = n.outputs[0]
            if new_kind:
                target.kind = new_kind
        else:
            # the first output may be omitted ('': RNN's Y with only Y_h wanted)
            target = FusedSubgraph([n], [], next((o for o in n.outputs if o), n.outputs[0]), kind)
            groups.append(target)
        if single:
            open_group[n.outputs[0]] = target
    for grp in groups:
        produced = {o for n in grp.nodes for o in n.outputs}
        seen = []
        for n in grp.nodes:
            for i in n.inputs:
                if i and i not in produced and i not in seen:
                    seen.append(i)
        grp.inputs = seen
    return topo_order(g, groups)


def topo_order(g: Graph, subgraphs: list[FusedSubgraph]) -> list[FusedSubgraph]:
    """Subgraphs in an order where each runs after the producers of its inputs
    (a group that absorbed a later node may need a value made by a group created after it)."""
    from ir.errors import ShapeError
    made_by = {o: k for k, sg in enumerate(subgraphs) for n in sg.nodes for o in n.outputs if o}
    deps = [{made_by[i] for n in sg.nodes for i in n.inputs if i in made_by and made_by[i] != k}
            for k, sg in enumerate(subgraphs)]
    order, done = [], set()
    while len(order) < len(subgraphs):
        ready = next((k for k in range(len(subgraphs)) if k not in done and deps[k] <= done), None)
        if ready is None:
            raise ShapeError("the partition has a cycle between subgraphs")
        order.append(ready)
        done.add(ready)
    return [subgraphs[k] for k in order]


def node_flops(op: str, attrs: dict, input_shapes: list, output_shape):
    """FLOPs of one node: the one counting rule (`subgraph_flops` applies it to a graph's
    symbolic shapes, `Workload.flops` to concrete ones). `input_shapes` holds None for
    an omitted optional input (or one of unknown type)."""
    elems = math.prod(output_shape)
    if op in ("MatMul", "Gemm"):
        a = input_shapes[0]
        k = a[0] if op == "Gemm" and attrs.get("transA", 0) else a[-1]
        return 2 * elems * k
    if op in ("Conv", "ConvTranspose"):  # weight [M, C/groups, *kernel] (ConvTranspose: [C, M/groups, *kernel])
        return 2 * elems * math.prod(input_shapes[1][1:])
    if op in OPS and OPS[op].kind == REDUCE:
        return math.prod(input_shapes[0]) * OPS[op].flops_per_elem
    return elems * (OPS[op].flops_per_elem if op in OPS else 1)


def subgraph_flops(g: Graph, sg: FusedSubgraph):
    """FLOPs of one subgraph as a (possibly symbolic) expression in the graph's dims."""
    total = 0
    for n in sg.nodes:
        shapes = [g.types[i].shape if i in g.types else g.type_of(i).shape if i in g.constants else None
                  for i in n.inputs]
        total += node_flops(n.op, n.attrs, shapes, g.type_of(n.outputs[0]).shape)
    return simplify_dim(total)


def describe_partition(g: Graph, subgraphs: list[FusedSubgraph]) -> str:
    """Readable table of the partition: one line per distinct workload signature,
    with its ops, kind, symbolic output shape, FLOPs and how often it occurs,
    followed by the ops that have no reference and will fall back to onnx.reference."""
    from ir.workload import make_workload
    sizes = {name: r.lo for name, r in g.dims.items()}
    rows: dict[str, list] = {}
    for sg in subgraphs:
        try:
            key = make_workload(g, sg, sizes).signature
        except Exception:  # a shape that cannot bind at the smallest sizes: group by text
            key = f"{sg}|{[g.type_of(i).shape for i in sg.inputs]}"
        if key in rows:
            rows[key][1] += 1
        else:
            rows[key] = [sg, 1]
    total = simplify_dim(sum(subgraph_flops(g, sg) for sg in subgraphs))
    lines = [f"graph {g.name}: {len(g.nodes)} nodes -> {len(subgraphs)} subgraphs, "
             f"{len(rows)} distinct workloads; dims: " + (", ".join(str(r) for r in g.dims.values()) or "none"),
             f"{'#':>3}  {'kind':<9} {'x':>3}  {'output':<28} {'FLOPs':<24} ops"]
    for k, (sg, count) in enumerate(rows.values()):
        out = g.type_of(sg.output)
        lines.append(f"{k:>3}  {sg.kind:<9} {count:>3}  {str(out):<28} {str(subgraph_flops(g, sg)):<24} {sg}")
    lines.append(f"total FLOPs: {total}")
    fallback = sorted({n.op for n in g.nodes if n.op not in OPS})
    lines.append("fallback to onnx.reference: " + (", ".join(fallback) if fallback else "none"))
    if g.constraints:
        lines.append("dim constraints: " + "; ".join(f"{a} == {b} ({w})" for a, b, w in g.constraints))
    return "\n".join(lines)

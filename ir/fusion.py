"""Fusion partitioner: groups nodes into `FusedSubgraph`s by TVM's pattern kinds.

An anchor (MatMul, Conv: out-elemwise-fusable) absorbs the elementwise/broadcast
ops that follow it; a chain of elementwise ops fuses into one subgraph; other
ops stand alone. A node joins a group only if the group's output feeds nothing
else, so no value is computed twice and every boundary value is materialized.
"""
from __future__ import annotations

from dataclasses import dataclass

from ir.graph import Graph, Node
from ir.ops import ANCHOR, BROADCAST, ELEMWISE, OPS

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
    return OPS[n.op].kind if n.op in OPS else "opaque"


def partition(g: Graph) -> list[FusedSubgraph]:
    consumers = g.consumers()
    outputs = set(g.outputs)
    groups: list[FusedSubgraph] = []
    open_group: dict[str, FusedSubgraph] = {}  # value -> group whose current output it is
    for n in g.nodes:
        kind = _kind(n)
        target = None
        if kind in _FUSABLE_EPILOGUE and len(n.outputs) == 1:
            for i in n.inputs:
                grp = open_group.get(i)
                if grp is not None and grp.kind in (ANCHOR, ELEMWISE, BROADCAST) \
                        and len(consumers.get(i, [])) == 1 and i not in outputs \
                        and g.type_of(n.outputs[0]).shape == g.type_of(i).shape:
                    target = grp
                    break
        if target is not None:
            open_group.pop(target.output)
            target.nodes.append(n)
            target.output = n.outputs[0]
        else:
            target = FusedSubgraph([n], [], n.outputs[0], kind)
            groups.append(target)
        if len(n.outputs) == 1:
            open_group[n.outputs[0]] = target
    for grp in groups:
        produced = {o for n in grp.nodes for o in n.outputs}
        seen = []
        for n in grp.nodes:
            for i in n.inputs:
                if i and i not in produced and i not in seen:
                    seen.append(i)
        grp.inputs = seen
    return groups

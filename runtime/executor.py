"""`CompiledModel`: runs a partitioned graph with compiled kernels.

Per concrete shape (the sizes bound from the inputs) it builds a program once:
for each subgraph the chosen kernel, bound to its constants (weights packed
here, once), or the NumPy reference ops. Programs are cached per shape.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from codegen import compile_kernel
from ir.errors import ShapeError
from ir.fusion import FusedSubgraph
from ir.graph import Graph
from ir.ops import OPS
from ir.reference import bind_inputs
from ir.workload import make_workload
from runtime.choose import REFERENCE, Chooser


def run_node(g: Graph, node, args: list) -> tuple[list, bool]:
    """(outputs, fell back to onnx.reference?) for one node on the reference path."""
    if node.op in OPS and "_domain" not in node.attrs:
        return OPS[node.op].ref(node, args), False
    from ir.reference import _run_onnx_node
    return _run_onnx_node(g, node, args), True


@dataclass
class Step:
    subgraph: FusedSubgraph
    kind: str                     # tuned | nearest | default | reference
    kernel: object = None         # BoundKernel, or None on the reference path
    name: str = ""
    seconds: float = 0.0
    calls: int = 0


@dataclass
class Program:
    sizes: dict
    steps: list[Step]
    fallback_nodes: list = field(default_factory=list)


@dataclass
class Coverage:
    """Which subgraphs ran tuned / nearest-shape / default / reference kernels."""

    counts: dict
    nodes: dict
    seconds: dict
    fallback_ops: list

    def share(self, kind: str) -> float:
        total = sum(self.nodes.values())
        return self.nodes.get(kind, 0) / total if total else 0.0

    def to_json(self) -> dict:
        total_s = sum(self.seconds.values()) or 1.0
        return {"subgraphs": self.counts, "nodes": self.nodes,
                "time_share": {k: v / total_s for k, v in self.seconds.items()},
                "onnx_reference_ops": self.fallback_ops}

    def __str__(self) -> str:
        total = sum(self.nodes.values())
        parts = [f"{k}: {self.counts[k]} subgraphs / {self.nodes[k]} nodes ({self.nodes[k] / total:.0%})"
                 for k in ("tuned", "nearest", "default", "reference") if self.counts.get(k)]
        return "; ".join(parts)


class CompiledModel:
    def __init__(self, graph: Graph, subgraphs: list[FusedSubgraph], chooser: Chooser, strict: bool = False):
        self.graph, self.subgraphs, self.chooser, self.strict = graph, subgraphs, chooser, strict
        self._programs: dict[tuple, Program] = {}

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    def __call__(self, *args, **feeds):
        if args:
            if len(args) > len(self.graph.inputs):
                raise ShapeError(f"model takes {len(self.graph.inputs)} inputs, got {len(args)}")
            feeds = {**dict(zip(self.graph.inputs, args)), **feeds}
        outs = self.run(feeds)
        return outs[self.graph.outputs[0]] if len(outs) == 1 else outs

    def program(self, sizes: dict[str, int]) -> Program:
        key = tuple(sorted(sizes.items()))
        if key not in self._programs:
            self._programs[key] = self._build(sizes)
        return self._programs[key]

    def _build(self, sizes: dict[str, int]) -> Program:
        g = self.graph
        steps = []
        for sg in self.subgraphs:
            wl = make_workload(g, sg, sizes)
            choice = self.chooser.choose(wl)
            if choice.kind == REFERENCE:
                if self.strict:
                    raise ShapeError(f"--strict: subgraph {sg} ({wl.describe()}) has no template and would run on the reference path")
                steps.append(Step(sg, REFERENCE, name=str(sg)))
                continue
            kernel = compile_kernel(choice.template, wl, choice.config)
            consts = [g.constants.get(i) for i in sg.inputs]
            steps.append(Step(sg, choice.kind, kernel.bind(consts), name=str(sg)))
        return Program(sizes, steps)

    def run(self, feeds: dict) -> dict:
        g = self.graph
        unknown = set(feeds) - set(g.inputs)
        if unknown:
            raise ShapeError(f"unknown input(s) {sorted(unknown)}; the model's inputs are {g.inputs}")
        feeds = {k: np.asarray(v, dtype=g.type_of(k).dtype) for k, v in feeds.items()}
        sizes = bind_inputs(g, feeds)
        prog = self.program(sizes)
        env = dict(g.constants)
        env.update(feeds)
        for step in prog.steps:
            t0 = time.perf_counter()
            if step.kernel is not None:
                env[step.subgraph.output] = step.kernel([env[i] for i in step.subgraph.inputs])
            else:
                for n in step.subgraph.nodes:
                    outs, fell = run_node(g, n, [env[i] if i else None for i in n.inputs])
                    if fell and n.op not in prog.fallback_nodes:
                        prog.fallback_nodes.append(n.op)
                    for o, v in zip(n.outputs, outs):
                        if o:
                            env[o] = np.asarray(v)
            step.seconds += time.perf_counter() - t0
            step.calls += 1
        return {o: env[o] for o in g.outputs}

    def coverage(self, sizes: dict | None = None) -> Coverage:
        progs = [self.program(sizes)] if sizes is not None else list(self._programs.values())
        counts, nodes, secs, fb = {}, {}, {}, []
        for p in progs:
            for s in p.steps:
                counts[s.kind] = counts.get(s.kind, 0) + 1
                nodes[s.kind] = nodes.get(s.kind, 0) + len(s.subgraph.nodes)
                secs[s.kind] = secs.get(s.kind, 0.0) + s.seconds
            fb += [op for op in p.fallback_nodes if op not in fb]
        return Coverage(counts, nodes, secs, fb)

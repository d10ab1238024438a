"""If / Loop / Scan: the executor runs their bodies, each a nested `CompiledModel`.

The importer keeps a body as an `ir.Graph` attribute (`then_branch`/`else_branch`,
`body`) whose formal inputs come first; the enclosing values it reads by name are
appended to the node's inputs, in the order `node.attrs["_outer"]` names them (see
`ir.graph`). A body is simplified, partitioned and compiled like any graph, at the
concrete types of its inputs (one nested model per distinct input shapes, so shape
functions see static sizes and kernels are specialized); enclosing constants become
the body's constants, so weights are packed once.

Semantics follow the ONNX operators: If runs one branch; Loop runs while
`iteration < M` and `cond` (either may be absent) and stacks its scan outputs; Scan
(opset >= 9) slices its scan inputs along their axes, in either direction, and stacks
its outputs along theirs.
"""
from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

from ir.errors import ShapeError, TensortuneError, UnsupportedOpError
from ir.graph import Graph, Node, TensorType
from ir.precision import HALF

CONTROL_FLOW = "control_flow"
_BODY_ATTRS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
_MAX_MODELS = 32  # nested models per body: one per distinct input shapes, oldest dropped


def is_control_flow(node: Node) -> bool:
    """A node whose bodies the executor runs (the importer gave it `ir.Graph` bodies)."""
    names = _BODY_ATTRS.get(node.op)
    return bool(names) and all(isinstance(node.attrs.get(a), Graph) for a in names)


class ControlFlow:
    """One If/Loop/Scan node. `make_model(graph)` compiles a body graph (the executor's
    `CompiledModel` with the enclosing model's chooser and options)."""

    def __init__(self, g: Graph, node: Node, make_model):
        self.node, self.make_model = node, make_model
        self.outer = list(node.attrs.get("_outer", ()))
        self.own = len(node.inputs) - len(self.outer)
        # enclosing constants a body reads: its own constants (packed once); the rest are fed
        self.outer_consts = {name: g.constants[v] for name, v in zip(self.outer, node.inputs[self.own:])
                             if v in g.constants}
        self.feeds = [k for k, name in enumerate(self.outer) if name not in self.outer_consts]
        self.models: dict[str, OrderedDict] = {a: OrderedDict() for a in _BODY_ATTRS[node.op]}
        self.build_seconds = 0.0  # compiling bodies, inside the node's step time
        if node.op == "Scan" and g.opset < 9:
            raise UnsupportedOpError(f"node '{node.name}' (Scan): opset {g.opset} Scan (with a batch axis) is not "
                                     "supported; re-export with opset >= 9")

    @property
    def compiled(self) -> list:
        """Every nested model built so far (for coverage)."""
        return [m for ms in self.models.values() for m in ms.values()]

    def __call__(self, args: list) -> dict[str, np.ndarray]:
        own, outer = args[:self.own], {self.outer[k]: args[self.own + k] for k in self.feeds}
        try:
            outs = getattr(self, "_" + self.node.op.lower())(own, outer)
        except TensortuneError as e:  # one line that says which node's body failed
            where = f"node '{self.node.name}' ({self.node.op})"
            raise type(e)(str(e) if str(e).startswith(where) else f"{where}: body: {e}") from None
        return {o: np.asarray(v) for o, v in zip(self.node.outputs, outs) if o}

    # -- bodies ---------------------------------------------------------------------------
    def _body(self, attr: str, formal: list, outer: dict) -> list[np.ndarray]:
        body: Graph = self.node.attrs[attr]
        if len(formal) != len(body.inputs):
            raise ShapeError(f"node '{self.node.name}' ({self.node.op}): body '{attr}' takes {len(body.inputs)} "
                             f"inputs, the node gives it {len(formal)}")
        feeds = {**dict(zip(body.inputs, formal)), **outer}
        feeds = {k: np.asarray(v) for k, v in feeds.items()}
        key = tuple((k, v.shape, v.dtype) for k, v in feeds.items())
        cache = self.models[attr]
        model = cache.get(key)
        if model is None:
            t0 = time.perf_counter()
            model = cache[key] = self.make_model(self._typed(body, feeds))
            model.prepare(feeds)  # compile now, so that build time is not counted as run time
            self.build_seconds += time.perf_counter() - t0
            if len(cache) > _MAX_MODELS:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        res = model.run(feeds)
        return [res[o] for o in model.graph.outputs]

    def _typed(self, body: Graph, feeds: dict) -> Graph:
        """The body as a graph of its own: fed values typed by the arrays at hand."""
        types = dict(body.types)
        for k, v in feeds.items():
            a = np.asarray(v)
            types[k] = TensorType(tuple(int(d) for d in a.shape), str(a.dtype))
        # the enclosing graph computes in float32 (ir.precision): so does the body, outputs included
        hints = {k: TensorType(t.shape, "float32") if t.dtype in HALF else t for k, t in body.hints.items()}
        g = body.copy(inputs=list(feeds), constants={**body.constants, **self.outer_consts}, types=types, dims={},
                      hints=hints)
        if hasattr(g, "outer"):
            g.outer = []
        return g

    # -- operators ------------------------------------------------------------------------
    def _if(self, own, outer):
        cond = np.asarray(own[0])
        if cond.size != 1:
            raise ShapeError(f"node '{self.node.name}' (If): condition has {cond.size} elements, expected 1")
        return self._body("then_branch" if bool(cond.reshape(-1)[0]) else "else_branch", [], outer)

    def _loop(self, own, outer):
        trips = None if own[0] is None else int(np.asarray(own[0]).reshape(-1)[0])
        cond = None if len(own) < 2 or own[1] is None else bool(np.asarray(own[1]).reshape(-1)[0])
        carried = [np.asarray(v) for v in own[2:]]
        n_carried = len(carried)
        scans: list[list] = []
        i = 0
        while (trips is None or i < trips) and (cond is None or cond):
            outs = self._body("body", [np.asarray(i, np.int64), np.asarray(True if cond is None else cond)]
                              + carried, outer)
            if cond is not None:  # without a cond input, the body's cond output is ignored
                cond = bool(np.asarray(outs[0]).reshape(-1)[0])
            carried = [np.asarray(v) for v in outs[1:1 + n_carried]]
            per_iter = outs[1 + n_carried:]
            if not scans:
                scans = [[] for _ in per_iter]
            for acc, v in zip(scans, per_iter):
                acc.append(np.asarray(v))
            i += 1
        n_scan = len(self.node.outputs) - n_carried
        if not scans:  # no iteration ran: empty scan outputs
            return carried + [np.zeros((0,), np.float32) for _ in range(n_scan)]
        return carried + [np.stack(acc) for acc in scans]

    def _scan(self, own, outer):
        a = self.node.attrs
        m = int(a["num_scan_inputs"])
        states, xs = [np.asarray(v) for v in own[:len(own) - m]], [np.asarray(v) for v in own[len(own) - m:]]
        in_axes = list(a.get("scan_input_axes", [0] * m))
        in_dirs = list(a.get("scan_input_directions", [0] * m))
        axes = [ax % x.ndim for ax, x in zip(in_axes, xs)]
        lengths = {x.shape[ax] for x, ax in zip(xs, axes)}
        if len(lengths) != 1:
            raise ShapeError(f"node '{self.node.name}' (Scan): scan inputs have different lengths {sorted(lengths)}")
        steps = lengths.pop()
        per_iter: list[list] = []
        for t in range(steps):
            slices = [np.take(x, steps - 1 - t if d else t, axis=ax) for x, ax, d in zip(xs, axes, in_dirs)]
            outs = self._body("body", states + slices, outer)
            states = [np.asarray(v) for v in outs[:len(states)]]
            if not per_iter:
                per_iter = [[] for _ in outs[len(states):]]
            for acc, v in zip(per_iter, outs[len(states):]):
                acc.append(np.asarray(v))
        k = len(per_iter)
        out_axes = list(a.get("scan_output_axes", [0] * k))
        out_dirs = list(a.get("scan_output_directions", [0] * k))
        stacked = []
        for acc, ax, d in zip(per_iter, out_axes, out_dirs):
            y = np.stack(acc[::-1] if d else acc)
            stacked.append(np.moveaxis(y, 0, ax % y.ndim))
        return states + stacked


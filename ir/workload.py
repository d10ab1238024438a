"""`Workload`: the canonical, JSON-serializable description of a fused subgraph.

Two subgraphs with the same ops, attrs, shapes and dtypes have the same `key`,
whatever their weights: an MLP with three equal layers yields one tuning task.
The `signature` is the same description with dynamic dims left symbolic: the
family of shapes that one template and config serve.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ir.fusion import FusedSubgraph
from ir.graph import Graph
from ir.ops import OPS, get_op
from ir.graph import Node
from ir.shapes import bind, check_size, dim_str

FAMILIES = {"MatMul": "dense", "Gemm": "dense", "Conv": "conv2d"}


def _jsonable(v):
    if isinstance(v, Graph):  # a control-flow body: its content hash stands for it
        return {"graph": v.name, "digest": v.digest()}
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Workload:
    """ops: [{"op", "in": [local names], "attrs"}]; inputs: [{"shape", "sym", "dtype", "const"}]."""

    ops: tuple
    inputs: tuple
    output_shape: tuple
    output_dtype: str = "float32"

    # -- identity -------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"ops": [dict(o) for o in self.ops], "inputs": [dict(i) for i in self.inputs],
                "output_shape": list(self.output_shape), "output_dtype": self.output_dtype}

    @classmethod
    def from_json(cls, d: dict) -> "Workload":
        return cls(tuple(_freeze(o) for o in d["ops"]), tuple(_freeze(i) for i in d["inputs"]),
                   tuple(d["output_shape"]), d.get("output_dtype", "float32"))

    @cached_property
    def key(self) -> str:
        return _hash(self.to_json())

    @cached_property
    def signature(self) -> str:
        j = self.to_json()
        for i in j["inputs"]:
            i["shape"] = i["sym"]
        j["output_shape"] = None
        return _hash(j)

    @property
    def family(self) -> str:
        return FAMILIES.get(self.ops[0]["op"], OPS[self.ops[0]["op"]].kind if self.ops[0]["op"] in OPS else "opaque")

    @property
    def dims(self) -> dict[str, int]:
        """Concrete sizes of the dynamic dims, read off input shapes vs symbolic shapes."""
        out = {}
        for i in self.inputs:
            for d, s in zip(i["shape"], i["sym"]):
                if isinstance(s, str) and s.isidentifier():
                    out[s] = d
        return out

    def describe(self) -> str:
        ins = ", ".join("x".join(map(str, i["shape"])) + ("(const)" if i["const"] else "") for i in self.inputs)
        return f"{'+'.join(o['op'] for o in self.ops)}({ins})"

    # -- semantics --------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        return [Node(o["op"], tuple(o["in"]), (f"t{k}",), dict(o["attrs"]), f"{o['op']}_{k}")
                for k, o in enumerate(self.ops)]

    def reference(self, arrays: list[np.ndarray]) -> np.ndarray:
        """Run the subgraph through the ops' NumPy references: the correctness oracle."""
        env = {f"i{k}": a for k, a in enumerate(arrays)}
        for n in self.nodes():
            env[n.outputs[0]] = get_op(n.op, n).ref(n, [env[i] for i in n.inputs])[0]
        return env[f"t{len(self.ops) - 1}"]

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [np.array(i["value"], dtype=i["dtype"]).reshape(i["shape"]) if "value" in i
                else rng.uniform(-1, 1, size=tuple(i["shape"])).astype(i["dtype"]) for i in self.inputs]

    def flops(self) -> int:
        total = 0
        shapes = {f"i{k}": tuple(i["shape"]) for k, i in enumerate(self.inputs)}
        out_elems = int(np.prod(self.output_shape)) if self.output_shape else 1
        for n in self.nodes():
            if n.op in ("MatMul", "Gemm"):
                k = shapes[n.inputs[0]][-1]
                total += 2 * out_elems * k
            elif n.op == "Conv":  # 2 * out * (C/groups * kernel): weight shape [M, C/g, *k]
                total += 2 * out_elems * int(np.prod(shapes[n.inputs[1]][1:]))
            else:
                total += out_elems * (OPS[n.op].flops_per_elem if n.op in OPS else 1)
            shapes[n.outputs[0]] = tuple(self.output_shape)
        return total


def _freeze(d: dict) -> dict:
    return dict(d)


def _sym(d) -> object:
    return d if isinstance(d, int) else dim_str(d)


SMALL_CONST = 64  # integer constants up to this size are stored in the workload by value
INDEX_MAP_OPS = {"Resize", "Upsample"}   # their float operands (roi, scales) fix the index map


def stored_by_value(value, readers) -> bool:
    """True if a constant (or shape-computed) input is part of the computation and is kept in
    the workload by value: a small int/bool (shapes, axes, indices), or a small float that a
    Resize reads after its data (roi, scales: the kernel's index tables are built from them
    when lowering). `readers`: (op, input position) of each node that reads it."""
    value = np.asarray(value)
    if value.size > SMALL_CONST:
        return False
    return value.dtype.kind in "iub" or any(op in INDEX_MAP_OPS and pos >= 1 for op, pos in readers)


def make_workload(g: Graph, sg: FusedSubgraph, sizes: dict[str, int]) -> Workload:
    """Describe subgraph `sg` of `g` at the concrete dim sizes `sizes`.

    Raises `ir.shapes.UnboundDimsError` if its shapes hold runtime dims `sizes` lacks,
    and ShapeError (naming node, value and dim) for a size no real tensor has."""
    local = {name: f"i{k}" for k, name in enumerate(sg.inputs)}
    ops = []
    for k, n in enumerate(sg.nodes):
        attrs = {a: _jsonable(v) for a, v in sorted(n.attrs.items()) if not a.startswith("_")}
        ops.append({"op": n.op, "in": [local[i] for i in n.inputs if i], "attrs": attrs})
        local[n.outputs[0]] = f"t{k}"
    inputs = []
    for name in sg.inputs:
        t = g.type_of(name)
        shape = bind(t.shape, sizes)
        check_size(shape, t.dtype, f"node '{_reader(sg, name)}': input '{name}'", t.shape)
        spec = {"shape": list(shape), "sym": [_sym(d) for d in t.shape],
                "dtype": t.dtype, "const": name in g.constants}
        value = g.constants.get(name)
        if value is None and name in g.values:
            value = _bound_value(g.values[name], sizes, t.dtype)
        readers = [(n.op, p) for n in sg.nodes for p, i in enumerate(n.inputs) if i == name]
        if value is not None and stored_by_value(value, readers):
            spec["value"] = value.tolist()  # shape/axes/index operands are part of the computation
        inputs.append(spec)
    out = g.type_of(sg.output)
    shape = bind(out.shape, sizes)
    check_size(shape, out.dtype, f"node '{sg.nodes[-1].name}': output '{sg.output}'", out.shape)
    return Workload(tuple(ops), tuple(inputs), shape, out.dtype)


def _bound_value(value, sizes: dict[str, int], dtype: str):
    """A shape computation's symbolic value (`Graph.values`: a Shape -> Gather -> Concat
    chain) at concrete sizes, or None: a Reshape target computed from the input's shape
    is then known to the template, as a constant target is."""
    try:
        flat = np.asarray(value, dtype=object).reshape(-1)
        ints = bind(tuple(flat.tolist()), sizes)
        return np.asarray(ints, dtype=dtype).reshape(np.shape(value))
    except Exception:  # a value that depends on data, or dims these sizes do not bind
        return None


def _reader(sg: FusedSubgraph, name: str) -> str:
    return next((n.name for n in sg.nodes if name in n.inputs), sg.name)

"""`Workload`: the canonical, JSON-serializable description of a fused subgraph.

Two subgraphs with the same ops, attrs, shapes and dtypes have the same `key`,
whatever their weights: an MLP with three equal layers yields one tuning task.
The `signature` is the same description with dynamic dims left symbolic: the
family of shapes that one template and config serve.

A workload is a value: deeply immutable (its entries are read-only dicts and lists),
hashable, and equal to another exactly when their keys are equal.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ir.fusion import FusedSubgraph, node_flops
from ir.graph import Graph, Node, TensorType
from ir.keys import dynamic_dims, workload_hash
from ir.ops import OPS, get_op
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


def _refuse(self, *args, **kwargs):
    raise TypeError("a workload is immutable: build a new one (Workload.from_json) instead")


class FrozenDict(dict):
    """A dict that refuses every change, and hashes: a workload's op and input entries.
    A dict still (comparisons, `dict(...)`, `json.dumps` and `isinstance` checks of the
    code that reads workloads all work as before)."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self):
        return hash(frozenset(self.items()))

    def __reduce__(self):  # pickle rebuilds it whole (its default way sets items one by one)
        return FrozenDict, (dict(self),)


class FrozenList(list):
    """A list that refuses every change, and hashes: shapes, input names and list attrs
    of a workload. A list still, so `wl.ops[0]["in"] == ["i0", "i1"]` holds as before."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = clear = extend = insert = pop = remove = \
        reverse = sort = _refuse

    def __hash__(self):
        return hash(tuple(self))

    def __reduce__(self):
        return FrozenList, (list(self),)


_SCALARS = frozenset((str, int, float, bool, type(None)))  # JSON leaves: kept as they are, without a call


def _freeze(v):
    if isinstance(v, dict):
        return FrozenDict({k: x if type(x) in _SCALARS else _freeze(x) for k, x in v.items()})
    if isinstance(v, (list, tuple)):
        return FrozenList([x if type(x) in _SCALARS else _freeze(x) for x in v])
    return v


def _thaw(v):
    """Plain, mutable JSON data again."""
    if isinstance(v, dict):
        return {k: x if type(x) in _SCALARS else _thaw(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [x if type(x) in _SCALARS else _thaw(x) for x in v]
    return v


@dataclass(frozen=True, eq=False)
class Workload:
    """ops: [{"op", "in": [local names], "attrs"}]; inputs: [{"shape", "sym", "dtype", "const"}].

    Given as plain dicts and lists, they are stored frozen (`FrozenDict`, `FrozenList`)."""

    ops: tuple
    inputs: tuple
    output_shape: tuple
    output_dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "ops", tuple(_freeze(o) for o in self.ops))
        object.__setattr__(self, "inputs", tuple(_freeze(i) for i in self.inputs))
        object.__setattr__(self, "output_shape", tuple(self.output_shape))

    # -- identity -------------------------------------------------------------------
    def to_json(self) -> dict:
        """A fresh plain-JSON description (the caller may change it)."""
        return {"ops": _thaw(self.ops), "inputs": _thaw(self.inputs),
                "output_shape": list(self.output_shape), "output_dtype": self.output_dtype}

    @classmethod
    def from_json(cls, d: dict) -> "Workload":
        return cls(tuple(d["ops"]), tuple(d["inputs"]), tuple(d["output_shape"]), d.get("output_dtype", "float32"))

    @cached_property
    def key(self) -> str:
        # the frozen entries are dicts and lists: they hash as the JSON of `to_json` does
        return workload_hash({"ops": list(self.ops), "inputs": list(self.inputs),
                              "output_shape": list(self.output_shape), "output_dtype": self.output_dtype})

    @cached_property
    def signature(self) -> str:
        return workload_hash({"ops": list(self.ops), "inputs": [{**i, "shape": i["sym"]} for i in self.inputs],
                              "output_shape": None, "output_dtype": self.output_dtype})

    def __eq__(self, other):
        return isinstance(other, Workload) and self.key == other.key

    def __hash__(self):
        return hash(self.key)

    @property
    def family(self) -> str:
        return FAMILIES.get(self.ops[0]["op"], OPS[self.ops[0]["op"]].kind if self.ops[0]["op"] in OPS else "opaque")

    @property
    def dims(self) -> dict[str, int]:
        """Concrete sizes of the dynamic dims, read off input shapes vs symbolic shapes."""
        return dynamic_dims(self.inputs)

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

    def value_types(self) -> dict[str, TensorType | None]:
        """The type of every local value (inputs i*, node outputs t*), inferred through the
        ops' shape functions; None where that needs what the workload does not hold (a
        shape that depends on data). The last node's is the workload's output type."""
        types: dict[str, TensorType | None] = {
            f"i{k}": TensorType(tuple(i["shape"]), i["dtype"]) for k, i in enumerate(self.inputs)}
        consts = {f"i{k}": np.array(i["value"]) for k, i in enumerate(self.inputs) if "value" in i}
        nodes = self.nodes()
        for k, n in enumerate(nodes):
            out = None
            if k == len(nodes) - 1:
                out = TensorType(tuple(self.output_shape), self.output_dtype)
            elif n.op in OPS and all(types.get(i) is not None for i in n.inputs):
                try:
                    out = OPS[n.op].infer(n, [types[i] for i in n.inputs], [consts.get(i) for i in n.inputs])[0]
                except Exception:  # a shape that needs values we do not have: unknown
                    out = None
            types[n.outputs[0]] = out
        return types

    def flops(self) -> int:
        """FLOPs at these shapes: `ir.fusion.node_flops` per node, as `subgraph_flops`
        counts them for the graph (a value of unknown shape counts as the output's)."""
        return self._flops

    @cached_property
    def _flops(self) -> int:
        shapes = {name: tuple(t.shape) for name, t in self.value_types().items()
                  if t is not None and all(isinstance(d, int) for d in t.shape)}
        out = tuple(self.output_shape)
        return int(sum(node_flops(n.op, n.attrs, [shapes.get(i, out) if i else None for i in n.inputs],
                                  shapes.get(n.outputs[0], out)) for n in self.nodes()))


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


_GATHERS = ("Gather", "GatherElements", "GatherND")


def work_estimate(wl: Workload) -> int:
    """A kernel's size for picking its thread count: FLOPs plus bytes read and written. A table a
    Gather reads from counts at most the output's bytes: it reads the rows it gathers, not the
    table (BERT's embedding lookup, 32 rows of a 512 KB table, ran 5.4 -> 15.3 us split on two
    threads)."""
    def nbytes(shape, dtype) -> int:
        try:
            return int(np.prod([int(d) for d in shape], dtype=np.int64)) * np.dtype(dtype).itemsize
        except (TypeError, ValueError):   # a symbolic dim, or a dtype NumPy does not name (bfloat16)
            return int(np.prod([d for d in shape if isinstance(d, int)], dtype=np.int64)) * 2
    try:
        flops = int(wl.flops())
    except Exception:   # an op node_flops cannot count: its bytes still tell the size
        flops = 0
    out = nbytes(wl.output_shape, wl.output_dtype)
    tables = {int(n.inputs[0][1:]) for n in wl.nodes() if n.op in _GATHERS and n.inputs[0][:1] == "i"
              and n.inputs[0][1:].isdigit()}
    return flops + sum(min(nbytes(spec["shape"], spec["dtype"]), out) if k in tables else nbytes(spec["shape"], spec["dtype"])
                       for k, spec in enumerate(wl.inputs)) + out

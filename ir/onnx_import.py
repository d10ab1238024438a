"""ONNX model -> `ir.Graph`. Dims the model leaves symbolic become sympy symbols.

Exporters write "unknown" in several ways; every one of them becomes its own fresh
symbol: paddle2onnx's `dim_value: -1` (or 0), tf2onnx's `?` and empty names,
onnx's `unk__N`, and expression strings such as `floor(height/2 - 1/2) + 1`. On a
graph input the fresh dim is named `<input>_<axis>` (declare it with `--dim x_0=1:8`).
`value_info` and `onnx.shape_inference` are hints only: shapes come from our shape
functions, and annotations serve just the ops that have none (their rank and static
sizes; their symbolic sizes become runtime dims, see `ir.shapes`).

Control-flow bodies (Loop/If/Scan) are imported as `ir.Graph`s, recursively; see
`ir.graph` for how they name the outer-scope values they read.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnx
import sympy
from onnx import helper, numpy_helper

from ir.dtypes import check_runnable, dtype_name
from ir.errors import ModelError
from ir.graph import Graph, Node, TensorType
from ir.shapes import DimRange, symbol

# ops whose semantics changed between opsets in a way attributes do not show
_OPSET_DEPENDENT = {"Softmax", "LogSoftmax", "Hardmax", "Resize"}
_DEFAULT_DOMAINS = ("", "ai.onnx")
# dim_param spellings that mean "unknown" (besides non-identifiers such as expressions)
_UNNAMED = re.compile(r"^(\?|-1|0|none|null|unk__\d+|unknown|dynamic|n/a)?$", re.IGNORECASE)


def load_onnx(model) -> onnx.ModelProto:
    """Read and validate a model; every failure is a `ModelError` naming the file."""
    if isinstance(model, onnx.ModelProto):
        proto, where = model, "<in-memory model>"
    else:
        where = str(model)
        if not os.path.exists(where):
            raise ModelError(f"model file '{where}' does not exist")
        try:
            proto = onnx.load(where)
        except Exception as e:  # protobuf raises several unrelated types
            raise ModelError(f"model file '{where}' is not a valid ONNX file: {type(e).__name__}: {e}") from None
    try:  # given a path, the C++ checker reads the file itself (no re-serializing big weights)
        onnx.checker.check_model(where if not isinstance(model, onnx.ModelProto) else proto)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"model '{where}' fails onnx.checker: {first}") from None
    return proto


def _initializer(t: onnx.TensorProto) -> np.ndarray:
    """An initializer's array; one whose data does not fill its dims is a ModelError (the checker lets it pass)."""
    try:
        return numpy_helper.to_array(t)
    except Exception as e:
        raise ModelError(f"initializer '{t.name}' (dims {list(t.dims)}, data type {t.data_type}) cannot be read: "
                         f"{type(e).__name__}: {e}") from None


def _ident(raw: str) -> str:
    if isinstance(raw, bytes):  # protobuf hands back invalid UTF-8 as bytes
        raw = raw.decode("utf-8", "replace")
    name = re.sub(r"\W", "_", raw)
    return name if name and not name[0].isdigit() else f"d_{name}"


def is_named_dim(d) -> bool:
    """A dim_param that names a dim (shared by every axis that uses the name)."""
    return bool(d.dim_param) and not _UNNAMED.match(d.dim_param.strip()) and d.dim_param.isidentifier()


def _input_type(vi: onnx.ValueInfoProto, dims: dict, where: str) -> TensorType | None:
    """A graph input's type: named dims are shared symbols, unknown ones fresh per axis."""
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise ModelError(f"{where} '{vi.name}' is not a tensor (sequence/map/optional inputs are not supported)")
    dtype = dtype_name(t.elem_type, f"{where} '{vi.name}'")
    check_runnable(dtype, f"{where} '{vi.name}'")
    if not t.HasField("shape"):
        return None
    shape = []
    for axis, d in enumerate(t.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            shape.append(int(d.dim_value))
            continue
        name = _ident(d.dim_param) if is_named_dim(d) else _ident(f"{vi.name}_{axis}")
        while name in dims and dims[name] != (d.dim_param if is_named_dim(d) else None):
            name += "_"  # a fresh dim whose name a named dim already took
        dims[name] = d.dim_param if is_named_dim(d) else None
        if d.HasField("dim_value") and d.dim_value == 0:  # empty, or "dynamic" (paddle2onnx): may be 0
            dims[name] = 0
            shape.append(sympy.Symbol(name, integer=True, nonnegative=True))
        else:
            shape.append(symbol(name))
    return TensorType(tuple(shape), dtype)


def _hint_type(vi: onnx.ValueInfoProto, dims: dict) -> TensorType | None:
    """An annotation: static sizes and the graph's named dims; anything else unknown (None)."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    t = vi.type.tensor_type
    if t.elem_type not in _KNOWN_TYPES:
        return None
    shape = []
    for d in t.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            shape.append(int(d.dim_value))
        elif is_named_dim(d) and dims.get(_ident(d.dim_param)) == d.dim_param:
            shape.append(symbol(_ident(d.dim_param)))
        else:
            shape.append(None)
    return TensorType(tuple(shape), dtype_name(t.elem_type, vi.name))


def _known_types():
    from ir.dtypes import DTYPES
    return set(DTYPES)


_KNOWN_TYPES = _known_types()


def _attr_value(a: onnx.AttributeProto, scope):
    if a.type == onnx.AttributeProto.GRAPH:
        return _import_body(a.g, scope)
    if a.type == onnx.AttributeProto.GRAPHS:
        return [_import_body(x, scope) for x in a.graphs]
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    return v


class _Scope:
    """What the graph being imported needs to know of the model: its opset and named dims."""

    def __init__(self, opset: int, dims: dict):
        self.opset, self.dims = opset, dims


def _import_nodes(g: onnx.GraphProto, scope: _Scope, constants: dict) -> list[Node]:
    nodes = []
    for i, n in enumerate(g.node):
        name = n.name or f"{n.op_type}_{i}"
        attrs = {a.name: _attr_value(a, scope) for a in n.attribute}
        if n.op_type == "Constant" and n.domain in _DEFAULT_DOMAINS:
            constants[n.output[0]] = _constant_value(n, attrs)
            continue
        inputs = tuple(n.input)
        bodies = [b for v in attrs.values() for b in (v if isinstance(v, list) else [v]) if isinstance(b, Graph)]
        if bodies:
            outer = list(dict.fromkeys(o for b in bodies for o in b.outer))
            attrs["_outer"] = outer
            inputs = inputs + tuple(outer)
        if n.domain not in _DEFAULT_DOMAINS:
            attrs["_domain"] = n.domain
        elif n.op_type in _OPSET_DEPENDENT:
            attrs["_opset"] = scope.opset
        _check_cast(n, name, attrs)
        nodes.append(Node(n.op_type, inputs, tuple(n.output), attrs, name))
    return nodes


_DTYPE_ATTRS = {"Cast": "to", "EyeLike": "dtype", "RandomNormal": "dtype", "RandomUniform": "dtype",
                "RandomNormalLike": "dtype", "RandomUniformLike": "dtype", "Multinomial": "dtype"}


def _check_cast(n, name, attrs) -> None:
    """An op told to make a dtype we cannot run fails here, naming the node."""
    key = _DTYPE_ATTRS.get(n.op_type)
    if key and key in attrs and n.domain in _DEFAULT_DOMAINS:
        where = f"node '{name}' ({n.op_type}) output '{n.output[0]}'"
        check_runnable(dtype_name(int(attrs[key]), where), where)


def _check_constants(constants: dict, consumers_of: dict) -> None:
    for k, v in constants.items():
        dtype = "object" if v.dtype.kind in "OSU" else str(v.dtype)
        users = consumers_of.get(k)
        check_runnable(dtype, f"constant '{k}'" + (f" (input of node '{users}')" if users else ""))


def _import_body(gp: onnx.GraphProto, scope: _Scope) -> Graph:
    """A control-flow body as an `ir.Graph` whose `outer` lists the enclosing values it reads."""
    constants = {i.name: _initializer(i) for i in gp.initializer}
    nodes = _import_nodes(gp, scope, constants)
    types, inputs = {}, []
    body_dims = dict(scope.dims)
    for vi in gp.input:
        typed = vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type != onnx.TensorProto.UNDEFINED
        t = _input_type(vi, body_dims, f"input of body '{gp.name}'") if typed else None  # bodies may leave it to inference
        if t is not None:
            types[vi.name] = t
        inputs.append(vi.name)
    defined = set(inputs) | set(constants) | {o for n in nodes for o in n.outputs if o}
    outer = list(dict.fromkeys(i for n in nodes for i in n.inputs if i and i not in defined))
    outer += [o.name for o in gp.output if o.name not in defined and o.name not in outer]
    hints = {}
    for vi in list(gp.value_info) + list(gp.output):
        t = _hint_type(vi, body_dims)
        if t is not None:
            hints[vi.name] = t
    fresh = {k: DimRange(k) for k in body_dims if k not in scope.dims}
    return Graph(nodes, inputs, [o.name for o in gp.output], constants, types, fresh, name=gp.name or "body",
                 hints=hints, opset=scope.opset, outer=outer, proto=gp)


def import_onnx(model, dims: dict[str, DimRange] | None = None) -> Graph:
    """Import an ONNX model (path or ModelProto). `dims` declares ranges of symbolic dims."""
    proto = load_onnx(model)
    g = proto.graph
    opset = next((o.version for o in proto.opset_import if o.domain in _DEFAULT_DOMAINS), 17)
    input_dims: dict[str, str | int | None] = {}  # name -> its dim_param; None: fresh; 0: fresh, may be 0
    constants = {i.name: _initializer(i) for i in g.initializer}
    types: dict[str, TensorType] = {}
    inputs = []
    for vi in g.input:
        if vi.name in constants:
            continue
        t = _input_type(vi, input_dims, "graph input")
        if t is None:
            raise ModelError(f"graph input '{vi.name}' has no shape")
        types[vi.name] = t
        inputs.append(vi.name)
    scope = _Scope(opset, input_dims)
    nodes = _import_nodes(g, scope, constants)
    _check_constants(constants, {i: n.name for n in nodes for i in n.inputs})
    hints = {}
    # hints serve only ops without shape functions or with data-dependent shapes (25 ms on 1,000 nodes)
    annotated = list(g.value_info) + list(g.output) + _onnx_inferred(proto, g)
    for vi in annotated:
        t = _hint_type(vi, input_dims)
        if t is not None:
            hints[vi.name] = t
    declared = dict(dims or {})
    ranges = {name: declared.pop(name, DimRange(name, 0 if input_dims[name] == 0 else 1)) for name in input_dims}
    if declared:
        raise ModelError(f"--dim names {sorted(declared)} are not dynamic dims of the model "
                         f"(it has: {sorted(ranges) or 'none'})")
    return Graph(nodes, inputs, [o.name for o in g.output], constants, types, ranges,
                 name=Path(str(model)).stem if not isinstance(model, onnx.ModelProto) else (g.name or "model"),
                 hints=hints, opset=opset)


def _without_big_weights(proto: onnx.ModelProto, limit: int = 4096) -> onnx.ModelProto:
    """A copy whose large initializers are typed graph inputs instead: shape inference
    needs their shapes, not their bytes (copying 47 MB of ResNet weights cost ~1 s).
    Small ones stay, since data propagation reads shape tensors' values."""
    big = [t for t in proto.graph.initializer if len(t.raw_data) > limit]
    if not big:
        return proto
    light = onnx.ModelProto()
    light.ir_version, light.producer_name = proto.ir_version, proto.producer_name
    light.opset_import.extend(proto.opset_import)
    g = light.graph
    g.name = proto.graph.name
    g.node.extend(proto.graph.node)
    g.input.extend(proto.graph.input)
    g.output.extend(proto.graph.output)
    g.value_info.extend(proto.graph.value_info)
    names = {t.name for t in big}
    declared = {vi.name for vi in proto.graph.input}
    g.initializer.extend(t for t in proto.graph.initializer if t.name not in names)
    g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                   for t in big if t.name not in declared)
    return light


def _onnx_inferred(proto, g) -> list:
    """onnx.shape_inference's value_info for values the model leaves unannotated: the
    ranks and static sizes of ops we have no shape function for."""
    known = {vi.name for vi in list(g.value_info) + list(g.output)}
    inferred = _infer_isolated(_without_big_weights(proto), g.name)
    return [vi for vi in inferred if vi.name not in known]


_INFER_SECONDS = 60            # a 1,000-node model infers in about a second
_INFER_EXTRA_BYTES = 512 << 20  # onnx's data propagation materializes Range values, ~50 bytes each


def _infer_isolated(proto: onnx.ModelProto, name: str) -> list:
    """onnx.shape_inference's value_info, computed in a forked child under a time and
    memory bound: on some malformed models onnx's C++ aborts the whole process (a Slice
    of a Pad with a negative result dim) or propagates a Range of 2**40 values (both
    found by tests/test_fuzz.py). [] when inference fails, as before."""
    def infer() -> bytes:
        out = onnx.GraphProto()
        out.value_info.extend(onnx.shape_inference.infer_shapes(proto, data_prop=True).graph.value_info)
        return out.SerializeToString()

    try:
        data = _forked(infer, name) if hasattr(os, "fork") else infer()
    except ModelError:
        raise
    except Exception:
        return []
    out = onnx.GraphProto()
    if data is not None:
        out.ParseFromString(data)
    return list(out.value_info)


def _forked(fn, name: str) -> bytes | None:
    """fn() in a child process; None if it raised; a ModelError if it crashed or hung."""
    import resource
    import select
    import signal
    import time
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: write fn()'s bytes, nothing else
        code = 1
        try:
            os.close(r)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # onnx's assert message is not ours to print
            import faulthandler
            faulthandler.disable()  # nor a crash report of the child (pytest enables it)
            with open("/proc/self/statm") as f:
                cap = int(f.read().split()[0]) * resource.getpagesize() + _INFER_EXTRA_BYTES
            hard = resource.getrlimit(resource.RLIMIT_AS)[1]
            resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
            data = fn()
            with os.fdopen(w, "wb") as f:
                f.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks, deadline = [], time.monotonic() + _INFER_SECONDS
    with os.fdopen(r, "rb", buffering=0) as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise ModelError(f"model '{name}' is malformed: onnx shape inference did not finish "
                                 f"within {_INFER_SECONDS} s")
            chunk = f.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise ModelError(f"model '{name}' is malformed: onnx shape inference crashed on it "
                         f"(signal {os.WTERMSIG(status)})")
    return b"".join(chunks) if os.waitstatus_to_exitcode(status) == 0 else None


def _constant_value(n, attrs) -> np.ndarray:
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in attrs:
            v = attrs[key]
            if key == "value_float" or key == "value_floats":
                return np.asarray(v, dtype=np.float32)
            if key in ("value_int", "value_ints"):
                return np.asarray(v, dtype=np.int64)
            return np.asarray(v)
    raise ModelError(f"Constant node '{n.name}' has no supported value attribute")

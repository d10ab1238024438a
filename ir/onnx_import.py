"""ONNX model -> `ir.Graph`. Dims the model leaves symbolic become sympy symbols."""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ir.errors import ModelError
from ir.graph import Graph, Node, TensorType
from ir.shapes import DimRange, symbol

_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64",
           onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32",
           onnx.TensorProto.BOOL: "bool", onnx.TensorProto.FLOAT16: "float16",
           onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8",
           onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.INT16: "int16", onnx.TensorProto.UINT16: "uint16",
           onnx.TensorProto.INT4: "int4", onnx.TensorProto.UINT4: "uint4"}


# ops whose semantics changed between opsets in a way attributes do not show
_OPSET_DEPENDENT = {"Softmax", "LogSoftmax", "Hardmax"}


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


def _dim_name(raw: str) -> str:
    name = re.sub(r"\W", "_", raw)
    return name if name and not name[0].isdigit() else f"d_{name}"


def _type_of(vi: onnx.ValueInfoProto, dim_names: dict) -> TensorType | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    shape = []
    for axis, d in enumerate(t.shape.dim):
        if d.HasField("dim_value"):
            shape.append(int(d.dim_value))
        else:
            raw = d.dim_param or f"{vi.name}_{axis}"
            dim_names.setdefault(raw, _dim_name(raw))
            shape.append(symbol(dim_names[raw]))
    return TensorType(tuple(shape), _DTYPES.get(t.elem_type, "float32"))


def _attr_value(a: onnx.AttributeProto):
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    return v


def import_onnx(model, dims: dict[str, DimRange] | None = None) -> Graph:
    """Import an ONNX model (path or ModelProto). `dims` declares ranges of symbolic dims."""
    proto = load_onnx(model)
    g = proto.graph
    dim_names: dict[str, str] = {}
    constants = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    types: dict[str, TensorType] = {}
    inputs = []
    for vi in g.input:
        if vi.name in constants:
            continue
        t = _type_of(vi, dim_names)
        if t is None:
            raise ModelError(f"graph input '{vi.name}' has no shape")
        types[vi.name] = t
        inputs.append(vi.name)
    hints = {}
    input_dims = dict(dim_names)  # dims named only in annotations are not graph dims
    for vi in list(g.value_info) + list(g.output) + _onnx_inferred(proto, g):
        t = _type_of(vi, dim_names)
        if t is not None:
            hints[vi.name] = t
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 17)
    nodes = []
    for i, n in enumerate(g.node):
        attrs = {a.name: _attr_value(a) for a in n.attribute}
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            constants[n.output[0]] = _constant_value(n, attrs)
            continue
        if n.domain not in ("", "ai.onnx"):
            attrs["_domain"] = n.domain
        elif n.op_type in _OPSET_DEPENDENT:
            attrs["_opset"] = opset
        nodes.append(Node(n.op_type, tuple(n.input), tuple(n.output), attrs, n.name or f"{n.op_type}_{i}"))
    declared = dict(dims or {})
    ranges = {name: declared.pop(name, DimRange(name)) for name in input_dims.values()}
    if declared:
        raise ModelError(f"--dim names {sorted(declared)} are not dynamic dims of the model "
                         f"(it has: {sorted(ranges) or 'none'})")
    graph = Graph(nodes, inputs, [o.name for o in g.output], constants, types, ranges,
                  name=Path(str(model)).stem if not isinstance(model, onnx.ModelProto) else (g.name or "model"),
                  hints=hints, opset=opset)
    return graph


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
    types of ops we do not know (opaque ops) come from here."""
    known = {vi.name for vi in list(g.value_info) + list(g.output)}
    try:
        inferred = onnx.shape_inference.infer_shapes(_without_big_weights(proto), data_prop=True).graph.value_info
    except Exception:
        return []
    return [vi for vi in inferred if vi.name not in known]


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

"""float16 / bfloat16 models compute in float32.

The generated kernels are float32; NumPy has no fast half-precision arithmetic and
no bfloat16 at all (ml_dtypes supplies the type, onnx.numpy_helper returns it). So
`compute_in_float32` rewrites the graph once, at import, before shapes are inferred:

- fp16/bf16 constants (weights) become float32 arrays (exact: both widen losslessly);
- each fp16/bf16 graph input gets a Cast to float32 in front of its uses, and each
  fp16/bf16 graph output a Cast back from float32, so callers feed and receive the
  dtypes the model declares;
- Cast nodes to fp16/bf16 inside the graph cast to float32 instead, and tensor
  attributes in those types (ConstantOfShape's value) widen too.

Results are the float32 computation rounded once at the outputs — at least as close
to the exact values as onnxruntime's native half-precision kernels.
"""
from __future__ import annotations

import numpy as np

from ir.graph import Graph, Node, TensorType

try:
    import ml_dtypes  # noqa: F401  (registers "bfloat16" with NumPy)
except ImportError:  # pragma: no cover
    ml_dtypes = None

HALF = ("float16", "bfloat16")
_ONNX_CODE = {"float16": 10, "bfloat16": 16}
_FLOAT = 1


def _widen(v):
    if isinstance(v, np.ndarray) and str(v.dtype) in HALF:
        return v.astype(np.float32)
    return v


def compute_in_float32(g: Graph) -> Graph:
    """The graph with fp16/bf16 arithmetic replaced by float32 (see the module doc)."""
    half_inputs = [i for i in g.inputs if g.type_of(i).dtype in HALF]
    half_outputs = [o for o in g.outputs if o in g.hints and g.hints[o].dtype in HALF]
    half_consts = [k for k, v in g.constants.items() if str(v.dtype) in HALF]
    casts = [n for n in g.nodes if n.op == "Cast" and int(n.attrs.get("to", 1)) in _ONNX_CODE.values()]
    half_attrs = [n for n in g.nodes if any(isinstance(v, np.ndarray) and str(v.dtype) in HALF
                                            for v in n.attrs.values())]
    if not (half_inputs or half_outputs or half_consts or casts or half_attrs):
        return g
    g = g.copy()
    for k in half_consts:
        g.constants[k] = g.constants[k].astype(np.float32)
    rename = {i: f"{i}/float32" for i in half_inputs}
    produced_as = {o: f"{o}/float32" for o in half_outputs if o not in g.inputs}
    nodes = [Node("Cast", (i,), (rename[i],), {"to": _FLOAT}, f"{i}/to_float32") for i in half_inputs]
    for n in g.nodes:
        attrs = {k: _widen(v) for k, v in n.attrs.items()}
        if n.op == "Cast" and int(attrs.get("to", 1)) in _ONNX_CODE.values():
            attrs["to"] = _FLOAT
        ins = tuple(produced_as.get(rename.get(i, i), rename.get(i, i)) if i else i for i in n.inputs)
        outs = tuple(produced_as.get(o, o) for o in n.outputs)
        nodes.append(Node(n.op, ins, outs, attrs, n.name))
    for o, inner in produced_as.items():
        nodes.append(Node("Cast", (inner,), (o,), {"to": _ONNX_CODE[g.hints[o].dtype]}, f"{o}/to_{g.hints[o].dtype}"))
    g.nodes = nodes
    g.hints = {k: TensorType(t.shape, "float32") if t.dtype in HALF and k not in g.outputs else t
               for k, t in g.hints.items()}  # annotations of values now computed in float32
    for o, inner in produced_as.items():  # ops without shape functions read them by name
        if o in g.hints:
            g.hints[inner] = TensorType(g.hints[o].shape, "float32")
    return g

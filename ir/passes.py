"""Graph passes. Each is a function Graph -> Graph that returns a new graph."""
from __future__ import annotations

import numpy as np

from ir.errors import ShapeError, UnsupportedOpError
from ir.graph import Graph, Node, TensorType
from ir.ops import OPS, get_op
from ir.shapes import format_shape


def infer_shapes(g: Graph) -> Graph:
    """Give every value a (possibly symbolic) type, in topological order."""
    g = g.copy()
    for n in g.nodes:
        in_types = [g.type_of(i) if i else None for i in n.inputs]
        consts = [g.constants.get(i) for i in n.inputs]
        if n.op in OPS:
            try:
                outs = OPS[n.op].infer(n, in_types, consts)
            except (ShapeError, UnsupportedOpError):
                raise
            except Exception as e:
                raise ShapeError(f"node '{n.name}' ({n.op}): shape inference failed: {e}") from None
        elif all(o in g.hints for o in n.outputs):
            outs = [g.hints[o] for o in n.outputs]  # opaque op: trust ONNX's annotation
        else:
            raise UnsupportedOpError(f"op '{n.op}' (node '{n.name}') is not supported by tensortune "
                                     f"and the model does not annotate its output shapes")
        for o, t in zip(n.outputs, outs):
            g.types[o] = t
    for o in g.outputs:
        if o in g.hints and o in g.types:
            _check_agrees(g.types[o], g.hints[o], o)
    return g


def _check_agrees(ours: TensorType, theirs: TensorType, name: str) -> None:
    if len(ours.shape) != len(theirs.shape):
        raise ShapeError(f"output '{name}': inferred rank {format_shape(ours.shape)} but the model declares {format_shape(theirs.shape)}")
    for a, b in zip(ours.shape, theirs.shape):
        if isinstance(a, int) and isinstance(b, int) and a != b:
            raise ShapeError(f"output '{name}': inferred shape {format_shape(ours.shape)} but the model declares {format_shape(theirs.shape)}")


def fold_constants(g: Graph) -> Graph:
    """Evaluate nodes whose inputs are all constants, with the ops' NumPy references."""
    g = g.copy()
    kept = []
    for n in g.nodes:
        if n.op in OPS and n.inputs and all((not i) or i in g.constants for i in n.inputs) \
                and not set(n.outputs) & set(g.outputs):
            values = OPS[n.op].ref(n, [g.constants.get(i) for i in n.inputs])
            for o, v in zip(n.outputs, values):
                g.constants[o] = np.asarray(v)
                g.types.pop(o, None)
        else:
            kept.append(n)
    g.nodes = kept
    return g


def eliminate_dead_code(g: Graph) -> Graph:
    """Drop nodes and constants that no graph output depends on."""
    g = g.copy()
    live = set(g.outputs)
    kept = []
    for n in reversed(g.nodes):
        if set(n.outputs) & live or n.op not in OPS and n.attrs.get("_side_effects"):
            kept.append(n)
            live |= {i for i in n.inputs if i}
    g.nodes = list(reversed(kept))
    g.constants = {k: v for k, v in g.constants.items() if k in live}
    g.types = {k: v for k, v in g.types.items() if k in live or k in g.inputs}
    return g


def remove_identities(g: Graph) -> Graph:
    """Remove Identity / inference Dropout by renaming their output to their input."""
    g = g.copy()
    rename: dict[str, str] = {}
    kept = []
    for n in g.nodes:
        n = Node(n.op, tuple(rename.get(i, i) for i in n.inputs), n.outputs, n.attrs, n.name)
        if n.op in ("Identity", "Dropout") and n.outputs[0] not in g.outputs:
            rename[n.outputs[0]] = n.inputs[0]
            continue
        kept.append(n)
    g.nodes = kept
    return g


def decompose_gemm(g: Graph) -> Graph:
    """Gemm -> [Transpose] MatMul [Mul alpha] [Add beta*C]: the dense template covers MatMul + epilogue.

    Transposes and scalings of constant operands fold away in `fold_constants`.
    """
    g = g.copy()
    nodes = []
    for n in g.nodes:
        if n.op != "Gemm":
            nodes.append(n)
            continue
        a, b = n.inputs[0], n.inputs[1]
        c = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
        out = n.outputs[0]
        alpha, beta = float(n.attrs.get("alpha", 1.0)), float(n.attrs.get("beta", 1.0))
        base = n.name
        if n.attrs.get("transA", 0):
            nodes.append(Node("Transpose", (a,), (f"{base}/At",), {"perm": [1, 0]}, f"{base}/transA"))
            a = f"{base}/At"
        if n.attrs.get("transB", 0):
            nodes.append(Node("Transpose", (b,), (f"{base}/Bt",), {"perm": [1, 0]}, f"{base}/transB"))
            b = f"{base}/Bt"
        y = out if (alpha == 1.0 and c is None) else f"{base}/ab"
        nodes.append(Node("MatMul", (a, b), (y,), {}, f"{base}/matmul"))
        if alpha != 1.0:
            g.constants[f"{base}/alpha"] = np.asarray(alpha, dtype=np.float32)
            y2 = out if c is None else f"{base}/scaled"
            nodes.append(Node("Mul", (y, f"{base}/alpha"), (y2,), {}, f"{base}/alpha_mul"))
            y = y2
        if c is not None:
            if beta != 1.0:
                g.constants[f"{base}/beta"] = np.asarray(beta, dtype=np.float32)
                nodes.append(Node("Mul", (c, f"{base}/beta"), (f"{base}/Cb",), {}, f"{base}/beta_mul"))
                c = f"{base}/Cb"
            nodes.append(Node("Add", (y, c), (out,), {}, f"{base}/bias"))
    g.nodes = nodes
    return infer_shapes(g)


DEFAULT_PIPELINE = (infer_shapes, remove_identities, decompose_gemm, fold_constants, eliminate_dead_code, infer_shapes)


def simplify(g: Graph, pipeline=DEFAULT_PIPELINE) -> Graph:
    """The standard pass pipeline, in order, as a list you can read."""
    for p in pipeline:
        g = p(g)
    return g


def check_supported(g: Graph) -> list[str]:
    """Names of ops in `g` that have no reference implementation (they cannot run)."""
    return sorted({n.op for n in g.nodes if n.op not in OPS})


__all__ = ["infer_shapes", "fold_constants", "eliminate_dead_code", "remove_identities",
           "decompose_gemm", "simplify", "check_supported", "get_op"]

"""Graph passes. Each is a function Graph -> Graph that returns a new graph."""
from __future__ import annotations

import numpy as np

import sympy

from ir.dtypes import check_runnable
from ir.errors import DataDependentShapeError, ModelError, ShapeError, TensortuneError, UnsupportedOpError
from ir.graph import Graph, Node, TensorType
from ir.ops import ELEMWISE, OPS, VALUE_FNS, get_op, take_constraints
from ir.lowering import lower
from ir.ops.registry import runtime_dim
from ir.patterns import fuse_gelu, fuse_gelu_tanh, fuse_swish
from ir.shapes import dims_equal, format_shape, is_runtime_dim
from ir.ops.quant import fuse_fake_quant
from ir.precision import compute_in_float32


def infer_shapes(g: Graph) -> Graph:
    """Give every value a (possibly symbolic) type, in topological order.

    Alongside types it tracks the symbolic *values* of small int tensors computed
    from shapes (`g.values`), so Reshape targets built by Shape/Gather/Concat stay
    exact, and collects dim equalities two inputs must satisfy (`g.constraints`).
    An op without a shape function, or whose output shape depends on data, gets
    runtime dims (`g.runtime_dims`): its rank and static sizes from the model's
    annotation, the rest known once it has run.
    """
    g = g.copy()
    g.values = {}
    g.runtime_dims = {}
    take_constraints()
    for n in g.nodes:
        try:
            in_types = [g.type_of(i) if i else None for i in n.inputs]
        except KeyError as e:
            take_constraints()
            raise ShapeError(f"node '{n.name}' ({n.op}): input {e} has no known type") from None
        consts = [g.constants.get(i, g.values.get(i)) if i else None for i in n.inputs]
        outs = _infer_node(g, n, in_types, consts)
        for o, t in zip(n.outputs, outs):
            if o and t is not None:
                check_runnable(t.dtype, f"value '{o}' (output of node '{n.name}', {n.op})")
                g.types[o] = t
                for d in t.shape:
                    if isinstance(d, sympy.Symbol) and is_runtime_dim(d.name):
                        g.runtime_dims.setdefault(d.name, n.name)
        _propagate_value(g, n, consts, in_types)
    g.constraints = _dedupe(take_constraints())
    for o in g.outputs:
        if o in g.hints and o in g.types:
            _check_agrees(g.types[o], g.hints[o], o)
    return g


def _infer_node(g: Graph, n: Node, in_types, consts) -> list:
    if n.op in OPS:
        try:
            return OPS[n.op].infer(n, in_types, consts)
        except DataDependentShapeError as e:
            why = str(e)
        except (ShapeError, UnsupportedOpError):
            take_constraints()
            raise
        except Exception as e:
            take_constraints()
            raise ShapeError(f"node '{n.name}' ({n.op}): shape inference failed: {type(e).__name__}: {e}") from None
    else:
        why = f"op '{n.op}' has no shape function in tensortune"
    return _runtime_types(g, n, why)


def _runtime_types(g: Graph, n: Node, why: str) -> list:
    """Output types known only by running the node: the annotation's rank, static sizes and
    named input dims; every other dim a runtime dim."""
    outs = []
    for k, o in enumerate(n.outputs):
        hint = (g.hints.get(o) or _body_hint(g, n, k)) if o else None
        if o and hint is None:
            take_constraints()
            if n.op not in OPS:
                raise UnsupportedOpError(f"op '{n.op}' (node '{n.name}') is not supported by tensortune "
                                         f"and the model does not annotate its output shapes")
            raise DataDependentShapeError(f"{why}; the model does not annotate output '{o}' (its rank is unknown)")
        outs.append(None if not o else TensorType(
            tuple(runtime_dim(n, k, a) if d is None else d for a, d in enumerate(hint.shape)), hint.dtype))
    return outs


def _body_hint(g: Graph, n: Node, k: int) -> TensorType | None:
    """An annotation for a control-flow output read off its body: If takes the then-branch's
    output type; a Loop/Scan carried value the body's annotation of it (else its initial
    value's rank, sizes unknown: they may change per iteration); a scan output the body's
    per-iteration type with one more axis first (the iteration count)."""
    def stacked(t, extra=0):
        return None if t is None else TensorType((None,) * extra + tuple(t.shape), t.dtype)
    if n.op == "If" and "then_branch" in n.attrs:
        body = n.attrs["then_branch"]
        return stacked(body.hints.get(body.outputs[k])) if k < len(body.outputs) else None
    if n.op not in ("Loop", "Scan") or "body" not in n.attrs:
        return None
    body = n.attrs["body"]
    own = len(n.inputs) - len(n.attrs.get("_outer", ()))
    first = 2 if n.op == "Loop" else 0  # Loop's inputs: trip count, condition, carried...
    n_state = own - first - (int(n.attrs.get("num_scan_inputs", 0)) if n.op == "Scan" else 0)
    out = k + (1 if n.op == "Loop" else 0)  # a Loop body's output 0 is the condition
    declared = body.hints.get(body.outputs[out]) if out < len(body.outputs) else None
    if k < n_state:
        init = n.inputs[first + k]
        if declared is None and init and (init in g.types or init in g.constants):
            t = g.type_of(init)
            return TensorType((None,) * t.rank, t.dtype)
        return stacked(declared)
    return stacked(declared, extra=1)


def _propagate_value(g: Graph, n: Node, consts, in_types) -> None:
    fn = VALUE_FNS.get(n.op)
    if fn is None or not all(g.types.get(o, TensorType(())).dtype in ("int64", "int32", "bool") for o in n.outputs if o):
        return
    vals = [None if c is None else np.asarray(c, dtype=object) for c in consts]
    try:
        outs = fn(n, vals, in_types)
    except Exception:
        return  # a value we cannot track symbolically is just unknown
    for o, v in zip(n.outputs, outs or []):
        if o and v is not None and np.size(v) <= 64:
            g.values[o] = v


def _dedupe(pairs: list) -> list:
    out, seen = [], set()
    for c in pairs:
        key = (frozenset(c[:2]), getattr(c, "broadcast", False))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _check_agrees(ours: TensorType, theirs: TensorType, name: str) -> None:
    if len(ours.shape) != len(theirs.shape):
        raise ShapeError(f"output '{name}': inferred rank {format_shape(ours.shape)} but the model declares {format_shape(theirs.shape)}")
    for a, b in zip(ours.shape, theirs.shape):
        if isinstance(a, int) and isinstance(b, int) and a != b and b > 0:
            raise ShapeError(f"output '{name}': inferred shape {format_shape(ours.shape)} but the model declares {format_shape(theirs.shape)}")


def fold_constants(g: Graph) -> Graph:
    """Evaluate nodes whose inputs are all constants, with the ops' NumPy references.

    Shape subgraphs fold too: a node whose output value `infer_shapes` resolved to
    plain ints (e.g. Shape of a static tensor, Gather of a static dim) becomes a constant.
    Results far larger than their inputs (ConstantOfShape, Expand) stay nodes.
    """
    g = g.copy()
    kept = []
    for n in g.nodes:
        if n.op in OPS and not set(n.outputs) & set(g.outputs):
            known = [o for o in n.outputs if o]
            if all(o in g.values and _all_ints(g.values[o]) for o in known) and known:
                for o in known:
                    g.constants[o] = np.asarray(g.values[o].tolist(), dtype=g.types[o].dtype) \
                        if np.ndim(g.values[o]) else np.asarray(int(g.values[o]), dtype=g.types[o].dtype)
                    g.types.pop(o, None)
                continue
            if n.inputs and all((not i) or i in g.constants for i in n.inputs):
                in_bytes = sum(g.constants[i].nbytes for i in n.inputs if i)
                limit = max(1 << 20, 4 * in_bytes)
                if _typed_bytes(g, n.outputs) > limit:  # too big to fold: not even computed once
                    kept.append(n)
                    continue
                values = _fold(n, [g.constants.get(i) if i else None for i in n.inputs])
                out_bytes = sum(np.asarray(v).nbytes for v in values)
                if out_bytes <= limit:
                    for o, v in zip(n.outputs, values):
                        if o:
                            g.constants[o] = np.asarray(v)
                            g.types.pop(o, None)
                    continue
        kept.append(n)
    g.nodes = kept
    return g


def _typed_bytes(g: Graph, outputs) -> int:
    """Bytes of the outputs whose types are static (0 for symbolic ones)."""
    total = 0
    for o in outputs:
        t = g.types.get(o) if o else None
        if t is not None and all(isinstance(d, (int, np.integer)) for d in t.shape):
            try:
                itemsize = np.dtype(t.dtype).itemsize
            except TypeError:  # a type NumPy cannot hold: the reference says so when folding
                itemsize = 1
            total += int(np.prod([max(int(d), 0) for d in t.shape], dtype=object)) * itemsize
    return total


def _fold(n, inputs) -> list:
    """A node's reference on constant inputs; failing there is the model's error, named."""
    try:
        return OPS[n.op].ref(n, inputs)
    except TensortuneError:
        raise
    except Exception as e:
        raise ModelError(f"node '{n.name}' ({n.op}) fails on its constant inputs: {type(e).__name__}: {e}") from None


def _all_ints(v) -> bool:
    return all(isinstance(x, (int, np.integer)) for x in np.asarray(v, dtype=object).reshape(-1).tolist())


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


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(dims_equal(x, y) for x, y in zip(a, b))


def _is_noop(g: Graph, n: Node) -> bool:
    """Identity, inference Dropout, Cast to the same dtype, shape ops that keep the shape."""
    if n.op == "Identity":
        return True
    if n.op == "Dropout":
        unused_mask = len(n.outputs) < 2 or not n.outputs[1]
        return unused_mask and not (len(n.inputs) > 2 and n.inputs[2])
    x, y = g.types.get(n.inputs[0]) if n.inputs else None, g.types.get(n.outputs[0])
    if x is None:
        x = g.type_of(n.inputs[0]) if n.inputs and n.inputs[0] in g.constants else None
    if x is None or y is None:
        return False
    if n.op == "Cast":
        return x.dtype == y.dtype
    if n.op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Tile"):
        return x.dtype == y.dtype and _same_shape(x.shape, y.shape)
    if n.op in ("Pad", "Slice"):  # same shape is not enough: a reverse slice, pads [-1, +1] move data
        return x.dtype == y.dtype and _same_shape(x.shape, y.shape) and _moves_nothing(g, n)
    if n.op == "Transpose":
        perm = n.attrs.get("perm")
        return perm is not None and list(perm) == sorted(perm) or (perm is None and x.rank <= 1)
    return False


def _moves_nothing(g: Graph, n: Node) -> bool:
    def ints(i, attr):
        if len(n.inputs) > i and n.inputs[i]:
            v = g.constants.get(n.inputs[i])
            return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]
        return list(n.attrs.get(attr, []))
    if n.op == "Pad":
        pads = ints(1, "pads")
        return pads is not None and not any(pads)
    starts, steps = ints(1, "starts"), ints(4, "steps")
    return starts is not None and steps is not None and all(s == 1 for s in steps) and all(s == 0 for s in starts)


def remove_identities(g: Graph) -> Graph:
    """Remove no-op nodes by renaming their output to their input (needs types: run after infer_shapes)."""
    g = g.copy()
    rename: dict[str, str] = {}
    kept = []
    for n in g.nodes:
        n = Node(n.op, tuple(rename.get(i, i) for i in n.inputs), n.outputs, n.attrs, n.name)
        if n.outputs[0] not in g.outputs and _is_noop(g, n):
            rename[n.outputs[0]] = n.inputs[0]
            continue
        kept.append(n)
    g.nodes = kept
    return g


def fold_batchnorm(g: Graph) -> Graph:
    """BatchNormalization -> folded into the Conv / MatMul(+bias Add) before it, else Mul + Add.

    BN(x) = a * x + b per channel, so `Conv(W, c)` then BN is `Conv(a*W, a*c + b)`; for a
    2-D MatMul output the channel is the last axis: `x @ (W * a) + (c * a + b)`.
    A BN that cannot fold becomes Mul/Add with [C, 1, ...] constants (fusable epilogues).
    """
    from ir.ops.nn import bn_scale_shift
    g = g.copy()
    producers, consumers = g.producers(), g.consumers()
    drop: set[str] = set()
    replace: dict[str, list[Node]] = {}
    for bn in g.nodes:
        if bn.op != "BatchNormalization" or bn.attrs.get("training_mode", 0) \
                or not all(i in g.constants for i in bn.inputs[1:5]):
            continue
        a, b = bn_scale_shift(bn, *(g.constants[i] for i in bn.inputs[1:5]))
        x, y = bn.inputs[0], bn.outputs[0]
        p = producers.get(x)
        single = p is not None and len(consumers.get(x, [])) == 1 and x not in g.outputs and p.name not in drop
        rank = g.type_of(x).rank
        if single and p.op == "Conv" and p.inputs[1] in g.constants and \
                (len(p.inputs) < 3 or not p.inputs[2] or p.inputs[2] in g.constants):
            w = g.constants[p.inputs[1]]
            c = g.constants[p.inputs[2]] if len(p.inputs) > 2 and p.inputs[2] else np.zeros(w.shape[0], w.dtype)
            g.constants[f"{p.name}/w_bn"] = (w * a.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
            g.constants[f"{p.name}/b_bn"] = (c * a + b).astype(w.dtype)
            replace[p.name] = [Node("Conv", (p.inputs[0], f"{p.name}/w_bn", f"{p.name}/b_bn"), (y,), p.attrs, p.name)]
            drop.add(bn.name)
            continue
        if single and rank == 2 and p.op == "Add":
            mm = producers.get(p.inputs[0])
            bias = p.inputs[1]
            if mm is not None and mm.op == "MatMul" and mm.inputs[1] in g.constants and bias in g.constants \
                    and len(consumers.get(mm.outputs[0], [])) == 1 and g.constants[mm.inputs[1]].ndim == 2:
                w = g.constants[mm.inputs[1]]
                g.constants[f"{mm.name}/w_bn"] = (w * a[None, :]).astype(w.dtype)
                g.constants[f"{p.name}/b_bn"] = (np.broadcast_to(g.constants[bias], a.shape) * a + b).astype(w.dtype)
                replace[mm.name] = [Node("MatMul", (mm.inputs[0], f"{mm.name}/w_bn"), mm.outputs, {}, mm.name)]
                replace[p.name] = [Node("Add", (mm.outputs[0], f"{p.name}/b_bn"), (y,), {}, p.name)]
                drop.add(bn.name)
                continue
        shape = (-1,) + (1,) * (rank - 2)
        g.constants[f"{bn.name}/scale"] = a.reshape(shape)
        g.constants[f"{bn.name}/shift"] = b.reshape(shape)
        replace[bn.name] = [Node("Mul", (x, f"{bn.name}/scale"), (f"{bn.name}/scaled",), {}, f"{bn.name}/mul"),
                            Node("Add", (f"{bn.name}/scaled", f"{bn.name}/shift"), (y,), {}, f"{bn.name}/add")]
    nodes = []
    for n in g.nodes:
        if n.name in drop:
            continue
        nodes.extend(replace.get(n.name, [n]))
    g.nodes = nodes
    return infer_shapes(g) if replace else g


def resolve_reshape_targets(g: Graph) -> Graph:
    """A Reshape whose target is computed from shapes (Shape -> Gather -> Concat) gets a constant
    target instead, read off its inferred output shape: a static size stays, a dim equal to the
    input's at that axis becomes 0, and at most one other (symbolic) dim becomes -1. A -1 the
    target already held is resolved in that output shape, so it never adds a second one (torch's
    attention targets `Concat(Shape(x)[0], [-1], [h], [64])`). A target with two such dims keeps
    its shape subgraph (evaluated per shape at run time). The subgraph dies in DCE otherwise."""
    g = g.copy()
    nodes = []
    for n in g.nodes:
        if n.op == "Reshape" and n.inputs[1] not in g.constants and n.inputs[1] in g.values \
                and not n.attrs.get("allowzero") and n.outputs[0] in g.types:
            target = _constant_target(g.type_of(n.inputs[0]).shape, g.types[n.outputs[0]].shape)
            if target is not None:
                name = f"{n.name}/target"
                g.constants[name] = np.asarray(target, dtype=np.int64)
                n = Node("Reshape", (n.inputs[0], name), n.outputs, n.attrs, n.name)
        nodes.append(n)
    g.nodes = nodes
    return g


def _constant_target(in_shape, out_shape) -> list | None:
    out, free = [], 0
    for i, d in enumerate(out_shape):
        if isinstance(d, int):
            out.append(d)
        elif i < len(in_shape) and dims_equal(d, in_shape[i]):
            out.append(0)
        else:
            out.append(-1)
            free += 1
    if free > 1 or (0 in [d for d in out_shape if isinstance(d, int)]):
        return None  # an empty axis: 0 would mean "copy" in the target
    return out


def cancel_transposes(g: Graph) -> Graph:
    """Transpose(Transpose(x)) -> one Transpose (or none); Reshape(Reshape(x)) -> one Reshape."""
    g = g.copy()
    producers = g.producers()
    nodes = []
    for n in g.nodes:
        p = producers.get(n.inputs[0]) if n.inputs else None
        if n.op == "Transpose" and p is not None and p.op == "Transpose" and n.attrs.get("perm") and p.attrs.get("perm"):
            p1, p2 = list(p.attrs["perm"]), list(n.attrs["perm"])
            n = Node("Transpose", p.inputs, n.outputs, {"perm": [p1[i] for i in p2]}, n.name)
        elif n.op == "Reshape" and p is not None and p.op == "Reshape" and n.inputs[1] in g.constants \
                and not (g.constants[n.inputs[1]] == 0).any() and not n.attrs.get("allowzero"):
            n = Node("Reshape", (p.inputs[0], n.inputs[1]), n.outputs, n.attrs, n.name)
        nodes.append(n)
        producers.update({o: n for o in n.outputs})
    g.nodes = nodes
    return remove_identities(infer_shapes(g))


def sink_reshapes(g: Graph) -> Graph:
    """Reshape -> a one-input elementwise op read by nothing else ⇒ the op, then the Reshape (they
    commute): the op then fuses into the epilogue of what made the Reshape's input. GPT-2 as torch
    exports it runs Gemm -> Reshape -> Gelu -> Reshape -> Gemm: the Gelu was a step of its own,
    a pass over the MLP's widest tensor."""
    cons, outputs = g.consumers(), set(g.outputs)
    moved: dict[str, Node] = {}   # Reshape's name -> the op it feeds
    for n in g.nodes:
        users = cons.get(n.outputs[0], []) if n.op == "Reshape" and n.outputs[0] not in outputs else []
        d = OPS.get(users[0].op) if len(users) == 1 else None
        if d is not None and d.kind == ELEMWISE and len(users[0].inputs) == 1 and len(users[0].outputs) == 1:
            moved[n.name] = users[0]
    if not moved:
        return g
    g = g.copy()
    later = {moved[n.name].name: n for n in g.nodes if n.name in moved}   # the op's name -> its Reshape
    nodes = []
    for n in g.nodes:
        if n.name in moved:      # the op, where the Reshape was, on the Reshape's input
            e = moved[n.name]
            nodes.append(Node(e.op, (n.inputs[0],), (f"{e.outputs[0]}/unshaped",), e.attrs, e.name))
        elif n.name in later:    # the Reshape, where the op was, of the op's value
            r = later[n.name]
            nodes.append(Node("Reshape", (f"{n.outputs[0]}/unshaped",) + tuple(r.inputs[1:]), n.outputs, r.attrs, r.name))
        else:
            nodes.append(n)
    g.nodes = nodes
    return infer_shapes(g)


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


DEFAULT_PIPELINE = (compute_in_float32, infer_shapes, lower, remove_identities, decompose_gemm, fold_constants, fuse_gelu,
                    fuse_gelu_tanh, fuse_swish, sink_reshapes, fuse_fake_quant, infer_shapes,
                    fold_batchnorm, resolve_reshape_targets, fold_constants, cancel_transposes, fold_constants,
                    eliminate_dead_code, infer_shapes)


def simplify(g: Graph, pipeline=DEFAULT_PIPELINE) -> Graph:
    """The standard pass pipeline, in order, as a list you can read."""
    for p in pipeline:
        g = p(g)
    return g


def check_supported(g: Graph) -> list[str]:
    """Names of ops in `g` that have no reference implementation (they cannot run)."""
    return sorted({n.op for n in g.nodes if n.op not in OPS})


__all__ = ["infer_shapes", "fold_constants", "eliminate_dead_code", "remove_identities", "fold_batchnorm",
           "cancel_transposes", "resolve_reshape_targets",
           "decompose_gemm", "simplify", "check_supported", "get_op"]

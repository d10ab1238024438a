"""QuantizeLinear / DequantizeLinear (opsets 13-21): per-tensor, per-axis and blocked.

A QDQ model (onnxruntime's quantizer writes Q/DQ pairs around Conv and MatMul) keeps
its float ops: DequantizeLinear of a constant weight folds to a float32 constant at
import (`fold_constants`), so the Conv/MatMul runs in compiled float32 kernels; a
per-tensor Q -> DQ pair on an activation becomes one elementwise `QuantizeDequantize`
(`fuse_fake_quant`) that fuses into the kernel before it. Other Q/DQ nodes run as
NumPy references (one vectorized pass each).

Integer types are the ones NumPy (with ml_dtypes for 4-bit) holds: int8, uint8,
int16, uint16, int32 (DequantizeLinear of a bias), int4, uint4. float8 types are
refused with an error naming the node and the type.
"""
from __future__ import annotations

import numpy as np

from ir.errors import ShapeError, UnsupportedOpError
from ir.graph import Graph, Node, TensorType
from ir.ops.registry import ELEMWISE, OPAQUE, f32, register, same_as_input

try:  # registers the bfloat16 / int4 / uint4 dtypes with NumPy (an onnx dependency)
    import ml_dtypes  # noqa: F401
except ImportError:  # pragma: no cover
    ml_dtypes = None

_ONNX_INT_TYPES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 21: "uint4", 22: "int4"}
_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
           "uint4": (0, 15), "int4": (-8, 7), "int32": (-2**31, 2**31 - 1)}


def _quant_dtype(node, zero_point_dtype: str | None) -> str:
    """Q's output type: the zero point's, else the `output_dtype` attribute, else uint8."""
    if zero_point_dtype is not None:
        dt = zero_point_dtype
    else:
        code = int(node.attrs.get("output_dtype", 0))
        if code and code not in _ONNX_INT_TYPES:
            raise UnsupportedOpError(f"node '{node.name}' (QuantizeLinear): output type {code} (float8?) "
                                     "is not supported")
        dt = _ONNX_INT_TYPES.get(code, "uint8")
    if dt not in _RANGES or dt == "int32":
        raise UnsupportedOpError(f"node '{node.name}' ({node.op}): quantized type {dt} is not supported "
                                 f"(supported: {', '.join(k for k in _RANGES if k != 'int32')})")
    return dt


def _along(node, param: np.ndarray, x_shape: tuple) -> np.ndarray:
    """A scale or zero point shaped to broadcast against x: per tensor (scalar / [1]),
    per axis (1-D along `axis`) or blocked (x's rank, `block_size` elements per entry)."""
    rank = len(x_shape)
    axis = int(node.attrs.get("axis", 1))
    block = int(node.attrs.get("block_size", 0))
    if param.ndim == 0 or (param.ndim == 1 and param.size == 1 and not block):
        return param.reshape(())
    if not -rank <= axis < rank:
        raise ShapeError(f"node '{node.name}' ({node.op}): axis {axis} out of range for rank {rank}")
    axis %= rank
    if block > 0:
        want = tuple((d + block - 1) // block if a == axis else d for a, d in enumerate(x_shape))
        if param.shape != want:
            raise ShapeError(f"node '{node.name}' ({node.op}): blocked scale/zero point has shape "
                             f"{list(param.shape)}, expected {list(want)} for input {list(x_shape)} "
                             f"with block_size {block} on axis {axis}")
        return np.repeat(param, block, axis=axis)[tuple(slice(0, d) for d in x_shape)]
    if param.ndim != 1 or param.shape[0] != x_shape[axis]:
        raise ShapeError(f"node '{node.name}' ({node.op}): per-axis scale/zero point has shape "
                         f"{list(param.shape)}, expected [{x_shape[axis]}] (axis {axis} of {list(x_shape)})")
    return param.reshape([-1 if a == axis else 1 for a in range(rank)])


def _zero_point(xs, dtype: str) -> np.ndarray:
    zp = xs[2] if len(xs) > 2 and xs[2] is not None else None
    return np.zeros((), dtype) if zp is None else np.asarray(zp)


def _quantize_ref(node, xs):
    x, scale = np.asarray(xs[0]), np.asarray(xs[1])
    zp_in = xs[2] if len(xs) > 2 and xs[2] is not None else None
    dt = _quant_dtype(node, None if zp_in is None else str(np.asarray(zp_in).dtype))
    zp = _zero_point(xs, dt)
    s = _along(node, scale.astype(np.float32), x.shape)
    z = _along(node, zp.astype(np.int64), x.shape)
    lo, hi = _RANGES[dt]
    q = np.rint(x.astype(np.float32) / s).astype(np.int64) + z  # rint: round half to even, as ONNX
    return [np.clip(q, lo, hi).astype(dt)]


def _dequantize_ref(node, xs):
    x, scale = np.asarray(xs[0]), np.asarray(xs[1])
    if str(x.dtype) not in _RANGES:
        raise UnsupportedOpError(f"node '{node.name}' (DequantizeLinear): input type {x.dtype} is not supported")
    zp = _zero_point(xs, str(x.dtype))
    s = _along(node, scale.astype(np.float32), x.shape)
    z = _along(node, zp.astype(np.int64), x.shape)
    y = (x.astype(np.int64) - z).astype(np.float32) * s
    return [y.astype(scale.dtype)]


def _quantize_infer(node, types, consts):
    zp = types[2] if len(types) > 2 and types[2] is not None else None
    return [TensorType(types[0].shape, _quant_dtype(node, zp.dtype if zp is not None else None))]


def _dequantize_infer(node, types, consts):
    if types[0].dtype not in _RANGES:
        raise UnsupportedOpError(f"node '{node.name}' (DequantizeLinear): input type {types[0].dtype} "
                                 "is not supported")
    return [TensorType(types[0].shape, types[1].dtype)]


register("QuantizeLinear", OPAQUE, _quantize_infer, _quantize_ref, flops_per_elem=3)
register("DequantizeLinear", OPAQUE, _dequantize_infer, _dequantize_ref, flops_per_elem=2)


# -- Q -> DQ pairs on activations: one elementwise op that kernels compile and fuse ---------
def _fake_quant_ref(node, xs):
    s, z = np.float32(node.attrs["scale"]), np.float32(node.attrs["zero_point"])
    q = np.clip(np.rint(xs[0].astype(np.float32) / s) + z, node.attrs["lo"], node.attrs["hi"])
    return [((q - z) * s).astype(np.float32)]


def _fake_quant_expr(node, a):
    s, z = f32(node.attrs["scale"]), f32(node.attrs["zero_point"])
    lo, hi = f32(node.attrs["lo"]), f32(node.attrs["hi"])
    return f"((min(max(np.rint({a[0]} / {s}) + {z}, {lo}), {hi}) - {z}) * {s})"


register("QuantizeDequantize", ELEMWISE, same_as_input(0), _fake_quant_ref, _fake_quant_expr, 5)


def _per_tensor(g: Graph, n: Node):
    """(scale, zero point, dtype) of a per-tensor Q/DQ with constant float32 parameters, or None."""
    if n.attrs.get("block_size", 0) or len(n.inputs) < 2 or n.inputs[1] not in g.constants:
        return None
    s = g.constants[n.inputs[1]]
    zp = g.constants.get(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
    if s.size != 1 or s.dtype != np.float32 or (len(n.inputs) > 2 and n.inputs[2] and zp is None) \
            or (zp is not None and zp.size != 1):
        return None
    return float(s.reshape(-1)[0]), 0 if zp is None else int(zp.reshape(-1)[0]), \
        "uint8" if zp is None else str(zp.dtype)


def fuse_fake_quant(g: Graph) -> Graph:
    """QuantizeLinear -> DequantizeLinear with the same per-tensor constants (what onnxruntime's
    quantizer writes around every activation) -> one `QuantizeDequantize`: elementwise, so it
    compiles and fuses as a Conv/MatMul epilogue. Results are identical (the same float32
    rounding and clipping)."""
    producers, consumers = g.producers(), g.consumers()
    drop, replace = set(), {}
    for dq in g.nodes:
        if dq.op != "DequantizeLinear":
            continue
        q = producers.get(dq.inputs[0])
        if q is None or q.op != "QuantizeLinear" or dq.inputs[0] in g.outputs or len(consumers[dq.inputs[0]]) != 1:
            continue
        a, b = _per_tensor(g, q), _per_tensor(g, dq)
        if a is None or a != b or q.attrs.get("output_dtype", 0) or a[2] not in _RANGES:
            continue
        lo, hi = _RANGES[a[2]]
        drop.add(q.name)
        replace[dq.name] = Node("QuantizeDequantize", (q.inputs[0],), dq.outputs,
                                {"scale": a[0], "zero_point": a[1], "lo": lo, "hi": hi}, dq.name)
    if not replace:
        return g
    g = g.copy()
    g.nodes = [replace.get(n.name, n) for n in g.nodes if n.name not in drop]
    return g

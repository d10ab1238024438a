"""QuantizeLinear / DequantizeLinear (opsets 13-21): per-tensor, per-axis and blocked.

A QDQ model (onnxruntime's quantizer writes Q/DQ pairs around Conv and MatMul) keeps
its float ops: DequantizeLinear of a constant weight folds to a float32 constant at
import (`fold_constants`), so the Conv/MatMul runs in compiled float32 kernels; the
Q/DQ pairs on activations run as NumPy references (one vectorized pass each).

Integer types are the ones NumPy (with ml_dtypes for 4-bit) holds: int8, uint8,
int16, uint16, int32 (DequantizeLinear of a bias), int4, uint4. float8 types are
refused with an error naming the node and the type.
"""
from __future__ import annotations

import numpy as np

from ir.errors import ShapeError, UnsupportedOpError
from ir.graph import TensorType
from ir.ops.registry import OPAQUE, register

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

"""ONNX element types <-> dtype names, and which ones tensortune runs.

The table covers every `TensorProto` element type, so no type is ever silently
retyped. Compiled kernels and our NumPy references compute in the `RUNNABLE`
types; tensors of other types with a NumPy dtype (float8, int4, complex, strings
as `object`, all as `onnx.numpy_helper` returns them, through `ml_dtypes`) run on
the per-node onnx.reference path; a type with none is a ModelError naming the value.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

try:  # registers bfloat16, float8_*, int4... with NumPy (onnx depends on it)
    import ml_dtypes  # noqa: F401
except ImportError:  # pragma: no cover
    pass

from ir.errors import ModelError

# element type -> dtype name (the name NumPy, with ml_dtypes, knows it by)
DTYPES: dict[int, str] = {
    TensorProto.FLOAT: "float32", TensorProto.DOUBLE: "float64", TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.INT8: "int8", TensorProto.INT16: "int16", TensorProto.INT32: "int32", TensorProto.INT64: "int64",
    TensorProto.UINT8: "uint8", TensorProto.UINT16: "uint16", TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64", TensorProto.BOOL: "bool", TensorProto.STRING: "object",
    TensorProto.COMPLEX64: "complex64", TensorProto.COMPLEX128: "complex128",
}
for _name in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4", "FLOAT4E2M1",
              "FLOAT8E8M0", "UINT2", "INT2"):
    if hasattr(TensorProto, _name):  # named as numpy_helper's arrays (ml_dtypes) name them
        try:
            DTYPES[getattr(TensorProto, _name)] = str(np.dtype(helper.tensor_dtype_to_np_dtype(getattr(TensorProto, _name))))
        except Exception:
            DTYPES[getattr(TensorProto, _name)] = _name.lower()
ONNX_TYPES: dict[str, int] = {v: k for k, v in DTYPES.items()}

# what the references and kernels compute with (fp16/bf16: see the runtime's README notes)
RUNNABLE = frozenset({"float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
                      "uint8", "uint16", "uint32", "uint64", "bool", "int4", "uint4"})   # int4/uint4: Q/DQ weights


def dtype_name(elem_type: int, where: str) -> str:
    """The dtype name of an ONNX element type; ModelError for undefined/unknown ones."""
    if elem_type in DTYPES:
        return DTYPES[elem_type]
    label = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else str(elem_type)
    raise ModelError(f"{where} has element type {label}, which tensortune does not know")


def check_runnable(dtype: str, where: str) -> None:
    """ModelError unless some path can hold and run tensors of `dtype` (see the module doc)."""
    if dtype in RUNNABLE:
        return
    try:
        np.dtype(dtype)
    except TypeError:
        raise ModelError(f"{where} has dtype {dtype}, which tensortune cannot run "
                         f"(it has no NumPy dtype; compiled kernels run {', '.join(sorted(RUNNABLE))})") from None


def onnx_type(dtype) -> int:
    """TensorProto element type of a NumPy dtype or dtype name."""
    name = str(dtype)
    if name not in ONNX_TYPES:
        raise ModelError(f"dtype {name} has no ONNX element type")
    return ONNX_TYPES[name]


__all__ = ["DTYPES", "ONNX_TYPES", "RUNNABLE", "dtype_name", "check_runnable", "onnx_type"]

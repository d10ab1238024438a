"""Graph IR: ONNX import, symbolic shapes, passes, fusion, workloads.

Names are loaded on first use (PEP 562), so `import ir.errors` (which every
CLI and the database need) does not pay for sympy, onnx and scipy.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "ModelError": "ir.errors", "ShapeError": "ir.errors", "TensortuneError": "ir.errors",
    "UnsupportedOpError": "ir.errors", "FusedSubgraph": "ir.fusion", "partition": "ir.fusion",
    "Graph": "ir.graph", "Node": "ir.graph", "TensorType": "ir.graph", "import_onnx": "ir.onnx_import",
    "load_onnx": "ir.onnx_import", "simplify": "ir.passes", "DimRange": "ir.shapes",
    "Workload": "ir.workload", "make_workload": "ir.workload",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ir' has no attribute {name!r}")

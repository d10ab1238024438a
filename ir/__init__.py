"""Graph IR: ONNX import, symbolic shapes, passes, fusion, workloads.

Names are loaded on first use (PEP 562), so `import ir.errors` (which every
CLI and the database need) does not pay for sympy, onnx and scipy.
"""
from ir.lazy import lazy_exports

_EXPORTS = {
    "ModelError": "ir.errors", "ShapeError": "ir.errors", "TensortuneError": "ir.errors",
    "UnsupportedOpError": "ir.errors", "FusedSubgraph": "ir.fusion", "partition": "ir.fusion",
    "Graph": "ir.graph", "Node": "ir.graph", "TensorType": "ir.graph", "import_onnx": "ir.onnx_import",
    "load_onnx": "ir.onnx_import", "simplify": "ir.passes", "DimRange": "ir.shapes",
    "Workload": "ir.workload", "make_workload": "ir.workload",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

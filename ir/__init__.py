"""Graph IR: ONNX import, symbolic shapes, passes, fusion, workloads."""
from ir.errors import ModelError, ShapeError, TensortuneError, UnsupportedOpError
from ir.fusion import FusedSubgraph, partition
from ir.graph import Graph, Node, TensorType
from ir.onnx_import import import_onnx, load_onnx
from ir.passes import simplify
from ir.shapes import DimRange
from ir.workload import Workload, make_workload

__all__ = ["Graph", "Node", "TensorType", "FusedSubgraph", "Workload", "DimRange", "import_onnx",
           "load_onnx", "simplify", "partition", "make_workload", "TensortuneError", "ModelError",
           "ShapeError", "UnsupportedOpError"]

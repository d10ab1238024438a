"""Op registry; importing this package registers every op module."""
from ir.ops import elementwise, linalg, shape_ops  # noqa: F401  (registration side effects)
from ir.ops.registry import (ANCHOR, BROADCAST, ELEMWISE, INJECTIVE, OPAQUE, OPS, REDUCE, OpDef,
                             broadcast_shapes, f32, get_op, register)

__all__ = ["OPS", "OpDef", "get_op", "register", "broadcast_shapes", "f32",
           "ELEMWISE", "BROADCAST", "INJECTIVE", "REDUCE", "ANCHOR", "OPAQUE"]

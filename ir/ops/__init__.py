"""Op registry; importing this package registers every op module."""
from ir.ops import elementwise, linalg, nn, reduce, resize, shape_ops, tensor  # noqa: F401  (registration side effects)
from ir.ops import (attention_ops, detection_ops, index_ops, linalg_more, math_more, misc_ops,  # noqa: F401
                    norm_ops, pool_more, rnn_ops, sampling_ops, signal_ops)
from ir.ops import quant  # noqa: F401  (QuantizeLinear / DequantizeLinear)
from ir.ops.registry import (ANCHOR, BROADCAST, ELEMWISE, INJECTIVE, OPAQUE, OPS, REDUCE, OpDef,
                             VALUE_FNS, broadcast_shapes, dims_of, f32, get_op,
                             note_equal, register, register_value, take_constraints)

__all__ = ["OPS", "OpDef", "get_op", "register", "broadcast_shapes", "f32",
           "ELEMWISE", "BROADCAST", "INJECTIVE", "REDUCE", "ANCHOR", "OPAQUE"]

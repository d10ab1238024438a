"""Checks the generated CPU kernels call: an index read from a tensor (Gather,
GatherElements, GatherND) is the input's data, so it is checked before memory is
read at it. Without the check an out-of-range index read whatever lay beside the
array (or crashed the process); with it the kernel raises IndexError, which the
executor reports as one line naming the node (`ir.errors.InputValueError`)."""
from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def index_in(g, size):
    """`g` as an index into an axis of `size`: negative counts from the end (ONNX)."""
    if g < 0:
        g += size
    if g < 0 or g >= size:
        raise IndexError("an index is out of range")
    return g

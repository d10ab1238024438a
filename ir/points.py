"""The concrete dim sizes a model is tuned or run at (TensorRT-like opt points)."""
from __future__ import annotations

import itertools

from ir.errors import ShapeError
from ir.shapes import DimRange

DEFAULT_DIM_SIZE = 32


def shape_points(dims: dict[str, DimRange], shapes: dict[str, list[int]] | None = None) -> list[dict[str, int]]:
    """The product of the `--shape` values; a dim given none is taken at 32,
    clamped into its declared range."""
    shapes = dict(shapes or {})
    unknown = set(shapes) - set(dims)
    if unknown:
        raise ShapeError(f"--shape names {sorted(unknown)} are not dynamic dims of the model "
                         f"(it has: {sorted(dims) or 'none'})")
    axes = []
    for name, rng in dims.items():
        values = shapes.get(name) or [min(max(DEFAULT_DIM_SIZE, rng.lo), rng.hi)]
        for v in values:
            rng.check(v, "--shape: ")
        axes.append([(name, v) for v in values])
    return [dict(p) for p in itertools.product(*axes)] if axes else [{}]

"""Fused elementwise epilogues: the ops after an anchor, inlined into its store.

An extra input of the epilogue (bias, residual, scale) is read through one of
four index modes over the anchor's output viewed as [M, N]: scalar, row (along
N), col (along M), full ([M, N]); templates with a channel axis (NCHW conv) can
ask for a fifth, chan (one value per channel, read at the channel index `c`),
and for `broadcast_full`: any other broadcastable extra is read as full after
the template broadcasts it to the output shape.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ir.ops import BROADCAST, ELEMWISE, OPS
from ir.workload import Workload
from schedules.loopnest import Assign

MODES = ("scalar", "row", "col", "full", "chan")


@dataclass(frozen=True)
class Extra:
    input_index: int   # position in the workload's inputs
    mode: str
    param: str         # parameter name in generated code
    dtype: str = "float32"   # or "bool": a Where condition (an attention mask)

    @property
    def scalar_local(self) -> str:
        """The local a scalar extra is read into once per function (`Epilogue.prelude`)."""
        return f"{self.param}_scalar"

    @property
    def type(self) -> str:
        t = "boolean" if self.dtype == "bool" else "float32"
        return f"{t}[:, ::1]" if self.mode == "full" else f"{t}[::1]"

    def load(self, i: str, j: str, c: str | None = None) -> str:
        return {"scalar": self.scalar_local, "row": f"{self.param}[{j}]",
                "col": f"{self.param}[{i}]", "full": f"{self.param}[{i}, {j}]",
                "chan": f"{self.param}[{c}]"}[self.mode]

    def view(self, a: np.ndarray, m: int, n: int) -> np.ndarray:
        """The array as the kernel reads it (contiguous float32 or bool, 1-D or [M, N])."""
        if self.dtype == "bool":
            a = np.ascontiguousarray(a, dtype=bool)
            a = a if a.flags.writeable else a.copy()
        else:
            a = as_kernel_array(a)
        return a.reshape(m, n) if self.mode == "full" else a.reshape(-1)


    def arg(self, wl, m: int, n: int, out_shape: tuple | None = None):
        """The launch argument that passes this extra: `view` as data (schedules.launch.In).
        `out_shape`: for `broadcast_full` templates, a full extra of another shape is
        broadcast to it first (an extra of exactly that shape is passed as it is: no copy)."""
        from schedules.launch import In
        shape = tuple(int(d) for d in wl.inputs[self.input_index]["shape"])
        size = 1
        for d in shape:
            size *= d
        full = self.mode == "full"
        broadcast = tuple(out_shape) if full and out_shape is not None and shape != tuple(out_shape) else None
        return In(self.input_index, (m, n) if full else (size,), "bool" if self.dtype == "bool" else "float32",
                  broadcast)


def as_kernel_array(a: np.ndarray) -> np.ndarray:
    """Contiguous, writeable float32 (numba signatures take no read-only arrays)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    return a if a.flags.writeable else a.copy()


def index_mode(shape, out_shape, channel_axis: int | None = None, broadcast_full: bool = False) -> str | None:
    if len(shape) > len(out_shape):
        return None
    s = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    o = tuple(out_shape)
    if all(d == 1 for d in s):
        return "scalar"
    if channel_axis is not None:
        if s[channel_axis] == o[channel_axis] and all(d == 1 for k, d in enumerate(s) if k != channel_axis):
            return "chan"
        if s == o:
            return "full"
        if broadcast_full and all(d in (1, od) for d, od in zip(s, o)):
            return "full"
        return None  # [M, N] row/col views do not apply to a channel layout
    if all(d == 1 for d in s[:-1]) and s[-1] == o[-1]:
        return "row"
    if s == o:
        return "full"
    if s[-1] == 1 and s[:-1] == o[:-1]:
        return "col"
    if broadcast_full and all(d in (1, od) for d, od in zip(s, o)):
        return "full"
    return None


NO_CLAMP = ("np.float32(-np.inf)", "np.float32(np.inf)")
"""`Epilogue.clamp_bounds` of an epilogue that clamps nothing: the bounds a tile then passes."""


@dataclass(frozen=True)
class Epilogue:
    steps: tuple      # (op json, arg refs) after the anchor
    extras: tuple     # Extra per distinct extra input

    def params(self):
        return [(e.param, e.type) for e in self.extras]

    @property
    def reads_output_sized(self) -> bool:
        """Whether an extra is output-sized (a residual), which may be the output buffer itself:
        tiles must then store element by element after the read, and not overlap (a tile moved
        back to end at a row's edge would read an element its neighbour already wrote). Scalar
        and per-channel extras (Clip's bounds, a scale) are smaller than any output."""
        return any(e.mode == "full" for e in self.extras)

    def clamp_bounds(self) -> tuple[str, str] | None:
        """(lo, hi) expressions where the epilogue is nothing, one Relu, or one Clip of the chain
        with constant or scalar bounds (ReLU6 as exporters write it), else None: a vector tile
        (`codegen.vector_tile.row_taps`) clamps its accumulators in registers instead of a second
        pass over its output. Clip(x) = min(max(x, lo), hi), so the bounds are the epilogue's own
        expression at -inf and +inf (one rule for Relu, Clip by attributes or by inputs)."""
        if not self.steps:
            return NO_CLAMP
        if len(self.steps) != 1 or any(e.mode != "scalar" for e in self.extras):
            return None
        op, args = self.steps[0]
        if op["op"] not in ("Relu", "Clip") or args[0] != "chain" or "chain" in args[1:]:
            return None
        bounds = []
        for end in NO_CLAMP:
            assigns, result = self.emit(f"({end})", "0", "0", "b")
            bounds.append(dict(assigns)[result] if assigns else result)
        return bounds[0], bounds[1]

    @property
    def hard_swish(self) -> bool:
        """Whether the epilogue is one HardSwish of the chain and nothing else (MobileNetV3's
        convs): a vector tile (`codegen.vector_tile.block_taps`) applies it in registers, as
        `clamp_bounds` lets it apply Relu and ReLU6, instead of a second pass over its output."""
        return len(self.steps) == 1 and not self.extras and self.steps[0][0]["op"] == "HardSwish" \
            and tuple(self.steps[0][1]) == ("chain",)

    def prelude(self) -> tuple:
        """What a function taking `params()` runs first: its scalar extras (Clip's bounds, as
        exporters write ReLU6) read once into locals. Read as `e0[0]` at every element, LLVM
        reloaded them after each store (the output might be the same memory), which kept a
        tile's stores scalar: MobileNetV2's depthwise convs ran 2.2-2.8x slower with ReLU6
        than with Relu (Zen 4, 2026-12-03)."""
        return tuple(Assign(e.scalar_local, f"{e.param}[0]") for e in self.extras if e.mode == "scalar")

    def emit(self, value: str, i: str, j: str, tmp: str, c: str | None = None,
             rows: dict | None = None) -> tuple[list[tuple[str, str]], str]:
        """Assignments (name, expr) computing the epilogue of `value` at (i, j) (channel c for
        chan extras); returns (assigns, result). `rows`: extra param -> the row it is read at
        instead of i (a full extra broadcast over batches, read through a batch table)."""
        from ir.graph import Node
        loads = {f"i{e.input_index}": e.load((rows or {}).get(e.param, i), j, c) for e in self.extras}
        assigns, cur = [], value
        for k, (op, args) in enumerate(self.steps):
            node = Node(op["op"], tuple(args), ("_",), dict(op["attrs"]))
            exprs = [cur if a == "chain" else loads[a] for a in args]
            name = f"{tmp}_{k}"
            assigns.append((name, OPS[op["op"]].expr(node, exprs)))
            cur = name
        return assigns, cur


def parse_epilogue(wl: Workload, anchor_inputs: int, out_shape, channel_axis: int | None = None,
                   broadcast_full: bool = False) -> Epilogue | None:
    """The epilogue of `wl` (ops after ops[0]), or None if it cannot be fused by index modes.
    channel_axis / broadcast_full: see `index_mode` (the template must support them)."""
    steps, extras = [], {}
    for k, op in enumerate(wl.ops[1:], start=1):
        d = OPS.get(op["op"])
        if d is None or d.kind not in (ELEMWISE, BROADCAST) or d.expr is None:
            return None
        args = []
        for ref in op["in"]:
            if ref == f"t{k - 1}":
                args.append("chain")
            elif ref.startswith("i"):
                idx = int(ref[1:])
                if idx < anchor_inputs and ref not in extras:
                    pass
                if ref not in extras:
                    mode = index_mode(wl.inputs[idx]["shape"], out_shape, channel_axis, broadcast_full)
                    dtype = wl.inputs[idx]["dtype"]
                    cond = op["op"] == "Where" and op["in"][0] == ref
                    if mode is None or dtype != ("bool" if cond else "float32"):
                        return None   # bool only as a Where condition: every other operand is float32 code
                    extras[ref] = Extra(idx, mode, f"e{len(extras)}", dtype)
                args.append(ref)
            else:
                return None  # reads an earlier intermediate: not a simple chain
        if args.count("chain") != 1:
            return None
        steps.append((op, tuple(args)))
    return Epilogue(tuple(steps), tuple(extras.values()))

"""Batched MatMul on the GPU: C[b..., M, N] = A[b..., M, K] @ B[b..., K, N] (NumPy
broadcasting of the batch dims) with a fused elementwise epilogue, as the tiled SGEMM
kernel of cuda/dense (`gemm_kernel`: same knobs, same shared-memory staging) over a
1-D grid of (batch, row tile, column tile) blocks.

Which A and B matrix an output batch reads are index tables (the CPU template's
`_batch_index`). An epilogue input that the CPU template broadcasts to the output
(an attention mask [b, 1, 1, n]) is read in place here instead: a table of its offset
per output batch, and its row and column strides (0 along a broadcast dim), so
nothing is broadcast on the host.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ir.workload import Workload
from schedules import gpu
from schedules.epilogue import Epilogue, Extra
from schedules.launch import Call, In, Launch, Out, Scalar, Table
from schedules.loopnest import Assign, LoopModule, Param
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace
from schedules.template import Lowered, Template
from schedules.templates.batch_matmul import BatchMatmulTemplate, _batch_index, _epilogue, _prod
from schedules.templates.cuda.dense import (Operands, Tiling, gemm_constraint, gemm_default, gemm_kernel, gemm_knobs,
                                            gemm_resources, tiling_doc)


class StridedExtra(Extra):
    """A full epilogue input broadcast over the output, read at the kernel's batch `bt` and
    in-batch row `gi`: flat[off[bt] + gi * sm + j * sn]."""

    @property
    def type(self) -> str:
        return ("boolean" if self.dtype == "bool" else "float32") + "[::1]"

    def load(self, i: str, j: str, c: str | None = None) -> str:
        p = self.param
        return f"{p}[{p}_off[bt] + gi * {p}_sm + {j} * {p}_sn]"


@lru_cache(maxsize=256)
def _sizes(wl: Workload) -> tuple[int, int, int, int, int]:
    """(batches, M, N, K, bytes of the epilogue's inputs): asked once per config when a space is pruned."""
    a_shape, b_shape = (tuple(int(d) for d in wl.inputs[i]["shape"]) for i in (0, 1))
    extra_bytes = sum(4 * _prod(wl.inputs[e.input_index]["shape"]) for e in _epilogue(wl).extras)
    return _prod(wl.output_shape[:-2]), a_shape[-2], b_shape[-1], a_shape[-1], extra_bytes


class CudaBatchMatmulTemplate(Template):
    name = "cuda_batch_matmul"
    version = 1
    kind = "cuda"

    def matches(self, wl: Workload) -> bool:
        return BatchMatmulTemplate.matches(self, wl)   # exactly the CPU batch_matmul's workloads

    @staticmethod
    def _shapes(wl: Workload):
        a_shape, b_shape = (tuple(int(d) for d in wl.inputs[i]["shape"]) for i in (0, 1))
        out_shape = tuple(int(d) for d in wl.output_shape)
        return a_shape, b_shape, out_shape

    def _dims(self, wl: Workload) -> tuple[int, int, int, int]:
        return _sizes(wl)[:4]

    def space(self, wl: Workload) -> ConfigSpace:
        return ConfigSpace(gemm_knobs(), constraint=gemm_constraint(self, wl))

    def resources(self, wl: Workload, cfg) -> gpu.Resources:
        return gemm_resources(Tiling.of(cfg), *_sizes(wl))

    def default_config(self, wl: Workload) -> Config:
        nb, M, N, _ = self._dims(wl)
        return gemm_default(self.space(wl), nb, M, N)

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        t = Tiling.of(cfg)
        a_shape, b_shape, out_shape = self._shapes(wl)
        nb, M, N, K = self._dims(wl)
        batch = out_shape[:-2]
        tables = {"ia": _batch_index(a_shape[:-2], batch), "ib": _batch_index(b_shape[:-2], batch)}
        epi = _epilogue(wl)
        extras, params, args = [], [], []
        for e in epi.extras:
            arg = e.arg(wl, nb * M, N, out_shape)
            if arg.broadcast is None:
                extras.append(e)
                params.append(Param(e.param, e.type))
                args.append(arg)
                continue
            s = StridedExtra(e.input_index, e.mode, e.param, e.dtype)
            extras.append(s)
            shape = tuple(int(d) for d in wl.inputs[e.input_index]["shape"])
            off, sm, sn = broadcast_strides(shape, out_shape)
            tables[f"{e.param}_off"] = off
            params += [Param(e.param, s.type), Param(f"{e.param}_off", "int64[::1]"),
                       Param(f"{e.param}_sm", "int64"), Param(f"{e.param}_sn", "int64")]
            args += [In(e.input_index, (_prod(shape),), arg.dtype), Table(f"{e.param}_off"), Scalar(sm), Scalar(sn)]
        epi = Epilogue(epi.steps, tuple(extras))
        ops = Operands(a=lambda m, k: f"A[ab, {m}, {k}]", b=lambda k, n: f"B[bb, {k}, {n}]",
                       row=lambda m: f"bt * M + {m}", batch_setup=(Assign("ab", "ia[bt]"), Assign("bb", "ib[bt]")),
                       batched=True)
        kparams = (Param("A", "float32[:, :, ::1]"), Param("B", "float32[:, :, ::1]"),
                   Param("ia", "int64[::1]"), Param("ib", "int64[::1]"), *params,
                   Param("out", "float32[:, ::1]")) + tuple(Param(n, "int64") for n in ("M", "N", "K"))
        module = LoopModule((gemm_kernel("bmm", t, ops, epi, kparams),),
                            doc=f"cuda batch_matmul kernel: {tiling_doc(t)}, epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"cuda_batch_matmul v{self.version}"})
        if not nb * M * N:   # an empty output: nothing to launch
            return Lowered(module, Launch((), tables=tables))
        blocks = nb * gpu.blocks_for(M, t.bm) * gpu.blocks_for(N, t.bn)
        call = Call("bmm", (In(0, (_prod(a_shape[:-2]), M, K), "float32"), In(1, (_prod(b_shape[:-2]), K, N), "float32"),
                            Table("ia"), Table("ib"), *args, Out((nb * M, N)), Scalar(M), Scalar(N), Scalar(K)),
                    items=blocks, grid=(blocks,), block=(t.threads,))
        return Lowered(module, Launch((call,), tables=tables))


def broadcast_strides(shape: tuple, out_shape: tuple) -> tuple[np.ndarray, int, int]:
    """(offset of each output batch, row stride, column stride) of an input of `shape`
    broadcast to `out_shape`, in elements of the input (0 along a broadcast dim)."""
    s = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    flat = np.broadcast_to(np.arange(_prod(s), dtype=np.int64).reshape(s), out_shape)   # a view: no copy
    row, col = (int(x) // flat.itemsize for x in flat.strides[-2:])
    return np.ascontiguousarray(flat[..., 0, 0]).reshape(-1), row, col


register_template(CudaBatchMatmulTemplate())

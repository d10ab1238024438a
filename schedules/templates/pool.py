"""MaxPool / AveragePool, NCHW 2-D (kernel, strides, pads, dilations, ceil_mode,
count_include_pad). GlobalAverage/MaxPool are reductions: see `reduce.py`.

The input is padded once per call into a cached buffer (with -inf for max, 0 for
average; ceil_mode's extra tail included), so the window loops carry no bounds
checks; an average divides by a per-output-pixel count computed once per shape.
Knobs: `owtile` (code) — output pixels of a row computed together in scalar
accumulators (SLP-vectorizable; guarded tail); `unroll` (code) — the window
loops written out; planes per work item and threading are run-time.
"""
from __future__ import annotations

import numpy as np

from ir.ops.nn import _concrete_pads, _windows
from ir.workload import Workload
from schedules.epilogue import as_kernel_array
from schedules.loopnest import UNROLLED, Assign, For, Function, LoopModule, Param
from schedules.parallel import num_threads, parallel_for
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import LegacyLowered as Lowered, Template


def _geo(wl: Workload):
    node = wl.nodes()[0]
    x = wl.inputs[0]["shape"]
    strides, dil, pads, outs, extra = _concrete_pads(node, list(x[2:]), list(node.attrs["kernel_shape"]))
    return node, strides, dil, pads, outs, extra


class PoolTemplate(Template):
    name = "pool"
    version = 1

    def matches(self, wl: Workload) -> bool:
        if len(wl.ops) != 1 or wl.ops[0]["op"] not in ("MaxPool", "AveragePool") or len(wl.ops[0]["in"]) != 1:
            return False
        if wl.inputs[0]["dtype"] != "float32" or len(wl.inputs[0]["shape"]) != 4:
            return False
        a = wl.ops[0]["attrs"]
        if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or a.get("storage_order", 0):
            return False
        return True

    def space(self, wl: Workload) -> ConfigSpace:
        return ConfigSpace([
            Knob("owtile", (1, 4, 8)),
            Knob("unroll", (True, False)),
            Knob("parallel", (True, False), code_shape=False),
            Knob("PB", (1, 4, 16), code_shape=False),
        ])

    def default_config(self, wl: Workload) -> Config:
        return self.space(wl).validate({"owtile": 8, "unroll": True, "parallel": True, "PB": 4})

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        node, (SH, SW), (DH, DW), pads, outs, extra = _geo(wl)
        KH, KW = node.attrs["kernel_shape"]
        is_max = node.op == "MaxPool"
        tile, unroll = cfg["owtile"], cfg["unroll"]

        def window(r: int):
            kind = UNROLLED if unroll else "serial"
            upd = (Assign(f"a{r}", f"max(a{r}, xp[pl, ih, iw + {r * SW}])") if is_max
                   else Assign(f"a{r}", f"xp[pl, ih, iw + {r * SW}]", "+"))
            return upd

        def block(n: int, ow0: str) -> tuple:
            kind = UNROLLED if unroll else "serial"
            init = tuple(Assign(f"a{r}", "np.float32(-np.inf)" if is_max else "np.float32(0.0)") for r in range(n))
            loops = (For("kh", "0", str(KH), (
                Assign("ih", f"oh * {SH} + kh * {DH}"),
                For("kw", "0", str(KW), (Assign("iw", f"({ow0}) * {SW} + kw * {DW}"),) + tuple(window(r) for r in range(n)), kind),
            ), kind),)
            store = tuple(Assign(f"out[pl, oh, {ow0} + {r}]", f"a{r}" if is_max else f"a{r} * inv[oh, {ow0} + {r}]")
                          for r in range(n))
            return init + loops + store

        row = (For("owt", "0", f"OW // {tile}", block(tile, f"owt * {tile}")),) + (
            (For("ow", f"(OW // {tile}) * {tile}", "OW", block(1, "ow")),) if tile > 1 else ())
        body = (
            For("blk", "t", "(P + PB - 1) // PB", step="T", body=(
                For("pl", "blk * PB", "min(P, blk * PB + PB)", (For("oh", "0", "OH", row),)),
            )),
        )
        params = (Param("xp", "float32[:, :, ::1]"), Param("inv", "float32[:, ::1]"), Param("out", "float32[:, :, ::1]"),
                  Param("P", "int64"), Param("OH", "int64"), Param("OW", "int64"), Param("PB", "int64"),
                  Param("t", "int64"), Param("T", "int64"))
        module = LoopModule((Function("pool", params, body),),
                            doc=f"pool kernel: {node.op} {KH}x{KW} stride {SH}x{SW} owtile={tile} unroll={unroll}",
                            meta={"template": f"pool v{self.version}"})
        threads = num_threads() if cfg["parallel"] else 1
        PB = cfg["PB"]
        cache = {}

        def geometry(shape):
            if shape not in cache:
                N, C, H, W = shape
                st, dl, pd, os_, ex = _concrete_pads(node, [H, W], [KH, KW])
                hp = max(H + pd[0] + pd[2] + ex[0], (os_[0] - 1) * st[0] + (KH - 1) * dl[0] + 1)
                wp = max(W + pd[1] + pd[3] + ex[1], (os_[1] - 1) * st[1] + (KW - 1) * dl[1] + 1)
                xp = np.full((N * C, hp, wp), -np.inf if is_max else 0.0, np.float32)
                if is_max:
                    inv = np.ones((1, 1), np.float32)
                else:
                    widths = [(0, 0), (0, 0), (pd[0], pd[2] + ex[0]), (pd[1], pd[3] + ex[1])]
                    ones = np.ones((1, 1, H, W), np.float32)
                    if node.attrs.get("count_include_pad", 0):
                        src = np.pad(np.pad(ones, [(0, 0), (0, 0), (pd[0], pd[2]), (pd[1], pd[3])], constant_values=1),
                                     [(0, 0), (0, 0), (0, ex[0]), (0, ex[1])])
                    else:
                        src = np.pad(ones, widths)
                    count = _windows(src, [KH, KW], st, dl, os_).sum(axis=(-2, -1))[0, 0]
                    inv = as_kernel_array(1.0 / count)
                cache.clear()
                cache[shape] = (xp, inv, pd)
            return cache[shape]

        def launch(funcs, state, arrays, out):
            X = as_kernel_array(arrays[0])
            N, C, H, W = X.shape
            xp, inv, pd = geometry(X.shape)
            xp.reshape(N, C, *xp.shape[1:])[:, :, pd[0]:pd[0] + H, pd[1]:pd[1] + W] = X
            OH, OW = out.shape[2:]
            parallel_for(funcs["pool"], (xp, inv, out.reshape(N * C, OH, OW), N * C, OH, OW, PB), threads)

        return Lowered(module, lambda funcs, arrays: None, launch)


register_template(PoolTemplate())

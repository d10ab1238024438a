"""MaxPool / AveragePool, NCHW 2-D (kernel, strides, pads, dilations, ceil_mode,
count_include_pad). GlobalAverage/MaxPool are reductions: see `reduce.py`.

For the window loops each plane is first written padded into a workspace (-inf
for max, 0 for average; ceil_mode's extra tail included) by the thread that
pools it, so they carry no bounds checks (unpadded windows read the input
itself); the separable code reads the input in place and pads only its row
buffer. An average divides by a per-output-pixel count, a table built while
lowering.
Knobs: `algo` (code) — "window": each output pixel reduces its KH x KW window;
"separable": per output row, the KH input rows reduced into a row buffer first
(contiguous, vectorized along the row), then KW strided reads of that row per
output pixel (max and sum are both separable); `owtile` (code) — output pixels
of a row computed together in scalar accumulators (SLP-vectorizable; guarded
tail); `unroll` (code) — the window loops written out; planes per work item and
threading are run-time.
"""
from __future__ import annotations

import numpy as np

from ir.ops.nn import _concrete_pads, _windows
from ir.workload import Workload
from schedules.launch import Buffer, Call, In, Launch, Out, Scalar, Table, Work
from schedules.loopnest import UNROLLED, Alloc, Assign, For, Function, If, LoopModule, Param, thread_share
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Lowered, Template


def _geo(wl: Workload):
    node = wl.nodes()[0]
    x = wl.inputs[0]["shape"]
    strides, dil, pads, outs, extra = _concrete_pads(node, list(x[2:]), list(node.attrs["kernel_shape"]))
    return node, strides, dil, pads, outs, extra


class PoolTemplate(Template):
    name = "pool"
    version = 3   # v2: the default's window loops are loops (unroll=False); the `algo` knob came later
                  # with `before="window"`: a config recorded without it builds the code it built then;
                  # v3: `separable` reads the input in place (no padded plane): its records' times changed

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
            Knob("algo", ("window", "separable"), before="window"),
            Knob("owtile", (1, 4, 8)),
            Knob("unroll", (True, False)),
            Knob("parallel", (True, False), code_shape=False),
            Knob("PB", (1, 4, 16), code_shape=False),
        ])

    def default_config(self, wl: Workload) -> Config:
        """Separable for windows of 9 or more pixels, at any stride and width: reading the input
        rows in place (no padded plane), it ran ResNet's MaxPool 3x3/2 0.50-0.81x as long as the
        window loops from 8- to 112-pixel rows, AveragePool 3x3/2 @56 0.54x, YOLO's SPPF MaxPool
        5x5/1 0.73-0.75x (1 thread, Zen 3, 2026-12-07, experiments/bench_pool.md; before, with
        the padded plane, it lost on rows under 48 pixels). Otherwise 8 pixels of a row at once
        in the window loops: 2x2/2 windows share no column (separable 1.6x as long)."""
        node, _, _, _, _, _ = _geo(wl)
        kh, kw = node.attrs["kernel_shape"]
        algo = "separable" if kh * kw >= 9 else "window"
        return self.space(wl).validate({"algo": algo, "owtile": 8, "unroll": False, "parallel": True, "PB": 4})

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        node, (SH, SW), (DH, DW), pads, outs, extra = _geo(wl)
        KH, KW = node.attrs["kernel_shape"]
        is_max = node.op == "MaxPool"
        tile, unroll = cfg["owtile"], cfg["unroll"]

        kind = UNROLLED if unroll else "serial"

        def block(n: int, ow0: str) -> tuple:
            init = tuple(Assign(f"a{r}", "np.float32(-np.inf)" if is_max else "np.float32(0.0)") for r in range(n))
            loops = (For("kh", "0", str(KH), (
                Assign("ih", f"oh * {SH} + kh * {DH}"),
                For("kw", "0", str(KW), (Assign("iw", f"({ow0}) * {SW} + kw * {DW}"),) + tuple(
                    Assign(f"a{r}", _reduce(is_max, f"a{r}", f"xp[pl, ih, iw + {r * SW}]")) for r in range(n)), kind),
            ), kind),)
            return init + loops + _store(is_max, n, ow0)

        N, C, H, W = wl.inputs[0]["shape"]
        (OH, OW), P = outs, N * C
        hp = max(H + pads[0] + pads[2] + extra[0], (OH - 1) * SH + (KH - 1) * DH + 1)
        wp = max(W + pads[1] + pads[3] + extra[1], (OW - 1) * SW + (KW - 1) * DW + 1)
        separable = cfg["algo"] == "separable"
        if separable:   # reads the input rows in place: no padded plane
            row = _separable_row(is_max, (KH, KW), (SH, SW), (DH, DW), (pads[0], pads[1]), tile, kind)
        else:
            row = _row_tiles(block, tile)
        padded = not separable and (hp, wp) != (H, W)   # else the windows stay inside the input: read it as it is
        pad = _pad_plane(pads[0], pads[1], is_max) if padded else ()
        body = (_row_buffer(is_max, pads[1]) if separable else ()) + (
            thread_share("blk", "(P + PB - 1) // PB", body=(
                For("pl", "blk * PB", "min(P, blk * PB + PB)", pad + (For("oh", "0", "OH", row),)),
            )),
        )
        # the input is `x`; the windows read `xp`: the padded workspace, or the input itself (the separable
        # code reads `x`)
        inputs = ("x", "xp") if padded else ("x",) if separable else ("xp",)
        params = tuple(Param(name, "float32[:, :, ::1]") for name in inputs) + (
            Param("inv", "float32[:, ::1]"), Param("out", "float32[:, :, ::1]"),
            Param("P", "int64"), Param("H", "int64"), Param("W", "int64"), Param("OH", "int64"), Param("OW", "int64"),
            *((Param("WP", "int64"),) if separable else ()),
            Param("PB", "int64"), Param("t", "int64"), Param("T", "int64"))
        module = LoopModule((Function("pool", params, body),),
                            doc=f"pool kernel: {node.op} {KH}x{KW} stride {SH}x{SW} algo={cfg['algo']} owtile={tile} "
                                f"unroll={unroll}",
                            meta={"template": f"pool v{self.version}"})
        x = In(0, (P, H, W), "float32")
        tables = {"inv": np.ones((1, 1), np.float32) if is_max else _inverse_counts(node, (H, W), (KH, KW))}
        step = Call("pool", ((x, Work("xp")) if padded else (x,)) + (
            Table("inv"), Out((P, OH, OW)), *map(Scalar, (P, H, W, OH, OW) + ((wp,) if separable else ()) + (cfg["PB"],))),
            items=-(-P // cfg["PB"]), parallel=cfg["parallel"])
        work = (Buffer("xp", (P, hp, wp)),) if padded else ()
        return Lowered(module, Launch((step,), workspaces=work, tables=tables))


def _reduce(is_max: bool, acc: str, value: str) -> str:
    return f"max({acc}, {value})" if is_max else f"{acc} + {value}"


def _store(is_max: bool, n: int, ow0: str) -> tuple:
    """Accumulators a0 .. a{n-1} into output pixels ow0 .. ow0 + n - 1 of row `oh` (an average
    times its window's inverse count)."""
    return tuple(Assign(f"out[pl, oh, {ow0} + {r}]", f"a{r}" if is_max else f"a{r} * inv[oh, {ow0} + {r}]")
                 for r in range(n))


def _row_tiles(block, tile: int) -> tuple:
    """An output row as tiles of `tile` pixels, `block(n, ow0)` each, then its last pixels one by one."""
    return (For("owt", "0", f"OW // {tile}", block(tile, f"owt * {tile}")),) + (
        (For("ow", f"(OW // {tile}) * {tile}", "OW", block(1, "ow")),) if tile > 1 else ())


def _separable_row(is_max: bool, kernel: tuple, strides: tuple, dil: tuple, pads: tuple, tile: int, kind: str) -> tuple:
    """Output row `oh` of plane `pl` in two passes: the KH input rows of its windows reduced
    element by element into the thread's row buffer `vr` (contiguous: vectorized along the
    row, KH - 1 ops a column where the windows of a row share their columns), then per output
    pixel KW reads of `vr`, `tile` pixels at a time. Per output pixel of a 3x3/2 window:
    (KH - 1) x SW + KW - 1 = 6 ops, half of them in vectors, against KH x KW - 1 = 8 scalar.

    The rows are read from the input in place: `vr` holds a padded row (its pad columns filled
    once, `_row_buffer`), and a window's rows in the pad, which would add the fill, are left out
    of a sum and read as a row inside by a max. Copying each plane padded first took as long as
    the two passes: ResNet-18's MaxPool 3x3/2 @112 348 -> 192 us alone, 1 thread (Zen 3,
    2026-12-07)."""
    (KH, KW), (SH, SW), (DH, DW), (top, left) = kernel, strides, dil, pads
    fill = "np.float32(-np.inf)" if is_max else "np.float32(0.0)"
    col = f"vr[iw + {left}]"
    if is_max:
        # a max takes a row twice as it takes it once: a window's rows in the pad read its first row
        # inside (`rv`) instead, so every output row runs the one loop (on 20-row planes of a 5x5/1
        # pool, 4 rows in 20 are edge rows: the passes over `vr` took it 1.25x as long); a window
        # wholly in the pad (pads as wide as the kernel) is the fill
        rows = (Assign("ih0", f"oh * {SH} - {top}"),
                Assign("rv", f"ih0 if ih0 >= 0 else ih0 + ((-ih0 + {DH - 1}) // {DH}) * {DH}"),
                If(f"rv < H and rv <= ih0 + {(KH - 1) * DH}", tuple(
                    Assign(f"r{kh}", f"ih0 + {kh * DH} if ih0 + {kh * DH} >= 0 and ih0 + {kh * DH} < H else rv")
                    for kh in range(KH)) + (For("iw", "0", "W", (
                        Assign("v", "x[pl, r0, iw]"),
                        *(Assign("v", _reduce(is_max, "v", f"x[pl, r{kh}, iw]")) for kh in range(1, KH)),
                        Assign(col, "v"),
                    )),), (For("iw", "0", "W", (Assign(col, fill),)),)))
    else:   # a sum must not take a row twice: the edge rows add the rows inside one by one
        inside = (For("iw", "0", "W", (
            Assign("v", "x[pl, ih0, iw]"),
            *(Assign("v", _reduce(is_max, "v", f"x[pl, ih0 + {kh * DH}, iw]")) for kh in range(1, KH)),
            Assign(col, "v"),
        )),)
        edge = (For("iw", "0", "W", (Assign(col, fill),)),
                For("kh", "0", str(KH), (
                    Assign("ih", f"ih0 + kh * {DH}"),
                    If("ih >= 0 and ih < H", (For("iw", "0", "W", (Assign(col, _reduce(is_max, col, "x[pl, ih, iw]")),)),)),
                )))
        rows = (Assign("ih0", f"oh * {SH} - {top}"),
                If(f"ih0 >= 0 and ih0 + {(KH - 1) * DH} < H", inside, edge))

    def block(n: int, ow0: str) -> tuple:
        init = tuple(Assign(f"a{r}", f"vr[({ow0} + {r}) * {SW}]") for r in range(n))
        loop = (For("kw", "1", str(KW), tuple(
            Assign(f"a{r}", _reduce(is_max, f"a{r}", f"vr[({ow0} + {r}) * {SW} + kw * {DW}]")) for r in range(n)),
            kind),) if KW > 1 else ()
        return init + loop + _store(is_max, n, ow0)

    return rows + _row_tiles(block, tile)


def _row_buffer(is_max: bool, left: int) -> tuple:
    """The thread's padded row `vr` (WP columns, the input row at `left`): its pad columns
    filled once, since the rows written into it never reach them."""
    fill = "np.float32(-np.inf)" if is_max else "np.float32(0.0)"
    return (Alloc("vr", ("WP",)),
            For("iw", "0", str(left), (Assign("vr[iw]", fill),)),
            For("iw", f"W + {left}", "WP", (Assign("vr[iw]", fill),)))


def _inverse_counts(node, hw, kernel) -> np.ndarray:
    """1 / (input pixels under each output pixel's window), [OH, OW]: what an average divides by."""
    H, W = hw
    st, dl, pd, os_, ex = _concrete_pads(node, [H, W], list(kernel))
    ones = np.ones((1, 1, H, W), np.float32)
    if node.attrs.get("count_include_pad", 0):
        src = np.pad(np.pad(ones, [(0, 0), (0, 0), (pd[0], pd[2]), (pd[1], pd[3])], constant_values=1),
                     [(0, 0), (0, 0), (0, ex[0]), (0, ex[1])])
    else:
        src = np.pad(ones, [(0, 0), (0, 0), (pd[0], pd[2] + ex[0]), (pd[1], pd[3] + ex[1])])
    count = _windows(src, list(kernel), st, dl, os_).sum(axis=(-2, -1))[0, 0]
    return np.ascontiguousarray(1.0 / count, dtype=np.float32)


def _pad_plane(top: int, left: int, is_max: bool) -> tuple:
    """Plane pl of the padded workspace, all of it: the input at (top, left), the fill (-inf for
    max, 0 for average) everywhere else (workspaces start undefined). Written by the thread that
    pools the plane, just before: it is still in cache when the windows read it."""
    fill = "np.float32(-np.inf)" if is_max else "np.float32(0.0)"
    return (
        For("ih", "0", "xp.shape[1]", (
            Assign("h", f"ih - {top}"),
            If("h >= 0 and h < H", (
                For("iw", "0", str(left), (Assign("xp[pl, ih, iw]", fill),)),
                For("w", "0", "W", (Assign(f"xp[pl, ih, w + {left}]", "x[pl, h, w]"),)),
                For("iw", f"W + {left}", "xp.shape[2]", (Assign("xp[pl, ih, iw]", fill),)),
            ), (
                For("iw", "0", "xp.shape[2]", (Assign("xp[pl, ih, iw]", fill),)),
            )),
        )),
    )


register_template(PoolTemplate())

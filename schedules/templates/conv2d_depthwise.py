"""Conv2d's `dw_blocked` algorithm: a depthwise conv vectorized along channels (NCHWc, as
onnxruntime's and TVM's x86 depthwise kernels).

The `depthwise` algorithm vectorizes along the pixels of one channel plane, so small maps
(7x7, 14x14) and strides waste most lanes. Here `pad_nchw8c` regroups the input into blocks of
8 channels (`conv2d_blocked.channel_block`: one AVX2 vector) of zero-bordered planes,
`Xc[n, cbk, (ih * WP + j) * 8 + ci]` (no phase split: a strided conv's channel vectors are
contiguous anyway), and the weights are packed at prepare as `Wp[m, cbk, (kh * KW + kw) * 8 + ci]`
(m: the channel multiplier). The register tile is TP consecutive output pixels of a row x the
block's 8 channels: per tap one weight vector and TP input vectors feed TP FMAs; the kh/kw
loops have constant trip counts, so LLVM unrolls them. Indices are unsigned (np.uint64), so
numba leaves its negative-index tests out of the tile.

Stores: a full tile applies the epilogue to the accumulators and stores, per channel, TP
contiguous pixels of its NCHW row (through `ct`, the scalar store loop took as long as the
FMAs; `ct` written transposed took twice as long, measured). Without residual-like extras (an
input that may be the output buffer itself) a row's last tile ends at the row's end,
overlapping its neighbour, so rows of at least TP pixels store full tiles only; otherwise, and
for a partial last channel block, the pixels past the row read the last pixel's window and
the tile is stored through `ct`. Rows per work item (`PB`) are a run-time knob.
"""
from __future__ import annotations

from schedules.epilogue import Epilogue
from schedules.loopnest import Alloc, Assign, Comment, For, Function, If, Param, unflatten
from schedules.microkernel import F0
from schedules.templates.conv2d_blocked import buffered_store

DWB_TILES = ("4x8", "8x8")   # pixels of an output row x channels of a block


def pack_w_depthwise(cb: int, taps: int) -> Function:
    """W[OC, KH * KW] (OC = C * M, channel c's copies c * M .. c * M + M - 1) into
    Wp[M, NCB, taps * CB]; zeros past the channels; thread t of T packs (m, block) t, t+T, ..."""
    body = (
        Assign("NCB", "Wp.shape[1]"),
        For("it", "t", "M * NCB", step="T", body=(
            Assign("m", "it // NCB"), Assign("cbk", "it % NCB"),
            For("tap", "0", str(taps), (
                For("ci", "0", str(cb), (
                    Assign("c", f"cbk * {cb} + ci"),
                    If("c < C", (Assign(f"Wp[m, cbk, tap * {cb} + ci]", "W[c * M + m, tap]"),),
                       (Assign(f"Wp[m, cbk, tap * {cb} + ci]", F0),)),
                )),
            )),
        )),
    )
    params = (Param("W", "float32[:, ::1]"), Param("Wp", "float32[:, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("C", "M", "t", "T"))
    return Function("pack_w", params, body)


def pad_nchw8c(cb: int) -> Function:
    """X[N, C, H, W] into Xc[N, NCB, HP * WP * CB]: element (ih, j, ci) of block cbk is
    x[n, cbk * CB + ci, ih - PT, j - PL], zero outside the input and past the channels. No
    phase split: channel vectors of a strided conv are contiguous anyway. A full block's row
    is written by one loop over the pixels with the CB channels unrolled (an interleaved store
    group that LLVM vectorizes; the blocked conv's pad, one channel at a time, writes with
    stride CB and took longer than the depthwise kernel itself, measured). Thread t of T
    writes blocks t, t+T, ..."""
    full = (
        Assign("d", f"drow[j0 * {cb}:]"),
        *(Assign(f"s{ci}", f"X[n, cbk * {cb} + {ci}, h, j0 - PL:]") for ci in range(cb)),
        For("jj", "0", "j1 - j0", tuple(Assign(f"d[jj * {cb} + {ci}]", f"s{ci}[jj]") for ci in range(cb))),
    )
    partial = (For("ci", "0", str(cb), (
        Assign("c", f"cbk * {cb} + ci"), Assign("d", f"drow[j0 * {cb} + ci:]"),
        If("c < C", (Assign("srow", "X[n, c, h, j0 - PL:]"), For("jj", "0", "j1 - j0", (Assign(f"d[jj * {cb}]", "srow[jj]"),)),),
           (For("jj", "0", "j1 - j0", (Assign(f"d[jj * {cb}]", F0),)),)),
    )),)
    row = (
        Assign("j0", "min(WP, PL)"), Assign("j1", "max(j0, min(WP, W + PL))"),
        For("q", "0", f"j0 * {cb}", (Assign("drow[q]", F0),)),
        For("q", f"j1 * {cb}", f"WP * {cb}", (Assign("drow[q]", F0),)),
        If(f"cbk * {cb} + {cb} <= C", full, partial),
    )
    body = (
        Assign("NCB", "Xc.shape[1]"),
        For("p", "t", "N * NCB", step="T", body=(
            Assign("n", "p // NCB"), Assign("cbk", "p % NCB"), Assign("xb", "Xc[n, cbk]"),
            For("ih", "0", "HP", (
                Assign("h", "ih - PT"), Assign("drow", f"xb[ih * WP * {cb}:]"),
                If("h >= 0 and h < H", row, (For("q", "0", f"WP * {cb}", (Assign("drow[q]", F0),)),)),
            )),
        )),
    )
    params = (Param("X", "float32[:, :, :, ::1]"), Param("Xc", "float32[:, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("N", "C", "H", "W", "HP", "WP", "PT", "PL", "t", "T"))
    return Function("pad", params, body)


def conv_depthwise(tp: int, geo: dict, epi: Epilogue, cb: int) -> Function:
    """The kernel: work items t, t+T, ... of (n, block, m, PB output rows); per row, tiles of
    TP pixels x CB channels."""
    g = geo
    acc = [[f"c{r}_{q}" for q in range(cb)] for r in range(tp)]
    tap = (
        Assign("xo", f"np.uint64((kh * {g['DH']} * WP + kw * {g['DW']}) * {cb})"),
        Assign("wo", f"np.uint64((kh * {g['KW']} + kw) * {cb})"),
    ) + tuple(Assign(f"w{q}", f"wk[wo + u{q}]") for q in range(cb)) \
        + tuple(Assign(f"i{r}", f"o{r} + xo") for r in range(tp)) \
        + tuple(Assign(acc[r][q], f"xb[i{r} + u{q}] * w{q}", "+") for r in range(tp) for q in range(cb))
    store = buffered_store(epi, f"min({cb}, C - cbk * {cb})", f"(cbk * {cb} + q) * M + m",
                           "out[n, oc, oh, ow0:]", f"min({tp}, OW - ow0)", "oh * OW + ow0 + r")
    fast = ()   # a full tile: the epilogue on the accumulators, per channel TP contiguous stores
    for q in range(cb):
        fast += (Assign(f"oc{q}", f"(cbk * {cb} + {q}) * M + m"), Assign(f"b{q}", f"bias[oc{q}]"),
                 Assign(f"orow{q}", f"out[n, oc{q}, oh]"))
        for r in range(tp):
            fa, fr = epi.emit(f"v{r}_{q}", f"n * OC + oc{q}", f"oh * OW + ow0 + {r}", f"e{r}_{q}_", c=f"oc{q}")
            fast += (Assign(f"v{r}_{q}", f"{acc[r][q]} + b{q}"),) + tuple(Assign(n, e) for n, e in fa) \
                + (Assign(f"orow{q}[uo + u{r}]", fr),)
    # without extras (a residual input could be the output buffer itself), a row's last tile
    # moves left to end at the row's end: it recomputes a few pixels, but stores a full tile
    ow0 = f"min(owt * {tp}, max(0, OW - {tp}))" if not epi.extras else f"owt * {tp}"
    tile = (
        Assign("ow0", ow0),
        *(Assign(f"o{r}", f"np.uint64(rowo + min(ow0 + {r}, OW - 1) * {g['SW'] * cb})") for r in range(tp)),
        *(Assign(acc[r][q], F0) for r in range(tp) for q in range(cb)),
        Comment(f"{tp}x{cb} depthwise tile (pixels x channels of a block), SLP-vectorized along channels"),
        For("kh", "0", str(g["KH"]), (For("kw", "0", str(g["KW"]), tap),)),
        Assign("uo", "np.uint64(ow0)"),
        If(f"ow0 + {tp} <= OW and cbk * {cb} + {cb} <= C", fast,
           tuple(Assign(f"ct[{r}, {q}]", acc[r][q]) for r in range(tp) for q in range(cb)) + store),
    )
    body = (
        Assign("NCB", "Xc.shape[1]"), Assign("OC", "C * M"),
        Assign("n_rb", "(OH + PB - 1) // PB"), Assign("n_owt", f"(OW + {tp - 1}) // {tp}"),
        *(Assign(f"u{q}", f"np.uint64({q})") for q in range(max(cb, tp))),
        Alloc("ct", (str(tp), str(cb))),
        For("it", "t", "N * NCB * M * n_rb", step="T", body=(
            *unflatten("it", (("rb", "n_rb"), ("m", "M"), ("cbk", "NCB")), "n"),
            Assign("xb", "Xc[n, cbk]"), Assign("wk", "Wp[m, cbk]"),
            For("oh", "rb * PB", "min(OH, rb * PB + PB)", (
                Assign("rowo", f"oh * {g['SH']} * WP * {cb}"),
                For("owt", "0", "n_owt", tile),
            )),
        )),
    )
    params = (Param("Xc", "float32[:, :, ::1]"), Param("Wp", "float32[:, :, ::1]"), Param("bias", "float32[::1]")) \
        + tuple(Param(n, t) for n, t in epi.params()) + (Param("out", "float32[:, :, :, ::1]"),) + tuple(
        Param(n, "int64") for n in ("N", "C", "M", "OH", "OW", "WP", "PB", "t", "T"))
    return Function("conv", params, body)

"""Conv2d's `winograd` algorithm: F(2x2, 3x3) for 3x3 stride-1 convs (Lavin & Gray, 2015).

An output tile of 2x2 pixels is A^T [(G g G^T) . (B^T d B)] A for its 4x4 input window d and
the 3x3 kernel g: 16 products per input channel where the direct conv does 36, so the
reduction over the input channels becomes 16 independent GEMMs of 2.25x fewer FMAs in all:

    U[xi][oc, c] = (G g[oc, c] G^T)[xi]        the weights, once at prepare time
    V[xi][c, t]  = (B^T d[c, t] B)[xi]         `wino_input`: per input plane, tiles t along rows
    M[xi][oc, t] = sum_c U[xi][oc, c] V[xi][c, t]   the 1x1 GEMM over the plane (`_gemm_1x1`)
                                                     with 16 groups: V and M are [16 * C, P]
    y[oc, tile]  = A^T M[.][oc, t] A + bias, epilogue   `wino_output`

per image (V and M hold one image's tiles; P >= the tiles, odd: see `conv2d._lower_winograd`).
The transforms' constants are 0, +-1 and 1/2 (F(2x2, 3x3): the one whose float32 rounding stays
within a direct conv's tolerance; F(4x4, 3x3) multiplies 4x less but its transforms scale by up
to 5). The input is first copied zero-bordered (the `pad` step of the direct kernels); the
transforms are vector-IR calls over runs of neighbouring tiles (`codegen.vector_tile`'s
`wino_in_tiles`, `wino_out_tiles`): contiguous loads split into even and odd columns, and stores
interleaved back, by shuffles.
"""
from __future__ import annotations

from schedules.epilogue import Epilogue
from schedules.loopnest import Assign, Call, For, Function, If, Param, thread_share

XI = 16   # transformed planes: the 4x4 input window of a 2x2 output tile


def _f32(e: str) -> str:
    return f"np.float32({e})"


def wino_weights() -> Function:
    """W[OC, C * 9] (3x3 kernels, row-major) into U[xi * OC + oc, c] = (G g G^T)[xi] with
    G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]; thread t of T writes its
    share of the output channels."""
    body = [Assign(f"g{r}{s}", f"W[oc, c * 9 + {r * 3 + s}]") for r in range(3) for s in range(3)]
    # G g: 4 rows of 3
    for s in range(3):
        body += [Assign(f"h0{s}", f"g0{s}"), Assign(f"h1{s}", f"(g0{s} + g1{s} + g2{s}) * {_f32('0.5')}"),
                 Assign(f"h2{s}", f"(g0{s} - g1{s} + g2{s}) * {_f32('0.5')}"), Assign(f"h3{s}", f"g2{s}")]
    # (G g) G^T: each row the same three-to-four map
    for i in range(4):
        cols = (f"h{i}0", f"(h{i}0 + h{i}1 + h{i}2) * {_f32('0.5')}", f"(h{i}0 - h{i}1 + h{i}2) * {_f32('0.5')}",
                f"h{i}2")
        body += [Assign(f"U[{4 * i + j} * OC + oc, c]", e) for j, e in enumerate(cols)]
    params = (Param("W", "float32[:, ::1]"), Param("U", "float32[:, ::1]")) + tuple(
        Param(n, "int64") for n in ("OC", "C", "t", "T"))
    return Function("wino_w", params, (thread_share("oc", "OC", body=(For("c", "0", "C", tuple(body)),)),))


def wino_input(lanes: int) -> Function:
    """For image n: V[0, xi * C + c, th * TW + tw] = (B^T d B)[xi], d the 4x4 window at rows
    2 th .. 2 th + 3 and columns 2 tw .. 2 tw + 3 of the zero-bordered input Xp[n, c, row, 0, column],
    B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]: per plane one pass over its tiles for each row of
    B^T d (4 of V's 16 planes: `wino_in_tiles`), runs of `lanes` tiles a call, a row's last run
    moved left to end at the row's end (some tiles computed twice), or, in rows of fewer tiles,
    run on past the row (its loads: Xp has spare rows at the bottom; its stores: over the next row's
    tiles, which that row's run overwrites, and V's rows have room for the last row's: their length
    is at least P + lanes - TW). Every store a full vector: Zen 3's masked stores took 64->64 @14
    (TW = 7) 65 us against 18 us at 16x16. Thread t of T transforms its share of the image's input planes."""
    passes = tuple(For("th", "0", "TH", (
        Assign("xo", "((n * C + c) * HP + 2 * th) * WP"), Assign("vo", "c * P + th * TW"),
        For("tw", "0", "TW", (
            Assign("ts", f"max(0, min(tw, TW - {lanes}))"),
            Call(f"wino_in_tiles(Xp, xo + 2 * ts, WP, V, vo + ts, C * P, {lanes}, {i}, {lanes})"),),
            step=str(lanes)),
    )) for i in range(4))
    body = (
        thread_share("c", "C", body=(
            Assign("HP", "Xp.shape[2]"), Assign("WP", "Xp.shape[4]"), Assign("P", "V.shape[2]"),
        ) + passes),
    )
    params = (Param("Xp", "float32[:, :, :, :, ::1]"), Param("V", "float32[:, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("n", "C", "TH", "TW", "t", "T"))
    return Function("wino_in", params, body)


def wino_output(epi: Epilogue, lanes: int, padded: bool = False) -> Function:
    """For image n: out[n, oc, (2 th + k) * OW + 2 tw + l] = (A^T m A)[k, l] + bias[oc] for
    m = M[0, xi * OC + oc, th * TW + tw], A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]: runs of `lanes` tiles a `wino_out_tiles`
    call, a row's last run moved left to end at the row's end (masked where the map's width is
    odd: pixels past its last column, and past an odd map's last row, are not stored); then the
    epilogue over the plane (contiguous: LLVM vectorizes it). With a residual input (which may be
    the output buffer itself) the tiles go to the workspace Y (its image yn = 0) and the epilogue
    pass reads it, else Y is the output (yn = n) and the pass runs in place.

    `padded` (maps of fewer than `lanes` tiles a row, whose every run would store masked vectors,
    slow on Zen 3): Y is the workspace of 2 TH rows of YW = 2 `lanes` pixels, every run
    loads `lanes` tiles of M (its rows have room, `conv2d._lower_winograd`) and stores two whole
    rows of 2 `lanes` pixels, and the epilogue pass copies the OH x OW pixels out. Thread t of T
    finishes its share of the image's channels."""
    def row_of_tiles(rows: int) -> tuple:
        count = str(2 * lanes) if padded else f"min({2 * lanes}, OW - 2 * ts)"
        return (For("tw", "0", "TW", (
            Assign("ts", f"max(0, min(tw, TW - {lanes}))"),
            Call(f"wino_out_tiles(M, mo + ts, OC * P, bias, oc, Y, yo + 2 * ts, {'YW' if padded else 'OW'}, {count}, "
                 f"{rows}, {lanes})")), step=str(lanes)),)
    finish = ()
    if padded:
        assigns, result = epi.emit("v", "n * OC + oc", "oh * OW + ow", "e", c="oc")
        finish = (Assign("yrow", "Y[yn, oc]"), Assign("orow", "out[n, oc]"), For("oh", "0", "OH", (
            For("ow", "0", "OW", (Assign("v", "yrow[oh * YW + ow]"),) + tuple(Assign(name, e) for name, e in assigns)
                + (Assign("orow[oh * OW + ow]", result),)),)),)
    elif epi.steps:
        assigns, result = epi.emit("v", "n * OC + oc", "q", "e", c="oc")
        finish = (Assign("yrow", "Y[yn, oc]"), Assign("orow", "out[n, oc]"), For("q", "0", "OH * OW", (
            Assign("v", "yrow[q]"),) + tuple(Assign(name, e) for name, e in assigns) + (Assign("orow[q]", result),)),)
    plane, row = ("2 * TH * YW", "YW") if padded else ("OH * OW", "OW")
    # Y's rows in pairs (padded), or an odd map's last row alone
    tiles = row_of_tiles(2) if padded else (If("2 * th + 1 < OH", row_of_tiles(2), row_of_tiles(1)),)
    body = (
        thread_share("oc", "OC", body=(
            Assign("P", "M.shape[2]"), *((Assign("YW", "Y.shape[2] // (2 * TH)"),) if padded else ()),
            For("th", "0", "TH", (
                Assign("mo", "oc * P + th * TW"), Assign("yo", f"(yn * OC + oc) * {plane} + 2 * th * {row}"),
            ) + tiles),
        ) + finish),
    )
    params = (Param("M", "float32[:, :, ::1]"), Param("bias", "float32[::1]")) + tuple(
        Param(n, t) for n, t in epi.params()) + (Param("Y", "float32[:, :, ::1]"), Param("out", "float32[:, :, ::1]")) \
        + tuple(Param(n, "int64") for n in ("n", "yn", "OC", "OH", "OW", "TH", "TW", "t", "T"))
    return Function("wino_out", params, epi.prelude() + body)

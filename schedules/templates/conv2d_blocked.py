"""Conv2d's `blocked` algorithm: an NCHWc-style direct convolution (as TVM's x86 schedules).

The input is repacked once per call into channel blocks, `Xc[n, g * NCB + cb, q]` with q the
flat index of `(ih, phase, j, ci)` over the zero-bordered, phase-split plane of CB channels
(the pad step copies the input anyway, so the layout change is free); the weights are packed
at prepare time into `Wp[g, oc_tile, k, 0:NR]` with k running over (cb, kh, kw, ci), so the
kernel streams them in order. The register tile is MR pixels x NR output channels, vectors
along the channels: per k, MR broadcasts of input values and NR/8 vector loads of weights
feed MR*NR/8 FMAs, and the reduction over the CB channels of a block is the innermost,
constant-length loop. The tile's pixels are consecutive pixels of the flattened output
plane (they may cross rows): a pixel's offset into the block plane separates from the tap's
offset, so each pixel gets one base offset per tile, and tiny maps (7x7, 14x14) waste no
lanes on the row's end. Pixels past the plane read the last pixel's window and are not stored.

The tile is written either as unrolled scalar locals that LLVM's SLP pass vectorizes
(`tile_code` "slp", `register_tile`) or as calls of the vector-IR tile
(`codegen.vector_tile.tile_fma`, "vec<lanes>"): one call per contiguous run of the reduction
(the CB channels of one tap, or a whole kernel row of taps where the phase-split plane makes
a row's taps adjacent: dilation == stride), the first call storing into the scratch tile
`ct`, the others adding to it; the store loop is the same for both.
"""
from __future__ import annotations

from schedules.epilogue import Epilogue
from schedules.loopnest import Alloc, Assign, For, Function, If, Param, unflatten
from schedules.microkernel import F0, register_tile, vector_tile

MAX_CB = 8   # channels per block: the innermost loop's length
DEFAULT_VECTOR_IR = False   # the untuned tile_code of blocked convs: "vec<lanes>" (True) or "slp"


def channel_block(cg: int) -> int:
    """Channels per block: a code constant (with a run-time block length the kernel's
    inner loop kept its base pointers on the stack, measured), so one for every channel
    count; convs of fewer channels pad with zeros (the heuristic leaves those to `direct`)."""
    return MAX_CB


def pack_w_blocked(nr: int, cb: int, kh: int, kw: int) -> Function:
    """W[OC, Cg * KH * KW] into Wp[g, oc_tile, k, 0:NR], k = ((cbk * KH + kh) * KW + kw) * CB + ci
    for input channel cbk * CB + ci; zeros past the group's channels (both kinds); thread t of
    T packs panels t, t+T, ..."""
    taps = kh * kw
    body = (
        Assign("n_oct", f"(OCg + {nr - 1}) // {nr}"), Assign("KB", f"NCB * {taps * cb}"),
        For("it", "t", "G * n_oct", step="T", body=(
            Assign("g", "it // n_oct"), Assign("oct", "it % n_oct"),
            For("k", "0", "KB", (
                Assign("ci", f"k % {cb}"), Assign("tap", f"(k // {cb}) % {taps}"), Assign("cbk", f"k // {taps * cb}"),
                Assign("c", f"cbk * {cb} + ci"),
                For("q", "0", str(nr), (
                    Assign("oc", f"oct * {nr} + q"),
                    If("oc < OCg and c < Cg", (Assign("Wp[g, oct, k, q]", f"W[g * OCg + oc, c * {taps} + tap]"),),
                       (Assign("Wp[g, oct, k, q]", F0),)),
                )),
            )),
        )),
    )
    params = (Param("W", "float32[:, ::1]"), Param("Wp", "float32[:, :, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("G", "OCg", "Cg", "NCB", "t", "T"))
    return Function("pack_w", params, body)


def pad_blocked(s: int, cb: int) -> Function:
    """X[N, C, H, W] into Xc[N, G * NCB, HP * S * WQ * CB]: element (ih, ph, j, ci) of block
    (g, cbk) is x[n, g * Cg + cbk * CB + ci, ih - PT, j * S + ph - PL], zero outside the input
    and past the group's channels (a workspace holds garbage, so every element is written).
    Thread t of T writes blocks t, t+T, ... Rows are read through views indexed from 0 (a
    negative index would cost numba's wraparound test per element)."""
    copy = "srow[jj]" if s == 1 else f"srow[jj * {s}]"
    row = (
        Assign("j0", f"min(WQ, max(0, (PL - ph + {s - 1}) // {s}))"),
        Assign("j1", f"max(j0, min(WQ, (W + PL - ph + {s - 1}) // {s}))"),
        For("j", "0", "j0", (Assign(f"drow[j * {cb}]", F0),)),
        Assign("d", f"drow[j0 * {cb}:]"), Assign("srow", f"xsrc[h, j0 * {s} + ph - PL:]"),
        For("jj", "0", "j1 - j0", (Assign(f"d[jj * {cb}]", copy),)),
        For("j", "j1", "WQ", (Assign(f"drow[j * {cb}]", F0),)),
    )
    plane = (
        Assign("xsrc", "X[n, g * Cg + c]"),
        For("ih", "0", "HP", (
            Assign("h", "ih - PT"),
            For("ph", "0", str(s), (
                Assign("drow", f"xb[(ih * {s} + ph) * WQ * {cb} + ci:]"),
                If("h >= 0 and h < H", row, (For("j", "0", "WQ", (Assign(f"drow[j * {cb}]", F0),)),)),
            )),
        )),
    )
    body = (
        Assign("Cg", "C // G"), Assign("NB", "Xc.shape[1]"), Assign("NCB", "NB // G"),
        For("p", "t", "N * NB", step="T", body=(
            Assign("n", "p // NB"), Assign("gb", "p % NB"), Assign("g", "gb // NCB"), Assign("cbk", "gb % NCB"),
            Assign("xb", "Xc[n, gb]"),
            For("ci", "0", str(cb), (
                Assign("c", f"cbk * {cb} + ci"),
                If("c < Cg", plane, (For("q", "0", f"HP * {s} * WQ", (Assign(f"xb[q * {cb} + ci]", F0),)),)),
            )),
        )),
    )
    params = (Param("X", "float32[:, :, :, ::1]"), Param("Xc", "float32[:, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("N", "C", "G", "H", "W", "HP", "WQ", "PT", "PL", "t", "T"))
    return Function("pad", params, body)


def buffered_store(epi: Epilogue, channels: str, oc: str, row: str, pixels: str, pixel: str) -> tuple:
    """Store a tile held in `ct[pixel r, channel q]` with bias and epilogue: for q < `channels`,
    output channel `oc` gets `pixels` contiguous outputs through the view `row` (a view from the
    tile's first pixel: no negative-index tests); `pixel` is r's flat index in the plane."""
    assigns, result = epi.emit("v", "n * OC + oc", pixel, "e", c="oc")
    return (For("q", "0", channels, (
        Assign("oc", oc), Assign("bo", "bias[oc]"), Assign("orow", row),
        For("r", "0", pixels, (
            Assign("v", "ct[r, q] + bo"),
        ) + tuple(Assign(n, e) for n, e in assigns) + (Assign("orow[r]", result),)),
    )),)


def vector_tile_runs(mr: int, nr: int, geo: dict, cb: int, lanes: int) -> tuple:
    """The tile as `tile_fma` calls into `ct` (int64 pixel offsets `o{r}`, see `conv_blocked`):
    per (block, kernel row), one call over the row's KW * CB contiguous (tap, channel) pairs
    where dilation == stride (the taps' columns are then neighbouring columns of one phase
    plane, and the packed weights run over (kw, ci) in the same order), else one per tap
    over its CB channels. The first call stores the tile, the others add to it."""
    g, s = geo, geo["SW"]
    whole_row = g["DW"] == s
    n_k = g["KW"] * cb if whole_row else cb
    call = vector_tile("xb", [f"o{r} + xo" for r in range(mr)], "1", "Wk", f"kb * {nr}", str(nr), str(n_k),
                       "ct", "0", str(nr), "first == 0", nr, lanes)
    run = (
        Assign("xo", f"((kh * {g['DH'] * s} + (kw * {g['DW']}) % {s}) * WQ + (kw * {g['DW']}) // {s}) * {cb}"),
        Assign("kb", f"((cbk * {g['KH']} + kh) * {g['KW']} + kw) * {cb}"),
        call, Assign("first", "0"))
    inner = (Assign("kw", "0"),) + run if whole_row else (For("kw", "0", str(g["KW"]), run),)
    return (Assign("first", "1"), For("cbk", "0", "NCB", (
        Assign("xb", "Xc[n, g * NCB + cbk]"),
        For("kh", "0", str(g["KH"]), inner),
    )))


def conv_blocked(mr: int, nr: int, order: str, geo: dict, epi: Epilogue, cb: int, lanes: int | None = None) -> Function:
    """The kernel: work items t, t+T, ... of (n, g, OC block of OCB tiles, pixel block of PB
    tiles); per tile, MR pixel offsets, then the register tile over (cb, kh, kw, ci): SLP
    scalar locals (`lanes` None) or `tile_fma` calls of that many lanes (`vector_tile_runs`)."""
    g, s = geo, geo["SW"]

    def k_loops(body):
        return (For("cbk", "0", "NCB", (
            Assign("xb", "Xc[n, g * NCB + cbk]"),
            For("kh", "0", str(g["KH"]), (
                For("kw", "0", str(g["KW"]), (
                    Assign("xo", f"((kh * {g['DH'] * s} + (kw * {g['DW']}) % {s}) * WQ + (kw * {g['DW']}) // {s}) * {cb}"),
                    Assign("kb", f"((cbk * {g['KH']} + kh) * {g['KW']} + kw) * {cb}"),
                    For("ci", "0", str(cb), (Assign("xi", "np.uint64(xo + ci)"), Assign("k", "np.uint64(kb + ci)")) + body),
                )),
            )),
        )),)

    # uint64 offsets for the scalar tile (no wraparound selects); int64 for tile_fma's
    # arguments (uint64 + int64 is a float in numba)
    cast = "np.uint64" if lanes is None else ""
    offsets = tuple(
        s_ for r in range(mr) for s_ in (
            Assign(f"pp{r}", f"min(p0 + {r}, P - 1)"),
            Assign(f"o{r}", f"{cast}(((pp{r} // OW) * {g['SH'] * s} * WQ + pp{r} % OW) * {cb})"))
    )
    # the store: per output channel, the tile's pixels are a contiguous run of its plane
    # (written through a view from p0: no negative-index tests)
    store = buffered_store(epi, f"min({nr}, OCg - oct * {nr})", f"g * OCg + oct * {nr} + q",
                           "out[n, oc, p0:]", f"min({mr}, P - p0)", "p0 + r")
    head = (Assign("p0", f"pt * {mr}"), Assign("Wk", "Wp[g, oct]")) + offsets
    if lanes is None:
        tile = head + register_tile(
            mr, nr, lambda r: f"xb[o{r} + xi]", lambda q: f"Wk[k, {q}]", k_loops, (),
            comment=f"{mr}x{nr} register tile (pixels x output channels) over {cb}-channel blocks, "
                    f"SLP-vectorized along channels")[:-1] + store   # [:-1]: its per-row store loop (empty here)
    else:
        tile = head + vector_tile_runs(mr, nr, geo, cb, lanes) + store
    oc_loop = ("oct", "ob * OCB", "min(n_oct, ob * OCB + OCB)")
    px_loop = ("pt", "pb * PB", "min(n_pt, pb * PB + PB)")
    outer, inner = (oc_loop, px_loop) if order == "oc_px" else (px_loop, oc_loop)
    body = (
        Assign("OCg", "OC // G"), Assign("NCB", "Xc.shape[1] // G"), Assign("P", "OH * OW"),
        Assign("n_oct", f"(OCg + {nr - 1}) // {nr}"), Assign("n_ob", "(n_oct + OCB - 1) // OCB"),
        Assign("n_pt", f"(P + {mr - 1}) // {mr}"), Assign("n_pb", "(n_pt + PB - 1) // PB"),
        Alloc("ct", (str(mr), str(nr))),
        For("it", "t", "N * G * n_ob * n_pb", step="T", body=(
            *unflatten("it", (("pb", "n_pb"), ("ob", "n_ob"), ("g", "G")), "n"),
            For(*outer, body=(For(*inner, body=tile),)),
        )),
    )
    params = (Param("Xc", "float32[:, :, ::1]"), Param("Wp", "float32[:, :, :, ::1]"), Param("bias", "float32[::1]")) \
        + tuple(Param(n, t) for n, t in epi.params()) + (Param("out", "float32[:, :, ::1]"),) + tuple(
        Param(n, "int64") for n in ("N", "OC", "G", "OH", "OW", "WQ", "OCB", "PB", "t", "T"))
    return Function("conv", params, body)

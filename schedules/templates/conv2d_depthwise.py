"""Conv2d's depthwise kernels: `dw_blocked`, vectorized along channels (NCHWc, as
onnxruntime's and TVM's x86 depthwise kernels), `depthwise` (`conv_depthwise_rows`,
`conv_depthwise_vector`), vectorized along the pixels of a row of the NCHW planes as they are,
and `dw_plane` (`conv_depthwise_plane`, at the end), the same at stride 1 or 2 along the rows,
reading the input plane itself.

The `depthwise` algorithm vectorizes along the pixels of one channel plane, so small maps
(7x7, 14x14) and strides waste most lanes. Here the kernel regroups the input into blocks of
CB channels (the tile's: 8, one AVX2 vector; on AVX-512 also 16, one zmm, `DWB_TILES_BY_SHAPE`)
of zero-bordered rows, one band of PB output rows (plus the window's halo rows) at a time into a thread-local buffer
`xb[(r * WP + j) * CB + ci]` that stays in cache (`fill_band`; no phase split: a strided conv's
channel vectors are contiguous anyway). A separate pad pass over the whole map took 33-55 %
of a layer (it wrote the regrouped map to memory and the kernel read it back). The weights
are packed at prepare as `Wp[m, cbk, (kh * KW + kw) * CB + ci]`
(m: the channel multiplier). The register tile is TP consecutive output pixels of a row x the
block's CB channels: per tap one weight vector and TP input vectors feed TP FMAs; the kh/kw
loops have constant trip counts, so LLVM unrolls them. Indices are unsigned (np.uint64), so
numba leaves its negative-index tests out of the tile.

Stores: a full tile applies the epilogue to the accumulators and stores, per channel, TP
contiguous pixels of its NCHW row (through `ct`, the scalar store loop took as long as the
FMAs; `ct` written transposed took twice as long, measured). Without residual-like extras (an
input that may be the output buffer itself) a row's last tile ends at the row's end,
overlapping its neighbour, so rows of at least TP pixels store full tiles only; otherwise, and
for a partial last channel block, the pixels past the row read the last pixel's window and
the tile is stored through `ct`. Rows per band (`PB`, a work item) are a run-time knob;
the output is read and written through flat per-image views (no view per channel row).
With tile_code vec<lanes> (the AVX2 default) a full tile is instead one `block_taps` call
(`codegen.vector_tile`): the same FMAs in registers, the epilogue on the accumulators, and the
per-channel stores as one 8x8 (or 16x16) shuffle transpose, where LLVM had built the SLP tile's
from ~15 inserts and blends a stored vector.
"""
from __future__ import annotations

from schedules.epilogue import NO_CLAMP, Epilogue
from schedules.loopnest import Alloc, Assign, Call, Comment, For, Function, If, Param, thread_share, unflatten
from schedules.microkernel import F0, pick_tiles, vector_shape
from schedules.templates.conv2d_blocked import buffered_store

DWB_TILES = ("4x8", "8x8")   # pixels of an output row x channels of a block (AVX2: one ymm a pixel)
# per vector shape ((lanes, registers): `schedules.microkernel.vector_shape`, `pick_tiles`): on
# AVX-512 a block of 16 channels is one zmm a pixel (8-channel blocks fill half of one); 7 pixels
# divide MobileNetV2's rows (112 .. 7). 14x16, 16x16, 28x16 (up to 28 of the 32 registers) and 7x8
# were never faster than these (the regroup and the transposing stores, not the FMAs, bound the
# kernel) and 14x16 compiles in 5.6 s CPU against 3.0 for 7x16 (Xeon, 2026-12-02)
DWB_TILES_BY_SHAPE = {(8, 16): DWB_TILES, (16, 32): DWB_TILES + ("7x16", "8x16")}
DWB_ALL_TILES = tuple(dict.fromkeys(t for ts in DWB_TILES_BY_SHAPE.values() for t in ts))


def dwb_tiles(target=None) -> tuple:
    """The `dw_blocked` tiles (pixels x channels of a block) for the target's vector shape."""
    return pick_tiles(DWB_TILES_BY_SHAPE, *vector_shape(target))


def dwb_default_tile(c: int, ow: int, target=None) -> str:
    """The untuned `dw_blocked` tile: 8 pixels a tile where a row holds 8 (its last tile
    overlaps), else 4, x 8 channels (AVX2's ymm; measured, experiments/bench_conv.md). On
    AVX-512, rows of 7 pixels (MobileNetV2's 960@7 and 576@14/2) of whole 16-channel blocks: one
    7x16 tile a row, 1.25-1.3x faster than 4x8 (7x8: no faster, so it is the zmm blocks). On wider
    rows 16-channel blocks were no faster: regrouping 16 planes per block stays scalar where 8
    vectorize (LLVM's store groups), and it outweighs the FMAs saved (Xeon, 2026-12-02,
    experiments/bench_depthwise.py)."""
    if vector_shape(target)[0] >= 16 and ow == 7 and c % 16 == 0:
        return "7x16"
    return "8x8" if ow >= 8 else "4x8"


def pack_w_depthwise(cb: int, taps: int) -> Function:
    """W[OC, KH * KW] (OC = C * M, channel c's copies c * M .. c * M + M - 1) into
    Wp[M, NCB, taps * CB]; zeros past the channels; thread t of T packs its share of (m, block)"""
    body = (
        Assign("NCB", "Wp.shape[1]"),
        thread_share("it", "M * NCB", body=(
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


def fill_band(cb: int, geo: dict) -> tuple:
    """Statements writing the band's input rows into the thread-local `xb` (rows ih0 .. ih0 +
    nrows - 1 of the zero-bordered plane, WP pixels x CB channels each), from the image's flat
    input `xn` ([C * H * W]). Every index is unsigned (no wraparound tests) and no row is
    sliced into a view (each view costs an NRT incref and decref: with 8 per row the pad step
    took 2 cycles an element, measured); a full block's row is one `regroup_channels` call
    (CB x CB transposes in registers: as a scalar loop, which LLVM vectorized with scatters,
    MobileNetV2's 96-channel 3x3/2 dw @48 took 0.073 ms on Zen 4), its last pixels included (masked)."""
    full = (Assign("jd", f"regroup_channels(xn, sb, H * W, xb, db, j1 - j0, {cb}, 1)"),)
    partial = (For("ci", "0", str(cb), (
        Assign("c", f"cbk * {cb} + ci"), Assign("uc", "np.uint64(ci)"),
        If("c < C", (Assign("sc", "sb + np.uint64(ci * H * W)"),
                     For("jj", "0", "j1 - j0", (Assign(f"xb[db + np.uint64(jj * {cb}) + uc]", "xn[sc + np.uint64(jj)]"),))),
           (For("jj", "0", "j1 - j0", (Assign(f"xb[db + np.uint64(jj * {cb}) + uc]", F0),)),)),
    )),)
    row = (
        For("q", "0", f"j0 * {cb}", (Assign("xb[np.uint64(d0 + q)]", F0),)),
        For("q", f"j1 * {cb}", f"WP * {cb}", (Assign("xb[np.uint64(d0 + q)]", F0),)),
        Assign("sb", f"np.uint64(max(0, (cbk * {cb} * H + h) * W + j0 - PL))"),
        Assign("db", f"np.uint64(d0 + j0 * {cb})"),
        If(f"cbk * {cb} + {cb} <= C", full, partial),
    )
    return (
        Assign("j0", "min(WP, PL)"), Assign("j1", "max(j0, min(WP, W + PL))"),
        For("r", "0", f"(oh1 - 1 - oh0) * {geo['SH']} + {(geo['KH'] - 1) * geo['DH'] + 1}", (
            Assign("h", f"oh0 * {geo['SH']} + r - PT"), Assign("d0", f"r * WP * {cb}"),
            If("h >= 0 and h < H", row, (For("q", "0", f"WP * {cb}", (Assign("xb[np.uint64(d0 + q)]", F0),)),)),
        )),
    )


def conv_depthwise(tp: int, geo: dict, epi: Epilogue, cb: int, vector: bool = False, full: bool = False) -> Function:
    """The kernel: copy t of T's share of the work items of (n, block, band of PB output rows); per item the
    band's input rows into the thread-local `xb` (`fill_band`: it stays in cache, where a
    separate pad pass wrote the whole regrouped map to memory and the kernel read it back),
    then per channel multiplier m and output row, tiles of TP pixels x CB channels.

    `vector` (tile_code vec<lanes>; one channel copy per input channel, no residual extra): a
    full tile is one `codegen.vector_tile.block_taps` call (Relu, ReLU6 or HardSwish in
    registers, the transposed stores as vector shuffles), any other epilogue run over its
    stored pixels after; the SLP tile stays for partial tiles, and is left out where every tile is full
    (`full`: whole channel blocks, rows of at least TP pixels)."""
    g = geo
    acc = [[f"c{r}_{q}" for q in range(cb)] for r in range(tp)]
    tap = (
        Assign("xo", f"np.uint64((kh * {g['DH']} * WP + kw * {g['DW']}) * {cb})"),
        Assign("wo", f"np.uint64((kh * {g['KW']} + kw) * {cb})"),
    ) + tuple(Assign(f"w{q}", f"wk[wo + u{q}]") for q in range(cb)) \
        + tuple(Assign(f"i{r}", f"o{r} + xo") for r in range(tp)) \
        + tuple(Assign(acc[r][q], f"xb[i{r} + u{q}] * w{q}", "+") for r in range(tp) for q in range(cb))
    store = buffered_store(epi, f"min({cb}, C - cbk * {cb})", f"(cbk * {cb} + q) * M + m",
                           "oimg[(oc * OH + oh) * OW + ow0:]", f"min({tp}, OW - ow0)", "oh * OW + ow0 + r")
    fast = ()   # a full tile: the epilogue on the accumulators, per channel TP contiguous stores
    for q in range(cb):
        fast += (Assign(f"oc{q}", f"(cbk * {cb} + {q}) * M + m"), Assign(f"b{q}", f"bias[oc{q}]"),
                 Assign(f"ob{q}", f"np.uint64((oc{q} * OH + oh) * OW + ow0)"))
        for r in range(tp):
            fa, fr = epi.emit(f"v{r}_{q}", f"n * OC + oc{q}", f"oh * OW + ow0 + {r}", f"e{r}_{q}_", c=f"oc{q}")
            fast += (Assign(f"v{r}_{q}", f"{acc[r][q]} + b{q}"),) + tuple(Assign(n, e) for n, e in fa) \
                + (Assign(f"oimg[ob{q} + u{r}]", fr),)
    # without a residual (which could be the output buffer itself), a row's last tile
    # moves left to end at the row's end: it recomputes a few pixels, but stores a full tile
    ow0 = f"min(owt * {tp}, max(0, OW - {tp}))" if not epi.reads_output_sized else f"owt * {tp}"
    slp = (
        *(Assign(acc[r][q], F0) for r in range(tp) for q in range(cb)),
        Comment(f"{tp}x{cb} depthwise tile (pixels x channels of a block), SLP-vectorized along channels"),
        For("kh", "0", str(g["KH"]), (For("kw", "0", str(g["KW"]), tap),)),
    )
    partial = tuple(Assign(f"ct[{r}, {q}]", acc[r][q]) for r in range(tp) for q in range(cb)) + store
    full_tile = f"ow0 + {tp} <= OW and cbk * {cb} + {cb} <= C"
    lo, hi = epi.clamp_bounds() or NO_CLAMP   # the vector tile's bounds, read once per call
    if not vector:   # the accumulators before the branch: both stores read them
        tail = slp + (If(full_tile, fast, partial),)
    elif full:       # every tile full: no SLP code at all
        tail = _block_taps_tile(tp, cb, g, epi)
    else:
        tail = (If(full_tile, _block_taps_tile(tp, cb, g, epi), slp + partial),)
    tile = (
        Assign("ow0", ow0),
        *(Assign(f"o{r}", f"np.uint64(rowo + min(ow0 + {r}, OW - 1) * {g['SW'] * cb})") for r in range(tp)),
        *tail,
    )
    band_rows = f"(min(PB, OH) - 1) * {g['SH']} + {(g['KH'] - 1) * g['DH'] + 1}"
    body = (
        Assign("NCB", f"(C + {cb - 1}) // {cb}"), Assign("OC", "C * M"),
        Assign("n_rb", "(OH + PB - 1) // PB"), Assign("n_owt", f"(OW + {tp - 1}) // {tp}"),
        *(Assign(f"u{q}", f"np.uint64({q})") for q in range(max(cb, tp))),
        Alloc("ct", (str(tp), str(cb))), Alloc("xb", (f"({band_rows}) * WP * {cb}",)),
        *((Assign("lo", lo), Assign("hi", hi)) if vector else ()),
        thread_share("it", "N * NCB * n_rb", body=(
            *unflatten("it", (("rb", "n_rb"), ("cbk", "NCB")), "n"),
            Assign("oh0", "rb * PB"), Assign("oh1", "min(OH, oh0 + PB)"),
            Assign("xn", "X[n]"), Assign("oimg", "out[n]"),
            *fill_band(cb, g),
            For("m", "0", "M", (
                Assign("wk", "Wp[m, cbk]"),
                For("oh", "oh0", "oh1", (
                    Assign("rowo", f"(oh - oh0) * {g['SH']} * WP * {cb}"),
                    For("owt", "0", "n_owt", tile),
                )),
            )),
        )),
    )
    params = (Param("X", "float32[:, ::1]"), Param("Wp", "float32[:, :, ::1]"), Param("bias", "float32[::1]")) \
        + tuple(Param(n, t) for n, t in epi.params()) + (Param("out", "float32[:, ::1]"),) + tuple(
        Param(n, "int64") for n in ("N", "C", "M", "H", "W", "OH", "OW", "WP", "PT", "PL", "PB", "t", "T"))
    return Function("conv", params, epi.prelude() + body)


def _block_taps_tile(tp: int, cb: int, g: dict, epi: Epilogue) -> tuple:
    """A full `dw_blocked` tile as one `block_taps` call (channel multiplier 1: output channel =
    input channel), stored into the NCHW rows of the block's channels; an epilogue other than
    Relu/ReLU6 (`Epilogue.clamp_bounds`) or HardSwish (`Epilogue.hard_swish`), which the call
    applies in registers, then runs over those TP x CB stored pixels in place."""
    offsets = ", ".join(f"o{r}" for r in range(tp))
    swish = int(epi.hard_swish)
    out = (Assign("ob", f"(cbk * {cb} * OH + oh) * OW + ow0"),
           Call(f"block_taps(xb, ({offsets},), {g['DH']} * WP * {cb}, Wp, cbk * {g['KH'] * g['KW'] * cb}, "
                f"bias, cbk * {cb}, oimg, ob, OH * OW, lo, hi, {g['KH']}, {g['KW']}, {g['DW']}, {cb}, {swish})"))
    if epi.clamp_bounds() is not None or swish:
        return out
    assigns, result = epi.emit("v", "n * OC + oc", "oh * OW + ow0 + r", "e", c="oc")
    return out + (For("q", "0", str(cb), (
        Assign("oc", f"cbk * {cb} + q"), Assign("uq", "np.uint64(ob + q * OH * OW)"),
        For("r", "0", str(tp), (Assign("ur", "uq + np.uint64(r)"), Assign("v", "oimg[ur]"))
            + tuple(Assign(n, e) for n, e in assigns) + (Assign("oimg[ur]", result),)),
    )),)


def pad_plane_flat(geo: dict) -> tuple:
    """Statements copying input plane `ic` of the image's flat input `xn` ([C * H * W]) into
    the interior of the thread-local zero-bordered, phase-split plane `xp[(ih * S + ph) * WQ +
    j]` = x[ih - PT, j * S + ph - PL] (S: the stride along W). The border is the same for every
    plane, so it is zeroed once per call (`zero_plane`) and a plane costs only its rows' copies
    (the per-row zero loops took as long as the copies, measured). A row is copied in groups of
    S consecutive input columns, one to each phase (an interleaved load group, which LLVM
    vectorizes as loads and shuffles; a loop per phase reading every S-th column stayed scalar,
    1.5x slower than the whole `dw_blocked` conv at stride 2, measured), from the first column
    `c0` that lands in phase 0; the few columns before and after run one by one. Flat unsigned
    indices, no views (each view is an NRT incref and decref)."""
    s = geo["SW"]
    group = tuple(Assign(f"xp[ud + np.uint64({e}) * uq + uk]", f"xn[us + uk * np.uint64({s}) + np.uint64({e})]")
                  for e in range(s))
    one = (Assign("pc", "c + PL"),
           If(f"pc // {s} < WQ", (Assign(f"xp[np.uint64(((h + PT) * {s} + pc % {s}) * WQ + pc // {s})]",
                                         "xn[np.uint64((ic * H + h) * W + c)]"),)))
    return (
        Assign("c0", f"({s} - PL % {s}) % {s}"), Assign("jb", f"(c0 + PL) // {s}"),
        Assign("kn", f"max(0, min((W - c0) // {s}, WQ - jb))"), Assign("uq", "np.uint64(WQ)"),
        For("h", "max(0, -PT)", "min(H, HP - PT)", (
            Assign("us", "np.uint64((ic * H + h) * W + c0)"),
            Assign("ud", f"np.uint64((h + PT) * {s} * WQ + jb)"),
            For("k", "0", "kn", (Assign("uk", "np.uint64(k)"),) + group),
            *((For("c", "0", "min(c0, W)", one),) if s > 1 else ()),
            For("c", f"c0 + kn * {s}", "W", one),
        )),
    )


def zero_plane(geo: dict) -> tuple:
    """The thread-local plane `xp` all zeros, once per call: `pad_plane_flat` writes only the
    interior, the same positions for every plane."""
    return (For("q", "0", f"HP * {geo['SW']} * WQ", (Assign("xp[np.uint64(q)]", F0),)),)


def conv_depthwise_rows(mr: int, nr: int, geo: dict, epi: Epilogue) -> Function:
    """The `depthwise` kernel: NCHW as it is, vectors along the pixels of an output row (no
    regroup into channel blocks). Copy t of T's share of the work items of (n, input plane); per item the plane
    into the thread-local zero-bordered `xp` (`pad_plane_flat`: a row copy, in cache), then per
    channel multiplier m tiles of MR output rows x NR pixels of scalar accumulators: per tap one
    weight (a broadcast scalar) and MR contiguous runs of NR pixels, the kh/kw loops unrolled
    (constant trip counts, so the phase and offset of each tap fold to constants).

    Stores as `conv_depthwise`: a full tile applies the epilogue to the accumulators and stores
    per row NR contiguous pixels at flat unsigned indices; without extras (a residual input may be
    the output buffer itself) the last tile of a row, and the last row tile, move back to end at
    the plane's edge (recomputing a few pixels) so that planes of at least MR x NR store full
    tiles only; smaller planes store through `ct`."""
    g = geo
    s = g["SW"]
    acc = [[f"c{r}_{q}" for q in range(nr)] for r in range(mr)]
    tap = (
        Assign("xo", f"np.uint64((kh * {g['DH'] * s} + (kw * {g['DW']}) % {s}) * WQ + (kw * {g['DW']}) // {s})"),
        Assign("wv", f"wk[np.uint64(kh * {g['KW']} + kw)]"),
    ) + tuple(Assign(f"i{r}", f"o{r} + xo") for r in range(mr)) \
        + tuple(Assign(acc[r][q], f"xp[i{r} + u{q}] * wv", "+") for r in range(mr) for q in range(nr))
    fast = ()
    for r in range(mr):
        fast += (Assign(f"ob{r}", f"np.uint64((oc * OH + oh0 + {r}) * OW + ow0)"),)
        for q in range(nr):
            fa, fr = epi.emit(f"v{r}_{q}", "n * OC + oc", f"(oh0 + {r}) * OW + ow0 + {q}", f"e{r}_{q}_", c="oc")
            fast += (Assign(f"v{r}_{q}", f"{acc[r][q]} + bo"),) + tuple(Assign(n, e) for n, e in fa) \
                + (Assign(f"oimg[ob{r} + u{q}]", fr),)
    assigns, result = epi.emit("v", "n * OC + oc", "oh * OW + ow0 + q", "e", c="oc")
    slow = tuple(Assign(f"ct[{r}, {q}]", acc[r][q]) for r in range(mr) for q in range(nr)) + (
        For("r", "0", f"min({mr}, OH - oh0)", (
            Assign("oh", "oh0 + r"), Assign("orow", "oimg[(oc * OH + oh) * OW + ow0:]"),
            For("q", "0", f"min({nr}, OW - ow0)", (Assign("v", "ct[r, q] + bo"),)
                + tuple(Assign(n, e) for n, e in assigns) + (Assign("orow[q]", result),)),
        )),)
    back = not epi.reads_output_sized
    tile = (
        Assign("ow0", f"min(owt * {nr}, max(0, OW - {nr}))" if back else f"owt * {nr}"),
        *(Assign(f"o{r}", f"np.uint64((oh0 + {r}) * {g['SH'] * s} * WQ + ow0)") for r in range(mr)),
        *(Assign(acc[r][q], F0) for r in range(mr) for q in range(nr)),
        Comment(f"{mr}x{nr} depthwise tile (rows x pixels), SLP-vectorized along the pixels of a row"),
        For("kh", "0", str(g["KH"]), (For("kw", "0", str(g["KW"]), tap),)),
        If(f"oh0 + {mr} <= OH and ow0 + {nr} <= OW", fast, slow),
    )
    body = (
        Assign("M", "OC // C"),
        Assign("n_ht", f"(OH + {mr - 1}) // {mr}"), Assign("n_owt", f"(OW + {nr - 1}) // {nr}"),
        *(Assign(f"u{q}", f"np.uint64({q})") for q in range(nr)),
        Alloc("ct", (str(mr), str(nr))), Alloc("xp", (f"HP * {s} * WQ",)), *zero_plane(g),
        _per_plane(pad_plane_flat(g), (Assign("wk", "Wd[oc]"),), tile, mr, back),
    )
    return Function("conv", _plane_params("float32[:, ::1]", epi), epi.prelude() + body)


def _per_plane(pad: tuple, per_channel: tuple, tile: tuple, mr: int, back: bool):
    """The NCHW depthwise kernels' work: copy t of T's share of the (n, input plane) items; per
    item the plane's copy (`pad`), then per channel multiplier m the rows of tiles (the last row
    tile moved back to end at the plane's edge where `back`)."""
    return thread_share("it", "N * C", body=(
        Assign("n", "it // C"), Assign("ic", "it % C"),
        Assign("xn", "X[n]"), Assign("oimg", "out[n]"),
        *pad,
        For("m", "0", "M", (
            Assign("oc", "ic * M + m"), Assign("bo", "bias[oc]"), *per_channel,
            For("ht", "0", "n_ht", (
                Assign("oh0", f"min(ht * {mr}, max(0, OH - {mr}))" if back else f"ht * {mr}"),
                For("owt", "0", "n_owt", tile),
            )),
        )),
    ))


def _plane_params(weights: str, epi: Epilogue) -> tuple:
    return (Param("X", "float32[:, ::1]"), Param("Wd", weights), Param("bias", "float32[::1]")) \
        + tuple(Param(n, t) for n, t in epi.params()) + (Param("out", "float32[:, ::1]"),) + tuple(
        Param(n, "int64") for n in ("N", "C", "OC", "H", "W", "OH", "OW", "HP", "WQ", "PT", "PL", "t", "T"))


def conv_depthwise_vector(mr: int, nr: int, lanes: int, geo: dict, epi: Epilogue) -> Function:
    """The `depthwise` kernel's vector-IR code (tile_code "vec<lanes>"): NCHW as it is, one
    `codegen.vector_tile.row_taps` call per tile of MR output rows x NR pixels of a row. Per
    work item (n, input plane) the plane is copied into the thread-local zero-bordered `xp`
    (rows of WQ, no phase split: `pad_plane_flat` at stride 1), then per channel multiplier m
    and tile one call: the bias starts the accumulators, the taps are unrolled, a strided conv
    picks every S-th lane of contiguous loads (no phase-split copy, no regroup into channel
    blocks). A Relu or ReLU6 epilogue is applied in registers (`Epilogue.clamp_bounds`); a
    full tile is stored into the output row-major, any other epilogue run over it in place
    after; a tile past the plane, or any tile where a residual input may be the output itself
    (`Epilogue.reads_output_sized`), goes through `ct`. Without such extras a
    row's last tile and the plane's last row tile move back to end at the edge (recomputing
    a few pixels), so planes of at least MR x NR store full tiles only."""
    g = geo
    s, flat = g["SW"], dict(geo, SW=1)
    back = not epi.reads_output_sized
    taps = f"{g['KH']}, {g['KW']}, {g['DW']}, {s}, {nr}, {lanes}"
    rows = ", ".join(f"(oh0 + {r}) * {g['SH']} * WQ + ow0 * {s}" for r in range(mr))

    clamp = epi.clamp_bounds()   # Relu, ReLU6 or nothing: applied in registers, no pass over the tile
    lo, hi = clamp or NO_CLAMP
    bounds = (Assign("lo", lo), Assign("hi", hi))   # once per call, not per tile

    def call(out: str, offset: str, stride: str) -> Call:
        return Call(f"row_taps(xp, ({rows},), {g['DH']} * WQ, Wd, oc * KK, bo, {out}, {offset}, {stride}, "
                    f"lo, hi, {taps})")
    in_place = [call("oimg", "(oc * OH + oh0) * OW + ow0", "OW")]
    if clamp is None:
        assigns, result = epi.emit("v", "n * OC + oc", "(oh0 + r) * OW + ow0 + q", "e", c="oc")
        in_place.append(For("r", "0", str(mr), (
            Assign("ob", "np.uint64((oc * OH + oh0 + r) * OW + ow0)"),
            For("q", "0", str(nr), (Assign("uq", "ob + np.uint64(q)"), Assign("v", "oimg[uq]"))
                + tuple(Assign(n, e) for n, e in assigns) + (Assign("oimg[uq]", result),)),
        )))
    assigns, result = epi.emit("v", "n * OC + oc", "oh * OW + ow0 + q", "e", c="oc") if clamp is None else ([], "v")
    through_ct = (call("ct", "0", str(nr)), For("r", "0", f"min({mr}, OH - oh0)", (
        Assign("oh", "oh0 + r"), Assign("ob", "np.uint64((oc * OH + oh) * OW + ow0)"),
        For("q", "0", f"min({nr}, OW - ow0)", (Assign("v", f"ct[np.uint64(r * {nr} + q)]"),)
            + tuple(Assign(n, e) for n, e in assigns) + (Assign("oimg[ob + np.uint64(q)]", result),)),
    )))
    tile = (
        Assign("ow0", f"min(owt * {nr}, max(0, OW - {nr}))" if back else f"owt * {nr}"),
        Comment(f"{mr}x{nr} depthwise tile (rows x pixels), one row_taps call ({lanes}-float vectors)"),
        *((If(f"oh0 + {mr} <= OH and ow0 + {nr} <= OW", tuple(in_place), through_ct),) if back else through_ct),
    )
    body = (
        Assign("M", "OC // C"), Assign("KK", str(g["KH"] * g["KW"])),
        Assign("n_ht", f"(OH + {mr - 1}) // {mr}"), Assign("n_owt", f"(OW + {nr - 1}) // {nr}"),
        Alloc("ct", (str(mr * nr),)), Alloc("xp", ("HP * WQ",)), *zero_plane(flat), *bounds,
        _per_plane(pad_plane_flat(flat), (), tile, mr, back),
    )
    return Function("conv", _plane_params("float32[::1]", epi), epi.prelude() + body)


def conv_depthwise_plane(mr: int, nr: int, lanes: int, geo: dict, epi: Epilogue) -> Function:
    """The `dw_plane` kernel (stride 1 or 2 along the rows): NCHW as it is, one
    `codegen.vector_tile.plane_taps` call per tile of MR output rows x NR pixels, reading the
    input plane itself. No padded copy (the pads are masked loads) and no regroup into channel
    blocks: each input row the tile reads is loaded once (and at stride 2 split into its even
    and odd pixels), which serves every tap of that row and every output row reading it. Tiles cover
    NR pixels of a row (the whole row where it is at most NR wide); a tile's last pixels and
    rows past the plane are masked, so every tile stores in place. A Relu or ReLU6 runs in
    registers (`Epilogue.clamp_bounds`); any other epilogue runs over the stored tile after,
    or, where a residual input may be the output itself (`Epilogue.reads_output_sized`), the
    tile goes through `ct`."""
    g = geo
    clamp = epi.clamp_bounds()
    lo, hi = clamp or NO_CLAMP
    literals = f"{mr}, {g['SH']}, {g['KH']}, {g['KW']}, {g['DH']}, {g['DW']}, {g['SW']}, 1, 1, {nr}, {lanes}"
    in_place = not epi.reads_output_sized

    def call(out: str, offset: str, stride: str) -> Call:
        return Call(f"plane_taps(xn, ic * H * W, W, 0, oh0 * {g['SH']} - PT, H, W, ow0 * {g['SW']} - PL, Wd, oc * KK, 0, "
                    f"bias, oc, {out}, {offset}, {stride}, 0, nrow, ncol, lo, hi, {literals})")
    assigns, result = epi.emit("v", "n * OC + oc", "oh * OW + ow0 + q", "e", c="oc") if clamp is None else ([], "v")
    rows = For("r", "0", "nrow", (
        Assign("oh", "oh0 + r"), Assign("ob", "np.uint64((oc * OH + oh) * OW + ow0)"),
        For("q", "0", "ncol", (Assign("v", f"ct[np.uint64(r * {nr} + q)]" if not in_place else "oimg[ob + np.uint64(q)]"),)
            + tuple(Assign(n, e) for n, e in assigns) + (Assign("oimg[ob + np.uint64(q)]", result),)),
    ))
    if in_place:
        tile = (call("oimg", "(oc * OH + oh0) * OW + ow0", "OW"),) + ((rows,) if clamp is None else ())
    else:
        tile = (call("ct", "0", str(nr)), rows)
    tile = (Assign("nrow", f"min({mr}, OH - oh0)"), Assign("ow0", f"owt * {nr}"), Assign("ncol", f"min({nr}, OW - ow0)"),
            Comment(f"{mr}x{nr} depthwise tile (rows x pixels), one plane_taps call ({lanes}-float vectors)"), *tile)
    body = (
        Assign("M", "OC // C"), Assign("KK", str(g["KH"] * g["KW"])),
        Assign("n_ht", f"(OH + {mr - 1}) // {mr}"), Assign("n_owt", f"(OW + {nr - 1}) // {nr}"),
        Alloc("ct", (str(mr * nr),)), Assign("lo", lo), Assign("hi", hi),
        _per_plane((), (), tile, mr, back=False),
    )
    params = (Param("X", "float32[:, ::1]"), Param("Wd", "float32[::1]"), Param("bias", "float32[::1]")) \
        + tuple(Param(n, t) for n, t in epi.params()) + (Param("out", "float32[:, ::1]"),) + tuple(
        Param(n, "int64") for n in ("N", "C", "OC", "H", "W", "OH", "OW", "PT", "PL", "t", "T"))
    return Function("conv", params, epi.prelude() + body)

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
(`tile_code` "slp", `register_tile`) or as a nest-form call of the vector-IR tile
(`codegen.vector_tile.tile_fma`, "vec<lanes>", the default): one call per tile covers the
whole reduction (channel blocks x kernel rows around a contiguous run of taps x channels,
or one run per phase plane for strided convs), the accumulators in registers throughout, in
chunks of KC channel blocks (run-time) so that a chunk's weights or inputs stay in L1 across
the work item's tiles; the tiles accumulate in the output itself (column-major, masked), bias
and epilogue then applied there in place.
"""
from __future__ import annotations

from schedules.epilogue import Epilogue, Extra
from schedules.loopnest import Alloc, Assign, For, Function, If, Param, thread_share, unflatten
from schedules.microkernel import F0, register_tile, vector_tile

MAX_CB = 8   # channels per block: the innermost loop's length
DEFAULT_VECTOR_IR = True   # the untuned tile_code of blocked convs: "vec<lanes>" (True) or "slp"


def channel_block(cg: int) -> int:
    """Channels per block: a code constant (with a run-time block length the kernel's
    inner loop kept its base pointers on the stack, measured), so one for every channel
    count; convs of fewer channels pad with zeros (the heuristic leaves those to `direct`)."""
    return MAX_CB


def phase_taps(geo: dict) -> dict:
    """The kernel row's taps by the phase plane they read, {phase: [kw, ...]}: with stride S and
    dilation D, tap kw reads plane (kw * D) % S at column (kw * D) // S; a plane's taps step
    by a constant kw (and column) distance."""
    phases = {}
    for kw in range(geo["KW"]):
        phases.setdefault((kw * geo["DW"]) % geo["SW"], []).append(kw)
    return phases


def tap_order(geo: dict) -> tuple:
    """The order of a kernel row's taps in the vector-IR tile's packed weights: by phase plane
    (stride 2, dilation 1: 0, 2, 1), so that a plane's taps, neighbouring columns of the plane,
    are one contiguous run of weights as of inputs; the identity where dilation == stride or
    a multiple of it (one plane)."""
    return tuple(kw for kws in phase_taps(geo).values() for kw in kws)


def pack_w_blocked(nr: int, cb: int, kh: int, kw: int, order: tuple | None = None) -> Function:
    """W[OC, Cg * KH * KW] into Wp[g, oc_tile, k, 0:NR], k = ((cbk * KH + kh) * KW + j) * CB + ci
    for input channel cbk * CB + ci and tap kw = order[j] (default the identity); zeros past
    the group's channels (both kinds); thread t of T packs panels t, t+T, ..."""
    taps = kh * kw
    tap = "tap" if order is None or tuple(order) == tuple(range(kw)) else \
        f"(tap // {kw}) * {kw} + ({', '.join(map(str, order))},)[tap % {kw}]"
    body = (
        Assign("n_oct", f"(OCg + {nr - 1}) // {nr}"), Assign("KB", f"NCB * {taps * cb}"),
        thread_share("it", "G * n_oct", body=(
            Assign("g", "it // n_oct"), Assign("oct", "it % n_oct"),
            For("k", "0", "KB", (
                Assign("ci", f"k % {cb}"), Assign("tap", f"(k // {cb}) % {taps}"), Assign("cbk", f"k // {taps * cb}"),
                Assign("c", f"cbk * {cb} + ci"),
                For("q", "0", str(nr), (
                    Assign("oc", f"oct * {nr} + q"),
                    If("oc < OCg and c < Cg", (Assign("Wp[g, oct, k, q]", f"W[g * OCg + oc, c * {taps} + {tap}]"),),
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
    Thread t of T writes blocks t, t+T, ... The CB channels of a pixel are written together
    (one vector store, read from CB input rows at unsigned indices): per channel, a store
    every CB elements cost 10-18 % of the blocked conv's time (3x3 convs of ResNet-18, measured);
    CB pixels of a full block at once (`regroup_channels`)."""
    src = f"X[un, uc0 + np.uint64(ci), uh, np.uint64((j0 + jj) * {s} + ph - PL)]"
    dst = f"xb[np.uint64(r0 + (j0 + jj) * {cb} + ci)]"
    zeros = lambda lo, hi: For("j", lo, hi, (Assign("xb[np.uint64(r0 + j)]", F0),))   # noqa: E731
    # a full block's row: CB x CB transposes in registers (`regroup_channels`) over the pixels whose
    # S columns lie in the row (strided: the rest, a pixel or so, a scalar loop). Rows are offsets
    # into the block's plane, not views: with a view per row (an NRT incref and decref each) and the
    # scalar loop the pad took 10 of ResNet-18's 127 us 64->64 3x3 @16 (Emerald Rapids)
    fits = "j1 - j0" if s == 1 else f"min(j1 - j0, (W - x0) // {s})"
    full = (
        Assign("x0", f"j0 * {s} + ph - PL"),
        Assign("jd", f"regroup_channels(X, ((n * C + g * Cg + cbk * {cb}) * H + h) * W + x0, H * W, Xc, "
                     f"(n * NB + gb) * PLN + r0 + j0 * {cb}, {fits}, {cb}, {s})"),
    ) + ((For("jj", "jd", "j1 - j0", (For("ci", "0", str(cb), (Assign(dst, src),)),)),) if s > 1 else ())
    row = (
        Assign("j0", f"min(WQ, max(0, (PL - ph + {s - 1}) // {s}))"),
        Assign("j1", f"max(j0, min(WQ, (W + PL - ph + {s - 1}) // {s}))"),
        zeros("0", f"j0 * {cb}"),
        If(f"nci == {cb}", full,
           (For("jj", "0", "j1 - j0", (For("ci", "0", str(cb), (Assign(dst, f"{src} if ci < nci else {F0}"),)),)),)),
        zeros(f"j1 * {cb}", f"WQ * {cb}"),
    )
    body = (
        Assign("Cg", "C // G"), Assign("NB", "Xc.shape[1]"), Assign("NCB", "NB // G"), Assign("PLN", "Xc.shape[2]"),
        thread_share("p", "N * NB", body=(
            Assign("n", "p // NB"), Assign("gb", "p % NB"), Assign("g", "gb // NCB"), Assign("cbk", "gb % NCB"),
            Assign("xb", "Xc[n, gb]"), Assign("un", "np.uint64(n)"), Assign("uc0", f"np.uint64(g * Cg + cbk * {cb})"),
            Assign("nci", f"max(0, min({cb}, Cg - cbk * {cb}))"),
            For("ih", "0", "HP", (
                Assign("h", "ih - PT"), Assign("uh", "np.uint64(max(h, 0))"),
                For("ph", "0", str(s), (
                    Assign("r0", f"(ih * {s} + ph) * WQ * {cb}"),
                    If("h >= 0 and h < H and nci > 0", row, (zeros("0", f"WQ * {cb}"),)),
                )),
            )),
        )),
    )
    params = (Param("X", "float32[:, :, :, ::1]"), Param("Xc", "float32[:, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("N", "C", "G", "H", "W", "HP", "WQ", "PT", "PL", "t", "T"))
    return Function("pad", params, body)


def buffered_store(epi: Epilogue, channels: str, oc: str, row: str, pixels: str, pixel: str,
                   tile: str = "ct[r, q]") -> tuple:
    """Store a tile held in memory (`tile`: pixel r, channel q's element) with bias and epilogue: for q < `channels`,
    output channel `oc` gets `pixels` contiguous outputs through the view `row` (a view from the
    tile's first pixel: no negative-index tests); `pixel` is r's flat index in the plane."""
    assigns, result = epi.emit("v", "n * OC + oc", pixel, "e", c="oc")
    return (For("q", "0", channels, (
        Assign("oc", oc), Assign("bo", "bias[oc]"), Assign("orow", row),
        For("r", "0", pixels, (
            Assign("v", f"{tile} + bo"),
        ) + tuple(Assign(n, e) for n, e in assigns) + (Assign("orow[r]", result),)),
    )),)


def vector_tile_runs(mr: int, nr: int, geo: dict, cb: int, lanes: int, blocks: str, first: str, tile: str,
                     rows: list, stride: str) -> tuple:
    """The tile as one nest-form `tile_fma` call into `ct` at element `tile`: the whole array
    `Xc` from element `rows[r]` (pixel r's window in the chunk's first block) and `Wp` from
    `wg` (the chunk's panel), the accumulators in registers over `blocks` channel blocks (one
    block plane `PLN` apart in Xc) x the kernel rows around the row's taps. Where dilation ==
    stride a kernel row's KW * CB (tap, channel) pairs are one contiguous run (the taps'
    columns are neighbouring columns of one phase plane, and the packed weights run over
    (kw, ci) in the same order); where the dilation is a multiple of the stride the taps are a
    loop of their own; else (stride 2, dilation 1: the taps alternate phase planes) the row is
    one segment per phase plane (its taps, neighbouring columns there, are consecutive in the
    packed weights: `tap_order`), or one per tap. The call starts from the tile where `first`
    is true (a later chunk of the reduction), else stores it: into `out` from element `tile`,
    `stride` its C tile's (column-major: `codegen.vector_tile`) stride triple."""
    g, s = geo, geo["SW"]
    taps_b = g["KW"] * cb * nr                       # packed weights of one kernel row
    outer = f"({blocks}, PLN, {g['KH'] * taps_b}), ({g['KH']}, {g['DH'] * s * cb} * WQ, {taps_b})"
    if g["DW"] == s:
        nest = f"({outer}, {g['KW'] * cb})"
    elif g["DW"] % s == 0:
        nest = f"({outer}, ({g['KW']}, {g['DW'] // s * cb}, {cb * nr}), {cb})"
    else:
        segments, j = [], 0
        for ph, kws in phase_taps(geo).items():
            col, step = (kws[0] * g["DW"]) // s, (kws[1] - kws[0]) * g["DW"] // s if len(kws) > 1 else 1
            runs = [(col, len(kws))] if step == 1 else [(col + i * step, 1) for i in range(len(kws))]
            for c, n in runs:
                xo = f"{ph * cb} * WQ + {c * cb}" if ph else str(c * cb)
                segments.append(f"({xo}, {j * cb * nr}, {n * cb})")
                j += n
        nest = f"({outer}, ({', '.join(segments)},))"
    call = vector_tile("Xc", rows, "1", "Wp", "wg", str(nr), nest, "out", tile, stride, first, nr, lanes)
    return (call,)


def pixel_run(mr: int, ow: int) -> int:
    """Pixels of an MR-pixel tile that lie consecutively in one output row from a row's start, where
    every tile's do (0 where tiles start mid-row): MR where rows hold whole tiles, OW where a
    tile holds whole rows. A code constant: such a tile's windows are a few base offsets plus
    constants (`conv_blocked_vector`), one address register, not MR of them (14 pointers plus
    the weights' spilled and were reloaded in the k loop: 6-8 % of 64->64 3x3 @56, measured)."""
    return mr if ow % mr == 0 else ow if mr % ow == 0 else 0


def residual_split(epi: Epilogue) -> tuple[Epilogue, Extra | None] | None:
    """`epi` as (tail, residual): an optional leading Add of a full-plane extra (ResNet's skip
    connection), then steps that read no extras (Relu), or None for any other epilogue. The
    vector-IR kernel takes the residual as a run-time flag (`conv_blocked_vector`), so Conv+Relu
    and Conv+Add+Relu of one geometry share one compile (~4 CPU s each, ResNet-18's 3x3 convs)."""
    steps, extras = epi.steps, epi.extras
    res = None
    if steps and steps[0][0]["op"] == "Add" and len(extras) >= 1:
        refs = [a for a in steps[0][1] if a != "chain"]
        first = [e for e in extras if refs == [f"i{e.input_index}"]]
        if len(first) == 1 and first[0].mode == "full" and first[0].dtype == "float32":
            res, steps, extras = first[0], steps[1:], tuple(e for e in extras if e is not first[0])
    if extras or any(a != "chain" for _, args in steps for a in args):
        return None
    return Epilogue(steps, ()), res


def conv_blocked_vector(mr: int, nr: int, order: str, geo: dict, epi: Epilogue, cb: int, lanes: int,
                        run: int = 0) -> Function:
    """The kernel with the vector-IR tile (`vector_tile_runs`): work items as `conv_blocked`'s;
    per tile of the outer loop (an OC tile for "oc_px", a pixel tile for "px_oc") the reduction
    runs in chunks of KC channel blocks (run-time; KC <= 0: all at once), each chunk over all
    tiles of the inner loop, so the chunk's weights (oc_px) or input (px_oc) stay in L1 across
    them. The tiles accumulate in the output itself: an output channel's pixels are contiguous
    there, so the tile is column-major and masked at the plane's and the channels' ends
    (`codegen.vector_tile`: a transpose in registers and 16-lane masked stores, where a loop over
    a scratch tile stored 448 scalars: 10 % of 64->64 3x3 @56, measured); bias and epilogue then
    run in place over the work item's channel rows (contiguous: vectorized), a residual Add
    (`residual_split`) behind the run-time flag R, the residual `res` else a dummy. `run`
    (`pixel_run`, 0: none) fixes how the tile's pixels lie along the rows."""
    g = geo
    oc_loop = ("oct", "ob * OCB", "min(n_oct, ob * OCB + OCB)")
    px_loop = ("pt", "pb * PB", "min(n_pt, pb * PB + PB)")
    outer, inner = (oc_loop, px_loop) if order == "oc_px" else (px_loop, oc_loop)
    # pixel r's window: row and column of p0 (one division), then stepped along the plane;
    # pixels past the plane read the last pixel's window (they are not stored)
    at = lambda: f"(pr * {g['SH'] * g['SW']} * WQ + pc) * {cb}"   # noqa: E731
    offsets = (Assign("p0", f"pt * {mr}"), Assign("pr", "p0 // OW"), Assign("pc", "p0 - pr * OW"), Assign("o0", at()))
    if run:   # runs of `run` pixels along a row from a row's start: run bases, pixels a constant apart from theirs
        for j in range(1, mr // run):
            offsets += (Assign(f"o{j}", f"o{j - 1} + {g['SH'] * g['SW'] * cb} * WQ if p0 + {j * run} < P else o{j - 1}"),)
        rows = [f"o{r // run} + xg + {(r % run) * cb}" if r % run else f"o{r // run} + xg" for r in range(mr)]
    else:
        for r in range(1, mr):
            offsets += (Assign("pc", "pc + 1"), If("pc == OW", (Assign("pc", "0"), Assign("pr", "pr + 1"))),
                        Assign(f"o{r}", f"{at()} if p0 + {r} < P else o{r - 1}"))
        rows = [f"o{r} + xg" for r in range(mr)]
    tiles = (
        Assign("xg", "(n * NB + g * NCB + c0) * PLN"),
        Assign("wg", f"((g * n_oct + oct) * KB + c0 * {g['KH'] * g['KW'] * cb}) * {nr}"),
    ) + vector_tile_runs(mr, nr, geo, cb, lanes, "nc", "c0 > 0", f"(n * OC + g * OCg + oct * {nr}) * P + p0", rows,
                         f"(P, min({mr}, P - p0), min({nr}, OCg - oct * {nr}))")
    # the offsets where the pixel tile changes: per inner tile (oc_px), else once per outer one
    chunk = For(*inner, body=offsets + tiles) if order == "oc_px" else For(*inner, body=tiles)
    first = () if order == "oc_px" else offsets
    # the work item's outputs: channel tiles x pixel tiles, one run of pixels per channel
    chans, pix = (("oct * {nr}", "min(OCg, oct * {nr} + {nr})"), ("pb * PB * {mr}", "min(P, (pb * PB + PB) * {mr})")) \
        if order == "oc_px" else (("ob * OCB * {nr}", "min(OCg, (ob * OCB + OCB) * {nr})"), ("p0", "min(P, p0 + {mr})"))
    split = residual_split(epi)
    tail = split[0] if split else epi
    assigns, result = tail.emit("v", "n * OC + oc", "up", "e", c="oc")
    pixels = lambda add: For("p", *(e.format(nr=nr, mr=mr) for e in pix), (   # noqa: E731
        Assign("up", "np.uint64(p)"), Assign("v", "orow[up] + bo" + (" + rrow[up]" if add else "")),
    ) + tuple(Assign(n, e) for n, e in assigns) + (Assign("orow[up]", result),))
    # with `split`, the residual is a run-time flag R (one code for Relu and Add+Relu): a branch per channel row
    rows = (If("R != 0", (Assign("rrow", "res[n * OC + oc]"), pixels(True)), (pixels(False),)),) if split \
        else (pixels(False),)
    store = For("q", *(e.format(nr=nr, mr=mr) for e in chans), (
        Assign("oc", "g * OCg + q"), Assign("bo", "bias[oc]"), Assign("orow", "out[n, oc]")) + rows)
    body = (
        Assign("OCg", "OC // G"), Assign("NB", "Xc.shape[1]"), Assign("NCB", "NB // G"), Assign("P", "OH * OW"),
        Assign("PLN", "Xc.shape[2]"), Assign("KB", "Wp.shape[2]"),
        Assign("KCB", "NCB if KC <= 0 else min(KC, NCB)"),
        Assign("n_oct", f"(OCg + {nr - 1}) // {nr}"), Assign("n_ob", "(n_oct + OCB - 1) // OCB"),
        Assign("n_pt", f"(P + {mr - 1}) // {mr}"), Assign("n_pb", "(n_pt + PB - 1) // PB"),
        thread_share("it", "N * G * n_ob * n_pb", body=(
            *unflatten("it", (("pb", "n_pb"), ("ob", "n_ob"), ("g", "G")), "n"),
            For(*outer, body=first + (
                For("c0", "0", "NCB", step="KCB", body=(Assign("nc", "min(KCB, NCB - c0)"), chunk)),
                store,
            )),
        )),
    )
    extras = (("res", "float32[:, ::1]"),) if split else tuple(epi.params())
    params = (Param("Xc", "float32[:, :, ::1]"), Param("Wp", "float32[:, :, :, ::1]"), Param("bias", "float32[::1]")) \
        + tuple(Param(n, t) for n, t in extras) + (Param("out", "float32[:, :, ::1]"),) + tuple(
        Param(n, "int64") for n in ("N", "OC", "G", "OH", "OW", "WQ", "OCB", "PB", "KC") + (("R",) if split else ())
        + ("t", "T"))
    return Function("conv", params, tail.prelude() + body)


def conv_blocked(mr: int, nr: int, order: str, geo: dict, epi: Epilogue, cb: int, lanes: int | None = None,
                 run: int = 0) -> Function:
    """The kernel: work items t, t+T, ... of (n, g, OC block of OCB tiles, pixel block of PB
    tiles); per tile, MR pixel offsets, then the register tile over (cb, kh, kw, ci): SLP
    scalar locals (`lanes` None) or, with `lanes`, `conv_blocked_vector`'s kernel."""
    if lanes is not None:
        return conv_blocked_vector(mr, nr, order, geo, epi, cb, lanes, run)
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

    offsets = tuple(   # uint64: no wraparound selects
        s_ for r in range(mr) for s_ in (
            Assign(f"pp{r}", f"min(p0 + {r}, P - 1)"),
            Assign(f"o{r}", f"np.uint64(((pp{r} // OW) * {g['SH'] * s} * WQ + pp{r} % OW) * {cb})"))
    )
    # the store: per output channel, the tile's pixels are a contiguous run of its plane
    # (written through a view from p0: no negative-index tests)
    store = buffered_store(epi, f"min({nr}, OCg - oct * {nr})", f"g * OCg + oct * {nr} + q",
                           "out[n, oc, p0:]", f"min({mr}, P - p0)", "p0 + r")
    tile = (Assign("p0", f"pt * {mr}"), Assign("Wk", "Wp[g, oct]")) + offsets + register_tile(
        mr, nr, lambda r: f"xb[o{r} + xi]", lambda q: f"Wk[k, {q}]", k_loops, (),
        comment=f"{mr}x{nr} register tile (pixels x output channels) over {cb}-channel blocks, "
                f"SLP-vectorized along channels")[:-1] + store   # [:-1]: its per-row store loop (empty here)
    oc_loop = ("oct", "ob * OCB", "min(n_oct, ob * OCB + OCB)")
    px_loop = ("pt", "pb * PB", "min(n_pt, pb * PB + PB)")
    outer, inner = (oc_loop, px_loop) if order == "oc_px" else (px_loop, oc_loop)
    body = (
        Assign("OCg", "OC // G"), Assign("NCB", "Xc.shape[1] // G"), Assign("P", "OH * OW"),
        Assign("n_oct", f"(OCg + {nr - 1}) // {nr}"), Assign("n_ob", "(n_oct + OCB - 1) // OCB"),
        Assign("n_pt", f"(P + {mr - 1}) // {mr}"), Assign("n_pb", "(n_pt + PB - 1) // PB"),
        Alloc("ct", (str(mr), str(nr))),
        thread_share("it", "N * G * n_ob * n_pb", body=(
            *unflatten("it", (("pb", "n_pb"), ("ob", "n_ob"), ("g", "G")), "n"),
            For(*outer, body=(For(*inner, body=tile),)),
        )),
    )
    params = (Param("Xc", "float32[:, :, ::1]"), Param("Wp", "float32[:, :, :, ::1]"), Param("bias", "float32[::1]")) \
        + tuple(Param(n, t) for n, t in epi.params()) + (Param("out", "float32[:, :, ::1]"),) + tuple(
        Param(n, "int64") for n in ("N", "OC", "G", "OH", "OW", "WQ", "OCB", "PB", "t", "T"))
    return Function("conv", params, epi.prelude() + body)

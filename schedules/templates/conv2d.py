"""Conv2d, NCHW (strides, pads, dilations, groups incl. depthwise) with a fused epilogue.

Convolution as an implicit GEMM over output pixels x output channels, the reduction
over K = C/groups * KH * KW. Weights are packed once, at prepare time, into
`Wp[g, oc_tile, k, 0:TC]` panels (TC channels, contiguous per k, like dense's B
panels); a register tile of scalar locals is SLP-vectorized along one of its axes:

- `vec="oc"`: MR pixels x NR channels, vectors along the output channels (broadcast
  pixels, weight panels as vectors); good when there are many channels and few pixels;
- `vec="px"`: MR channels x NR pixels, vectors along the output pixels, which are
  contiguous in NCHW: the input is read as vectors and the output stored as vectors
  (a 1x1 conv is then exactly a dense GEMM over the pixel plane).

Algorithms (`algo`):

- `direct`: the tile's pixels are neighbours in one output row, read straight from
  the input (no packing of activations); with vectors along the pixels, full tiles are
  stored from registers and a row's last pixels may take a half-width tile (stems);
  a strided 1x1 conv copies the pixels it reads into a plane first and runs as a 1x1 GEMM.
  With vectors along the pixels the tile is either SLP code (`tile_code="slp"`) or one
  `tile_fma` call over the whole window ("vec<lanes>", the default: a tenth of the compile
  time on stems, and as fast or faster);
- `im2col`: pixels of the flattened output plane are packed into `Ap[tile, k, 0:T]`
  panels first (tiles cross rows, so narrow late layers waste no lanes; a strided
  1x1 conv becomes a gather into the panel plus a GEMM; a ViT's patch embedding, a
  rearrangement of the input); with vectors along the channels the tile is SLP code or
  one `tile_fma` call over the panel ("vec<lanes>", stored column-major);
- `blocked` (vectors along channels only): NCHWc-style, the input repacked into 8-channel
  blocks by the pad step and a pixels x channels tile over the flattened plane with the
  block's channels innermost (`conv2d_blocked`); the default for spatial convs of many
  channels;
- `dw_blocked` (only for convs with one input channel per group, the default for strided
  ones and small maps): a pixels x 8 channels tile over the input regrouped into 8-channel
  blocks, vectors along the channels (`conv2d_depthwise`);
- `depthwise` (the same convs, the default for stride 1 with rows of >= 12 pixels): NCHW as it
  is, a rows x pixels tile per output channel, vectors along the pixels of a row, weights as
  scalars (`conv2d_depthwise.conv_depthwise_rows`);
- `dw_plane` (the same convs, stride 1 or 2 along the rows; the AVX-512 default for rows of >= 8
  output pixels): NCHW as it is, the input plane read in place (no padded copy: the pads are
  masked loads), each input row loaded once and split into its stride's phases for all its
  taps (`conv2d_depthwise.conv_depthwise_plane`, `codegen.vector_tile.plane_taps`);
- `plane` (stems of 1-4 input channels, kernels up to 3x3, one group; the AVX-512 default
  there): the same intrinsic over every input plane for 8 output channels a tile, no pad step;
- `winograd` (3x3, stride 1, no dilation, one group; the AVX2 default from 64 channels on planes
  of 16+ tiles, `WINOGRAD_DEFAULT`): F(2x2, 3x3), 2.25x fewer multiplies: input and output
  transforms around the plane GEMM of the 1x1 convs over 16 transformed planes (`conv2d_winograd`).

Strided convs read a *phase-split* copy of the input: the pad step writes
`Xp[n, c, ih, phase, j]` = x[n, c, ih - PT, j * SW + phase - PL], so the pixels one
kernel tap reads for neighbouring outputs are contiguous for every stride (no
strided gathers in the inner loop). Kernel size, strides and dilations are code
constants; sizes of the tensors (and pads) are run-time arguments, so layers of
equal geometry share a compile. Block sizes and threading are run-time knobs.

The launch: `pack_w` (at prepare for constant weights), `pad` (when pads, strides or
the tiles' overrun need it), then `conv` (direct) or per (image, group) `pack_a` +
`gemm` (im2col); depthwise is one `conv` step that pads each plane itself.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from ir.ops.nn import _concrete_pads
from ir.workload import Workload
from schedules.epilogue import Epilogue, parse_epilogue
from schedules.launch import Buffer, Call, In, Launch, Out, Packed, Repeat, Scalar, Table, Var, Work
from schedules.loopnest import (Alloc, Assign, Call as LoopCall, Comment, For, Function, If, LoopModule, Param,
                                thread_share, unflatten)
from schedules.microkernel import (F0, k_range, register_epilogue, register_tile, register_tile_in_place, pick_tiles,
                                   tile_codes, tile_lanes, unsigned, vector_shape, vector_tile)
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Lowered, Template
from schedules.templates.conv2d_blocked import (DEFAULT_VECTOR_IR, channel_block, conv_blocked, pack_w_blocked,
                                                pad_blocked, pixel_run, residual_split, tap_order)
from schedules.templates.conv2d_depthwise import (DWB_ALL_TILES, conv_depthwise, conv_depthwise_plane,
                                                  conv_depthwise_rows, conv_depthwise_vector, dwb_default_tile,
                                                  dwb_tiles, pack_w_depthwise)
from schedules.templates.conv2d_winograd import XI, wino_input, wino_output, wino_weights

# MR x NR; NR is the vectorized axis (see `vec`). With 16 vector registers (AVX2, or AVX-512
# with LLVM's prefer-256-bit) 4x16, 6x16 and 4x24 keep 8-12 accumulators in registers; 8x16 and
# 4x32 need 16 and spill there (3.5x slower, measured), but fit 32 zmm registers
REG_TILES = ("4x16", "6x16", "4x24", "8x16", "4x32", "8x32")
# per vector shape ((lanes, registers): `schedules.microkernel.vector_shape`, `pick_tiles`): AVX-512's
# 32 zmm registers hold up to 28 accumulators of the vector-IR blocked tile (NR a multiple of 16)
# (only there: `_blocked_vectors_along_channels`; 6x48 and 6x64 were no faster than 8x32, measured;
# 4x64 is for planes of a few pixels: `blocked_tile`)
REG_TILES_BY_SHAPE = {(8, 16): REG_TILES, (16, 32): REG_TILES + ("12x32", "14x32", "4x64")}
# the untuned blocked conv's vector-IR tile per vector shape: AVX2 6x16 (12 ymm accumulators);
# AVX-512 14x32 (28 zmm accumulators, 2 weight vectors + 14 broadcasts per 28 FMAs): 1.2-1.5x
# faster than 6x16 (one zmm per pixel: broadcast-bound) on ResNet-18's 3x3 convs, 1.00-1.07x
# faster than 8x32, 12x32, 6x48, 4x64, 6x64 (Zen 5, experiments/bench_conv.md, 2026-12-02)
BLOCKED_TILE = {(8, 16): "6x16", (16, 32): "14x32"}
# the untuned blocked tiles per vector shape where the plane decides (`blocked_tile`): a tile of
# more pixels than the plane has computes pixels that are never stored, and each pixel tile
# streams the weights once more. On ResNet-18's deep layers at a 64x64 image (Intel Xeon,
# AVX-512, 1 thread, vs onnxruntime, 2026-12-04): 2x2 maps (512 channels) 4x64 0.85-0.91x where
# 14x32 took 1.16-1.20x and the direct 4x16 default 1.23-1.38x; 4x4 maps 8x32 0.94-0.99x where
# 14x32 took 1.28-1.41x; a 3x3 map kept 14x32 (one pixel tile: 0.98x, 4x64 1.10x); 8x8 and
# larger within 5 % either way
BLOCKED_PLANE_TILES = {(16, 32): ("14x32", "8x32", "4x64")}
BLOCKED_SMALL = {(8, 16): (16, "4x16")}
# per vector shape (pixels, tile): the untuned blocked tile on planes of at most that many output
# pixels (`blocked_tile`), and planes of fewer than 16 pixels then take the blocked kernel too, as
# on AVX-512 (`_blocked_by_plane`). AVX2 4x16 (8 ymm accumulators) on 4x4 maps and smaller,
# against 6x16 and, under 16 pixels, the direct vec=oc 4x16 (AMD EPYC Zen 3, 2026-12-07): alone, 1
# thread, CPU time, 256->256 @4 0.82x the time (onnxruntime 1.05x of it), 512->512 @2 738 -> 247
# us (onnxruntime 371), the 3x3/2 into 2x2 360 -> 157 (213), the 1x1/2 into 2x2 53 -> 32 (36);
# ResNet-18 (64x64) in the model, processes in turns: those steps 0.66-0.92x the time at 1 thread,
# 0.68-0.97x at 2, the model 0.99 -> 0.82x onnxruntime at 1 thread, 1.07 -> 0.87x at 2
# (experiments/bench_turns.md; tune had picked the same tiles, tuned 0.77x the untuned time).
# Larger planes keep 6x16: alone 4x16 ran 0.82-0.90x on 8x8 to 28x28 maps, but in the model,
# its weights streamed from L3 once per pixel tile, 1.02-1.07x on 16x16 and 8x8 (1.07x alone @56)
BLOCKED_WIDE = {(8, 16): "4x24"}
# per vector shape: the untuned blocked tile where its run along the output channels leaves fewer
# lanes empty than BLOCKED_TILE's (`blocked_tile`): AVX2 4x24 (12 ymm accumulators, as 6x16) for
# 24, 72, 120... channels. 3x3 convs alone, 1 thread, CPU time (AMD EPYC Zen 3, 2026-12-07):
# 64->24 @28 338 -> 260 us (onnxruntime 263), 32->24 @56 903 -> 667 (673), 24->72 @28 353 -> 335,
# 40->120 @14 216 -> 211; where both leave as many empty (40, 48 channels) they ran alike
BLOCKED_MIN_OC = 8
# on the vector shapes of FEW_OC_PX_TILE, stride-1 spatial convs into at most this many channels,
# on planes of 16 pixels or more, that would take the blocked kernel (16 input channels or more)
# do not by default: its vectors run along the output channels (16 a tile on AVX2), so one
# channel used a 16th of each FMA. Vectors along the pixels instead (direct vec=px, vector IR),
# 3x3, 1 thread, CPU time (AMD EPYC Zen 3, 2026-12-07): paddle_det's 16->1 @12x20 (batch 2) 32 ->
# 14 us, 32->1 @40 182 -> 67, 64->4 @20 88 -> 40, 64->2 @20 91 -> 40, 32->8 @28 92 -> 60, 16->8
# @56 202 -> 108, 64->2 @12 33 -> 34; at 12 and 16 channels both ran alike; strided (64->4 /2 @12)
# they took turns being faster, so strided convs keep the blocked kernel. Measured on AVX2 only:
# AVX-512 keeps it too
FEW_OC_PX_TILE = {(8, 16): (4, 20, "4x24")}
# per vector shape: (channels, row, tile): convs into at most that many channels, stride 1, rows
# of at least that many pixels take 4 channels x 24 pixels (16->1 @12x20 24 -> 20 us, 32->1 @40
# 68 -> 66, 64->4 @20 53 -> 43), the others the pixel tile of PX_TILES (4x16: on 12- and 10-pixel
# rows it was the faster, 16->1 @6x10 6.7 -> 4.5 us)
SMALL_MAP_BLOCKED_CG = {(8, 16): 8}
# per vector shape: stride-1 spatial convs on rows of under 14 pixels (where the others take
# im2col's SLP panels) take the blocked kernel from this many input channels on (not 16), into
# more than BLOCKED_MIN_OC channels. 3x3, 1 thread, CPU time (AMD EPYC Zen 3, 2026-12-07): the
# detector's 12->12 @6x8 (batch 2) 12.5 -> 8.3 us, 8->16 @7 7.0 -> 4.1, 12->12 @12 14.8 -> 11.0,
# 8->32 @10 14.2 -> 10.6; 3 input channels (a stem) gained nothing; on rows of 14 and more the
# direct kernel stays the faster (8->16 @28 38 against 49 us)
ALIGNED_MIN_PIXELS = 8
# a plane tile of this many pixels or more that rows hold whole goes before one of fewer weight
# passes that crosses them (`blocked_tile`): 8x32 against 14x32 on 3x3 convs, 1 thread, CPU
# time (Emerald Rapids, 2026-12-06): 64 -> 64 @16 (ResNet-18 at a 64x64 image) 0.96x the time
# (1.00x onnxruntime), 128 -> 128 @8 0.90x (0.98x), @24 0.95x, @32 0.99x; in the model, untuned
# ResNet-18 0.98x at 1 thread, 0.99x at 2. Rows of 7, 14, 28, 56 keep 14x32 (rows hold it)
# the untuned tiles with vectors along the pixels (output channels x pixels, SLP): (1x1 stride-1
# GEMM over the plane, packed im2col GEMMs of 1x1 / strided convs, direct stems). AVX2: 4x16, 6x16,
# 4x16 (8-12 ymm accumulators); AVX-512: 8x32 (16 zmm), 1.2-1.7x faster than 4x16 / 6x16 on
# ResNet-18's 7x7/2 stem and 1x1/2 convs and MobileNetV2's 1x1 convs (Zen 5, 2026-12-02)
PX_TILES = {(8, 16): ("4x16", "6x16", "4x16"), (16, 32): ("8x32", "8x32", "8x32")}
# the vector-IR 1x1 GEMM's tile for deep reductions (>= 64 input channels) on small planes (<= 256
# pixels) of >= 64 output channels, per vector shape: AVX-512 14x32 (28 zmm accumulators), 1.06-1.24x
# faster than 8x32 on MobileNetV2's 1x1 convs @14 and @7 and ResNet-18's 128->256 1x1/2, slower on
# large planes of few input channels (0.4-0.75x: 16->96 @112, 144->24 @56) and on the stem (Xeon
# Ice Lake, 2026-12-03, experiments/bench_conv.md); AVX2 keeps PX_TILES
PX_DEEP_TILE = {(16, 32): "14x32"}
# the vector-IR plane GEMM's tile (1x1 convs read in place, vec=px) where it is not PX_TILES's:
# AVX2 4x24 (12 ymm accumulators + 3 pixel vectors + a broadcast: the 16 registers, no spill as
# vector IR; the SLP tile spills there). MobileNetV2 (96x96) in the model, untuned, processes in
# turns against 4x16 (AMD EPYC Zen 3, 2026-12-07, experiments/bench_turns.md): every 1x1 step
# 0.79-0.90x the time at 1 thread (16->96 @48 191 -> 151 us, onnxruntime's node 143), 0.83-0.97x
# at 2; the step sum 0.88x; ResNet-18's strided 1x1s within the noise
PX_PLANE_TILE = {(8, 16): "4x24"}
DW_TILES = ("4x8", "2x16", "4x16", "2x32")     # depthwise: output rows x pixels of a row
DW_PLANE_TILES = ("4x8", "4x16", "2x32", "4x32", "2x64")   # dw_plane: output rows x pixels of a row
# plane (stems): output rows x pixels of a row, x `plane_channels` output channels. One row of 16 pixels:
# 1x32, 2x16 and 2x32 ran 2.5-10x slower on 3x3/2 and 7x7/2 stems (Emerald Rapids, 2026-12-06): the
# weights shared by the tile's vectors are kept live and spill
PLANE_TILES = ("1x16",)
PLANE_MAX_C = 4           # `plane` reads each of the (few) input planes in place: stems of 1-4 input channels
BLOCKS = (1, 2, 4, 8, 16)
GEMM_1X1_PIXELS = 128     # 1x1 convs on planes of at least this many pixels read them in place (`_gemm_1x1`);
                          # on 7x7 maps (P = 49, K up to 960) im2col's packed panels were 1.4x faster
# per vector shape: AVX-512's 8x32 tile reads 7x7 maps in place 1.2-1.6x faster than im2col's
# (MobileNetV2's 576->160, 960->320, 320->1280 @7, Zen 5, 2026-12-02): every plane of >= 16 pixels
GEMM_1X1_PIXELS_BY_SHAPE = {(8, 16): GEMM_1X1_PIXELS, (16, 32): 16}
SMALL_PLANE_1X1_DEEP = {(8, 16): 128}
# per vector shape whose plane GEMM stops at GEMM_1X1_PIXELS (AVX2): stride-1 1x1 convs on planes of
# 16 to GEMM_1X1_PIXELS pixels with more input channels than this take the blocked kernel (the
# vector-IR 6x16 tile, one weight panel over the whole plane a work item), the others the vector-IR
# plane GEMM (`PX_PLANE_TILE`), neither im2col's SLP panels any more. Alone, 1 thread, CPU time,
# against im2col (AMD EPYC Zen 3, 2026-12-07): MobileNetV2 at 224's 7x7 convs 576->160 0.72 ->
# 1.00x onnxruntime, 960->320 0.74 -> 0.96x, 320->1280 0.76 -> 0.89x, 160->960 0.82 -> 0.83x;
# 128->512 @7 0.67 -> 0.89x (plane GEMM; blocked 0.83x); 160->64 @10 1.02 -> 1.35x (blocked;
# plane GEMM 1.16x); shallow ones 1.2-2x faster as plane GEMMs (64->240 @8, 96->576 @6, 24->72 @9,
# 40->120 @5, 16->64 @4), where blocked ran 0.8-0.9x im2col's speed; 256->256 @8 even
SQUEEZE_IM2COL = ((8, 16),)
# per vector shape: the 3x3 stride-1 convs (one group, no dilation) that take `winograd` (F(2x2, 3x3),
# `conv2d_winograd`) by default: (least of input and output channels, least tiles of 2x2 output
# pixels), and its GEMM's tiles (`_winograd_tile`: the first, or a later one that computes 10 % fewer
# columns of the tiles: 6x16 computes 16 of 7x7's 16 tiles where 4x24 computes 24). Alone, 1 thread,
# CPU time, against the blocked default and onnxruntime (AMD EPYC Zen 3, 2026-12-07, interleaved):
# ResNet-18 at 224's 64->64 @56 2770 -> 1927 us (onnxruntime 2756), 128->128 @28 2571 -> 1756 (2528),
# 256->256 @14 3079 -> 2292 (2734), 512->512 @7 3276 -> 2303 (3470; 4x24 3276), at 2 threads 1.07-1.36x
# faster than blocked; smaller maps, once the GEMM computed no column past the tiles and narrow rows
# stored no masked vectors: 64->64 @16 226 -> 162 us (onnxruntime 235), 64->64 @14 179 -> 155 (187),
# 128->128 @14 658 -> 486 (666), 128->128 @8 223 -> 140 (214), 256->256 @7 708 -> 536 (641); slower:
# 256->256 @4 (4 tiles) 2x, 512->512 @2 7.5x (ResNet-18 at 64: 2x slower end to end with a rule that
# let those in), and under 64 channels 32->64 @64 1.02x, 32->32 @8 1.15x, 16->16 @64 1.24x (32->32
# @16 and @32 1.2-1.3x faster). AVX-512 not measured: a tuning choice there.
WINOGRAD_DEFAULT = {(8, 16): (64, 16, ("4x24", "6x16"))}
# vector shapes whose depthwise convs (one output channel per input channel, no residual input)
# take `dw_blocked` with its vector-IR tile (`block_taps`) by default, at any stride and row width.
# AVX2 (Zen 3, 1 thread, 2026-12-07), alone against the defaults before: stride 2 1.05-1.5x faster
# than dw_blocked's SLP tile (MobileNetV2's 96@48, 96@112, 144@24; MobileNetV3's 16@32x40,
# 48@16x20, 96@8x10 5x5), stride 1 1.0-1.7x faster than `depthwise`'s row_taps (32@48, 32@112,
# 144@24, 144@56, 192@12, 576@14) and 1.2x than dw_blocked's SLP on 7-pixel rows (960@7); in the
# models, old and new alternating: MobileNetV3's five depthwise steps 246 -> 229 us a call, its call
# 0.94x; MobileNetV2's 0.96x. AVX-512 keeps dw_plane (not measured there)
DWB_VECTOR_DEFAULT = ((8, 16),)
# per vector shape: the untuned tile of stems (at most PLANE_MAX_C input channels, kernels up to
# 3x3, the direct pixel-vector kernel), taken where it computes no more pixels of a row than the
# 16-pixel tile, with pixel tiles outside 4 channel tiles (OCB=4, px_oc: a tile's input rows stay
# in L1 for 16 output channels). AVX2 (Zen 3, 1 thread, in the models, old and new configs
# alternating, 2026-12-07): MobileNetV3's 3->16 3x3/2 @64x80 + HardSwish 51.3 -> 46.4 us,
# MobileNetV2's 3->32 3x3/2 @96 65.3 -> 59.2 us; 4x16 with the same order 3.5 % (MobileNetV2). Alone,
# the 4x24 tile on 32- and 80-pixel rows (more pixels computed) ran 1.1-1.25x slower, and on a
# 7x7 stem 2x slower (spills): neither takes it
STEM_TILE = {(8, 16): "4x24"}
# vector shapes whose 1x1 convs on planes of under 16 pixels that reduce more input channels than
# they output (squeeze-excite's squeeze, on a 1x1 map) take im2col's vector-IR tile along the
# channels (4x16) instead of the direct SLP one: alone, 1 thread, CPU time (AMD EPYC Zen 3,
# 2026-12-07): 960->240 51 -> 31 us (onnxruntime 34), 672->168 27 -> 17, 480->120 14 -> 9.5,
# 72->24 4.6 -> 3.4; the excites (24->72, 120->480, 240->960) ran 0.9-1.1x as fast either way
THREAD_WAKE_FLOPS = 2e5   # below this, a conv runs single-threaded by default (the pool's
                          # threads spin between a call's kernels, so a handoff costs a few us, not
                          # a ~20 us wake-up); 2e6 left MobileNetV2's depthwise convs on one thread,
                          # reading half their input from the other core (`codegen.cpu.MIN_WORK_PER_THREAD`)


def _geometry(wl: Workload):
    node = wl.nodes()[0]
    x, w = wl.inputs[0]["shape"], wl.inputs[1]["shape"]
    strides, dil, pads, outs, extra = _concrete_pads(node, list(x[2:]), list(w[2:]))
    return {"KH": w[2], "KW": w[3], "SH": strides[0], "SW": strides[1], "DH": dil[0], "DW": dil[1],
            "PT": pads[0], "PL": pads[1], "G": int(node.attrs.get("group", 1))}


def blocked_tile(pixels: int, shape: tuple, ow: int | None = None, oc: int | None = None) -> str:
    """The untuned blocked tile for a plane of `pixels` output pixels in rows of `ow`: the vector
    shape's small-plane tile where the plane is that small (`BLOCKED_SMALL`), else its wide tile
    where that leaves fewer of `oc` output channels' lanes empty (`BLOCKED_WIDE`), else of the
    vector shape's plane tiles (`BLOCKED_PLANE_TILES`, else its one `BLOCKED_TILE`), the one of
    fewest pixel tiles (weight passes), then of fewest pixels computed; ties to the first listed.
    Where rows hold whole tiles of at least `ALIGNED_MIN_PIXELS`, those go first: a tile crossing
    rows at varying columns computes each pixel's window offset (`pixel_run`, `ALIGNED_MIN_PIXELS`)."""
    small = BLOCKED_SMALL.get(shape)
    if small is not None and pixels <= small[0]:
        return small[1]
    wide = BLOCKED_WIDE.get(shape)
    if wide is not None and oc is not None and \
            (-oc) % _tile_dims(wide)[1] < (-oc) % _tile_dims(pick_tiles(BLOCKED_TILE, *shape))[1]:
        return wide
    tiles = BLOCKED_PLANE_TILES.get(shape)
    if not tiles:
        return pick_tiles(BLOCKED_TILE, *shape)
    def cost(tile: str) -> tuple:
        mr = _tile_dims(tile)[0]
        n = -(-pixels // mr)
        aligned = ow is not None and mr >= ALIGNED_MIN_PIXELS and ow % mr == 0
        return not aligned, n, n * mr
    return min(tiles, key=cost)


def _blocked_by_plane(shape: tuple) -> bool:
    """The untuned blocked tile of this vector shape follows the plane (`blocked_tile`): then
    planes of fewer than 16 pixels take the blocked kernel rather than vectors along the channels."""
    return shape in BLOCKED_PLANE_TILES or shape in BLOCKED_SMALL


def _epilogue(wl: Workload) -> Epilogue | None:
    return parse_epilogue(wl, len(wl.ops[0]["in"]), wl.output_shape, channel_axis=1, broadcast_full=True)


def _is_depthwise(wl: Workload) -> bool:
    """One input channel per group (depthwise, possibly with a channel multiplier)."""
    return int(wl.inputs[1]["shape"][1]) == 1 and int(wl.nodes()[0].attrs.get("group", 1)) > 1


def _tile_dims(regtile: str) -> tuple[int, int]:
    mr, nr = (int(v) for v in regtile.split("x"))
    return mr, nr


class Conv2dTemplate(Template):
    name = "conv2d"
    version = 8   # v2: the `vec` knob, the depthwise algorithm, phase-split strided input; v3: `blocked`; v4: `dw_blocked`;
                  # v5: dw_blocked pads per band of rows in its kernel, 1x1 direct px stores from registers;
                  # v6: strided 1x1 direct px: subsampled plane + the 1x1 GEMM; direct px: unsigned reads, full
                  # tiles stored from registers, a half tile for a row's last pixels, taps grouped by phase;
                  # blocked's pad writes a pixel's channel block at once; v7: blocked vector-IR tiles whose pixels
                  # lie along one row (`pixel_run`) read their windows at constant offsets from one base, and
                  # accumulate in the output (column-major tiles, masked), the epilogue in place; v8: their
                  # residual Add a run-time flag (`residual_split`: one code for Relu and Add+Relu). (The direct
                  # vec='px' kernels' tile_code, a new option, leaves v8: its records run the code they ran)

    def matches(self, wl: Workload) -> bool:
        if not wl.ops or wl.ops[0]["op"] != "Conv" or wl.ops[0]["in"][:2] != ["i0", "i1"]:
            return False
        ins = wl.ops[0]["in"]
        if len(ins) == 3 and ins[2] != "i2" or len(ins) > 3:
            return False
        if any(i["dtype"] != "float32" for i in wl.inputs) or wl.output_dtype != "float32":
            return False
        x, w = wl.inputs[0]["shape"], wl.inputs[1]["shape"]
        if len(x) != 4 or len(w) != 4 or len(wl.output_shape) != 4:
            return False
        if wl.ops[0]["attrs"].get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") and \
                any(isinstance(d, str) for d in wl.inputs[0]["sym"][2:]):
            return False  # SAME_* pads depend on dynamic spatial sizes: not constants
        return _epilogue(wl) is not None

    def space(self, wl: Workload, target=None) -> ConfigSpace:
        if _is_depthwise(wl):
            plane = _dw_plane_fits(_geometry(wl))
            return ConfigSpace([
                Knob("algo", ("dw_blocked", "depthwise") + (("dw_plane",) if plane else ())),
                Knob("regtile", tuple(dict.fromkeys(dwb_tiles(target) + DW_TILES + (DW_PLANE_TILES if plane else ())))),
                Knob("parallel", (True, False), code_shape=False),
                Knob("PB", BLOCKS, code_shape=False),
                Knob("tile_code", tile_codes(target), before="slp"),   # SLP, or row_taps / block_taps
            ], constraint=partial(_depthwise_tiles, block_taps=_dwb_vector_fits(wl)))
        plane = _plane_fits(wl, target)
        wino = _winograd_fits(_geometry(wl))
        return ConfigSpace([
            Knob("algo", ("direct", "im2col", "blocked") + (("plane",) if plane else ())
                 + (("winograd",) if wino else ())),
            Knob("vec", ("oc", "px")),
            Knob("regtile", pick_tiles(REG_TILES_BY_SHAPE, *vector_shape(target)) + (PLANE_TILES if plane else ())),
            Knob("order", ("oc_px", "px_oc")),
            Knob("parallel", (True, False), code_shape=False),
            Knob("OCB", BLOCKS, code_shape=False),
            Knob("PB", BLOCKS, code_shape=False),
            Knob("tile_code", tile_codes(target), before="slp"),   # the blocked tile's code (conv2d_blocked); others: slp
            Knob("KC", (0,) + BLOCKS, code_shape=False, before=0),   # the vector-IR blocked tile's reduction chunk
        ], constraint=_blocked_vectors_along_channels)

    def default_config(self, wl: Workload, target=None) -> Config:
        """A per-shape heuristic (measured on ResNet-18 and MobileNetV2 layers, see
        experiments/bench_conv.md): the blocked (NCHWc) kernel for spatial convs of many
        channels, vectors along the pixels for 1x1 convs (GEMMs over the plane) and stems,
        im2col (rows packed end to end) on tiny maps, one thread for small work."""
        oc, ow = int(wl.inputs[1]["shape"][0]), int(wl.output_shape[3])
        oh = int(wl.output_shape[2])
        par = wl.flops() >= THREAD_WAKE_FLOPS
        if _is_depthwise(wl):
            geo = _geometry(wl)
            if vector_shape(target)[0] >= 16 and DEFAULT_VECTOR_IR and geo["SW"] <= 2 and ow >= 8 \
                    and _dw_plane_fits(geo):
                # AVX-512, rows of >= 8 output pixels, stride 1 or 2: NCHW as it is, the plane read
                # in place (`plane_taps`: masked loads for the pads, each input row loaded once for all
                # its taps and output rows, a stride's phases split by permutes), tiles as wide as
                # the row wastes least (`dw_plane_tile`). Against the defaults before (Emerald Rapids,
                # 1 thread, 2026-12-06, experiments/bench_conv.md): stride 2 1.2-2.0x faster than
                # dw_blocked (MobileNetV2's 96@48, 144@24, 96@112, 144@56, 192@28, MobileNetV3's
                # 72@16, 72@56 5x5); stride 1 1.2-2.2x faster than `depthwise` (row_taps from a padded
                # copy: 32@48, 144@24, 192@12, 144@56, 576@14) and than dw_blocked on 8-pixel rows
                # (96@8 5x5). Rows of 7 (960@7, 576@14/2) stay dw_blocked (7x16), as does AVX2: there
                # (haswell code, 8-float masked loads) dw_plane was no faster.
                return self.space(wl, target).validate({"algo": "dw_plane", "regtile": dw_plane_tile(ow),
                                                        "parallel": par, "PB": 1, "tile_code": tile_codes(target)[1]})
            if vector_shape(target) in DWB_VECTOR_DEFAULT and DEFAULT_VECTOR_IR and _dwb_vector_fits(wl):
                tile = dwb_default_tile(int(wl.inputs[0]["shape"][1]), ow, target)
                return self.space(wl, target).validate({"algo": "dw_blocked", "regtile": tile, "parallel": par,
                                                        "PB": 16, "tile_code": tile_codes(target)[1]})
            if geo["SW"] == 1 and ow >= 12:
                # stride 1, rows of >= 12 pixels: NCHW as it is, vectors along a row (no regroup
                # into channel blocks; the plane's copy into a zero-bordered buffer is a row
                # copy): 1.25-1.6x faster than dw_blocked on MobileNetV2's 48, 24 and 12 pixel
                # rows, even on 16x16 and 8x8 5x5 (experiments/profile_untuned.md, 2026-12-02)
                # AVX-512: rows of >= 24 pixels take 16-pixel vectors (4x16), 1.1-1.4x faster than 4x8 on
                # MobileNetV2's 32@48, 32@112, 144@56, 192@28; on 14-pixel rows 0.8x (Emerald Rapids, 2026-12-06)
                # The vector-IR tile (`row_taps`, Relu/ReLU6 in registers): as fast on wide rows, 1.1x
                # faster on 12- and 14-pixel rows, and it compiles in 0.6 s against 1.2-1.9 s (MobileNetV2's
                # stride-1 layers, Emerald Rapids, 2026-12-06, experiments/bench_conv.md)
                tile = "4x16" if vector_shape(target)[0] >= 16 and ow >= 24 else "4x8"
                return self.space(wl, target).validate({"algo": "depthwise", "regtile": tile, "parallel": par, "PB": 1,
                                                        "tile_code": tile_codes(target)[1] if DEFAULT_VECTOR_IR
                                                        else "slp"})
            # else vectors along 8-channel blocks: strided convs (a phase split copy of the
            # plane costs as much as the regroup) and tiny maps (7x7 and less waste most of a
            # row's vector), 1.0-3.1x faster than vectors along a plane's pixels there
            # (experiments/bench_conv.md); the tile per vector shape: `dwb_default_tile`. Bands of 16 output rows: the kernel regroups a band's input rows
            # (plus the window's halo) into a buffer that stays in cache
            tile = dwb_default_tile(int(wl.inputs[0]["shape"][1]), ow, target)
            return self.space(wl, target).validate({"algo": "dw_blocked", "regtile": tile, "parallel": par, "PB": 16})
        geo = _geometry(wl)
        if _plane_fits(wl, target) and DEFAULT_VECTOR_IR and ow >= 8:
            # a 3x3 stem (MobileNet's 3 -> 32 /2), AVX-512: the input planes read in place (no pad
            # step): 1.3x faster than the direct 8x32 tile at 96x96 and 224x224 (Emerald Rapids,
            # 2026-12-06, experiments/bench_conv.md)
            return self.space(wl, target).validate({"algo": "plane", "vec": "px", "regtile": PLANE_TILES[0],
                                                    "order": "oc_px", "parallel": par, "OCB": 1, "PB": 1,
                                                    "tile_code": tile_codes(target)[1], "KC": 0})
        P = oh * ow
        base = {"order": "oc_px", "parallel": par, "OCB": 1, "PB": 4, "tile_code": "slp"}
        one = geo["KH"] * geo["KW"] == 1
        cg = int(wl.inputs[1]["shape"][1])
        shape = vector_shape(target)
        stride1 = (geo["SH"], geo["SW"]) == (1, 1)
        small_map_cg = SMALL_MAP_BLOCKED_CG.get(shape)
        blocked = not one and (cg >= 16 or small_map_cg is not None and cg >= small_map_cg and oc > BLOCKED_MIN_OC
                               and ow < 14 and stride1 and DEFAULT_VECTOR_IR)
        gemm_pixels = pick_tiles(GEMM_1X1_PIXELS_BY_SHAPE, *shape)   # the plane GEMM's smallest plane
        deep_cg = SMALL_PLANE_1X1_DEEP.get(shape)
        small_1x1 = one and stride1 and deep_cg is not None and DEFAULT_VECTOR_IR \
            and 16 <= P < gemm_pixels
        if small_1x1 and cg > deep_cg:
            blocked = True   # a deep reduction over a small plane (`SMALL_PLANE_1X1_DEEP`)
        if one and not stride1 and P <= 16 and cg >= 64 and DEFAULT_VECTOR_IR \
                and _blocked_by_plane(shape):
            # a strided 1x1 onto a plane of at most 16 pixels (ResNet-18's 1x1/2 downsamples @4x4
            # and @2x2 at 64x64): the blocked kernel (its pad is the subsample), 1.6-1.7x faster than
            # the direct vec=px 14x32 and 2.0-2.6x than vec=oc 4x16 there, 1.0-1.15x onnxruntime
            # (Emerald Rapids, 2026-12-06); on 8x8 planes the direct GEMM stays 1.8x faster
            blocked = True
        if P < 16 and not (blocked and DEFAULT_VECTOR_IR and _blocked_by_plane(shape)):
            # a few pixels (squeeze-excite convs, 1x1 maps): vectors along the channels
            if one and cg > oc and shape in SQUEEZE_IM2COL and DEFAULT_VECTOR_IR:
                return self.space(wl, target).validate({**base, "algo": "im2col", "vec": "oc", "regtile": "4x16",
                                                        "PB": 1, "tile_code": tile_codes(target)[1]})
            return self.space(wl).validate({**base, "algo": "direct", "vec": "oc", "regtile": "4x16", "PB": 1})
        px_tiles = pick_tiles(PX_TILES, *shape)
        px_code = tile_codes(target)[1] if DEFAULT_VECTOR_IR else "slp"
        few = FEW_OC_PX_TILE.get(shape)
        if few is not None and blocked and oc <= BLOCKED_MIN_OC and stride1 and P >= 16 and DEFAULT_VECTOR_IR:
            # a deep spatial conv into a few channels (a detector's score map): vectors along the pixels
            wide = oc <= few[0] and ow >= few[1]
            return self.space(wl, target).validate({**base, "algo": "direct", "vec": "px", "regtile": few[2] if wide
                                                    else px_tiles[2], "tile_code": px_code})
        if not blocked and _single_pixel_windows(geo, wl.inputs[0]["shape"][2:], (oh, ow)) and \
                (oc <= 32 or small_1x1 or P >= gemm_pixels):
            # the plane read in place as a GEMM's panel (no packing), full tiles stored from
            # registers; 4 x 16 (8 accumulators: 6x16 and 4x24 spill in the unrolled k loop,
            # measured); 4 pixel tiles x 4 channel tiles a work item, pixels outside. Strided:
            # the plane of the pixels read, copied first (`_subsample`): ResNet-18's 1x1/2
            # convs 1.1-1.45x faster than im2col's panels (AVX-512 8x32; AVX2's 4x16, LLVM's
            # haswell code on the same Xeon: 1.14-1.38x, 2026-12-02, experiments/bench_conv.md)
            deep = px_code != "slp" and shape in PX_DEEP_TILE and cg >= 64 and oc >= 64 and P <= 256
            plane_tile = PX_DEEP_TILE[shape] if deep else \
                PX_PLANE_TILE.get(shape, px_tiles[0]) if px_code != "slp" else px_tiles[0]
            if not stride1 and P < 2 * _tile_dims(px_tiles[0])[1] and not deep:
                # a strided plane of less than two pixel tiles (ResNet-18's 1x1/2 @14: 49 pixels, 64
                # computed): pixels x channels tiles over im2col's panel (its packing is the subsample
                # step), one channel tile over all pixels a work item: 1.15x faster than the SLP 8x32 (Xeon,
                # AVX-512); the deep vector-IR 14x32 tile (AVX-512) is 1.08x faster than im2col (2026-12-03)
                return self.space(wl).validate({**base, "algo": "im2col", "vec": "oc", "regtile": px_tiles[0],
                                                "order": "oc_px", "OCB": 1, "PB": 8})
            return self.space(wl, target).validate({**base, "algo": "direct", "vec": "px", "order": "px_oc", "OCB": 4,
                                                    "regtile": plane_tile, "tile_code": px_code})
        wino = WINOGRAD_DEFAULT.get(shape)
        tiles = -(-oh // 2) * -(-ow // 2)
        if wino is not None and DEFAULT_VECTOR_IR and _winograd_fits(geo) and min(cg, oc) >= wino[0] \
                and tiles >= wino[1]:
            return self.space(wl, target).validate({**base, "algo": "winograd", "vec": "px",
                                                    "regtile": _winograd_tile(wino[2], tiles),
                                                    "order": "px_oc", "OCB": 4, "PB": 4,
                                                    "tile_code": tile_codes(target)[1]})
        if blocked:
            # many input channels: 8-channel blocks, 12 (AVX2) or 28 (AVX-512) accumulators along the output channels;
            # pixel tiles cross rows, so tiny maps (7x7, 14x14) fill them too. The vector-IR tile
            # (one call per tile, the accumulators in registers over the whole reduction): per
            # work item one weight panel x 16 pixel tiles (the panel reused from L1/L2); the SLP
            # tile: 4 pixel tiles x 4 panels, pixels outside (experiments/bench_conv.md)
            tile = blocked_tile(P, shape, ow, oc) if DEFAULT_VECTOR_IR else "6x16"
            blocks = {"order": "oc_px", "OCB": 1, "PB": 16} if DEFAULT_VECTOR_IR else \
                {"order": "px_oc", "OCB": 4, "PB": 4}
            return self.space(wl, target).validate({**base, "algo": "blocked", "vec": "oc", "regtile": tile, **blocks,
                                                    "tile_code": tile_codes(target)[1 if DEFAULT_VECTOR_IR else 0]})
        # stems (few channels) read rows directly; 1x1 convs, strided convs and tiny maps as
        # GEMMs over the packed plane. 4x16 / 6x16 keep the accumulators in 16 vector registers (PX_TILES)
        strided = geo["SW"] > 1 and cg >= 32
        algo = "im2col" if one or strided or ow < 14 else "direct"
        tile = px_tiles[1] if one or strided else px_tiles[2]
        patches = _patches(wl, geo)
        if (algo == "im2col" and P < _tile_dims(tile)[1]) or patches:
            # fewer pixels than one tile's run along them (a ViT's 16x16/16 patch conv on 64x64:
            # 16 pixels, AVX-512's 8x32 computing 32): vectors along the channels, pixels x
            # channels tiles: 2.1x faster there (0.114 -> 0.054 ms; Zen 4, 2026-12-03). The same for
            # a patch embedding (`_patches`): its panel is the input rearranged, read once. The
            # vector-IR tile: 1.07x faster than the SLP one on ViT's patch conv @64 (Emerald
            # Rapids); AVX2 (haswell code on that Xeon): 6x16 as vector IR 1.39x (16x16/16) and
            # 1.23x (8x8/8) faster than the direct kernel, 4x16 1.1-1.2x (AVX2's small-plane
            # case, not a patch, stays SLP: not measured)
            vector_ir = DEFAULT_VECTOR_IR and (patches or shape[0] >= 16)
            regtile = px_tiles[1] if patches else px_tiles[0]
            return self.space(wl, target).validate({**base, "algo": "im2col", "vec": "oc", "regtile": regtile,
                                                    "tile_code": tile_codes(target)[1] if vector_ir else "slp"})
        stem = STEM_TILE.get(shape)
        if stem is not None and algo == "direct" and cg <= PLANE_MAX_C and geo["KH"] * geo["KW"] <= 9:
            # a stem of at most 4 input channels, up to 3x3 (`STEM_TILE`): pixel tiles outside the
            # channel tiles, the wide tile where it computes no more pixels
            tile = stem if _covered(ow, _tile_dims(stem)[1]) <= _covered(ow, _tile_dims(tile)[1]) else tile
            base = {**base, "order": "px_oc", "OCB": 4}
        return self.space(wl, target).validate({**base, "algo": algo, "vec": "px", "regtile": tile,
                                                "tile_code": px_code if algo == "direct" else "slp"})

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        geo = _geometry(wl)
        epi = _epilogue(wl)
        if cfg["algo"] == "depthwise":
            return self._lower_depthwise(wl, cfg, geo, epi)
        if cfg["algo"] == "dw_blocked":
            return self._lower_dw_blocked(wl, cfg, geo, epi)
        if cfg["algo"] == "blocked":
            return self._lower_blocked(wl, cfg, geo, epi)
        if cfg["algo"] in ("plane", "dw_plane"):
            return self._lower_plane(wl, cfg, geo, epi)
        if cfg["algo"] == "winograd":
            return self._lower_winograd(wl, cfg, geo, epi)
        mr, nr = _tile_dims(cfg["regtile"])
        algo, order, vec = cfg["algo"], cfg["order"], cfg["vec"]
        tc, tp = (nr, mr) if vec == "oc" else (mr, nr)   # channels, pixels per tile
        par, OCB, PB = cfg["parallel"], cfg["OCB"], cfg["PB"]
        G, KH, KW = geo["G"], geo["KH"], geo["KW"]
        N, C, H, W = (int(d) for d in wl.inputs[0]["shape"])
        OC = int(wl.inputs[1]["shape"][0])
        OH, OW = (int(d) for d in wl.output_shape[2:])
        Cg, OCg = C // G, OC // G
        K, n_oct = Cg * KH * KW, -(-OCg // tc)
        n_ob = -(-n_oct // OCB)
        code = cfg.get("tile_code", "slp")   # configs recorded before the knob: slp, as they ran
        if algo == "direct" and vec == "px" and _single_pixel_windows(geo, (H, W), (OH, OW)) \
                and (_gemm_1x1_epilogue(epi, mr, nr) is not None or tile_lanes(code, nr)):
            return self._lower_gemm_1x1(wl, cfg, geo, epi)
        if algo == "direct" and _pointwise(geo, (H, W), (OH, OW)):
            # a 1x1 stride-1 conv is a GEMM over the whole plane: rows of the map do not matter,
            # so the direct kernel runs on the plane cut into rows that the tiles fill
            H, W = OH, OW = _flat_rows(OH * OW, tp)

        funcs = [_pack_w(tc), _pad(geo["SW"])]
        # im2col of an unpadded conv gathers straight from the input: no pass that copies it
        in_place = algo == "im2col" and _reads_in_bounds(wl, geo, OH, OW)
        funcs.append(_direct(mr, nr, vec, order, geo, epi, code) if algo == "direct" else _pack_im2col(tp, geo, in_place))
        if algo == "im2col":
            funcs.append(_gemm(mr, nr, vec, order, epi, tile_lanes(code, nr) if vec == "oc" else None))
        module = LoopModule(tuple(funcs), doc=f"conv2d kernel: {algo} vec={vec} regtile={mr}x{nr} order={order} "
                            f"kernel={KH}x{KW} stride={geo['SH']}x{geo['SW']} dilation={geo['DH']}x{geo['DW']}, "
                            f"epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"conv2d v{self.version}"})

        # weights -> Wp[g, oc_tile, k, 0:TC]: depends on the weight shape only, so constant
        # weights are packed once and shared by every shape of the signature
        wp = Buffer("Wp", (G, n_oct, K, tc))
        w_const = wl.inputs[1]["const"]
        pack_w = Call("pack_w", (In(1, (OC, K), "float32"), Packed("Wp") if w_const else Work("Wp"),
                                 Scalar(G), Scalar(OCg), Scalar(K)), items=G * n_oct, parallel=par)
        bias, tables = _bias(wl, OC)
        extras = tuple(e.arg(wl, N * OC, OH * OW, wl.output_shape) for e in epi.extras)
        ow_need = _covered(OW, tp) if algo == "direct" else OW   # direct tiles run past OW
        x, work, steps = _padded_input(wl, geo, OH, ow_need, par, (H, W)) if not in_place else \
            (In(0, (N, C, H, W), "float32"), [], [])
        if not w_const:
            work.insert(0, wp)
            steps.insert(0, pack_w)
        w = pack_w.args[1]
        if algo == "direct":
            steps.append(Call("conv", (x, w, bias, *extras, Out((N, OC, OH * OW)),
                                       *(Scalar(v) for v in (N, C, OC, G, OH, OW, OCB, PB))),
                              items=N * G * n_ob * -(-OH // PB), parallel=par))
        else:
            P = OH * OW
            n_pt = -(-P // tp)
            work.append(Buffer("Ap", (n_pt, K, tp)))
            per_group = (
                Call("pack_a", (x, Work("Ap"), Var("n"), Var("g"), Scalar(Cg), Scalar(OW), Scalar(P)),
                     items=n_pt, parallel=par),
                Call("gemm", (Work("Ap"), w, bias, *extras, Out((N, OC, P)), Var("n"), Var("g"),
                              *(Scalar(v) for v in (C, OC, G, OH, OW, OCB, PB))),
                     items=n_ob * -(-n_pt // PB), parallel=par),
            )
            steps.append(Repeat("n", N, (Repeat("g", G, per_group),)))
        prepare = (pack_w,) if w_const else ()
        return Lowered(module, Launch(tuple(steps), prepare=prepare, packed=(wp,) if w_const else (),
                                      workspaces=tuple(work), tables=tables))

    def _lower_gemm_1x1(self, wl: Workload, cfg: Config, geo: dict, epi: Epilogue) -> Lowered:
        """A 1x1 conv without pads with vectors along the pixels (`_gemm_1x1`): weights packed at
        prepare, one kernel reading the input plane in place, or, when strided, the plane of the
        pixels it reads (`_subsample`: a copy of 1/(SH*SW) of the input; 1.1-1.4x faster than
        im2col's gather into panels, which the GEMM then reads once per channel tile)."""
        mr, nr = _tile_dims(cfg["regtile"])
        par, OCB, PB, G = cfg["parallel"], cfg["OCB"], cfg["PB"], geo["G"]
        N, C, H, W = (int(d) for d in wl.inputs[0]["shape"])
        OC = int(wl.inputs[1]["shape"][0])
        OH, OW = (int(d) for d in wl.output_shape[2:])
        P = OH * OW
        Cg, OCg = C // G, OC // G
        n_oct = -(-OCg // mr)
        strided = (geo["SH"], geo["SW"]) != (1, 1)
        funcs = (_pack_w(mr),) + ((_subsample(geo["SH"], geo["SW"]),) if strided else ()) + (_gemm_1x1(mr, nr, cfg["order"], epi, cfg.get("tile_code", "slp")),)
        module = LoopModule(funcs, doc=f"conv2d kernel: direct 1x1 (GEMM over the plane) vec=px regtile={mr}x{nr} "
                            f"order={cfg['order']} stride={geo['SH']}x{geo['SW']}, epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"conv2d v{self.version}"})
        wp = Buffer("Wp", (G, n_oct, Cg, mr))
        w_const = wl.inputs[1]["const"]
        pack_w = Call("pack_w", (In(1, (OC, Cg), "float32"), Packed("Wp") if w_const else Work("Wp"),
                                 Scalar(G), Scalar(OCg), Scalar(Cg)), items=G * n_oct, parallel=par)
        bias, tables = _bias(wl, OC)
        extras = tuple(e.arg(wl, N * OC, P, wl.output_shape) for e in epi.extras)
        x, steps, work = In(0, (N, C, P), "float32"), (), ()
        if strided:
            x, work = Work("Xs"), (Buffer("Xs", (N, C, P)),)
            steps = (Call("subsample", (In(0, (N, C, H, W), "float32"), x, *(Scalar(v) for v in (N, C, OH, OW))),
                          items=N * C, parallel=par),)
        conv = _gemm_1x1_call((x, pack_w.args[1], bias, *extras, Out((N, OC, P))), (N, C, OC, G, P, OCB, PB), mr, nr,
                              par)
        steps += (conv,)
        if not w_const:
            steps, work = (pack_w,) + steps, (wp,) + work
        return Lowered(module, Launch(steps, prepare=(pack_w,) if w_const else (), packed=(wp,) if w_const else (),
                                      workspaces=work, tables=tables))

    def _lower_blocked(self, wl: Workload, cfg: Config, geo: dict, epi: Epilogue) -> Lowered:
        """The NCHWc-style direct conv (`conv2d_blocked`): pad into channel blocks, one kernel."""
        mr, nr = _tile_dims(cfg["regtile"])
        par, G, KH, KW = cfg["parallel"], geo["G"], geo["KH"], geo["KW"]
        N, C, H, W = (int(d) for d in wl.inputs[0]["shape"])
        OC = int(wl.inputs[1]["shape"][0])
        OH, OW = (int(d) for d in wl.output_shape[2:])
        Cg, OCg = C // G, OC // G
        cb = channel_block(Cg)
        lanes = tile_lanes(cfg.get("tile_code", "slp"), nr)   # configs recorded before the knob: slp, as they ran
        ncb, n_oct = -(-Cg // cb), -(-OCg // nr)
        n_pt = -(-(OH * OW) // mr)
        n_ob, n_pb = -(-n_oct // cfg["OCB"]), -(-n_pt // cfg["PB"])
        split = residual_split(epi) if lanes else None
        # with `split` the doc too is one for both residual variants: one module source, one compile
        epi_doc = f"epilogue [residual?] + {[st[0]['op'] for st in split[0].steps]}" if split else \
            f"epilogue {[st[0]['op'] for st in epi.steps]}"
        module = LoopModule((pack_w_blocked(nr, cb, KH, KW, tap_order(geo) if lanes else None), pad_blocked(geo["SW"], cb),
                             conv_blocked(mr, nr, cfg["order"], geo, epi, cb, lanes, pixel_run(mr, OW) if lanes else 0)),
                            doc=f"conv2d kernel: blocked (NCHW{cb}c) regtile={mr}x{nr} order={cfg['order']} "
                            + (f"tile_code={cfg['tile_code']} " if lanes else "") +
                            f"kernel={KH}x{KW} stride={geo['SH']}x{geo['SW']} dilation={geo['DH']}x{geo['DW']}, "
                            + epi_doc,
                            meta={"template": f"conv2d v{self.version}"})
        wp = Buffer("Wp", (G, n_oct, ncb * KH * KW * cb, nr))
        w_const = wl.inputs[1]["const"]
        pack_w = Call("pack_w", (In(1, (OC, Cg * KH * KW), "float32"), Packed("Wp") if w_const else Work("Wp"),
                                 Scalar(G), Scalar(OCg), Scalar(Cg), Scalar(ncb)), items=G * n_oct, parallel=par)
        bias, tables = _bias(wl, OC)
        extras = tuple(e.arg(wl, N * OC, OH * OW, wl.output_shape) for e in epi.extras)
        flag = ()
        if split:   # the one code of Relu and Add+Relu (`residual_split`): residual or a dummy, and its flag
            if split[1] is None:
                extras, tables = (Table("nores"),), {**tables, "nores": np.zeros((1, 1), np.float32)}
            flag = (Scalar(int(split[1] is not None)),)
        hp, wq = _padded_size(geo, OH, OW)
        xc = Buffer("Xc", (N, G * ncb, hp * geo["SW"] * wq * cb))
        pad = Call("pad", (In(0, (N, C, H, W), "float32"), Work("Xc"),
                           *(Scalar(v) for v in (N, C, G, H, W, hp, wq, geo["PT"], geo["PL"]))),
                   items=N * G * ncb, parallel=par)
        conv = Call("conv", (Work("Xc"), pack_w.args[1], bias, *extras, Out((N, OC, OH * OW)),
                             *(Scalar(v) for v in (N, OC, G, OH, OW, wq, cfg["OCB"], cfg["PB"])),
                             *((Scalar(cfg.get("KC", 0)),) if lanes else ()), *flag),
                    items=N * G * n_ob * n_pb, parallel=par)
        steps, work = (pad, conv), (xc,)
        if not w_const:
            steps, work = (pack_w,) + steps, (wp,) + work
        return Lowered(module, Launch(steps, prepare=(pack_w,) if w_const else (), packed=(wp,) if w_const else (),
                                      workspaces=work, tables=tables))

    def _lower_depthwise(self, wl: Workload, cfg: Config, geo: dict, epi: Epilogue) -> Lowered:
        """Depthwise on NCHW as it is: one kernel that pads each plane into a thread-local
        buffer, vectors along the pixels of a row; the tile SLP-vectorized from a phase-split
        plane (`conv2d_depthwise.conv_depthwise_rows`, tile_code "slp") or one vector-IR call
        reading the plain padded plane at the stride (`conv_depthwise_vector`)."""
        mr, nr = _tile_dims(cfg["regtile"])
        N, C, H, W = (int(d) for d in wl.inputs[0]["shape"])
        OC = int(wl.inputs[1]["shape"][0])
        OH, OW = (int(d) for d in wl.output_shape[2:])
        KH, KW = geo["KH"], geo["KW"]
        lanes = tile_lanes(cfg.get("tile_code", "slp"), nr)
        if lanes is None:
            kernel, code = conv_depthwise_rows(mr, nr, geo, epi), "slp"
            hp, wq = _padded_size(geo, max(OH, mr), max(OW, nr))   # tiles end inside a plane of at least MR x NR
        else:   # one plain padded plane (no phase split); a tile's last load reads S - 1 past its window
            kernel, code = conv_depthwise_vector(mr, nr, lanes, geo, epi), f"vec{lanes}"
            hp, wq = _padded_size(geo, max(OH, mr), 1)[0], max(OW, nr) * geo["SW"] + (KW - 1) * geo["DW"]
        module = LoopModule((kernel,),
                            doc=f"conv2d kernel: depthwise regtile={mr}x{nr} ({code}) kernel={KH}x{KW} "
                            f"stride={geo['SH']}x{geo['SW']} dilation={geo['DH']}x{geo['DW']}, "
                            f"epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"conv2d v{self.version}"})
        bias, tables = _bias(wl, OC)
        extras = tuple(e.arg(wl, N * OC, OH * OW, wl.output_shape) for e in epi.extras)
        weights = In(1, (OC, KH * KW) if lanes is None else (OC * KH * KW,), "float32")
        step = Call("conv", (In(0, (N, C * H * W), "float32"), weights, bias, *extras,
                             Out((N, OC * OH * OW)),
                             *(Scalar(v) for v in (N, C, OC, H, W, OH, OW, hp, wq, geo["PT"], geo["PL"]))),
                    items=N * C, parallel=cfg["parallel"])
        return Lowered(module, Launch((step,), tables=tables))

    def _lower_winograd(self, wl: Workload, cfg: Config, geo: dict, epi: Epilogue) -> Lowered:
        """F(2x2, 3x3) (`conv2d_winograd`): the weights transformed and packed at prepare; per call
        the zero-bordered pad, then per image the input transform, the plane GEMM (`_gemm_1x1`)
        over the 16 transformed planes as 16 groups, and the output transform with bias and epilogue."""
        mr, nr = _tile_dims(cfg["regtile"])
        par, OCB, PB = cfg["parallel"], cfg["OCB"], cfg["PB"]
        code = cfg.get("tile_code", "slp")
        N, C, H, W = (int(d) for d in wl.inputs[0]["shape"])
        OC = int(wl.inputs[1]["shape"][0])
        OH, OW = (int(d) for d in wl.output_shape[2:])
        TH, TW = -(-OH // 2), -(-OW // 2)
        lanes = tile_lanes(code, nr)   # the transforms' vectors: the GEMM tile's
        # V's and M's rows (`_plane_row`), with room for `wino_input`'s full-vector stores past a narrow
        # map's last row; the GEMM computes the P tiles only (at 7x7 a 17th column took a second 16-pixel tile)
        P, n_oct = TH * TW, -(-OC // mr)
        S = _plane_row(max(P, P - TW + lanes), (C, OC))
        # maps narrower than a run: each run of `wino_output` would store masked vectors (wide maps of odd
        # width only their rows' last: there the copy out costs more, 64->64 @55 204-260 -> 286-329 us)
        padded = TW < lanes
        none = Epilogue((), ())
        module = LoopModule((wino_weights(), _pack_w(mr), _pad(1), wino_input(lanes),
                             _gemm_1x1(mr, nr, cfg["order"], none, code, strided_rows=True),
                             wino_output(epi, lanes, padded)),
                            doc=f"conv2d kernel: winograd F(2x2, 3x3) GEMM vec=px regtile={mr}x{nr} order={cfg['order']}"
                            + (f" tile_code={code}" if code != "slp" else "")
                            + f", epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"conv2d v{self.version}"})
        w_const = wl.inputs[1]["const"]
        u, wp = Buffer("U", (XI * OC, C)), Buffer("Wp", (XI, n_oct, C, mr))
        arg = Packed if w_const else Work
        wino_w = Call("wino_w", (In(1, (OC, C * 9), "float32"), arg("U"), Scalar(OC), Scalar(C)), items=OC, parallel=par)
        pack_w = Call("pack_w", (arg("U"), arg("Wp"), Scalar(XI), Scalar(OC), Scalar(C)), items=XI * n_oct, parallel=par)
        wq = 2 * TW + 2   # the zero-bordered plane the 4x4 windows read, and spare rows for a run's overrun
        hp = 2 * TH + 2 + -(-(2 * lanes + 2) // wq)
        pad = Call("pad", (In(0, (N, C, H, W), "float32"), Work("Xp"),
                           *(Scalar(v) for v in (N, C, H, W, hp, wq, geo["PT"], geo["PL"]))), items=N * C, parallel=par)
        # per image (`Repeat`): V and M hold one image's transforms (at batch 32 on 32x32 maps a batch's
        # V of 34 MB ran the conv 1.6x slower than the blocked kernel; per image they stay in L2/L3)
        wino_in = Call("wino_in", (Work("Xp"), Work("V"), Var("n"), *(Scalar(v) for v in (C, TH, TW))), items=C,
                       parallel=par)
        gemm = _gemm_1x1_call((Work("V"), arg("Wp"), Table("zeros"), Work("M")), (1, XI * C, XI * OC, XI, P, OCB, PB),
                              mr, nr, par)
        bias, tables = _bias(wl, OC)
        extras = tuple(e.arg(wl, N * OC, OH * OW, wl.output_shape) for e in epi.extras)
        # a residual may be the output buffer: the tiles go to Y first; so do a narrow map's (`padded`: Y's
        # rows hold whole runs; `wino_out` at 256->256 @7 53-58 -> 22-41 us, 64->64 @14 25-28 -> 16-21)
        staged = epi.reads_output_sized or padded
        out = Out((N, OC, OH * OW))
        wino_out = Call("wino_out", (Work("M"), bias, *extras, Work("Y") if staged else out, out, Var("n"),
                                     Scalar(0) if staged else Var("n"), *(Scalar(v) for v in (OC, OH, OW, TH, TW))),
                        items=OC, parallel=par)
        # V: a spare row for the GEMM's edge tile, which reads NR columns of a row of fewer
        work = (Buffer("Xp", (N, C, hp, 1, wq)), Buffer("V", (1, XI * C + 1, S)), Buffer("M", (1, XI * OC, S))) \
            + ((Buffer("Y", (1, OC, 2 * TH * 2 * lanes if padded else OH * OW)),) if staged else ())
        steps = (pad, Repeat("n", N, (wino_in, gemm, wino_out)))
        if not w_const:
            steps, work = (wino_w, pack_w) + steps, (u, wp) + work
        return Lowered(module, Launch(steps, prepare=(wino_w, pack_w) if w_const else (),
                                      packed=(u, wp) if w_const else (), workspaces=work,
                                      tables={**tables, "zeros": np.zeros(XI * OC, np.float32)}))

    def _lower_plane(self, wl: Workload, cfg: Config, geo: dict, epi: Epilogue) -> Lowered:
        """`dw_plane` (depthwise) and `plane` (stems of 1-4 input channels, MO output channels a
        tile) on NCHW as it is: one kernel, one `plane_taps` vector-IR call per tile reading the
        unpadded input planes in place (`conv2d_depthwise.conv_depthwise_plane`, `_plane`: no pad
        step, no packing)."""
        mr, nr = _tile_dims(cfg["regtile"])
        lanes = tile_lanes(cfg["tile_code"], nr)
        N, C, H, W = (int(d) for d in wl.inputs[0]["shape"])
        OC, Cg = (int(d) for d in wl.inputs[1]["shape"][:2])
        OH, OW = (int(d) for d in wl.output_shape[2:])
        KH, KW = geo["KH"], geo["KW"]
        if cfg["algo"] == "dw_plane":
            kernel, what = conv_depthwise_plane(mr, nr, lanes, geo, epi), f"dw_plane regtile={mr}x{nr}"
            sizes, items = (N, C, OC, H, W, OH, OW), N * C
        else:
            mo = plane_channels(OC)
            kernel, what = _plane(mr, nr, lanes, mo, C, geo, epi), f"plane regtile={mr}x{nr} x {mo} channels"
            sizes, items = (N, OC, H, W, OH, OW), N * (OC // mo) * -(-OH // mr)
        module = LoopModule((kernel,), doc=f"conv2d kernel: {what} (vec{lanes}) kernel={KH}x{KW} "
                            f"stride={geo['SH']}x{geo['SW']} dilation={geo['DH']}x{geo['DW']}, "
                            f"epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"conv2d v{self.version}"})
        bias, tables = _bias(wl, OC)
        step = Call("conv", (In(0, (N, C * H * W), "float32"), In(1, (OC * Cg * KH * KW,), "float32"), bias,
                             *(e.arg(wl, N * OC, OH * OW, wl.output_shape) for e in epi.extras), Out((N, OC * OH * OW)),
                             *(Scalar(v) for v in sizes + (geo["PT"], geo["PL"]))),
                    items=items, parallel=cfg["parallel"])
        return Lowered(module, Launch((step,), tables=tables))

    def _lower_dw_blocked(self, wl: Workload, cfg: Config, geo: dict, epi: Epilogue) -> Lowered:
        """Depthwise along channel blocks (the tile's 8 or 16, `conv2d_depthwise`): weights packed at prepare, one
        kernel that regroups each band of input rows into channel blocks itself."""
        tp, cb = _tile_dims(cfg["regtile"])
        par = cfg["parallel"]
        N, C, H, W = (int(d) for d in wl.inputs[0]["shape"])
        OC = int(wl.inputs[1]["shape"][0])
        M = OC // C
        OH, OW = (int(d) for d in wl.output_shape[2:])
        KH, KW = geo["KH"], geo["KW"]
        ncb = -(-C // cb)
        vector = cfg["tile_code"] != "slp"   # `_dwb_vector_fits` (the space's constraint)
        module = LoopModule((pack_w_depthwise(cb, KH * KW),
                             conv_depthwise(tp, geo, epi, cb, vector, full=C % cb == 0 and OW >= tp)),
                            doc=f"conv2d kernel: dw_blocked (NCHW{cb}c) regtile={tp}x{cb} kernel={KH}x{KW} "
                            f"stride={geo['SH']}x{geo['SW']} dilation={geo['DH']}x{geo['DW']}, "
                            f"epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"conv2d v{self.version}"})
        wp = Buffer("Wp", (M, ncb, KH * KW * cb))
        w_const = wl.inputs[1]["const"]
        pack_w = Call("pack_w", (In(1, (OC, KH * KW), "float32"), Packed("Wp") if w_const else Work("Wp"),
                                 Scalar(C), Scalar(M)), items=M * ncb, parallel=par)
        bias, tables = _bias(wl, OC)
        extras = tuple(e.arg(wl, N * OC, OH * OW, wl.output_shape) for e in epi.extras)
        wpad = (OW - 1) * geo["SW"] + (KW - 1) * geo["DW"] + 1   # the columns the windows read
        conv = Call("conv", (In(0, (N, C * H * W), "float32"), pack_w.args[1], bias, *extras, Out((N, OC * OH * OW)),
                             *(Scalar(v) for v in (N, C, M, H, W, OH, OW, wpad, geo["PT"], geo["PL"], cfg["PB"]))),
                    items=N * ncb * -(-OH // cfg["PB"]), parallel=par)
        steps, work = (conv,), ()
        if not w_const:
            steps, work = (pack_w, conv), (wp,)
        return Lowered(module, Launch(steps, prepare=(pack_w,) if w_const else (), packed=(wp,) if w_const else (),
                                      workspaces=work, tables=tables))


def _dw_plane_fits(geo: dict) -> bool:
    """`dw_plane` computes this depthwise conv: a tap's shift along the row stays within one
    vector of 4 or more lanes (`plane_taps`)."""
    return (geo["KW"] - 1) * geo["DW"] <= 4


def _plane_fits(wl: Workload, target=None) -> bool:
    """`plane` computes this conv on this target: AVX-512 (AVX2's 16-pixel tiles are two vectors,
    and spill), one group of at most PLANE_MAX_C input channels, stride 1 or 2 along the rows,
    kernels up to 3x3 without dilation along the rows (a 7x7/2 stem ran 1.2x slower than the
    direct kernel), and an epilogue the tile applies in registers (none, Relu, ReLU6)."""
    if _is_depthwise(wl) or vector_shape(target)[0] < 16:
        return False
    geo = _geometry(wl)
    return geo["G"] == 1 and int(wl.inputs[0]["shape"][1]) <= PLANE_MAX_C and geo["SW"] <= 2 \
        and geo["KH"] * geo["KW"] <= 9 and geo["DW"] == 1 and _epilogue(wl).clamp_bounds() is not None


def plane_channels(oc: int) -> int:
    """Output channels a `plane` tile computes (MO): 8, or the largest of 4, 2, 1 dividing OC."""
    return next(m for m in (8, 4, 2, 1) if oc % m == 0)


def _plane(mr: int, nr: int, lanes: int, mo: int, c: int, geo: dict, epi: Epilogue) -> Function:
    """The `plane` kernel (stems): copy t of T's share of the work items (n, block of MO output
    channels, band of MR output rows), blocks outside so that a thread writes whole channel
    planes (the depthwise conv after a MobileNet stem then reads its own core's planes); per item
    and NR pixels of the band's rows one `plane_taps` call over the C input planes, the pads as
    masked loads, Relu/ReLU6 in registers, partial tiles stored masked."""
    g = geo
    lo, hi = epi.clamp_bounds()
    literals = f"{mr}, {g['SH']}, {g['KH']}, {g['KW']}, {g['DH']}, {g['DW']}, {g['SW']}, {c}, {mo}, {nr}, {lanes}"
    kk = g["KH"] * g["KW"]
    body = (
        Assign("n_ht", f"(OH + {mr - 1}) // {mr}"), Assign("n_owt", f"(OW + {nr - 1}) // {nr}"),
        Assign("n_ob", f"OC // {mo}"), Assign("lo", lo), Assign("hi", hi),
        thread_share("it", "N * n_ob * n_ht", body=(
            *unflatten("it", (("ht", "n_ht"), ("ob", "n_ob")), "n"),
            Assign("xn", "X[n]"), Assign("oimg", "out[n]"),
            Assign("oh0", f"ht * {mr}"), Assign("nrow", f"min({mr}, OH - oh0)"),
            For("owt", "0", "n_owt", (
                Assign("ow0", f"owt * {nr}"), Assign("ncol", f"min({nr}, OW - ow0)"),
                Comment(f"{mo} channels x {mr}x{nr} conv tile over {c} input planes, one plane_taps call"),
                LoopCall(f"plane_taps(xn, 0, W, H * W, oh0 * {g['SH']} - PT, H, W, ow0 * {g['SW']} - PL, Wt, "
                     f"ob * {mo * c * kk}, {c * kk}, bias, ob * {mo}, oimg, (ob * {mo} * OH + oh0) * OW + ow0, OW, "
                     f"OH * OW, nrow, ncol, lo, hi, {literals})"),
            )),
        )),
    )
    params = (Param("X", "float32[:, ::1]"), Param("Wt", "float32[::1]"), Param("bias", "float32[::1]")) \
        + tuple(Param(n, t) for n, t in epi.params()) + (Param("out", "float32[:, ::1]"),) + tuple(
        Param(n, "int64") for n in ("N", "OC", "H", "W", "OH", "OW", "PT", "PL", "t", "T"))
    return Function("conv", params, epi.prelude() + body)


def _covered(n: int, w: int) -> int:
    """Pixels that tiles of `w` compute over a run of `n` (the last tile's overrun included)."""
    return -(-n // w) * w


def dw_plane_tile(ow: int) -> str:
    """The untuned `dw_plane` tile for rows of `ow` output pixels: 4 rows x 16 or 32 pixels,
    whichever computes fewer pixels past the row's tiles (ties: the wider, fewer tiles); rows
    of 8 or less 4x8. (Measured on AVX-512: 8-pixel tiles run half-width vectors, 1.5x slower on
    24-pixel rows than one 32-pixel tile; a 32-pixel tile on 12-pixel rows computes a vector
    for nothing, 1.5x slower than 4x16.)"""
    if ow <= 8:
        return "4x8"
    return min(("4x32", "4x16"), key=lambda t: _covered(ow, _tile_dims(t)[1]))


def _dwb_vector_fits(wl: Workload) -> bool:
    """`dw_blocked`'s vector-IR tile (`block_taps`) computes this conv: one output channel per
    input channel (its bias and output rows are the block's), and no residual extra (which may
    be the output buffer itself: the tile stores before the epilogue reads it)."""
    return int(wl.inputs[1]["shape"][0]) == int(wl.inputs[0]["shape"][1]) and not _epilogue(wl).reads_output_sized


def _depthwise_tiles(values: dict, block_taps: bool = False) -> str | None:
    algo, tile = values.get("algo"), values.get("regtile")
    if algo == "dw_blocked" and tile not in DWB_ALL_TILES:
        return f"dw_blocked tiles are pixels x channels of a block: {', '.join(DWB_ALL_TILES)}"
    if algo == "depthwise" and (tile not in DW_TILES or values.get("PB", 1) != 1):
        return f"depthwise tiles are rows x pixels ({', '.join(DW_TILES)}), one plane per work item (PB=1)"
    if algo == "dw_blocked" and values.get("tile_code", "slp") != "slp" and not block_taps:
        return "dw_blocked's vector-IR tile (block_taps) is for one output channel per input channel and no " \
               "residual input; tile_code='slp' here"
    if algo == "dw_plane" and (tile not in DW_PLANE_TILES or values.get("PB", 1) != 1
                                   or values.get("tile_code", "slp") == "slp"):
        return f"dw_plane tiles are rows x pixels ({', '.join(DW_PLANE_TILES)}) of vector-IR code (tile_code " \
               "vec<lanes>), one plane per work item (PB=1)"
    return None


def _plane_row(least: int, channels: tuple) -> int:
    """The length of winograd's V and M rows, at least `least` floats: a multiple of 8 (rows 32-byte
    aligned: the GEMM's vector loads cross no cache line) whose planes, `channels` rows apart, do
    not lie a multiple of 4 KiB apart (16 planes in the same cache sets: 64->64 @56 ran 3x slower
    in the input transform); where every such length does (128 channels and more), an odd one. 1
    thread, Zen 3, interleaved: 64->64 @56 2458-2471 -> 2177 us with rows of 792 against 785 (784,
    aligned in the same sets: 2295); 128->128 @28 1606-1627 us with 197 (208, aligned in the same
    sets: 1605)."""
    for row in range(-(-least // 8) * 8, least + 64, 8):
        if all(row * c % 1024 for c in channels):
            return row
    return least + 1 - least % 2


def _winograd_tile(tiles: tuple, count: int) -> str:
    """Of winograd's GEMM tiles in order of preference, the first, unless a later one computes 10 %
    fewer columns over the `count` tiles of a plane (its pixel tiles cover them, the last moved left;
    a plane of fewer than NR tiles still computes NR)."""
    def columns(tile: str) -> int:
        nr = _tile_dims(tile)[1]
        return -(-count // nr) * nr
    best = tiles[0]
    for tile in tiles[1:]:
        if columns(tile) <= 0.9 * columns(best):
            best = tile
    return best


def _winograd_fits(geo: dict) -> bool:
    """`winograd` (F(2x2, 3x3)) computes this conv: 3x3, stride 1, no dilation, one group."""
    return (geo["KH"], geo["KW"], geo["SH"], geo["SW"], geo["DH"], geo["DW"], geo["G"]) == (3, 3, 1, 1, 1, 1, 1)


def _blocked_vectors_along_channels(values: dict) -> str | None:
    if values.get("algo") == "winograd" and (values.get("vec") != "px" or values.get("KC", 0)
                                             or values.get("tile_code", "slp") == "slp"):
        return "winograd's GEMM is the vector-IR plane GEMM along the tiles (vec='px', tile_code vec<lanes>, KC=0)"
    if (values.get("algo") == "plane") != (values.get("regtile") in PLANE_TILES):
        return f"the plane algorithm's tiles are output rows x pixels ({', '.join(PLANE_TILES)}), its own"
    if values.get("algo") == "plane":
        if values.get("tile_code", "slp") == "slp" or values.get("vec") != "px" or values.get("KC", 0):
            return "the plane algorithm is vector-IR code along the pixels (vec='px', tile_code vec<lanes>, KC=0)"
        return None
    if values.get("algo") == "blocked" and values.get("vec") != "oc":
        return "the blocked algorithm vectorizes along output channels only (vec='oc')"
    vector_ir = values.get("tile_code", "slp") != "slp"
    if vector_ir and values.get("algo") != "blocked" and (values.get("algo"), values.get("vec")) not in \
            (("direct", "px"), ("im2col", "oc"), ("winograd", "px")):
        return "only the blocked, the direct vec='px' and the im2col vec='oc' kernels have a vector-IR tile " \
               "(tile_code='slp' for the others)"
    if values.get("KC", 0) and (values.get("algo") != "blocked" or values.get("tile_code", "slp") == "slp"):
        return "only the blocked algorithm's vector-IR tile splits its reduction (KC=0 for the others)"
    if values.get("regtile") not in REG_TILES and not vector_ir:
        return "the wide AVX-512 tiles are for the vector-IR tiles only (their 32 registers; SLP code spills)"
    return None


def _bias(wl: Workload, OC: int):
    if len(wl.ops[0]["in"]) == 3:
        return In(2, (OC,), "float32"), {}
    # one code for convs with and without bias: these add zeros
    return Table("bias0"), {"bias0": np.zeros(OC, np.float32)}


def _padded_size(geo: dict, oh_need: int, ow_need: int) -> tuple[int, int]:
    """Rows and phase-row width of the padded input that tiles covering `oh_need` output rows
    and `ow_need` pixels of a row read."""
    return ((oh_need - 1) * geo["SH"] + (geo["KH"] - 1) * geo["DH"] + 1,
            ow_need + (geo["KW"] - 1) * geo["DW"] // geo["SW"])


def _pointwise(geo: dict, hw: tuple, ohw: tuple) -> bool:
    """A 1x1 conv of stride 1 without pads: each output pixel reads its own input pixel."""
    return geo["KH"] == geo["KW"] == geo["SH"] == geo["SW"] == 1 and not geo["PT"] and not geo["PL"] \
        and tuple(hw) == tuple(ohw)


def _single_pixel_windows(geo: dict, hw: tuple, ohw: tuple) -> bool:
    """A 1x1 conv (any stride) whose every output pixel reads one pixel inside the input (no pads)."""
    return geo["KH"] == geo["KW"] == 1 and not geo["PT"] and not geo["PL"] \
        and (ohw[0] - 1) * geo["SH"] < hw[0] and (ohw[1] - 1) * geo["SW"] < hw[1]


def _flat_rows(P: int, tp: int, widest: int = 256) -> tuple[int, int]:
    """(rows, width) to view a plane of P pixels as: the widest multiple of the tile's TP
    pixels (up to `widest`) that divides P, so that tiles never run past a row and the
    rows still split into work items; else one row of P."""
    for w in range(widest - widest % tp, 0, -tp):
        if P % w == 0:
            return P // w, w
    return 1, P


def _padded_input(wl: Workload, geo: dict, oh_need: int, ow_need: int, par: bool, hw: tuple | None = None):
    """The input as the kernels read it, Xp[N, C, HP, SW, WQ] (phase-split, zero-bordered
    to what the tiles read when they run `oh_need` rows and `ow_need` pixels), and the
    workspace and `pad` step that make it; a plain view of the input when none is needed.
    `hw`: the (H, W) to view the input planes as (a 1x1 conv's rows, `_flat_rows`)."""
    N, C, H, W = (int(d) for d in wl.inputs[0]["shape"])
    H, W = hw or (H, W)
    SW = geo["SW"]
    hp, wq = _padded_size(geo, oh_need, ow_need)
    if SW == 1 and not geo["PT"] and not geo["PL"] and hp <= H and wq <= W:
        return In(0, (N, C, H, 1, W), "float32"), [], []
    work = [Buffer("Xp", (N, C, hp, SW, wq))]
    pad = Call("pad", (In(0, (N, C, H, W), "float32"), Work("Xp"),
                       *(Scalar(v) for v in (N, C, H, W, hp, wq, geo["PT"], geo["PL"]))), items=N * C, parallel=par)
    return Work("Xp"), work, [pad]


def _pack_w(tc: int) -> Function:
    """W[OC, K] (K = C/G * KH * KW) into TC-channel panels Wp[g, oc_tile, k, 0:TC], zeros past
    the group's channels; thread t of T packs its share of the panels"""
    body = (
        Assign("n_oct", f"(OCg + {tc - 1}) // {tc}"),
        thread_share("it", "G * n_oct", body=(
            Assign("g", "it // n_oct"), Assign("oct", "it % n_oct"),
            For("k", "0", "K", (
                For("q", "0", str(tc), (
                    Assign("oc", f"oct * {tc} + q"),
                    If("oc < OCg", (Assign("Wp[g, oct, k, q]", "W[g * OCg + oc, k]"),),
                       (Assign("Wp[g, oct, k, q]", F0),)),
                )),
            )),
        )),
    )
    params = (Param("W", "float32[:, ::1]"), Param("Wp", "float32[:, :, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("G", "OCg", "K", "t", "T"))
    return Function("pack_w", params, body)


def _pad_plane(s: int, dst: str, src: str) -> tuple:
    """Statements filling the plane `dst` ([HP, S, WQ]) from the input plane `src` ([H, W]):
    dst[ih, ph, j] = src[ih - PT, j * S + ph - PL], zero outside. Copies go through views
    indexed from 0: with `dst[..., PL + iw]` numba's negative-index wraparound keeps LLVM
    from vectorizing them (4-6x slower, measured)."""
    copy = "srow[jj]" if s == 1 else f"srow[jj * {s}]"
    row = (
        For("ph", "0", str(s), (
            Assign("drow", "xpl[ih, ph]"),
            Assign("j0", f"min(WQ, max(0, (PL - ph + {s - 1}) // {s}))"),
            Assign("j1", f"max(j0, min(WQ, (W + PL - ph + {s - 1}) // {s}))"),
            For("j", "0", "j0", (Assign("drow[j]", F0),)),
            Assign("d", "drow[j0:j1]"), Assign("srow", f"xsrc[h, j0 * {s} + ph - PL:]"),
            For("jj", "0", "j1 - j0", (Assign("d[jj]", copy),)),
            For("j", "j1", "WQ", (Assign("drow[j]", F0),)),
        )),
    )
    zero = (For("ph", "0", str(s), (For("j", "0", "WQ", (Assign("xpl[ih, ph, j]", F0),)),)),)
    return (Assign("xpl", dst), Assign("xsrc", src), For("ih", "0", "HP", (
        Assign("h", "ih - PT"),
        If("h >= 0 and h < H", row, zero),
    )))


def _pad(s: int) -> Function:
    """X[N, C, H, W] into the workspace Xp[N, C, HP, S, WQ], phase-split by the stride S (see
    `_pad_plane`; a workspace holds garbage when a call starts, so every element is written);
    thread t of T writes its share of the planes"""
    body = (
        thread_share("p", "N * C", body=(
            Assign("n", "p // C"), Assign("c", "p % C"),
        ) + _pad_plane(s, "Xp[n, c]", "X[n, c]")),
    )
    params = (Param("X", "float32[:, :, :, ::1]"), Param("Xp", "float32[:, :, :, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("N", "C", "H", "W", "HP", "WQ", "PT", "PL", "t", "T"))
    return Function("pad", params, body)


def _params(epi: Epilogue, first: tuple, out_type: str = "float32[:, :, :, ::1]") -> tuple:
    return first + (Param("Wp", "float32[:, :, :, ::1]"), Param("bias", "float32[::1]")) \
        + tuple(Param(n, t) for n, t in epi.params()) + (Param("out", out_type),)


def _store_oc(nr: int, epi: Epilogue, pixel: tuple, out: str) -> tuple:
    """Store of a pixels x channels tile: row r is a pixel (`pixel` sets `ok` and its index)."""
    assigns, result = epi.emit("v", "n * OC + oc", "oh * OW + ow", "e", c="oc")
    return pixel + (
        If("ok", (
            For("q", "0", f"min({nr}, OCg - oct * {nr})", (
                Assign("oc", f"g * OCg + oct * {nr} + q"),
                Assign("v", "ct[r, q] + bias[oc]"),
            ) + tuple(Assign(n, e) for n, e in assigns) + (Assign(out, result),)),
        )),
    )


def _store_px(mr: int, nr: int, epi: Epilogue, row: str, p0: str, count: str, j: str,
              tile: str = "ct[r, q]") -> tuple:
    """Store of a channels x pixels tile: row r is channel oct*MR + r, its pixels p0 + q are
    contiguous in `row` (the output row or plane), so the loop over q stores vectors. It
    writes through a view that starts at p0: indexed from 0 by the loop variable, numba
    leaves out its negative-index test and LLVM vectorizes the loop (with `row[p0 + q]` the
    store stayed scalar and cost more than the tile's FMAs when K is small, measured). `tile`:
    element q of the tile's row r (the scratch tile, or `orow[q]`: the stored tile in place)."""
    assigns, result = epi.emit("v", "n * OC + oc", j, "e", c="oc")
    return (
        If(f"oct * {mr} + r < OCg", (
            Assign("oc", f"g * OCg + oct * {mr} + r"), Assign("bo", "bias[oc]"), Assign("orow", f"{row}[{p0}:]"),
            For("q", "0", count, (
                Assign("pq", f"{p0} + q"), Assign("v", f"{tile} + bo"),
            ) + tuple(Assign(n, e) for n, e in assigns) + (Assign("orow[q]", result),)),
        )),
    )


def _tile_loops(order: str, px: tuple, body: tuple) -> tuple:
    oc = ("oct", "ob * OCB", "min(n_oct, ob * OCB + OCB)")
    outer, inner = (oc, px) if order == "oc_px" else (px, oc)
    return (For(*outer, body=(For(*inner, body=body),)),)


def _taps(g: dict, inner: tuple, row: str) -> tuple:
    """Loops over the kernel window for input row `row` (an expression of kh): per tap, `xq`
    is the phase of that input row the tap reads and `j0` where the tile's pixels start."""
    return (For("kh", "0", str(g["KH"]), (
        Assign("xr", f"Xp[n, ci, {row}]"),
        Assign("kb", f"(c * {g['KH']} + kh) * {g['KW']}"),
        For("kw", "0", str(g["KW"]), (
            Assign("xq", f"xr[(kw * {g['DW']}) % {g['SW']}]"),
            Assign("j0", f"ow0 + (kw * {g['DW']}) // {g['SW']}"),
            Assign("k", "kb + kw"),
        ) + inner),
    )),)


def _direct(mr: int, nr: int, vec: str, order: str, geo: dict, epi: Epilogue, code: str = "slp") -> Function:
    g = geo

    def k_loops(body):
        return (For("c", "0", "Cg", (Assign("ci", "g * Cg + c"),) + _taps(g, body, f"oh * {g['SH']} + kh * {g['DH']}")),)

    if vec == "oc":
        tp = mr
        store = _store_oc(nr, epi, (Assign("ow", "ow0 + r"), Assign("ok", "ow < OW")), "out[n, oc, oh * OW + ow]")
        a_load, b_load = (lambda r: f"xq[j0 + {r}]"), (lambda q: f"Wk[k, {q}]")
        what = f"{mr}x{nr} register tile (pixels x output channels), SLP-vectorized along channels"
    else:
        tp = nr
        store = _store_px(mr, nr, epi, "out[n, oc]", "oh * OW + ow0", f"min({nr}, OW - ow0)", "pq")
        a_load, b_load = (lambda r: f"Wk[k, {r}]"), (lambda q: f"xq[j0 + {q}]")
        what = f"{mr}x{nr} register tile (output channels x pixels), SLP-vectorized along pixels"
    vector = vec == "px" and tile_lanes(code, nr) is not None
    in_place = not vector and vec == "px" and nr % 2 == 0 and _gemm_1x1_epilogue(epi, mr, nr) is not None
    if vector:
        tile = _direct_px_vector(mr, nr, geo, epi, code)
    elif in_place:
        tile = _direct_px_in_place(mr, nr, geo, epi)
    else:
        tile = (Assign("ow0", f"owt * {tp}"), Assign("Wk", "Wp[g, oct]")) + register_tile(
            mr, nr, a_load, b_load, k_loops, store, comment=what)
    tc = nr if vec == "oc" else mr
    body = (
        Assign("Cg", "C // G"), Assign("OCg", "OC // G"),
        Assign("n_oct", f"(OCg + {tc - 1}) // {tc}"), Assign("n_ob", "(n_oct + OCB - 1) // OCB"),
        Assign("n_owt", f"(OW + {tp - 1}) // {tp}"), Assign("n_hb", "(OH + PB - 1) // PB"),
        *(Assign(f"u{q}", f"np.uint64({q})") for q in (range(max(mr, nr)) if in_place else ())),
        *((Assign("P", "OH * OW"), Assign("WQ", "Xp.shape[4]"), Assign("XR", "Xp.shape[3] * WQ"),
           Assign("XC", "Xp.shape[2] * XR")) if vector else ()),
        Alloc("ct", (str(mr), str(nr))),
        thread_share("it", "N * G * n_ob * n_hb", body=(
            *unflatten("it", (("hb", "n_hb"), ("ob", "n_ob"), ("g", "G")), "n"),
            Assign("og", "out[n]"), Assign("un", "np.uint64(n)"), Assign("ug", "np.uint64(g)"),
            For("oh", "hb * PB", "min(OH, hb * PB + PB)",
                _tile_loops(order, ("owt", "0", "n_owt"), tile)),
        )),
    )
    params = _params(epi, (Param("Xp", "float32[:, :, :, :, ::1]"),), "float32[:, :, ::1]") + tuple(
        Param(n, "int64") for n in ("N", "C", "OC", "G", "OH", "OW", "OCB", "PB", "t", "T"))
    return Function("conv", params, epi.prelude() + body)


def _direct_px_in_place(mr: int, nr: int, geo: dict, epi: Epilogue) -> tuple:
    """The direct kernel's channels x pixels tile (pixels ow0 .. of one output row) read at
    unsigned indices of Xp and Wp (no views per tap: with few input channels, stems, the taps
    are the loop) and, where it lies inside the output, stored from its accumulators with bias
    and epilogue applied there (`register_tile_in_place`; through `ct` the store cost as much
    as a 3-channel stem's FMAs). A row's last pixels that fit half a tile run a MR x NR/2 tile
    (112-pixel rows: 3 full tiles and a half, not 4 with 16 pixels computed twice). Without
    extras a row's last tile moves left to end at the row's end, so rows of at least NR pixels
    store full tiles only."""
    g = geo
    a_load = lambda r: f"Wp[ug, uoct, uk, u{r}]"           # noqa: E731
    b_load = lambda q: f"Xp[un, uci, urow, uph, uj0 + u{q}]"  # noqa: E731

    def k_loops(body):   # taps of one phase of the input row together (kw = kp, kp + SW, ...): its row is a constant
        return (For("c", "0", "Cg", (Assign("uci", "np.uint64(g * Cg + c)"),) + (For("kh", "0", str(g["KH"]), (
            Assign("urow", f"np.uint64(oh * {g['SH']} + kh * {g['DH']})"),
            Assign("kb", f"(c * {g['KH']} + kh) * {g['KW']}"),
            For("kp", "0", str(min(g["SW"], g["KW"])), (
                Assign("uph", "np.uint64(kp)" if g["DW"] == 1 else f"np.uint64((kp * {g['DW']}) % {g['SW']})"),
                For("i", "0", f"({g['KW']} - kp + {g['SW'] - 1}) // {g['SW']}", (
                    Assign("kw", f"kp + i * {g['SW']}"),
                    Assign("uj0", "np.uint64(ow0 + i)" if g["DW"] == 1 else f"np.uint64(ow0 + (kw * {g['DW']}) // {g['SW']})"),
                    Assign("uk", "np.uint64(kb + kw)"),
                ) + body),
            )),
        )),)),)

    def tile(w: int) -> tuple:
        ow0 = f"min(owt * {nr}, max(0, OW - {w}))" if not epi.reads_output_sized else f"owt * {nr}"
        return (Assign("ow0", ow0), Assign("p0", "oh * OW + ow0")) + register_tile_in_place(
            mr, w, a_load, b_load, k_loops, "og", "oc0", "p0", full=f"oct * {mr} + {mr} <= OCg and ow0 + {w} <= OW",
            edge_store=_store_px(mr, w, epi, "og[oc]", "p0", f"min({w}, OW - ow0)", "pq"),
            epilogue=_gemm_1x1_epilogue(epi, mr, w),
            comment=f"{mr}x{w} register tile (output channels x pixels of a row), SLP-vectorized along pixels, "
                    f"stored from registers")
    half = nr // 2
    return (Assign("oc0", f"g * OCg + oct * {mr}"), Assign("uoct", "np.uint64(oct)"),
            If(f"owt * {nr} + {half} >= OW and OW >= {half}", tile(half), tile(nr)))


def _px_vector_tile(mr: int, w: int, lanes: int, a_rows: list, a_kstride: str, b: str, b_offset: str,
                    b_kstride: str, n_k: str, full: str, edge_count: str, epi: Epilogue, shift: str = "0",
                    stride: str = "P") -> tuple:
    """The channels x pixels tile (MR output channels from oc0 x W pixels from p0 of the plane
    P) as one `tile_fma` call (`codegen.vector_tile`): rows of Wp (`a_rows`) times `b`'s
    contiguous pixels over the reduction `n_k` (an integer or its nest form). Where the tile lies
    inside the output (`full`) and the epilogue reads no residual (`Epilogue.reads_output_sized`) it is stored into the output
    row-major (stride P), then bias and epilogue run over the stored tile in place, a loop of W
    contiguous elements per channel at unsigned indices (vectorized; a view per row cost an NRT
    incref and decref each, 3x the tile's FMAs at K = 16, measured); else it goes to the scratch
    tile `ct` and the edge store writes `edge_count` pixels from its column `shift` (a residual
    input may be the output buffer itself: its element is read before the store that overwrites
    it); a full tile whose epilogue starts with the residual Add goes from `ct` through
    `residual_rows` (a row's loads before its stores). One call, not an SLP-vectorized unrolled
    tile: numba lowers a few statements, not MR*W accumulators (cold compile)."""
    def call(out: str, offset: str, stride: str) -> Call:
        return vector_tile("Wp", a_rows, a_kstride, b, b_offset, b_kstride, n_k, out, offset, stride, "False", w, lanes)

    def over_stored(e: Epilogue, bias: bool) -> For:
        """`e` (after the bias, where `bias`) over the full tile stored in `og`, in place: per channel
        W contiguous elements at unsigned indices (vectorized)."""
        assigns, result = e.emit("v", "n * OC + oc0 + r", "p0 + q", "e", c="oc0 + r")
        return For("r", "0", str(mr), (Assign("uoc", "np.uint64(oc0 + r)"),) + ((Assign("bo", "bias[uoc]"),) if bias else ())
                   + (For("q", "0", str(w), (Assign("uq", "np.uint64(p0 + q)"),
                                             Assign("v", "og[uoc, uq] + bo" if bias else "og[uoc, uq]"))
                          + tuple(Assign(n, x) for n, x in assigns) + (Assign("og[uoc, uq]", result),)),))
    in_place = (call("og", f"oc0 * {stride} + p0", stride), over_stored(epi, True))
    edge = (call("ct", "0", "ct.shape[1]"),
            For("r", "0", str(mr), _store_px(mr, w, epi, "og[oc]", "p0", edge_count, "pq",
                                             tile=f"ct[r, q + {shift}]" if shift != "0" else "ct[r, q]")))
    if not epi.reads_output_sized:
        return (If(full, in_place, edge),)
    # a full tile through ct (shift 0 there), each element's residual read before its store,
    # at unsigned indices without views: 1.3-1.5x faster than the edge store on MobileNetV2's
    # 1x1 project convs with their residual Add (the views' NRT calls, signed index tests)
    split = residual_split(epi)
    if split is not None and split[1] is not None:
        # a leading residual Add: `residual_rows` adds bias and residual a row at a time, its loads
        # before its stores (in a Python loop each store sat between two loads of the unrolled row,
        # and LLVM kept it scalar: 144->24 @24x24 + Add 70 -> 52 us, Zen 3), then the rest of the
        # epilogue (Relu) in place over the stored rows
        tail, res = split
        through_ct = (call("ct", "0", "ct.shape[1]"),
                      LoopCall(f"residual_rows(og, oc0 * P + p0, P, ct, 0, ct.shape[1], {res.param}, "
                               f"(n * OC + oc0) * P + p0, P, bias, oc0, {mr}, {w}, {lanes})")) \
            + ((over_stored(tail, False),) if tail.steps else ())
        return (If(full, through_ct, edge),)
    assigns, result = epi.emit("v", "n * OC + oc0 + r", "uq", "e", c="oc0 + r")
    through_ct = (call("ct", "0", "ct.shape[1]"), For("r", "0", str(mr), (
        Assign("uoc", "np.uint64(oc0 + r)"), Assign("ur", "np.uint64(r)"), Assign("bo", "bias[uoc]"),
        For("q", "0", str(w), (Assign("uq", "np.uint64(p0 + q)"), Assign("v", "ct[ur, np.uint64(q)] + bo"))
            + tuple(Assign(n, e) for n, e in assigns) + (Assign("og[uoc, uq]", result),)),
    )))
    return (If(full, through_ct, edge),)


def _direct_px_vector(mr: int, nr: int, geo: dict, epi: Epilogue, code: str) -> tuple:
    """`_direct_px_in_place`'s tile (pixels ow0 .. of one output row, a row's last pixels that fit
    half a tile a MR x NR/2 tile, the last tile moved left where no residual) as one `tile_fma`
    call (`_px_vector_tile`) over the whole window: the nest's levels are the group's input
    channels (one Xp plane, KH*KW weight rows apart) and the kernel rows; per phase plane of the
    stride one segment over the taps that read it (kw = kp, kp + SW, ...: neighbouring columns
    there, SW weight rows apart)."""
    g = geo
    sw, dw = g["SW"], g["DW"]
    segments = []
    for kp in range(min(sw, g["KW"])):
        phase, col = (kp * dw) % sw, (kp * dw) // sw
        b_off = " + ".join(x for x in ((f"{phase} * WQ" if phase else ""), (str(col) if col else "")) if x) or "0"
        segments.append(f"({kp * mr}, {b_off}, {(g['KW'] - kp + sw - 1) // sw})")
    nest = (f"((Cg, {g['KH'] * g['KW'] * mr}, XC), ({g['KH']}, {g['KW'] * mr}, {g['DH']} * XR), "
            f"({', '.join(segments)},))")

    def tile(w: int) -> tuple:
        ow0 = f"min(owt * {nr}, max(0, OW - {w}))" if not epi.reads_output_sized else f"owt * {nr}"
        return (Assign("ow0", ow0), Assign("p0", "oh * OW + ow0"),
                Assign("xb", f"(n * C + g * Cg) * XC + oh * {g['SH']} * XR + ow0")) + _px_vector_tile(
            mr, w, tile_lanes(code, w), [f"wb + {r}" for r in range(mr)], str(sw * mr), "Xp", "xb", str(dw), nest,
            full=f"oct * {mr} + {mr} <= OCg and ow0 + {w} <= OW", edge_count=f"min({w}, OW - ow0)", epi=epi)
    half = nr // 2
    return (Assign("oc0", f"g * OCg + oct * {mr}"), Assign("wb", f"(g * n_oct + oct) * Wp.shape[2] * {mr}"),
            If(f"owt * {nr} + {half} >= OW and OW >= {half}", tile(half), tile(nr)))


def _gemm_1x1_epilogue(epi: Epilogue, mr: int, nr: int):
    """finish(r, c) adding the bias and applying the epilogue to accumulator c{r}_{c} of a full
    1x1 tile (MR channels from oc0 x NR pixels from p0), or None where the epilogue cannot run
    on the accumulators (too long, or a channel-indexed extra: `register_epilogue`)."""
    def bias(r: int, c: int) -> tuple:
        return (Assign(f"c{r}_{c}", f"c{r}_{c} + bias[{unsigned(f'oc0 + {r}')}]"),)
    if not epi.steps:
        return bias
    in_registers = register_epilogue(epi, mr, nr, lambda r: f"n * OC + oc0 + {r}", "p0")
    if in_registers is None:
        return None
    return lambda r, c: bias(r, c) + in_registers(r, c)


def _gemm_1x1(mr: int, nr: int, order: str, epi: Epilogue, code: str = "slp", strided_rows: bool = False) -> Function:
    """A 1x1 stride-1 conv as a GEMM over the image's plane, out[n][OC, P] = W[OC, C] @ X[n][C, P]:
    MR output channels x NR pixels of accumulators, vectors along the pixels (contiguous in
    NCHW), the input read in place and a full tile stored straight from its accumulators with
    bias and epilogue applied there (`register_tile_in_place`). With few input channels (K = 16
    or 24, MobileNet's expand convs) the k loop is short, so the store is much of the tile's
    work: through `ct` and a loop over its rows it cost as much as the FMAs. Without extras (a
    residual input may be the output buffer itself) the last pixel tile moves left to end at
    the plane's end, so planes of at least NR pixels store full tiles only.

    `strided_rows` (winograd's planes V and M, which share their row length; vector-IR tile, no
    epilogue): the rows of X and out are X's row length S apart, longer than the P pixels computed
    (`_lower_winograd`)."""
    stride = "S" if strided_rows else "P"
    assert not strided_rows or (tile_lanes(code, nr) and not epi.steps), "strided rows: vector IR, no epilogue"
    a_load = lambda r: f"Wp[g, oct, uk, u{r}]"        # noqa: E731
    b_load = lambda q: f"xg[uci, up0 + u{q}]"         # noqa: E731
    k_loops = lambda body: (For("k", "0", "Cg", (      # noqa: E731
        Assign("uk", "np.uint64(k)"), Assign("uci", "np.uint64(g * Cg + k)")) + body),)
    lanes = tile_lanes(code, nr)
    if lanes:   # one tile_fma call; with a residual (every tile through ct) it reads at pc, moved left as without
        aliased = epi.reads_output_sized
        p0 = f"min(pt * {nr}, max(0, P - {nr}))" if not aliased else f"pt * {nr}"
        tile = (Assign("p0", p0), Assign("pc", f"min(p0, max(0, P - {nr}))" if aliased else "p0"),
                Assign("oc0", f"g * OCg + oct * {mr}"), Assign("wb", f"(g * n_oct + oct) * Cg * {mr}")) \
            + _px_vector_tile(mr, nr, lanes, [f"wb + {r}" for r in range(mr)], str(mr), "X",
                              f"(n * C + g * Cg) * {stride} + pc", stride, "Cg",
                              full=f"oct * {mr} + {mr} <= OCg and p0 + {nr} <= P",
                              edge_count=f"min({nr}, P - p0)", epi=epi, shift="p0 - pc" if aliased else "0",
                              stride=stride)
    else:
        edge = _store_px(mr, nr, epi, "og[oc]", "p0", f"min({nr}, P - p0)", "pq")
        p0 = f"min(pt * {nr}, max(0, P - {nr}))" if not epi.reads_output_sized else f"pt * {nr}"
        tile = (Assign("p0", p0), Assign("up0", "np.uint64(p0)"), Assign("oc0", f"g * OCg + oct * {mr}")) \
            + register_tile_in_place(mr, nr, a_load, b_load, k_loops, "og", "oc0", "p0",
                                 full=f"oct * {mr} + {mr} <= OCg and p0 + {nr} <= P", edge_store=edge,
                                 epilogue=_gemm_1x1_epilogue(epi, mr, nr),
                                 comment=f"{mr}x{nr} register tile (output channels x pixels of the plane), "
                                         f"SLP-vectorized along pixels, stored from registers")
    body = (
        Assign("Cg", "C // G"), Assign("OCg", "OC // G"), *((Assign("S", "X.shape[2]"),) if strided_rows else ()),
        Assign("n_oct", f"(OCg + {mr - 1}) // {mr}"), Assign("n_ob", "(n_oct + OCB - 1) // OCB"),
        Assign("n_pt", f"(P + {nr - 1}) // {nr}"), Assign("n_pb", "(n_pt + PB - 1) // PB"),
        *(Assign(f"u{q}", f"np.uint64({q})") for q in (range(max(mr, nr)) if not lanes else ())),
        Alloc("ct", (str(mr), str(nr))),
        thread_share("it", "N * G * n_ob * n_pb", body=(
            *unflatten("it", (("pb", "n_pb"), ("ob", "n_ob"), ("g", "G")), "n"),
            Assign("xg", "X[n]"), Assign("og", "out[n]"),
            *_tile_loops(order, ("pt", "pb * PB", "min(n_pt, pb * PB + PB)"), tile),
        )),
    )
    params = _params(epi, (Param("X", "float32[:, :, ::1]"),), "float32[:, :, ::1]") + tuple(
        Param(n, "int64") for n in ("N", "C", "OC", "G", "P", "OCB", "PB", "t", "T"))
    return Function("conv", params, epi.prelude() + body)


def _gemm_1x1_call(arrays: tuple, sizes: tuple, mr: int, nr: int, par: bool) -> Call:
    """The launch step of `_gemm_1x1`'s kernel: its array arguments (X, Wp, bias, extras, out), its
    sizes (N, C, OC, G, P, OCB, PB) and its work items, (image, group, block of OCB channel tiles,
    block of PB pixel tiles), as the kernel counts them (1x1 convs, and winograd's 16 planes)."""
    N, C, OC, G, P, OCB, PB = sizes
    n_oct, n_pt = -(-(OC // G) // mr), -(-P // nr)
    return Call("conv", arrays + tuple(Scalar(v) for v in sizes), items=N * G * -(-n_oct // OCB) * -(-n_pt // PB),
                parallel=par)


def _subsample(sh: int, sw: int) -> Function:
    """The pixels a strided 1x1 conv without pads reads, X[n, c, oh * SH, ow * SW], into the
    contiguous plane Xs[n, c, oh * OW + ow] that `_gemm_1x1` reads as its panel, at unsigned
    indices (views per row cost more than the copy on 7x7 outputs); thread t of T writes
    its share of the planes."""
    body = (
        thread_share("p", "N * C", body=(
            Assign("un", "np.uint64(p // C)"), Assign("uc", "np.uint64(p % C)"),
            For("oh", "0", "OH", (
                Assign("uh", f"np.uint64(oh * {sh})"), Assign("ub", "np.uint64(oh * OW)"),
                For("ow", "0", "OW", (Assign("Xs[un, uc, ub + np.uint64(ow)]", f"X[un, uc, uh, np.uint64(ow * {sw})]"),)),
            )),
        )),
    )
    params = (Param("X", "float32[:, :, :, ::1]"), Param("Xs", "float32[:, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("N", "C", "OH", "OW", "t", "T"))
    return Function("subsample", params, body)


PATCH_K = 128
"""Patch embeddings (`_patches`) of at least this many inputs a window run as im2col GEMMs by
default: 3 -> 384 at 224, 1 thread, Emerald Rapids (2026-12-06), AVX-512, against the direct kernel's
pixel vectors (rows of 14-56 pixels in 32-pixel tiles): 16x16/16 2.35x faster (1837 -> 781 us,
onnxruntime 744), 8x8/8 1.43x (1689 -> 1184, onnxruntime 1153), 3 -> 768 32x32/32 1.15x (2168 ->
1892, onnxruntime 1943); a 4x4/4 stem (3 -> 96, 48 inputs a window) stays direct (309 against
338-347 us)."""


def _patches(wl: Workload, geo: dict) -> bool:
    """A patch embedding: windows that tile the input without overlap or gaps (kernel = stride,
    no pads, no dilation, one group) of at least `PATCH_K` inputs each."""
    cg = int(wl.inputs[1]["shape"][1])
    return (geo["KH"], geo["KW"]) == (geo["SH"], geo["SW"]) and geo["KH"] * geo["KW"] > 1 and geo["G"] == 1 \
        and geo["DH"] == geo["DW"] == 1 and not geo["PT"] and not geo["PL"] and cg * geo["KH"] * geo["KW"] >= PATCH_K


def _reads_in_bounds(wl: Workload, geo: dict, OH: int, OW: int) -> bool:
    """No pads, and every output pixel's window lies inside the input."""
    H, W = (int(d) for d in wl.inputs[0]["shape"][2:])
    return not geo["PT"] and not geo["PL"] and (OH - 1) * geo["SH"] + (geo["KH"] - 1) * geo["DH"] < H \
        and (OW - 1) * geo["SW"] + (geo["KW"] - 1) * geo["DW"] < W


def _pack_im2col(tp: int, geo: dict, in_place: bool = False) -> Function:
    """Pixels pt*TP .. pt*TP+TP-1 of the flattened output plane into the panel Ap[pt, k, 0:TP],
    read from the phase-split padded input, or (`in_place`) from the input X[N, C, H, W] itself
    with the strides applied here (a strided 1x1 conv: a gather into the GEMM's panel)."""
    g = geo
    K = f"Cg * {g['KH'] * g['KW']}"
    if in_place:
        window = (For("kh", "0", str(g["KH"]), (
            Assign("xr", f"Xp[n, ci, oh * {g['SH']} + kh * {g['DH']}]"),
            Assign("kb", f"(c * {g['KH']} + kh) * {g['KW']}"),
            For("kw", "0", str(g["KW"]), (Assign("Ap[pt, kb + kw, r]", f"xr[ow0 * {g['SW']} + kw * {g['DW']}]"),)),
        )),)
    else:
        window = _taps(g, (Assign("Ap[pt, k, r]", "xq[j0]"),), f"oh * {g['SH']} + kh * {g['DH']}")
    body = (
        Assign("n_pt", f"(P + {tp - 1}) // {tp}"),
        thread_share("pt", "n_pt", body=(
            For("r", "0", str(tp), (
                Assign("p", f"pt * {tp} + r"),
                If("p < P", (
                    Assign("oh", "p // OW"), Assign("ow0", "p % OW"),
                    For("c", "0", "Cg", (Assign("ci", "g * Cg + c"),) + window),
                ), (For("k", "0", K, (Assign("Ap[pt, k, r]", F0),)),)),
            )),
        )),
    )
    params = (Param("Xp", "float32[:, :, :, ::1]" if in_place else "float32[:, :, :, :, ::1]"),
              Param("Ap", "float32[:, :, ::1]")) + tuple(Param(n, "int64") for n in ("n", "g", "Cg", "OW", "P", "t", "T"))
    return Function("pack_a", params, body)


def _gemm_vector_tile(mr: int, nr: int, epi: Epilogue, lanes: int) -> tuple[tuple, tuple]:
    """`_gemm`'s vector-IR tile (vectors along the output channels, tile_code "vec<lanes>") and
    what its work item runs after its tiles: one `tile_fma` call per tile over the panel's whole
    K (the nest form of one level, which the column-major store needs), the accumulators in
    registers, stored column-major into the output's channel rows (masked past the plane and
    the group's channels: `codegen.vector_tile`); then bias and epilogue in place over the work
    item's channel rows, each a contiguous run of pixels."""
    tile = (vector_tile("Ap", [f"pt * K * {mr} + {r}" for r in range(mr)], str(mr), "Wp", f"(g * n_oct + oct) * K * {nr}",
                        str(nr), "((1, 0, 0), K)", "out", f"(n * OC + g * OCg + oct * {nr}) * P + pt * {mr}",
                        f"(P, min({mr}, P - pt * {mr}), min({nr}, OCg - oct * {nr}))", "False", nr, lanes),)
    assigns, result = epi.emit("v", "n * OC + oc", "up", "e", c="oc")
    after = (For("q", f"ob * OCB * {nr}", f"min(OCg, (ob * OCB + OCB) * {nr})", (
        Assign("oc", "g * OCg + q"), Assign("bo", "bias[oc]"), Assign("orow", "out[n, oc]"),
        For("p", f"pb * PB * {mr}", f"min(P, (pb * PB + PB) * {mr})", (
            Assign("up", "np.uint64(p)"), Assign("v", "orow[up] + bo"),
        ) + tuple(Assign(n, e) for n, e in assigns) + (Assign("orow[up]", result),)),
    )),)
    return tile, after


def _gemm(mr: int, nr: int, vec: str, order: str, epi: Epilogue, lanes: int | None = None) -> Function:
    after = ()
    if lanes is not None:   # vec == "oc", the vector-IR tile
        tp = mr
        tile, after = _gemm_vector_tile(mr, nr, epi, lanes)
    elif vec == "oc":
        tp = mr
        pixel = (Assign("p", f"pt * {mr} + r"), Assign("ok", "p < P"), Assign("oh", "p // OW"), Assign("ow", "p % OW"))
        store = _store_oc(nr, epi, pixel, "out[n, oc, p]")
        a_load, b_load = (lambda r: f"Apt[k, {r}]"), (lambda q: f"Wk[k, {q}]")
        what = f"{mr}x{nr} register tile (pixels x output channels), SLP-vectorized along channels"
    else:
        tp = nr
        store = _store_px(mr, nr, epi, "out[n, oc]", f"pt * {nr}", f"min({nr}, P - pt * {nr})", "pq")
        a_load, b_load = (lambda r: f"Wk[k, {r}]"), (lambda q: f"Apt[k, {q}]")
        what = f"{mr}x{nr} register tile (output channels x pixels), SLP-vectorized along pixels"
    if lanes is None:
        tile = (Assign("Apt", "Ap[pt]"), Assign("Wk", "Wp[g, oct]")) + register_tile(
            mr, nr, a_load, b_load, k_range("0", "K"), store, comment=what)
    tc = nr if vec == "oc" else mr
    body = (
        Assign("Cg", "C // G"), Assign("OCg", "OC // G"), Assign("K", "Ap.shape[1]"), Assign("P", "OH * OW"),
        Assign("n_oct", f"(OCg + {tc - 1}) // {tc}"), Assign("n_ob", "(n_oct + OCB - 1) // OCB"),
        Assign("n_pt", f"(P + {tp - 1}) // {tp}"), Assign("n_pb", "(n_pt + PB - 1) // PB"),
        Alloc("ct", (str(mr), str(nr))),
        thread_share("it", "n_ob * n_pb", body=(
            Assign("pb", "it % n_pb"), Assign("ob", "it // n_pb"),
            *_tile_loops(order, ("pt", "pb * PB", "min(n_pt, pb * PB + PB)"), tile), *after,
        )),
    )
    params = _params(epi, (Param("Ap", "float32[:, :, ::1]"),), "float32[:, :, ::1]") + tuple(
        Param(n, "int64") for n in ("n", "g", "C", "OC", "G", "OH", "OW", "OCB", "PB", "t", "T"))
    return Function("gemm", params, epi.prelude() + body)


register_template(Conv2dTemplate())

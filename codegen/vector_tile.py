"""The MR x NR register tile's k loop as explicit LLVM vector IR: one numba intrinsic,
`tile_fma`, that generated kernels call (dense, batch_matmul, the blocked conv).

Why not the scalar tile (`schedules.microkernel`): there the tile is MR*NR scalar locals,
unrolled in the Python source, and LLVM's SLP pass rebuilds the vectors. Two costs
(experiments/dense/results.md, experiments/bench_compile.md): numba types and lowers
thousands of statements per code shape (~3-4 s), and for tiles past 4x16 on AVX2 the
vectorized loop keeps every A broadcast live and spills. Here the k loop is written
once in IR, as a BLAS micro-kernel is: MR*NR/lanes `<lanes x float>` accumulators
(phis), per k NR/lanes vector loads of B, then per row one broadcast of A and its
`llvm.fma` row — one broadcast live at a time; numba sees a single call.

    tile_fma(A, a_offsets, a_kstride, B, b_offset, b_kstride, n_k,
             C, c_offset, c_rowstride, accumulate, NR, LANES)

Offsets and strides count elements from each array's data pointer (any layout; nothing
is bounds-checked: every address the tile touches must lie in its array). Row r of the
tile reads A at `a_offsets[r] + k * a_kstride` (MR = len(a_offsets)), B at
`b_offset + k * b_kstride + c` for c < NR (contiguous), k = 0 .. n_k - 1. The tile is stored (or, where
`accumulate` is true, added) to C at `c_offset + r * c_rowstride + c`. NR and LANES
(float32 lanes per vector: `schedules.microkernel.vector_shape`) are integer literals
in the source (NR a multiple of LANES); they fix the code shape. float32 only.

The nest form: `n_k` may instead be a tuple `((count, a_stride, b_stride), ..., n_k)` of
outer loops (outermost first) around the contiguous k run, so that one call covers a whole
blocked reduction (a conv's channel blocks x kernel rows x taps) with the accumulators in
registers throughout: level i's index j_i adds `j_i * a_stride_i` to every row's A offset
and `j_i * b_stride_i` to B's. The innermost n_k may also be a tuple of segments
`((a_offset, b_offset, count), ...)`: runs one after another, each from its own offsets
(a strided conv's phase planes); the same k strides in all, and C is stored once at the end; where `accumulate` is true
the accumulators start from C's values (the same sum as adding at the end, summed in another
order). The counts may be run-time values; with n_k an integer the call is the plain form
above, IR unchanged. In the nest form c_rowstride may instead be a triple `(c_colstride, m, n)`:
C's tile is column-major, element (r, c) at `c_offset + c * c_colstride + r`, and only rows
r < m and columns c < n are read and written (masked vector moves): an NCHW conv output's
channel rows take a pixels x channels tile so, in place, its edges included.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.core.extending import intrinsic

# in the import line generated sources carry (codegen.source), so that a change of the IR
# below changes their text, hence their cache key (numba's cache does not track this file)
VERSION = 7   # v2: the nest form (n_k a tuple of outer loops); v3: its column-major C tile; v4: regroup_channels;
#             v5: its stride S and masked tail (row_taps came later, new: no cached source called it); v6: plane_taps;
#             v7: the column-major tile's plain moves where it lies inside

_F32 = ir.FloatType()
_I64 = ir.IntType(64)


def _vector_kit(builder, nr: int, lanes: int):
    """What both tile forms build from: the vector type, vectors per row, llvm.fma, a zero
    vector, a vector pointer at an element offset, and a broadcast of one float."""
    vty = ir.VectorType(_F32, lanes)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3), f"llvm.fma.v{lanes}f32")
    splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
    undef = ir.Constant(vty, ir.Undefined)

    def vector_at(base, offset):
        return builder.bitcast(builder.gep(base, [offset]), vty.as_pointer())

    def splat(value):
        return builder.shuffle_vector(builder.insert_element(undef, value, ir.Constant(ir.IntType(32), 0)),
                                      undef, splat_mask)
    return vty, nr // lanes, fma, ir.Constant(vty, [0.0] * lanes), vector_at, splat


def _masked_moves(builder, n: int):
    """llvm.masked.load and llvm.masked.store of `n` floats: (load(ptr, align, mask, passthru),
    store(value, ptr, align, mask)). The masked-off lanes are neither read nor written."""
    vty, i32 = ir.VectorType(_F32, n), ir.IntType(32)
    ptr, mask = vty.as_pointer(), ir.VectorType(ir.IntType(1), n)
    load = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [ptr, i32, mask, vty]),
                                          f"llvm.masked.load.v{n}f32.p0")
    store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [vty, ptr, i32, mask]),
                                           f"llvm.masked.store.v{n}f32.p0")
    return load, store


def _clamp(builder, a, lo_v, hi_v):
    """min(max(a, lo), hi) lane by lane, NaN kept (the generated Python's Relu/Clip order)."""
    a = builder.select(builder.fcmp_ordered("<", a, lo_v), lo_v, a)
    return builder.select(builder.fcmp_ordered(">", a, hi_v), hi_v, a)


def _literal_int(ty, what: str) -> int:
    if not isinstance(ty, types.IntegerLiteral):
        raise TypingError(f"tile_fma: {what} must be an integer literal in the source, got {ty}")
    return int(ty.literal_value)


@intrinsic(prefer_literal=True)
def tile_fma(typingctx, A, a_offsets, a_kstride, B, b_offset, b_kstride, n_k, C, c_offset, c_rowstride,
             accumulate, NR, LANES):
    nr, lanes = _literal_int(NR, "NR"), _literal_int(LANES, "LANES")
    if lanes < 1 or nr < lanes or nr % lanes:
        raise TypingError(f"tile_fma: NR={nr} is not a multiple of LANES={lanes}")
    _require_arrays("tile_fma", (("A", A), ("B", B), ("C", C)))
    _require_offsets("tile_fma", "a_offsets", a_offsets, "one per tile row")
    levels = _nest_levels(n_k)
    columns = _int_triple(c_rowstride)
    if columns and levels is None:
        raise TypingError("tile_fma: a column-major C tile ((c_colstride, m, n) as c_rowstride) needs the nest form")
    _require_integers("tile_fma", (("a_kstride", a_kstride), ("b_offset", b_offset), ("b_kstride", b_kstride),
                                   ("c_offset", c_offset)) + ((("c_rowstride", c_rowstride),) if not columns else ())
                      + ((("n_k", n_k),) if levels is None else ()))
    if not isinstance(accumulate, (types.Boolean, types.Integer)):
        raise TypingError(f"tile_fma: accumulate must be a boolean, got {accumulate}")
    mr = len(a_offsets)
    sig = types.void(A, a_offsets, a_kstride, B, b_offset, b_kstride, n_k, C, c_offset, c_rowstride,
                     accumulate, NR, LANES)

    if levels is not None:
        return sig, _nest_codegen(mr, nr, lanes, levels, columns)

    def codegen(context, builder, sig, args):
        aty, oty, _, bty, _, _, _, cty = sig.args[:8]
        a, offs, a_ks, b, b_off, b_ks, nk, c, c_off, c_rs, acc_flag = args[:11]

        def i64(value, ty):
            return context.cast(builder, value, ty, types.int64)

        a_ks, b_off, b_ks, nk, c_off, c_rs = (i64(v, sig.args[i]) for v, i in
                                              ((a_ks, 2), (b_off, 4), (b_ks, 5), (nk, 6), (c_off, 8), (c_rs, 9)))
        flag = context.cast(builder, acc_flag, sig.args[10], types.boolean)
        a_data = context.make_array(aty)(context, builder, a).data
        b_data = context.make_array(bty)(context, builder, b).data
        c_data = context.make_array(cty)(context, builder, c).data
        a_rows = [builder.gep(a_data, [i64(o, t)]) for o, t in zip(cgutils.unpack_tuple(builder, offs, mr), oty)]
        b_base = builder.gep(b_data, [b_off])
        vty, nv, fma, zero, vector_at, splat = _vector_kit(builder, nr, lanes)

        pre = builder.basic_block
        head = builder.append_basic_block("tile.k")
        body = builder.append_basic_block("tile.fma")
        done = builder.append_basic_block("tile.done")
        builder.branch(head)
        builder.position_at_end(head)
        k = builder.phi(_I64, "k")
        k.add_incoming(ir.Constant(_I64, 0), pre)
        accs = [[builder.phi(vty, f"c{r}_{v}") for v in range(nv)] for r in range(mr)]
        for row in accs:
            for phi in row:
                phi.add_incoming(zero, pre)
        builder.cbranch(builder.icmp_signed("<", k, nk), body, done)

        builder.position_at_end(body)
        b_k = builder.mul(k, b_ks)
        bvec = [builder.load(vector_at(b_base, builder.add(b_k, ir.Constant(_I64, v * lanes))), align=4)
                for v in range(nv)]
        a_k = builder.mul(k, a_ks)
        new = []
        for r in range(mr):
            ar = builder.load(builder.gep(a_rows[r], [a_k]), align=4)
            new.append([builder.call(fma, [splat(ar), bvec[v], accs[r][v]]) for v in range(nv)])
        k.add_incoming(builder.add(k, ir.Constant(_I64, 1)), builder.basic_block)
        for r in range(mr):
            for v in range(nv):
                accs[r][v].add_incoming(new[r][v], builder.basic_block)
        builder.branch(head)

        builder.position_at_end(done)
        c_base = builder.gep(c_data, [c_off])
        ptrs = [[vector_at(c_base, builder.add(builder.mul(ir.Constant(_I64, r), c_rs), ir.Constant(_I64, v * lanes)))
                 for v in range(nv)] for r in range(mr)]
        with builder.if_else(flag) as (added, stored):
            with added:
                for r in range(mr):
                    for v in range(nv):
                        builder.store(builder.fadd(builder.load(ptrs[r][v], align=4), accs[r][v]), ptrs[r][v], align=4)
            with stored:
                for r in range(mr):
                    for v in range(nv):
                        builder.store(accs[r][v], ptrs[r][v], align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic(prefer_literal=True)
def regroup_channels(typingctx, X, x_offset, plane, Y, y_offset, n, CB, S):
    """Y[y_offset + p * CB + c] = X[x_offset + c * plane + p * S] for c < CB and p < n: CB
    channel rows of pixels S apart into pixel-major blocks of CB channels (NCHW into NCHWc;
    S > 1 picks one phase of a strided conv's columns). Per CB pixels, CB vector loads of
    CB * S elements (one per channel; S > 1 then keeps every S-th lane), one CB x CB transpose
    in registers (`_transpose`) and CB vector stores; the last n % CB pixels the same with
    masked loads (only the elements they read) and a store per pixel. Written as a scalar loop,
    LLVM vectorized it with scatters, ~1 cycle an element on Zen 4 (most of a strided depthwise
    conv's time). Each of the first n - n % CB pixels must have its S elements in X (the load
    reads them all). Returns n. CB (a
    power of two: the lanes) and S are integer literals; nothing is bounds-checked."""
    cb, st = _literal_int(CB, "CB"), _literal_int(S, "S")
    if cb < 2 or cb & (cb - 1):
        raise TypingError(f"regroup_channels: CB={cb} is not a power of two")
    if st < 1:
        raise TypingError(f"regroup_channels: S={st} is not a positive stride")
    _require_arrays("regroup_channels", (("X", X), ("Y", Y)))
    _require_integers("regroup_channels", (("x_offset", x_offset), ("plane", plane), ("y_offset", y_offset), ("n", n)))
    sig = types.int64(X, x_offset, plane, Y, y_offset, n, CB, S)

    def codegen(context, builder, sig, args):
        xo, pl, yo, count = (context.cast(builder, args[i], sig.args[i], types.int64) for i in (1, 2, 4, 5))
        x_data = context.make_array(sig.args[0])(context, builder, args[0]).data
        y_data = context.make_array(sig.args[3])(context, builder, args[3]).data
        vty, wide = ir.VectorType(_F32, cb), ir.VectorType(_F32, cb * st)
        pick = ir.Constant(ir.VectorType(ir.IntType(32), cb), [j * st for j in range(cb)])
        step = ir.Constant(_I64, cb)
        full = builder.mul(builder.sdiv(count, step), step)
        x_rows = [builder.gep(x_data, [builder.add(xo, builder.mul(pl, ir.Constant(_I64, c)))]) for c in range(cb)]
        y_base = builder.gep(y_data, [yo])

        def row_at(row, p):
            if st == 1:
                return builder.load(builder.bitcast(builder.gep(row, [p]), vty.as_pointer()), align=4)
            at = builder.gep(row, [builder.mul(p, ir.Constant(_I64, st))])
            v = builder.load(builder.bitcast(at, wide.as_pointer()), align=4)
            return builder.shuffle_vector(v, ir.Constant(wide, ir.Undefined), pick)

        with cgutils.for_range_slice(builder, ir.Constant(_I64, 0), full, step, _I64) as (p, _):
            rows = [row_at(row, p) for row in x_rows]
            for q, col in enumerate(_transpose(builder, rows, cb)):
                at = builder.gep(y_base, [builder.mul(builder.add(p, ir.Constant(_I64, q)), step)])
                builder.store(col, builder.bitcast(at, vty.as_pointer()), align=4)
        # the last count % CB pixels: masked loads of the elements they read, one transpose, a
        # store per pixel (a plane of 4x4 or 2x2 pixels is nothing but this tail)
        rest = builder.sub(count, full)
        with builder.if_then(builder.icmp_signed(">", rest, ir.Constant(_I64, 0))):
            i32 = ir.IntType(32)
            mload = _masked_moves(builder, cb * st)[0]
            lanes_read = builder.add(builder.mul(builder.sub(rest, ir.Constant(_I64, 1)), ir.Constant(_I64, st)),
                                     ir.Constant(_I64, 1))
            ity = ir.VectorType(_I64, cb * st)
            bound = builder.shuffle_vector(builder.insert_element(ir.Constant(ity, ir.Undefined), lanes_read,
                                                                  ir.Constant(i32, 0)),
                                           ir.Constant(ity, ir.Undefined), ir.Constant(ir.VectorType(i32, cb * st),
                                                                                       [0] * (cb * st)))
            mask = builder.icmp_signed("<", ir.Constant(ity, list(range(cb * st))), bound)
            zero = ir.Constant(wide, [0.0] * (cb * st))
            rows = []
            for row in x_rows:
                at = builder.bitcast(builder.gep(row, [builder.mul(full, ir.Constant(_I64, st))]), wide.as_pointer())
                v = builder.call(mload, [at, ir.Constant(i32, 4), mask, zero])
                rows.append(v if st == 1 else builder.shuffle_vector(v, ir.Constant(wide, ir.Undefined), pick))
            for q, col in enumerate(_transpose(builder, rows, cb)[:cb - 1]):
                with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, q), rest)):
                    at = builder.gep(y_base, [builder.mul(builder.add(full, ir.Constant(_I64, q)), step)])
                    builder.store(col, builder.bitcast(at, vty.as_pointer()), align=4)
        return count

    return sig, codegen


@intrinsic(prefer_literal=True)
def row_taps(typingctx, X, x_offsets, x_rowstride, Wt, w_offset, bias, C, c_offset, c_rowstride, lo, hi,
             KH, KW, DW, S, NR, LANES):
    """A depthwise conv's MR output rows x NR pixels of one channel plane, in registers:

        C[c_offset + r * c_rowstride + c] = clamp(bias + sum over kh < KH, kw < KW of
            Wt[w_offset + kh * KW + kw] * X[x_offsets[r] + kh * x_rowstride + kw * DW + c * S], lo, hi)

    (MR = len(x_offsets): each row's window start; x_rowstride: the input row step of a kernel
    row, dilation included; clamp: below lo becomes lo, above hi becomes hi, NaN stays NaN, as
    min(max(v, lo), hi) in the generated Python: Relu and ReLU6 in registers, -inf and inf for
    none). The taps are unrolled (KH, KW literals); per tap one broadcast
    weight, per row and vector of LANES pixels one load and one FMA; the bias starts the
    accumulators. A stride S > 1 loads LANES * S contiguous elements and keeps every S-th lane
    (one permute with a memory operand on AVX-512), so a strided conv reads its padded NCHW
    plane as it is. (Splitting the plane by phase instead makes the taps plain loads, 1.3x
    faster, but the split copy cost more than that saves: a scalar copy 2.5x the taps, one
    with vector permutes and masks 1.5x; MobileNetV2's 96-channel 3x3/2 @48, Emerald Rapids.)
    Every element from x_offsets[r] + kh * x_rowstride + kw * DW up to NR * S past it must lie
    in X; nothing is bounds-checked. float32; KH, KW, DW, S, NR, LANES integer literals, NR a
    multiple of LANES."""
    kh_, kw_, dw_, st, nr, lanes = (_literal_int(t, n) for t, n in ((KH, "KH"), (KW, "KW"), (DW, "DW"), (S, "S"),
                                                                     (NR, "NR"), (LANES, "LANES")))
    if lanes < 1 or nr < lanes or nr % lanes or min(kh_, kw_, dw_, st) < 1:
        raise TypingError(f"row_taps: NR={nr} must be a multiple of LANES={lanes}; KH, KW, DW, S >= 1")
    _require_arrays("row_taps", (("X", X), ("Wt", Wt), ("C", C)))
    _require_offsets("row_taps", "x_offsets", x_offsets, "one per row")
    _require_integers("row_taps", (("x_rowstride", x_rowstride), ("w_offset", w_offset), ("c_offset", c_offset),
                                   ("c_rowstride", c_rowstride)))
    for name, t in (("bias", bias), ("lo", lo), ("hi", hi)):
        if not isinstance(t, types.Float):
            raise TypingError(f"row_taps: {name} must be a float, got {t}")
    mr = len(x_offsets)
    sig = types.void(X, x_offsets, x_rowstride, Wt, w_offset, bias, C, c_offset, c_rowstride, lo, hi,
                     KH, KW, DW, S, NR, LANES)

    def codegen(context, builder, sig, args):
        def i64(i):
            return context.cast(builder, args[i], sig.args[i], types.int64)

        x_rs, w_off, c_off, c_rs = i64(2), i64(4), i64(7), i64(8)
        b, low, high = (context.cast(builder, args[i], sig.args[i], types.float32) for i in (5, 9, 10))
        x_data = context.make_array(sig.args[0])(context, builder, args[0]).data
        w_data = context.make_array(sig.args[3])(context, builder, args[3]).data
        c_data = context.make_array(sig.args[6])(context, builder, args[6]).data
        rows = [context.cast(builder, v, t, types.int64)
                for v, t in zip(cgutils.unpack_tuple(builder, args[1], mr), sig.args[1])]
        vty, nv, fma, _, vector_at, splat = _vector_kit(builder, nr, lanes)
        wide = ir.VectorType(_F32, lanes * st)
        pick = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [j * st for j in range(lanes)])

        def pixels(at):
            if st == 1:
                return builder.load(vector_at(x_data, at), align=4)
            v = builder.load(builder.bitcast(builder.gep(x_data, [at]), wide.as_pointer()), align=4)
            return builder.shuffle_vector(v, ir.Constant(wide, ir.Undefined), pick)

        accs = [[splat(b)] * nv for _ in range(mr)]
        for kh in range(kh_):
            row_base = [builder.add(x, builder.mul(x_rs, ir.Constant(_I64, kh))) for x in rows]
            for kw in range(kw_):
                w = splat(builder.load(builder.gep(w_data, [builder.add(w_off, ir.Constant(_I64, kh * kw_ + kw))]),
                                       align=4))
                for r in range(mr):
                    for v in range(nv):
                        at = builder.add(row_base[r], ir.Constant(_I64, kw * dw_ + v * lanes * st))
                        accs[r][v] = builder.call(fma, [w, pixels(at), accs[r][v]])
        c_base = builder.gep(c_data, [c_off])
        lo_v, hi_v = splat(low), splat(high)
        for r in range(mr):
            for v in range(nv):
                at = builder.add(builder.mul(ir.Constant(_I64, r), c_rs), ir.Constant(_I64, v * lanes))
                builder.store(_clamp(builder, accs[r][v], lo_v, hi_v), vector_at(c_base, at), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic(prefer_literal=True)
def block_taps(typingctx, X, x_offsets, x_rowstride, Wt, w_offset, bias, b_offset, C, c_offset, c_chanstride,
               lo, hi, KH, KW, DW, CB, SWISH):
    """A depthwise conv's tile of TP output pixels x CB channels of a block (`dw_blocked`), in
    registers, stored into NCHW rows:

        C[c_offset + q * c_chanstride + p] = clamp(bias[b_offset + q] + sum over kh < KH, kw < KW
            of Wt[w_offset + (kh * KW + kw) * CB + q] * X[x_offsets[p] + kh * x_rowstride + kw * DW * CB + q], lo, hi)

    (TP = len(x_offsets): each pixel's window start in the channel-blocked input, element
    (pixel, channel) at pixel * CB + channel; x_rowstride: the input row step of a kernel row,
    dilation included). Per tap one weight vector (the block's CB channels) and per pixel one
    input vector and one FMA; the bias vector starts the accumulators; Relu or ReLU6 (or
    nothing: -inf, inf) in registers, and where SWISH is 1 then HardSwish, v * clamp(v / 6 +
    1 / 2, 0, 1) (MobileNetV3's). The TP x CB tile is then transposed in registers
    (`_transpose`, CB * log2(CB) shuffles) and stored as CB runs of TP contiguous pixels, one
    per channel plane. Written in Python, the tile was SLP code whose per-channel stores LLVM
    built from ~15 inserts and blends a stored vector, more than the tile's FMAs. TP <= CB; KH,
    KW, DW, CB (a power of two: the lanes), SWISH (0 or 1) integer literals; nothing is
    bounds-checked; float32."""
    kh_, kw_, dw_, cb, swish = (_literal_int(t, n) for t, n in ((KH, "KH"), (KW, "KW"), (DW, "DW"), (CB, "CB"),
                                                                 (SWISH, "SWISH")))
    if cb < 2 or cb & (cb - 1) or min(kh_, kw_, dw_) < 1 or swish not in (0, 1):
        raise TypingError(f"block_taps: CB={cb} must be a power of two; KH, KW, DW >= 1; SWISH 0 or 1")
    _require_arrays("block_taps", (("X", X), ("Wt", Wt), ("bias", bias), ("C", C)))
    _require_offsets("block_taps", "x_offsets", x_offsets, "one per pixel")
    tp = len(x_offsets)
    if tp > cb:
        raise TypingError(f"block_taps: {tp} pixels a tile, more than CB={cb}")
    _require_integers("block_taps", (("x_rowstride", x_rowstride), ("w_offset", w_offset), ("b_offset", b_offset),
                                     ("c_offset", c_offset), ("c_chanstride", c_chanstride)))
    for name, t in (("lo", lo), ("hi", hi)):
        if not isinstance(t, types.Float):
            raise TypingError(f"block_taps: {name} must be a float, got {t}")
    sig = types.void(X, x_offsets, x_rowstride, Wt, w_offset, bias, b_offset, C, c_offset, c_chanstride,
                     lo, hi, KH, KW, DW, CB, SWISH)

    def codegen(context, builder, sig, args):
        def i64(i):
            return context.cast(builder, args[i], sig.args[i], types.int64)

        x_rs, w_off, b_off, c_off, c_cs = i64(2), i64(4), i64(6), i64(8), i64(9)
        low, high = (context.cast(builder, args[i], sig.args[i], types.float32) for i in (10, 11))
        x_data, w_data, b_data, c_data = (context.make_array(sig.args[i])(context, builder, args[i]).data
                                          for i in (0, 3, 5, 7))
        pixels = [context.cast(builder, v, t, types.int64)
                  for v, t in zip(cgutils.unpack_tuple(builder, args[1], tp), sig.args[1])]
        vty, _, fma, _, vector_at, splat = _vector_kit(builder, cb, cb)
        b = builder.load(vector_at(b_data, b_off), align=4)
        accs = [b] * tp
        for kh in range(kh_):
            row_base = [builder.add(x, builder.mul(x_rs, ir.Constant(_I64, kh))) for x in pixels]
            for kw in range(kw_):
                w = builder.load(vector_at(w_data, builder.add(w_off, ir.Constant(_I64, (kh * kw_ + kw) * cb))),
                                 align=4)
                for p in range(tp):
                    x = builder.load(vector_at(x_data, builder.add(row_base[p], ir.Constant(_I64, kw * dw_ * cb))),
                                     align=4)
                    accs[p] = builder.call(fma, [x, w, accs[p]])
        lo_v, hi_v = splat(low), splat(high)
        rows = [_clamp(builder, a, lo_v, hi_v) for a in accs]
        if swish:
            sixth, half = (ir.Constant(vty, [v] * cb) for v in (1.0 / 6.0, 0.5))
            zero, one = (ir.Constant(vty, [v] * cb) for v in (0.0, 1.0))
            rows = [builder.fmul(v, _clamp(builder, builder.call(fma, [v, sixth, half]), zero, one)) for v in rows]
        rows += [ir.Constant(vty, ir.Undefined)] * (cb - tp)
        run = ir.VectorType(_F32, tp)
        first = ir.Constant(ir.VectorType(ir.IntType(32), tp), list(range(tp)))
        c_base = builder.gep(c_data, [c_off])
        for q, col in enumerate(_transpose(builder, rows, cb)):
            if tp < cb:
                col = builder.shuffle_vector(col, ir.Constant(vty, ir.Undefined), first)
            at = builder.gep(c_base, [builder.mul(c_cs, ir.Constant(_I64, q))])
            builder.store(col, builder.bitcast(at, run.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic(prefer_literal=True)
def residual_rows(typingctx, C, c_offset, c_rowstride, A, a_offset, a_rowstride, R, r_offset, r_rowstride,
                  bias, b_offset, MR, NR, LANES):
    """A tile's residual Add, row by row: C[c_offset + r * c_rowstride + j] = A[a_offset + r *
    a_rowstride + j] + bias[b_offset + r] + R[r_offset + r * r_rowstride + j] for r < MR, j < NR.
    Each row's loads (A's and R's vectors) come before its stores, so R may be C itself (a
    memory plan that runs the step in place: every element read before it is overwritten).
    Written as a loop in Python, each store between two loads of the unrolled row, LLVM could
    not move a load above a store that might write its element, and kept the row scalar. MR, NR,
    LANES integer literals, NR a multiple of LANES; nothing is bounds-checked; float32."""
    mr, nr, lanes = (_literal_int(t, n) for t, n in ((MR, "MR"), (NR, "NR"), (LANES, "LANES")))
    if lanes < 1 or nr < lanes or nr % lanes or mr < 1:
        raise TypingError(f"residual_rows: NR={nr} must be a multiple of LANES={lanes}; MR >= 1")
    _require_arrays("residual_rows", (("C", C), ("A", A), ("R", R), ("bias", bias)))
    _require_integers("residual_rows", (("c_offset", c_offset), ("c_rowstride", c_rowstride), ("a_offset", a_offset),
                                        ("a_rowstride", a_rowstride), ("r_offset", r_offset),
                                        ("r_rowstride", r_rowstride), ("b_offset", b_offset)))
    sig = types.void(C, c_offset, c_rowstride, A, a_offset, a_rowstride, R, r_offset, r_rowstride, bias, b_offset,
                     MR, NR, LANES)

    def codegen(context, builder, sig, args):
        def i64(i):
            return context.cast(builder, args[i], sig.args[i], types.int64)

        c_off, c_rs, a_off, a_rs, r_off, r_rs, b_off = (i64(i) for i in (1, 2, 4, 5, 7, 8, 10))
        c_data, a_data, r_data, b_data = (context.make_array(sig.args[i])(context, builder, args[i]).data
                                          for i in (0, 3, 6, 9))
        vty, nv, _, _, vector_at, splat = _vector_kit(builder, nr, lanes)
        for r in range(mr):
            row = ir.Constant(_I64, r)
            b = splat(builder.load(builder.gep(b_data, [builder.add(b_off, row)]), align=4))
            at = [(builder.add(base, builder.mul(row, rs))) for base, rs in ((a_off, a_rs), (r_off, r_rs), (c_off, c_rs))]
            sums = []
            for v in range(nv):
                j = ir.Constant(_I64, v * lanes)
                a = builder.load(vector_at(a_data, builder.add(at[0], j)), align=4)
                res = builder.load(vector_at(r_data, builder.add(at[1], j)), align=4)
                sums.append(builder.fadd(builder.fadd(a, b), res))
            for v in range(nv):
                builder.store(sums[v], vector_at(c_data, builder.add(at[2], ir.Constant(_I64, v * lanes))), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic(prefer_literal=True)
def plane_taps(typingctx, X, x_offset, x_rowstride, x_chanstride, h0, H, W, j0, Wt, w_offset, w_chanstride, bias,
               b_offset, C, c_offset, c_rowstride, c_chanstride, n_rows, n_cols, lo, hi,
               MR, SH, KH, KW, DH, DW, S, CI, MO, NR, LANES):
    """MO output channels x MR output rows x NR pixels of a conv over CI input planes, read
    straight from the unpadded NCHW planes (no padded copy), in registers:

        C[c_offset + o * c_chanstride + r * c_rowstride + c] = clamp(bias[b_offset + o] + sum over
            ci < CI, kh < KH, kw < KW of Wt[w_offset + o * w_chanstride + (ci * KH + kh) * KW + kw]
            * x(ci, h0 + r * SH + kh * DH, j0 + S * c + kw * DW), lo, hi)

    x(ci, h, j) = X[x_offset + ci * x_chanstride + h * x_rowstride + j] where 0 <= h < H and
    0 <= j < W, else 0 (the pads, so h0 and j0 are the window's first row and column, negative
    in the pads: loads are masked, so nothing outside the plane is read). Only rows r < n_rows
    and pixels c < n_cols are stored (masked). A depthwise conv is CI = MO = 1; a stem (3 input
    planes) CI = 3 and MO output channels a tile. Each input row the tile reads is loaded once
    (S * LANES floats a vector of outputs, masked) and split into its S phases (every S-th
    pixel: one permute each at S = 2, none at S = 1); every tap is one of those, or one shifted
    by whole lanes (one more permute, from the next vector), and serves every output row and
    channel reading that input row. A 3x3 kernel at stride 2 costs 3 permutes an input row and
    vector, where `row_taps` (a permute per tap) costs 3 per output row and kernel row; at
    stride 1, 2 permutes where `row_taps` makes 3 unaligned loads per output row and kernel
    row, mostly split across cache lines. MR, SH, KH, KW, DH, DW, S, CI, MO, NR, LANES integer
    literals; NR a multiple of LANES; (KW - 1) * DW <= S * LANES; float32."""
    lit = {n: _literal_int(t, n) for t, n in ((MR, "MR"), (SH, "SH"), (KH, "KH"), (KW, "KW"), (DH, "DH"), (DW, "DW"),
                                              (S, "S"), (CI, "CI"), (MO, "MO"), (NR, "NR"), (LANES, "LANES"))}
    mr, sh, kh_, kw_, dh, dw_, st, ci_, mo, nr, lanes = lit.values()
    if lanes < 1 or nr < lanes or nr % lanes or min(mr, sh, kh_, kw_, dh, dw_, st, ci_, mo) < 1 \
            or (kw_ - 1) * dw_ > st * lanes:
        raise TypingError(f"plane_taps: NR={nr} must be a multiple of LANES={lanes}; MR, SH, KH, KW, DH, DW, S, CI, "
                          f"MO >= 1; (KW - 1) * DW = {(kw_ - 1) * dw_} <= S * LANES")
    _require_arrays("plane_taps", (("X", X), ("Wt", Wt), ("bias", bias), ("C", C)))
    _require_integers("plane_taps", tuple((n, t) for n, t in (
        ("x_offset", x_offset), ("x_rowstride", x_rowstride), ("x_chanstride", x_chanstride), ("h0", h0), ("H", H),
        ("W", W), ("j0", j0), ("w_offset", w_offset), ("w_chanstride", w_chanstride), ("b_offset", b_offset),
        ("c_offset", c_offset), ("c_rowstride", c_rowstride), ("c_chanstride", c_chanstride), ("n_rows", n_rows),
        ("n_cols", n_cols))))
    for name, t in (("lo", lo), ("hi", hi)):
        if not isinstance(t, types.Float):
            raise TypingError(f"plane_taps: {name} must be a float, got {t}")
    sig = types.void(X, x_offset, x_rowstride, x_chanstride, h0, H, W, j0, Wt, w_offset, w_chanstride, bias,
                     b_offset, C, c_offset, c_rowstride, c_chanstride, n_rows, n_cols, lo, hi,
                     MR, SH, KH, KW, DH, DW, S, CI, MO, NR, LANES)

    def codegen(context, builder, sig, args):
        def i64(i):
            return context.cast(builder, args[i], sig.args[i], types.int64)

        x_off, x_rs, x_cs, top, height, width, col0, w_off, w_cs, b_off, c_off, c_rs, c_cs, m_valid, n_valid = (
            i64(i) for i in (1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 14, 15, 16, 17, 18))
        low, high = (context.cast(builder, args[i], sig.args[i], types.float32) for i in (19, 20))
        x_data, w_data, b_data, c_data = (context.make_array(sig.args[i])(context, builder, args[i]).data
                                          for i in (0, 8, 11, 13))
        vty, nv, fma, _, vector_at, splat = _vector_kit(builder, nr, lanes)
        i32, wide = ir.IntType(32), st * lanes
        wty, wmask = ir.VectorType(_F32, wide), ir.VectorType(ir.IntType(1), wide)
        mload, mstore = _masked_moves(builder, wide)[0], _masked_moves(builder, lanes)[1]
        align = ir.Constant(i32, 4)

        def splat_int(value, n):
            t = ir.VectorType(i32, n)
            v = builder.insert_element(ir.Constant(t, ir.Undefined), builder.trunc(value, i32), ir.Constant(i32, 0))
            return builder.shuffle_vector(v, ir.Constant(t, ir.Undefined), ir.Constant(t, [0] * n))

        def scalar(data, at):
            return builder.load(builder.gep(data, [at]), align=4)

        shifts = [(kw * dw_ % st, kw * dw_ // st) for kw in range(kw_)]   # (phase, whole-lane shift) per tap
        col_start, width_v = splat_int(col0, wide), splat_int(width, wide)
        col_masks = {}

        def cols_ok(v):
            """The columns of output vector v's load (v = 0 .. nv: the taps' shifts reach the next one)."""
            if v not in col_masks:
                cols = builder.add(col_start, ir.Constant(ir.VectorType(i32, wide), [wide * v + i for i in range(wide)]))
                col_masks[v] = builder.and_(builder.icmp_signed(">=", cols, ir.Constant(cols.type, [0] * wide)),
                                            builder.icmp_signed("<", cols, width_v))
            return col_masks[v]

        def weight(o, ci, kh, kw):
            at = builder.add(builder.add(w_off, builder.mul(w_cs, ir.Constant(_I64, o))),
                             ir.Constant(_I64, (ci * kh_ + kh) * kw_ + kw))
            return splat(scalar(w_data, at))

        accs = [[[splat(scalar(b_data, builder.add(b_off, ir.Constant(_I64, o))))] * nv for _ in range(mr)]
                for o in range(mo)]
        uses = {}   # input row (relative to h0) -> the (output row, kernel row) pairs reading it
        for r in range(mr):
            for kh in range(kh_):
                uses.setdefault(r * sh + kh * dh, []).append((r, kh))
        none, zeros = ir.Constant(wmask, [0] * wide), ir.Constant(wty, [0.0] * wide)
        for ci in range(ci_):
            for rr in sorted(uses):
                h = builder.add(top, ir.Constant(_I64, rr))
                row_ok = builder.and_(builder.icmp_signed(">=", h, ir.Constant(_I64, 0)),
                                      builder.icmp_signed("<", h, height))
                row_at = builder.add(builder.add(x_off, builder.mul(x_cs, ir.Constant(_I64, ci))),
                                     builder.add(builder.mul(h, x_rs), col0))
                phases = {}

                def phase(v, p):
                    """Lanes l of x(ci, h, j0 + S * (v * LANES + l) + p): the row's phase p of output vector v."""
                    if (v, p) not in phases:
                        at = builder.add(row_at, ir.Constant(_I64, wide * v))
                        ptr = builder.bitcast(builder.gep(x_data, [at]), wty.as_pointer())
                        run = builder.call(mload, [ptr, align, builder.select(row_ok, cols_ok(v), none), zeros])
                        for q in range(st):
                            phases[(v, q)] = run if st == 1 else builder.shuffle_vector(
                                run, ir.Constant(wty, ir.Undefined),
                                ir.Constant(ir.VectorType(i32, lanes), [st * i + q for i in range(lanes)]))
                    return phases[(v, p)]

                def tap(v, p, s):
                    if s == 0:
                        return phase(v, p)
                    return builder.shuffle_vector(phase(v, p), phase(v + 1, p), ir.Constant(
                        ir.VectorType(i32, lanes), [s + i for i in range(lanes)]))
                for kw, (p, s) in enumerate(shifts):
                    for v in range(nv):
                        t = tap(v, p, s)
                        for r, kh in uses[rr]:
                            for o in range(mo):
                                accs[o][r][v] = builder.call(fma, [weight(o, ci, kh, kw), t, accs[o][r][v]])
        lo_v, hi_v = splat(low), splat(high)
        n_left = splat_int(n_valid, lanes)
        for o in range(mo):
            c_base = builder.gep(c_data, [builder.add(c_off, builder.mul(c_cs, ir.Constant(_I64, o)))])
            for r in range(mr):
                row_in = builder.icmp_signed("<", ir.Constant(_I64, r), m_valid)
                for v in range(nv):
                    a = _clamp(builder, accs[o][r][v], lo_v, hi_v)
                    cols = builder.icmp_signed("<", ir.Constant(ir.VectorType(i32, lanes),
                                                                [v * lanes + i for i in range(lanes)]), n_left)
                    mask = builder.select(row_in, cols, ir.Constant(cols.type, [0] * lanes))
                    at = builder.add(builder.mul(ir.Constant(_I64, r), c_rs), ir.Constant(_I64, v * lanes))
                    builder.call(mstore, [a, vector_at(c_base, at), align, mask])
        return context.get_dummy_value()

    return sig, codegen


def _lane_mask(builder, count, start: int, lanes: int):
    """<lanes x i1>: lane q set where start + q < count (count an i64)."""
    idx = ir.Constant(ir.VectorType(_I64, lanes), [start + q for q in range(lanes)])
    cnt = builder.insert_element(ir.Constant(ir.VectorType(_I64, lanes), ir.Undefined), count, ir.Constant(ir.IntType(32), 0))
    cnt = builder.shuffle_vector(cnt, cnt, ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))
    return builder.icmp_signed("<", idx, cnt)


def _stores(builder, lanes: int, full, count, stores) -> None:
    """`stores` ([(vector, pointer, first lane's index)]) as plain stores where `full`, else masked
    to the lanes whose index is under `count` (a run's last, partial vectors)."""
    _, masked_store = _masked_moves(builder, lanes)
    with builder.if_else(full) as (whole, part):
        with whole:
            for v, ptr, _ in stores:
                builder.store(v, ptr, align=4)
        with part:
            for v, ptr, first in stores:
                builder.call(masked_store, [v, ptr, ir.Constant(ir.IntType(32), 4), _lane_mask(builder, count, first, lanes)])


@intrinsic(prefer_literal=True)
def wino_in_tiles(typingctx, X, x_offset, x_rowstride, V, v_offset, v_planestride, count, ROW, LANES):
    """Winograd F(2x2, 3x3)'s input transform, row ROW of B^T d (0..3), for the first `count` (at
    most LANES) of LANES neighbouring tiles of one zero-bordered input plane: the 4x4 windows'
    rows i at `x_offset + i * x_rowstride`, tile u's window at columns 2u .. 2u + 3; V[v_offset +
    (4 ROW + j) * v_planestride + u] = (B^T d_u B)[4 ROW + j] for j < 4, u < count
    (`schedules.templates.conv2d_winograd`). The two input rows B^T's row combines are combined
    as contiguous vectors, then split into even and odd columns by shuffles; a partial run's
    stores are masked. One ROW a call, so that a loop over the tiles writes 4 planes of V at a
    time: the 16 planes lie a multiple of 4 KiB apart in memory (C x P floats), and 16 write
    streams in the same cache sets ran 3x slower. As generated scalar code per tile, LLVM's loop
    vectorizer gave up (too many run-time alias checks) and its SLP pass packed the wrong
    statements. ROW and LANES integer literals (LANES a power of two); nothing is bounds-checked:
    the call reads 2 * LANES + 2 floats of each row, whatever `count`; float32."""
    row, lanes = _literal_int(ROW, "ROW"), _literal_int(LANES, "LANES")
    if row not in range(4) or lanes < 2 or lanes & (lanes - 1):
        raise TypingError(f"wino_in_tiles: ROW={row} must be 0..3, LANES={lanes} a power of two")
    _require_arrays("wino_in_tiles", (("X", X), ("V", V)))
    _require_integers("wino_in_tiles", (("x_offset", x_offset), ("x_rowstride", x_rowstride), ("v_offset", v_offset),
                                        ("v_planestride", v_planestride), ("count", count)))
    sig = types.void(X, x_offset, x_rowstride, V, v_offset, v_planestride, count, ROW, LANES)
    # B^T's row ROW: (first row, second row, second's sign)
    first, second, sign = ((0, 2, -1), (1, 2, 1), (2, 1, -1), (1, 3, -1))[row]

    def codegen(context, builder, sig, args):
        def i64(i):
            return context.cast(builder, args[i], sig.args[i], types.int64)

        x_off, x_rs, v_off, v_ps, n = (i64(i) for i in (1, 2, 4, 5, 6))
        x_data, v_data = (context.make_array(sig.args[i])(context, builder, args[i]).data for i in (0, 3))
        _, _, _, _, vector_at, _ = _vector_kit(builder, lanes, lanes)

        def const(k):
            return ir.Constant(_I64, k)

        def row_at(i, shift, half):   # `lanes` floats of window row i from column `shift` + half * lanes
            at = builder.add(builder.add(x_off, builder.mul(const(i), x_rs)), const(shift + half * lanes))
            return builder.load(vector_at(x_data, at), align=4)
        i32 = ir.IntType(32)
        even = ir.Constant(ir.VectorType(i32, lanes), [2 * q for q in range(lanes)])
        odd = ir.Constant(ir.VectorType(i32, lanes), [2 * q + 1 for q in range(lanes)])
        combine = builder.fsub if sign < 0 else builder.fadd
        cols = []
        for shift in (0, 2):   # window columns (0, 1), then (2, 3)
            lo, hi = (combine(row_at(first, shift, h), row_at(second, shift, h)) for h in (0, 1))
            cols += [builder.shuffle_vector(lo, hi, even), builder.shuffle_vector(lo, hi, odd)]
        sub, add = builder.fsub, builder.fadd
        outs = (sub(cols[0], cols[2]), add(cols[1], cols[2]), sub(cols[2], cols[1]), sub(cols[1], cols[3]))
        _stores(builder, lanes, builder.icmp_signed(">=", n, const(lanes)), n,
                [(v, vector_at(v_data, builder.add(v_off, builder.mul(const(4 * row + j), v_ps))), 0)
                 for j, v in enumerate(outs)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic(prefer_literal=True)
def wino_out_tiles(typingctx, M, m_offset, m_planestride, bias, b_offset, O, o_offset, o_rowstride, count, ROWS, LANES):
    """Winograd F(2x2, 3x3)'s output transform of LANES neighbouring tiles: m_u[xi] =
    M[m_offset + xi * m_planestride + u]; the tiles' 2x2 outputs (A^T m_u A) + bias[b_offset]
    stored as ROWS (1 or 2: a map's odd last row) output rows of the first `count` (at most
    2 LANES) of their 2 * LANES pixels at `o_offset + k * o_rowstride`, each row's two columns of
    every tile interleaved by two shuffles (as generated scalar code, LLVM built these stores
    from inserts). A partial run (count < 2 LANES: a row's last tiles, an odd map's last column)
    loads only its tiles' M and stores only its pixels (masked). ROWS and LANES integer literals
    (LANES a power of two); nothing is bounds-checked; float32."""
    rows, lanes = _literal_int(ROWS, "ROWS"), _literal_int(LANES, "LANES")
    if rows not in (1, 2) or lanes < 2 or lanes & (lanes - 1):
        raise TypingError(f"wino_out_tiles: ROWS={rows} must be 1 or 2, LANES={lanes} a power of two")
    _require_arrays("wino_out_tiles", (("M", M), ("bias", bias), ("O", O)))
    _require_integers("wino_out_tiles", (("m_offset", m_offset), ("m_planestride", m_planestride),
                                         ("b_offset", b_offset), ("o_offset", o_offset), ("o_rowstride", o_rowstride),
                                         ("count", count)))
    sig = types.void(M, m_offset, m_planestride, bias, b_offset, O, o_offset, o_rowstride, count, ROWS, LANES)

    def codegen(context, builder, sig, args):
        def i64(i):
            return context.cast(builder, args[i], sig.args[i], types.int64)

        m_off, m_ps, b_off, o_off, o_rs, n = (i64(i) for i in (1, 2, 4, 6, 7, 8))
        m_data, b_data, o_data = (context.make_array(sig.args[i])(context, builder, args[i]).data for i in (0, 3, 5))
        vty, _, _, _, vector_at, splat = _vector_kit(builder, lanes, lanes)
        masked_load, _ = _masked_moves(builder, lanes)

        def const(k):
            return ir.Constant(_I64, k)
        full = builder.icmp_signed(">=", n, const(2 * lanes))
        tiles = builder.ashr(builder.add(n, const(1)), const(1))   # tiles with a pixel to store
        ptrs = [[vector_at(m_data, builder.add(m_off, builder.mul(const(4 * i + j), m_ps))) for j in range(4)]
                for i in range(4)]
        with builder.if_else(full) as (whole, part):
            with whole:
                plain = [[builder.load(p, align=4) for p in row] for row in ptrs]
                whole_end = builder.basic_block
            with part:
                mask = _lane_mask(builder, tiles, 0, lanes)
                zero = ir.Constant(vty, [0.0] * lanes)
                masked = [[builder.call(masked_load, [p, ir.Constant(ir.IntType(32), 4), mask, zero]) for p in row]
                          for row in ptrs]
                part_end = builder.basic_block
        m = []
        for i in range(4):
            m.append([])
            for j in range(4):
                phi = builder.phi(vty)
                phi.add_incoming(plain[i][j], whole_end)
                phi.add_incoming(masked[i][j], part_end)
                m[i].append(phi)
        b = splat(builder.load(builder.gep(b_data, [b_off]), align=4))
        sub, add = builder.fsub, builder.fadd
        a = [[add(add(m[0][j], m[1][j]), m[2][j]) for j in range(4)],
             [sub(sub(m[1][j], m[2][j]), m[3][j]) for j in range(4)]]
        i32 = ir.IntType(32)
        half = lanes // 2
        lo = ir.Constant(ir.VectorType(i32, lanes), [q // 2 + (q % 2) * lanes for q in range(lanes)])
        hi = ir.Constant(ir.VectorType(i32, lanes), [half + q // 2 + (q % 2) * lanes for q in range(lanes)])
        stores = []
        for k in range(rows):
            y0 = add(add(add(a[k][0], a[k][1]), a[k][2]), b)
            y1 = add(sub(sub(a[k][1], a[k][2]), a[k][3]), b)
            at = builder.add(o_off, builder.mul(const(k), o_rs))
            stores += [(builder.shuffle_vector(y0, y1, lo), vector_at(o_data, at), 0),
                       (builder.shuffle_vector(y0, y1, hi), vector_at(o_data, builder.add(at, const(lanes))), lanes)]
        _stores(builder, lanes, full, n, stores)
        return context.get_dummy_value()

    return sig, codegen


def _require_arrays(fn: str, pairs) -> None:
    """The intrinsics' typing checks, one message each: (name, numba type) pairs."""
    for name, arr in pairs:
        if not isinstance(arr, types.Array) or arr.dtype != types.float32:
            raise TypingError(f"{fn}: {name} must be a float32 array, got {arr}")


def _require_integers(fn: str, pairs) -> None:
    for name, t in pairs:
        if not isinstance(t, types.Integer):
            raise TypingError(f"{fn}: {name} must be an integer, got {t}")


def _require_offsets(fn: str, name: str, t, what: str) -> None:
    if not isinstance(t, types.BaseTuple) or not len(t) or not all(isinstance(x, types.Integer) for x in t):
        raise TypingError(f"{fn}: {name} must be a tuple of integers ({what}), got {t}")


def _int_triple(t) -> bool:
    return isinstance(t, types.BaseTuple) and len(t) == 3 and all(isinstance(x, types.Integer) for x in t)


def _nest_levels(n_k) -> int | None:
    """The number of outer loops of a nest-form `n_k` (a tuple of (count, a_stride, b_stride)
    tuples ending with the inner count or segments), None for a plain integer n_k; else a
    TypingError."""
    if isinstance(n_k, types.Integer):
        return None
    last = n_k[-1] if isinstance(n_k, types.BaseTuple) and len(n_k) else None
    segments = isinstance(last, types.BaseTuple) and len(last) and all(_int_triple(t) for t in last)
    if last is None or not (isinstance(last, types.Integer) or segments) \
            or not all(_int_triple(lv) for lv in n_k[:-1]):
        raise TypingError("tile_fma: n_k must be an integer or a tuple ((count, a_stride, b_stride), ..., n_k), "
                          f"n_k an integer or a tuple of (a_offset, b_offset, count) segments, got {n_k}")
    return len(n_k) - 1


def _transpose(builder, rows: list, lanes: int) -> list:
    """The LANES x LANES block whose rows are the vectors `rows`, transposed: one step per bit
    of the index, each swapping that bit of the row and lane indices across pairs of rows with
    two-input shuffles (LANES * log2(LANES) shuffles in all)."""
    rows, bit = list(rows), 1
    while bit < lanes:
        lo = [j if not j & bit else lanes + j - bit for j in range(lanes)]
        hi = [j + bit if not j & bit else lanes + j for j in range(lanes)]
        for i in range(lanes):
            if not i & bit:
                a, b = rows[i], rows[i | bit]
                rows[i] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), lanes), lo))
                rows[i | bit] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), lanes), hi))
        bit *= 2
    return rows


def _pieces(count: int, lanes: int) -> list:
    """[(first, width)]: `count` consecutive lanes as whole vectors of power-of-two widths, widest
    first (6 of 8 lanes: 4 + 2), so that a column of fewer rows than LANES moves without a mask."""
    pieces, first = [], 0
    while first < count:
        width = lanes
        while width > count - first:
            width //= 2
        pieces.append((first, width))
        first += width
    return pieces


def _column_tile(builder, vty, lanes: int, mr: int, nr: int, c_data, c_off, cs, m_valid, n_valid):
    """The C tile stored column-major (column c's MR elements contiguous, columns `cs` apart, as
    an NCHW output's channel rows take a pixels x channels tile), of which the first `m_valid`
    rows and `n_valid` columns are written: load() -> accumulators [r][v], store(accs).
    Per LANES rows x LANES columns, one transpose (`_transpose`) and LANES vector moves: plain
    ones of power-of-two widths (`_pieces`) where the whole tile is inside (m_valid >= MR and
    n_valid >= NR, every tile but a plane's or a channel range's last), masked ones at the edges
    (on Zen 3 a masked store takes ~10x a plain one: 6x16's 16 of them cost the 1x1 conv over a
    7x7 plane 12 % of its time)."""
    i32, i1v = ir.IntType(32), ir.VectorType(ir.IntType(1), lanes)
    ptr_ty = vty.as_pointer()
    mload, mstore = _masked_moves(builder, lanes)
    ivty = ir.VectorType(_I64, lanes)
    rows_left = builder.insert_element(ir.Constant(ivty, ir.Undefined), m_valid, ir.Constant(i32, 0))
    rows_left = builder.shuffle_vector(rows_left, ir.Constant(ivty, ir.Undefined),
                                       ir.Constant(ir.VectorType(i32, lanes), [0] * lanes))
    groups = -(-mr // lanes)
    zero, none = ir.Constant(vty, [0.0] * lanes), ir.Constant(i1v, [0] * lanes)
    whole = builder.and_(builder.icmp_signed(">=", m_valid, ir.Constant(_I64, mr)),
                         builder.icmp_signed(">=", n_valid, ir.Constant(_I64, nr)))

    def element(v, j, gi):
        """The offset of column v * LANES + j's element gi * LANES."""
        return builder.add(c_off, builder.add(builder.mul(ir.Constant(_I64, v * lanes + j), cs),
                                              ir.Constant(_I64, gi * lanes)))

    def at(v, j, gi):
        """Column v * LANES + j's vector of rows gi * LANES ..., and its mask."""
        first = [gi * lanes + x for x in range(lanes)]
        rows = builder.icmp_signed("<", ir.Constant(ivty, first), rows_left)
        rows = builder.and_(rows, ir.Constant(i1v, [int(x < mr) for x in first]))
        col_ok = builder.icmp_signed("<", ir.Constant(_I64, v * lanes + j), n_valid)
        return builder.bitcast(builder.gep(c_data, [element(v, j, gi)]), ptr_ty), builder.select(col_ok, rows, none)

    def piece_ptr(v, j, gi, first, width):
        ptr = builder.gep(c_data, [builder.add(element(v, j, gi), ir.Constant(_I64, first))])
        return ptr if width == 1 else builder.bitcast(ptr, ir.VectorType(_F32, width).as_pointer())

    def lane_list(lanes_):
        return ir.Constant(ir.VectorType(i32, len(lanes_)), list(lanes_))

    def gather(v, j, gi):
        """Column v * LANES + j's rows gi * LANES ... (all inside) as one vector, plain loads."""
        col = zero
        for first, width in _pieces(min(lanes, mr - gi * lanes), lanes):
            part = builder.load(piece_ptr(v, j, gi, first, width), align=4)
            if width == 1:
                col = builder.insert_element(col, part, ir.Constant(i32, first))
            elif width == lanes:
                col = part
            else:   # the piece widened to LANES, then blended into its lanes
                wide = builder.shuffle_vector(part, part, lane_list([min(x, width - 1) for x in range(lanes)]))
                col = builder.shuffle_vector(col, wide, lane_list([lanes + x - first if first <= x < first + width
                                                                   else x for x in range(lanes)]))
        return col

    def scatter(col, v, j, gi):
        """`col` into column v * LANES + j's rows gi * LANES ... (all inside), plain stores."""
        for first, width in _pieces(min(lanes, mr - gi * lanes), lanes):
            if width == 1:
                part = builder.extract_element(col, ir.Constant(i32, first))
            elif width == lanes:
                part = col
            else:
                part = builder.shuffle_vector(col, col, lane_list(range(first, first + width)))
            builder.store(part, piece_ptr(v, j, gi, first, width), align=4)

    align = ir.Constant(i32, 4)

    def load():
        columns = {}
        with builder.if_else(whole) as (inside, edge):
            with inside:
                for v in range(nr // lanes):
                    for gi in range(groups):
                        for j in range(lanes):
                            columns[v, gi, j] = [gather(v, j, gi), builder.block]
            with edge:
                for v in range(nr // lanes):
                    for gi in range(groups):
                        for j in range(lanes):
                            ptr, mask = at(v, j, gi)
                            columns[v, gi, j] += [builder.call(mload, [ptr, align, mask, zero]), builder.block]
        for key, (a, a_block, b, b_block) in columns.items():   # the phis first: LLVM wants them on top
            columns[key] = builder.phi(vty)
            columns[key].add_incoming(a, a_block)
            columns[key].add_incoming(b, b_block)
        accs = [[None] * (nr // lanes) for _ in range(mr)]
        for v in range(nr // lanes):
            for gi in range(groups):
                cols = [columns[v, gi, j] for j in range(lanes)]
                for x, row in enumerate(_transpose(builder, cols, lanes)):
                    if gi * lanes + x < mr:
                        accs[gi * lanes + x][v] = row
        return accs

    def store(accs):
        columns = {}
        for v in range(nr // lanes):
            for gi in range(groups):
                rows = [accs[gi * lanes + x][v] if gi * lanes + x < mr else zero for x in range(lanes)]
                for j, col in enumerate(_transpose(builder, rows, lanes)):
                    columns[v, gi, j] = col
        with builder.if_else(whole) as (inside, edge):
            with inside:
                for (v, gi, j), col in columns.items():
                    scatter(col, v, j, gi)
            with edge:
                for (v, gi, j), col in columns.items():
                    ptr, mask = at(v, j, gi)
                    builder.call(mstore, [col, ptr, align, mask])
    return load, store


def _nest_codegen(mr: int, nr: int, lanes: int, n_outer: int, columns: bool = False):
    """The nest form's IR: the accumulators live in stack slots of the entry block, which LLVM's
    SROA/mem2reg turn into registers (phis at every loop head); the outer loops only move the
    A and B base offsets; the inner loop is the plain form's body. `columns`: C's tile is
    column-major and masked (`_column_tile`)."""

    def codegen(context, builder, sig, args):
        aty, oty, a_ks_ty, bty, b_off_ty, b_ks_ty, nest_ty, cty = sig.args[:8]
        a, offs, a_ks, b, b_off, b_ks, nest, c, c_off, c_rs, acc_flag = args[:11]

        def i64(value, ty):
            return context.cast(builder, value, ty, types.int64)

        a_ks, b_off, b_ks = i64(a_ks, a_ks_ty), i64(b_off, b_off_ty), i64(b_ks, b_ks_ty)
        c_off = i64(c_off, sig.args[8])
        if columns:
            c_rs = [i64(v, t) for v, t in zip(cgutils.unpack_tuple(builder, c_rs, 3), sig.args[9])]
        else:
            c_rs = i64(c_rs, sig.args[9])
        parts = cgutils.unpack_tuple(builder, nest, n_outer + 1)
        outer = []
        for value, ty in zip(parts[:-1], nest_ty[:-1]):
            outer.append([i64(v, t) for v, t in zip(cgutils.unpack_tuple(builder, value, 3), ty)])
        if isinstance(nest_ty[-1], types.Integer):   # one run from the level's offsets
            runs = [(ir.Constant(_I64, 0), ir.Constant(_I64, 0), i64(parts[-1], nest_ty[-1]))]
        else:   # segments: (a_offset, b_offset, count) runs one after the other
            runs = [[i64(v, t) for v, t in zip(cgutils.unpack_tuple(builder, seg, 3), seg_ty)]
                    for seg, seg_ty in zip(cgutils.unpack_tuple(builder, parts[-1], len(nest_ty[-1])), nest_ty[-1])]
        flag = context.cast(builder, acc_flag, sig.args[10], types.boolean)
        a_data = context.make_array(aty)(context, builder, a).data
        b_data = context.make_array(bty)(context, builder, b).data
        c_data = context.make_array(cty)(context, builder, c).data
        a_offs = [i64(o, t) for o, t in zip(cgutils.unpack_tuple(builder, offs, mr), oty)]
        vty, nv, fma, zero, vector_at, splat = _vector_kit(builder, nr, lanes)

        # accumulate: the accumulators start from C (loaded once; C's tile is stored at the end
        # anyway, so the loads are in bounds) rather than being added to it at the end, so a
        # second call after a first into the same C keeps one set of accumulators live, not two
        slots = [[cgutils.alloca_once(builder, vty, name=f"acc{r}_{v}") for v in range(nv)] for r in range(mr)]
        if columns:   # masked loads, a transpose: only where the tile accumulates
            load_tile, store_tile = _column_tile(builder, vty, lanes, mr, nr, c_data, c_off, *c_rs)
            with builder.if_else(flag) as (added, stored):
                with added:
                    for r, row in enumerate(load_tile()):
                        for v in range(nv):
                            builder.store(row[v], slots[r][v])
                with stored:
                    for r in range(mr):
                        for v in range(nv):
                            builder.store(zero, slots[r][v])
        else:
            c_base = builder.gep(c_data, [c_off])
            ptrs = [[vector_at(c_base, builder.add(builder.mul(ir.Constant(_I64, r), c_rs),
                                                   ir.Constant(_I64, v * lanes))) for v in range(nv)] for r in range(mr)]
            for r in range(mr):
                for v in range(nv):
                    builder.store(builder.select(flag, builder.load(ptrs[r][v], align=4), zero), slots[r][v])

        def loops(level, a_base, b_base):
            if level == n_outer:
                for a_seg, b_seg, nk in runs:
                    run(builder.add(a_base, a_seg), builder.add(b_base, b_seg), nk)
                return
            count, a_step, b_step = outer[level]
            with cgutils.for_range(builder, count) as loop:
                j = loop.index
                loops(level + 1, builder.add(a_base, builder.mul(j, a_step)), builder.add(b_base, builder.mul(j, b_step)))

        def run(a_base, b_base, nk):
            """The contiguous k run from these base offsets: the plain form's loop body."""
            with cgutils.for_range(builder, nk) as loop:
                k = loop.index
                b_k = builder.add(b_base, builder.mul(k, b_ks))
                bvec = [builder.load(vector_at(b_data, builder.add(b_k, ir.Constant(_I64, v * lanes))), align=4)
                        for v in range(nv)]
                a_k = builder.add(a_base, builder.mul(k, a_ks))
                for r in range(mr):
                    ar = builder.load(builder.gep(a_data, [builder.add(a_offs[r], a_k)]), align=4)
                    a_splat = splat(ar)
                    for v in range(nv):
                        builder.store(builder.call(fma, [a_splat, bvec[v], builder.load(slots[r][v])]), slots[r][v])

        loops(0, ir.Constant(_I64, 0), b_off)
        if columns:
            store_tile([[builder.load(slots[r][v]) for v in range(nv)] for r in range(mr)])
        else:
            for r in range(mr):
                for v in range(nv):
                    builder.store(builder.load(slots[r][v]), ptrs[r][v], align=4)
        return context.get_dummy_value()

    return codegen

"""Conv2d, NCHW (strides, pads, dilations, groups incl. depthwise) with a fused epilogue.

Convolution as an implicit GEMM: rows are output pixels, columns output channels,
the reduction runs over K = C/groups * KH * KW. Weights are packed once, at
prepare time, into `Wp[g, oc_tile, k, 0:NR]` panels (contiguous per k, like
dense's B panels), and an MR (pixels) x NR (channels) register tile of scalar
locals is SLP-vectorized along the channels. Two algorithms:

- `direct`: the tile is MR neighbouring pixels of one output row, read straight
  from the (zero-padded) input: no packing of activations;
- `im2col`: pixels of the flattened output plane are packed into `Ap[tile, k, 0:MR]`
  panels first (tiles cross rows, so narrow late layers waste no lanes).

Kernel size, strides and dilations are code constants; sizes of the tensors (and
pads) are run-time arguments, so layers of equal geometry share a compile. Block
sizes (output-channel tiles and pixel tiles per work item) and threading are
run-time knobs too.

The launch: `pack_w` (at prepare for constant weights), `pad` (the input into a
zero-bordered workspace, when pads or the direct tiles' overrun need one), then
`conv` (direct), or per (image, group) `pack_a` + `gemm` (im2col).
"""
from __future__ import annotations

import numpy as np

from ir.ops.nn import _concrete_pads
from ir.workload import Workload
from schedules.epilogue import Epilogue, parse_epilogue
from schedules.launch import Buffer, Call, In, Launch, Out, Packed, Repeat, Scalar, Table, Var, Work
from schedules.loopnest import Alloc, Assign, For, Function, If, LoopModule, Param
from schedules.microkernel import F0, k_range, register_tile
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import Lowered, Template

REG_TILES = ("4x16", "8x16", "4x32", "8x32")


def _geometry(wl: Workload):
    node = wl.nodes()[0]
    x, w = wl.inputs[0]["shape"], wl.inputs[1]["shape"]
    strides, dil, pads, outs, extra = _concrete_pads(node, list(x[2:]), list(w[2:]))
    return {"KH": w[2], "KW": w[3], "SH": strides[0], "SW": strides[1], "DH": dil[0], "DW": dil[1],
            "PT": pads[0], "PL": pads[1], "G": int(node.attrs.get("group", 1))}


def _epilogue(wl: Workload) -> Epilogue | None:
    return parse_epilogue(wl, len(wl.ops[0]["in"]), wl.output_shape, channel_axis=1, broadcast_full=True)


class Conv2dTemplate(Template):
    name = "conv2d"
    version = 1

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

    def space(self, wl: Workload) -> ConfigSpace:
        return ConfigSpace([
            Knob("algo", ("direct", "im2col")),
            Knob("regtile", REG_TILES),
            Knob("order", ("oc_px", "px_oc")),
            Knob("parallel", (True, False), code_shape=False),
            Knob("OCB", (1, 2, 4, 8, 16), code_shape=False),
            Knob("PB", (1, 2, 4, 8, 16), code_shape=False),
        ])

    def default_config(self, wl: Workload) -> Config:
        ow = wl.output_shape[3]
        algo = "direct" if ow >= 28 else "im2col"
        return self.space(wl).validate({"algo": algo, "regtile": "4x32" if wl.inputs[1]["shape"][0] >= 32 else "4x16",
                                        "order": "oc_px", "parallel": True, "OCB": 2, "PB": 2})

    def lower(self, wl: Workload, cfg: Config) -> Lowered:
        geo = _geometry(wl)
        epi = _epilogue(wl)
        mr, nr = (int(v) for v in cfg["regtile"].split("x"))
        algo, order = cfg["algo"], cfg["order"]
        funcs = (_pack_w(nr), _pad())
        funcs += (_direct(mr, nr, order, geo, epi),) if algo == "direct" else (_pack_im2col(mr, geo), _gemm(mr, nr, order, epi))
        module = LoopModule(funcs, doc=f"conv2d kernel: {algo} regtile={mr}x{nr} order={order} "
                            f"kernel={geo['KH']}x{geo['KW']} stride={geo['SH']}x{geo['SW']} dilation={geo['DH']}x{geo['DW']}, "
                            f"epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"conv2d v{self.version}"})
        par, OCB, PB = cfg["parallel"], cfg["OCB"], cfg["PB"]
        G, KH, KW = geo["G"], geo["KH"], geo["KW"]
        N, C, H, W = (int(d) for d in wl.inputs[0]["shape"])
        OC = int(wl.inputs[1]["shape"][0])
        OH, OW = (int(d) for d in wl.output_shape[2:])
        Cg, OCg = C // G, OC // G
        K, n_oct = Cg * KH * KW, -(-OCg // nr)
        n_ob = -(-n_oct // OCB)

        # weights -> Wp[g, oc_tile, k, 0:NR]: depends on the weight shape only, so constant
        # weights are packed once and shared by every shape of the signature
        wp = Buffer("Wp", (G, n_oct, K, nr))
        w_const = wl.inputs[1]["const"]
        pack_w = Call("pack_w", (In(1, (OC, K), "float32"), Packed("Wp") if w_const else Work("Wp"),
                                 Scalar(G), Scalar(OCg), Scalar(K)), items=G * n_oct, parallel=par)
        tables = {}
        if len(wl.ops[0]["in"]) == 3:
            bias = In(2, (OC,), "float32")
        else:   # one code for convs with and without bias: these add zeros
            tables["bias0"] = np.zeros(OC, np.float32)
            bias = Table("bias0")
        extras = tuple(e.arg(wl, N * OC, OH * OW, wl.output_shape) for e in epi.extras)

        # the input, zero-padded to what the tiles read (direct tiles run MR pixels past OW)
        hp = max(H + geo["PT"], (OH - 1) * geo["SH"] + (KH - 1) * geo["DH"] + 1)
        ow_need = -(-OW // mr) * mr if algo == "direct" else OW
        wpad = max(W + geo["PL"], (ow_need - 1) * geo["SW"] + (KW - 1) * geo["DW"] + 1)
        x = In(0, (N, C, H, W), "float32")
        work, steps = [], []
        if not w_const:
            work.append(wp)
            steps.append(pack_w)
        if (hp, wpad) != (H, W) or geo["PT"] or geo["PL"]:
            work.append(Buffer("Xp", (N, C, hp, wpad)))
            steps.append(Call("pad", (x, Work("Xp"), *(Scalar(v) for v in (N, C, H, W, hp, wpad, geo["PT"], geo["PL"]))),
                              items=N * C, parallel=par))
            x = Work("Xp")
        w = pack_w.args[1]
        if algo == "direct":
            steps.append(Call("conv", (x, w, bias, *extras, Out(), *(Scalar(v) for v in (N, C, OC, G, OH, OW, OCB, PB))),
                              items=N * G * n_ob * -(-OH // PB), parallel=par))
        else:
            P = OH * OW
            n_pt = -(-P // mr)
            work.append(Buffer("Ap", (n_pt, K, mr)))
            per_group = (
                Call("pack_a", (x, Work("Ap"), Var("n"), Var("g"), Scalar(Cg), Scalar(OW), Scalar(P)),
                     items=n_pt, parallel=par),
                Call("gemm", (Work("Ap"), w, bias, *extras, Out(), Var("n"), Var("g"),
                              *(Scalar(v) for v in (C, OC, G, OH, OW, OCB, PB))),
                     items=n_ob * -(-n_pt // PB), parallel=par),
            )
            steps.append(Repeat("n", N, (Repeat("g", G, per_group),)))
        prepare = (pack_w,) if w_const else ()
        return Lowered(module, Launch(tuple(steps), prepare=prepare, packed=(wp,) if w_const else (),
                                      workspaces=tuple(work), tables=tables))


def _pack_w(nr: int) -> Function:
    """W[OC, K] (K = C/G * KH * KW) into NR-channel panels Wp[g, oc_tile, k, 0:NR], zeros past
    the group's channels; thread t of T packs panels t, t+T, ..."""
    body = (
        Assign("n_oct", f"(OCg + {nr - 1}) // {nr}"),
        For("it", "t", "G * n_oct", step="T", body=(
            Assign("g", "it // n_oct"), Assign("oct", "it % n_oct"),
            For("k", "0", "K", (
                For("q", "0", str(nr), (
                    Assign("oc", f"oct * {nr} + q"),
                    If("oc < OCg", (Assign("Wp[g, oct, k, q]", "W[g * OCg + oc, k]"),),
                       (Assign("Wp[g, oct, k, q]", F0),)),
                )),
            )),
        )),
    )
    params = (Param("W", "float32[:, ::1]"), Param("Wp", "float32[:, :, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("G", "OCg", "K", "t", "T"))
    return Function("pack_w", params, body)


def _pad() -> Function:
    """X[N, C, H, W] into the workspace Xp[N, C, HP, WP] at offset (PT, PL), every other element
    zero (a workspace holds garbage when a call starts); thread t of T writes planes t, t+T, ...
    The row copy goes through views indexed from 0: with `Xp[..., PL + iw]` numba's
    negative-index wraparound keeps LLVM from vectorizing it (4-6x slower, measured)."""
    row = (
        For("iw", "0", "PL", (Assign("Xp[n, c, ih, iw]", F0),)),
        Assign("dst", "Xp[n, c, ih, PL:PL + W]"), Assign("src", "X[n, c, h]"),
        For("iw", "0", "W", (Assign("dst[iw]", "src[iw]"),)),
        For("iw", "PL + W", "WP", (Assign("Xp[n, c, ih, iw]", F0),)),
    )
    body = (
        For("p", "t", "N * C", step="T", body=(
            Assign("n", "p // C"), Assign("c", "p % C"),
            For("ih", "0", "HP", (
                Assign("h", "ih - PT"),
                If("h >= 0 and h < H", row, (For("iw", "0", "WP", (Assign("Xp[n, c, ih, iw]", F0),)),)),
            )),
        )),
    )
    params = (Param("X", "float32[:, :, :, ::1]"), Param("Xp", "float32[:, :, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("N", "C", "H", "W", "HP", "WP", "PT", "PL", "t", "T"))
    return Function("pad", params, body)


def _tile(mr: int, nr: int, a_load, k_loops, epi: Epilogue, pixel) -> tuple:
    """The MR x NR register tile (pixels x output channels): B is the weight panel Wk[k, 0:NR]."""
    assigns, result = epi.emit("v", "n * OC + oc", "oh * OW + ow", "e", c="oc")
    store = pixel + (
        If("ok", (
            For("q", "0", f"min({nr}, OCg - oct * {nr})", (
                Assign("oc", f"g * OCg + oct * {nr} + q"),
                Assign("v", "ct[r, q] + bias[oc]"),
            ) + tuple(Assign(n, e) for n, e in assigns) + (Assign("out[n, oc, oh, ow]", result),)),
        )),
    )
    return (Assign("Wk", "Wp[g, oct]"),) + register_tile(
        mr, nr, a_load, lambda q: f"Wk[k, {q}]", k_loops, store,
        comment=f"{mr}x{nr} register tile (pixels x output channels), SLP-vectorized along channels")


def _params(epi: Epilogue, first: tuple) -> tuple:
    return first + (Param("Wp", "float32[:, :, :, ::1]"), Param("bias", "float32[::1]")) \
        + tuple(Param(n, t) for n, t in epi.params()) + (Param("out", "float32[:, :, :, ::1]"),)


def _tile_loops(order: str, px: tuple, body: tuple) -> tuple:
    oc = ("oct", "ob * OCB", "min(n_oct, ob * OCB + OCB)")
    outer, inner = (oc, px) if order == "oc_px" else (px, oc)
    return (For(*outer, body=(For(*inner, body=body),)),)


def _direct(mr: int, nr: int, order: str, geo: dict, epi: Epilogue) -> Function:
    g = geo

    def k_loops(body):
        return (For("c", "0", "Cg", (
            Assign("ci", "g * Cg + c"),
            For("kh", "0", str(g["KH"]), (
                Assign("xr", f"Xp[n, ci, oh * {g['SH']} + kh * {g['DH']}]"),
                Assign("kb", f"(c * {g['KH']} + kh) * {g['KW']}"),
                For("kw", "0", str(g["KW"]), (
                    Assign("iw", f"ow0 * {g['SW']} + kw * {g['DW']}"),
                    Assign("k", "kb + kw"),
                ) + body),
            )),
        )),)

    pixel = (Assign("ow", "ow0 + r"), Assign("ok", "ow < OW"))
    tile = (Assign("ow0", f"owt * {mr}"),) + _tile(mr, nr, lambda r: f"xr[iw + {r * g['SW']}]", k_loops, epi, pixel)
    body = (
        Assign("Cg", "C // G"), Assign("OCg", "OC // G"),
        Assign("n_oct", f"(OCg + {nr - 1}) // {nr}"), Assign("n_ob", "(n_oct + OCB - 1) // OCB"),
        Assign("n_owt", f"(OW + {mr - 1}) // {mr}"), Assign("n_hb", "(OH + PB - 1) // PB"),
        Alloc("ct", (str(mr), str(nr))),
        For("it", "t", "N * G * n_ob * n_hb", step="T", body=(
            Assign("hb", "it % n_hb"), Assign("rest", "it // n_hb"),
            Assign("ob", "rest % n_ob"), Assign("rest", "rest // n_ob"),
            Assign("g", "rest % G"), Assign("n", "rest // G"),
            For("oh", "hb * PB", "min(OH, hb * PB + PB)",
                _tile_loops(order, ("owt", "0", "n_owt"), tile)),
        )),
    )
    params = _params(epi, (Param("Xp", "float32[:, :, :, ::1]"),)) + tuple(
        Param(n, "int64") for n in ("N", "C", "OC", "G", "OH", "OW", "OCB", "PB", "t", "T"))
    return Function("conv", params, body)


def _pack_im2col(mr: int, geo: dict) -> Function:
    g = geo
    K = f"Cg * {g['KH'] * g['KW']}"
    body = (
        Assign("n_pt", f"(P + {mr - 1}) // {mr}"),
        For("pt", "t", "n_pt", step="T", body=(
            For("r", "0", str(mr), (
                Assign("p", f"pt * {mr} + r"),
                If("p < P", (
                    Assign("oh", "p // OW"), Assign("ow", "p % OW"),
                    For("c", "0", "Cg", (
                        Assign("ci", "g * Cg + c"),
                        For("kh", "0", str(g["KH"]), (
                            Assign("ih", f"oh * {g['SH']} + kh * {g['DH']}"),
                            Assign("kb", f"(c * {g['KH']} + kh) * {g['KW']}"),
                            For("kw", "0", str(g["KW"]), (
                                Assign("Ap[pt, kb + kw, r]", f"Xp[n, ci, ih, ow * {g['SW']} + kw * {g['DW']}]"),
                            )),
                        )),
                    )),
                ), (For("k", "0", K, (Assign("Ap[pt, k, r]", F0),)),)),
            )),
        )),
    )
    params = (Param("Xp", "float32[:, :, :, ::1]"), Param("Ap", "float32[:, :, ::1]")) + tuple(
        Param(n, "int64") for n in ("n", "g", "Cg", "OW", "P", "t", "T"))
    return Function("pack_a", params, body)


def _gemm(mr: int, nr: int, order: str, epi: Epilogue) -> Function:
    pixel = (Assign("p", f"pt * {mr} + r"), Assign("ok", "p < P"), Assign("oh", "p // OW"), Assign("ow", "p % OW"))
    tile = (Assign("Apt", "Ap[pt]"),) + _tile(mr, nr, lambda r: f"Apt[k, {r}]", k_range("0", "K"), epi, pixel)
    body = (
        Assign("Cg", "C // G"), Assign("OCg", "OC // G"), Assign("K", "Ap.shape[1]"), Assign("P", "OH * OW"),
        Assign("n_oct", f"(OCg + {nr - 1}) // {nr}"), Assign("n_ob", "(n_oct + OCB - 1) // OCB"),
        Assign("n_pt", f"(P + {mr - 1}) // {mr}"), Assign("n_pb", "(n_pt + PB - 1) // PB"),
        Alloc("ct", (str(mr), str(nr))),
        For("it", "t", "n_ob * n_pb", step="T", body=(
            Assign("pb", "it % n_pb"), Assign("ob", "it // n_pb"),
            *_tile_loops(order, ("pt", "pb * PB", "min(n_pt, pb * PB + PB)"), tile),
        )),
    )
    params = _params(epi, (Param("Ap", "float32[:, :, ::1]"),)) + tuple(
        Param(n, "int64") for n in ("n", "g", "C", "OC", "G", "OH", "OW", "OCB", "PB", "t", "T"))
    return Function("gemm", params, body)


register_template(Conv2dTemplate())

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

Kernel size, strides and dilations are code constants; sizes of the tensors are
run-time arguments, so layers of equal geometry share a compile. Block sizes
(output-channel tiles and pixel tiles per work item) and threading are run-time
knobs too.
"""
from __future__ import annotations

import numpy as np

from ir.ops.nn import _concrete_pads
from ir.workload import Workload
from schedules.epilogue import Epilogue, as_kernel_array, parse_epilogue
from schedules.loopnest import Alloc, Assign, Comment, For, Function, If, LoopModule, Param
from schedules.parallel import num_threads, parallel_for
from schedules.registry import register_template
from schedules.space import Config, ConfigSpace, Knob
from schedules.template import LegacyLowered as Lowered, Template

REG_TILES = ("4x16", "8x16", "4x32", "8x32")
F0 = "np.float32(0.0)"


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
        has_bias = len(wl.ops[0]["in"]) == 3
        funcs = (_direct(mr, nr, order, geo, epi),) if algo == "direct" else (_pack_im2col(mr, geo), _gemm(mr, nr, order, epi))
        module = LoopModule(funcs, doc=f"conv2d kernel: {algo} regtile={mr}x{nr} order={order} "
                            f"kernel={geo['KH']}x{geo['KW']} stride={geo['SH']}x{geo['SW']} dilation={geo['DH']}x{geo['DW']}, "
                            f"epilogue {[st[0]['op'] for st in epi.steps]}",
                            meta={"template": f"conv2d v{self.version}"})
        threads = num_threads() if cfg["parallel"] else 1
        OCB, PB = cfg["OCB"], cfg["PB"]
        G, KH, KW = geo["G"], geo["KH"], geo["KW"]
        OC = wl.inputs[1]["shape"][0]
        out_shape = tuple(wl.output_shape)

        def pack_w(W):
            W = np.asarray(W, np.float32)
            ocg = OC // G
            n_oct = -(-ocg // nr)
            k = W.shape[1] * KH * KW
            Wg = np.zeros((G, n_oct * nr, k), np.float32)
            Wg[:, :ocg] = W.reshape(G, ocg, k)
            return np.ascontiguousarray(Wg.reshape(G, n_oct, nr, k).transpose(0, 1, 3, 2))

        def prepare(funcs_, arrays):
            state = {"Wp": pack_w(arrays[1]) if wl.inputs[1]["const"] else None, "xp": {}}
            if has_bias and wl.inputs[2]["const"]:
                state["bias"] = as_kernel_array(arrays[2]).reshape(-1)
            return state

        def padded(state, X, OH, OW, n_owt):
            N, C, H, W = X.shape
            hp = max(H + geo["PT"], (OH - 1) * geo["SH"] + (KH - 1) * geo["DH"] + 1)
            ow_need = n_owt * mr if algo == "direct" else OW
            wp = max(W + geo["PL"], (ow_need - 1) * geo["SW"] + (KW - 1) * geo["DW"] + 1)
            if (hp, wp) == (H, W) and geo["PT"] == geo["PL"] == 0:
                return X
            key = (N, C, hp, wp)
            if key not in state["xp"]:
                state["xp"] = {key: np.zeros(key, np.float32)}
            Xp = state["xp"][key]
            Xp[:, :, geo["PT"]:geo["PT"] + H, geo["PL"]:geo["PL"] + W] = X
            return Xp

        def launch(funcs_, state, arrays, out):
            X = as_kernel_array(arrays[0])
            N, C = X.shape[:2]
            OH, OW = out.shape[2:]
            Wp = state["Wp"] if state["Wp"] is not None else pack_w(arrays[1])
            bias = state.get("bias")
            if bias is None:
                bias = as_kernel_array(arrays[2]).reshape(-1) if has_bias else np.zeros(OC, np.float32)
            extras = []
            for e in epi.extras:
                a = arrays[e.input_index]
                if e.mode == "full":
                    a = np.broadcast_to(a, out.shape)
                extras.append(e.view(a, N * OC, OH * OW))
            Xp = padded(state, X, OH, OW, -(-OW // mr))
            if algo == "direct":
                parallel_for(funcs_["conv"], (Xp, Wp, bias, *extras, out, N, C, OC, G, OH, OW, OCB, PB), threads)
                return
            K = (C // G) * KH * KW
            P = OH * OW
            Ap = np.empty((-(-P // mr), K, mr), np.float32)
            for n in range(N):
                for g in range(G):
                    parallel_for(funcs_["pack_a"], (Xp, Ap, n, g, C // G, OW, P), threads)
                    parallel_for(funcs_["gemm"], (Ap, Wp, bias, *extras, out, n, g, C, OC, G, OH, OW, OCB, PB), threads)

        return Lowered(module, prepare, launch)


def _tile(mr: int, nr: int, a_load, k_loops, epi: Epilogue, pixel) -> tuple:
    """The MR x NR register tile: zero, accumulate over k (k_loops wraps the body), store."""
    acc = [[f"c{r}_{q}" for q in range(nr)] for r in range(mr)]
    body = tuple(Assign(f"a{r}", a_load(r)) for r in range(mr)) \
        + tuple(Assign(f"b{q}", f"Wk[k, {q}]") for q in range(nr)) \
        + tuple(Assign(acc[r][q], f"a{r} * b{q}", "+") for r in range(mr) for q in range(nr))
    assigns, result = epi.emit("v", "n * OC + oc", "oh * OW + ow", "e", c="oc")
    store = pixel + (
        If("ok", (
            For("q", "0", f"min({nr}, OCg - oct * {nr})", (
                Assign("oc", f"g * OCg + oct * {nr} + q"),
                Assign("v", "ct[r, q] + bias[oc]"),
            ) + tuple(Assign(n, e) for n, e in assigns) + (Assign("out[n, oc, oh, ow]", result),)),
        )),
    )
    return (Assign("Wk", "Wp[g, oct]"),) + tuple(Assign(acc[r][q], F0) for r in range(mr) for q in range(nr)) + (
        Comment(f"{mr}x{nr} register tile (pixels x output channels), SLP-vectorized along channels"),
    ) + k_loops(body) + tuple(Assign(f"ct[{r}, {q}]", acc[r][q]) for r in range(mr) for q in range(nr)) + (
        For("r", "0", str(mr), store),
    )


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
    def k_loops(body):
        return (For("k", "0", "K", body),)

    pixel = (Assign("p", f"pt * {mr} + r"), Assign("ok", "p < P"), Assign("oh", "p // OW"), Assign("ow", "p % OW"))
    tile = (Assign("Apt", "Ap[pt]"),) + _tile(mr, nr, lambda r: f"Apt[k, {r}]", k_loops, epi, pixel)
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

"""Depthwise conv layers of the MobileNetV2/V3-style models: the depthwise code shapes side by
side with onnxruntime, 1 thread, CPU time of the calling thread, interleaved rounds, medians.

    python experiments/bench_depthwise.py [--rounds 5] [--only SUBSTR] [--tiles 2x16,4x8]
        [--vec-tiles 4x16,2x32] [--blocked-tiles 8x8,14x16] [--plane-tiles 4x16,4x32] [--nets V2@224]

Per layer: `dw_blocked` (channel blocks, vectors along channels) for each blocked tile given
(pixels x channels of a block), `depthwise` (NCHW as it is, vectors along a row's pixels) for
each tile given (`--tiles`: its SLP code; `--vec-tiles`: its vector-IR code, `row_taps`),
`dw_plane` (`--plane-tiles`: `plane_taps`, the plane read in place), the
template's default, and onnxruntime's
Conv + Relu alone (which runs its NCHWc kernel between a reorder of the input and of the output:
inside a model those reorders are shared by neighbouring convs, so its in-model time is lower).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]

import numpy as np  # noqa: E402

from bench_conv import interleaved, ort_session  # noqa: E402
from codegen import compile_kernel  # noqa: E402
from codegen.backend import get_backend  # noqa: E402
from ir.settings import Settings, use  # noqa: E402
from schedules import get_template  # noqa: E402
from schedules.microkernel import tile_codes  # noqa: E402
from tests.template_cases import conv_wl, precompile  # noqa: E402

# (net, channels, input size, kernel, stride): MobileNetV2-style at 96x96 (experiments/models/make_mobilenet.py),
# MobileNetV3-style at 32x32 (tests/real_models/mobilenetv3_torchscript.onnx)
LAYERS = [("V2@96", 32, 48, 3, 1), ("V2@96", 96, 48, 3, 2), ("V2@96", 144, 24, 3, 1), ("V2@96", 144, 24, 3, 2),
          ("V2@96", 192, 12, 3, 1), ("V2@224", 144, 56, 3, 1), ("V2@224", 576, 14, 3, 1), ("V2@224", 960, 7, 3, 1),
          ("V3@32", 16, 16, 3, 1), ("V3@32", 72, 16, 3, 2), ("V3@32", 96, 8, 5, 1), ("V3@224", 72, 56, 5, 2),
          ("V3@224", 672, 14, 5, 2), ("V3@224", 960, 7, 5, 1)]
# every distinct depthwise layer of MobileNetV2 at 224x224 (channels, input size, kernel, stride)
V2_224 = [("V2@224", c, h, 3, s) for c, h, s in ((32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2),
                                                  (192, 28, 1), (192, 28, 2), (384, 14, 1), (576, 14, 1),
                                                  (576, 14, 2), (960, 7, 1))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--tiles", default="2x16,4x8,4x16")
    ap.add_argument("--vec-tiles", default="4x16,2x32")
    ap.add_argument("--blocked-tiles", default="8x8")
    ap.add_argument("--plane-tiles", default="4x16,4x32")
    ap.add_argument("--nets", default="", help="comma-separated nets (V2@96, V2@224, V3@32, V3@224); "
                    "V2@224 means every MobileNetV2 depthwise layer")
    args = ap.parse_args(argv)
    settings = Settings.from_env().with_(threads=1)
    use(settings)
    conv, backend = get_template("conv2d"), get_backend(None, settings)
    nets = [n for n in args.nets.split(",") if n]
    pool = list(dict.fromkeys(LAYERS + V2_224)) if nets else LAYERS
    layers = [lay for lay in pool if args.only in f"{lay[0]} {lay[1]}@{lay[2]}/{lay[4]}" and (not nets or lay[0] in nets)]
    wls = [conv_wl(1, c, h, h, c, k=k, s=s, p=k // 2, g=c, epi=("relu",)) for _, c, h, k, s in layers]
    btiles = [t for t in args.blocked_tiles.split(",") if t]
    vtiles = [t for t in args.vec_tiles.split(",") if t]
    ptiles = [t for t in args.plane_tiles.split(",") if t]
    names = [f"dw_blocked {t}" for t in btiles] + [f"depthwise {t}" for t in args.tiles.split(",") if t] \
        + [f"depthwise vec {t}" for t in vtiles] + [f"dw_plane {t}" for t in ptiles]
    vec = tile_codes()[1]

    def configs(wl):
        base = conv.default_config(wl).to_json()
        out = {"default": conv.default_config(wl)}
        for t in btiles:
            out[f"dw_blocked {t}"] = conv.space(wl).validate({**base, "algo": "dw_blocked", "regtile": t, "PB": 16,
                                                                "tile_code": "slp"})
        for t in [t for t in args.tiles.split(",") if t]:
            out[f"depthwise {t}"] = conv.space(wl).validate({**base, "algo": "depthwise", "regtile": t, "PB": 1,
                                                              "tile_code": "slp"})
        for t in vtiles:
            out[f"depthwise vec {t}"] = conv.space(wl).validate({**base, "algo": "depthwise", "regtile": t, "PB": 1,
                                                                  "tile_code": vec})
        for t in ptiles:
            if "dw_plane" in conv.space(wl)._by_name["algo"].options:
                out[f"dw_plane {t}"] = conv.space(wl).validate({**base, "algo": "dw_plane", "regtile": t,
                                                                     "PB": 1, "tile_code": vec})
        return out
    cfgs = [configs(wl) for wl in wls]
    precompile("conv2d", [(wl, c) for wl, cs in zip(wls, cfgs) for c in cs.values()])
    head = ["layer"] + [f"{n} ms" for n in names + ["default"]] + ["ORT ms"] + [f"ORT / {n}" for n in names + ["default"]]
    print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head), flush=True)
    for (net, c, h, k, s), wl, cs in zip(layers, wls, cfgs):
        arrays = wl.random_inputs(0)
        y = np.empty(wl.output_shape, np.float32)
        ref = wl.reference(arrays)
        fns = {}
        for name, cfg in cs.items():
            run = compile_kernel(conv, wl, cfg).bind([None, arrays[1], arrays[2]], backend)
            run(arrays, y)
            np.testing.assert_allclose(y, ref, rtol=1e-3, atol=1e-3)
            fns[name] = (lambda run: lambda: run(arrays, y))(run)
        sess = ort_session(c, h, c, k, s, k // 2, c, arrays[1], arrays[2], 1)
        fns["ORT"] = lambda: sess.run(None, {"x": arrays[0]})
        med = {name: statistics.median(v) * 1e3 for name, v in interleaved(fns, args.rounds).items()}
        cols = [f"{net} dw {c} {k}x{k}/{s} @{h}"] + [f"{med[n]:.3f}" if n in med else "-" for n in names + ["default"]] \
            + [f"{med['ORT']:.3f}"] + [f"{med['ORT'] / med[n]:.2f}x" if n in med else "-" for n in names + ["default"]]
        print("| " + " | ".join(cols) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Before/after of the conv2d defaults' tiles per vector shape (schedules/templates/conv2d.py
BLOCKED_TILE, PX_TILES, GEMM_1X1_PIXELS_BY_SHAPE): per non-depthwise ResNet-18 / MobileNetV2 layer, the default config with
AVX2's (8, 16) tiles (what every machine ran before) vs the default for this machine's vector shape
vs onnxruntime, interleaved rounds, 1 thread, CPU time of the calling thread, medians.

`--before KNOB=VALUE,...`: *before* is the default config with these knobs instead (e.g. the
im2col config that 1x1 stride-2 convs ran by default until conv2d v6:
`--only 1x1/2 --before algo=im2col,order=oc_px,OCB=1`).

Run: python experiments/bench_conv_shape.py [--rounds 5] [--only SUBSTR,...] [--threads 1] [--before ...]"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from codegen.backend import get_backend  # noqa: E402
from experiments.bench_conv import LAYERS, _short, before_after_times, clock_for  # noqa: E402
from ir.settings import Settings, use  # noqa: E402
from schedules import get_template  # noqa: E402
from schedules.microkernel import tile_codes, vector_shape  # noqa: E402
from tests.template_cases import conv_wl, precompile  # noqa: E402


def before(conv, wl):
    """What the defaults ran here before they followed the vector shape: the config for AVX2's
    (8 lanes, 16 registers), its blocked tile as this machine's vector-IR code."""
    cfg = conv.default_config(wl, {"vector_bits": 256, "vector_registers": 16}).to_json()
    if cfg.get("tile_code", "slp") != "slp":
        cfg["tile_code"] = tile_codes()[1]
    return conv.space(wl).validate(cfg)


def overridden(conv, wl, knobs: str):
    """The default config of `wl` with `knobs` ("name=value,...": ints as ints) over it."""
    values = dict(kv.split("=", 1) for kv in knobs.split(","))
    return conv.space(wl).validate({**conv.default_config(wl).to_json(),
                                    **{k: int(v) if v.isdigit() else v for k, v in values.items()}})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--before", default="", help="KNOB=VALUE,...: before = the default with these knobs")
    args = ap.parse_args()
    use(Settings.from_env())
    conv = get_template("conv2d")
    backend = get_backend(None, Settings.from_env().with_(threads=args.threads))
    layers = []
    for net, c, h, oc, k, s, p, g in LAYERS:
        label = f"{c}->{oc} {k}x{k}/{s} @{h}"
        if g == 1 and net != "MobileNetV3" and (not args.only or any(o in label for o in args.only.split(","))):
            wl = conv_wl(1, c, h, h, oc, k=k, s=s, p=p, epi=("relu",))
            old = overridden(conv, wl, args.before) if args.before else before(conv, wl)
            layers.append((net, label, (c, h, oc, k, s, p), wl, old, conv.default_config(wl)))
    precompile("conv2d", [(wl, cfg) for *_, wl, b, a in layers for cfg in (b, a)])
    print(f"vector shape {vector_shape()}, {args.threads} thread(s), load {os.getloadavg()[0]:.1f}", flush=True)
    print("| layer | net | before ms | after ms | ORT ms | before vs ORT | after vs ORT | after / before | before | after |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |", flush=True)
    clock = clock_for(args.threads)
    for net, label, (c, h, oc, k, s, p), wl, b, a in layers:
        times = before_after_times(conv, wl, b, a, backend, (c, h, oc, k, s, p, 1), args.threads, args.rounds, clock)
        m = {n: statistics.median(v) for n, v in times.items()}
        print(f"| {label} | {net} | {m['before'] * 1e3:.3f} | {m['after'] * 1e3:.3f} | {m['ort'] * 1e3:.3f} | "
              f"{m['ort'] / m['before']:.2f}x | {m['ort'] / m['after']:.2f}x | {m['before'] / m['after']:.2f}x | "
              f"{_short(b)} | {_short(a)} |", flush=True)


if __name__ == "__main__":
    main()

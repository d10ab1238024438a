"""Every distinct ResNet-18 conv, the distinct MobileNetV2 convs and MobileNetV3's other kinds
(batch 1, 224x224, + bias + Relu) with the conv2d template vs onnxruntime, in the same process, at 1 and 2 threads.

Per layer and thread count: the default config (what an untuned model runs) and the best of a
fixed candidate list (no tuner; the same list for every layer of a kind, <= 64 configs, the
default among them: see `candidates`). The sweep times each candidate briefly; then the best,
the default and onnxruntime are timed again in interleaved rounds, and the ratios come from
that (fastest batches, and medians beside them: see the results file for why). A few code shapes per kernel geometry are compiled in parallel first.

Run: python experiments/bench_conv.py [--quick] [--only SUBSTR] [--threads 1,2]
(writes experiments/bench_conv.md and .png)
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.pop("OPENBLAS_CORETYPE", None)   # this process only: compare against an untuned NumPy/ORT
os.environ.pop("OPENBLAS_L2_SIZE", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from codegen import compile_kernel  # noqa: E402
from codegen.backend import get_backend  # noqa: E402
from codegen.source import render  # noqa: E402
from schedules import get_template  # noqa: E402
from schedules.microkernel import tile_codes  # noqa: E402
from ir.settings import Settings, use  # noqa: E402
from tests.template_cases import conv_wl, precompile  # noqa: E402
from tuner.verify import settle  # noqa: E402

# (net, C, H, OC, kernel, stride, pad, groups)
RESNET18 = [(3, 224, 64, 7, 2, 3), (64, 56, 64, 3, 1, 1), (64, 56, 128, 3, 2, 1), (64, 56, 128, 1, 2, 0),
            (128, 28, 128, 3, 1, 1), (128, 28, 256, 3, 2, 1), (128, 28, 256, 1, 2, 0), (256, 14, 256, 3, 1, 1),
            (256, 14, 512, 3, 2, 1), (256, 14, 512, 1, 2, 0), (512, 7, 512, 3, 1, 1)]
# MobileNetV2 at 224: the stem, every depthwise stride/size seen, and the 1x1 expand/project convs
MOBILENETV2 = [(3, 224, 32, 3, 2, 1, 1),
               (32, 112, 32, 3, 1, 1, 32), (96, 112, 96, 3, 2, 1, 96), (144, 56, 144, 3, 1, 1, 144),
               (144, 56, 144, 3, 2, 1, 144), (192, 28, 192, 3, 1, 1, 192), (192, 28, 192, 3, 2, 1, 192),
               (384, 14, 384, 3, 1, 1, 384), (576, 14, 576, 3, 1, 1, 576), (576, 14, 576, 3, 2, 1, 576),
               (960, 7, 960, 3, 1, 1, 960),
               (32, 112, 16, 1, 1, 0, 1), (16, 112, 96, 1, 1, 0, 1), (24, 56, 144, 1, 1, 0, 1), (144, 56, 24, 1, 1, 0, 1),
               (32, 28, 192, 1, 1, 0, 1), (192, 28, 32, 1, 1, 0, 1), (64, 14, 384, 1, 1, 0, 1), (384, 14, 64, 1, 1, 0, 1),
               (576, 7, 160, 1, 1, 0, 1), (160, 7, 960, 1, 1, 0, 1), (960, 7, 320, 1, 1, 0, 1), (320, 7, 1280, 1, 1, 0, 1)]
# MobileNetV3-Large at 224: what V2 lacks, 5x5 depthwise convs (stride 1 and 2, down to 7x7 maps) and
# the squeeze-excite 1x1 convs on 1x1 maps
MOBILENETV3 = [(72, 56, 72, 5, 2, 2, 72), (120, 28, 120, 5, 1, 2, 120), (672, 14, 672, 5, 2, 2, 672),
               (960, 7, 960, 5, 1, 2, 960), (960, 1, 240, 1, 1, 0, 1), (240, 1, 960, 1, 1, 0, 1)]
LAYERS = [("ResNet-18", *r, 1) for r in RESNET18] + [("MobileNetV2", *r) for r in MOBILENETV2] \
    + [("MobileNetV3", *r) for r in MOBILENETV3]

# the candidate list: code shapes x run-time blocks (+ the default config)
CODE = [dict(algo="direct", vec="px", regtile="4x16"), dict(algo="direct", vec="px", regtile="6x16"),
        dict(algo="im2col", vec="px", regtile="4x16"), dict(algo="im2col", vec="px", regtile="6x16"),
        dict(algo="direct", vec="oc", regtile="4x16"),
        dict(algo="blocked", vec="oc", regtile="6x16"), dict(algo="blocked", vec="oc", regtile="4x24"),
        dict(algo="blocked", vec="oc", regtile="4x16"), dict(algo="blocked", vec="oc", regtile="6x16", order="px_oc"),
        dict(algo="blocked", vec="oc", regtile="6x16", tile_code=tile_codes()[1])]
DW_CODE = [dict(algo="dw_blocked", regtile=t) for t in ("4x8", "8x8")] \
    + [dict(algo="depthwise", regtile=t, PB=1) for t in ("4x8", "2x16", "4x16", "2x32")]
RUNTIME = [dict(OCB=o, PB=p) for o in (1, 4) for p in (1, 4)]
DW_RUNTIME = [dict(parallel=True), dict(parallel=False), dict(parallel=True, PB=4), dict(parallel=False, PB=4)]


def candidates(conv, wl, quick=False) -> list:
    """The configs swept for `wl`: the default first, then code shapes x blocks (parallel on)."""
    space, default = conv.space(wl), conv.default_config(wl)
    dw = "depthwise" in space.knobs[0].options
    code, rt = (DW_CODE, DW_RUNTIME) if dw else (CODE, RUNTIME)
    if quick:
        code, rt = code[:2], rt[:2]
    out = [default]
    for c in code:
        for r in rt:
            cfg = space.validate({**default.to_json(), "order": "oc_px", "parallel": True, "tile_code": "slp", "KC": 0,
                                  **c, **r} if not dw
                                 else {**default.to_json(), **r, **c})
            if cfg not in out:
                out.append(cfg)
    assert len(out) <= 64
    return out


def timeit(fn, min_time=0.01, repeat=5, clock=time.perf_counter) -> list:
    """Times per call of `repeat` batches, each batch long enough (>= min_time / repeat) to time,
    once the process's other threads are idle (`tuner.verify.settle`: onnxruntime's and
    OpenBLAS's pools spin after a call and would take a core from the next runtime timed)."""
    settle()
    fn()
    n = 1
    while True:
        t0 = clock()
        for _ in range(n):
            fn()
        if clock() - t0 >= min_time / repeat or n >= 1000:
            break
        n *= 2
    times = []
    for _ in range(repeat):
        t0 = clock()
        for _ in range(n):
            fn()
        times.append((clock() - t0) / n)
    return times


def interleaved(fns: dict, rounds: int, clock=time.thread_time) -> dict:
    """{name: seconds per call of each batch}: `fns` timed in `rounds` interleaved rounds of 3
    batches each (`timeit`), so a change of the machine's load hits them all alike."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name] += timeit(fn, repeat=3, clock=clock)
    return times


def clock_for(threads: int):
    """One thread: the calling thread's CPU time (both our kernel and onnxruntime with
    intra_op_num_threads=1 run on the calling thread), which leaves out the time other processes
    preempt it for; more threads: wall time."""
    return time.thread_time if threads == 1 else time.perf_counter


def layer_label(c, h, oc, k, s, g) -> str:
    """A layer's name in the tables and in --only: "64->128 3x3/2 @56", "dw 96->96 3x3/2 @112"."""
    return f"{'dw ' if g > 1 else ''}{c}->{oc} {k}x{k}/{s} @{h}"


def layer_proto(c, h, oc, k, s, p, g, w, b):
    """The layer as an ONNX model: Conv (weights `w`, bias `b`) + Relu on a 1 x c x h x h input."""
    from onnx import TensorProto, helper, numpy_helper
    o = (h + 2 * p - k) // s + 1
    gr = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y0"], strides=[s, s], pads=[p] * 4, group=g),
                            helper.make_node("Relu", ["y0"], ["y"])], "conv",
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, oc, o, o])],
                           [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])


def ort_session(c, h, oc, k, s, p, g, w, b, threads):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    return ort.InferenceSession(layer_proto(c, h, oc, k, s, p, g, w, b).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def machine() -> str:
    import numba
    import onnxruntime
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), platform.processor())
    flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "")
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return (f"{cpu} ({isa}), {len(os.sched_getaffinity(0))} cores usable; Python {platform.python_version()}, "
            f"numba {numba.__version__}, onnxruntime {onnxruntime.__version__}. "
            f"The 2 cores were shared with 4 other helpers' work (tests, compiles, benchmarks; load average "
            f"{os.getloadavg()[0]:.1f} when this was written): ratios, measured side by side, are more reliable "
            f"than absolute numbers.")


def plot(rows, threads_list, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = list(dict.fromkeys(r["layer"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(10, len(labels) * 0.38), 4.5))
    width = 0.8 / (2 * len(threads_list))
    for i, th in enumerate(threads_list):
        for j, (key, name) in enumerate((("best", "best of list"), ("default", "default config"))):
            vals = {r["layer"]: r[key] for r in rows if r["threads"] == th}
            off = (2 * i + j - len(threads_list) + 0.5) * width
            ax.bar([x + off for x in range(len(labels))], [vals.get(lb, 0) for lb in labels], width,
                   label=f"{name}, {th} thread{'s' if th > 1 else ''}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=60, ha="right")
    ax.set_ylabel("speed vs onnxruntime (higher is better)")
    ax.set_title("conv2d template vs onnxruntime, ResNet-18 and MobileNetV2/V3 convs, batch 1")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2 code shapes x 2 blocks per layer")
    ap.add_argument("--only", default="", help="only layers whose label contains one of these (comma-separated)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds of best/default/ORT")
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    ap.add_argument("--from-logs", default="", help="comma-separated stdout logs of earlier (interrupted) runs: "
                    "write the tables from the rows they printed, measure nothing")
    ap.add_argument("--depthwise-before-after", default="", metavar="OUT.md",
                    help="only the depthwise layers: the `depthwise` algorithm's tile heuristic (the default "
                    "before dw_blocked) vs the default config vs ORT, interleaved, 1 thread; write OUT.md")
    ap.add_argument("--tile-code-before-after", default="", metavar="OUT.md",
                    help="ResNet-18's convs (default its stride-1 3x3 ones; --only picks): the blocked kernel's "
                    "tile variants (--tile-variants) vs ORT, interleaved, 1 thread, and compile CPU s per code shape; write OUT.md")
    ap.add_argument("--tile-variants", default="", metavar="CODE:MRxNR,...",
                    help="with --tile-code-before-after: the blocked tiles compared, code slp or vec "
                    "(this machine's vec<lanes>), optionally :order:OCB:PB:KC (else the default config's); "
                    "default slp:6x16,vec:6x16,vec:4x24")
    args = ap.parse_args()
    if args.tile_code_before_after:
        tile_code_before_after(Path(args.tile_code_before_after), args.rounds, args.only, args.tile_variants)
        return
    if args.depthwise_before_after:
        depthwise_before_after(Path(args.depthwise_before_after), args.rounds)
        return
    if args.from_logs:
        rows = _rows_from_logs(args.from_logs.split(","))
        write(rows, sorted({r["threads"] for r in rows}), args, 0.0)
        return
    base = Settings.from_env()
    use(base)
    conv = get_template("conv2d")
    threads_list = [int(t) for t in args.threads.split(",")]
    layers = []
    for net, c, h, oc, k, s, p, g in LAYERS:
        label = layer_label(c, h, oc, k, s, g)
        if not args.only or any(o in label or o == net for o in args.only.split(",")):
            layers.append((net, label, (c, h, oc, k, s, p, g),
                           conv_wl(1, c, h, h, oc, k=k, s=s, p=p, g=g, epi=("relu",))))
    cands = {label: candidates(conv, wl, args.quick) for _, label, _, wl in layers}
    t0 = time.time()
    pairs, seen = [], set()
    for _, label, _, wl in layers:
        for cfg in cands[label]:
            key = render(conv.lower(wl, cfg).module)   # layers of equal geometry share the code
            if key not in seen:
                seen.add(key)
                pairs.append((wl, cfg))
    precompile("conv2d", pairs)
    print(f"compiled {len(pairs)} in {time.time() - t0:.0f} s", flush=True)
    rows = []
    for net, label, (c, h, oc, k, s, p, g), wl in layers:
        arrays = wl.random_inputs(0)
        out = np.empty(wl.output_shape, np.float32)
        expect = wl.reference(arrays)
        for th in threads_list:
            backend = get_backend(None, base.with_(threads=th))
            runs = {}
            for cfg in cands[label]:
                run = compile_kernel(conv, wl, cfg).bind([None, arrays[1], arrays[2]], backend)
                run(arrays, out)
                np.testing.assert_allclose(out, expect, rtol=1e-3, atol=1e-3)
                runs[cfg] = (min(timeit(lambda: run(arrays, out), clock=clock_for(th))), run)
            best = min(runs, key=lambda cf: runs[cf][0])
            default = cands[label][0]
            sess = ort_session(c, h, oc, k, s, p, g, arrays[1], arrays[2], th)
            fns = {"best": runs[best][1], "default": runs[default][1],
                   "ort": lambda: sess.run(None, {"x": arrays[0]})}
            times = {name: [] for name in fns}
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    times[name] += timeit(fn if name == "ort" else (lambda f=fn: f(arrays, out)), repeat=3,
                                          clock=clock_for(th))
            med = {name: min(v) for name, v in times.items()}
            mid = {name: statistics.median(v) for name, v in times.items()}
            gf = wl.flops() / 1e9
            rows.append(dict(net=net, layer=label, threads=th, mflop=gf * 1e3, ours=med["best"] * 1e3,
                             gflops=gf / med["best"], ort=med["ort"] * 1e3, ort_gflops=gf / med["ort"],
                             best=med["ort"] / med["best"], default=med["ort"] / med["default"],
                             best_med=mid["ort"] / mid["best"], default_med=mid["ort"] / mid["default"],
                             n=len(cands[label]), cfg=_short(best), dcfg=_short(default)))
            print({k_: (round(v, 3) if isinstance(v, float) else v) for k_, v in rows[-1].items()}, flush=True)
        write(rows, threads_list, args, time.time() - t0, quiet=True)   # partial results survive an interrupted run
    write(rows, threads_list, args, time.time() - t0)


def _plane_default(wl, par: bool):
    """The `depthwise` (vectors along a plane's pixels) config the template defaulted to before
    `dw_blocked`: kept to compare against."""
    ow, sw = int(wl.output_shape[3]), int(wl.nodes()[0].attrs["strides"][1])
    tile = "4x8" if ow <= 8 else "4x16" if ow <= 16 else "2x32" if sw > 1 and ow >= 32 else "2x16"
    return {"algo": "depthwise", "regtile": tile, "parallel": par, "PB": 1}


def before_after_times(conv, wl, old, new, backend, geometry: tuple, threads: int, rounds: int, clock) -> dict:
    """{"before", "after", "ort": seconds of each batch}: the two configs of `wl` (each checked
    against the reference) and onnxruntime on the conv `geometry` (c, h, oc, k, s, p, g), timed
    in `rounds` interleaved rounds of 3 batches."""
    c, h, oc, k, s, p, g = geometry
    arrays = wl.random_inputs(0)
    y = np.empty(wl.output_shape, np.float32)
    runs = {}
    for name, cfg in (("before", old), ("after", new)):
        runs[name] = compile_kernel(conv, wl, cfg).bind([None, arrays[1], arrays[2]], backend)
        runs[name](arrays, y)
        np.testing.assert_allclose(y, wl.reference(arrays), rtol=1e-3, atol=1e-3)
    sess = ort_session(c, h, oc, k, s, p, g, arrays[1], arrays[2], threads)
    fns = {"before": lambda: runs["before"](arrays, y), "after": lambda: runs["after"](arrays, y),
           "ort": lambda: sess.run(None, {"x": arrays[0]})}
    return interleaved(fns, rounds, clock)


def depthwise_before_after(out: Path, rounds: int):
    """Per depthwise layer, 1 thread (CPU time of the calling thread): the old default, the
    default, onnxruntime, timed in `rounds` interleaved rounds; medians and fastest batches."""
    use(Settings.from_env())
    conv = get_template("conv2d")
    backend = get_backend(None, Settings.from_env().with_(threads=1))
    layers = [(net, c, h, oc, k, s, p, g) for net, c, h, oc, k, s, p, g in LAYERS if g > 1]
    wls = [conv_wl(1, c, h, h, oc, k=k, s=s, p=p, g=g, epi=("relu",)) for _, c, h, oc, k, s, p, g in layers]
    cfgs = [(conv.space(wl).validate(_plane_default(wl, conv.default_config(wl)["parallel"])), conv.default_config(wl))
            for wl in wls]
    precompile("conv2d", [(wl, c) for wl, pair in zip(wls, cfgs) for c in pair])
    lines = ["| layer | net | before: depthwise ms | after: default ms | ORT ms | before vs ORT | after vs ORT "
             "| after / before | fastest: before, after vs ORT | before config | after config |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for (net, c, h, oc, k, s, p, g), wl, (old, new) in zip(layers, wls, cfgs):
        times = before_after_times(conv, wl, old, new, backend, (c, h, oc, k, s, p, g), 1, rounds, time.thread_time)
        med = {name: statistics.median(v) for name, v in times.items()}
        low = {name: min(v) for name, v in times.items()}
        label = layer_label(c, h, oc, k, s, g)
        lines.append(f"| {label} | {net} | {med['before'] * 1e3:.3f} | {med['after'] * 1e3:.3f} | {med['ort'] * 1e3:.3f} "
                     f"| {med['ort'] / med['before']:.2f}x | {med['ort'] / med['after']:.2f}x "
                     f"| {med['before'] / med['after']:.2f}x | {low['ort'] / low['before']:.2f}x, {low['ort'] / low['after']:.2f}x "
                     f"| {_short(old)} | {_short(new)} |")
        print(lines[-1], flush=True)
    out.write_text("\n".join(lines) + "\n")


def tile_code_before_after(out: Path, rounds: int, only: str = "", variants: str = ""):
    """ResNet-18's convs (`only`: labels as --only; default the stride-1 3x3 ones), 1 thread
    (the calling thread's CPU time): the blocked kernel's tile variants (`variants`: comma-separated
    "code:MRxNR[:order:OCB:PB:KC]", code "slp" or "vec" for this machine's vec<lanes>, run-time
    knobs the default config's unless given; default slp 6x16, vec 6x16, vec 4x24) vs onnxruntime, in `rounds` interleaved rounds, medians, ratios to the first variant;
    and the CPU seconds each code shape takes to compile in this process (numba's typing +
    LLVM; run with a fresh TENSORTUNE_CACHE, else they read the cache)."""
    use(Settings.from_env())
    conv = get_template("conv2d")
    backend = get_backend(None, Settings.from_env().with_(threads=1))
    vec = tile_codes()[1]

    def variant(spec: str):
        code, tile, *rt = spec.split(":")
        code = vec if code == "vec" else code
        knobs = dict(zip(("order", "OCB", "PB", "KC"), rt))
        knobs.update({k: int(v) for k, v in knobs.items() if k != "order"})
        return (f"{code} {tile}" + (f" {'/'.join(rt)}" if rt else ""),
                dict(algo="blocked", vec="oc", regtile=tile, tile_code=code, **knobs))

    variants = tuple(variant(v) for v in (variants or "slp:6x16,vec:6x16,vec:4x24").split(","))
    label = lambda r: f"{r[0]}->{r[2]} {r[3]}x{r[3]}/{r[4]} @{r[1]}"   # noqa: E731
    layers = [r for r in RESNET18 if any(o in label(r) for o in only.split(","))] if only else \
        [r for r in RESNET18 if r[3] == 3 and r[4] == 1]
    compile_s = {}   # (variant, code shape) -> CPU s of its first build
    first = variants[0][0]
    lines = ["| layer | " + " | ".join(f"{n} ms" for n, _ in variants) + " | ORT ms | "
             + " | ".join(f"{n} vs ORT" for n, _ in variants) + " | " + " | ".join(f"{n} / {first}" for n, _ in variants[1:])
             + " |", "| --- |" + " ---: |" * (3 * len(variants))]
    for c, h, oc, k, s, p in layers:
        wl = conv_wl(1, c, h, h, oc, k=k, s=s, p=p, epi=("relu",))
        arrays = wl.random_inputs(0)
        y = np.empty(wl.output_shape, np.float32)
        runs = {}
        for name, code in variants:
            cfg = conv.space(wl).validate({**conv.default_config(wl).to_json(), "parallel": False, **code})
            t0 = time.process_time()
            runs[name] = compile_kernel(conv, wl, cfg).bind([None, arrays[1], arrays[2]], backend)
            runs[name](arrays, y)
            compile_s.setdefault((name, k, s), time.process_time() - t0)   # layers of one geometry share code
            np.testing.assert_allclose(y, wl.reference(arrays), rtol=1e-3, atol=1e-3)
        sess = ort_session(c, h, oc, k, s, p, 1, arrays[1], arrays[2], 1)
        fns = {**{n: (lambda r=runs[n]: r(arrays, y)) for n, _ in variants}, "ort": lambda: sess.run(None, {"x": arrays[0]})}
        times = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                times[name] += timeit(fn, repeat=3, clock=time.thread_time)
        med = {name: statistics.median(v) for name, v in times.items()}
        names = [n for n, _ in variants]
        lines.append(f"| {label((c, h, oc, k, s, p))} | " + " | ".join(f"{med[n] * 1e3:.3f}" for n in names)
                     + f" | {med['ort'] * 1e3:.3f} | " + " | ".join(f"{med['ort'] / med[n]:.2f}x" for n in names)
                     + " | " + " | ".join(f"{med[names[0]] / med[n]:.2f}x" for n in names[1:]) + " |")
        print(lines[-1], flush=True)
    lines.append("")
    lines.append("compile CPU s per code shape (first build, in-process; per variant, each kernel geometry): " + "; ".join(
        f"{n} " + ", ".join(f"{k}x{k}/{s} {t:.1f}" for (v, k, s), t in compile_s.items() if v == n) for n, _ in variants))
    print(lines[-1], flush=True)
    out.write_text("\n".join(lines) + "\n")


def _rows_from_logs(paths) -> list:
    """The result rows runs printed (one dict per line), in the order of LAYERS; a layer and
    thread count measured twice keeps the later run's row."""
    import ast
    rows = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.startswith("{'net'"):
                r = ast.literal_eval(line)
                rows[(r["layer"], r["threads"])] = r
    order = {layer_label(c, h, oc, k, s, g): i for i, (_, c, h, oc, k, s, p, g) in enumerate(LAYERS)}
    return sorted(rows.values(), key=lambda r: (order[r["layer"]], r["threads"]))


def _short(cfg) -> str:
    j = cfg.to_json()
    if j["algo"] == "depthwise":
        return f"dw {j['regtile']}{'' if j['parallel'] else ' serial'}"
    if j["algo"] == "dw_blocked":
        return f"dwb {j['regtile']} PB{j['PB']}{'' if j['parallel'] else ' serial'}"
    order = " px_oc" if j["order"] == "px_oc" else ""
    return f"{j['algo']} {j['vec']} {j['regtile']}{order} OCB={j['OCB']} PB={j['PB']}{'' if j['parallel'] else ' serial'}"


def write(rows, threads_list, args, wall, quiet=False):
    lines = ["# conv2d template vs onnxruntime: ResNet-18 and MobileNetV2/V3 convs, batch 1", "", machine(), "",
             "Each row: Conv + bias + Relu (MobileNetV2's Relu6/none epilogues are replaced by Relu: one "
             "epilogue for all), batch 1, 224x224 network input. *best* = the fastest of a fixed candidate "
             "list (no tuner: the default config plus 9 code shapes (direct/im2col with vectors along "
             "pixels, direct with vectors along channels, and 4 of the blocked NCHWc kernel) x 4 run-time "
             "block settings (OCB, PB in {1, 4}) for convs, 2 dw_blocked tiles x parallel on/off x PB in {1, 4} and 4 depthwise (plane) tiles x parallel on/off for depthwise; at most "
             "37 configs, so within the 64-trial budget); *default* = the template's default config, what an untuned model runs. Speed = "
             "ORT time / our time, in the same process, onnxruntime with intra_op_num_threads = our threads; "
             "the sweep keeps each candidate's fastest of 5 batches, then best, default and ORT are timed in "
             f"{args.rounds} interleaved rounds of 3 batches each. With 5 helpers' work on these 2 cores, batches are often preempted, so a median measures the scheduler as much as "
             "the kernel; the speed columns therefore compare the *fastest* batch of each (the least "
             "disturbed), and the ratios of medians are given beside them. At 1 thread the clock is the calling "
             "thread's CPU time (both kernels run on that thread), which leaves preemption out; at 2 threads it "
             "is wall time, and those figures suffer most (a kernel waits for its slowest thread).", "",
             "Kernels (schedules/templates/conv2d.py, conv2d_blocked.py): *blocked* is the NCHWc-style direct "
             "conv: the pad step repacks the input into 8-channel blocks (zero-bordered, phase-split for "
             "strides), weights are packed at prepare in (block, kh, kw, channel) order, and an MR pixels x NR "
             "output channels register tile (6x16: 12 ymm accumulators) runs over pixels of the flattened "
             "plane with the 8 channels of a block innermost (per channel: MR broadcasts, NR/8 weight "
             "vectors, MR*NR/8 FMAs). *direct px* / *im2col px*: MR output channels x NR pixels, vectors "
             "along pixels (a 1x1 stride-1 direct conv runs on the plane cut into rows its tiles fill: a "
             "GEMM over the plane without packing). *direct oc*: vectors along channels on NCHW rows.", ""]
    for th in threads_list:
        sub = [r for r in rows if r["threads"] == th]
        if not sub:
            continue
        lines += [f"## {th} thread{'s' if th > 1 else ''}", "",
                  "| layer | net | MFLOP | ours ms | ours GFLOP/s | ORT ms | ORT GFLOP/s | speed vs ORT | default vs ORT | "
                  "medians: best, default | best config | default config |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        lines += [f"| {r['layer']} | {r['net']} | {r['mflop']:.1f} | {r['ours']:.3f} | {r['gflops']:.1f} | {r['ort']:.3f} | "
                  f"{r['ort_gflops']:.1f} | {r['best']:.2f}x | {r['default']:.2f}x | {r['best_med']:.2f}x, {r['default_med']:.2f}x | "
                  f"{r['cfg']} | {r['dcfg']} |" for r in sub]
        lines.append("")
        for net in ("ResNet-18", "MobileNetV2", "MobileNetV3"):
            part = [r for r in sub if r["net"] == net]
            if part:
                b, d = sorted(r["best"] for r in part), sorted(r["default"] for r in part)
                lines.append(f"- {net}, {len(part)} layers: best median **{statistics.median(b):.2f}x** "
                             f"(min {b[0]:.2f}x, max {b[-1]:.2f}x), {sum(x >= 1.0 for x in b)} of {len(b)} >= 1.0x; "
                             f"default median {statistics.median(d):.2f}x (min {d[0]:.2f}x).")
        lines.append("")
    if wall:
        lines += [f"Total wall time {wall:.0f} s (compiles included).", ""]
    out = Path(args.out)
    out.write_text("\n".join(lines))
    plot(rows, threads_list, out.with_suffix(".png"))
    if not quiet:
        print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Record the latency of every config of a (sub)space of the dense template on real
kernels, for the simulated runner (`tests/simulated.py`) and the convergence benchmark.

Each code shape (register tile x loop order) is compiled once; every config is then
timed in this process (one warm-up call, median of `--repeat` calls) and its output of
one config per code shape is checked against NumPy. Writes one JSON file per workload:
{"workload", "template", "knobs": [[name, options, code_shape]], "latency_us": [...]}
with latencies indexed like `ConfigSpace.get(i)` of the recorded knobs (null: failed),
plus the compile time per code shape.

    python experiments/convergence/record_dataset.py --shape 128x256x1024 --out experiments/convergence/data
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from codegen import Kernel, compile_kernel  # noqa: E402
from ir import import_onnx, make_workload, partition, simplify  # noqa: E402
from schedules import get_template  # noqa: E402
from schedules.space import ConfigSpace, Knob  # noqa: E402
from tests.helpers import dense_model  # noqa: E402


def dense_workload(m: int, k: int, n: int, epilogue=("bias",)):
    g = simplify(import_onnx(dense_model(m, k, n, epilogue)))
    return make_workload(g, partition(g)[0], {})


def recorded_space(full: ConfigSpace) -> ConfigSpace:
    """All generated code shapes; run-time block sizes thinned out to keep the table small.
    `regtile=blas` (library dispatch) is left out: it ignores every other knob, so
    160 configs of the table would be one kernel timed 160 times, and the search
    would have nothing to find (the benchmark compares searches over generated code)."""
    knobs = []
    for k in full.knobs:
        opts = k.options
        if k.name == "regtile":
            opts = tuple(o for o in opts if o != "blas")
        elif k.name in ("MB", "NB"):
            opts = tuple(o for o in opts if o in (1, 4, 16, 64))
        elif k.name == "KB":
            opts = tuple(dict.fromkeys((opts[0], opts[len(opts) // 2], opts[-1])))
        knobs.append(Knob(k.name, opts, k.code_shape))
    return ConfigSpace(knobs)


def resnet_conv_workload():
    """The first 3x3, 64 -> 64 channel conv of ResNet-18 (layer1, 56x56, batch 1), with its fused ReLU."""
    g = simplify(import_onnx(Path(__file__).resolve().parents[1] / "models" / "resnet18.onnx"))
    for sg in partition(g):
        wl = make_workload(g, sg, {k: 1 for k in g.dims})
        if wl.ops[0]["op"] == "Conv" and list(wl.inputs[1]["shape"]) == [64, 64, 3, 3]:
            return wl
    raise LookupError("no 64x64x3x3 conv in resnet18.onnx")


def record(m: int, k: int, n: int, repeat: int) -> dict:
    dense = get_template("dense")
    wl = dense_workload(m, k, n)
    d = record_workload(dense, wl, recorded_space(dense.space(wl)), repeat)
    d["shape"] = [m, k, n]
    return d


def record_workload(template, wl, space: ConfigSpace, repeat: int) -> dict:
    """Time every config of `space` (a subspace of `template`'s space for wl) on real kernels."""
    arrays = wl.random_inputs(0)
    consts = [a if spec["const"] else None for a, spec in zip(arrays, wl.inputs)]
    expected = wl.reference(arrays)
    out = np.empty(wl.output_shape, np.float32)
    compiled, compile_s = {}, {}
    lat = []
    t_start = time.time()
    for i, cfg in enumerate(space):
        key = space.code_key(cfg)
        try:
            if key not in compiled:
                compiled[key] = None   # a code shape that fails to compile or computes garbage stays failed
                kern = compile_kernel(template, wl, cfg)
                compile_s[str(key)] = kern.artifact.compile_s
                kern.bind(consts)(arrays, out)
                if not np.allclose(out, expected, rtol=1e-4, atol=1e-3 * max(1.0, float(np.abs(expected).max()))):
                    raise AssertionError(f"wrong result for {cfg}")
                compiled[key] = kern
            if compiled[key] is None:
                raise RuntimeError("code shape failed")
            k0 = compiled[key]   # same code shape: the artifact is shared, the launch is this config's
            run = Kernel(wl, template.name, cfg, template.lower(wl, cfg), k0.artifact).bind(consts)
            run(arrays, out)  # warm-up
            ts = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                run(arrays, out)
                ts.append(time.perf_counter() - t0)
            lat.append(round(statistics.median(ts) * 1e6, 2))
        except Exception as e:  # a failing config is data too
            print(f"config {i} failed: {type(e).__name__}: {e}", file=sys.stderr)
            lat.append(None)
        if i % 200 == 0:
            print(f"{wl.describe()}: {i}/{len(space)} configs, {time.time() - t_start:.0f} s", file=sys.stderr)
    return {"workload": wl.to_json(), "template": template.name,
            "knobs": [[kb.name, list(kb.options), kb.code_shape] for kb in space.knobs],
            "latency_us": lat, "compile_s": compile_s, "repeat": repeat,
            "recorded_s": round(time.time() - t_start, 1)}


def drop_blas(d: dict) -> dict:
    """Drop `regtile=blas` rows from a table recorded with them (see recorded_space)."""
    from tuner.measure.replay import Table
    names = [k[0] for k in d["knobs"]]
    old = ConfigSpace([Knob(n, tuple(o), bool(cs)) for n, o, cs in d["knobs"]])
    knobs = [[n, [o for o in opts if o != "blas"] if n == "regtile" else opts, cs] for n, opts, cs in d["knobs"]]
    new = ConfigSpace([Knob(n, tuple(o), bool(cs)) for n, o, cs in knobs])
    d = dict(d, knobs=knobs, latency_us=[d["latency_us"][old.index_of(c)] for c in new])
    d["compile_s"] = {k: v for k, v in d["compile_s"].items() if "blas" not in k}
    assert names == [k[0] for k in knobs] and Table is not None
    return d


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", action="append", default=[], help="dense MxKxN (+bias)")
    p.add_argument("--resnet-conv", action="store_true", help="also the ResNet-18 layer1 3x3 conv (conv2d template)")
    p.add_argument("--out", default=str(Path(__file__).parent / "data"))
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    from ir.settings import Settings, use
    use(Settings.from_env())   # a command line: reads the environment like the CLIs
    for s in a.shape:
        m, k, n = (int(x) for x in s.split("x"))
        d = record(m, k, n, a.repeat)
        path = Path(a.out) / f"dense_{m}x{k}x{n}.json"
        path.write_text(json.dumps(d, separators=(",", ":")))
        print(f"wrote {path} ({path.stat().st_size // 1024} KB, {d['recorded_s']} s)", file=sys.stderr)
    if a.resnet_conv:
        conv = get_template("conv2d")
        wl = resnet_conv_workload()
        d = record_workload(conv, wl, conv.space(wl), a.repeat)
        path = Path(a.out) / "conv2d_resnet18_layer1.json"
        path.write_text(json.dumps(d, separators=(",", ":")))
        print(f"wrote {path} ({path.stat().st_size // 1024} KB, {d['recorded_s']} s)", file=sys.stderr)


if __name__ == "__main__":
    main()

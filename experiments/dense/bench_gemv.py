"""Dense with a few rows (classifier heads, decoder steps at batch 1-4): register tiles vs the
untuned default vs NumPy (OpenBLAS sgemv / sgemm), one thread each, side by side.

Run: python experiments/dense/bench_gemv.py [--rows 1 2 4] [--tiles 1x64,1x128,2x64,4x64] [--rounds 7]

Per (M, K x N): the default config (`DenseTemplate.default_config`), then each tile of `--tiles`
as vector IR with the default's blocks, then `np.matmul`, in `--rounds` alternating rounds of 20
calls each (fastest call per round, median over rounds), microseconds. OpenBLAS runs on one
thread (OPENBLAS_NUM_THREADS=1, set before NumPy loads): its sgemv otherwise takes both cores.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # bench_knobs sets its own first
for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # they slow a current numpy (FACTS.md)
    os.environ.pop(var, None)

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from codegen import compile_kernel  # noqa: E402
from codegen.backend import get_backend  # noqa: E402
from ir.settings import Settings, use  # noqa: E402

SHAPES = [(160, 100), (512, 1000), (768, 768), (768, 3072), (1280, 1000)]   # K x N: heads, a BERT/GPT-2 layer


def best_of(fn, calls: int = 20) -> float:
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def timed_against_numpy(dense, wl, cfgs, backend, rounds: int, calls: int = 20) -> list:
    """Seconds per call of each config of `wl` (each checked against the reference first), then
    of `np.matmul`: the fastest of `calls` calls per round, median over `rounds` alternating
    rounds (load from other processes hits all alike)."""
    arrays = wl.random_inputs(0)
    y = np.empty(wl.output_shape, np.float32)
    fns = []
    for cfg in cfgs:
        run = compile_kernel(dense, wl, cfg).bind([None, *arrays[1:]], backend)
        run(arrays, y)
        np.testing.assert_allclose(y, wl.reference(arrays), rtol=1e-3, atol=1e-3)
        fns.append(lambda run=run: run(arrays, y))
    fns.append(lambda: np.matmul(arrays[0], arrays[1]))
    times = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            times[i].append(best_of(fn, calls))
    return [statistics.median(t) for t in times]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--tiles", default="1x64,1x128,2x64,4x64")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    use(Settings.from_env())
    backend = get_backend(None, Settings.from_env().with_(threads=1))
    from codegen.cpu import _host
    from schedules import get_template
    from schedules.microkernel import tile_codes
    from tests.template_cases import make_wl, precompile
    dense, code = get_template("dense"), tile_codes()[1]
    h = _host()
    print(f"{h['cpu']} ({h['cpu_name']}), {h['vector_bits']}-bit vectors, 1 thread, numba {h['numba']}")
    tiles = args.tiles.split(",")
    cases = []
    for m in args.rows:
        for k, n in SHAPES:
            wl = make_wl([("MatMul", ["i0", "i1"], {}), ("Add", ["t0", "i2"], {})],
                         [((m, k), "float32", False), ((k, n), "float32", True), ((n,), "float32", True)])
            default = dense.default_config(wl)
            space = dense.space(wl)
            cfgs = [default] + [space.validate({**default.to_json(), "regtile": t, "tile_code": code})
                                for t in tiles if t in space.knobs[0].options]
            cases.append((wl, cfgs))
    precompile("dense", [(wl, c) for wl, cfgs in cases for c in cfgs])
    print("| M | K x N | " + " | ".join(["default"] + tiles + ["NumPy"]) + " | default vs NumPy (NumPy time / default time) |")
    print("|---|---|" + "---:|" * (len(tiles) + 3))
    for wl, cfgs in cases:
        med = {i: t * 1e6 for i, t in enumerate(timed_against_numpy(dense, wl, cfgs, backend, args.rounds))}
        by_tile = {c["regtile"]: med[i] for i, c in enumerate(cfgs) if i}
        m, k = wl.inputs[0]["shape"]
        cells = [f"{med[0]:.1f} ({cfgs[0]['regtile']})"] + [f"{by_tile[t]:.1f}" if t in by_tile else "-" for t in tiles]
        print(f"| {m} | {k}x{wl.inputs[1]['shape'][1]} | " + " | ".join(cells) + f" | {med[len(cfgs)]:.1f} | "
              f"{med[len(cfgs)] / med[0]:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

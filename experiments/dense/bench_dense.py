"""Dense float32: best generated-loop kernel vs NumPy's matmul (OpenBLAS), 1 and 2 threads;
and fused dense + bias + GELU vs the same in NumPy op by op.

"Best" is the best of a sweep over the dense template's code shapes (register tile)
and a few run-time block settings: a brute-force stand-in for the tuner, so the
table shows what the space contains. Medians of repeated runs, ratios in one run.

Run: python experiments/dense/bench_dense.py   (writes results.md and dense.png here)
"""
import os

for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # they slow a current numpy (FACTS.md)
    os.environ.pop(var, None)

import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from scipy.special import erf  # noqa: E402
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

from codegen import compile_kernel, host_target  # noqa: E402
from ir import import_onnx, make_workload, partition, simplify  # noqa: E402
from schedules import get_template  # noqa: E402

HERE = Path(__file__).parent
DENSE = get_template("dense")
SHAPES = [(1024, 1024, 1024), (128, 256, 256), (128, 256, 1024), (128, 1024, 256)]
BLOCKS = [(4, 4, 256), (8, 8, 512), (16, 4, 128), (2, 16, 1024)]
QUICK = "--quick" in sys.argv


def median_time(fn, min_s=0.2, repeat=7):
    fn()
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_s / repeat:
            break
        n *= 2
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return float(np.median(times))


def workload(m, k, n, gelu=False):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y0"])]
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")]
    out = "y0"
    if gelu:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
        nodes += [helper.make_node("Add", ["y0", "b"], ["y1"]), helper.make_node("Gelu", ["y1"], ["y2"], domain="")]
        out = "y2"
    g = helper.make_graph(nodes, "d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, [m, n])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    graph = simplify(import_onnx(model))
    [sg] = partition(graph)
    return make_workload(graph, sg, {})


def best_generated(wl, threads, tiles):
    arrays = wl.random_inputs(0)
    consts = [a if s["const"] else None for a, s in zip(arrays, wl.inputs)]
    space = DENSE.space(wl)
    best = (float("inf"), None)
    for tile in tiles:
        for mb, nb, kb in BLOCKS:
            kb = min(space.knobs[5].options, key=lambda v: abs(v - kb))
            cfg = space.validate({"regtile": tile, "order": "ij", "parallel": threads > 1, "MB": mb, "NB": nb, "KB": kb})
            run = compile_kernel(DENSE, wl, cfg).bind(consts)
            out = np.empty(wl.output_shape, np.float32)
            t = median_time(lambda: run(arrays, out))
            best = min(best, (t, cfg.to_json()), key=lambda x: x[0])
    return best


def main():
    from ir.settings import Settings, use
    use(Settings.from_env().with_(threads=2))
    tiles = [t for t in get_template("dense").space(workload(8, 8, 8)).knobs[0].options if t != "blas"]
    if QUICK:
        tiles = ["4x24", "6x16", "3x24"]
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    rows, plot = [], []
    for threads in (1, 2):
        use(Settings.from_env().with_(threads=threads))
        for m, k, n in SHAPES:
            wl = workload(m, k, n)
            x, w = wl.random_inputs(0)[:2]
            with threadpool_limits(threads, user_api="blas"):
                t_np = median_time(lambda: x @ w)
                t_gen, cfg = best_generated(wl, threads, tiles)
                t_blas, _ = best_generated(wl, threads, ["blas"])
            fl = 2 * m * n * k
            rows.append((f"{m}x{k}x{n}", threads, fl / t_np / 1e9, fl / t_gen / 1e9, t_np / t_gen,
                         fl / t_blas / 1e9, cfg["regtile"], f"MB={cfg['MB']} NB={cfg['NB']} KB={cfg['KB']}"))
            plot.append((f"{m}x{k}x{n}\n{threads} thr", t_np / t_gen))
            print(rows[-1], flush=True)
    # fused dense + bias + GELU (BERT FFN up-projection) vs NumPy op by op
    fused = []
    for threads in (1, 2):
        use(Settings.from_env().with_(threads=threads))
        wl = workload(128, 256, 1024, gelu=True)
        x, w, b = wl.random_inputs(0)

        def numpy_ops():
            y = x @ w
            y += b
            return 0.5 * y * (1.0 + erf(y / np.float32(np.sqrt(2.0))))

        with threadpool_limits(threads, user_api="blas"):
            t_np = median_time(numpy_ops)
            t_gen, cfg = best_generated(wl, threads, tiles + ["blas"])
        fused.append((threads, t_np * 1e6, t_gen * 1e6, t_np / t_gen, cfg["regtile"]))
        print(fused[-1], flush=True)
    write(rows, fused, blas, plot)


def write(rows, fused, blas, plot):
    t = host_target()
    lines = ["# Dense float32: generated loops vs NumPy/OpenBLAS", "",
             f"Machine: {t.cpu} ({t.cpu_name}, {t.cores} cores, {t.features}); numba {t.numba}; "
             f"NumPy {np.__version__} with " + ", ".join(f"{b.get('internal_api')} {b.get('version')} "
                                                        f"({b.get('architecture')})" for b in blas) + f"; Python {platform.python_version()}.",
             "Median of 7 repeats per point; best of a sweep over register tiles x 4 block settings (order ij). "
             "Ratio = generated GFLOP/s / NumPy GFLOP/s, measured side by side in one run.", "",
             "| M x K x N | threads | NumPy GFLOP/s | generated GFLOP/s | ratio | BLAS-dispatch candidate GFLOP/s | best tile | blocks |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.1f} | **{r[4]:.2f}x** | {r[5]:.1f} | {r[6]} | {r[7]} |")
    lines += ["", "## Fused dense + bias + GELU, 128x256x1024", "",
              "| threads | NumPy op by op (us) | tensortune fused (us) | speedup | chosen |", "|---|---|---|---|---|"]
    for f in fused:
        lines.append(f"| {f[0]} | {f[1]:.0f} | {f[2]:.0f} | **{f[3]:.2f}x** | {f[4]} |")
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 4))
        ax.bar(range(len(plot)), [p[1] for p in plot])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(plot)), [p[0] for p in plot], fontsize=7)
        ax.set_ylabel("generated / NumPy (higher is better)")
        ax.set_title("Dense float32, best generated loops vs OpenBLAS")
        fig.tight_layout()
        fig.savefig(HERE / "dense.png", dpi=100)
    except ImportError:
        pass


if __name__ == "__main__":
    main()

"""Dense float32: best generated-loop kernel vs NumPy's matmul (OpenBLAS), 1 and 2 threads;
and fused dense + bias + GELU vs the same in NumPy op by op.

"Best" is the best of a sweep over the dense template's code shapes (register tile,
loop order) and a few run-time block settings: a brute-force stand-in for the tuner,
so the table shows what the space contains. The best config and NumPy are then timed
again in alternating rounds (medians), so load from other processes hits both alike.

Run: python experiments/dense/bench_dense.py [--quick | --defaults | --tile-code]   (writes results.md and dense.png here)
--defaults: no sweep; the template's default config (what an untuned model runs) against NumPy,
for the dense shapes and the attention batched matmuls (12 heads of BERT-base / ViT-B).
--tile-code: the register tile as SLP scalars (today's default 4x16) vs as LLVM vector IR
(`tile_code="vec<lanes>"`, several tiles), default blocks, 1 thread CPU time side by side with NumPy;
and the CPU seconds numba takes to compile the `blocks` function of each (fresh cache).
Prints a Markdown table (results.md is left alone).
--avx512-asm: no timing; the dense AVX-512 tiles as vector IR ("vec16") cross-compiled for
`sapphirerapids` (AVX-512 features, -prefer-256-bit): zmm FMAs and stack accesses in the hot loop.
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
from schedules.microkernel import tile_codes  # noqa: E402
from tuner.verify import settle  # noqa: E402

HERE = Path(__file__).parent
DENSE = get_template("dense")
# 1024^3, then BERT-base/ViT-B dense layers: QKV/out projection, FFN up, FFN down (128 tokens),
# and ViT-B/16's 197 tokens
SHAPES = [(1024, 1024, 1024), (128, 768, 768), (128, 768, 3072), (128, 3072, 768), (197, 768, 768)]
BLOCKS = [(4, 4, 256), (8, 8, 512), (16, 4, 256), (2, 16, 1024)]
ORDERS = ("ij", "ji")
QUICK = "--quick" in sys.argv
DEFAULTS = "--defaults" in sys.argv
# attention, batch 1, 12 heads: scores (s x d) @ (d x s) / sqrt(d) + mask, context (s x s) @ (s x d)
ATTENTION = [(12, 128, 64, 128), (12, 128, 128, 64), (12, 197, 64, 197), (12, 197, 197, 64)]


def median_time(fn, min_s=0.2, repeat=7, clock=time.perf_counter):
    settle()
    fn()
    n, t = 1, 0.0
    while True:
        t0 = clock()
        for _ in range(n):
            fn()
        t = clock() - t0
        if t >= min_s / repeat:
            break
        n *= 2
    times = []
    for _ in range(repeat):
        t0 = clock()
        for _ in range(n):
            fn()
        times.append((clock() - t0) / n)
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


def best_generated(wl, threads, tiles, orders=ORDERS):
    """(seconds, config, the call) of the fastest config of the sweep."""
    arrays = wl.random_inputs(0)
    consts = [a if s["const"] else None for a, s in zip(arrays, wl.inputs)]
    space = DENSE.space(wl)
    best = (float("inf"), None, None)
    for tile in tiles:
        for order in (orders if tile != "blas" else ("ij",)):
            for mb, nb, kb in (BLOCKS if tile != "blas" else BLOCKS[:1]):
                kb = min(space.knobs[5].options, key=lambda v: abs(v - kb))
                cfg = space.validate({"regtile": tile, "order": order, "parallel": threads > 1, "MB": mb, "NB": nb, "KB": kb})
                run = compile_kernel(DENSE, wl, cfg).bind(consts)
                out = np.empty(wl.output_shape, np.float32)
                call = (lambda run=run, out=out: run(arrays, out))
                # one thread: pick by CPU time, which time-sharing distorts less (see side_by_side)
                t = median_time(call, min_s=0.1, repeat=5, clock=time.thread_time if threads == 1 else time.perf_counter)
                best = min(best, (t, cfg.to_json(), call), key=lambda x: x[0])
    return best


def side_by_side(fns, rounds=7, min_s=0.05, clock=time.perf_counter):
    """Median seconds of each fn, timed in alternating rounds. With clock=time.thread_time
    (one thread only: everything runs in the calling thread) it is the CPU time the calling
    thread got, which time-sharing with other processes inflates far less than wall time."""
    reps = []
    for f in fns:
        f()
        t0 = time.perf_counter()
        f()
        one = max(time.perf_counter() - t0, 1e-7)
        reps.append(max(1, int(min_s / one)))
    times = [[] for _ in fns]
    for _ in range(rounds):
        for f, n, ts in zip(fns, reps, times):
            settle()   # OpenBLAS's threads spin ~100 ms after a call: not on the next one's time
            f()
            t0 = clock()
            for _ in range(n):
                f()
            ts.append((clock() - t0) / n)
    return [float(np.median(ts)) for ts in times]


def attention_workload(h, m, k, n):
    """q[1, h, m, k] @ kt[1, h, k, n], with `/ scale + mask[1, 1, 1, n]` when it is the scores
    matmul (m == n)."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s0"])]
    ins = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, h, m, k]),
           helper.make_tensor_value_info("kt", TensorProto.FLOAT, [1, h, k, n])]
    inits, out = [], "s0"
    if m == n:
        inits.append(numpy_helper.from_array(np.array(8.0, np.float32), "scale"))
        ins.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, 1, n]))
        nodes += [helper.make_node("Div", ["s0", "scale"], ["s1"]), helper.make_node("Add", ["s1", "mask"], ["s2"])]
        out = "s2"
    g = helper.make_graph(nodes, "a", ins, [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, h, m, n])], inits)
    graph = simplify(import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])))
    [sg] = partition(graph)
    return make_workload(graph, sg, {})


def defaults_main():
    """Default configs vs NumPy, side by side: dense shapes and attention batched matmuls."""
    from ir.settings import Settings, use
    bmm = get_template("batch_matmul")
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    rows = []
    for threads in (1, 2):
        use(Settings.from_env().with_(threads=threads))
        cases = [("dense", f"{m}x{k}x{n}", workload(m, k, n), 2 * m * k * n) for m, k, n in SHAPES] \
            + [("batch_matmul", f"{h}x({m}x{k} @ {k}x{n})", attention_workload(h, m, k, n), 2 * h * m * k * n)
               for h, m, k, n in ATTENTION]
        for family, name, wl, fl in cases:
            template = DENSE if family == "dense" else bmm
            arrays = wl.random_inputs(0)
            consts = [a if s["const"] else None for a, s in zip(arrays, wl.inputs)]
            cfg = template.default_config(wl)
            run = compile_kernel(template, wl, cfg).bind(consts)
            out = np.empty(wl.output_shape, np.float32)
            ref = wl.reference(arrays)
            run(arrays, out)
            assert np.allclose(out, ref, rtol=1e-3, atol=1e-3), name
            if family == "dense":
                x, w = arrays[:2]
                numpy_fn = (lambda x=x, w=w: x @ w)
            elif len(arrays) > 2:
                q, kt, scale, mask = arrays
                numpy_fn = (lambda q=q, kt=kt, scale=scale, mask=mask: np.matmul(q, kt) / scale + mask)
            else:
                q, kt = arrays
                numpy_fn = (lambda q=q, kt=kt: np.matmul(q, kt))
            gen = (lambda run=run, out=out: run(arrays, out))
            with threadpool_limits(threads, user_api="blas"):
                t_np, t_gen = side_by_side([numpy_fn, gen], rounds=9)
                cpu = side_by_side([numpy_fn, gen], rounds=9, clock=time.thread_time) if threads == 1 else None
            rows.append((name, threads, fl / t_np / 1e9, fl / t_gen / 1e9, t_np / t_gen,
                         f"{cpu[0] / cpu[1]:.2f}x" if cpu else "-", cfg_text(cfg)))
            print(rows[-1], flush=True)
    t = host_target()
    lines = ["# Default configs vs NumPy/OpenBLAS (what an untuned model runs)", "",
             f"Machine: {t.cpu} ({t.cpu_name}, {t.cores} cores, {t.features}; kernels built for "
             f"{t.vector_bits}-bit vectors, {t.vector_registers} vector registers); numba {t.numba}; NumPy "
             f"{np.__version__} with " + ", ".join(f"{b.get('internal_api')} {b.get('version')} ({b.get('architecture')})"
                                                     for b in blas) + ".",
             "NumPy: `x @ w`; attention: `np.matmul(q, kt) / scale + mask` (scores) or `np.matmul` (context). "
             "Timed side by side in 9 alternating rounds, medians; CPU-time ratio: the calling thread's CPU "
             "time (1 thread only).", "",
             "| shape | threads | NumPy GFLOP/s | generated GFLOP/s | ratio | CPU-time ratio | default config |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.1f} | **{r[4]:.2f}x** | {r[5]} | {r[6]} |" for r in rows]
    (HERE / "defaults.md").write_text("\n".join(lines) + "\n")


VEC = tile_codes()[1]   # this machine's vector IR tile code ("vec8" on AVX2)
TILE_CODE_CASES = [("slp", "4x16"), (VEC, "4x16"), (VEC, "6x16"), (VEC, "4x24"), (VEC, "8x8"), (VEC, "3x24")]


def compile_cpu_seconds(wl, cfg) -> float:
    """CPU seconds numba takes for the `blocks` function of `cfg` (the code shape's own part;
    the B packing is shared by every tile of one NR), in a fresh kernel cache."""
    import tempfile
    from codegen.build import load_source, parts_for
    from ir.settings import Settings
    [part] = [p for p in parts_for(DENSE.lower(wl, cfg).module, host_target()) if "blocks" in p.functions]
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o700)
        t0 = time.process_time()
        load_source(part.source, part.key, list(part.functions), Settings.from_env().with_(cache_dir=d), prefix="f_")
        return time.process_time() - t0


def tile_code_main():
    """SLP tile vs vector-IR tiles, default blocks, 1 thread: GFLOP per CPU-second side by side."""
    from ir.settings import Settings, use
    use(Settings.from_env().with_(threads=1))
    header = "| M x K x N | NumPy | " + " | ".join(f"{c} {t}" for c, t in TILE_CODE_CASES) + " |"
    lines = [header, "|" + "---|" * (len(TILE_CODE_CASES) + 2)]
    compile_s = {case: [] for case in TILE_CODE_CASES}
    for m, k, n in SHAPES:
        wl = workload(m, k, n)
        arrays = wl.random_inputs(0)
        consts = [a if s["const"] else None for a, s in zip(arrays, wl.inputs)]
        x, w = arrays[:2]
        fns = [lambda: x @ w]
        for code, tile in TILE_CODE_CASES:
            cfg = DENSE.space(wl).validate({**DENSE.default_config(wl).to_json(), "regtile": tile, "tile_code": code,
                                            "parallel": False})
            if (m, k, n) == SHAPES[0]:
                compile_s[(code, tile)].append(compile_cpu_seconds(wl, cfg))
            run = compile_kernel(DENSE, wl, cfg).bind(consts)
            out = np.empty(wl.output_shape, np.float32)
            run(arrays, out)
            assert np.allclose(out, x @ w, rtol=1e-3, atol=1e-3), (code, tile)
            fns.append(lambda run=run, out=out: run(arrays, out))
        with threadpool_limits(1, user_api="blas"):
            cpu = side_by_side(fns, rounds=9, clock=time.thread_time)
        fl = 2 * m * n * k
        lines.append(f"| {m}x{k}x{n} | {fl / cpu[0] / 1e9:.0f} | "
                     + " | ".join(f"{fl / t / 1e9:.0f} ({cpu[0] / t:.2f}x)" for t in cpu[1:]) + " |")
        print(lines[-1], flush=True)
    lines.append("| compile `blocks`, CPU s | - | " + " | ".join(f"{v[0]:.2f}" for v in compile_s.values()) + " |")
    print("\n".join(lines + [""] + attention_tile_code()))


def attention_tile_code() -> list:
    """The attention batched matmuls (batch_matmul template, default MB), 1 thread, SLP vs
    vector-IR tiles side by side with NumPy (CPU time): Markdown table lines."""
    bmm = get_template("batch_matmul")
    cases = [("slp", "4x16"), (VEC, "4x16"), (VEC, "2x16"), (VEC, "8x16")]
    lines = ["| attention | NumPy | " + " | ".join(f"{c} {t}" for c, t in cases) + " |", "|" + "---|" * (len(cases) + 2)]
    for h, m, k, n in ATTENTION:
        wl = attention_workload(h, m, k, n)
        arrays = wl.random_inputs(0)
        ref = wl.reference(arrays)
        if len(arrays) > 2:   # scores: / scale + mask, as defaults_main
            fns = [lambda a=arrays: np.matmul(a[0], a[1]) / a[2] + a[3]]
        else:
            fns = [lambda a=arrays: np.matmul(a[0], a[1])]
        for code, tile in cases:
            cfg = bmm.space(wl).validate({**bmm.default_config(wl).to_json(), "regtile": tile, "tile_code": code,
                                          "parallel": False})
            run = compile_kernel(bmm, wl, cfg).bind([a if s['const'] else None for a, s in zip(arrays, wl.inputs)])
            out = np.empty(wl.output_shape, np.float32)
            run(arrays, out)
            assert np.allclose(out, ref, rtol=1e-3, atol=1e-3), (code, tile)
            fns.append(lambda run=run, out=out: run(arrays, out))
        with threadpool_limits(1, user_api="blas"):
            cpu = side_by_side(fns, rounds=9, clock=time.thread_time)
        fl = 2 * h * m * k * n
        lines.append(f"| {h}x({m}x{k} @ {k}x{n}) | {fl / cpu[0] / 1e9:.0f} | "
                     + " | ".join(f"{fl / t / 1e9:.0f} ({cpu[0] / t:.2f}x)" for t in cpu[1:]) + " |")
        print(lines[-1], flush=True)
    return lines


def avx512_asm_main():
    """Each AVX-512 dense tile as vector IR: numba's optimized LLVM IR (compiled here), its target
    attributes stripped, emitted for sapphirerapids by an llvmlite target machine; per tile the
    FMAs (zmm) and stack accesses in the loop with the most FMAs, up to its back edge."""
    import re
    import tempfile
    import llvmlite.binding as ll
    from codegen.build import load_source, parts_for
    from ir.settings import Settings
    feats = ll.get_host_cpu_features()
    for f in ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"):
        feats[f] = True
    tm = ll.Target.from_default_triple().create_target_machine(
        cpu="sapphirerapids", features=feats.flatten() + ",-prefer-256-bit", opt=3)
    avx512 = {"vector_bits": 512, "vector_registers": 32}
    wl = workload(128, 768, 768)
    space = DENSE.space(wl, avx512)
    settings = Settings.from_env().with_(cache_dir=tempfile.mkdtemp())
    os.chmod(settings.cache_dir, 0o700)
    for tile in (t for t in space.knobs[0].options if t != "blas"):
        cfg = space.validate({**DENSE.default_config(wl, avx512).to_json(), "regtile": tile, "tile_code": "vec16"})
        [part] = [p for p in parts_for(DENSE.lower(wl, cfg).module, host_target()) if "blocks" in p.functions]
        fn = load_source(part.source, part.key, list(part.functions), settings, prefix="f_").functions["blocks"]
        text = re.sub(r'"target-(cpu|features)"="[^"]*"', "", fn.inspect_llvm(fn.signatures[0]))
        asm = tm.emit_assembly(ll.parse_assembly(text))
        hot = max(re.split(r"\n(?=\.?L\w+:)", asm), key=lambda b: b.count("vfmadd")).splitlines()
        back = max(i for i, line in enumerate(hot) if line.strip().startswith(("jne", "jb")))
        loop = "\n".join(hot[:back])
        mr, nr = (int(x) for x in tile.split("x"))
        zmm = len(re.findall(r"vfmadd[^\n]*zmm", loop))
        stack = len(re.findall(r"[(]%r[sb]p[)]", loop))
        print(f"{tile}: {loop.count('vfmadd')} FMAs ({zmm} zmm; {mr * nr // 16} per k), {stack} stack accesses",
              flush=True)


def cfg_text(cfg) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.to_json().items())


def main():
    if DEFAULTS:
        return defaults_main()
    if "--tile-code" in sys.argv:
        return tile_code_main()
    if "--avx512-asm" in sys.argv:
        return avx512_asm_main()
    from ir.settings import Settings, use
    use(Settings.from_env().with_(threads=2))
    tiles = [t for t in get_template("dense").space(workload(8, 8, 8)).knobs[0].options if t != "blas"]
    if QUICK:   # the tiles that won the full sweep on AVX2 / the AVX-512 set's middle
        tiles = ["4x24", "6x16", "3x24"] if host_target().vector_bits == 256 else ["8x32", "12x32", "6x48"]
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    rows, plot = [], []
    for threads in (1, 2):
        use(Settings.from_env().with_(threads=threads))
        for m, k, n in SHAPES:
            wl = workload(m, k, n)
            x, w = wl.random_inputs(0)[:2]
            with threadpool_limits(threads, user_api="blas"):
                _, cfg, gen = best_generated(wl, threads, tiles)
                _, _, blas_call = best_generated(wl, threads, ["blas"])
                t_np, t_gen, t_blas = side_by_side([lambda: x @ w, gen, blas_call])
                cpu = side_by_side([lambda: x @ w, gen], clock=time.thread_time) if threads == 1 else None
            fl = 2 * m * n * k
            rows.append((f"{m}x{k}x{n}", threads, fl / t_np / 1e9, fl / t_gen / 1e9, t_np / t_gen,
                         f"{cpu[0] / cpu[1]:.2f}x ({fl / cpu[0] / 1e9:.0f} vs {fl / cpu[1] / 1e9:.0f})" if cpu else "-",
                         fl / t_blas / 1e9, cfg["regtile"], f"{cfg['order']} MB={cfg['MB']} NB={cfg['NB']} KB={cfg['KB']}"))
            plot.append((f"{m}x{k}x{n}\n{threads} thr", t_np / t_gen))
            print(rows[-1], flush=True)
    # fused dense + bias + GELU (BERT FFN up-projection) vs NumPy op by op
    fused = []
    for threads in (1, 2):
        use(Settings.from_env().with_(threads=threads))
        wl = workload(128, 768, 3072, gelu=True)
        x, w, b = wl.random_inputs(0)

        def numpy_ops():
            y = x @ w
            y += b
            return 0.5 * y * (1.0 + erf(y / np.float32(np.sqrt(2.0))))

        with threadpool_limits(threads, user_api="blas"):
            _, cfg, gen = best_generated(wl, threads, tiles + ["blas"])
            t_np, t_gen = side_by_side([numpy_ops, gen])
        fused.append((threads, t_np * 1e6, t_gen * 1e6, t_np / t_gen, cfg["regtile"]))
        print(fused[-1], flush=True)
    write(rows, fused, blas, plot, tiles)


def write(rows, fused, blas, plot, rows_tiles=()):
    t = host_target()
    lines = ["# Dense float32: generated loops vs NumPy/OpenBLAS", "",
             f"Machine: {t.cpu} ({t.cpu_name}, {t.cores} cores, {t.features}; kernels built for "
             f"{t.vector_bits}-bit vectors, {t.vector_registers} vector registers); numba {t.numba}; "
             f"NumPy {np.__version__} with " + ", ".join(f"{b.get('internal_api')} {b.get('version')} "
                                                        f"({b.get('architecture')})" for b in blas) + f"; Python {platform.python_version()}.",
             f"Best of a sweep over {len(rows_tiles)} register tiles x orders {'/'.join(ORDERS)} x {len(BLOCKS)} block "
             "settings; that config, NumPy and the BLAS-dispatch candidate then timed in 7 alternating rounds "
             "(medians). Ratio = generated GFLOP/s / NumPy GFLOP/s, measured side by side in one run.", "",
             "CPU-time ratio (1 thread): the same, timed by the calling thread's CPU time (NumPy vs generated "
             "GFLOP per CPU-second in brackets): less distorted when other processes share the cores.", "",
             "| M x K x N | threads | NumPy GFLOP/s | generated GFLOP/s | ratio | CPU-time ratio | BLAS-dispatch candidate GFLOP/s | best tile | order, blocks |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.1f} | **{r[4]:.2f}x** | {r[5]} | {r[6]:.1f} | {r[7]} | {r[8]} |")
    lines += ["", "## Fused dense + bias + GELU, 128x768x3072 (BERT FFN up-projection)", "",
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

"""Executor overhead per step: what Python costs around the kernels of a model call.

Builds models with many tiny subgraphs (batch 1), loads them as a user does
(`runtime.load(path)`, `model(x)`), and reports per call, medians of interleaved rounds:
  call       `model(x)`;
  bound      the program's bound kernels called one after the other (`BoundKernel(arrays, out)`)
             on the program's own buffers;
  functions  the kernel functions alone, called with their arguments already resolved
             (the plan's calls): what no executor can avoid;
  overhead   (call - functions) / steps, in microseconds of CPU time (this process's threads).
With `--baseline DIR` (a checkout of an older commit), each model's `call` is measured
there too, in a subprocess run right after this process's rounds, for a before/after row.
With `--handoff`: what handing a kernel to a second thread costs (`codegen.cpu.parallel_for`),
wall µs per call, medians of interleaved rounds: a trivial nogil kernel at 1 and 2 threads
(on the Python threads' pool, on the native pool, and on the native pool as a plan calls it),
dense N^3 kernels (parallel config) at 1 and 2 threads, and a 1-thread kernel run right
after a 2-thread one (the pool still spinning) against one run after the spin ended.

Run: PYTHONPATH=. python experiments/bench_overhead.py [--threads 1 2] [--baseline /tmp/old] [--out FILE]
     PYTHONPATH=. python experiments/bench_overhead.py --handoff [--sizes 128 256 512]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent


def dense_chain(layers: int, width: int = 16, seed: int = 0) -> onnx.ModelProto:
    """MatMul + Add + Relu, `layers` times: one dense subgraph (bias and relu fused) per layer."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        b = (0.01 * rng.standard_normal(width)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
        nodes += [helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"]),
                  helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"]),
                  helper.make_node("Relu", [f"a{k}"], ["y" if k == layers - 1 else f"r{k}"])]
        x = f"r{k}"
    return _model(nodes, inits, [1, width], "dense_chain")


def norm_chain(layers: int, width: int = 32) -> onnx.ModelProto:
    """Softmax then Mul by a constant, `layers` times: reduction and elementwise subgraphs."""
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        inits.append(numpy_helper.from_array(np.full(width, 1.5, np.float32), f"s{k}"))
        nodes += [helper.make_node("Softmax", [x], [f"p{k}"], axis=-1),
                  helper.make_node("Mul", [f"p{k}", f"s{k}"], ["y" if k == layers - 1 else f"q{k}"])]
        x = f"q{k}"
    return _model(nodes, inits, [1, width], "norm_chain")


def _model(nodes, inits, shape, name) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _us(fn, number: int) -> tuple[float, float]:
    """(wall, CPU) microseconds per call. CPU time (all this process's threads) is what the
    overhead is measured in: on cores shared with other jobs the wall clock also counts the
    time this process waited for a core."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number * 1e6, (time.process_time() - c0) / number * 1e6


def _direct(model, x):
    """(bound, functions, steps): the program's kernels called directly, two ways."""
    model(x)   # builds the program
    prog = next(iter(model._programs.values()))
    env = list(prog.env0)
    env[model._slot[model.graph.inputs[0]]] = x
    bound, functions = [], []
    for step in prog.steps:
        if step.kernel is None:
            raise SystemExit(f"step {step.name} runs no kernel ({step.kind}): pick another model")
        _, s, view, _ = step.outs[0]
        out = view if view is not None else np.empty(step.out_shape, step.out_dtype)
        arrays = [env[i] for i in step.in_slots]
        env[s] = out
        bound.append((step.kernel, arrays, out, step.work))
        functions += step.plan.fill(arrays, out)

    def run_bound():
        for k, arrays, out, work in bound:
            k(arrays, out, work)

    def run_functions():
        for run, args in functions:
            run(*args)
    return run_bound, run_functions, len(prog.steps)


def _load(path: Path, threads: int):
    from ir.settings import Settings
    from runtime import load
    return load(str(path), settings=Settings.from_env().with_(threads=threads))


def measure(path: Path, x: np.ndarray, threads: int, number: int, repeat: int) -> dict:
    model = _load(path, threads)
    run_bound, run_functions, steps = _direct(model, x)
    want = np.array(model(x))
    run_functions()
    assert np.array_equal(np.asarray(model(x)), want), "the model's result changed between calls"
    t = {"call": [], "bound": [], "functions": []}
    for _ in range(repeat):   # interleaved: the neighbours' load on shared cores hits all three alike
        t["call"].append(_us(lambda: model(x), number))
        t["bound"].append(_us(run_bound, number))
        t["functions"].append(_us(run_functions, number))
    r = {k: statistics.median(w for w, _ in v) for k, v in t.items()}
    r.update({k + "_cpu": statistics.median(c for _, c in v) for k, v in t.items()})
    r["steps"] = steps
    r["overhead"] = (r["call_cpu"] - r["functions_cpu"]) / steps
    return r


def call_only(path: Path, x: np.ndarray, threads: int, number: int, repeat: int) -> tuple[float, float]:
    """Median (wall, CPU) µs of `model(x)`, with nothing but the public API (runs on any commit)."""
    model = _load(path, threads)
    model(x)
    t = [_us(lambda: model(x), number) for _ in range(repeat)]
    return statistics.median(w for w, _ in t), statistics.median(c for _, c in t)


def _trivial():
    """A kernel that adds one to out[t]: compiled on demand (the Python threads' pool runs it)
    and for one explicit signature (the native pool's threads call it by address)."""
    from numba import njit

    def bump(out, t, T):
        out[t] += 1.0
    out = np.zeros(2)
    lazy, native = njit(nogil=True)(bump), njit("void(float64[::1], int64, int64)", nogil=True)(bump)
    lazy(out, 0, 1)
    return lazy, native, out


def dense_run(n: int, threads: int):
    """A dense n^3 kernel (default config, parallel) bound for `threads`, checked: () -> None.
    MB = 8 gives even small n two blocks of rows to split."""
    from codegen import compile_kernel
    from codegen.backend import get_backend
    from ir.settings import Settings
    from schedules import get_template
    from tests.template_cases import make_wl
    wl = make_wl([("MatMul", ["i0", "i1"], {})], [((n, n), "float32", False), ((n, n), "float32", True)])
    t = get_template("dense")
    cfg = t.space(wl).validate({**t.default_config(wl).to_json(), "parallel": True, "MB": 8})
    arrays, y = wl.random_inputs(0), np.empty(wl.output_shape, np.float32)
    run = compile_kernel(t, wl, cfg).bind([None, arrays[1]], get_backend(None, Settings.from_env().with_(threads=threads)))
    run(arrays, y)
    # NumPy's reference on one BLAS thread: OpenBLAS's second thread would spin ~100 ms after it,
    # on the core the pool thread waits on, and the pool thread (yielding between looks) then
    # ran no copy at all in the first rounds (measured on the Intel guest, 2026-12-04)
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1, user_api="blas"):
        np.testing.assert_allclose(y, wl.reference(arrays), rtol=1e-3, atol=1e-3)
    return lambda: run(arrays, y)


def interleaved(calls: dict, rounds: int, number: int) -> dict:
    """{name: median wall µs per call}: each round runs every entry's `number` calls back to back
    (after 2 untimed ones), the order rotating from round to round."""
    t, keys = {k: [] for k in calls}, list(calls)
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            calls[k]()
            calls[k]()
            t[k].append(_us(calls[k], number)[0])
    return {k: statistics.median(v) for k, v in t.items()}


def handoff(sizes: list[int], rounds: int) -> list[str]:
    """The `--handoff` rows (see the module docstring)."""
    from codegen import cpu
    lazy, native, out = _trivial()
    spread = cpu._Spread(native, 2, 2)   # as a plan runs a step: the argument block kept
    rows = []
    r = interleaved({"T=1": lambda: cpu.parallel_for(native, (out,), 1),
                     "T=2 Python pool": lambda: cpu.parallel_for(lazy, (out,), 2),
                     "T=2 native pool": lambda: cpu.parallel_for(native, (out,), 2),
                     "T=2 native, plan": lambda: spread(out)}, rounds, 2000)
    rows.append("trivial kernel, µs per call: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
    saved, cpu.MIN_WORK_PER_THREAD = cpu.MIN_WORK_PER_THREAD, 1   # split every size, to see where it pays
    try:
        for n in sizes:
            one, two = dense_run(n, 1), dense_run(n, 2)
            number = max(20, int(2e6 / n ** 2))   # blocks of ms: the pool thread wakes once a block, not once a call
            r = interleaved({"T=1": one, "T=2": two}, rounds, number)
            after, rested = [], []
            for _ in range(rounds):
                two()
                after.append(_us(one, 1)[0])
                time.sleep(10 * cpu.SPIN_S)
                rested.append(_us(one, 1)[0])
            rows.append(f"dense {n}^3 (work {2 * n ** 3 + 12 * n * n:,}): T=1 {r['T=1']:.1f} µs, T=2 {r['T=2']:.1f} µs "
                        f"({r['T=1'] / r['T=2']:.2f}x); T=1 right after T=2 {statistics.median(after):.1f} µs, "
                        f"after the spin ended {statistics.median(rested):.1f} µs")
    finally:
        cpu.MIN_WORK_PER_THREAD = saved
    return rows


def models(layers: list[int], work: Path) -> list[tuple[str, Path, np.ndarray]]:
    out = []
    for n in layers:
        for name, m, width in ((f"dense_chain{n} (16 wide)", dense_chain(n), 16),
                               (f"norm_chain{n} (32 wide)", norm_chain(n), 32)):
            p = work / (name.split()[0] + ".onnx")
            onnx.save(m, p)
            out.append((name, p, np.ones((1, width), np.float32)))
    mlp = HERE / "models" / "mlp.onnx"
    if mlp.exists():
        out.append(("mlp.onnx (batch 1)", mlp, np.ones((1, 256), np.float32)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--layers", type=int, nargs="+", default=[50, 200])
    ap.add_argument("--number", type=int, default=20, help="calls per round")
    ap.add_argument("--repeat", type=int, default=15, help="rounds (the median is reported)")
    ap.add_argument("--baseline", default=None, help="a checkout of an older commit: its call time too")
    ap.add_argument("--out", default=None, help="append a Markdown table to this file")
    ap.add_argument("--handoff", action="store_true", help="2-thread handoff costs instead (see above)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[96, 128, 192, 256, 512])
    ap.add_argument("--call-only", nargs=3, metavar=("MODEL", "WIDTH", "THREADS"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.call_only:
        path, width, threads = a.call_only
        print(json.dumps(call_only(Path(path), np.ones((1, int(width)), np.float32), int(threads),
                                   a.number, a.repeat)))
        return 0
    if a.handoff:
        for row in handoff(a.sizes, a.repeat):
            print(row, flush=True)
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench_overhead_"))
    rows = []
    for name, path, x in models(a.layers, work):
        for t in a.threads:
            r = measure(path, x, t, a.number, a.repeat)
            if a.baseline:
                env = {**os.environ, "PYTHONPATH": str(Path(a.baseline).resolve())}
                res = subprocess.run([sys.executable, __file__, "--call-only", str(path), str(x.shape[1]), str(t),
                                      "--number", str(a.number), "--repeat", str(a.repeat)],
                                     env=env, capture_output=True, text=True, check=True, cwd=a.baseline)
                r["baseline"], r["baseline_cpu"] = json.loads(res.stdout.strip().splitlines()[-1])
                r["baseline_overhead"] = (r["baseline_cpu"] - r["functions_cpu"]) / r["steps"]
            rows.append((name, t, r))
            base = (f" | before: call {r['baseline_cpu']:8.1f} us, {r['baseline_overhead']:6.2f} us/step"
                    if "baseline" in r else "")
            print(f"{name:26s} T={t} steps={r['steps']:4d} CPU µs: call={r['call_cpu']:8.1f} "
                  f"bound={r['bound_cpu']:8.1f} functions={r['functions_cpu']:8.1f} overhead={r['overhead']:6.2f}"
                  f" us/step (wall call {r['call']:.1f}){base}", flush=True)
    if a.out:
        from codegen.cpu import _host
        h = _host()
        head = ("| model | threads | steps | call µs | bound kernels µs | functions µs | overhead µs/step "
                "| call µs wall |")
        if a.baseline:
            head += " before: call µs | before: overhead µs/step | before: call µs wall |"
        lines = [f"\n### {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {h['cpu']} ({h['cores']} cores "
                 f"this process may use), numba {h['numba']}, Python {sys.version.split()[0]}; "
                 f"{a.repeat} rounds of {a.number} calls, medians, CPU time unless marked wall\n", head,
                 "|" + "---|" * (head.count("|") - 1)]
        for n, t, r in rows:
            line = (f"| {n} | {t} | {r['steps']} | {r['call_cpu']:.1f} | {r['bound_cpu']:.1f} | "
                    f"{r['functions_cpu']:.1f} | {r['overhead']:.2f} | {r['call']:.1f} |")
            if "baseline" in r:
                line += f" {r['baseline_cpu']:.1f} | {r['baseline_overhead']:.2f} | {r['baseline']:.1f} |"
            lines.append(line)
        with open(a.out, "a") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

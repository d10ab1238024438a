"""Memory-bound templates in GB/s (bytes read + written / time) vs a NumPy copy of as many bytes
(the bandwidth ceiling: the faster of np.copyto and a numba copy loop; one thread), at 1 and 2 kernel threads, plus onnxruntime (one-node
models, same threads): Softmax and LayerNormalization rows of (128, 256) and (128, 1024), a
12-op elementwise chain (Tanh, Sigmoid...), the attention Transpose (0, 2, 1, 3), a 2x
nearest / linear Resize and ViT's mean over the tokens (ReduceMean over a middle axis). Ours: the template's default config (what untuned models run) and the
best of the listed code configs x run-time RB x parallel (on/off: for small work, waking a
thread costs more than it saves).

Run: python experiments/bench_memory_bound.py [--quick] [--one-thread] [--aligned] [--base REV] [--only TEXT]
     (writes bench_memory_bound.md/.png; --base: the default config of commit REV's templates timed
     in the same turns, column "before", and writes nothing; --only: the workloads whose name
     contains TEXT, printed, nothing written; --aligned: ours' inputs and output start at 64-byte
     boundaries, which np.empty's (and the executor's arena's) large arrays do not)
     python experiments/bench_memory_bound.py --vs-base REV   (prints the kernels this branch changed
     against the templates of commit REV, side by side; writes nothing)
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

os.environ.pop("OPENBLAS_CORETYPE", None)
os.environ.pop("OPENBLAS_L2_SIZE", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from codegen import compile_kernel  # noqa: E402
from bench_conv import clock_for, machine, timeit  # noqa: E402
from schedules import get_template  # noqa: E402
from ir.settings import Settings, use  # noqa: E402
from tests.template_cases import make_wl, precompile  # noqa: E402

CHAIN = [("Mul", "i1"), ("Add", "i2"), ("Tanh", None), ("Mul", "i1"), ("Sub", "i2"), ("Relu", None),
         ("Mul", "i1"), ("Add", "i2"), ("Sigmoid", None), ("Mul", "i1"), ("Add", "i2"), ("Abs", None)]
THREADS = (1, 2)
TARGET = 0.5   # issue 13: memory-bound kernels at >= 50 % of the machine's copy bandwidth


def cases():
    """(name, template, workload, input arrays or None, code configs)."""
    out = []
    for rows, cols in ((128, 256), (128, 1024)):
        out.append((f"Softmax {rows}x{cols}", "reduce", make_wl([("Softmax", ["i0"], {"axis": -1})], [((rows, cols), "float32", False)]),
                    None, [{"cache": c} for c in (True, False)]))   # one pass: LLVM's lanes (reduce v7)
        out.append((f"LayerNorm {rows}x{cols}", "reduce", make_wl(
            [("LayerNormalization", ["i0", "i1", "i2"], {"axis": -1})],
            [((rows, cols), "float32", False), ((cols,), "float32", True), ((cols,), "float32", True)]),
            None, [{}]))   # one pass: no lanes knob (reduce v5)
    ops, prev = [], "i0"
    for k, (op, arg) in enumerate(CHAIN):
        ops.append((op, [prev] + ([arg] if arg else []), {}))
        prev = f"t{k}"
    out.append((f"{len(CHAIN)}-op elementwise chain 4Mi", "elementwise", make_wl(
        ops, [((2048, 2048), "float32", False), ((), "float32", True), ((), "float32", True)]),
        None, [{"vector": "flat", "unroll": 1}]))
    out.append(("Transpose 0213 (8,12,128,64)", "elementwise", make_wl(
        [("Transpose", ["i0"], {"perm": [0, 2, 1, 3]})], [((8, 12, 128, 64), "float32", False)]),
        None, [{"vector": "last", "unroll": u} for u in (1, 4)]))
    x = np.random.default_rng(0).standard_normal((1, 64, 56, 56)).astype(np.float32)
    for mode in ("nearest", "linear"):
        arrays = [x, np.zeros(0, np.float32), np.array([1, 1, 2, 2], np.float32)]
        out.append((f"Resize {mode} 2x (1,64,56,56)", "elementwise", make_wl(
            [("Resize", ["i0", "i1", "i2"], {"mode": mode})],
            [(x.shape, "float32", False), ((0,), "float32", True), ((4,), "float32", True)], arrays),
            arrays, [{"vector": "last", "unroll": 1}]))
    out.append(("BERT emb Add+Add+LayerNorm (1,32,128)", "reduce", make_wl(   # position rows (32,128) + type row
        [("Add", ["i0", "i1"], {}), ("Add", ["t0", "i2"], {}), ("LayerNormalization", ["t1", "i3", "i4"], {"axis": -1})],
        [((1, 32, 128), "float32", False), ((32, 128), "float32", False), ((128,), "float32", True),
         ((128,), "float32", True), ((128,), "float32", True)]), None, [{}]))
    out.append(("ReduceMean axes=[1] (1,197,192)", "reduce", make_wl(
        [("ReduceMean", ["i0"], {"axes": [1], "keepdims": 0})], [((1, 197, 192), "float32", False)]),
        None, [{"unroll": u} for u in (1, 4, 8)]))
    return out


def ort_session(wl, arrays, threads):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    names = {f"i{k}": f"x{k}" for k in range(len(wl.inputs))}
    nodes, inits = [], []
    for k, o in enumerate(wl.ops):
        nodes.append(helper.make_node(o["op"], [names.get(r, r) for r in o["in"]], [f"t{k}"], **o["attrs"]))
    for k, spec in enumerate(wl.inputs[1:], start=1):
        inits.append(numpy_helper.from_array(np.asarray(arrays[k]), f"x{k}"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, list(wl.inputs[0]["shape"]))],
                          [helper.make_tensor_value_info(f"t{len(wl.ops) - 1}", TensorProto.FLOAT, None)], inits)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def copy_functions():
    """The copy baseline: np.copyto and a numba copy loop; each round takes the faster (glibc's
    memcpy ran 128 KiB at 3.8 GB/s and 512 KiB at 48 GB/s on this VM: a copy of the machine's
    bandwidth, not of one size's memcpy path)."""
    import numba

    @numba.njit("void(float32[::1], float32[::1])", nogil=True)
    def loop_copy(src, dst):
        for i in range(src.shape[0]):
            dst[np.uint64(i)] = src[np.uint64(i)]

    return lambda src, dst: (lambda: np.copyto(dst, src), lambda: loop_copy(src, dst))


def planned(bound, arrays, out):
    """The kernel as the executor runs it: its launch planned once for these buffers (arguments
    that cannot be fixed, such as an input broadcast at launch, filled on each call)."""
    plan = bound.plan(arrays, out)
    calls = plan.calls

    def run():
        for fn, args in calls:
            fn(*args)

    def run_filled():
        for fn, args in plan.fill(arrays, out):
            fn(*args)
    return run_filled if plan.dynamic else run


BASE_TEMPLATES = {"reduce": ("schedules/templates/reduce.py", "ReduceTemplate"),
                  "elementwise": ("schedules/templates/elementwise.py", "ElementwiseTemplate")}


ALIGNED = False   # --aligned: ours' inputs and output at 64-byte boundaries (np.empty's large arrays are 16 or 48 past one)


def at_64(a: np.ndarray) -> np.ndarray:
    """A copy of `a` that starts at a 64-byte boundary (a cache line: no vector access of the
    kernel's rows splits one). On this Xeon a 512 KB output 16 bytes off halved LayerNorm
    128x1024's speed (zmm stores across lines)."""
    raw = np.empty(a.nbytes + 64, np.uint8)
    k = (-raw.ctypes.data) % 64
    out = raw[k:k + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def measure(settings, all_cases, min_time, rounds=5, base=None):
    """{workload: (MB moved, {what: seconds}, best configs)}. The best listed config per thread
    count is searched first; then copy, ours (default config and best) and onnxruntime are timed
    in turns, `rounds` times, each keeping its median: other work on the cores then weighs on
    all of them alike. One thread: CPU time of this thread; two: wall time."""
    res = {}
    copies = copy_functions()
    for name, tname, wl, given, codes in all_cases:
        t = get_template(tname)
        arrays = given if given is not None else wl.random_inputs(0)
        out = np.empty(wl.output_shape, np.float32)
        if ALIGNED:
            arrays, out = [at_64(np.asarray(a)) for a in arrays], at_64(out)
        nbytes = arrays[0].nbytes + out.nbytes
        src = np.ones(nbytes // 8, np.float32)   # a copy moves as many bytes (read + write)
        dst = np.empty_like(src)
        fns, configs = {}, {}
        for threads in THREADS:
            use(dataclasses.replace(settings, threads=threads))
            clock = clock_for(threads)
            default = t.default_config(wl)
            run = planned(compile_kernel(t, wl, default).bind(arrays), arrays, out)
            run()
            np.testing.assert_allclose(out, wl.reference(arrays), rtol=1e-4, atol=1e-5)
            fns[("default", threads)] = run
            if base is not None and threads == 1:   # the base commit's template, its default config
                old = base_template(base, *BASE_TEMPLATES[tname])
                fns[("before", 1)] = planned(compile_kernel(old, wl, old.default_config(wl)).bind(arrays), arrays, out)
                fns[("before", 1)]()
                np.testing.assert_allclose(out, wl.reference(arrays), rtol=1e-4, atol=1e-5)
            best = (float("inf"), "", None)
            space = t.space(wl)
            rbs = next(k for k in space.knobs if k.name == "RB").options
            for c in codes:
                for par in (True, False) if threads > 1 else (False,):
                    for rb in rbs:
                        cfg = space.validate({**default.to_json(), **c, "RB": rb, "parallel": par})
                        run = planned(compile_kernel(t, wl, cfg).bind(arrays), arrays, out)
                        run()
                        np.testing.assert_allclose(out, wl.reference(arrays), rtol=1e-4, atol=1e-5)
                        tm = min(timeit(run, min_time=min_time / 2, repeat=3, clock=clock))
                        if tm < best[0]:
                            best = (tm, " ".join(f"{k}={v}" for k, v in {**c, "RB": rb, "par": par}.items()), run)
            fns[("best", threads)], configs[threads] = best[2], best[1]
            try:
                sess = ort_session(wl, arrays, threads)
                fns[("ort", threads)] = (lambda s: lambda: s.run(None, {"x0": arrays[0]}))(sess)
            except Exception as e:   # an op/attribute onnxruntime does not take as built here
                print(f"  onnxruntime: {type(e).__name__}: {str(e)[:120]}", flush=True)
        use(settings)
        samples = {}
        for _ in range(rounds):
            for threads in THREADS:
                clock = clock_for(threads)
                samples.setdefault(("copy", threads), []).append(
                    min(min(timeit(f, min_time=min_time / 2, repeat=3, clock=clock)) for f in copies(src, dst)))
                for what in ("before", "default", "best", "ort"):
                    if (what, threads) in fns:
                        samples.setdefault((what, threads), []).append(
                            min(timeit(fns[(what, threads)], min_time=min_time, repeat=3, clock=clock)))
        med = {k: float(np.median(v)) for k, v in samples.items()}
        res[name] = (nbytes / 1e6, med, configs)
        print(name, res[name], flush=True)
    return res


def report(res, note, base=None, write=True):
    lines = ["# Memory-bound templates: GB/s vs a copy of as many bytes", "", machine(), "", note, "",
             "GB/s = (input + output bytes) / median time. Copy, ours and onnxruntime are timed in turns "
             "(5 rounds, medians of each round's least); `copy` = the faster of np.copyto and a numba copy "
             "loop moving as many bytes (read + write), one thread. One thread: this thread's CPU time "
             "(leaves out the time other processes took the core away: the fairer figure on shared cores); "
             "two: wall time. Ours runs as the executor runs it (the launch planned once for the buffers). "
             "`default`: the template's default config (what an untuned model runs); `best`: the best of "
             "the listed code configs x run-time RB x parallel on/off. onnxruntime: a one-node model, "
             "intra_op_num_threads = threads. Target (issue 13): ours / copy >= 0.5.", "",
             "| workload | MB moved | copy GB/s T=1 | " + (f"before ({base[:8]}) default/copy T=1 | " if base else "")
             + "default/copy T=1 | best/copy T=1 | ORT/copy T=1 | "
             "default/copy T=2 | best/copy T=2 | ORT/copy T=2 | best config T=1 / T=2 |",
             "| --- | ---: | ---: | " + ("---: | " if base else "") + "---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, (mb, med, configs) in res.items():
        r = {k: med[("copy", k[1])] / v for k, v in med.items() if k[0] != "copy"}
        cell = lambda k: f"{r[k]:.2f}" if k in r else "-"  # noqa: E731
        lines.append(f"| {name} | {mb:.2f} | {mb / 1e3 / med[('copy', 1)]:.1f} | "
                     + (f"{cell(('before', 1))} | " if base else "") + f"{cell(('default', 1))} | "
                     f"{cell(('best', 1))} | {cell(('ort', 1))} | {cell(('default', 2))} | {cell(('best', 2))} | "
                     f"{cell(('ort', 2))} | {configs.get(1, '-')} / {configs.get(2, '-')} |")
    md = Path(__file__).with_suffix(".md")
    print("\n".join(lines))
    if base is not None or not write:   # a before/after or partial run: printed for the results file's dated sections
        return
    md.write_text("\n".join(lines) + "\n" + NOTES)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(res)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    w = 0.16
    series = [("ours default T=1", ("default", 1)), ("ours best T=1", ("best", 1)), ("ours best T=2", ("best", 2)),
              ("ORT T=1", ("ort", 1)), ("ORT T=2", ("ort", 2))]
    for j, (label, key) in enumerate(series):
        vals = [res[n][1][("copy", key[1])] / res[n][1][key] if key in res[n][1] else 0 for n in names]
        ax.bar(np.arange(len(names)) + (j - 2) * w, vals, w, label=label)
    ax.axhline(TARGET, color="k", ls="--", lw=1, label="target 0.5")
    ax.set_xticks(np.arange(len(names)), names, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("GB/s / copy GB/s")
    ax.set_title("memory-bound kernels vs a copy of as many bytes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(md.with_suffix(".png"), dpi=110)


NOTES = ""   # the hand-written reading of a run goes below the table, after the run


def base_template(rev: str, path: str, cls: str):
    """The template class of `path` as commit `rev` has it, not registered (its old code, built
    beside this branch's in one process)."""
    import subprocess
    import types
    src = subprocess.check_output(["git", "-C", str(Path(__file__).resolve().parents[1]), "show", f"{rev}:{path}"], text=True)
    mod = types.ModuleType(f"base_{cls}")
    sys.modules[mod.__name__] = mod   # dataclasses look their module up
    exec(compile(src.replace("register_template(", "(lambda t: t)("), f"{rev}:{path}", "exec"), mod.__dict__)
    return getattr(mod, cls)()


def vs_base(rev: str, rounds: int = 7):
    """Issue 13's profile (untuned models vs onnxruntime, 1 thread) found ViT's ReduceMean over the
    tokens on the NumPy reference path and BERT's embedding Gather 4.6x onnxruntime: each before
    (`rev`'s template, or the reference step where no template matched) and after, and onnxruntime
    (a one-node session), timed in turns, this thread's CPU time at one thread, medians."""
    import time
    from ir.ops import get_op
    use(dataclasses.replace(Settings.from_env(), threads=1))
    clock = time.thread_time
    rows = []

    def bench(name, fns):
        s = {k: [] for k in fns}
        for _ in range(rounds):
            for k, f in fns.items():
                s[k].append(min(timeit(f, min_time=0.05, repeat=3, clock=clock)))
        med = {k: float(np.median(v)) * 1e6 for k, v in s.items()}
        rows.append((name, med))
        print(name, ", ".join(f"{k} {v:.2f} us" for k, v in med.items()), flush=True)

    x = np.random.default_rng(0).standard_normal((1, 197, 192)).astype(np.float32)
    axes = np.array([1], np.int64)   # opset 18: the axes an input, as torch exports them
    wl = make_wl([("ReduceMean", ["i0", "i1"], {"keepdims": 0})], [(x.shape, "float32", False), ((1,), "int64", True)],
                 [x, axes])
    red = get_template("reduce")
    out = np.empty(wl.output_shape, np.float32)
    after = planned(compile_kernel(red, wl, red.default_config(wl)).bind([x, axes]), [x, axes], out)
    after()
    np.testing.assert_allclose(out, x.mean(1), rtol=1e-5, atol=1e-6)
    node = wl.nodes()[0]
    ref, ref_out = get_op(node.op, node).ref, np.empty_like(out)
    before = lambda: np.copyto(ref_out, ref(node, [x, axes])[0])  # noqa: E731  (the executor's reference step)
    sess = ort_session(make_wl([("ReduceMean", ["i0"], {"axes": [1], "keepdims": 0})], [(x.shape, "float32", False)]),
                       [x], 1)
    bench("ReduceMean axes=[1] (1,197,192)", {"before (reference)": before, "after": after,
                                               "onnxruntime": lambda: sess.run(None, {"x0": x})})
    new, old = get_template("elementwise"), base_template(rev, "schedules/templates/elementwise.py", "ElementwiseTemplate")
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    for vocab, hidden, seq in ((1000, 128, 32), (30522, 256, 128)):
        table = np.random.default_rng(1).standard_normal((vocab, hidden)).astype(np.float32)
        ids = np.random.default_rng(2).integers(0, vocab, (1, seq)).astype(np.int64)
        wl = make_wl([("Gather", ["i0", "i1"], {"axis": 0})],
                     [(table.shape, "float32", True), (ids.shape, "int64", False)], [table, ids])
        fns = {}
        for label, t in ((f"before ({rev[:8]})", old), ("after", new)):
            o = np.empty(wl.output_shape, np.float32)
            fns[label] = planned(compile_kernel(t, wl, t.default_config(wl)).bind([table, ids]), [table, ids], o)
            fns[label]()
            np.testing.assert_array_equal(o, table[ids])
        g = helper.make_graph([helper.make_node("Gather", ["t", "ids"], ["y"], axis=0)], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, list(ids.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(table, "t")])
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                                    so, providers=["CPUExecutionProvider"])
        fns["onnxruntime"] = (lambda s, i: lambda: s.run(None, {"ids": i}))(sess, ids)
        bench(f"Gather ({vocab},{hidden}) by ids (1,{seq})", fns)
    print(f"{machine()}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared)")
    return rows


def main():
    if "-h" in sys.argv or "--help" in sys.argv:
        print(__doc__)
        return
    if "--vs-base" in sys.argv:
        vs_base(sys.argv[sys.argv.index("--vs-base") + 1])
        return
    quick = "--quick" in sys.argv
    base = sys.argv[sys.argv.index("--base") + 1] if "--base" in sys.argv else None
    global THREADS, ALIGNED
    ALIGNED = "--aligned" in sys.argv
    if "--one-thread" in sys.argv:
        THREADS = (1,)
    settings = Settings.from_env()
    use(settings)
    all_cases = cases()
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    if only is not None:
        all_cases = [c for c in all_cases if only in c[0]]
        if not all_cases:
            raise SystemExit(f"--only {only!r}: no workload's name contains it")
    by_template = {}
    for name, tname, wl, given, codes in all_cases:
        t = get_template(tname)
        by_template.setdefault(tname, []).extend(
            (wl, t.space(wl).validate({**t.default_config(wl).to_json(), **c})) for c in codes)
    for threads in THREADS:   # the target (hence the kernel's source key) names the thread count
        use(dataclasses.replace(settings, threads=threads))
        for tname, ps in by_template.items():
            precompile(tname, ps)
    use(settings)
    res = measure(settings, all_cases, 0.05 if quick else 0.1, base=base)
    load = os.getloadavg()[0]
    report(res, f"Load average when the run ended: {load:.1f} on {os.cpu_count()} cores (other helpers' work shared them).",
           base, write=only is None)


if __name__ == "__main__":
    main()

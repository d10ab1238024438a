"""Compile time per code shape, and a cold ResNet-18 first call, this checkout vs a baseline.

For each model (ResNet-18-style at 224, BERT-small-style at seq 128, MobileNetV2-style at 96;
batch 1; builders in tests/models.py and experiments/models/) the distinct kernels of its
untuned program (default configs, one per distinct source) are compiled one after the other
in a fresh process with an empty kernel cache, as a cold model's first call compiles them:
per code shape the wall and CPU seconds of `backend.compile(module)`. A function already
compiled for an earlier code shape of the same model (this checkout: helpers such as padding
and weight packing have their own cache entries) is not compiled again, so the figures are
what a cold model pays per code shape; a module all of whose functions were compiled before
(e.g. a blocked conv that differs from another only in its residual, a run-time flag) is no
code shape of its own. The `--speed` largest kernels of each model are also
timed (1 thread) so that faster compiles are seen not to cost run time.

`--baseline DIR` (a checkout of an older commit, e.g. `git archive <commit> | tar -x -C DIR`)
runs the same measurement with that code, model by model, side by side with this one. With
`--cold`, ResNet-18's first call (`runtime.load` + `model.run`, fresh TENSORTUNE_CACHE, which
compiles on worker processes when the machine has 2+ cores) is timed for both.

Run: PYTHONPATH=. python experiments/bench_compile.py [--baseline /tmp/base] [--models resnet18 bert mobilenet]
     [--cold] [--speed 3] [--out experiments/bench_compile.md]
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

MODELS = {   # name -> (label, sizes)
    "resnet18": ("ResNet-18-style (224x224)", {"batch": 1}),
    "bert": ("BERT-small-style (4 layers, 256 hidden, seq 128)", {"batch": 1, "seq": 128}),
    "mobilenet": ("MobileNetV2-style (96x96, 5 blocks)", {"batch": 1}),
}


def write_model(name: str, work: Path) -> Path:
    """The model's ONNX file in `work` (written by this checkout's builders, used by both sides)."""
    import onnx
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(HERE / "models"))
    path = work / f"{name}.onnx"
    if not path.exists():
        if name == "resnet18":
            from models import make_resnet18
            m = make_resnet18(image=224)
        elif name == "bert":
            from models import make_bert
            m = make_bert()
        else:
            from make_mobilenet import make_mobilenet
            m = make_mobilenet()
        onnx.save(m, path)
    return path


class _Collected(Exception):
    pass


def model_jobs(path: Path, sizes: dict) -> list:
    """(template, workload, config) of every kernel the untuned program of `path` runs, in order."""
    import runtime
    from runtime.executor import CompiledModel
    seen = []

    def collect(self, jobs):
        seen.extend(jobs)
        raise _Collected
    CompiledModel._precompile = collect
    model = runtime.load(str(path))
    try:
        model.prepare(sizes)
    except _Collected:
        pass
    return seen


def _function_texts(module) -> set | None:
    """The sources `module`'s functions compile from (`codegen.build.parts_for` keys its files by
    them), or None in a checkout that compiles whole modules."""
    try:
        from codegen.source import render_function
    except ImportError:
        return None
    return {render_function(f, lean=True) for f in module.functions}


def _warm_up(backend) -> None:
    """numba's one-time start-up (first compile in a process), paid before the timed compiles."""
    from schedules.registry import get_template
    from tests.template_cases import make_wl
    t = get_template("elementwise")
    wl = make_wl([("Neg", ["i0"], {})], [((3, 5), "float32", False)])
    backend.compile(t.lower(wl, t.default_config(wl)).module)


def _plain_functions(module) -> dict | None:
    """`module`'s functions compiled as before this change (plain source, numba's default
    pipeline; exec'd, no cache), or None in a checkout without the lean path."""
    import types
    try:
        from codegen.source import HEADER, render
        src = render(module, "", HEADER, lean=False)
    except TypeError:
        return None
    src = (src.replace("cache=True", "cache=False").replace(", no_cfunc_wrapper=True", "")
           .replace(", pipeline_class=LeanCompiler", ""))
    mod = types.ModuleType("bench_compile_plain")
    exec(compile(src, "<plain>", "exec"), mod.__dict__)
    return {f.name: getattr(mod, f.name) for f in module.functions}


def _time_kernels(template, wl, cfg, artifact, backend) -> tuple[float, float | None]:
    """Median seconds of one call (1 thread, check inputs) of the compiled kernel and, where this
    checkout has it, of the same module compiled the plain way: 7 interleaved rounds."""
    from codegen.backend import Artifact
    from codegen.kernel import BoundKernel, Kernel, prepare
    from ir import accuracy
    low = template.lower(wl, cfg)
    arrays = accuracy.check_inputs(wl, 0)[0]
    kernels = [Kernel(wl, template.name, cfg, low, artifact).bind(arrays, backend)]
    plain = _plain_functions(low.module)
    if plain is not None:   # same packed constants, workspaces and output: only the code differs
        fixed = _FixedFunctions(plain)
        k = Kernel(wl, template.name, cfg, low, Artifact("cpu", "plain", "", "", tuple(plain)))
        kernels.append(BoundKernel(k, kernels[0].state, fixed))
    work, out = kernels[0].own_work(), kernels[0](arrays)
    lat = [[] for _ in kernels]
    for _ in range(7):
        for i, bk in enumerate(kernels):
            lat[i].append(bk.backend.time(lambda: bk(arrays, out, work), 3, 1, 0.0)[0][0])
    med = [statistics.median(x) for x in lat]
    return med[0], (med[1] if len(med) > 1 else None)


def compile_model(name: str, path: Path, speed: int) -> dict:
    """Run in a fresh process with an empty cache: compile each distinct kernel, timed."""
    from codegen.backend import get_backend
    from ir.settings import Settings, use
    use(Settings.from_env().with_(threads=1))
    backend = get_backend("cpu")
    jobs = model_jobs(path, MODELS[name][1])
    distinct = {}
    for template, wl, cfg in jobs:
        module = template.lower(wl, cfg).module
        distinct.setdefault(backend.source_key(module), (template, wl, cfg, module))
    _warm_up(backend)
    rows, compiled = [], set()
    for key, (template, wl, cfg, module) in distinct.items():
        texts = _function_texts(module)
        if texts is not None and texts <= compiled:
            continue   # every function compiled for an earlier module (their files are keyed by their own source)
        compiled |= texts or set()
        t0, c0 = time.perf_counter(), time.process_time()
        art = backend.compile(module)
        rows.append({"template": template.name, "what": module.doc.split(":")[-1].strip()[:90] if module.doc else "",
                     "functions": len(module.functions), "wall": time.perf_counter() - t0,
                     "cpu": time.process_time() - c0, "flops": float(wl.flops()), "key": key,
                     "_job": (template, wl, cfg, art)})
    for r in sorted(rows, key=lambda r: -r["flops"])[:speed]:
        template, wl, cfg, art = r["_job"]
        r["run_s"], r["plain_run_s"] = _time_kernels(template, wl, cfg, art, backend)
    for r in rows:
        del r["_job"]
    return {"kernels": len(jobs), "rows": rows}


def cold_call(path: Path, sizes: dict) -> dict:
    """Run in a fresh process with an empty cache: load the model and time its first call
    (wall, and CPU seconds of this process and of the compile workers it waited for)."""
    import resource

    import runtime
    from ir.settings import Settings, use
    from runtime.cli import random_feeds
    use(Settings.from_env())   # the fresh TENSORTUNE_CACHE run_side made (the library reads no env itself)
    t0 = time.perf_counter()
    model = runtime.load(str(path))
    feeds = random_feeds(model.graph, sizes, seed=0)
    model.run(feeds)
    first = time.perf_counter() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = {"main_cpu_s": time.process_time(), "workers_cpu_s": children.ru_utime + children.ru_stime}
    t0 = time.perf_counter()
    model.run(feeds)
    return {"first_s": first, "second_s": time.perf_counter() - t0, "compiles": model.stats.get("compiles"),
            "load": os.getloadavg()[0], **cpu}


ABLATION = [   # cumulative: (label, lean printer text, lean_options that are switched to lean, no cfunc wrapper)
    ("numba defaults, plain source (before)", False, (), False),
    ("+ printer: hoisted constants, row views", True, (), False),
    ("+ no cfunc wrapper", True, (), True),
    ("+ no SSA reconstruction", True, ("ssa",), True),
    ("+ closure inlining only where closures are made", True, ("ssa", "closures"), True),
    ("+ builtin call typings remembered", True, ("ssa", "closures", "retype_calls"), True),
    ("+ LLVM function passes at -O1, no vectorizers (all of it: this checkout)", True,
     ("ssa", "closures", "retype_calls", "function_passes"), True),
]


def ablation(reps: int) -> list:
    """CPU seconds to compile the ResNet-18 3x3 conv (64 ch, 56x56, + Relu, default config), per
    step of ABLATION, cumulative; in this process, without numba's cache (exec'd source),
    variants interleaved, `reps` rounds. Returns [(label, median s, min s, run ms)]."""
    import types

    import numpy as np

    from codegen import numba_pipeline
    from codegen.source import HEADER, render
    from ir import accuracy
    from schedules.registry import get_template
    from tests.template_cases import conv_wl
    wl = conv_wl(1, 64, 56, 56, 64, epi=("relu",))
    t = get_template("conv2d")
    cfg = t.default_config(wl)
    low = t.lower(wl, cfg)
    saved = dict(numba_pipeline.lean_options)

    def source(lean_text, cfunc_off):
        src = render(low.module, "", HEADER, lean=lean_text).replace("cache=True", "cache=False")
        if not cfunc_off:
            src = src.replace(", no_cfunc_wrapper=True", "")
        return src
    times = {a[0]: [] for a in ABLATION}
    fns = {}
    for r in range(reps):
        for label, lean_text, lean, cfunc_off in ABLATION:
            for k in numba_pipeline.lean_options:
                numba_pipeline.lean_options[k] = k not in lean
            if not lean and not cfunc_off:
                src = source(lean_text, cfunc_off).replace(", pipeline_class=LeanCompiler", "")
            else:
                src = source(lean_text, cfunc_off)
            mod = types.ModuleType(f"ablation_{r}_{len(fns)}")
            c0 = time.process_time()
            exec(compile(src, f"<ablation {label}>", "exec"), mod.__dict__)
            times[label].append(time.process_time() - c0)
            fns[label] = {f.name: getattr(mod, f.name) for f in low.module.functions}
    numba_pipeline.lean_options.update(saved)
    arrays = accuracy.check_inputs(wl, 0)[0]
    expected = accuracy.reference(wl, arrays)
    from codegen.backend import Artifact
    from codegen.kernel import BoundKernel, Kernel, prepare
    bound, state, work, out = {}, None, None, None
    for label, *_ in ABLATION:   # every variant on the same packed constants, workspaces and output
        backend = _FixedFunctions(fns[label])
        k = Kernel(wl, "conv2d", cfg, low, Artifact("cpu", label, "", "", tuple(fns[label])))
        bound[label] = bk = BoundKernel(k, state or prepare(k, arrays, backend), backend)
        state, work = bk.state, work or bk.own_work()
        out = bk(arrays, out, work)
        assert np.allclose(out, expected, rtol=1e-3, atol=1e-3), label
    run = {label: [] for label in bound}
    for _ in range(7):   # interleaved: the neighbours' load hits every variant alike
        for label, bk in bound.items():
            lat, _ = bk.backend.time(lambda: bk(arrays, out, work), 3, 1, 0.0)
            run[label].append(lat[0])
    return [(label, statistics.median(times[label]), min(times[label]), statistics.median(run[label]) * 1e3)
            for label, *_ in ABLATION]


def _FixedFunctions(functions: dict):
    """The CPU backend (1 thread) whose `load` hands out `functions` (compiled outside the cache)."""
    from codegen.cpu import CpuBackend
    from ir.settings import Settings

    class Fixed(CpuBackend):
        def load(self, artifact):
            return functions
    return Fixed(Settings.from_env().with_(threads=1))


def run_side(code: Path, mode: str, name: str, path: Path, speed: int, timeout: float) -> dict:
    """`mode` ("compile" or "cold") of model `name` in a subprocess running the code in `code`."""
    with tempfile.TemporaryDirectory(prefix="bench_compile_") as cache:
        os.chmod(cache, 0o700)
        env = {**os.environ, "PYTHONPATH": str(code), "TENSORTUNE_CACHE": str(Path(cache) / "tt")}
        env.pop("NUMBA_CACHE_DIR", None)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--side", mode, name, str(path), "--speed", str(speed)]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, env=env, cwd=code, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        if p.returncode != 0:
            return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
        out = json.loads(p.stdout.strip().splitlines()[-1])
        out["process_s"] = time.perf_counter() - t0
        return out


def stats(rows: list, field: str) -> tuple[float, float, float]:
    xs = [r[field] for r in rows]
    return statistics.median(xs), min(xs), max(xs)


def _machine() -> str:
    from codegen.cpu import _host
    h = _host()
    load = os.getloadavg()[0]
    return (f"{h['cpu']} ({h['cpu_name']}), {h['cores']} cores shared with other jobs (load average "
            f"{load:.1f} at the start), numba {h['numba']}, Python {sys.version.split()[0]}")


def report(results: dict, cold: dict | None, baseline: str | None, machine: str) -> str:
    lines = [f"\n### {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {machine}\n"]
    if baseline:
        lines.append(f"Before: `{baseline}`; after: this checkout; each model's two sides run one after the "
                     "other in fresh processes with empty kernel caches. Seconds per distinct code shape "
                     "(one loop module: a kernel's functions), median / min / max.\n")
    head = "| model | side | code shapes (kernels) | functions | compile s wall: median / min / max | " \
           "compile s CPU: median / min / max | total CPU s |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for name, sides in results.items():
        for side, r in sides.items():
            if "error" in r:
                lines.append(f"| {MODELS[name][0]} | {side} | error: {r['error']} | | | | |")
                continue
            rows = r["rows"]
            w, c = stats(rows, "wall"), stats(rows, "cpu")
            lines.append(f"| {MODELS[name][0]} | {side} | {len(rows)} ({r['kernels']}) | "
                         f"{sum(x['functions'] for x in rows)} | {w[0]:.2f} / {w[1]:.2f} / {w[2]:.2f} | "
                         f"{c[0]:.2f} / {c[1]:.2f} / {c[2]:.2f} | {sum(x['cpu'] for x in rows):.1f} |")
    speed = []
    for name, sides in results.items():
        for x in sides.get("after", {}).get("rows", []):
            if x.get("plain_run_s"):
                speed.append(f"| {MODELS[name][0]} | {x['template']}: {x['what']} | {x['plain_run_s'] * 1e3:.3f} | "
                             f"{x['run_s'] * 1e3:.3f} | {x['plain_run_s'] / x['run_s']:.2f} |")
    if speed:
        lines += ["", "Kernel run time, 1 thread, median of 7 interleaved rounds of 3 calls, in the 'after' process: "
                  "the module compiled as before (plain source, numba's default pipeline) vs as now "
                  "(before/after > 1: after is faster):", "",
                  "| model | kernel | before ms | after ms | before/after |", "|---|---|---|---|---|"] + speed
    if cold:
        lines += ["", "ResNet-18-style (224) first call with an empty kernel cache (`runtime.load` + first "
                  "`run`, compiles on worker processes):", "",
                  "| side | first call s (wall) | CPU s: main process + compile workers | compiles | "
                  "load average after |", "|---|---|---|---|---|"]
        for side, r in cold.items():
            if "error" in r:
                lines.append(f"| {side} | error: {r['error']} | | | |")
            else:
                lines.append(f"| {side} | {r['first_s']:.1f} | {r['main_cpu_s']:.1f} + {r['workers_cpu_s']:.1f} | "
                             f"{r['compiles']} | {r['load']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--baseline", default=None, help="a checkout of an older commit: the 'before' side")
    ap.add_argument("--cold", action="store_true", help="also time ResNet-18's first call with a cold cache")
    ap.add_argument("--speed", type=int, default=3, help="time this many of each model's largest kernels")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per side and model")
    ap.add_argument("--out", default=None, help="append the Markdown tables to this file")
    ap.add_argument("--ablation", type=int, default=0, metavar="ROUNDS",
                    help="only: compile the ResNet 3x3 conv with each idea added in turn, ROUNDS rounds")
    ap.add_argument("--side", nargs=3, metavar=("MODE", "MODEL", "PATH"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.side:
        mode, name, path = a.side
        out = compile_model(name, Path(path), a.speed) if mode == "compile" else cold_call(Path(path), MODELS[name][1])
        print(json.dumps(out))
        return 0
    machine = _machine()
    if a.ablation:
        rows = ablation(a.ablation)
        text = (f"\n### {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: ablation, {machine}\n\n"
                f"ResNet-18 3x3 conv (64 ch, 56x56, + Relu), default config (3 functions); CPU s to compile, "
                f"{a.ablation} interleaved rounds, numba's cache off; kernel run time 1 thread, 7 interleaved rounds of 3 calls, median.\n\n"
                "| step (cumulative) | compile CPU s median | min | kernel ms |\n|---|---|---|---|\n"
                + "".join(f"| {lab} | {m:.2f} | {lo:.2f} | {ms:.3f} |\n" for lab, m, lo, ms in rows))
        print(text)
        if a.out:
            with open(a.out, "a") as f:
                f.write(text)
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench_compile_models_"))
    sides = [("before", Path(a.baseline).resolve())] if a.baseline else []
    sides.append(("after", ROOT))
    results = {}
    for name in a.models:
        path = write_model(name, work)
        results[name] = {}
        for side, code in sides:
            r = results[name][side] = run_side(code, "compile", name, path, a.speed if side == "after" else 0,
                                               a.timeout)
            if "rows" in r:
                m, lo, hi = stats(r["rows"], "cpu")
                print(f"{name:10s} {side:6s} {len(r['rows'])} code shapes: CPU s per shape median {m:.2f} "
                      f"(min {lo:.2f}, max {hi:.2f}), total {sum(x['cpu'] for x in r['rows']):.1f}", flush=True)
            else:
                print(f"{name:10s} {side:6s} {r}", flush=True)
    cold = None
    if a.cold:
        path = write_model("resnet18", work)
        cold = {}
        for side, code in sides:
            cold[side] = run_side(code, "cold", "resnet18", path, 0, a.timeout)
            print(f"cold ResNet-18 {side}: {cold[side]}", flush=True)
    text = report(results, cold, a.baseline, machine)
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

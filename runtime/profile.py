"""Where a deployed model's time goes: every executor step timed over a few calls.

`profile(model, feeds)` runs the model in the executor's timed mode
(`CompiledModel.run_timed`), so the normal `run` carries no clock reads, and groups the
steps by what runs them: a kernel step by its template (conv2d, dense, batch_matmul,
reduce, elementwise, pool, ...), the others by their kind (reference: NumPy ops;
view: reshapes; onnxruntime: fallback regions; control_flow; host: a GPU model's
steps on the CPU). What a call costs besides its steps (finding the program, the
environment, graph outputs, the Python loop) is the executor overhead: end-to-end
time minus the sum of the steps.

Given the ONNX model, onnxruntime runs the same feeds with its own profiler
(`SessionOptions.enable_profiling`), and each of its node times is attributed to the
step that computes the same ONNX node (by node name, or for a node onnxruntime made
by fusing several, by the value it outputs), so each row shows what onnxruntime
spends on the same work. Shape computations fold once per shape here (kind
"static", no time per call); onnxruntime's time on them shows in that row.

A shared machine preempts single steps: each step's figure is its median over the
calls, the executor overhead the median of (end-to-end - sum of steps) per call, and the
profile's total their sum, so the rows add up exactly; the median end-to-end time of
the calls (`wall_s`) is given beside it.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ir.errors import TensortuneError

OVERHEAD = "executor overhead"
STATIC = "static"
UNMATCHED = "onnxruntime only"   # onnxruntime nodes that no step of ours computes


class ProfileError(TensortuneError):
    """A profile that cannot be taken (bad run count, onnxruntime missing or failing)."""


@dataclass
class StepProfile:
    index: int
    group: str            # template name, or the step's kind where no kernel runs it
    choice: str           # tuned | nearest | default | reference | view | ... (the executor's step kind)
    ops: str              # the ONNX ops it computes, "Conv + Add + Relu"
    name: str             # its first node's name
    seconds: float        # per call
    onnxruntime_s: float | None = None   # onnxruntime's time on the same nodes, per call


@dataclass
class GroupProfile:
    group: str
    steps: int            # steps of this group in one call
    seconds: float
    share: float          # of the end-to-end time
    onnxruntime_s: float | None = None


@dataclass
class OrtProfile:
    """onnxruntime's own per-node profile of the same model and feeds (seconds per call)."""
    total_s: float                       # Σ nodes + overhead (its `model_run` events, the profiler's cost included)
    by_op: dict                          # op type -> seconds
    by_node: dict                        # node name -> (op type, seconds)
    outputs: dict = field(default_factory=dict)   # node name -> the values it writes (its optimized graph)
    source_outputs: dict = field(default_factory=dict)   # the same of the model as given
    runs: int = 0
    threads: int = 1
    plain_s: float | None = None         # end-to-end seconds of a session without the profiler, run in turn
    plain_cpu_s: float | None = None     # its calling thread's CPU seconds per call (median)

    @property
    def overhead_s(self) -> float:
        """Its session's time outside its nodes (median over its calls)."""
        return self.total_s - sum(self.by_op.values())


@dataclass
class Profile:
    """A model's call, step by step (`profile`): `groups()` and `table()` summarize it."""
    total_s: float                        # seconds per call: Σ step medians + median overhead
    steps: list[StepProfile]
    static: list[StepProfile]             # shape computations folded at build time (0 s per call)
    runs: int
    wall_s: float                         # median end-to-end seconds of the timed calls
    threads: int
    overhead_s: float = 0.0               # the executor's: median over calls of end-to-end - Σ steps
    cpu_s: float | None = None            # the calling thread's CPU seconds per call (median): on one thread
                                          # all the work, and no time lost to preemption
    onnxruntime: OrtProfile | None = None
    unmatched: dict = field(default_factory=dict)   # op type -> onnxruntime seconds no step accounts for

    def groups(self) -> list[GroupProfile]:
        """One row per group, slowest first, then the folded shape computations and the
        executor overhead (and, with onnxruntime, what only onnxruntime runs)."""
        ort = self.onnxruntime is not None
        rows: dict[str, GroupProfile] = {}
        for s in self.steps:
            g = rows.setdefault(s.group, GroupProfile(s.group, 0, 0.0, 0.0, 0.0 if ort else None))
            g.steps += 1
            g.seconds += s.seconds
            if ort:
                g.onnxruntime_s += s.onnxruntime_s or 0.0
        out = sorted(rows.values(), key=lambda g: -g.seconds)
        if self.static:
            out.append(GroupProfile(STATIC, 0, 0.0, 0.0,
                                    sum(s.onnxruntime_s or 0.0 for s in self.static) if ort else None))
        out.append(GroupProfile(OVERHEAD, 0, self.overhead_s, 0.0, self.onnxruntime.overhead_s if ort else None))
        if ort and self.unmatched:
            out.append(GroupProfile(UNMATCHED, 0, 0.0, 0.0, sum(self.unmatched.values())))
        for g in out:
            g.share = g.seconds / self.total_s if self.total_s else 0.0
        return out

    def table(self, top: int = 10) -> str:
        """The profile as text: groups, then the `top` slowest steps, then onnxruntime by op type."""
        ort = self.onnxruntime
        thr = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        head = (f"profile: {_ms(self.total_s)} per call, {thr} (medians of {self.runs} calls; end to end "
                f"{_ms(self.wall_s)})")
        if ort is not None:
            head += (f"; onnxruntime {_ms(ort.total_s)} under its own profiler ({_ratio(self.total_s, ort.total_s)}), "
                     f"{_ms(ort.plain_s or 0)} without ({_ratio(self.total_s, ort.plain_s)})")
        if self.threads == 1 and self.cpu_s:
            head += f"\nCPU time of the calling thread per call: {_ms(self.cpu_s)}"
            if ort is not None and ort.plain_cpu_s:
                head += (f", onnxruntime without its profiler {_ms(ort.plain_cpu_s)} "
                         f"({_ratio(self.cpu_s, ort.plain_cpu_s)})")
        cols = ["kind", "steps", "ms/call", "share"] + (["onnxruntime ms", "vs onnxruntime"] if ort else [])
        rows = [cols]
        for g in self.groups():
            row = [g.group, str(g.steps) if g.steps else "-", f"{g.seconds * 1e3:.3f}", f"{g.share:.1%}"]
            if ort:
                row += [f"{g.onnxruntime_s * 1e3:.3f}", _ratio(g.seconds, g.onnxruntime_s)]
            rows.append(row)
        total = ["total", str(len(self.steps)), f"{self.total_s * 1e3:.3f}", "100.0%"]
        rows.append(total + ([f"{ort.total_s * 1e3:.3f}", _ratio(self.total_s, ort.total_s)] if ort else []))
        lines = [head, *_columns(rows)]
        slow = sorted(self.steps, key=lambda s: -s.seconds)[:top]
        if slow:
            lines += ["", f"slowest {len(slow)} steps:"]
            cols = ["#", "kind", "config", "ms/call", "share"] + (["onnxruntime ms", "vs onnxruntime"] if ort else [])
            rows = [cols + ["ops (first node)"]]
            for s in slow:
                row = [str(s.index), s.group, s.choice, f"{s.seconds * 1e3:.3f}", f"{s.seconds / self.total_s:.1%}"]
                if ort:
                    row += [f"{(s.onnxruntime_s or 0) * 1e3:.3f}", _ratio(s.seconds, s.onnxruntime_s)]
                rows.append(row + [f"{_short(s.ops)} ({s.name})"])
            lines += _columns(rows, left=(1, 2, -1))
        if ort is not None:
            lines += ["", "onnxruntime by op type: " + ", ".join(
                f"{op} {v * 1e3:.3f} ms" for op, v in sorted(ort.by_op.items(), key=lambda x: -x[1]))]
            if self.unmatched:
                lines.append("onnxruntime only (no step of ours computes these nodes): " + ", ".join(
                    f"{op} {v * 1e3:.3f} ms" for op, v in sorted(self.unmatched.items(), key=lambda x: -x[1])))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_json(self) -> dict:
        ort = self.onnxruntime
        return {"total_s": self.total_s, "overhead_s": self.overhead_s, "runs": self.runs, "wall_s": self.wall_s,
                "cpu_s": self.cpu_s,
                "threads": self.threads, "groups": [asdict(g) for g in self.groups()],
                "steps": [asdict(s) for s in self.steps], "static": [asdict(s) for s in self.static],
                "onnxruntime": None if ort is None else {
                    "total_s": ort.total_s, "plain_s": ort.plain_s, "plain_cpu_s": ort.plain_cpu_s,
                    "overhead_s": ort.overhead_s, "by_op": ort.by_op, "runs": ort.runs,
                    "threads": ort.threads, "unmatched": self.unmatched}}


def step_group(step) -> str:
    """What runs a step: its template's name, or its kind where no kernel runs it; a GPU
    model's step on the CPU is "host <that>"."""
    what = step.kernel.kernel.template if step.kernel is not None else step.kind
    return f"host {what}" if step.host else what


def profile(model, feeds: dict, runs: int = 10, warmup: int = 1, onnx_model=None) -> Profile:
    """Time every step of `model` (`runtime.load`'s `CompiledModel`) on `feeds`, `runs`
    calls after `warmup` untimed ones; with `onnx_model` (a path, ModelProto or bytes)
    onnxruntime's own profile of the same feeds beside it, at the model's thread count,
    the two taking turns in blocks of calls (`tuner.verify.take_turns`)."""
    if runs < 1 or warmup < 0:
        raise ProfileError(f"a profile needs runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    threads = int(model.backend.settings.num_threads)
    ort = OrtProfiler(onnx_model, feeds, threads) if onnx_model is not None else None
    for _ in range(warmup):
        model.run(feeds)
        if ort is not None:
            ort.run()
    totals, per_step, cpu = [], [], []
    perf, thread_time = time.perf_counter, time.thread_time

    def timed():
        c0, t0 = thread_time(), perf()
        _, times = model.run_timed(feeds)
        totals.append(perf() - t0)
        cpu.append(thread_time() - c0)
        per_step.append(times)
    if ort is None:
        for _ in range(runs):
            timed()
    else:
        # in turns, so that a shared machine's load hits both alike; in blocks of calls after an
        # untimed one, as deployed models run: called in turn call by call, each found the other's
        # data in the caches (ViT-small, Zen 4: ours 0.79 -> 1.03 ms, onnxruntime 0.77 -> 0.85)
        from tuner.verify import take_turns
        take_turns([(lambda: model.run(feeds), timed), (lambda: ort.run(timed=False), ort.run)], runs)
    prog = model.prepare(feeds)
    n = len(prog.steps)
    keep = [k for k in range(runs) if len(per_step[k]) == n]   # calls of this program (not one rebuilt midway)
    per = np.asarray([per_step[k] for k in keep]).reshape(len(keep), n)
    med = np.median(per, axis=0)
    overhead = float(np.median([totals[k] for k in keep] - per.sum(axis=1)))
    steps = [_step_profile(k, s, float(med[k])) for k, s in enumerate(prog.steps)]
    static = [_step_profile(s.index, s, 0.0) for s in prog.static_steps]
    out = Profile(float(med.sum()) + overhead, steps, static, len(keep), float(np.median(totals)), threads, overhead,
                  float(np.median(cpu)))
    if ort is not None:
        out.onnxruntime = ort.finish(warmup)
        out.unmatched = attribute(out.onnxruntime, steps + static, prog.steps + prog.static_steps)
    return out


def _step_profile(index: int, step, seconds: float) -> StepProfile:
    return StepProfile(index, step_group(step) if step.kind != STATIC else STATIC, step.kind,
                       " + ".join(step.subgraph.ops), step.subgraph.name, seconds)


def attribute(ort: OrtProfile, profiles: list[StepProfile], steps: list) -> dict:
    """Give each step profile onnxruntime's time on the nodes it computes (`_owner`).
    Returns op type -> the seconds attributed to no step."""
    by_name, by_value = {}, {}
    for k, st in enumerate(steps):
        for node in st.subgraph.nodes:
            by_name[node.name] = k
            for o in node.outputs:
                if o:
                    by_value[o] = k
    got = [0.0] * len(steps)
    unmatched: dict[str, float] = {}
    for name, (op, secs) in ort.by_node.items():
        k = _owner(name, ort, by_name, by_value)
        if k is None:
            unmatched[op] = unmatched.get(op, 0.0) + secs
        else:
            got[k] += secs
    for p, secs in zip(profiles, got):
        p.onnxruntime_s = secs
    return unmatched


def _owner(name: str, ort: OrtProfile, by_name: dict, by_value: dict) -> int | None:
    """The step that computes onnxruntime's node `name`: one of ours of that name (or of
    its part before a "/", as "l0.qk/MatMulScaleFusion/"); else the step making a value it
    outputs in its optimized graph (a fused node: BiasGelu); else a node of the model as
    given whose name it extends ("layer1.0.a.relu_nchwc") and whose output a step makes
    (a node our import folded, as a BatchNormalization into its Conv)."""
    head = name.split("/")[0] or name   # "/stem/stem.0/Conv_nchwc" (a torch export's names) has no head
    for cand in (name, head):
        if cand in by_name:
            return by_name[cand]
    for v in ort.outputs.get(name, ()):
        if v in by_value:
            return by_value[v]
    while "_" in head:
        head = head.rsplit("_", 1)[0]
        if head in by_name:
            return by_name[head]
        for v in ort.source_outputs.get(head, ()):
            if v in by_value:
                return by_value[v]
    return None


class OrtProfiler:
    """An onnxruntime session (CPU, all graph optimizations, `threads` intra-op threads) with
    its profiler on: `run` it in turn with the model, then `finish` reads its trace."""

    def __init__(self, onnx_model, feeds: dict, threads: int = 1):
        try:
            import onnxruntime as ort
        except ImportError:
            raise ProfileError("the onnxruntime side of a profile needs onnxruntime: pip install "
                               "'tensortune[check]'") from None
        self.threads = threads
        self._tmp = tempfile.TemporaryDirectory(prefix="tt_ortprof_")
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.enable_profiling = True
        so.log_severity_level = 3   # no warning about the optimized graph it writes for us
        so.profile_file_prefix = os.path.join(self._tmp.name, "ort")
        self._optimized = so.optimized_model_filepath = os.path.join(self._tmp.name, "optimized.onnx")
        source = onnx_model.SerializeToString() if hasattr(onnx_model, "SerializeToString") else onnx_model
        source = source if isinstance(source, bytes) else str(source)
        self._source = source
        plain = ort.SessionOptions()
        plain.intra_op_num_threads, plain.inter_op_num_threads = threads, 1
        try:
            self.session = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
            self.plain = ort.InferenceSession(source, plain, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 (onnxruntime's errors have no common base class)
            self._tmp.cleanup()
            raise ProfileError(f"onnxruntime could not load the model: {_first_line(e)}") from None
        wanted = {i.name for i in self.session.get_inputs()}
        self.feeds = {k: v for k, v in feeds.items() if k in wanted}
        self.plain_times: list[float] = []
        self.plain_cpu: list[float] = []
        self.timed: list[bool] = []   # per call: counted (False: it brought the caches back)

    def run(self, timed: bool = True) -> None:
        """One call of the profiled session, then one of the plain one (timed)."""
        try:
            self.session.run(None, self.feeds)
            c0, t0 = time.thread_time(), time.perf_counter()
            self.plain.run(None, self.feeds)
            self.plain_times.append(time.perf_counter() - t0)
            self.plain_cpu.append(time.thread_time() - c0)
            self.timed.append(timed)
        except Exception as e:  # noqa: BLE001
            raise ProfileError(f"onnxruntime could not run the model: {_first_line(e)}") from None

    def finish(self, warmup: int) -> OrtProfile:
        """The profile of the calls after the first `warmup`; the session's files are removed."""
        try:
            with open(self.session.end_profiling()) as f:
                events = json.load(f)
            keep = [k >= warmup and t for k, t in enumerate(self.timed)]
            out = parse_trace(events, warmup, _node_outputs(self._optimized), self.threads, keep)
            out.source_outputs = _node_outputs(self._source)
            timed = [t for t, k in zip(self.plain_times, keep) if k]
            out.plain_s = float(np.median(timed)) if timed else None
            cpu = [t for t, k in zip(self.plain_cpu, keep) if k]
            out.plain_cpu_s = float(np.median(cpu)) if cpu else None
            return out
        finally:
            self._tmp.cleanup()


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _node_outputs(source) -> dict:
    """node name -> its outputs in an ONNX model (a path or bytes; empty where none can be read)."""
    try:
        import onnx
        m = onnx.load_from_string(source) if isinstance(source, bytes) else onnx.load(source, load_external_data=False)
    except Exception:   # noqa: BLE001 (no optimized graph: fused nodes then match by name only)
        return {}
    return {n.name: [o for o in n.output if o] for n in m.graph.node}


def parse_trace(events: list, warmup: int, outputs: dict | None = None, threads: int = 1,
                keep: list | None = None) -> OrtProfile:
    """An onnxruntime profiler trace (Chrome trace events, microseconds) -> per-call node
    times: each `model_run` event is one call, its node `*_kernel_time` events lie within.
    The calls after the first `warmup`, or where given, those whose flag in `keep` is true."""
    calls = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") == "Session" and e.get("name") == "model_run")
    calls = [c for c, k in zip(calls, keep) if k] if keep is not None else calls[warmup:]
    if not calls:
        raise ProfileError("onnxruntime's profile holds no timed call")
    per_call: list[dict] = [{} for _ in calls]
    ops: dict[str, str] = {}
    starts = [c[0] for c in calls]
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        k = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        if k < 0 or e["ts"] > calls[k][1]:
            continue   # a warm-up call's node
        node = name[:-len("_kernel_time")]
        ops[node] = e.get("args", {}).get("op_name", "?")
        per_call[k][node] = per_call[k].get(node, 0.0) + e["dur"] * 1e-6
    totals = np.asarray([(b - a) * 1e-6 for a, b in calls])
    per = np.asarray([[c.get(node, 0.0) for node in ops] for c in per_call]).reshape(len(calls), len(ops))
    med = np.median(per, axis=0)
    by_node = {node: (op, float(m)) for (node, op), m in zip(ops.items(), med)}
    by_op: dict[str, float] = {}
    for op, secs in by_node.values():
        by_op[op] = by_op.get(op, 0.0) + secs
    overhead = float(np.median(totals - per.sum(axis=1)))
    return OrtProfile(float(med.sum()) + overhead, by_op, by_node, outputs=outputs or {}, runs=len(calls),
                      threads=threads)


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


def _ratio(ours: float, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "-"


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _columns(rows: list[list[str]], left: tuple = (0,)) -> list[str]:
    """Aligned text columns, numbers right-aligned, the columns in `left` (indices) left-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    left = {i % len(widths) for i in left}
    out = ["  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
           for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out

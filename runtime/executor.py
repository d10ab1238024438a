"""`CompiledModel`: runs a partitioned graph with compiled kernels.

Per concrete shape (the sizes bound from the inputs) it builds a `Program` once:
the subgraphs in dependency order, for each the chosen kernel bound to its
constants or the NumPy reference ops, and a memory plan that places every
intermediate tensor in one arena (see `runtime.memory`). Kernels write straight
into their planned buffer (`BoundKernel(arrays, out=view)`); reference steps copy
their result into it. Graph outputs get fresh arrays on every call, so an output
a caller keeps is never overwritten by a later call.

Weight packing (`Kernel.bind`) happens once per (subgraph, template, config) and
is shared by the programs of every shape: a template's `prepare` depends only on
the constants and the config, never on the dynamic dims.

A call costs little Python around the kernels (`experiments/bench_overhead.py`):
each kernel step's launch is planned once per program as flat calls on the arena
(`BoundKernel.plan`), so a step whose inputs and output live there runs as one
Python call per kernel function; only steps reading a feed or a value made on this
call, or writing a graph output, fill those few arguments per call. Runs of
consecutive fixed steps go further where the backend can (`Backend.batch`): on the
CPU one native loop calls all their kernels, no Python between them. Feeds of a
(name, shape, dtype) signature seen before go straight to their program. A cold
program's distinct uncached kernels compile on worker processes at once.

`run` reads no clock but the native loop's counter between kernels (~20 cycles).
`run_timed` is the profiling mode (`runtime.profile`): the same steps with the time of
each; a program's first call runs that way too, so that the coverage's time shares
are known without a cost on later calls.
"""
from __future__ import annotations

import os
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from codegen import compile_kernel, get_backend
from codegen.backend import aligned_copy
from codegen.kernel import BoundKernel, Kernel
from ir.custom import has_definition
from ir.errors import InputValueError, ShapeError, TensortuneError, UnsupportedOpError
from ir.fusion import FusedSubgraph, partition, topo_order
from ir.graph import Graph
from ir.ops import OPS
from ir.passes import simplify
from ir.reference import bind_inputs
from ir.shapes import UnboundDimsError, bind
from ir.workload import make_workload
from runtime.choose import CPU_FALLBACK, REFERENCE, Choice, Chooser
from runtime.control_flow import CONTROL_FLOW, ControlFlow, is_control_flow
from runtime.fallback import ONNXRUNTIME, OrtRegion, check_fallback, regions, unsupported_nodes

MAX_PROGRAMS = 16        # per-shape programs (each with its arena) a model keeps, least recently used dropped
MAX_BOUND_SHAPES = 256   # input shapes whose bound dim sizes are remembered (small dicts)
STAGE_MAX_BYTES = 1 << 18
"""Graph inputs up to this size that kernels read are copied at the start of each call into a
buffer of the program's (`Program.staged`), so that every kernel call of the program has fixed
arguments and the whole program runs from one native loop (`Backend.batch`): a kernel reading
the caller's array was filled and dispatched from Python on each call (its native argument
block packed again: ~10-25 us a step once the kernels have pushed the interpreter's data out of
the caches). Untuned, processes in turns with the tree before (AMD EPYC Zen 3, 2026-12-07,
experiments/bench_turns.md), median ratio to onnxruntime before -> after: 1 thread BERT-small
0.90 -> 0.85, ViT-small 0.89 -> 0.84, ResNet-18 1.07 -> 0.99, MobileNetV2 1.06 -> 1.05; 2 threads
BERT 1.02 -> 0.82, MobileNetV2 1.28 -> 1.15, ViT and ResNet-18 unchanged (the host noisy: wide
quartiles). A copy of a larger input (a 224x224 image: 600 KB) costs about what it saves."""
# distinct uncached kernels a program needs before worker processes compile them: a worker
# takes about a second to start, a compile one to a few seconds
PARALLEL_COMPILE_MIN = 4
STATIC, VIEW = "static", "view"   # shape computations folded per shape; reshapes run as views
_VIEW_OPS = ("Reshape", "Unsqueeze", "Squeeze", "Flatten")
from runtime.memory import MemoryPlan, plan_memory


def compile_on_workers(backend, modules: dict, workers: int, timeout: float = 600.0) -> dict:
    """source key -> Artifact of each loop module, compiled on `workers` fresh worker
    processes (`tuner.measure.worker`: no fork of a process running numba threads, no
    re-import of the caller's __main__), each filling the kernel cache this process then
    loads from. A module that fails or times out is left out."""
    import queue
    from concurrent.futures import ThreadPoolExecutor

    from tuner.measure import jobs
    from tuner.measure.worker import Worker
    settings = backend.settings.to_json()
    # Each worker takes the next module when it is free, longest source first (numba's passes are
    # linear in the statements): no long compile is left for last while the other workers idle.
    todo = queue.SimpleQueue()
    for key in sorted(modules, key=lambda k: -len(backend.render(modules[k]))):
        todo.put(key)
    # no colours in numba's messages: it formats one for every typing template it tries and rejects
    pool = [Worker({"NUMBA_NUM_THREADS": "1", "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING": "1"})
            for _ in range(workers)]

    def build(w: int) -> dict:
        out = {}
        while True:
            try:
                key = todo.get_nowait()
            except queue.Empty:
                return out
            try:
                reply = pool[w].call(jobs.build_job, {"module": modules[key], "settings": settings}, timeout)
            except Exception:   # noqa: BLE001 (a worker that died or overran: compiled here instead)
                continue
            if reply[0] == "ok":
                out[key] = reply[1]
    try:
        with ThreadPoolExecutor(workers) as threads:
            return {k: a for part in threads.map(build, range(workers)) for k, a in part.items()}
    finally:
        for w in pool:
            w.kill()


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class FallbackError(TensortuneError):
    """--strict: a subgraph would run on the NumPy reference path or in onnxruntime (or a
    stored config is unusable)."""


def _bad_value(step, e: IndexError) -> InputValueError:
    """An index out of range, met by a kernel or the reference while running `step`: the
    inputs' fault, said as one line naming the subgraph's nodes (the outputs are not made)."""
    nodes = ", ".join(f"{n.op} '{n.name}'" for n in step.subgraph.nodes[:3])
    why = str(e).strip().splitlines()[0] if str(e).strip() else "an index is out of range"
    for n in step.subgraph.nodes:   # a kernel's own message may start with its op's name
        why = why.removeprefix(f"{n.op}: ")
    more = f" (+{len(step.subgraph.nodes) - 3} more)" if len(step.subgraph.nodes) > 3 else ""
    return InputValueError(f"{nodes}{more}: {why} (a value in the inputs is out of range for the model)")


class _RefFailed(Exception):
    """A node's reference refused its inputs: with a fallback, it joins an onnxruntime region."""

    def __init__(self, node):
        self.node = node


def run_node(g: Graph, node, args: list) -> tuple[list, bool]:
    """(outputs, fell back to onnx.reference?) for one node on the reference path."""
    if has_definition(node):
        try:
            return OPS[node.op].ref(node, args), False
        except UnsupportedOpError:  # a case our reference does not cover (a dtype, a mode)
            pass
    from ir.reference import _run_onnx_node
    try:
        return _run_onnx_node(g, node, args), True
    except UnsupportedOpError as e:  # onnx.reference's own message may span lines
        raise UnsupportedOpError(str(e).strip().splitlines()[0]) from None


@dataclass
class Step:
    subgraph: FusedSubgraph
    kind: str                     # tuned | nearest | default | cpu-fallback | static | view | reference | onnxruntime | control_flow
    index: int = 0                # position in CompiledModel.subgraphs
    kernel: object = None         # BoundKernel, or None on the reference path
    host: bool = False            # a GPU model's step that runs on the host (CPU kernel, reference, onnxruntime)
    session: object = None        # OrtRegion of an onnxruntime step, ControlFlow of an If/Loop/Scan
    name: str = ""
    seconds: float = 0.0          # summed over the timed calls (`run_timed`, a program's first call)
    calls: int = 0                # how many timed calls ran it
    in_slots: list = field(default_factory=list)
    # (value, slot, planned view or None, graph output?) for every value the step hands on
    outs: list = field(default_factory=list)
    out_shape: tuple = ()
    out_dtype: str = "float32"
    work: dict | None = None      # the kernel's workspaces: views of the arena (None: its own)
    plan: object = None           # the kernel's flat calls on this program's buffers (codegen.kernel.Calls)
    fixed: tuple | None = None    # those calls when nothing in them changes from call to call
    dynamic_inputs: bool = False  # some input is read from the environment on each call


@dataclass
class Program:
    sizes: dict
    steps: list[Step]
    memory: MemoryPlan | None = None
    arena: np.ndarray | None = None
    fallback_nodes: list = field(default_factory=list)
    static: dict = field(default_factory=dict)         # slot -> value computed at build time
    static_steps: list = field(default_factory=list)   # the steps those came from (for coverage)
    owned: frozenset = frozenset()                     # slots of graph outputs in the program's own buffers
    runs: list = field(default_factory=list)           # what a call runs, in order (`Executor._batched`)
    staged: list = field(default_factory=list)         # (slot, buffer): graph inputs copied in per call (`STAGE_MAX_BYTES`)
    env0: list = field(default_factory=list)           # each call's environment to start from
    timed: bool = False                                # a call of it has been timed step by step


@dataclass
class Coverage:
    """Which subgraphs ran tuned / nearest-shape / default / reference kernels."""

    counts: dict
    nodes: dict
    seconds: dict
    fallback_ops: list

    def share(self, kind: str) -> float:
        total = sum(self.nodes.values())
        return self.nodes.get(kind, 0) / total if total else 0.0

    def time_share(self, kind: str) -> float:
        total = sum(self.seconds.values())
        return self.seconds.get(kind, 0.0) / total if total else 0.0

    def to_json(self) -> dict:
        total_s = sum(self.seconds.values()) or 1.0
        total_n = sum(self.nodes.values()) or 1
        return {"subgraphs": self.counts, "nodes": self.nodes,
                "node_share": {k: v / total_n for k, v in self.nodes.items()},
                "time_share": {k: v / total_s for k, v in self.seconds.items()},
                "onnx_reference_ops": self.fallback_ops,
                "fallback_rate": {"nodes": self.share(ONNXRUNTIME), "time": self.time_share(ONNXRUNTIME)}}

    def __str__(self) -> str:
        total = sum(self.nodes.values())
        parts = [f"{k}: {self.counts[k]} subgraphs / {self.nodes[k]} nodes ({self.nodes[k] / total:.0%} of nodes, "
                 f"{self.time_share(k):.0%} of time)"
                 for k in ("tuned", "nearest", "default", CPU_FALLBACK, "static", "view", "reference", ONNXRUNTIME,
                           CONTROL_FLOW)
                 if self.counts.get(k)]
        return "; ".join(parts)


def _int_valued(g: Graph, sg: FusedSubgraph) -> bool:
    try:
        return g.type_of(sg.output).dtype in ("int64", "int32", "bool")
    except Exception:
        return False


# ONNX's own non-default domains: onnx.reference implements their ops (run per node)
_ONNX_DOMAINS = (None, "", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview", "ai.onnx.preview.training")


def _refuse_undefined(g: Graph) -> None:
    """Without a fallback, an op of a custom domain that no plugin registered cannot run."""
    bad = [n for n in g.nodes if not has_definition(n) and n.attrs.get("_domain") not in _ONNX_DOMAINS]
    if bad:
        n = bad[0]
        more = f" ({len(bad) - 1} more such nodes)" if len(bad) > 1 else ""
        raise UnsupportedOpError(f"node '{n.name}': op '{n.op}' of domain '{n.attrs['_domain']}' is not supported "
                                 f"by tensortune{more}; run it in onnxruntime with --fallback onnxruntime, or "
                                 "register it with a plugin (--plugin MODULE)")


def _kind(dtype) -> str:
    """NumPy's dtype kind, with ml_dtypes' bfloat16 (kind 'V') counted as a float."""
    return "f" if str(dtype) == "bfloat16" else np.dtype(dtype).kind


class CompiledModel:
    """Callable on NumPy arrays (by position or input name). Not reentrant: one call at a
    time per model (a lock enforces it), since a program's arena is shared by its calls."""

    def __init__(self, graph: Graph, subgraphs: list[FusedSubgraph], chooser: Chooser, strict: bool = False,
                 plan_memory: bool = True, max_programs: int = MAX_PROGRAMS, fallback: str | None = None,
                 backend=None):
        self.graph, self.chooser, self.strict = graph, chooser, strict
        self.backend = get_backend(backend)
        self.fallback = check_fallback(fallback)
        self._partition = topo_order(graph, subgraphs)
        self.plan_memory = plan_memory
        if not (isinstance(max_programs, int) and not isinstance(max_programs, bool) and max_programs >= 1):
            raise TensortuneError(f"max_programs must be an integer >= 1, got {max_programs!r}")
        self.max_programs = max_programs
        self._programs: OrderedDict[tuple, Program] = OrderedDict()   # LRU: most recently used last
        self._programs_lock = threading.RLock()
        self._sizes_by_shapes: OrderedDict[tuple, dict] = OrderedDict()  # input shapes -> bound dim sizes (LRU)
        self._by_signature: dict[tuple, tuple] = {}  # feeds' (name, shape, dtype)s -> (program key, sizes)
        self._kernels: dict[tuple, object] = {}      # (workload key, template, config) -> Kernel
        self._states: dict[tuple, object] = {}       # (subgraph, template, version, config) -> packed state
        self.stats = {"binds": 0, "bind_reused": 0, "compiles": 0}
        self._lock = threading.Lock()
        self._parent: CompiledModel | None = None   # the model whose control-flow node runs this one as a body
        self._timing = False                         # a timed call is running (its bodies then time theirs)
        names = list(graph.inputs) + list(graph.constants)
        names += [o for n in graph.nodes for o in n.outputs if o]
        self._slot = {v: k for k, v in enumerate(dict.fromkeys(names))}
        self._env0 = [None] * len(self._slot)
        for name, arr in graph.constants.items():
            self._env0[self._slot[name]] = arr
        # (name, slot, is a graph input or constant) of each graph output, in order
        self._outputs = [(o, self._slot[o], o in graph.inputs or o in graph.constants) for o in graph.outputs]
        self._unsupported: set[str] = unsupported_nodes(graph) if self.fallback else set()
        if not self.fallback:
            _refuse_undefined(graph)
        self._index()

    def _index(self) -> None:
        """Subgraphs (unsupported regions merged, with a fallback), what each hands on, sessions."""
        graph = self.graph
        self.subgraphs = regions(graph, self._partition, self._unsupported)
        consumers = graph.consumers()
        self._read_outside = {}  # subgraph index -> values its nodes make that others read
        self._sessions = {}      # subgraph index -> OrtRegion, or ControlFlow (bodies run as nested models)
        for k, sg in enumerate(self.subgraphs):
            inside = {id(n) for n in sg.nodes}
            made = [o for n in sg.nodes for o in n.outputs if o]
            self._read_outside[k] = [o for o in made if o == sg.output or o in graph.outputs
                                     or any(id(c) not in inside for c in consumers.get(o, []))]
            if all(n.name in self._unsupported for n in sg.nodes):
                self._sessions[k] = OrtRegion(graph, sg, self._read_outside[k])
            elif len(sg.nodes) == 1 and is_control_flow(sg.nodes[0]):
                self._sessions[k] = ControlFlow(graph, sg.nodes[0], self._nested)

    def _nested(self, body: Graph) -> "CompiledModel":
        """A control-flow body, simplified, partitioned and compiled like any graph."""
        g = simplify(body)
        m = CompiledModel(g, partition(g), self.chooser, strict=self.strict, plan_memory=self.plan_memory,
                          fallback=self.fallback)
        m._parent = self
        return m

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    def __call__(self, *args, **feeds):
        if args:
            if len(args) > len(self.graph.inputs):
                raise ShapeError(f"model takes {len(self.graph.inputs)} inputs, got {len(args)}")
            named = dict(zip(self.graph.inputs, args))
            if feeds:
                named.update(feeds)
            feeds = named
        outs = self.run(feeds)
        return outs[self.graph.outputs[0]] if len(outs) == 1 else outs

    # -- programs ---------------------------------------------------------------------
    def program(self, sizes: dict[str, int]) -> Program:
        """The program for these dim sizes (built on first use). The `max_programs` most
        recently used are kept; an older one is dropped with its arena (a caller still
        running it keeps it alive until done) and rebuilt if its sizes come back."""
        key = tuple(sorted(sizes.items()))
        with self._programs_lock:
            prog = self._programs.get(key)
            if prog is not None:
                self._programs.move_to_end(key)
                return prog
            prog = self._programs[key] = self._build(dict(sizes))
            if len(self._programs) > self.max_programs:
                while len(self._programs) > self.max_programs:
                    self._programs.popitem(last=False)
                self._drop_unused_kernels()
            return prog

    def _program_for(self, feeds: dict) -> tuple[dict, Program]:
        """(feeds as the model takes them, their program). Feeds of input shapes and dtypes
        seen before, that needed no conversion then, skip the checks and the size binding:
        one dict lookup by (name, shape, dtype) of each."""
        try:
            sig = tuple([(k, v.shape, v.dtype) for k, v in feeds.items()])
        except AttributeError:   # not arrays (lists, scalars): the full path converts them
            sig = None
        known = self._by_signature.get(sig) if sig is not None else None
        if known is not None:
            with self._programs_lock:
                prog = self._programs.get(known[0])
                if prog is not None:
                    self._programs.move_to_end(known[0])
                    return feeds, prog
        conv, sizes = self._bind(feeds)
        prog = self.program(sizes)
        if sig is not None and all(conv[k] is v for k, v in feeds.items()):
            with self._programs_lock:
                if len(self._by_signature) >= MAX_BOUND_SHAPES:
                    self._by_signature.clear()
                self._by_signature[sig] = (tuple(sorted(sizes.items())), sizes)
        return conv, prog

    def _drop_unused_kernels(self) -> None:
        """Compiled kernels are per shape (workload key): keep only those a kept program runs.
        Packed weights (`_states`) are per config, shared by every shape: they stay."""
        live = {(s.kernel.kernel.workload.key, s.kernel.kernel.template, s.kernel.kernel.config)
                for p in self._programs.values() for s in p.steps if s.kernel is not None}
        for k in [k for k in self._kernels if k not in live]:
            del self._kernels[k]

    def prepare(self, feeds_or_sizes: dict) -> Program:
        """Build the program ahead of the first call: sizes {"batch": 8} or example feeds."""
        vals = list(feeds_or_sizes.values())
        if vals and all(isinstance(v, (int, np.integer)) for v in vals):
            return self.program({k: int(v) for k, v in feeds_or_sizes.items()})
        return self.program(self._bind(feeds_or_sizes)[1])

    def memory(self, sizes: dict[str, int]) -> MemoryPlan:
        return self.program(sizes).memory

    def _kernel(self, template, wl, cfg, backend):
        key = (wl.key, template.name, cfg)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = compile_kernel(template, wl, cfg, backend)
            self.stats["compiles"] += 1
        return k

    def _precompile(self, jobs: list[tuple]) -> None:
        """Compile the distinct kernels of `jobs` (template, workload, config) that neither this
        model nor the backend's cache has, on worker processes at once, one per core (a cold
        model's first call is mostly numba compiling, seconds per kernel, one core each). What
        a worker could not compile is left to `_kernel`, which compiles it here and raises its
        error. Only a backend that can say what its cache holds (`has_cached`) takes part."""
        has_cached = getattr(self.backend, "has_cached", None)
        workers = min(self.backend.settings.num_threads, _cores())
        if has_cached is None or workers < 2 or len(jobs) < PARALLEL_COMPILE_MIN:
            return
        todo, modules = {}, {}   # kernel key -> (template, wl, cfg, lowered); source key -> module
        for template, wl, cfg in jobs:
            key = (wl.key, template.name, cfg)
            if key in self._kernels or key in todo:
                continue
            try:
                low = template.lower(wl, cfg)
            except Exception:   # noqa: BLE001 (`_kernel` lowers it again and raises where it always did)
                continue
            if not has_cached(low.module):
                todo[key] = (template, wl, cfg, low)
                modules.setdefault(self.backend.source_key(low.module), low.module)
        if len(modules) < PARALLEL_COMPILE_MIN:
            return
        artifacts = compile_on_workers(self.backend, modules, min(workers, len(modules)))
        for key, (template, wl, cfg, low) in todo.items():
            art = artifacts.get(self.backend.source_key(low.module))
            if art is not None:
                self._kernels[key] = Kernel(wl, template.name, cfg, low, art)
                self.stats["compiles"] += 1

    def _bound(self, index: int, template, wl, cfg, sg: FusedSubgraph, backend=None) -> BoundKernel:
        backend = backend or self.backend
        kernel = self._kernel(template, wl, cfg, backend)
        key = (index, template.name, template.version, cfg)
        state = self._states.get(key)
        if state is None:
            bk = kernel.bind([self.graph.constants.get(i) for i in sg.inputs], backend)
            self._states[key] = bk.state
            self.stats["binds"] += 1
            return bk
        self.stats["bind_reused"] += 1
        return BoundKernel(kernel, state, backend)

    def _build(self, sizes: dict[str, int]) -> Program:
        g = self.graph
        steps: list[Step] = []
        static: dict[str, np.ndarray] = {}
        static_steps: list[Step] = []
        kernels: list[tuple] = []   # (step, choice, workload): bound once the distinct kernels are compiled
        for k, sg in enumerate(self.subgraphs):
            sess = self._sessions.get(k)
            if isinstance(sess, ControlFlow):
                steps.append(Step(sg, CONTROL_FLOW, k, session=sess, name=str(sg), host=self.backend.device,
                                  in_slots=[self._slot[i] if i else -1 for i in sg.nodes[0].inputs]))
                continue
            if sess is not None:
                if self.strict:
                    raise FallbackError(f"--strict: node(s) {sess.label} would run in onnxruntime")
                steps.append(Step(sg, ONNXRUNTIME, k, session=sess, name=str(sg), host=self.backend.device,
                                  in_slots=[self._slot[i] for i in sess.feeds]))
                continue
            # shape arithmetic (int/bool values) folds once per shape, even where a kernel covers it
            if _int_valued(g, sg) and self._fold_static(sg, sizes, static):
                static_steps.append(Step(sg, STATIC, k, name=str(sg), in_slots=[self._slot[i] for i in sg.inputs]))
                continue
            try:
                wl = make_workload(g, sg, sizes)
            except UnboundDimsError:  # shapes known only once an earlier step ran (runtime dims)
                if self.strict:
                    raise FallbackError(f"--strict: subgraph '{sg.name}' ({sg}) has shapes known only at run "
                                        "time and would run on the NumPy reference path") from None
                steps.append(Step(sg, REFERENCE, k, name=str(sg), host=self.backend.device,
                                  in_slots=[self._slot[i] for i in sg.inputs]))
                continue
            choice = self.chooser.choose(wl)
            if choice.kind != REFERENCE and set(self._read_outside[k]) - {sg.output}:
                choice = Choice(REFERENCE, None, None)  # a kernel writes one output; this hands on more
            step = Step(sg, choice.kind, k, name=str(sg), in_slots=[self._slot[i] for i in sg.inputs])
            if choice.kind == REFERENCE and self._fold_static(sg, sizes, static):
                step.kind = STATIC
                static_steps.append(step)
                continue
            if choice.kind == REFERENCE and len(sg.nodes) == 1 and sg.nodes[0].op in _VIEW_OPS:
                step.kind = VIEW   # a reshape: metadata only, NumPy returns a view
            elif choice.kind == REFERENCE:
                if self.strict:
                    raise FallbackError(f"--strict: subgraph '{sg.name}' ({wl.describe()}) has no template "
                                        "and would run on the NumPy reference path")
            else:
                kernels.append((step, choice, wl))
            # on a GPU, steps without a GPU kernel run on host copies (CPU fallback, reference, views)
            step.host = self.backend.device and choice.kind in (REFERENCE, CPU_FALLBACK)
            steps.append(step)
        self._precompile([(c.template, wl, c.config) for _, c, wl in kernels if c.backend is None])
        for step, choice, wl in kernels:
            backend = get_backend(choice.backend, self.backend.settings) if choice.backend else None
            step.kernel = self._bound(step.index, choice.template, wl, choice.config, step.subgraph, backend)
            if choice.split:   # every thread (`codegen.cpu.threads_for` without a size), or one (a size of 0)
                step.kernel.work_estimate = None
            elif choice.one:
                step.kernel.work_estimate = 0
            step.out_shape, step.out_dtype = tuple(wl.output_shape), wl.output_dtype
        if self.backend.device:   # folded shape values: uploaded once per program, like constants
            static = {v: self.backend.asarray(a, a.dtype) for v, a in static.items()}
        prog = Program(sizes, steps, static={self._slot[v]: a for v, a in static.items()},
                       static_steps=static_steps)
        self._plan(prog)
        return prog

    def _fold_static(self, sg: FusedSubgraph, sizes: dict, static: dict) -> bool:
        """Evaluate a shape computation (Shape of a value, then ops on constants) once per
        concrete shape: its result depends on the sizes only, never on the data."""
        g = self.graph
        if sg.output in g.outputs:
            return False
        local: dict[str, np.ndarray] = {}
        for n in sg.nodes:
            args = []
            for k, i in enumerate(n.inputs):
                if not i:
                    args.append(None)
                elif i in local or i in static or i in g.constants:
                    args.append(local.get(i, static.get(i, g.constants.get(i))))
                elif n.op == "Shape" and k == 0:
                    try:
                        t = g.type_of(i)
                        args.append(np.empty(bind(t.shape, sizes), t.dtype))  # only its shape is read
                    except Exception:
                        return False
                else:
                    return False
            try:
                outs, _ = run_node(g, n, args)
            except Exception:
                return False
            local.update({o: np.asarray(v) for o, v in zip(n.outputs, outs) if o})
        # a program-owned array: a folded value is often a view of a constant (BERT's position ids,
        # a Slice of a read-only initializer), which a kernel's launch cannot bind once for the
        # program (`BoundKernel._fixed_input`): its Gather then ran from Python on every call
        static[sg.output] = np.array(local[sg.output], order="C")
        return True

    def _handed_on(self, step: Step) -> list[str]:
        return [step.subgraph.output] if step.kernel is not None else self._read_outside[step.index]

    def _value_type(self, step: Step, name: str, sizes: dict):
        """(shape, dtype) of a value a step hands on, or None where it cannot be known ahead."""
        if step.kernel is not None:
            return step.out_shape, step.out_dtype
        if step.kind == CONTROL_FLOW:  # a loop's outputs may change shape from call to call
            return None
        return self._declared_type(name, sizes)

    def _declared_type(self, name: str, sizes: dict):
        """(shape, dtype name) the graph declares for a value at these dim sizes, or None."""
        try:
            t = self.graph.type_of(name)
            return tuple(int(d) for d in bind(t.shape, sizes)), np.dtype(t.dtype).name
        except Exception:  # unknown type or dtype, or a size that depends on data
            return None

    def _plan(self, prog: Program) -> None:
        """Liveness over the steps → one arena; views of it become the steps' outputs."""
        g = self.graph
        outputs = set(g.outputs)
        made_at, types = {}, {}
        for k, step in enumerate(prog.steps):
            for v in self._handed_on(step):
                made_at[v] = k
                types[v] = self._value_type(step, v, prog.sizes)
        last_use = {}
        for k, step in enumerate(prog.steps):
            for i in step.subgraph.inputs:
                if i in made_at:
                    last_use[i] = k
        planned = {v: int(np.prod(t[0], dtype=np.int64)) * np.dtype(t[1]).itemsize
                   for v, t in types.items() if t is not None and v not in outputs and self.plan_memory}
        work = {}   # a kernel's workspaces live during its own step only, placed like any buffer
        for k, step in enumerate(prog.steps):
            for b in (step.kernel.workspaces if step.kernel is not None and self.plan_memory else ()):
                name = f"\0work{k}:{b.name}"
                work[name] = (k, b)
                planned[name], made_at[name], last_use[name] = b.nbytes, k, k
        # a step run by NumPy may write its output over an input that dies there; a kernel may not:
        # LLVM vectorizes a loop whose output and input are separate arrays after a run-time check
        # that their ranges do not overlap, so over its own input it ran the scalar loop (an Add of
        # 7680 floats: 9.9 us against 1.7). With kernels kept off their inputs, paddle_det went
        # 0.71 -> 0.64x onnxruntime, GPT-2 0.76 -> 0.72x (AMD EPYC Zen 3, 2026-12-07), and the
        # arenas of the real models stayed as large
        inplace = {}
        for k, step in enumerate(prog.steps):
            out = step.subgraph.output
            if out not in planned or step.kernel is not None:
                continue
            for i in step.subgraph.inputs:
                if i in planned and last_use.get(i) == k and types[i] == types[out]:
                    inplace[out] = i
                    break
        mem = plan_memory(planned, {v: made_at[v] for v in planned}, last_use, inplace)
        arena = self.backend.empty((mem.arena_bytes,), np.uint8)   # in the backend's memory
        owned = set()
        for step in prog.steps:
            for v in self._handed_on(step):
                view = None
                if v in planned:
                    shape, dtype = types[v]
                    off = mem.offsets[v]
                    view = arena[off:off + planned[v]].view(dtype).reshape(shape)
                elif v in outputs and self.plan_memory and types.get(v) is not None and step.kernel is not None \
                        and not step.host:
                    # a kernel's graph output gets a buffer of the program's, copied out per call
                    # (`_results`), so its launch too is fixed: a fresh array per call cost the last
                    # step of a model 50-70 us where the model's weights had pushed the allocation
                    # path out of the caches (MobileNetV2's and ViT's heads, Intel Xeon, 2026-12-04)
                    view = self.backend.empty(*types[v])
                    owned.add(self._slot[v])
                step.outs.append((v, self._slot[v], view, v in outputs))
        for name, (k, b) in work.items():
            off = mem.offsets[name]
            view = arena[off:off + b.nbytes].view(b.dtype).reshape(b.shape)
            prog.steps[k].work = {**(prog.steps[k].work or {}), b.name: view}
        prog.memory, prog.arena, prog.owned = mem, arena, frozenset(owned)
        self._plan_calls(prog)

    def _plan_calls(self, prog: Program) -> None:
        """Each kernel step's launch as flat calls on this program's buffers, so that a call
        of the model runs one Python call per kernel function: values that live at one place
        for the program's life (constants, folded shapes, kernels' arena outputs) are bound
        into the calls once and start each call's environment (`env0`)."""
        env0 = list(self._env0)
        for s_, v in prog.static.items():
            env0[s_] = v
        fixed = set(prog.static) | {self._slot[c] for c in self.graph.constants}
        prog.staged = self._staged_inputs(prog)
        staged = dict(prog.staged)
        for step in prog.steps:
            if step.kernel is None or step.host:   # host steps run through `_run_on_host`
                continue
            _, s_, view, _ = step.outs[0]
            arrays = [staged[i] if i in staged else env0[i] if i in fixed else None for i in step.in_slots]
            step.plan = step.kernel.plan(arrays, view, step.work)
            try:   # a dtype object: the per-call allocation of a graph output then skips parsing its name
                step.out_dtype = np.dtype(step.out_dtype)
            except TypeError:
                pass
            step.fixed = None if step.plan.dynamic else step.plan.calls
            step.dynamic_inputs = step.plan.reads_inputs   # an input not held, or held only as a copy
            if view is not None:
                env0[s_] = view
                fixed.add(s_)
        prog.env0 = env0
        prog.runs = self._batched(prog.steps)

    def _staged_inputs(self, prog: Program) -> list:
        """(slot, buffer) of each graph input of at most `STAGE_MAX_BYTES` that a kernel step
        reads, its shape and dtype known for the program's sizes (on the host only: a device
        backend copies every input anyway)."""
        if self.backend.device:
            return []
        read = {i for st in prog.steps if st.kernel is not None and not st.host for i in st.in_slots}
        staged = []
        for name in self.graph.inputs:
            slot = self._slot.get(name)
            declared = self._declared_type(name, prog.sizes) if slot in read and slot not in prog.static else None
            if declared is None:   # not read by a kernel, or no known type: read from the caller's array
                continue
            shape, dtype = declared[0], np.dtype(declared[1])
            if int(np.prod(shape)) * dtype.itemsize <= STAGE_MAX_BYTES:
                staged.append((slot, self.backend.empty(shape, dtype)))
        return staged

    def _batched(self, steps: list) -> list:
        """The steps as a call runs them: each run of consecutive steps whose calls are all fixed
        and that the backend can batch (`Backend.batch`: on the CPU one native loop for all of
        them) as (batch, the step of each of its calls, (its steps, the index of each one's first
        call)), every other step as (None, step, None)."""
        runs, group = [], []

        def close():
            calls = [c for st in group for c in st.fixed]
            batch = self.backend.batch(calls) if group else None
            if batch is not None:
                starts = np.cumsum([0] + [len(st.fixed) for st in group[:-1]])
                runs.append((batch, [st for st in group for _ in st.fixed], (list(group), starts)))
            else:
                runs.extend((None, st, None) for st in group)
            group.clear()
        for step in steps:
            if step.fixed and step.kernel.backend is self.backend and self.backend.batch(step.fixed) is not None:
                group.append(step)
            else:
                close()
                runs.append((None, step, None))
        close()
        return runs

    # -- running ----------------------------------------------------------------------
    def _bind(self, feeds: dict):
        g = self.graph
        unknown = set(feeds) - set(g.inputs)
        if unknown:
            raise ShapeError(f"unknown input(s) {sorted(unknown)}; the model's inputs are {g.inputs}")
        conv = {}
        for k, v in feeds.items():
            want = g.type_of(k).dtype
            a = np.asarray(v)
            if a.dtype != want:
                if _kind(a.dtype) != _kind(want) and not (_kind(a.dtype) in "iu" and _kind(want) in "iu"):
                    raise ShapeError(f"input '{k}': got dtype {a.dtype}, expected {want}")
                a = a.astype(want)
            conv[k] = a
        key = tuple((k, a.shape) for k, a in sorted(conv.items()))
        with self._programs_lock:
            sizes = self._sizes_by_shapes.get(key)
            if sizes is not None:
                self._sizes_by_shapes.move_to_end(key)
        if sizes is None:  # sympy binding and range checks run once per distinct input shapes
            sizes = bind_inputs(g, conv)
            with self._programs_lock:
                self._sizes_by_shapes[key] = sizes
                while len(self._sizes_by_shapes) > MAX_BOUND_SHAPES:
                    self._sizes_by_shapes.popitem(last=False)
        return conv, sizes

    def run(self, feeds: dict) -> dict:
        return self._execute(feeds, None)

    def run_timed(self, feeds: dict) -> tuple[dict, list[float]]:
        """(outputs, seconds of each step of this call's program, in order): the profiling run
        mode (`runtime.profile`). `run` itself reads no clock: its loop stays free of timing
        (but for the native loop's counter, which `run_timed` reads back)."""
        times: list[float] = []
        return self._execute(feeds, times), times

    def profile(self, feeds: dict, runs: int = 10, warmup: int = 1, onnx_model=None):
        """Where a call's time goes, step by step (`runtime.profile.profile`): a `Profile`
        whose `table()` groups the steps by template or kind; `onnx_model` (path or
        ModelProto) adds onnxruntime's own profile of the same feeds beside it."""
        from runtime.profile import profile
        return profile(self, feeds, runs=runs, warmup=warmup, onnx_model=onnx_model)

    def _execute(self, feeds: dict, times: list | None) -> dict:
        with self._lock:
            feeds, prog = self._program_for(feeds)
            while True:
                # a program's first call is timed (coverage's time shares), and a body's calls while its
                # enclosing model's call is: the coverage takes the bodies' time out of their node's
                if times is None and (not prog.timed or (self._parent is not None and self._parent._timing)):
                    times = []
                try:
                    with self.backend.fp_mode():
                        if times is None:
                            return self._run(feeds, prog)
                        prog.timed = True
                        del times[:]
                        return self._run_timed(feeds, prog, times)
                except _RefFailed as e:  # only with a fallback: that node moves to onnxruntime
                    self._unsupported.add(e.node.name)
                    self._index()
                    self._programs.clear()
                    prog = self.program(prog.sizes)

    def _start(self, feeds: dict, prog: Program) -> list:
        """This call's environment: the program's, with the feeds in their slots."""
        env = list(prog.env0)
        slot, backend = self._slot, self.backend
        device = backend.device
        for k, v in feeds.items():   # on a GPU: one host-to-device copy per input and call
            env[slot[k]] = backend.asarray(v, v.dtype) if device else v
        for s_, buf in prog.staged:  # what the kernels' calls read the small inputs from
            np.copyto(buf, env[s_])
        return env

    def _run(self, feeds: dict, prog: Program) -> dict:
        env = self._start(feeds, prog)
        run_step = self._run_step
        try:
            for batch, step, _ in prog.runs:
                if batch is not None:          # kernels on the program's own buffers, run natively
                    batch()
                    continue
                fixed = step.fixed
                if fixed is not None:          # a kernel on the program's own buffers
                    for run, args in fixed:
                        run(*args)
                else:
                    run_step(prog, step, env)
        except IndexError as e:
            raise _bad_value(step[batch.failed] if batch is not None else step, e) from None
        return self._results(feeds, env, prog)

    def _run_timed(self, feeds: dict, prog: Program, times: list) -> dict:
        """`_run` with a clock read around every step: seconds per step appended to `times`
        and added to the steps' totals (`Step.seconds`, `Step.calls`). Batched steps run as
        `_run` runs them and take their times from the batch's own clock (`cpu._Batch.seconds`):
        timed one by one from Python, ViT-small's steps summed to 1.10x its call (each kernel
        call ~0.7 us more), and tune's estimate, made of step times, ran that much high."""
        env = self._start(feeds, prog)
        run_step = self._run_step
        perf = time.perf_counter
        self._timing = True
        try:
            for batch, step, grouped in prog.runs:
                if batch is not None:          # as `_run` runs it; its calls' own times, per step
                    batch()
                    steps, starts = grouped
                    for st, dt in zip(steps, np.add.reduceat(batch.seconds(), starts).tolist()):
                        times.append(dt)
                        st.seconds += dt
                        st.calls += 1
                    continue
                t0 = perf()
                fixed = step.fixed
                if fixed is not None:
                    for run, args in fixed:
                        run(*args)
                else:
                    run_step(prog, step, env)
                dt = perf() - t0
                times.append(dt)
                step.seconds += dt
                step.calls += 1
        except IndexError as e:
            raise _bad_value(step[batch.failed] if batch is not None else step, e) from None
        finally:
            self._timing = False
        return self._results(feeds, env, prog)

    def _run_step(self, prog: Program, step: Step, env: list) -> None:
        """One step whose launch is not fixed for the program's life."""
        if step.host:                    # a GPU model's step without a GPU kernel: on host copies
            self._run_on_host(prog, step, env)
        elif step.kernel is not None:    # a kernel reading a feed or a value made on this call
            _, s, view, _ = step.outs[0]
            out = view if view is not None else self.backend.empty(step.out_shape, step.out_dtype)
            arrays = [env[i] for i in step.in_slots] if step.dynamic_inputs else None
            for run, args in step.plan.fill(arrays, out):
                run(*args)
            env[s] = out
        elif step.session is not None:
            self._hand_on(step, step.session([env[i] if i >= 0 else None for i in step.in_slots]), env)
        else:
            self._run_reference(prog, step, env)

    def _results(self, feeds: dict, env: list, prog: Program) -> dict:
        device, backend, owned = self.backend.device, self.backend, prog.owned
        result = {}
        for o, s, maybe_shared in self._outputs:
            v = env[s]
            if device:   # one device-to-host copy per output and call
                v = backend.to_host(v)
            elif s in owned:   # the program's buffer: a copy the caller keeps, aligned where fed back
                v = aligned_copy(v, STAGE_MAX_BYTES)   # as an input it is read in place (smaller: staged)
            elif maybe_shared and (o in feeds or o in self.graph.constants):   # the caller's array or ours: a copy
                v = np.array(v)
            result[o] = v
        return result

    def _run_on_host(self, prog: Program, step: Step, env: list) -> None:
        """A GPU model's step that runs on the host: its inputs come down, its results go back
        up into the planned device buffers (other values stay host arrays until a kernel reads
        them: `Backend.asarray` uploads those)."""
        to_host = self.backend.to_host
        host = list(env)
        for i in step.in_slots:
            if i >= 0 and host[i] is not None:
                host[i] = to_host(host[i])
        if step.kernel is not None:
            out = step.kernel([host[i] for i in step.in_slots], np.empty(step.out_shape, step.out_dtype), None)
            self._hand_on(step, {step.subgraph.output: out}, env)
        elif step.session is not None:
            self._hand_on(step, step.session([host[i] if i >= 0 else None for i in step.in_slots]), env)
        else:
            self._run_reference(prog, step, host)
            for v, s, _, _ in step.outs:
                env[s] = host[s]

    def _run_reference(self, prog: Program, step: Step, env: list) -> None:
        g, slot, local = self.graph, self._slot, {}
        for n in step.subgraph.nodes:
            args = [(local[i] if i in local else env[slot[i]]) if i else None for i in n.inputs]
            try:
                outs, fell = run_node(g, n, args)
            except UnsupportedOpError:
                if self.fallback:
                    raise _RefFailed(n) from None
                raise
            if fell and n.op not in prog.fallback_nodes:
                prog.fallback_nodes.append(n.op)
            for o, v in zip(n.outputs, outs):
                if o:
                    local[o] = np.asarray(v)
        self._hand_on(step, local, env)

    def _hand_on(self, step: Step, local: dict, env: list) -> None:
        """Put a reference or onnxruntime step's results where the plan wants them."""
        for v, s, view, is_out in step.outs:
            a = local[v]
            if view is not None and a.shape == view.shape and a.dtype == view.dtype:
                self.backend.copy_into(view, a)
                a = view
            elif self.backend.device:   # a host value outside the device plan: kernels upload it
                a = np.array(a)
            elif view is not None or is_out or a.base is not None:
                # a view may point into the arena (Reshape of a planned buffer): own the bytes
                if view is not None:
                    warnings.warn(f"value '{v}' came out as {a.dtype}{list(a.shape)}, the plan expected "
                                  f"{view.dtype}{list(view.shape)}: kept outside the memory plan")
                a = np.array(a)
            env[s] = a

    def coverage(self, sizes: dict | None = None) -> Coverage:
        progs = [self.program(sizes)] if sizes is not None else list(self._programs.values())
        counts, nodes, secs, fb = {}, {}, {}, []
        bodies_seen: set[int] = set()  # a control-flow node's nested models serve every program
        for p in progs:
            for s in p.steps + p.static_steps:
                counts[s.kind] = counts.get(s.kind, 0) + 1
                nodes[s.kind] = nodes.get(s.kind, 0) + len(s.subgraph.nodes)
                secs[s.kind] = secs.get(s.kind, 0.0) + s.seconds
                if s.kind == CONTROL_FLOW and id(s.session) not in bodies_seen:  # bodies count as what they ran on
                    bodies_seen.add(id(s.session))
                    secs[CONTROL_FLOW] -= s.session.build_seconds
                    for body in s.session.compiled:
                        c = body.coverage()
                        for k in c.counts:
                            counts[k] = counts.get(k, 0) + c.counts[k]
                            nodes[k] = nodes.get(k, 0) + c.nodes[k]
                            secs[k] = secs.get(k, 0.0) + c.seconds[k]
                            secs[CONTROL_FLOW] -= c.seconds[k]
                        fb += [op for op in c.fallback_ops if op not in fb]
            fb += [op for op in p.fallback_nodes if op not in fb]
        return Coverage(counts, nodes, secs, fb)

"""`Kernel`: a compiled (workload, config) as data; `BoundKernel` runs it on a backend.

A `Kernel` holds the lowered template (loop module + launch description) and the
backend's artifact; it pickles, so a builder in one process (or on one machine)
hands it to a runner elsewhere, which loads the artifact instead of compiling and
never looks the template up again.

`prepare` runs the launch's constant-packing steps once (`Prepared`: packed
buffers and views of constant inputs), shared by the programs of every shape;
`BoundKernel` then interprets the launch steps on each call. Workspaces come from
the caller (the executor's memory plan) or are allocated once per bound kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from codegen.backend import Artifact, Backend, get_backend
from ir.workload import Workload, work_estimate
from schedules.launch import Call, In, Library, Out, Packed, Repeat, Scalar, Table, Var, Work
from schedules.space import Config
from schedules.template import Lowered, Template


@dataclass(frozen=True)
class Kernel:
    workload: Workload
    template: str
    config: Config
    lowered: Lowered
    artifact: Artifact

    @property
    def source(self) -> str:
        return self.artifact.source

    def bind(self, arrays: list, backend: Backend | str | None = None) -> "BoundKernel":
        """Prepare with the constant inputs (others may be None): weight packing happens here, once."""
        return BoundKernel(self, prepare(self, arrays, backend), backend)


def compile_kernel(template: Template, wl: Workload, cfg: Config, backend: Backend | str | None = None) -> Kernel:
    backend = get_backend(backend)
    lowered = template.lower(wl, cfg)
    return Kernel(wl, template.name, cfg, lowered, backend.compile(lowered.module))


@dataclass
class Prepared:
    """What `prepare` made from the constants: packed buffers, and views of constant
    inputs (made on first use, keyed by their `In`, so every shape's launch shares them)."""
    packed: dict = field(default_factory=dict)
    views: dict = field(default_factory=dict)


def _functions(kernel: Kernel, backend: Backend) -> dict:
    cache = backend.__dict__.setdefault("_loaded", {})
    fns = cache.get(kernel.artifact.key)
    if fns is None:
        fns = cache[kernel.artifact.key] = backend.load(kernel.artifact)
    return fns


def prepare(kernel: Kernel, arrays: list, backend: Backend | str | None = None) -> Prepared:
    backend = get_backend(backend)
    fns = _functions(kernel, backend)
    launch = kernel.lowered.launch
    p = Prepared({b.name: backend.empty(b.shape, b.dtype) for b in launch.packed})
    consts = [a if spec["const"] else None for a, spec in zip(arrays, kernel.workload.inputs)]
    env = _Env(kernel, backend, p, consts, None, {}, {}, _tables(launch, backend))
    _run(backend, fns, launch.prepare, env)
    return p


class _Env:
    """Resolves launch arguments to arrays for one call."""
    __slots__ = ("kernel", "backend", "prepared", "arrays", "out", "work", "vars", "tables")

    def __init__(self, kernel, backend, prepared, arrays, out, work, vars_, tables):
        self.kernel, self.backend, self.prepared = kernel, backend, prepared
        self.arrays, self.out, self.work, self.vars, self.tables = arrays, out, work, vars_, tables

    def view(self, a: In):
        spec = self.kernel.workload.inputs[a.index]
        if spec["const"]:
            v = self.prepared.views.get(a)
            if v is None:
                v = self.prepared.views[a] = self._input(a, spec)
            return v
        return self._input(a, spec)

    def _input(self, a: In, spec):
        x = self.arrays[a.index]
        if x is None:
            raise ValueError(f"launch reads input {a.index}, which was not given")
        if a.broadcast is not None:   # a host-side view (device arrays come down for it)
            x = np.broadcast_to(self.backend.to_host(x), a.broadcast)
        x = self.backend.asarray(x, a.dtype or spec["dtype"])
        if isinstance(x, np.ndarray) and not x.flags.writeable:   # numba signatures take no read-only arrays
            x = x.copy()
        return x.reshape(a.shape) if a.shape is not None else x

    def resolve(self, a):
        if isinstance(a, In):
            return self.view(a)
        if isinstance(a, Out):
            return self.out.reshape(a.shape) if a.shape is not None else self.out
        if isinstance(a, Work):
            return self.work[a.name]
        if isinstance(a, Packed):
            return self.prepared.packed[a.name]
        if isinstance(a, Table):
            return self.tables[a.name]
        if isinstance(a, Scalar):
            return a.value
        if isinstance(a, Var):
            return self.vars[a.name]
        raise TypeError(f"unknown launch argument {a!r}")


def _tables(launch, backend: Backend) -> dict:
    """The launch's constant tables in the backend's memory (uploaded once per bound kernel)."""
    return {name: backend.asarray(t, t.dtype) for name, t in launch.tables.items()}


def _run(backend: Backend, fns: dict, steps, env: _Env) -> None:
    for s in steps:
        if isinstance(s, Call):
            backend.call(fns[s.function], [env.resolve(a) for a in s.args], s.items, s.parallel, s.grid, s.block)
        elif isinstance(s, Library):
            backend.library(s.routine)(*[env.resolve(a) for a in s.args])
        elif isinstance(s, Repeat):
            for v in range(s.count):
                env.vars[s.var] = v
                _run(backend, fns, s.body, env)
        else:
            raise TypeError(f"unknown launch step {s!r}")


_IN, _OUT = 1, 2   # argument kinds filled on each call; all others are fixed per plan


def _launcher(backend: Backend, s: Call, work_estimate: int | None):
    """(run, trailing args) of one `Call` step: `run(*args, *trailing)` runs it. A backend
    with a `launcher` decides once per plan how to run it (on the CPU: how many threads);
    others are called through `Backend.call` on every run."""
    make = getattr(backend, "launcher", None)
    if make is not None:
        return make(s.items, s.parallel, s.grid, s.block, work_estimate)
    return None


class Calls:
    """A launch turned into flat calls for given buffers: `calls` is a tuple of
    (run, args) with every argument that stays the same from call to call resolved;
    `dynamic` lists (call index, position, kind, what, dtype) of the arguments that are filled
    on each call (inputs not given when the plan was made, the output when not given).
    `fill(arrays, out)` gives the calls to run: `for run, args in ...: run(*args)`."""
    __slots__ = ("calls", "dynamic", "reads_inputs", "_input")

    def __init__(self, calls: tuple, dynamic: tuple, resolve_input):
        self.calls, self.dynamic, self._input = calls, dynamic, resolve_input
        self.reads_inputs = any(kind == _IN for _, _, kind, _, _ in dynamic)   # `fill` needs the arrays

    def fill(self, arrays, out) -> tuple | list:
        if not self.dynamic:
            return self.calls
        calls = list(self.calls)
        last, args = -1, None
        for k, pos, kind, what, dtype in self.dynamic:
            if k != last:
                if args is not None:
                    calls[last] = (calls[last][0], args)
                last, args = k, list(calls[k][1])
            if kind == _IN:
                args[pos] = self._input(what, arrays[what.index], dtype)
            else:
                args[pos] = out if what is None or out.shape == what else out.reshape(what)
        calls[last] = (calls[last][0], args)
        return calls


class BoundKernel:
    """A kernel with its constants prepared, callable as `bk(arrays, out)`.

    `plan(arrays, out, work)` turns the launch into flat calls (`Calls`) for buffers that
    stay the same from call to call (the executor's arena views): `Repeat` steps unrolled,
    every argument fixed for these buffers resolved once (scalars, tables, packed buffers,
    workspaces, views of constants and of the given arrays), and the backend's way to run
    each step (thread count) chosen once. A call then costs one Python call per step;
    `bk(arrays, out)` uses a plan with every input and the output filled on each call."""

    def __init__(self, kernel: Kernel, state: Prepared, backend: Backend | str | None = None):
        self.kernel, self.state = kernel, state
        self.backend = get_backend(backend)
        self.functions = _functions(kernel, self.backend)
        self._own_work: dict | None = None
        self._tables = _tables(kernel.lowered.launch, self.backend)
        self._generic, self._generic_work = None, None
        # its size for the backend's thread count (`codegen.cpu.threads_for`); None: no size cut, the
        # kernel runs on every thread (where `tune`'s in-model check found that faster: `runtime.choose.SPLIT`)
        self.work_estimate: int | None = work_estimate(kernel.workload)

    @property
    def workspaces(self) -> tuple:
        return self.kernel.lowered.launch.workspaces

    def own_work(self) -> dict:
        """This kernel's workspaces, allocated once (when the caller gives none)."""
        if self._own_work is None:
            self._own_work = {b.name: self.backend.empty(b.shape, b.dtype)
                              for b in self.kernel.lowered.launch.workspaces}
        return self._own_work

    def _input(self, a: In, x, dtype=None):
        """Input `a` of array `x`, as the kernel's function takes it (what `_Env` does per call);
        `dtype`: the NumPy dtype it is read as, when the caller has it at hand."""
        if x is None:
            raise ValueError(f"launch reads input {a.index}, which was not given")
        if a.broadcast is not None:
            x = np.broadcast_to(x, a.broadcast)
        x = self.backend.asarray(x, dtype if dtype is not None else self._dtype(a))
        if not getattr(x.flags, "writeable", True):   # numba signatures take no read-only arrays
            x = x.copy()                              # (a CUDA device array's flags: a dict, no such key)
        return x if a.shape is None or x.shape == a.shape else x.reshape(a.shape)

    def _dtype(self, a: In):
        d = a.dtype or self.kernel.workload.inputs[a.index]["dtype"]
        try:
            return np.dtype(d)
        except TypeError:   # a name NumPy does not know (bfloat16): the backend resolves it
            return d

    def _fixed_input(self, a: In, x):
        """The view of `x` the kernel reads, if it aliases `x` (no conversion copy): only
        then may a plan keep it, since `x`'s contents change from call to call."""
        if a.broadcast is not None:
            return None
        spec = self.kernel.workload.inputs[a.index]
        y = self.backend.asarray(x, a.dtype or spec["dtype"])
        if y is not x or not getattr(x.flags, "writeable", True):
            return None
        return x.reshape(a.shape) if a.shape is not None else x

    def plan(self, arrays: list | None = None, out=None, work: dict | None = None) -> Calls:
        """Flat calls of the launch for these buffers. `arrays[i]` given (not None): input i
        is always that array (an input that would need a converted copy stays per call);
        `out` given: the output is always that array; `work`: the workspaces (None: own)."""
        work = self.own_work() if work is None else work
        arrays = list(arrays) if arrays is not None else [None] * len(self.kernel.workload.inputs)
        launch = self.kernel.lowered.launch
        env = _Env(self.kernel, self.backend, self.state, arrays, out, work, {}, self._tables)
        const = [spec["const"] for spec in self.kernel.workload.inputs]
        calls, dynamic = [], []
        for s in _unrolled(launch.steps, env.vars):
            args = []
            for pos, a in enumerate(s.args):
                if isinstance(a, In) and not const[a.index]:
                    v = self._fixed_input(a, arrays[a.index]) if arrays[a.index] is not None else None
                    if v is None:
                        dynamic.append((len(calls), pos, _IN, a, self._dtype(a)))
                    args.append(v)
                elif isinstance(a, Out):
                    if out is None:
                        dynamic.append((len(calls), pos, _OUT, a.shape, None))
                        args.append(None)
                    else:
                        args.append(out.reshape(a.shape) if a.shape is not None else out)
                else:
                    args.append(env.resolve(a))
            if isinstance(s, Call):
                fn = self.functions[s.function]
                how = _launcher(self.backend, s, self.work_estimate)
                if how is None:
                    backend = self.backend
                    run = (lambda f, items, par, grid, block: lambda *xs: backend.call(f, list(xs), items, par,
                                                                                        grid, block))(
                        fn, s.items, s.parallel, s.grid, s.block)
                else:
                    run, trailing = how(fn)
                    args += trailing
            elif isinstance(s, Library):
                run = self.backend.library(s.routine)
            else:
                raise TypeError(f"unknown launch step {s!r}")
            calls.append((run, tuple(args)))
        return Calls(tuple(calls), tuple(dynamic), self._input)

    def __call__(self, arrays: list, out: np.ndarray | None = None, work: dict | None = None) -> np.ndarray:
        """Run on `arrays` into `out` (allocated when None). `work`: name -> array of each
        workspace (from a memory plan); when None, this kernel's own, allocated once."""
        if out is None:
            wl = self.kernel.workload
            out = self.backend.empty(wl.output_shape, wl.output_dtype)
        if work is None:
            work = self.own_work()
        if self._generic is None or self._generic_work is not work:
            consts = [a if spec["const"] else None for a, spec in zip(arrays, self.kernel.workload.inputs)]
            self._generic, self._generic_work = self.plan(consts, None, work), work   # views of constants kept
        for run, args in self._generic.fill(arrays, out):
            run(*args)
        return out


def _unrolled(steps, vars_: dict):
    """The launch's `Call`/`Library` steps in order, `Repeat` bodies repeated with their
    variable set in `vars_` while each copy is resolved."""
    for s in steps:
        if isinstance(s, Repeat):
            for v in range(s.count):
                vars_[s.var] = v
                yield from _unrolled(s.body, vars_)
        else:
            yield s

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
from ir.workload import Workload
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


_IN, _OUT, _VAR = 1, 2, 3   # argument kinds resolved on every call; all others are fixed per kernel


class BoundKernel:
    """A kernel with its constants prepared, callable as `bk(arrays, out)`.

    The first call (and a call with other workspaces) turns the launch into a plan: per
    step, the function, its arguments with everything fixed for this kernel already
    resolved (scalars, tables, packed buffers, workspaces, views of constants), and the
    few positions filled on each call (inputs, the output, `Repeat` variables). A call then
    costs a list copy and a backend call per step."""

    def __init__(self, kernel: Kernel, state: Prepared, backend: Backend | str | None = None):
        self.kernel, self.state = kernel, state
        self.backend = get_backend(backend)
        self.functions = _functions(kernel, self.backend)
        self._own_work: dict | None = None
        self._tables = _tables(kernel.lowered.launch, self.backend)
        self._plan, self._plan_work = None, None

    @property
    def workspaces(self) -> tuple:
        return self.kernel.lowered.launch.workspaces

    def _compile(self, steps, env: _Env) -> list:
        const = [spec["const"] for spec in self.kernel.workload.inputs]
        plan = []
        for s in steps:
            if isinstance(s, Repeat):
                plan.append((s.var, s.count, self._compile(s.body, env)))
                continue
            args, dynamic = [], []
            for pos, a in enumerate(s.args):
                if isinstance(a, In) and not const[a.index]:
                    dynamic.append((pos, _IN, a))
                elif isinstance(a, Out):
                    dynamic.append((pos, _OUT, a.shape))
                elif isinstance(a, Var):
                    dynamic.append((pos, _VAR, a.name))
                args.append(None if dynamic and dynamic[-1][0] == pos else env.resolve(a))
            if isinstance(s, Call):
                fn, backend = self.functions[s.function], self.backend
                run = (lambda f, items, par, grid, block: lambda xs: backend.call(f, xs, items, par, grid, block))(
                    fn, s.items, s.parallel, s.grid, s.block)
            elif isinstance(s, Library):
                routine = self.backend.library(s.routine)
                run = (lambda r: lambda xs: r(*xs))(routine)
            else:
                raise TypeError(f"unknown launch step {s!r}")
            plan.append((run, args, dynamic))
        return plan

    def _execute(self, plan, env: _Env, arrays, out) -> None:
        for step in plan:
            if len(step) == 3 and isinstance(step[0], str):   # Repeat: (var, count, body)
                var, count, body = step
                for v in range(count):
                    env.vars[var] = v
                    self._execute(body, env, arrays, out)
                continue
            run, args, dynamic = step
            if dynamic:
                args = list(args)
                for pos, kind, what in dynamic:
                    if kind == _IN:
                        args[pos] = env.view(what)
                    elif kind == _OUT:
                        args[pos] = out if what is None else out.reshape(what)
                    else:
                        args[pos] = env.vars[what]
            run(args)

    def __call__(self, arrays: list, out: np.ndarray | None = None, work: dict | None = None) -> np.ndarray:
        """Run on `arrays` into `out` (allocated when None). `work`: name -> array of each
        workspace (from a memory plan); when None, this kernel's own, allocated once."""
        if out is None:
            wl = self.kernel.workload
            out = self.backend.empty(wl.output_shape, wl.output_dtype)
        launch = self.kernel.lowered.launch
        if work is None:
            if self._own_work is None:
                self._own_work = {b.name: self.backend.empty(b.shape, b.dtype) for b in launch.workspaces}
            work = self._own_work
        env = _Env(self.kernel, self.backend, self.state, arrays, out, work, {}, self._tables)
        if self._plan is None or self._plan_work is not work:
            self._plan, self._plan_work = self._compile(launch.steps, env), work
        self._execute(self._plan, env, arrays, out)
        return out

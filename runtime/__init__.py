"""Deploy: `runtime.load(model, db=… | plan=…)` → a callable model with the best kernels.

Imports neither the tuner, XGBoost nor Ray.
"""
from __future__ import annotations

import warnings

from codegen import get_backend
from ir import Graph, ModelError, import_onnx, partition, simplify
from ir.shapes import DimRange
from runtime.choose import Chooser, deployed_record
from runtime.executor import MAX_PROGRAMS, CompiledModel, Coverage, FallbackError
from runtime.fallback import FALLBACKS, check_fallback
from runtime.memory import MemoryPlan
from runtime.plan import Plan, PlanEntry, PlanError
from runtime.profile import Profile, ProfileError, profile


def load(model, db=None, plan=None, dims: dict | None = None, target: str | None = None,
         strict: bool = False, max_programs: int = MAX_PROGRAMS, fallback: str | None = None,
         plugins=(), settings=None) -> CompiledModel:
    """Load an ONNX model with kernels from a database URL/`Database` or a plan (path or
    `Plan`); neither means default configs for every subgraph.

    `model`: a path, a ModelProto, or an `ir.Graph` already imported (`ir.import_onnx`,
    simplified or not), so a caller that has read the model (`tune`) does not read it
    again; the graph is not changed, and `dims` and the plan's ranges apply to it as
    they would to the file.

    `dims` declares ranges of dynamic dims: {"batch": (1, 64)} or DimRange values.
    `max_programs`: how many per-shape programs (with their arenas) stay built; the least
    recently used beyond that are dropped and rebuilt when their shape returns.
    `fallback="onnxruntime"` runs what tensortune cannot (ops without a definition, or
    whose reference fails) in onnxruntime, one session per maximal region (`strict`
    still refuses it). `plugins` names modules that register custom ops and templates
    (see `ir.custom`); installed `tensortune.plugins` entry points load too.
    `target` names the backend kernels are built and run with (`codegen.backend`; default the
    settings' backend, "cpu" unless TENSORTUNE_BACKEND says otherwise: "cpu",
    "cuda" — subgraphs without a GPU template then run CPU kernels, shown as "cpu-fallback"
    in the coverage — or one a plugin registers); `settings` (`ir.settings.Settings`) gives its thread count
    and kernel cache (default: the process default, which the CLIs read from the environment).
    """
    from ir.custom import load_plugins
    check_fallback(fallback)
    from ir.settings import resolve
    settings = resolve(settings)
    load_plugins(list(plugins) + [p for p in settings.plugins if p not in plugins])   # before the backend:
    backend = get_backend(target or settings.backend, settings)                          # a plugin may register it
    ranges = {k: v if isinstance(v, DimRange) else DimRange(k, int(v[0]), int(v[1])) for k, v in (dims or {}).items()}
    tgt = backend.target()
    if plan is not None and not isinstance(plan, Plan):
        plan = Plan.load(plan)
    if plan is not None:
        for k, (lo, hi) in plan.dims.items():
            ranges.setdefault(k, DimRange(k, lo, hi))
        if plan.target.get("key") != tgt.key:
            msg = (f"plan was tuned on target {plan.target.get('key')} ({plan.target.get('cpu', '?')}), "
                   f"this machine is {tgt.key} ({tgt}): its configs are not used")
            if strict:
                raise PlanError(msg)
            warnings.warn(msg + "; running default configs")
            plan = None
    graph = simplify(_declared(model, ranges) if isinstance(model, Graph) else import_onnx(model, ranges or None))
    if db is not None and not hasattr(db, "best"):
        from database import Database
        db = Database(db)
    chooser = Chooser(plan, db, tgt.key, strict=strict, kind=backend.template_kind)
    return CompiledModel(graph, partition(graph), chooser, strict=strict,
                         max_programs=max_programs, fallback=fallback, backend=backend)


def _declared(graph: Graph, ranges: dict[str, DimRange]) -> Graph:
    """`graph` with `ranges` declared on its dynamic dims, as `import_onnx` declares them."""
    unknown = sorted(set(ranges) - set(graph.dims))
    if unknown:
        raise ModelError(f"--dim names {unknown} are not dynamic dims of the model "
                         f"(it has: {sorted(graph.dims) or 'none'})")
    return graph.copy(dims={**graph.dims, **ranges}) if ranges else graph


def default_sizes(dims: dict[str, DimRange], shapes: dict[str, list[int]] | None = None) -> dict[str, int]:
    """The dim sizes to run at: the first `--shape` point (32 for dims not given)."""
    from ir.points import shape_points
    return shape_points(dims, shapes)[0]


def build_plan(graph, db, points: list[dict], target_key: str, model_name: str = "", target=None) -> Plan:
    """The best stored config per subgraph workload at each tuned shape point (`target`: the
    `codegen.Target` whose key is `target_key`; default the settings' backend's)."""
    from ir.workload import make_workload
    from schedules import find_template
    target = target or get_backend().target()
    from codegen.backend import template_kind
    kind = template_kind(target.kind)
    entries, seen = [], set()
    for sizes in points:
        for sg in partition(graph):
            wl = make_workload(graph, sg, sizes)
            if wl.key in seen or find_template(wl, kind) is None:
                continue
            seen.add(wl.key)
            r = deployed_record(db, wl.key, target_key)   # what runtime.load(db=...) deploys
            if r is not None:
                entries.append(PlanEntry(wl.key, wl.signature, r.template, r.template_version, wl.dims, r.config, r.median))
    dims = {k: [v.lo, v.hi] for k, v in graph.dims.items()}
    return Plan(target.describe(), dims, entries, model_name)


__all__ = ["load", "build_plan", "default_sizes", "CompiledModel", "Coverage", "MemoryPlan", "Plan", "PlanEntry",
           "PlanError", "FallbackError", "FALLBACKS", "Profile", "ProfileError", "profile"]

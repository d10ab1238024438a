"""Custom ops: the public API for adding an op (and a template for it) from outside.

A *plugin* is an importable Python module that, on import, registers ops with
`register_op` and, if it wants them compiled, templates with
`schedules.register_template`::

    # my_ops.py
    import numpy as np
    from ir.custom import register_op, same_shape
    register_op("Swish2", domain="my.ops", kind="elemwise", infer=same_shape,
                ref=lambda node, xs: [xs[0] / (1 + np.exp(-2 * xs[0]))],
                expr=lambda node, a: f"({a[0]} / (np.float32(1) + math.exp(np.float32(-2) * {a[0]})))")

Plugins reach every process that needs them:

- `tune --plugin my_ops` / `tune-run --plugin my_ops` (or `$TENSORTUNE_PLUGINS`,
  comma-separated, read by the CLIs only) and `runtime.load(..., plugins=["my_ops"])`
  call `load_plugins`; a plugin is a module name or the path of a `.py` file;
- installed packages may declare an entry point in the group `tensortune.plugins`
  (`[project.entry-points."tensortune.plugins"] my_ops = "my_ops"`); `load_plugins`
  loads every one of them;
- the tuner's worker processes are started with the plugins their parent loaded
  (`loaded_plugins()`), and import them before their first job.

`kind` is the op's fusion pattern kind (elemwise, broadcast, injective, reduce, anchor,
opaque: see `ir.ops.registry`); `infer(node, input types, constant inputs) -> output
types` is its shape function; `ref(node, input arrays) -> output arrays` its NumPy
reference (the correctness oracle every tuned kernel is checked against); `expr`, for
elemwise/broadcast ops, the scalar numba expression the elementwise templates inline.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Iterable

from ir.errors import TensortuneError
from ir.graph import Node
from ir.ops.registry import (ANCHOR, BROADCAST, ELEMWISE, INJECTIVE, OPAQUE, OPS, REDUCE, ExprFn, InferFn, OpDef,
                             RefFn, register, same_as_input)

KINDS = (ELEMWISE, BROADCAST, INJECTIVE, REDUCE, ANCHOR, OPAQUE)
ENTRY_POINT_GROUP = "tensortune.plugins"

_DOMAINS: dict[str, str] = {}      # custom op name -> its ONNX domain ("" for the default domain)
_LOADED: list[str] = []            # plugin modules imported in this process, in order
_entry_points_done = False

same_shape: InferFn = same_as_input(0)


class PluginError(TensortuneError):
    """A plugin module that cannot be imported, or an op registration that conflicts."""


def register_op(name: str, kind: str, infer: InferFn, ref: RefFn, expr: ExprFn | None = None,
                domain: str = "", flops_per_elem: int = 1) -> OpDef:
    """Register op `name` of ONNX `domain`. Registering the same op of the same domain again
    replaces it (a plugin imported twice); taking the name of a built-in op or of another
    domain's op is refused."""
    if kind not in KINDS:
        raise PluginError(f"custom op '{name}': unknown kind '{kind}' (choose from: {', '.join(KINDS)})")
    if kind in (ELEMWISE, BROADCAST) and expr is not None and not callable(expr):
        raise PluginError(f"custom op '{name}': expr must be a function (node, argument expressions) -> str")
    if not (callable(infer) and callable(ref)):
        raise PluginError(f"custom op '{name}': infer and ref must be functions")
    if name in OPS and _DOMAINS.get(name) != domain:
        owner = "a built-in op" if name not in _DOMAINS else f"an op of domain '{_DOMAINS[name]}'"
        raise PluginError(f"custom op '{name}' (domain '{domain}') conflicts with {owner} of that name")
    _DOMAINS[name] = domain
    return register(name, kind, infer, ref, expr, flops_per_elem)


def has_definition(node: Node) -> bool:
    """True if an op definition covers `node`: a built-in op of the default domain, or a
    custom op registered for the node's domain."""
    if node.op not in OPS:
        return False
    domain = node.attrs.get("_domain", "")
    if domain in ("", "ai.onnx"):
        domain = ""
    return _DOMAINS.get(node.op, "") == domain


def load_plugins(modules: Iterable[str] = (), entry_points: bool = True) -> list[str]:
    """Import plugin modules by name (and, once per process, every `tensortune.plugins`
    entry point). Returns the plugins loaded so far in this process."""
    global _entry_points_done
    if entry_points and not _entry_points_done:
        _entry_points_done = True
        from importlib.metadata import entry_points as eps
        for ep in eps(group=ENTRY_POINT_GROUP):
            _import(ep.value.split(":")[0].strip(), f"entry point '{ep.name}'")
    for name in modules:
        name = name.strip()
        if name:
            _import(name, "--plugin")
    return loaded_plugins()


def _import(module: str, where: str) -> None:
    """Import a plugin by module name, or from a `.py` file path (made absolute, so that
    worker processes started elsewhere find the same file)."""
    if module.endswith(".py") or os.sep in module:
        module = os.path.abspath(module)
    if module in _LOADED:
        return
    try:
        if module.endswith(".py"):
            if not os.path.isfile(module):
                raise FileNotFoundError(f"no file {module}")
            name = "tensortune_plugin_" + os.path.splitext(os.path.basename(module))[0]
            spec = importlib.util.spec_from_file_location(name, module)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        else:
            importlib.import_module(module)
    except TensortuneError:
        raise
    except Exception as e:
        raise PluginError(f"plugin '{module}' ({where}) cannot be imported: {type(e).__name__}: {e}") from None
    _LOADED.append(module)


def loaded_plugins() -> list[str]:
    return list(_LOADED)


def plugins_from_env(value: str | None) -> list[str]:
    """The plugin list of `$TENSORTUNE_PLUGINS` (comma-separated); for the CLIs."""
    return [p.strip() for p in (value or "").split(",") if p.strip()]

"""Packages whose names load on first use (PEP 562): `import ir.errors` or
`import database.record` then does not pay for what the package's other modules
import (sympy, onnx, SQLAlchemy)."""
from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str]):
    """The module `__getattr__` of `package`: name -> the module that defines it, imported
    on first use and then kept as a plain attribute."""

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def load_object(spec):
    """What a "module:attr" string names, imported now (anything else is returned as it is):
    how backends, builders and runners registered by name are created only when chosen.
    Raises ImportError (or AttributeError) naming what is missing."""
    if not isinstance(spec, str):
        return spec
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)

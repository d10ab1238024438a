"""A leaner numba pipeline for generated kernels (`pipeline_class=LeanCompiler` in their `@njit`).

Compile time is the tuner's main cost, and for generated code it goes mostly to
numba's passes over thousands of statements (register tiles are unrolled). Our
code never needs some of what numba's default nopython pipeline does for
arbitrary Python, so this pipeline leaves that out:

- SSA reconstruction (`reconstruct_ssa`): it exists so that a variable may change
  type between assignments. Generated kernels give every variable one type; without
  SSA numba types a variable by unifying its assignments (as numba did before 0.50)
  and LLVM's mem2reg builds the SSA form anyway. Its cost grows with (variables
  assigned more than once) x (statements): 64 accumulators of a 4x16 tile ->
  ~0.3-0.6 s per kernel.
- closure inlining (`inline_closure_likes`) runs only where the function makes a
  closure (`make_function` in its IR): generated code makes none.
- builtin calls typed again and again (`_get_call_type`): numba types `a * b` by trying
  each of the operator's templates in turn, for every statement, and again while
  lowering; a kernel's ~1000 such calls have a few dozen distinct argument types, so
  the typing of each (function, argument types) is remembered.
- LLVM's function passes on each new function (`_optimize_functions`) run at -O1
  without the vectorizers instead of -O3 with them: the library's -O3 module passes
  (with the SLP vectorizer) run over the linked module at finalization anyway. Some
  function passes must run first: without any, a 7x7 conv and a batch matmul ran 3x
  slower (measured; not analysed: numba's reference-count pruning runs between the two
  and may find less to prune); at -O1 they run as fast as at -O3.

Machine code is unchanged in speed (experiments/bench_compile.md). `lean_options` is
read at compile time; set `TENSORTUNE_NUMBA_LEAN=0` for numba's default passes (the
source, hence the cache key, is the same either way: use a fresh cache to compare).
"""
from __future__ import annotations

import os
import threading

from numba.core import ir, types
from numba.core import untyped_passes as _untyped
from numba.core.codegen import CPUCodeLibrary, create_pass_builder
from numba.core.types.functions import BaseFunction
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import PassManager, register_pass

__all__ = ["LeanCompiler", "lean_options"]

_LEAN = os.environ.get("TENSORTUNE_NUMBA_LEAN", "1") != "0"
# True: numba's way
lean_options = {"ssa": not _LEAN, "closures": not _LEAN, "retype_calls": not _LEAN, "function_passes": not _LEAN}


def _makes_closures(func_ir) -> bool:
    return any(isinstance(s, ir.Assign) and isinstance(s.value, ir.Expr) and s.value.op == "make_function"
               for block in func_ir.blocks.values() for s in block.body)


@register_pass(mutates_CFG=True, analysis_only=False)
class InlineClosuresWhereMade(_untyped.InlineClosureLikes):
    """numba's closure inlining, skipped (it walks every statement) when no closure is made."""
    _name = "inline_closures_where_made"

    def run_pass(self, state):
        if lean_options["closures"] or _makes_closures(state.func_ir):
            return super().run_pass(state)
        return False


# Types whose typing of a builtin call depends on the types alone (no value, no state):
# what the scalar and array arithmetic of a generated kernel passes to operators.
_PLAIN = (types.Number, types.Boolean, types.Array, types.NoneType)
_lean = threading.local()      # .on: what is lean, inside a LeanCompiler compile on this thread
_call_types: dict = {}         # (function type, typing context, arg types) -> signature
MAX_CALL_TYPES = 1 << 16
FUNCTION_OPT = 1   # LLVM -O level of the function passes (numba: 3, with the vectorizers)


def _plain(t) -> bool:
    return isinstance(t, _PLAIN) and (not isinstance(t, types.Literal) or isinstance(t, types.IntegerLiteral))


_numba_get_call_type = BaseFunction.get_call_type


def _get_call_type(self, context, args, kws):
    """numba's typing of a call of builtin `self` on `args`, remembered per (function,
    context, argument types) while generated kernels compile. numba tries each of an
    operator's templates in turn, formatting an error message for every one that does not
    match (~10 per `a * b`), and does it again for every statement and again while lowering:
    a register tile's ~1000 calls of a dozen distinct typings took ~1/3 of a conv's compile."""
    lean = getattr(_lean, "on", None)
    if kws or not (lean and lean["calls"]) or not all(_plain(a) for a in args):
        return _numba_get_call_type(self, context, args, kws)
    key = (self, context, tuple(args))
    sig = _call_types.get(key)
    if sig is None or sig.args not in self._impl_keys:
        sig = _numba_get_call_type(self, context, args, kws)
        if len(_call_types) >= MAX_CALL_TYPES:
            _call_types.clear()
        _call_types[key] = sig
    return sig


BaseFunction.get_call_type = _get_call_type

_numba_optimize_functions = CPUCodeLibrary._optimize_functions


def _optimize_functions(self, ll_module):
    """numba's function passes on each function of a new LLVM module, for generated kernels
    at -O1 without the vectorizers, the vectorizing left to the library's -O3 module passes
    (module docstring)."""
    lean = getattr(_lean, "on", None)
    if lean and lean["passes"]:
        ll_module.data_layout = self._codegen._data_layout   # what numba's version sets first
        for func in ll_module.functions:
            pb = create_pass_builder(self._codegen._tm, opt=FUNCTION_OPT, loop_vectorize=False, slp_vectorize=False)
            pb.getFunctionPassManager().run(func, pb)
        return
    _numba_optimize_functions(self, ll_module)


CPUCodeLibrary._optimize_functions = _optimize_functions


class LeanCompiler(CompilerBase):
    """numba's nopython pipeline without the passes generated kernels do not need; builtin
    calls typed once per argument types (`_get_call_type`); LLVM's function passes left to
    the module passes (`_optimize_functions`)."""

    def _compile_core(self):
        was = getattr(_lean, "on", None)
        _lean.on = {"calls": not lean_options["retype_calls"], "passes": not lean_options["function_passes"]}
        try:
            return super()._compile_core()
        finally:
            _lean.on = was

    def define_pipelines(self):
        base = DefaultPassBuilder.define_nopython_pipeline(self.state)
        pm = PassManager("tensortune_lean")
        for cls, desc in base.passes:
            if cls is _untyped.ReconstructSSA and not lean_options["ssa"]:
                continue
            if cls is _untyped.InlineClosureLikes:
                cls = InlineClosuresWhereMade
            pm.add_pass(cls, desc)
        pm.finalize()
        return [pm]

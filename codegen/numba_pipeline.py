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

LLVM's passes stay as numba runs them: skipping its per-function passes (the module's
-O3 pipeline runs after them anyway) saved ~0.3 s per conv kernel but made it 2.5x
slower (measured: the SLP vectorizer then finds less to do).

Machine code is unchanged in speed (experiments/bench_compile.md). `lean_options` is
read at compile time; set `TENSORTUNE_NUMBA_LEAN=0` for numba's default passes (the
source, hence the cache key, is the same either way: use a fresh cache to compare).
"""
from __future__ import annotations

import os

from numba.core import ir
from numba.core import untyped_passes as _untyped
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import PassManager, register_pass

__all__ = ["LeanCompiler", "lean_options"]

_LEAN = os.environ.get("TENSORTUNE_NUMBA_LEAN", "1") != "0"
lean_options = {"ssa": not _LEAN, "closures": not _LEAN}   # True: numba's pass runs


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


class LeanCompiler(CompilerBase):
    """numba's nopython pipeline without the passes generated kernels do not need."""

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

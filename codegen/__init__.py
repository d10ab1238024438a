"""Loop nest → Python source → numba kernel, with an on-disk kernel cache."""
from codegen.build import CacheError, CompileError, CompiledModule, build, cache_dir, source_for
from codegen.kernel import Kernel, compile_kernel
from codegen.target import Target, host_target

__all__ = ["build", "CacheError", "CompileError", "CompiledModule", "cache_dir", "source_for", "Kernel",
           "compile_kernel", "Target", "host_target"]

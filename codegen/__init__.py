"""Loop nest -> source -> compiled kernel, through a backend chosen by name (`codegen.backend`)."""
from codegen.backend import Artifact, Backend, BackendError, backend_names, get_backend, register_backend
from codegen.build import CacheError, CompileError, cache_dir
from codegen.kernel import BoundKernel, Kernel, compile_kernel, prepare
from codegen.target import Target, host_target

__all__ = ["Artifact", "Backend", "BackendError", "backend_names", "get_backend", "register_backend", "CacheError",
           "CompileError", "cache_dir", "BoundKernel", "Kernel", "compile_kernel", "prepare", "Target", "host_target"]

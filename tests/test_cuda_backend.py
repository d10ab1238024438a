"""The cuda backend under numba-cuda's simulator: rendering, launch, device memory,
limits and pruning, and a model that runs on it with a CPU fallback shown in coverage."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

from codegen import compile_kernel, get_backend  # noqa: E402
from codegen.cuda import CudaError, declared_props, parse_arch, simulator  # noqa: E402
from ir.settings import Settings  # noqa: E402
from schedules.launch import Call, In, Launch, Out, Scalar  # noqa: E402
from schedules.loopnest import Alloc, Assign, Call as Stmt, For, Function, If, LoopModule, Param  # noqa: E402
from schedules.space import ConfigError, ConfigSpace, Knob  # noqa: E402
from schedules.template import Lowered  # noqa: E402

pytestmark = pytest.mark.skipif(not simulator(), reason="runs on numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1)")


def _block_sum_module(bs: int) -> LoopModule:
    """out[b] = sum of x[b*bs:(b+1)*bs] + 1: shared memory, syncthreads, a tree reduction."""
    body = (
        Alloc("buf", (str(bs),), "float32", scope="shared"),
        Assign("tx", "cuda.threadIdx.x"), Assign("i", f"cuda.blockIdx.x * {bs} + tx"),
        If("i < n", (Assign("buf[tx]", "x[i]"),), (Assign("buf[tx]", "np.float32(0.0)"),)),
        Stmt("cuda.syncthreads()"),
        Assign("s", str(bs // 2)),
        Stmt("while s > 0:\n        if tx < s:\n            buf[tx] += buf[tx + s]\n        cuda.syncthreads()\n"
             "        s //= 2"),
        If("tx == 0", (Assign("out[cuda.blockIdx.x]", "plus_one(buf[0])"),)),
    )
    kern = Function("block_sum", (Param("x", "float32[::1]"), Param("out", "float32[::1]"), Param("n", "int64")), body)
    dev = Function("plus_one", (Param("v", "float32"),), (Stmt("return v + np.float32(1.0)"),), device=True)
    return LoopModule((dev, kern), meta={"template": "test block sum"})


def test_renders_cuda_kernels_and_runs_a_launch_on_device_memory():
    be = get_backend("cuda")
    assert be.device and be.template_kind == "cuda"
    mod = _block_sum_module(8)
    src = be.render(mod)
    assert "@cuda.jit(\"void(float32[::1], float32[::1], int64)\"" in src
    assert "cuda.shared.array((8,), dtype=np.float32)" in src and "@cuda.jit(device=True" in src
    art = be.compile(mod)
    assert art.backend == "cuda" and art.functions == ("block_sum",)   # device functions are not launched
    fns = be.load(art)
    x = np.arange(20, dtype=np.float32)
    dx, dout = be.asarray(x, "float32"), be.empty((3,), "float32")
    be.call(fns["block_sum"], [dx, dout, 20], items=3, parallel=True, grid=(3,), block=(8,))
    be.synchronize()
    got = be.to_host(dout)
    assert np.allclose(got, [x[0:8].sum() + 1, x[8:16].sum() + 1, x[16:20].sum() + 1])


def test_a_cpu_launch_is_refused_on_the_gpu():
    be = get_backend("cuda")
    with pytest.raises(Exception, match="grid and block"):
        be.call(lambda *a: None, [], items=1, parallel=False)


def test_device_arrays_are_not_silently_converted():
    be = get_backend("cuda")
    d = be.asarray(np.zeros(4, np.float32), "float32")
    assert be.asarray(d, "float32") is d
    with pytest.raises(Exception, match="not converted"):
        be.asarray(d, "int64")


def test_target_describes_the_declared_architecture_and_its_limits():
    t = get_backend("cuda", Settings(cuda_arch="9.0")).target()
    assert t.kind == "cuda" and t.cc == "9.0" and t.simulator is True
    assert t.shared_per_block == 48 << 10 and t.max_threads_per_block == 1024 and t.regs_per_sm == 65536
    other = get_backend("cuda", Settings(cuda_arch="7.5")).target()
    assert other.key != t.key and other.threads_per_sm == 1024
    assert declared_props(parse_arch("8.6"), "x")["blocks_per_sm"] == 16
    with pytest.raises(CudaError, match="compute capability"):
        parse_arch("banana")
    with pytest.raises(CudaError, match="not one tensortune knows"):
        parse_arch("1.0")


def test_a_constraint_prunes_configs_before_any_build():
    space = ConfigSpace([Knob("threads", (64, 256, 1024, 2048))],
                        constraint=lambda v: "more threads than a block may have" if v["threads"] > 1024 else None)
    assert [c["threads"] for c in space] == [64, 256, 1024]
    with pytest.raises(ConfigError, match="cannot run here: more threads"):
        space.validate({"threads": 2048})
    from tuner.search.random_search import RandomSearch
    s = RandomSearch(space, seed=1)
    seen = [c["threads"] for c in s.propose(10)]
    assert sorted(seen) == [64, 256, 1024] and 2048 not in seen


def test_a_kernel_with_constants_uploads_them_once():
    """A launch over a hand-made GPU module through Kernel/BoundKernel: constants are device
    arrays held by the bound kernel, inputs come from the host each call."""
    from ir.workload import Workload
    be = get_backend("cuda")
    mod = _block_sum_module(4)
    wl = Workload.from_json({"ops": [], "inputs": [{"shape": [8], "dtype": "float32", "const": True, "sym": [8]}],
                             "output_shape": [2], "output_dtype": "float32"})
    launch = Launch((Call("block_sum", (In(0), Out(), Scalar(8)), items=2, grid=(2,), block=(4,)),))

    class T:
        name = "test"

        def lower(self, wl, cfg):
            return Lowered(mod, launch)
    k = compile_kernel(T(), wl, {}, be)
    w = np.arange(8, dtype=np.float32)
    bk = k.bind([w], be)
    out = bk([w])
    assert np.allclose(be.to_host(out), [w[:4].sum() + 1, w[4:].sum() + 1])
    view = bk.state.views
    assert all(hasattr(v, "copy_to_host") for v in view.values())

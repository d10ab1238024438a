"""The vectorizable float32 polynomials (exp, tanh, sigmoid, log, erf) compiled as generated
kernels compile them (numba, the kernels' fastmath flags, statements from `op_assigns`): their
accuracy over a wide range of inputs, their values at 0/inf/subnormals, and that LLVM vectorized
the loop (the reason they exist)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ir.graph import Node
from ir.ops.elementwise import op_assigns
from schedules.loopnest import Function

OPS_TESTED = ("Exp", "Tanh", "Sigmoid", "Log", "Erf")


@pytest.fixture(scope="module")
def kernel():
    """One numba function: out[k, i] = op_k(x[i]) for the ops above (one compile for all)."""
    import numba
    import codegen.build  # noqa: F401  (turns numba's SLP vectorizer on, as for every kernel)
    body = []
    for k, op in enumerate(OPS_TESTED):
        for t, e in op_assigns(Node(op, ("x",), ("y",), {}), ["v"], f"y{k}"):
            body.append(f"        {t} = {e}")
        body.append(f"        out[{k}, np.uint64(i)] = y{k}")
    src = "def f(x, out):\n    for i in range(x.shape[0]):\n        v = x[np.uint64(i)]\n" + "\n".join(body) + "\n"
    ns = {"np": np, "math": math}
    exec(src, ns)
    fast = set(Function("f", (), ()).fastmath)
    fn = numba.njit("void(float32[::1], float32[:, ::1])", fastmath=fast, error_model="numpy")(ns["f"])
    return fn


def _run(kernel, x):
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty((len(OPS_TESTED), x.size), np.float32)
    kernel(x, out)
    return dict(zip(OPS_TESTED, out))


def _reference(op, x):
    from scipy.special import erf
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        return {"Exp": np.exp, "Tanh": np.tanh, "Sigmoid": lambda v: 1 / (1 + np.exp(-v)), "Log": np.log,
                "Erf": erf}[op](x)


def test_relative_error_over_a_wide_range(kernel):
    rng = np.random.default_rng(0)
    mag = np.exp(rng.uniform(-87, 88, 100_000))
    x = np.concatenate([rng.uniform(-1, 1, 100_000), rng.uniform(-20, 20, 100_000), rng.uniform(-120, 120, 100_000),
                        mag, -mag]).astype(np.float32)
    got = _run(kernel, x)
    got["Log"] = _run(kernel, np.abs(x))["Log"]
    worst = {}
    for op in OPS_TESTED:
        xs = np.abs(x) if op == "Log" else x
        ref = _reference(op, xs)
        normal = (np.abs(ref) > 1.2e-38) & (np.abs(ref) < 3.4e38)   # float32 normal results
        rel = np.abs(got[op][normal] - ref[normal]) / np.abs(ref[normal])
        worst[op] = rel.max()
    # a few float32 ulps; erf is the known 3.3e-7 of its rational approximation
    assert worst["Exp"] < 2e-7 and worst["Sigmoid"] < 3e-7 and worst["Log"] < 2e-7, worst
    assert worst["Tanh"] < 5e-7 and worst["Erf"] < 5e-7, worst


def test_special_values(kernel):
    x = np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, 88.7, 89.0, -87.5, -104.0, -200.0, 3e38, -3e38], np.float32)
    got = _run(kernel, x)
    exp = got["Exp"]
    assert exp[0] == 1 and exp[2] == np.inf and exp[3] == 0 and exp[4] == 1
    assert np.isclose(exp[5], np.exp(np.float32(88.7)), rtol=1e-6) and exp[6] == np.inf
    assert 0 < exp[7] < 1.2e-38 and exp[8] == 0 and exp[9] == 0     # subnormal, then flushed to 0
    tanh = got["Tanh"]   # +-1 - 3e-7 beyond the clamp at +-7.9: within the error bound above
    assert tanh[0] == 0 and tanh[4] == np.float32(1e-40) and np.allclose(tanh[[2, 3, 10, 11]], [1, -1, 1, -1], rtol=5e-7)
    sig = got["Sigmoid"]   # e^-x is kept finite (x >= -88): sigmoid(-inf) is 6e-39, not 0;
    # the division may be a refined reciprocal estimate (fastmath arcp): 1 ulp off 0.5
    assert np.allclose(sig[[0, 2, 10]], [0.5, 1, 1], rtol=2e-7) and 0 <= sig[3] < 1e-38 and 0 <= sig[11] < 1e-38
    log = _run(kernel, np.array([1.0, 0.0, np.inf, 1e-40, 3e38, np.e, -1.0], np.float32))["Log"]
    assert log[0] == 0 and log[1] == -np.inf and log[2] == np.inf and np.isnan(log[6])
    assert np.allclose(log[[3, 4, 5]], np.log(np.array([1e-40, 3e38, np.e])), rtol=1e-6)
    erf = got["Erf"]
    assert erf[0] == 0 and erf[2] == 1 and erf[3] == -1


def test_the_loop_vectorizes(kernel):
    ir = next(iter(kernel.inspect_llvm().values()))
    assert "<8 x float>" in ir or "<16 x float>" in ir
    assert "@llvm.exp" not in ir and "expf" not in ir and "tanhf" not in ir   # no libm call per element


def test_exp2_for_softmax_rows():
    """exp2_build (softmax's e^(v - m) as 2^(v log2 e - m log2 e)): a few ulps on [-126, 0], the
    least normal float32 below (it stands for 0 there), vectorized."""
    import numba
    import codegen.build  # noqa: F401
    from ir.ops.elementwise import exp2_build
    stmts = []

    def bind(e):
        stmts.append((f"t{len(stmts)}", e))
        return stmts[-1][0]
    r = exp2_build(bind, "v")
    src = ("def f(x, out):\n    for i in range(x.shape[0]):\n        v = x[np.uint64(i)]\n"
           + "".join(f"        {a} = {b}\n" for a, b in stmts) + f"        out[np.uint64(i)] = {r}\n")
    ns = {"np": np}
    exec(src, ns)
    fn = numba.njit("void(float32[::1], float32[::1])", fastmath=set(Function("f", (), ()).fastmath),
                    error_model="numpy")(ns["f"])
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-1, 0, 50_000), rng.uniform(-126, 0, 50_000), [0.0, -0.5, -126.0, -200.0]])
    x = x.astype(np.float32)
    got = np.empty_like(x)
    fn(x, got)
    ref = np.exp2(x.astype(np.float64))
    normal = x >= -126
    assert (np.abs(got[normal] - ref[normal]) / ref[normal]).max() < 2e-7
    assert got[-4] == 1 and got[-1] == np.float32(2.0 ** -126)
    assert "<8 x float>" in next(iter(fn.inspect_llvm().values())) or "<16 x float>" in next(iter(fn.inspect_llvm().values()))

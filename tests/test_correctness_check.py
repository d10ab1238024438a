"""No wrong kernel passes the correctness check (issue 10, item 9): the rule of
`ir.accuracy` (element-wise, tolerance from dtype and reduction length, two input
sets), as the tuner's worker job applies it to real compiled kernels, and as
`tune-run --check` applies it to whole models."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from codegen import compile_kernel, host_target
from ir import accuracy, import_onnx, make_workload, partition, simplify
from schedules import get_template
from schedules.launch import Buffer, Call, In, Out, Scalar, Work
from schedules.loopnest import Assign, For, Function, Param
from schedules.template import Lowered
from tests.helpers import dense_model
from tests.template_cases import conv_wl, make_wl
from tuner.measure import jobs

DENSE = get_template("dense")


# -- the rule ----------------------------------------------------------------------------

def _dot(k: int, seed: int = 0):
    """float32 products A @ B with K = k summed in another order than NumPy's, and the float64 truth."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (64, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, 48)).astype(np.float32)
    naive = np.zeros((64, 48), np.float32)
    for j in range(k):  # one running float32 accumulator: the least accurate order a kernel may use
        naive += a[:, j:j + 1] * b[j:j + 1, :]
    return a @ b, naive, a.astype(np.float64) @ b.astype(np.float64)


@pytest.mark.parametrize("k", [1, 19, 256, 2048])
def test_reordered_float32_sums_pass(k):
    blas, naive, exact = _dot(k)
    assert accuracy.compare(naive, blas, k).ok, accuracy.compare(naive, blas, k).message()
    assert accuracy.compare(exact.astype(np.float32), blas, k).ok


@pytest.mark.parametrize("k", [1, 19, 256])
def test_an_error_of_1e_3_on_order_one_outputs_is_wrong(k):
    blas, _, _ = _dot(k)
    scaled = blas / np.sqrt(np.mean(blas.astype(np.float64) ** 2))  # O(1) outputs
    c = accuracy.compare(scaled + np.float32(1e-3), scaled, k)
    assert not c.ok and c.bad == scaled.size and "outside" in c.message()


def test_one_element_off_is_found_and_named():
    ref = np.linspace(-2, 2, 60, dtype=np.float32).reshape(3, 4, 5)
    got = ref.copy()
    got[2, 3, 1] += np.float32(1e-3)
    c = accuracy.compare(got, ref, 8)
    assert not c.ok and c.bad == 1 and "[2, 3, 1]" in c.worst


def test_tolerance_follows_dtype_and_reduction_length():
    t32, t64 = accuracy.tolerance("float32", 100, 1.0), accuracy.tolerance("float64", 100, 1.0)
    assert t64.rtol < t32.rtol * 1e-8
    assert accuracy.tolerance("float32", 400, 1.0).rtol == pytest.approx(2 * accuracy.tolerance("float32", 100, 1.0).rtol)
    assert accuracy.tolerance("float32", 100, 10.0).atol == pytest.approx(10 * t32.atol)
    assert accuracy.tolerance("int64", 1000, 5.0).exact


def test_ints_and_bools_are_exact_and_nan_is_wrong():
    ref = np.arange(12, dtype=np.int64)
    assert accuracy.compare(ref.copy(), ref).ok
    off = ref.copy()
    off[5] += 1
    assert not accuracy.compare(off, ref).ok
    assert not accuracy.compare(np.array([True, False]), np.array([True, True])).ok
    x = np.ones(8, np.float32)
    y = x.copy()
    y[3] = np.nan
    assert not accuracy.compare(y, x).ok                 # a NaN where the reference is finite
    assert accuracy.compare(y, y).ok                     # a non-finite reference element is not judged
    assert not accuracy.compare(x[:4], x).ok             # wrong shape


def test_reduction_length_comes_from_the_workload():
    g = simplify(import_onnx(dense_model(37, 19, 53)))
    dense = make_workload(g, partition(g)[0], {})
    assert accuracy.workload_reduction(dense) == 19 + 2            # K, + bias, + relu
    conv = conv_wl(1, 6, 9, 9, 8, k=3, epi=("relu",))
    assert accuracy.workload_reduction(conv) == 6 * 3 * 3 + 2      # C*kh*kw, + bias (in the Conv), + relu
    softmax = make_wl([("Add", ["i0", "i1"], {}), ("Softmax", ["t0"], {"axis": -1})],
                      [((4, 33), "float32", False), ((33,), "float32", True)])
    assert accuracy.workload_reduction(softmax) == 1 + 33
    pool = make_wl([("AveragePool", ["i0"], {"kernel_shape": [3, 2], "strides": [1, 1]})],
                   [((1, 2, 7, 7), "float32", False)])
    assert accuracy.workload_reduction(pool) == 6
    mean = make_wl([("ReduceMean", ["i0"], {"axes": [1], "keepdims": 1})], [((3, 40, 2), "float32", False)])
    assert accuracy.workload_reduction(mean) == 40
    chain = make_wl([("Transpose", ["i0"], {"perm": [1, 0]}), ("Exp", ["t0"], {}), ("Mul", ["t1", "t1"], {})],
                    [((3, 5), "float32", False)])
    assert accuracy.workload_reduction(chain) == 2                  # moves are exact


def test_check_inputs_cover_negative_large_and_valid_index_values():
    wl = make_wl([("Gather", ["i0", "i1"], {"axis": 0}), ("Relu", ["t0"], {})],
                 [((40, 8), "float32", True), ((4,), "int64", False)])
    first, wide = accuracy.check_inputs(wl, seed=3)
    assert np.abs(first[0]).max() <= 1
    assert wide[0].min() < -2 and np.abs(wide[0]).max() > 4      # negative and large
    assert set(np.unique(wide[1])) <= {-1, 0}
    accuracy.reference(wl, wide)                                 # valid indices: the reference runs


# -- the tuner's check on real kernels -----------------------------------------------------

class Broken:
    """The dense template with a bug injected into its launch description (the dense code is the
    real one; a bug adds a generated function or reroutes an argument)."""

    def __init__(self, bug):
        self.bug, self.name, self.version = bug, DENSE.name, DENSE.version

    def space(self, wl):
        return DENSE.space(wl)

    def lower(self, wl, cfg):
        return self.bug(DENSE.lower(wl, cfg))


M2 = "float32[:, ::1]"


def _rows(name: str, arrays: tuple, stmt: Assign) -> Function:
    """A function over rows i = t, t+T, ... < m of [m, n] arrays, doing `stmt` at each (i, j)."""
    params = tuple(Param(a, M2) for a in arrays) + tuple(Param(v, "int64") for v in ("m", "n", "t", "T"))
    return Function(name, params, (For("i", "t", "m", (For("j", "0", "n", (stmt,)),), step="T"),))


def _with(low: Lowered, fn: Function, steps: tuple, **launch) -> Lowered:
    return Lowered(replace(low.module, functions=low.module.functions + (fn,)), replace(low.launch, steps=steps, **launch))


def _reroute(steps: tuple, old, new) -> tuple:
    return tuple(replace(s, args=tuple(new if old(a) else a for a in s.args)) for s in steps)


def _one(low: Lowered, test) -> object:
    """The one distinct argument the per-call steps pass that passes `test` (dense: out, or A)."""
    [a] = {a for s in low.launch.steps for a in s.args if test(a)}
    return a


def is_out(a) -> bool:
    return isinstance(a, Out)


def is_activation(a) -> bool:
    return isinstance(a, In) and a.index == 0


def plus_1e_3(low):
    """One more generated function runs after the kernel: out += 1e-3."""
    out = _one(low, is_out)
    bump = _rows("bump", ("y",), Assign("y[i, j]", "np.float32(1e-3)", "+"))
    return _with(low, bump, low.launch.steps + (Call("bump", (out, *map(Scalar, out.shape)), items=out.shape[0]),))


def misses_last_row(low):
    """An off-by-one in the remainder loop: the last row is never written (the kernel writes
    a workspace; the copy to the output stops a row early)."""
    out = _one(low, is_out)
    m, n = out.shape
    copy = _rows("copy", ("full", "y"), Assign("y[i, j]", "full[i, j]"))
    steps = _reroute(low.launch.steps, is_out, Work("full"))
    steps += (Call("copy", (Work("full"), out, Scalar(m - 1), Scalar(n)), items=m - 1),)
    return _with(low, copy, steps, workspaces=low.launch.workspaces + (Buffer("full", (m, n)),))


def saturates(low):
    """Right only for inputs in [-1, 1] (as a too-short polynomial approximation would be): the
    activations are clipped into a workspace before the kernel reads them."""
    x = _one(low, is_activation)
    clip = _rows("clip", ("x", "y"), Assign("y[i, j]", "min(max(x[i, j], np.float32(-1.0)), np.float32(1.0))"))
    steps = _reroute(low.launch.steps, is_activation, Work("clipped"))
    steps = (Call("clip", (x, Work("clipped"), *map(Scalar, x.shape)), items=x.shape[0]),) + steps
    return _with(low, clip, steps, workspaces=low.launch.workspaces + (Buffer("clipped", x.shape),))


@pytest.fixture(scope="module")
def dense_wl():
    g = simplify(import_onnx(dense_model(37, 19, 53)))   # 37 x 53: remainders for every register tile
    return make_workload(g, partition(g)[0], {})


@pytest.fixture(scope="module")
def dense_kernel(dense_wl):
    return compile_kernel(DENSE, dense_wl, DENSE.default_config(dense_wl))


def broken(wl, bug):
    """The dense kernel with `bug` in its launch, compiled as the builder would."""
    return compile_kernel(Broken(bug), wl, DENSE.default_config(wl))


def _run(kernel):
    jobs._REFERENCE.clear()
    return jobs.run_job({"kernel": kernel, "repeat": 1, "min_repeat_ms": 1, "number": 1})


def test_correct_kernel_passes_and_is_timed(dense_kernel):
    reply = _run(dense_kernel)
    assert "wrong" not in reply and len(reply["latencies"]) == 1
    assert reply["target"]["key"] == host_target().key   # the machine that measured it says which it is


@pytest.mark.parametrize("bug, needle", [(plus_1e_3, "input set 1"), (misses_last_row, "input set 1"),
                                         (saturates, "input set 2 of 2 (wide")])
def test_wrong_kernels_are_wrong_results(dense_wl, bug, needle):
    reply = _run(broken(dense_wl, bug))
    assert "latencies" not in reply and needle in reply["wrong"], reply
    assert "outside" in reply["wrong"] and "reduction length 21" in reply["wrong"]


class InProcess:
    """A worker that runs the job in this process (so the injected bug is seen)."""

    def call(self, fn, payload, timeout):
        return "ok", fn(payload)

    def close(self):
        pass


def test_the_runner_records_wrong_result(dense_wl):
    """Through the runner's result mapping: recorded as wrong_result, with no latency to rank."""
    from tuner.measure import LocalRunner, MeasureInput
    from tuner.measure.base import BuildResult
    jobs._REFERENCE.clear()
    runner = LocalRunner(timeout=60, repeat=1, min_repeat_ms=1)
    runner.worker.close()
    runner.worker = InProcess()
    inp = MeasureInput(dense_wl, "dense", DENSE.default_config(dense_wl))
    [r] = runner.run([inp], [BuildResult("ok", kernel=broken(dense_wl, plus_1e_3))])
    assert r.status == "wrong_result" and not r.latencies and "outside" in r.error
    assert r.target["key"] == host_target().key


# -- tune-run --check: the same rule on whole models ----------------------------------------

def test_tune_run_check_uses_the_same_rule(tmp_path):
    import runtime
    from runtime.cli import _check
    path = tmp_path / "mlp.onnx"
    path.write_bytes(dense_model(16, 64, 32).SerializeToString())
    model = runtime.load(path)
    feeds = {"x": np.random.default_rng(0).uniform(-1, 1, (16, 64)).astype(np.float32)}
    outs = model.run(feeds)
    good = _check(path, feeds, outs, model.graph, {})
    assert good["ok"], good
    [name] = outs
    assert good["outputs"][name]["reduction"] == 64 + 2
    bad = _check(path, feeds, {name: outs[name] + np.float32(1e-3)}, model.graph, {})
    assert not bad["ok"] and "outside" in bad["error"] and name in bad["error"]

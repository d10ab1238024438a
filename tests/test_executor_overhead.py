"""The executor's per-call path: kernels planned once per program, no allocation but the
graph outputs', no conversions of buffers the plan already holds, results identical from
call to call and to a plain NumPy computation; the thread count of tiny kernels."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import runtime
from codegen import cpu
from codegen.kernel import BoundKernel, work_estimate
from ir.settings import Settings

WIDTH, LAYERS = 16, 4
ROOT = Path(__file__).resolve().parents[1]


def chain(layers: int = LAYERS, width: int = WIDTH, batch: int = 1, seed: int = 0):
    """(model, weights, biases): relu(x @ W + b) `layers` times, then a softmax."""
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32) for _ in range(layers)]
    bs = [(0.1 * rng.standard_normal(width)).astype(np.float32) for _ in range(layers)]
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        inits += [numpy_helper.from_array(ws[k], f"w{k}"), numpy_helper.from_array(bs[k], f"b{k}")]
        nodes += [helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"]),
                  helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"]),
                  helper.make_node("Relu", [f"a{k}"], [f"r{k}"])]
        x = f"r{k}"
    nodes.append(helper.make_node("Softmax", [x], ["y"], axis=-1))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, ws, bs


def numpy_chain(x, ws, bs):
    for w, b in zip(ws, bs):
        x = np.maximum(x.astype(np.float64) @ w + b, 0)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def model_and_reference():
    m, ws, bs = chain()
    model = runtime.load(m, settings=Settings.from_env().with_(threads=1))
    x = np.linspace(-1, 1, WIDTH, dtype=np.float32)[None]
    model(x)   # builds the program (compiles on a cold cache)
    return model, ws, bs


def test_every_step_is_a_kernel_and_inner_steps_are_planned_whole(model_and_reference):
    model, _, _ = model_and_reference
    prog = next(iter(model._programs.values()))
    assert all(s.kernel is not None for s in prog.steps), [s.kind for s in prog.steps]
    # every step runs on the program's buffers only (the feed copied into one of them at the
    # start of each call, the arena, and the last one's own buffer for the graph output, copied
    # out per call), its calls fixed when the program was built
    [(slot, staged)] = prog.staged
    assert staged.shape == (1, WIDTH) and slot == model._slot["x"]
    assert len(prog.steps) >= 3 and all(s.fixed is not None for s in prog.steps)
    assert any(a is staged or (isinstance(a, np.ndarray) and np.shares_memory(a, staged))
               for _, args in prog.steps[0].fixed for a in args)
    assert len(prog.owned) == 1


def test_the_fixed_steps_run_from_one_native_loop_with_the_per_step_bits(model_and_reference):
    model, ws, bs = model_and_reference
    prog = next(iter(model._programs.values()))
    # every step from one native loop (`cpu._Batch`), the feed's step too (it reads the copy)
    assert len(prog.runs) == 1
    batch, owners, _ = prog.runs[0]
    assert isinstance(batch, cpu._Batch) and owners == [s for s in prog.steps for _ in s.fixed]
    assert len(batch.table) == len(owners) and (batch.table[:, 3] == 1).all()   # one thread: no pool
    x = np.random.default_rng(4).standard_normal((1, WIDTH)).astype(np.float32)
    batched = np.array(model(x))
    per_step, times = model.run_timed({"x": x})   # the same loop, its calls timed by its own clock
    assert len(times) == len(prog.steps) and np.array_equal(per_step["y"], batched)
    assert all(t > 0 for t in times) and np.allclose(times, [batch.seconds()[k] for k in range(len(owners))])
    np.testing.assert_allclose(batched, numpy_chain(x, ws, bs), rtol=1e-5, atol=1e-6)


def test_results_match_numpy_and_stay_identical(model_and_reference):
    model, ws, bs = model_and_reference
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, WIDTH)).astype(np.float32) for _ in range(3)]
    firsts = [np.array(model(x)) for x in xs]
    for x, first in zip(xs, firsts):
        np.testing.assert_allclose(first, numpy_chain(x, ws, bs), rtol=1e-5, atol=1e-6)
    kept = model(xs[0])
    for x, first in zip(xs, firsts):    # the same input gives the same bits, whatever ran between
        assert np.array_equal(model(x), first)
    assert np.array_equal(kept, firsts[0])   # a later call never overwrote an output handed out


def test_a_call_allocates_nothing_through_the_backend_and_builds_no_plan(model_and_reference, monkeypatch):
    model, _, _ = model_and_reference
    x = np.ones((1, WIDTH), np.float32)
    model(x)
    empties, asarrays, plans, builds = [], [], [], []
    backend = model.backend
    real_empty, real_asarray = backend.empty, backend.asarray
    monkeypatch.setattr(backend, "empty", lambda *a: empties.append(a) or real_empty(*a))
    monkeypatch.setattr(backend, "asarray", lambda *a: asarrays.append(a) or real_asarray(*a))
    real_plan = BoundKernel.plan
    monkeypatch.setattr(BoundKernel, "plan", lambda *a, **k: plans.append(a) or real_plan(*a, **k))
    real_build = type(model)._build
    monkeypatch.setattr(type(model), "_build", lambda *a: builds.append(a) or real_build(*a))
    for _ in range(3):
        model(x)
    outs = [model(x) for _ in range(2)]
    assert empties == []                 # the graph output is written to the program's buffer, then copied
    assert not np.shares_memory(outs[0], outs[1]) and np.array_equal(outs[0], outs[1])
    assert asarrays == []                # the feed is copied into the program's buffer; the arena's never converted
    assert plans == [] and builds == []


def test_each_call_reads_its_own_feed_through_the_staged_copy(model_and_reference):
    model, ws, bs = model_and_reference
    prog = next(iter(model._programs.values()))
    [(_, staged)] = prog.staged
    base = np.random.default_rng(5).standard_normal((3, WIDTH)).astype(np.float32)
    x = base.T.copy().T[:1]              # not C-contiguous: copied in all the same
    assert not x.flags.c_contiguous
    got = np.array(model(x))
    np.testing.assert_allclose(got, numpy_chain(x, ws, bs), rtol=1e-5, atol=1e-6)
    assert np.array_equal(staged, x) and not np.shares_memory(staged, x)
    x2 = np.ascontiguousarray(-x)        # same program, new contents: the copy is refreshed per call
    np.testing.assert_allclose(model(x2), numpy_chain(x2, ws, bs), rtol=1e-5, atol=1e-6)


def test_a_feed_above_the_staging_size_is_read_in_place_per_call(monkeypatch):
    from runtime import executor
    monkeypatch.setattr(executor, "STAGE_MAX_BYTES", WIDTH * 4 - 1)
    m, ws, bs = chain(seed=3)
    model = runtime.load(m, settings=Settings.from_env().with_(threads=1))
    x = np.random.default_rng(6).standard_normal((1, WIDTH)).astype(np.float32)
    np.testing.assert_allclose(model(x), numpy_chain(x, ws, bs), rtol=1e-5, atol=1e-6)
    prog = next(iter(model._programs.values()))
    assert prog.staged == [] and prog.steps[0].fixed is None        # filled from the caller's array per call
    assert prog.runs[0] == (None, prog.steps[0], None) and len(prog.runs) == 2
    np.testing.assert_allclose(model(-x), numpy_chain(-x, ws, bs), rtol=1e-5, atol=1e-6)


def test_a_feed_that_needs_converting_still_runs_right(model_and_reference):
    model, ws, bs = model_and_reference
    x64 = np.random.default_rng(2).standard_normal((1, WIDTH))          # float64: converted per call
    want = numpy_chain(x64.astype(np.float32), ws, bs)
    for _ in range(2):
        np.testing.assert_allclose(model(x64), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model(x64.tolist()), want, rtol=1e-5, atol=1e-6)   # not even an array


def test_plan_keeps_only_arrays_it_can_alias(model_and_reference):
    model, _, _ = model_and_reference
    step = next(iter(model._programs.values())).steps[1]
    bk, consts = step.kernel, model.graph.constants
    x, out = np.zeros((1, WIDTH), np.float32), np.zeros((1, WIDTH), np.float32)
    arrays = [consts.get(i, x) for i in step.subgraph.inputs]
    held = bk.plan(arrays, out, step.work)
    assert held.dynamic == ()                   # the arrays themselves are in the calls
    w = next(a for a in arrays if a.ndim == 2 and a is not x)
    b = next(a for a in arrays if a.ndim == 1)
    for v in (1.0, -2.0):                       # so the plan reads what they hold now
        x[:] = np.linspace(0, v, WIDTH)
        for run, args in held.fill(None, None):
            run(*args)
        np.testing.assert_allclose(out, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-6)
    ro = x.copy()
    ro.flags.writeable = False                  # numba is handed a copy of it: a copy would go stale
    per_call = bk.plan([consts.get(i, ro) for i in step.subgraph.inputs], None, step.work)
    assert sorted({kind for _, _, kind, _, _ in per_call.dynamic}) == [1, 2]   # input and output per call
    assert per_call.reads_inputs and not held.reads_inputs
    out = np.zeros((1, WIDTH), np.float32)
    for run, args in per_call.fill([consts.get(i, ro) for i in step.subgraph.inputs], out):
        run(*args)
    np.testing.assert_allclose(out, np.maximum(ro @ w + b, 0), rtol=1e-5, atol=1e-6)


def test_tiny_kernels_run_on_one_thread():
    assert cpu.threads_for(8, items=1000, work=10) == 1
    assert cpu.threads_for(8, items=3, work=None) == 3
    assert cpu.threads_for(2, items=1000, work=100 * cpu.MIN_WORK_PER_THREAD) == 2
    assert cpu.threads_for(4, items=1000, work=2 * cpu.MIN_WORK_PER_THREAD) == 2
    m, _, _ = chain(layers=1)
    model = runtime.load(m, settings=Settings.from_env().with_(threads=2))
    bk = model.prepare({"x": np.ones((1, WIDTH), np.float32)}).steps[0].kernel
    assert work_estimate(bk.kernel.workload) < cpu.MIN_WORK_PER_THREAD
    run, _ = bk.plan().calls[-1]
    assert run is bk.functions[bk.kernel.lowered.launch.steps[-1].function]   # the function itself


def test_parallel_for_runs_every_copy_and_raises_a_workers_error():
    seen, lock, others_ran = [], threading.Lock(), threading.Event()

    def copy(out, t, T):
        if t == 0:   # the pool threads run theirs meanwhile (the caller runs one they have not):
            # waited for, not slept on: a thread spinning on the other core (OpenBLAS's, ~100 ms
            # after an earlier test's NumPy matmul) kept them off it for over 50 ms in one CI run
            others_ran.wait(10.0)
        with lock:
            seen.append((t, T, threading.get_ident()))
            if sum(1 for s in seen if s[0] != 0) == T - 1:
                others_ran.set()
        out[t] = t + 1

    out = np.zeros(3)
    # the pool warmed first: in a process where nothing ran on it yet, a thread's first looks
    # load numba's cached functions (mailbox atomics, FP mode) and outlasted copy 0's 50 ms
    cpu.parallel_for(lambda t, T: None, (), 3)
    cpu.parallel_for(copy, (out,), 3)
    assert out.tolist() == [1, 2, 3] and sorted(t for t, _, _ in seen) == [0, 1, 2]
    assert {T for _, T, _ in seen} == {3} and len({i for _, _, i in seen}) == 3

    def fails_off_the_caller(t, T):
        if t == 1:
            raise ValueError("copy 1 failed")

    with pytest.raises(ValueError, match="copy 1 failed"):
        cpu.parallel_for(fails_off_the_caller, (), 2)
    cpu.parallel_for(copy, (out,), 2)   # the pool still serves after a failure


def test_one_and_two_threads_give_the_same_bits(monkeypatch):
    monkeypatch.setattr(cpu, "MIN_WORK_PER_THREAD", 1)   # split even these tiny kernels
    m, _, _ = chain(batch=64)   # work items enough for two threads
    x = np.random.default_rng(3).standard_normal((64, WIDTH)).astype(np.float32)
    one = runtime.load(m, settings=Settings.from_env().with_(threads=1))(x)
    two = runtime.load(m, settings=Settings.from_env().with_(threads=2))
    prog = two.prepare({"x": x})
    assert any(type(run) is cpu._Spread for s in prog.steps for run, _ in s.plan.calls)
    assert np.array_equal(two(x), one)
    # the split kernels are posted to the pool from the native loop; while another caller
    # holds the pool, the loop's calls run one by one from Python, to the same bits
    batches = [b for b, _, _ in prog.runs if b is not None]
    assert batches and any((b.table[:, 3] > 1).any() for b in batches)
    pool = cpu._the_native_pool()
    with pool.lock:
        assert np.array_equal(two(x), one)
    assert np.array_equal(two(x), one)


COLD = """
import json, sys
import numpy as np
import onnx
import runtime
from runtime import executor
from ir.settings import Settings
executor.PARALLEL_COMPILE_MIN = 2      # the least taken apart: two distinct kernels
executor._cores = lambda: 2
model = runtime.load(onnx.load(sys.argv[1]), settings=Settings.from_env().with_(cache_dir=sys.argv[2], threads=2))
here = []
real = type(model.backend).compile
type(model.backend).compile = lambda self, mod: here.append(1) or real(self, mod)
x = np.arange(16, dtype=np.float32).reshape(2, 8) / 8
y = model(x)
print(json.dumps({"y": y.tolist(), "steps": len(next(iter(model._programs.values())).steps),
                  "compiles": model.stats["compiles"], "here": len(here)}))
"""


def test_a_cold_program_compiles_its_kernels_on_worker_processes(tmp_path):
    """Two distinct kernels, an empty kernel cache, two threads: the workers compile both,
    this process only loads them from the cache they filled. A fresh interpreter: one
    that loaded the same code before would have nothing to compile."""
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1), helper.make_node("Mul", ["p", "b"], ["q"]),
             helper.make_node("Softmax", ["q"], ["y"], axis=-1)]
    b = np.linspace(-1, 1, 8, dtype=np.float32)
    g = helper.make_graph(nodes, "cold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                          [numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "cold.onnx")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", COLD, str(tmp_path / "cold.onnx"), str(tmp_path / "cache")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    x = np.arange(16, dtype=np.float32).reshape(2, 8) / 8

    def softmax(v):
        e = np.exp(v - v.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.array(got["y"], np.float32), softmax(softmax(x) * b), rtol=1e-5, atol=1e-6)
    assert got["steps"] == 2 and got["compiles"] == 2
    assert got["here"] == 0   # nothing compiled (nor loaded through compile) in that process


def test_an_embedding_lookup_counts_the_rows_it_gathers_not_its_table():
    """BERT's token embedding (a 1000 x 128 table, 32 ids) is a small kernel: split on two
    threads it ran 3x slower. Its table counts at most the output's bytes."""
    from tests.template_cases import make_wl
    table, ids = np.zeros((1000, 128), np.float32), np.zeros((1, 32), np.int64)
    wl = make_wl([("Gather", ["i0", "i1"], {"axis": 0})], [((1000, 128), "float32", True), ((1, 32), "int64", False)],
                 [table, ids])
    out_bytes = 32 * 128 * 4
    assert work_estimate(wl) < 3 * out_bytes < table.nbytes / 10
    assert cpu.threads_for(2, items=32, work=work_estimate(wl)) == 1


def test_a_gather_at_folded_position_ids_runs_in_the_native_loop():
    """BERT's position embedding as torch exports it: Gather(table, position_ids[:, :seq]) with
    the ids a Slice of an initializer, folded once per shape. The folded value is the program's
    own array, so the Gather's launch is fixed and the whole call is one native loop (it was a
    read-only view of the initializer, and the Gather ran from Python on every call)."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((64, 16)).astype(np.float32)
    ids = np.arange(64, dtype=np.int64)[None]
    nodes = [helper.make_node("Shape", ["x"], ["shp"], start=1, end=2),
             helper.make_node("Slice", ["ids", "zero", "shp", "one"], ["pos"]),
             helper.make_node("Gather", ["table", "pos"], ["emb"], axis=0),
             helper.make_node("Add", ["x", "emb"], ["y"])]
    inits = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(ids, "ids"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([1], np.int64), "one")]
    g = helper.make_graph(nodes, "pos", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    model = runtime.load(m, settings=Settings.from_env().with_(threads=1))
    for seq in (13, 5):
        x = rng.standard_normal((1, seq, 16)).astype(np.float32)
        np.testing.assert_allclose(model(x), x + table[:seq][None], rtol=1e-6)
        prog = model.prepare({"x": x})
        assert [b is not None for b, _, _ in prog.runs] == [True], prog.runs

"""Memory plan: liveness → one arena per shape, reuse factor on ResNet- and BERT-style
models, outputs that never alias internal buffers, kernels writing into planned buffers."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from ir import import_onnx, partition, simplify
from runtime.choose import REFERENCE, Choice, Chooser
from runtime.executor import STAGE_MAX_BYTES, CompiledModel
from runtime.memory import plan_memory

try:
    from tests.models import make_bert, make_resnet18
except ImportError:
    from models import make_bert, make_resnet18


class OnlyChooser(Chooser):
    """Compiled kernels only for the named template families; the NumPy reference elsewhere
    (keeps numba compiles, the slow part of these tests, to a few dense kernels)."""

    def __init__(self, templates=()):
        super().__init__()
        self.templates = set(templates)

    def choose(self, wl):
        c = super().choose(wl)
        return c if c.template is not None and c.template.name in self.templates else Choice(REFERENCE, None, None)


def compiled(model, templates=()):
    g = simplify(import_onnx(model))
    return CompiledModel(g, partition(g), OnlyChooser(templates))


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.fixture(scope="module")
def resnet():
    model = make_resnet18(image=32, classes=10)
    return model, compiled(model)


@pytest.fixture(scope="module")
def bert():
    model = make_bert(layers=2, hidden=64, heads=2, ffn=256, vocab=50)
    return model, compiled(model, templates=("dense",))


def bert_feeds(batch, seq, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - 2:] = 0
    return {"input_ids": rng.integers(0, 50, (batch, seq)).astype(np.int64), "attention_mask": mask}


def test_plan_memory_reuses_dead_buffers():
    # a chain a -> b -> c -> d: at most two live at once, each step may reuse the one before last
    sizes = {"a": 1000, "b": 1000, "c": 1000, "d": 1000}
    defs = {"a": 0, "b": 1, "c": 2, "d": 3}
    uses = {"a": 1, "b": 2, "c": 3}
    mem = plan_memory(sizes, defs, uses)
    assert mem.no_reuse_bytes == 4 * 1024 and mem.arena_bytes == 2 * 1024
    for x, y in (("a", "b"), ("b", "c"), ("c", "d")):  # live at the same step: disjoint
        assert abs(mem.offsets[x] - mem.offsets[y]) >= 1024
    inpl = plan_memory(sizes, defs, uses, inplace={"b": "a", "c": "b", "d": "c"})
    assert inpl.arena_bytes == 1024 and len(inpl.inplace) == 3


def test_plan_memory_never_overlaps_live_values():
    rng = np.random.default_rng(0)
    n = 60
    sizes = {f"v{k}": int(rng.integers(1, 5000)) for k in range(n)}
    defs = {f"v{k}": k for k in range(n)}
    uses = {f"v{k}": k + int(rng.integers(0, 6)) for k in range(n)}
    mem = plan_memory(sizes, defs, uses)
    for a in sizes:
        for b in sizes:
            if a < b and defs[a] <= uses[b] and defs[b] <= uses[a]:
                lo_a, lo_b = mem.offsets[a], mem.offsets[b]
                assert lo_a + sizes[a] <= lo_b or lo_b + sizes[b] <= lo_a, (a, b)
    assert mem.live_peak_bytes <= mem.arena_bytes <= mem.no_reuse_bytes


def test_resnet_style_reuse_and_numerics(resnet):
    model, m = resnet
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    out = m(x)
    np.testing.assert_allclose(out, ort_run(model, {"image": x})["logits"], rtol=1e-4, atol=1e-4)
    mem = m.memory({"batch": 2})
    assert mem.ratio <= 0.5, str(mem)
    assert mem.inplace, "elementwise/reference steps should write over inputs that die there"


def test_bert_style_reuse_and_numerics_with_kernels_writing_planned_buffers(bert):
    model, m = bert
    feeds = bert_feeds(2, 16)
    out = m.run(feeds)["hidden"]
    np.testing.assert_allclose(out, ort_run(model, feeds)["hidden"], rtol=1e-4, atol=1e-4)
    prog = m.program({"batch": 2, "seq": 16})
    assert prog.memory.ratio <= 0.5, str(prog.memory)
    kernel_steps = [s for s in prog.steps if s.kernel is not None]
    assert kernel_steps, "dense subgraphs should run compiled kernels"
    planned = [s for s in kernel_steps if s.outs[0][2] is not None]
    assert planned and all(np.shares_memory(s.outs[0][2], prog.arena) for s in planned)


def test_outputs_never_alias_internal_buffers(bert):
    model, m = bert
    first = m.run(bert_feeds(2, 16, seed=1))["hidden"]
    kept = first.copy()
    second = m.run(bert_feeds(2, 16, seed=2))["hidden"]
    np.testing.assert_array_equal(first, kept)          # a later call did not overwrite it
    assert not np.shares_memory(first, second)
    assert not np.shares_memory(first, m.program({"batch": 2, "seq": 16}).arena)


def test_programs_and_plans_cached_per_shape(resnet):
    _, m = resnet
    m(np.zeros((1, 3, 32, 32), np.float32))
    p1 = m.program({"batch": 1})
    m(np.ones((1, 3, 32, 32), np.float32))
    assert m.program({"batch": 1}) is p1
    assert m.memory({"batch": 1}).arena_bytes < m.memory({"batch": 2}).arena_bytes


def test_no_memory_plan_gives_same_result(resnet):
    model, m = resnet
    g = m.graph
    plain = CompiledModel(g, partition(g), OnlyChooser(), plan_memory=False)
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_array_equal(plain(x), m(x))
    assert plain.memory({"batch": 1}).arena_bytes == 0


def test_kernel_workspaces_live_in_the_arena_and_are_reused():
    """A dense kernel whose weights come with each call packs them into a workspace of its
    launch (a constant weight is packed once, at prepare): the executor places it in the
    arena (no allocation per call), and two layers share one region of it."""
    import onnx
    from onnx import TensorProto, helper
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((32, 32)).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                         for n, s in (("x", [8, 32]), ("w1", [32, 32]), ("w2", [32, 32]))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])])
    m = compiled(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), ("dense",))
    x = rng.standard_normal((8, 32)).astype(np.float32)
    feeds = {"x": x, "w1": w1, "w2": w2}
    y = m.run(feeds)["y"]
    np.testing.assert_allclose(y, np.maximum(x @ w1, 0) @ w2, rtol=1e-4, atol=1e-4)
    prog = m.program({})
    kernels = [s for s in prog.steps if s.kernel is not None]
    assert len(kernels) == 2 and all(s.work and "Bp" in s.work for s in kernels)
    for s in kernels:
        for view in s.work.values():
            assert np.shares_memory(view, prog.arena)
    b0, b1 = (s.work["Bp"] for s in kernels)
    assert b0.__array_interface__["data"][0] == b1.__array_interface__["data"][0]   # dead after step 0: reused
    np.testing.assert_array_equal(m.run(feeds)["y"], y)   # the second call reuses them


def test_planned_buffers_outputs_and_runner_inputs_start_on_cache_lines(bert):
    """Every planned buffer and a kernel-written graph output too large to be staged when fed
    back as an input (as returned: a copy of the program's buffer, `codegen.backend.aligned_copy`;
    a smaller one is NumPy's plain copy, ~5 us faster) start on a 64-byte
    boundary, and so do the runner's inputs: NumPy's arrays start 16 bytes past one, where each AVX-512 load
    spans two cache lines (LayerNorm 1.4x slower measured), and a kernel timed on such inputs
    would not be timed as the model runs it."""
    from codegen import get_backend
    from codegen.backend import ALIGN
    from tuner.measure.jobs import _on_device
    model, m = bert
    prog = m.program({"batch": 2, "seq": 16})
    assert prog.arena.ctypes.data % ALIGN == 0
    views = [v for s in prog.steps for _, _, v, _ in s.outs if v is not None and v.size]
    assert views and all(v.ctypes.data % ALIGN == 0 for v in views)
    from onnx import TensorProto, helper, numpy_helper
    w = np.ones((64, 288), np.float32)   # y: 256 x 288 floats, 288 KB, over STAGE_MAX_BYTES
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 288])],
                          [numpy_helper.from_array(w, "w")])
    dense = compiled(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), templates=("dense",))
    assert any(s.kernel is not None for s in dense.program({}).steps)
    y = dense.run({"x": np.ones((256, 64), np.float32)})["y"]
    assert y.nbytes > STAGE_MAX_BYTES and y.ctypes.data % ALIGN == 0 and np.all(y == 64)
    assert dense.run({"x": np.ones((256, 64), np.float32)})["y"].ctypes.data != y.ctypes.data
    odd = np.arange(1 + 128 * 64, dtype=np.float32)[1:].reshape(128, 64)   # 4 bytes past whatever NumPy gave
    assert odd.ctypes.data % ALIGN != 0
    wl = type("W", (), {"inputs": [{"const": False}]})()
    (moved,) = _on_device(wl, [odd], get_backend())
    assert moved.ctypes.data % ALIGN == 0 and np.array_equal(moved, odd)


def test_kernels_never_write_over_their_own_inputs():
    """A step that NumPy runs may write its output over an input that dies there; a kernel may
    not: LLVM's vectorized loop runs only after a check that the output's range does not overlap
    an input's, so over its own input an elementwise Mul ran its scalar loop (an Add 5.8x slower,
    measured). Here the Mul between two Softmax kernels reads a value that dies there: it gets a
    buffer of its own, and the result is NumPy's."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1), helper.make_node("Mul", ["s", "s"], ["t"]),
             helper.make_node("Softmax", ["t"], ["y"], axis=-1), helper.make_node("Softmax", ["t"], ["z"], axis=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 96])],
                          [helper.make_tensor_value_info(v, TensorProto.FLOAT, [64, 96]) for v in "yz"])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cm = compiled(model, templates=("elementwise", "reduce"))
    x = np.linspace(-2, 2, 64 * 96, dtype=np.float32).reshape(64, 96)

    def softmax(v, axis=-1):
        e = np.exp(v - v.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)
    t = softmax(x) ** 2   # read by two Softmax kernels: the Mul is a step of its own
    y, z = (cm.run({"x": x})[v] for v in "yz")
    np.testing.assert_allclose(y, softmax(t), rtol=1e-5)
    np.testing.assert_allclose(z, softmax(t, 0), rtol=1e-5)
    prog = cm.program({})
    kernels = [s for s in prog.steps if s.kernel is not None]
    assert len(kernels) >= 3 and not prog.memory.inplace   # the axis-0 Softmax may run as NumPy
    for s in kernels:
        ins = [prog.env0[i] for i in s.in_slots if i >= 0 and isinstance(prog.env0[i], np.ndarray)]
        assert not any(np.shares_memory(v, s.outs[0][2]) for v in ins if s.outs[0][2] is not None)

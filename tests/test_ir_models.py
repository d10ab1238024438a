"""Real models end to end: import with dynamic dims, simplify, partition, and match onnxruntime."""
from __future__ import annotations

import collections

import numpy as np
import onnxruntime as ort
import pytest

try:  # tests/ as a package or as a plain rootdir-inserted folder
    from tests import models
except ImportError:
    import models
from ir import import_onnx, partition, simplify
from ir.fusion import describe_partition
from ir.reference import run_reference


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _kinds(subgraphs):
    return collections.Counter(sg.kind for sg in subgraphs)


@pytest.fixture(scope="module")
def resnet():
    return models.make_resnet18(image=64)


@pytest.fixture(scope="module")
def bert():
    return models.make_bert()


def test_mlp_dynamic_batch_matches_onnxruntime():
    m = models.make_mlp()
    g = simplify(import_onnx(m))
    assert str(g.type_of("x").shape[0]) == "batch"
    sgs = partition(g)
    assert [str(s) for s in sgs] == ["MatMul + Add + Relu"] * 3
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 256)).astype(np.float32)
        ours = run_reference(g, {"x": x})
        np.testing.assert_allclose(ours["y"], _ort(m, {"x": x})[0], rtol=1e-4, atol=1e-4)
        assert ours.sizes == {"batch": batch}


def test_resnet18_partition(resnet):
    g = simplify(import_onnx(resnet))
    assert not any(n.op == "BatchNormalization" for n in g.nodes)  # folded into the convs
    sgs = partition(g)
    # 20 convs (17 3x3/7x7 + 3 downsample 1x1) + the classifier; MaxPool + GAP; Flatten
    assert _kinds(sgs) == {"anchor": 21, "reduce": 2, "injective": 1}
    ops = collections.Counter(str(s) for s in sgs)
    assert ops["Conv + Add + Relu"] == 8          # every block's second conv takes the residual
    assert ops["Conv + Relu"] == 9                # stem + every block's first conv
    assert ops["Conv"] == 3                       # downsample shortcuts
    assert ops["MatMul + Add"] == 1
    assert g.type_of("logits").shape[1] == 1000 and str(g.type_of("logits").shape[0]) == "batch"
    text = describe_partition(g, sgs)
    assert "Conv + Add + Relu" in text and "fallback to onnx.reference: none" in text


@pytest.mark.parametrize("batch", [1, 2])
def test_resnet18_matches_onnxruntime(resnet, batch):
    g = simplify(import_onnx(resnet))
    x = np.random.default_rng(batch).standard_normal((batch, 3, 64, 64)).astype(np.float32)
    ours = run_reference(g, {"image": x})
    np.testing.assert_allclose(ours["logits"], _ort(resnet, {"image": x})[0], rtol=1e-4, atol=1e-4)
    assert ours.report.fallback_nodes == []


def test_bert_shapes_stay_symbolic(bert):
    g = simplify(import_onnx(bert))
    assert [str(d) for d in g.type_of("hidden").shape] == ["batch", "seq", "256"]
    # the head-split Reshape targets resolved to constants: no Concat left for them
    assert not any(n.op == "Concat" for n in g.nodes)
    for n in g.nodes:
        if n.op == "Reshape":
            assert n.inputs[1] in g.constants


def test_bert_partition(bert):
    g = simplify(import_onnx(bert))
    sgs = partition(g)
    ops = collections.Counter(str(s) for s in sgs)
    layers = 4
    assert ops["MatMul + Add"] == 3 * layers              # q, k, v
    assert ops["MatMul + Add + Gelu"] == layers           # ffn1: the erf form became one Gelu and fused
    assert ops["MatMul + Add + Add"] == 2 * layers        # attention out / ffn2 + residual
    assert ops["MatMul + Div + Add"] == layers            # scores, scale and mask fused
    assert ops["MatMul"] == layers                        # probs @ v
    assert ops["Softmax"] == layers
    assert ops["LayerNormalization"] == 2 * layers
    assert ops["Add + Add + LayerNormalization"] == 1     # embeddings sum as LayerNorm prologue
    text = describe_partition(g, sgs)
    assert "batch*seq**2" in text                          # symbolic FLOPs of attention


@pytest.mark.parametrize("batch,seq", [(1, 16), (2, 7)])
def test_bert_matches_onnxruntime(bert, batch, seq):
    g = simplify(import_onnx(bert))
    rng = np.random.default_rng(seq)
    ids = rng.integers(0, 1000, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - 2:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    ours = run_reference(g, feeds)
    np.testing.assert_allclose(ours["hidden"], _ort(bert, feeds)[0], rtol=1e-4, atol=1e-4)
    assert ours.sizes == {"batch": batch, "seq": seq}


def test_bert_seq_128(bert):
    g = simplify(import_onnx(bert))
    ids = np.random.default_rng(0).integers(0, 1000, (1, 128)).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones((1, 128), np.int64)}
    np.testing.assert_allclose(run_reference(g, feeds)["hidden"], _ort(bert, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("which", ["resnet", "bert"])
def test_shapes_agree_with_onnx_shape_inference(which, request):
    """Every intermediate shape onnx.shape_inference knows, we know too and identically
    (same int, or the same named dim); where it gives up (unk__ / missing) we stay exact."""
    import onnx
    from ir.passes import infer_shapes
    model = request.getfixturevalue(which)
    theirs = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True).graph.value_info
    g = infer_shapes(import_onnx(model))
    compared = 0
    for vi in theirs:
        ours = g.type_of(vi.name).shape
        dims = vi.type.tensor_type.shape.dim
        assert len(ours) == len(dims), vi.name
        for a, d in zip(ours, dims):
            if d.HasField("dim_value"):
                assert a == d.dim_value, (vi.name, ours)
                compared += 1
            elif d.dim_param and not d.dim_param.startswith("unk__"):
                assert str(a) == d.dim_param, (vi.name, ours)
                compared += 1
    assert compared > 100

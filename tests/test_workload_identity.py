"""`ir.Workload` is a value: deeply immutable, hashable, equal exactly when the keys are,
round-tripping through JSON and pickle, and its keys are those stored databases and plans
already hold (pinned below: computed before the workload became immutable)."""
from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ir import import_onnx, partition, simplify
from ir.workload import Workload, make_workload

try:
    from tests.helpers import dense_model
except ImportError:
    from helpers import dense_model

LITERAL = {
    "ops": [{"op": "MatMul", "in": ["i0", "i1"], "attrs": {}}],
    "inputs": [{"shape": [8, 64], "sym": ["batch", 64], "dtype": "float32", "const": False},
               {"shape": [64, 32], "sym": [64, 32], "dtype": "float32", "const": True}],
    "output_shape": [8, 32], "output_dtype": "float32"}


def _model(nodes, inits, x_shape, y_shape):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)
    m = helper.make_model(helper.make_graph(nodes, "m", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def conv_model():
    w = np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32)
    return _model([helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
                   helper.make_node("Relu", ["c"], ["y"])],
                  [numpy_helper.from_array(w, "w")], ["batch", 3, 8, 8], ["batch", 8, 8, 8])


def reshape_model():
    return _model([helper.make_node("Sigmoid", ["x"], ["t"]), helper.make_node("Reshape", ["t", "s"], ["y"])],
                  [numpy_helper.from_array(np.array([-1, 24], np.int64), "s")], ["batch", 4, 6], ["batch", 24])


def workloads(model, batch=4) -> list[Workload]:
    g = simplify(import_onnx(model))
    return [make_workload(g, sg, {"batch": batch}) for sg in partition(g)]


# (workload, key, signature) as the code before this change computed them
PINNED = [
    (lambda: Workload.from_json(LITERAL), "bce606bf0bbbfd44a71c", "0fb1a5a63210215789b3"),
    (lambda: workloads(dense_model(8, 16, 32, dynamic_batch=True))[0], "941165050727d79a0854", "0baaca9893b45e0a0001"),
    (lambda: workloads(conv_model())[0], "2f0828463aadc2921bea", "2e735fcfcc41a1aade0b"),      # list attrs
    (lambda: workloads(reshape_model())[1], "a8dd412dbe37d146a207", "b9cd9765ead6788df036"),   # a stored value
]


@pytest.mark.parametrize("make, key, signature", PINNED)
def test_keys_are_the_stored_ones(make, key, signature):
    wl = make()
    assert (wl.key, wl.signature) == (key, signature)


def test_equal_workloads_hash_alike_and_serve_as_dict_keys():
    a = workloads(dense_model(8, 16, 32, dynamic_batch=True))[0]
    b = workloads(dense_model(8, 16, 32, dynamic_batch=True, seed=1))[0]   # other weights: the same workload
    c = workloads(dense_model(8, 16, 32, dynamic_batch=True), batch=5)[0]
    assert a == b and hash(a) == hash(b) and a is not b
    assert a != c and a.key != c.key and a.signature == c.signature
    assert {a: 1, b: 2, c: 3} == {a: 2, c: 3}
    assert a != a.to_json() and a != a.key   # only a workload equals a workload


def test_equality_is_key_equality():
    """Not Python's value equality: 1 == 1.0 == True, but their JSON (and keys) differ."""
    as_int = Workload.from_json({**LITERAL, "ops": [{"op": "MatMul", "in": ["i0", "i1"], "attrs": {"x": 1}}]})
    as_float = Workload.from_json({**LITERAL, "ops": [{"op": "MatMul", "in": ["i0", "i1"], "attrs": {"x": 1.0}}]})
    assert as_int.key != as_float.key and as_int != as_float
    assert Workload.from_json(LITERAL) == Workload(tuple(LITERAL["ops"]), tuple(LITERAL["inputs"]), (8, 32))


def test_assignment_anywhere_raises():
    wl = Workload.from_json(LITERAL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        wl.ops = ()
    changes = [lambda: wl.ops[0].__setitem__("op", "Gemm"), lambda: wl.ops[0].update(op="Gemm"),
               lambda: wl.ops[0]["attrs"].setdefault("transB", 1), lambda: wl.ops[0]["in"].append("i2"),
               lambda: wl.inputs[0]["shape"].__setitem__(0, 16), lambda: wl.inputs[0]["shape"].sort(),
               lambda: wl.inputs[1].pop("const"), lambda: wl.ops[0]["in"].__iadd__(["i2"])]
    for change in changes:
        with pytest.raises(TypeError, match="immutable"):
            change()
    assert wl.to_json() == LITERAL and wl.key == "bce606bf0bbbfd44a71c"


def test_the_callers_dicts_are_copied_not_kept():
    d = json.loads(json.dumps(LITERAL))
    wl = Workload.from_json(d)
    d["ops"][0]["op"] = "Gemm"
    d["inputs"][0]["shape"][0] = 16
    assert wl.ops[0]["op"] == "MatMul" and wl.inputs[0]["shape"] == [8, 64]
    out = wl.to_json()   # a fresh plain copy the caller may change
    out["inputs"][0]["shape"].append(1)
    out["ops"][0]["attrs"]["k"] = 1
    assert type(out["ops"][0]) is dict and type(out["inputs"][0]["shape"]) is list
    assert wl.to_json() == LITERAL


def test_reads_work_as_on_plain_json():
    """Templates compare and slice entries as the lists and dicts they were."""
    wl = workloads(conv_model())[0]
    op = wl.ops[0]
    assert op["in"] == ["i0", "i1"] and op["in"][:2] == ["i0", "i1"] and ["i0", "i1"] == op["in"]
    assert op["attrs"]["pads"] == [1, 1, 1, 1] and op["attrs"].get("group", 1) == 1
    assert isinstance(op, dict) and isinstance(op["in"], list) and {**op}["op"] == "Conv"
    assert wl.inputs[1]["shape"][1:] == [3, 3, 3] and wl.inputs[0]["shape"] + [0] == [4, 3, 8, 8, 0]
    assert tuple(wl.inputs[0]["shape"]) == (4, 3, 8, 8) and wl.dims == {"batch": 4}
    assert np.zeros(wl.inputs[1]["shape"]).shape == (8, 3, 3, 3)
    assert json.dumps(op, sort_keys=True) == json.dumps(wl.to_json()["ops"][0], sort_keys=True)


@pytest.mark.parametrize("make", [m for m, _, _ in PINNED])
def test_json_and_pickle_round_trips(make):
    wl = make()
    again = Workload.from_json(json.loads(json.dumps(wl.to_json())))
    assert again == wl and again.key == wl.key and again.signature == wl.signature
    assert again.to_json() == wl.to_json()
    shipped = pickle.loads(pickle.dumps(wl))   # as measurement workers receive it
    assert shipped == wl and hash(shipped) == hash(wl)
    with pytest.raises(TypeError):
        shipped.ops[0]["in"].append("i9")

"""Indices read from tensors are the user's data: out of range, every gather raises one clear
InputValueError naming its node (before: the index loop read memory beside the array), and
negative indices in range count from the end, as onnxruntime does."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import runtime
from ir.errors import InputValueError, TensortuneError

W = np.arange(40, dtype=np.float32).reshape(10, 4) + 0.5
W16 = np.arange(160, dtype=np.float32).reshape(10, 16)


def _model(tmp_path, name, node, ids_shape, out_shape, w=W):
    g = h.make_graph([node], name, [h.make_tensor_value_info("ids", T.INT64, ids_shape)],
                     [h.make_tensor_value_info("y", T.FLOAT, out_shape)], [onnx.numpy_helper.from_array(w, "w")])
    path = tmp_path / f"{name}.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return runtime.load(str(path))


CASES = {   # name: (node, ids shape, out shape, weights, ids in range, reference, ids out of range)
    "gather_rows": (h.make_node("Gather", ["w", "ids"], ["y"], axis=0), [3], [3, 16], W16,
                    [0, 9, -1], lambda ids: W16[ids], [0, 5, 10]),
    "gather_short_rows": (h.make_node("Gather", ["w", "ids"], ["y"], axis=0), [3], [3, 4], W,
                          [0, 9, -10], lambda ids: W[ids], [0, 5, -11]),
    "gather_axis1": (h.make_node("Gather", ["w", "ids"], ["y"], axis=1), [2], [10, 2], W,
                     [3, -4], lambda ids: W[:, ids], [1, 4]),
    "gather_elements": (h.make_node("GatherElements", ["w", "ids"], ["y"], axis=0), [2, 4], [2, 4], W,
                        [[0, 1, 2, -1], [9, 0, 0, 0]], lambda ids: np.take_along_axis(W, np.where(ids < 0, ids + 10, ids), 0),
                        [[0, 1, 2, 30], [0, 0, 0, 0]]),
    "gather_nd": (h.make_node("GatherND", ["w", "ids"], ["y"]), [2, 1], [2, 4], W,
                  [[3], [-1]], lambda ids: W[ids[:, 0]], [[3], [11]]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gather_indices_checked(tmp_path, name):
    node, ids_shape, out_shape, w, good, ref, bad = CASES[name]
    m = _model(tmp_path, name, node, ids_shape, out_shape, w)
    good = np.array(good, dtype=np.int64)
    np.testing.assert_array_equal(m.run({"ids": good})["y"], ref(good))
    with pytest.raises(InputValueError, match=rf"{node.op_type} '.*': an index is out of range") as err:
        m.run({"ids": np.array(bad, dtype=np.int64)})
    assert isinstance(err.value, TensortuneError) and "\n" not in str(err.value)
    np.testing.assert_array_equal(m.run({"ids": good})["y"], ref(good))   # the model still runs


@pytest.mark.parametrize("threads", [1, 2])
def test_a_gather_run_from_the_native_loop_names_its_node(tmp_path, threads):
    """Indices computed inside the model: the Gather's step has fixed arguments and runs from
    the native loop (`codegen.cpu._Batch`) with the step after it; out of range, the failing
    call is run again from Python and the error names the Gather, as from the step loop."""
    from ir.settings import Settings
    nodes = [h.make_node("Add", ["ids", "one"], ["j"]), h.make_node("Gather", ["w", "j"], ["g"], axis=0),
             h.make_node("Mul", ["g", "two"], ["y"])]
    g = h.make_graph(nodes, "computed_ids", [h.make_tensor_value_info("ids", T.INT64, [3])],
                     [h.make_tensor_value_info("y", T.FLOAT, [3, 16])],
                     [onnx.numpy_helper.from_array(W16, "w"), onnx.numpy_helper.from_array(np.array(1, np.int64), "one"),
                      onnx.numpy_helper.from_array(np.array(2, np.float32), "two")])
    m = runtime.load(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]),
                     settings=Settings.from_env().with_(threads=threads))
    good = np.array([0, 8, -2], np.int64)
    np.testing.assert_array_equal(m.run({"ids": good})["y"], 2 * W16[good + 1])
    prog = m.prepare({"ids": good})
    batched = [st for b, sts, _ in prog.runs if b is not None for st in sts]
    assert any(n.op == "Gather" for st in batched for n in st.subgraph.nodes), [st.name for st in prog.steps]
    with pytest.raises(InputValueError, match=r"Gather '.*': an index is out of range") as err:
        m.run({"ids": np.array([0, 9, 1], np.int64)})
    assert "\n" not in str(err.value)
    np.testing.assert_array_equal(m.run({"ids": good})["y"], 2 * W16[good + 1])   # the model still runs

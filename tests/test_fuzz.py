"""Fuzzing the three files tensortune reads from users (issue 10, item 3): ONNX models,
plan files and JSON-lines exports. Every mutation of a valid file gives a correct load
or one `TensortuneError` (one line from the CLI, exit 2) — never another exception, a
hang (each example runs under an alarm) or a huge allocation (each example runs with
its address space capped a little above what the process already has).

Mutations: bytes flipped, set or cut off; protobuf fields changed (dims, op types,
attributes, initializer dims, types, values and data, opset, deleted nodes); JSON
values replaced, deleted or added anywhere in the tree. Models are tiny (an MLP, a
one-layer BERT encoder, a chain of shape ops) so an example costs milliseconds.
"""
from __future__ import annotations

import contextlib
import copy
import json
import resource
import signal
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from ir.errors import TensortuneError
from tests.models import make_bert, make_mlp

ROOT = Path(__file__).resolve().parents[1]
FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
EXAMPLE_SECONDS = 30
EXTRA_BYTES = 2 << 30


class Hang(Exception):
    pass


@contextlib.contextmanager
def bounded():
    """Fail an example that runs past EXAMPLE_SECONDS or allocates more than EXTRA_BYTES."""
    def on_alarm(*_):
        raise Hang(f"no answer within {EXAMPLE_SECONDS} s")

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * resource.getpagesize()
    cap = vm + EXTRA_BYTES if hard == resource.RLIM_INFINITY else min(hard, vm + EXTRA_BYTES)
    old = signal.signal(signal.SIGALRM, on_alarm)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.alarm(EXAMPLE_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, old)


def clean(fn, *args):
    """fn(*args) must return or raise a one-line-able TensortuneError; anything else fails."""
    with bounded():
        try:
            return fn(*args)
        except TensortuneError as e:
            assert str(e).strip(), f"{type(e).__name__} without a message"
            return e


# -- ONNX models --------------------------------------------------------------------------

def shapes_model() -> onnx.ModelProto:
    """Expand, Tile, ConstantOfShape, Range, Reshape, Pad, Slice: every shape comes from a constant."""
    i64 = lambda name, v: numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)  # noqa: E731
    inits = [i64("eshape", [3, 4]), i64("reps", [1, 2]), i64("cshape", [3, 8]), i64("rshape", [-1, 2]),
             i64("pads", [0, 1, 0, 1]), i64("starts", [0]), i64("ends", [2]), i64("axes", [1]),
             i64("r0", 0), i64("r1", 8), i64("r2", 1), numpy_helper.from_array(np.ones((8, 4), np.float32), "w")]
    n = helper.make_node
    nodes = [n("Expand", ["x", "eshape"], ["e"]), n("Tile", ["e", "reps"], ["t"]),
             n("ConstantOfShape", ["cshape"], ["c"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
             n("Add", ["t", "c"], ["a"]), n("Range", ["r0", "r1", "r2"], ["rg"]), n("Cast", ["rg"], ["rgf"], to=1),
             n("Mul", ["a", "rgf"], ["m"]), n("MatMul", ["m", "w"], ["mm"]), n("Reshape", ["mm", "rshape"], ["rs"]),
             n("Pad", ["rs", "pads"], ["p"]), n("Slice", ["p", "starts", "ends", "axes"], ["y"])]
    g = helper.make_graph(nodes, "shapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 2])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@lru_cache(maxsize=None)
def seed_models() -> dict[str, bytes]:
    return {"mlp": make_mlp(width=8, layers=2).SerializeToString(),
            "bert": make_bert(layers=1, hidden=8, heads=2, ffn=16, vocab=10, max_pos=8).SerializeToString(),
            "shapes": shapes_model().SerializeToString()}


INTS = st.one_of(st.sampled_from([-(2 ** 62), -(2 ** 31), -1, 0, 1, 2, 3, 2 ** 31 - 1, 2 ** 40, 2 ** 62]),
                 st.integers(-4, 64))
OPS = ["Relu", "Gemm", "MatMul", "Add", "Reshape", "Transpose", "Softmax", "Gather", "Concat", "Slice", "Conv",
       "ReduceMean", "Squeeze", "Unsqueeze", "Expand", "Tile", "Pad", "Split", "Where", "Cast", "MaxPool",
       "Flatten", "ConstantOfShape", "Range", "LayerNormalization", "Erf", "NoSuchOp"]
ATTRS = ["axis", "axes", "perm", "transA", "transB", "keepdims", "group", "pads", "strides", "kernel_shape", "to"]


def _pick(data, seq, label):
    return seq[data.draw(st.integers(0, len(seq) - 1), label=label)] if len(seq) else None


def mutate_proto(m: onnx.ModelProto, data) -> None:
    """One protobuf-level change, drawn by hypothesis."""
    g = m.graph
    kind = data.draw(st.sampled_from(["dim", "dim_param", "op", "attr", "new_attr", "init_dims", "init_type",
                                      "init_value", "raw_data", "del_node", "del_init", "rewire", "opset",
                                      "elem_type"]), label="mutation")
    vis = list(g.input) + list(g.output) + list(g.value_info)
    if kind in ("dim", "dim_param", "elem_type") and vis:
        vi = _pick(data, vis, "value")
        if kind == "elem_type":
            vi.type.tensor_type.elem_type = data.draw(st.integers(0, 30))
            return
        d = _pick(data, vi.type.tensor_type.shape.dim, "axis")
        if d is not None:
            if kind == "dim":
                d.dim_value = data.draw(INTS)
            else:
                d.dim_param = data.draw(st.sampled_from(["batch", "seq", "a+b", "", "unk__3", "2*batch", "-1", "é"]))
    elif kind in ("op", "attr", "new_attr", "rewire") and g.node:
        n = _pick(data, g.node, "node")
        if kind == "op":
            n.op_type = data.draw(st.sampled_from(OPS))
        elif kind == "attr" and n.attribute:
            a = _pick(data, n.attribute, "attribute")
            if a.type == onnx.AttributeProto.INT:
                a.i = data.draw(INTS)
            elif a.type == onnx.AttributeProto.INTS:
                del a.ints[:]
                a.ints.extend(data.draw(st.lists(INTS, max_size=5)))
            elif a.type == onnx.AttributeProto.FLOAT:
                a.f = data.draw(st.sampled_from([float("nan"), float("inf"), -1e30, 0.0, 1e-30]))
        elif kind == "new_attr":
            value = data.draw(st.one_of(INTS, st.lists(INTS, min_size=1, max_size=4)))
            n.attribute.append(helper.make_attribute(data.draw(st.sampled_from(ATTRS)), value))
        elif kind == "rewire" and n.input:
            names = [i.name for i in g.input] + [t.name for t in g.initializer] + [o for x in g.node for o in x.output]
            n.input[data.draw(st.integers(0, len(n.input) - 1))] = _pick(data, names, "source")
    elif kind in ("init_dims", "init_type", "init_value", "raw_data") and g.initializer:
        t = _pick(data, g.initializer, "initializer")
        if kind == "init_dims":
            del t.dims[:]
            t.dims.extend(data.draw(st.lists(st.integers(0, 9), max_size=4)))
        elif kind == "init_type":
            t.data_type = data.draw(st.integers(0, 30))
        elif kind == "raw_data":
            t.raw_data = t.raw_data[: data.draw(st.integers(0, len(t.raw_data)))]
        elif t.data_type == TensorProto.INT64 and len(t.raw_data) >= 8:
            a = np.frombuffer(t.raw_data, dtype=np.int64).copy()
            a[data.draw(st.integers(0, a.size - 1))] = data.draw(INTS)
            t.raw_data = a.tobytes()
    elif kind == "del_node" and g.node:
        del g.node[data.draw(st.integers(0, len(g.node) - 1))]
    elif kind == "del_init" and g.initializer:
        del g.initializer[data.draw(st.integers(0, len(g.initializer) - 1))]
    elif kind == "opset":
        m.opset_import[0].version = data.draw(st.sampled_from([1, 7, 11, 13, 17, 18, 21, 99]))


@pytest.mark.parametrize("name,values", [("r1", 2 ** 40), ("pads", [0, 1, 0, -(2 ** 31)])])
def test_models_onnx_itself_cannot_handle(tmp_path, name, values):
    """Found by the fuzzer: onnx's shape inference propagates a Range of 2**40 values (minutes,
    gigabytes) and aborts the process on a Slice of a negative Pad dim. Both: one clean error, bounded."""
    m = shapes_model()
    t = next(t for t in m.graph.initializer if t.name == name)
    t.CopyFrom(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    assert isinstance(clean(inspect, path), TensortuneError)


def mutate_bytes(b: bytes, data) -> bytes:
    b = bytearray(b)
    kind = data.draw(st.sampled_from(["flip", "set", "cut"]), label="byte mutation")
    if kind == "cut":
        return bytes(b[: data.draw(st.integers(0, len(b) - 1))])
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(b) - 1))
        b[i] = b[i] ^ (1 << data.draw(st.integers(0, 7))) if kind == "flip" else data.draw(st.integers(0, 255))
    return bytes(b)


def inspect(path):
    """What `tune inspect` does: import, simplify, partition, workloads and templates at a shape."""
    from tuner.cli import inspect_text
    return inspect_text(path)


@settings(FUZZ, max_examples=40)
@given(data=st.data(), which=st.sampled_from(["mlp", "bert", "shapes"]), n=st.integers(1, 3))
def test_mutated_onnx_fields(tmp_path_factory, data, which, n):
    m = onnx.ModelProto()
    m.ParseFromString(seed_models()[which])
    for _ in range(n):
        mutate_proto(m, data)
    path = tmp_path_factory.mktemp("onnx") / f"{which}.onnx"
    path.write_bytes(m.SerializeToString())
    clean(inspect, path)


@FUZZ
@given(data=st.data(), which=st.sampled_from(["mlp", "bert", "shapes"]))
def test_mutated_onnx_bytes(tmp_path_factory, data, which):
    path = tmp_path_factory.mktemp("onnx") / f"{which}.onnx"
    path.write_bytes(mutate_bytes(seed_models()[which], data))
    clean(inspect, path)


# -- JSON trees (plans, exported records) ----------------------------------------------------

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=False, allow_infinity=False),
              st.sampled_from(["", "dense", "elementwise", "8", "x" * 300, "batch"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "batch", "lanes"]),
                                                                         inner, max_size=3)),
    max_leaves=6)


def _paths(tree, prefix=()):
    yield prefix
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(tree, list):
        for k, v in enumerate(tree):
            yield from _paths(v, prefix + (k,))


def mutate_json(tree, data):
    """Replace, delete or add one value somewhere in the tree (a deep copy)."""
    tree = copy.deepcopy(tree)
    paths = list(_paths(tree))
    path = paths[data.draw(st.integers(0, len(paths) - 1), label="json path")]
    kind = data.draw(st.sampled_from(["replace", "delete", "add"]), label="json mutation")
    if not path:
        return data.draw(JSON_VALUES) if kind == "replace" else tree
    parent = tree
    for k in path[:-1]:
        parent = parent[k]
    if kind == "replace":
        parent[path[-1]] = data.draw(JSON_VALUES)
    elif kind == "delete":
        del parent[path[-1]]
    else:
        target = parent[path[-1]]
        if isinstance(target, dict):
            target[data.draw(st.sampled_from(["extra", "lanes", "median", "format"]))] = data.draw(JSON_VALUES)
        elif isinstance(target, list):
            target.append(data.draw(JSON_VALUES))
    return tree


def mutate_text(text: str, data) -> str:
    kind = data.draw(st.sampled_from(["cut", "char", "nan", "deep"]), label="text mutation")
    if kind == "cut":
        return text[: data.draw(st.integers(0, len(text) - 1))]
    if kind == "nan":
        return text.replace("1", "NaN", 1)
    if kind == "deep":
        return text.replace("{", "[" * 100_000 + "{", 1)
    i = data.draw(st.integers(0, len(text) - 1))
    return text[:i] + data.draw(st.sampled_from(['"', "}", "\\", "\x00", "\xff", "9e999"])) + text[i + 1:]


@lru_cache(maxsize=1)
def mlp_workloads():
    """(small MLP path, its subgraph workloads at batch 32, a valid plan, valid exported lines)."""
    import tempfile

    from codegen import host_target
    from database.record import Record
    from ir import import_onnx, partition, simplify
    from ir.workload import make_workload
    from schedules import find_template
    path = Path(tempfile.mkdtemp(prefix="tt_fuzz_")) / "mlp.onnx"
    path.write_bytes(seed_models()["mlp"])
    g = simplify(import_onnx(path))
    wls = [make_workload(g, sg, {"batch": 32}) for sg in partition(g)]
    target = host_target().describe()
    entries, lines = [], []
    for wl in wls:
        t = find_template(wl)
        if t is None:
            continue
        cfg = t.default_config(wl).to_json()
        entries.append({"workload_key": wl.key, "signature": wl.signature, "template": t.name,
                        "template_version": t.version, "dims": wl.dims, "config": cfg, "median": 1e-4})
        rec = Record(workload=wl.to_json(), workload_key=wl.key, signature=wl.signature, family=wl.family,
                     template=t.name, template_version=t.version, target=target, config=cfg, status="ok",
                     latencies=[1e-4, 1.1e-4], median=1e-4)
        lines.append(json.dumps(rec.to_json(), sort_keys=True))
    plan = {"format": "tensortune-plan", "version": 1, "model": "mlp", "target": target,
            "dims": {"batch": [1, 64]}, "entries": entries}
    return path, wls, plan, lines


def deploy_with_plan(model_path, plan_path, wls):
    """Load the plan, deploy it, choose every subgraph's kernel (strict and not): no compiling."""
    import warnings

    import runtime
    from runtime.choose import Chooser
    from runtime.plan import Plan
    plan = Plan.load(plan_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runtime.load(model_path, plan=plan)
        for strict in (False, True):
            chooser = Chooser(plan, None, plan.target.get("key"), strict=strict)
            for wl in wls:
                chooser.choose(wl)
    return plan


def _plan_case(tmp_path_factory, data, tree_or_text):
    model, wls, _, _ = mlp_workloads()
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(tree_or_text if isinstance(tree_or_text, str) else json.dumps(tree_or_text))
    clean(deploy_with_plan, model, path, wls)


def test_valid_plan_and_records_load():
    """The seeds themselves are correct inputs: else every mutation would only test rejection."""
    from database.jsonl import parse_line
    from runtime.plan import Plan
    model, wls, plan, lines = mlp_workloads()
    assert len(Plan.from_json(plan).entries) == len(lines) >= 2
    assert all(parse_line(line).status == "ok" for line in lines)


@FUZZ
@given(data=st.data(), n=st.integers(1, 3))
def test_mutated_plan_json(tmp_path_factory, data, n):
    tree = mlp_workloads()[2]
    for _ in range(n):
        tree = mutate_json(tree, data)
    _plan_case(tmp_path_factory, data, tree)


@FUZZ
@given(data=st.data())
def test_mutated_plan_text(tmp_path_factory, data):
    _plan_case(tmp_path_factory, data, mutate_text(json.dumps(mlp_workloads()[2], indent=1), data))


def _read_records(path):
    from database.jsonl import read_records
    return read_records(path)


@FUZZ
@given(data=st.data(), n=st.integers(1, 3), as_text=st.booleans())
def test_mutated_jsonl_export(tmp_path_factory, data, n, as_text):
    lines = list(mlp_workloads()[3])
    k = data.draw(st.integers(0, len(lines) - 1), label="line")
    if as_text:
        lines[k] = mutate_text(lines[k], data).replace("\n", " ")
    else:
        tree = json.loads(lines[k])
        for _ in range(n):
            tree = mutate_json(tree, data)
        lines[k] = json.dumps(tree)
    path = tmp_path_factory.mktemp("jsonl") / "export.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = clean(_read_records, path)
    if not isinstance(out, Exception):  # accepted: every record is complete and fits its template
        assert len(out) == sum(1 for x in lines if x.strip()) and all(r.workload_key and r.template for r in out)


# -- the CLIs on a few mutated files: one line, exit 2 ------------------------------------

def test_cli_on_mutated_files(tmp_path):
    import os
    lines = mlp_workloads()[3]
    # onnx's C++ shape inference aborts the process on this one (a Slice of a Pad whose dim went negative)
    m = shapes_model()
    pads = next(t for t in m.graph.initializer if t.name == "pads")
    pads.CopyFrom(numpy_helper.from_array(np.array([0, 1, 0, -2 ** 31], dtype=np.int64), "pads"))
    aborts = tmp_path / "aborts.onnx"
    aborts.write_bytes(m.SerializeToString())
    export = tmp_path / "export.jsonl"
    export.write_text(lines[0] + "\n" + lines[1].replace('"status": "ok"', '"status": "fine"') + "\n")
    # (a cut model and a cut plan: tests/test_cli_errors.py)
    cases = {"malformed": ["tuner.cli", "inspect", str(aborts)],
             "export.jsonl:2": ["database.cli", "--db", f"sqlite:///{tmp_path / 't.db'}", "import", str(export)]}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = {needle: subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, cwd=ROOT, env=env) for needle, args in cases.items()}
    for needle, p in procs.items():
        _, err = p.communicate(timeout=300)
        lines_ = [x for x in err.strip().splitlines() if x.strip()]
        assert p.returncode == 2 and len(lines_) == 1 and "Traceback" not in err, err
        assert needle in lines_[0], lines_[0]

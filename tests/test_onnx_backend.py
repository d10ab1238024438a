"""ONNX backend node tests (shipped inside the `onnx` wheel) through the path a user gets:
`runtime.load(model)` (default configs: a compiled kernel wherever a template covers a
subgraph, the NumPy reference ops otherwise) and a call of the `CompiledModel`.

Every node test is attempted; none is skipped by op. Those that fail for a known
reason are in KNOWN_GAPS (reason -> tests) and xfail strictly, so a fix shows up as
an unexpected pass and a regression as a failure. The default run takes a fixed
sample (~940 tests): every test that runs on references only (fast) plus every sixth
of those that compile kernels;
`-m slow` runs all of them. `experiments/onnx_backend_report.py` writes the table.
"""
from __future__ import annotations

import re
import warnings
from functools import lru_cache

import pytest
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import Runner, _normalize_tensor

import runtime

# Ops whose float32 tests compile kernels (templates cover them); the rest of the node tests
# run on references only and are cheap, so all of those are in the default run.
COMPILED_FAMILIES = re.compile(
    r"^test_(abs|acos|acosh|add|asin|asinh|atan|atanh|averagepool|basic_conv|batchnorm|cast|ceil|celu|clip|concat|"
    r"conv|cos|cosh|div|dropout|elu|erf|exp|expand|flatten|floor|gather|gelu|gemm|globalaveragepool|globalmaxpool|"
    r"hardsigmoid|hardswish|identity|layer_normalization|leakyrelu|log|logsoftmax|matmul|max|maxpool|mean|min|"
    r"mish|mul|neg|pow|prelu|reciprocal|reduce_max|reduce_mean|reduce_min|reduce_sum|relu|reshape|round|selu|"
    r"shrink|sigmoid|sign|sin|sinh|slice|softmax|softplus|softsign|sqrt|squeeze|sub|sum|swish|tan|tanh|"
    r"thresholdedrelu|transpose|unsqueeze|attention|rms|rotary)")
SAMPLE_EVERY = 6

# reason -> node tests (full names) that fail through runtime.load for it
KNOWN_GAPS: dict[str, list[str]] = {}


def _gap_of() -> dict[str, str]:
    return {name: why for why, names in KNOWN_GAPS.items() for name in names}


@lru_cache(maxsize=1)
def node_cases() -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c for c in load_model_tests(kind="node")}


def run_case(case) -> runtime.CompiledModel:
    """Load the case's model with runtime.load, run every data set, assert like onnx's runner."""
    model = runtime.load(case.model)
    for inputs, expected in case.data_sets:
        feeds = dict(zip(model.input_names, [_normalize_tensor(x) for x in inputs]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # inf/nan inputs are part of some tests
            got = model.run(feeds)
        Runner.assert_similar_outputs([_normalize_tensor(x) for x in expected],
                                      [got[o] for o in model.graph.outputs],
                                      rtol=case.rtol, atol=case.atol, model_dir=None)
    return model


def compiled_kernels(model: runtime.CompiledModel) -> int:
    """Subgraphs that ran a generated kernel (any kind but the reference, static and view paths)."""
    cov = model.coverage()
    return sum(n for k, n in cov.counts.items() if k not in ("reference", "static", "view"))


def _compiles(name: str) -> bool:
    """Likely to compile kernels (numba, ~1 s each cold): a covered op, or an `_expanded` test
    (the op's function body: elementwise/reduce chains)."""
    return bool(COMPILED_FAMILIES.match(name)) or "_expanded" in name


def _sampled(names: list[str]) -> set[str]:
    heavy = [n for n in names if _compiles(n)]
    return {n for n in names if not _compiles(n)} | set(heavy[::SAMPLE_EVERY])


def _params():
    names = list(node_cases())
    sample, gaps = _sampled(names), _gap_of()
    out = []
    for name in names:
        marks = [] if name in sample else [pytest.mark.slow]
        if name in gaps:
            marks.append(pytest.mark.xfail(reason=gaps[name], strict=True))
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", _params())
def test_node(name):
    run_case(node_cases()[name])


def test_known_gaps_name_real_tests():
    """Every KNOWN_GAPS entry names a node test that exists (a typo would hide nothing)."""
    names = set(node_cases())
    listed = [n for ns in KNOWN_GAPS.values() for n in ns]
    assert not [n for n in listed if n not in names]
    assert len(listed) == len(set(listed)), "a test is listed under two reasons"


def test_a_compiled_kernel_runs_and_matches():
    """The backend really exercises generated kernels: float32 Elu compiles, nothing on references."""
    model = run_case(node_cases()["test_elu"])
    assert compiled_kernels(model) == 1 and model.coverage().counts.get("reference", 0) == 0

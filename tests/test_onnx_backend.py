"""ONNX backend node tests (shipped inside the `onnx` wheel) through the path a user gets:
`runtime.load(model)` (default configs: a compiled kernel wherever a template covers a
subgraph, the NumPy reference ops otherwise) and a call of the `CompiledModel`.

Every node test is attempted; none is skipped by op. Those that fail for a known
reason are in KNOWN_GAPS (reason -> tests) and xfail strictly, so a fix shows up as
an unexpected pass and a regression as a failure. The default run takes a fixed
sample (~940 tests): every test that runs on references only (fast) plus every twelfth
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
SAMPLE_EVERY = 12

# reason -> node tests (full names) that fail through runtime.load for it
KNOWN_GAPS: dict[str, list[str]] = {
    'control flow or sequence op without a shape (If/Loop/Scan/SplitToSequence)': [
        'test_affine_grid_2d_align_corners_expanded', 'test_affine_grid_2d_expanded',
        'test_affine_grid_3d_align_corners_expanded', 'test_affine_grid_3d_expanded', 'test_if_opt', 'test_if_seq',
        'test_linear_attention_decode_step_expanded', 'test_linear_attention_delta_expanded',
        'test_linear_attention_explicit_scale_expanded', 'test_linear_attention_fp16_expanded',
        'test_linear_attention_gated_delta_beta_scalar_expanded', 'test_linear_attention_gated_delta_expanded',
        'test_linear_attention_gated_delta_gqa_expanded', 'test_linear_attention_gated_delta_mqa_expanded',
        'test_linear_attention_gated_expanded', 'test_linear_attention_gated_per_head_decay_expanded',
        'test_linear_attention_linear_expanded', 'test_linear_attention_linear_t1_no_past_expanded',
        'test_linear_attention_no_past_explicit_zeros_expanded', 'test_linear_attention_prefill_with_past_expanded',
        'test_range_bfloat16_type_positive_delta_expanded', 'test_range_float16_type_positive_delta_expanded',
        'test_split_to_sequence_1', 'test_split_to_sequence_2', 'test_split_to_sequence_nokeepdims',
    ],
    'sequence/optional values are not tensors': [
        'test_identity_opt', 'test_identity_sequence', 'test_loop13_seq', 'test_loop16_seq_none',
        'test_optional_get_element_optional_sequence', 'test_optional_get_element_optional_tensor',
        'test_optional_get_element_sequence', 'test_optional_has_element_empty_optional_input',
        'test_optional_has_element_optional_input', 'test_optional_has_element_tensor_input',
        'test_sequence_insert_at_back', 'test_sequence_insert_at_front', 'test_sequence_map_add_1_sequence_1_tensor',
        'test_sequence_map_add_1_sequence_1_tensor_expanded', 'test_sequence_map_add_2_sequences',
        'test_sequence_map_add_2_sequences_expanded', 'test_sequence_map_extract_shapes',
        'test_sequence_map_extract_shapes_expanded', 'test_sequence_map_identity_1_sequence',
        'test_sequence_map_identity_1_sequence_1_tensor', 'test_sequence_map_identity_1_sequence_1_tensor_expanded',
        'test_sequence_map_identity_1_sequence_expanded', 'test_sequence_map_identity_2_sequences',
        'test_sequence_map_identity_2_sequences_expanded',
    ],
    'reduction axes fed at run time: data-dependent output shape': [
        'test_reduce_l2_default_axes_keepdims_example_expanded',
        'test_reduce_l2_default_axes_keepdims_random_expanded', 'test_reduce_l2_do_not_keepdims_example_expanded',
        'test_reduce_l2_do_not_keepdims_random_expanded', 'test_reduce_l2_empty_set_expanded',
        'test_reduce_l2_keep_dims_example_expanded', 'test_reduce_l2_keep_dims_random_expanded',
        'test_reduce_l2_negative_axes_keep_dims_example_expanded',
        'test_reduce_l2_negative_axes_keep_dims_random_expanded', 'test_reduce_log_sum_asc_axes_expanded',
        'test_reduce_log_sum_default_expanded', 'test_reduce_log_sum_desc_axes_expanded',
        'test_reduce_log_sum_empty_set_expanded', 'test_reduce_log_sum_exp_default_axes_keepdims_example_expanded',
        'test_reduce_log_sum_exp_default_axes_keepdims_random_expanded',
        'test_reduce_log_sum_exp_do_not_keepdims_example_expanded',
        'test_reduce_log_sum_exp_do_not_keepdims_random_expanded', 'test_reduce_log_sum_exp_empty_set_expanded',
        'test_reduce_log_sum_exp_keepdims_example_expanded', 'test_reduce_log_sum_exp_keepdims_random_expanded',
        'test_reduce_log_sum_exp_negative_axes_keepdims_example_expanded',
        'test_reduce_log_sum_exp_negative_axes_keepdims_random_expanded',
        'test_reduce_log_sum_negative_axes_expanded',
    ],
    'element type the importer reads as another (int16, uint16-64, bfloat16, float8, int4, string)': [
        'test_castlike_FLOAT16_to_FLOAT8E4M3FN', 'test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ',
        'test_castlike_FLOAT16_to_FLOAT8E5M2', 'test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ',
        'test_castlike_FLOAT_to_FLOAT8E4M3FN', 'test_castlike_FLOAT_to_FLOAT8E4M3FNUZ',
        'test_castlike_FLOAT_to_FLOAT8E5M2', 'test_castlike_FLOAT_to_FLOAT8E5M2FNUZ', 'test_dequantizelinear_e4m3fn',
        'test_dequantizelinear_e4m3fn_float16', 'test_dequantizelinear_e4m3fn_zero_point',
        'test_dequantizelinear_float4e2m1', 'test_dequantizelinear_int2', 'test_dequantizelinear_uint2',
        'test_quantizelinear_e4m3fn', 'test_quantizelinear_float4e2m1', 'test_quantizelinear_int2',
        'test_quantizelinear_uint2',
    ],
    "random output: values cannot match the reference generator's": [
        'test_bernoulli', 'test_bernoulli_double', 'test_bernoulli_double_expanded', 'test_bernoulli_expanded',
        'test_bernoulli_seed', 'test_bernoulli_seed_expanded', 'test_training_dropout',
        'test_training_dropout_default', 'test_training_dropout_default_mask', 'test_training_dropout_mask',
    ],
    'AssertionError: Not equal to tolerance rtol=N.N, atol=Ne-N': [
        'test_bitshift_left_int32_negative_shift', 'test_mod_float_edge_cases_fmod_0_float32',
        'test_mod_float_edge_cases_fmod_0_float64', 'test_resize_downsample_scales_cubic_align_corners',
        'test_resize_downsample_scales_linear_align_corners',
    ],
    'IndexError: tuple index out of range': [
        'test_optional_has_element_empty_no_input_name_optional_input',
        'test_optional_has_element_empty_no_input_name_tensor_input',
        'test_optional_has_element_empty_no_input_optional_input',
        'test_optional_has_element_empty_no_input_tensor_input',
    ],
    'CompileError: TypingError: Failed in nopython mode pipeline (step: nopython frontend) \x1b[Nm\x1b[Nm\x1b[NmUnknown attribut': [
        'test_mod_mixed_sign_float32', 'test_mod_mixed_sign_float64',
    ],
    'no reference of ours (Scan, QuantizeLinear float8) and onnx.reference fails on the inputs': [
        'test_quantizelinear_e5m2', 'test_scan_sum',
    ],
    "UnsupportedOpError: node '…' (DequantizeLinear): input type floatN_eNmN is not supported": [
        'test_dequantizelinear_e5m2',
    ],
}


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

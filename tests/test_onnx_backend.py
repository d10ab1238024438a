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
KNOWN_GAPS: dict[str, list[str]] = {
    'element type the importer reads as another (int16, uint16-64, bfloat16, float8, int4, string)': [
        'test_add_int16', 'test_add_uint16', 'test_add_uint32', 'test_add_uint64',
        'test_ai_onnx_ml_label_encoder_string_int', 'test_ai_onnx_ml_label_encoder_string_int_no_default',
        'test_ai_onnx_ml_label_encoder_tensor_mapping', 'test_ai_onnx_ml_label_encoder_tensor_value_only_mapping',
        'test_attention_3d_causal_bf16', 'test_attention_4d_attn_mask_causal_bf16', 'test_attention_4d_causal_bf16',
        'test_attention_4d_causal_padded_kv_bf16', 'test_attention_4d_padded_kv_bf16',
        'test_bitcast_uint16_to_int16', 'test_bitcast_uint32_to_int32', 'test_bitshift_left_int16',
        'test_bitshift_left_uint16', 'test_bitshift_left_uint32', 'test_bitshift_left_uint64',
        'test_bitshift_right_int16', 'test_bitshift_right_uint16', 'test_bitshift_right_uint32',
        'test_bitshift_right_uint64', 'test_bitwise_and_i16_3d', 'test_bitwise_and_ui64_bcast_3v1d',
        'test_bitwise_not_3d', 'test_bitwise_or_ui64_bcast_3v1d', 'test_bitwise_xor_i16_3d',
        'test_bitwise_xor_ui64_bcast_3v1d', 'test_cast_BFLOAT16_to_FLOAT', 'test_cast_FLOAT4E2M1_to_FLOAT',
        'test_cast_FLOAT4E2M1_to_FLOAT16', 'test_cast_FLOAT8E4M3FNUZ_to_FLOAT',
        'test_cast_FLOAT8E4M3FNUZ_to_FLOAT16', 'test_cast_FLOAT8E4M3FN_to_FLOAT',
        'test_cast_FLOAT8E4M3FN_to_FLOAT16', 'test_cast_FLOAT8E5M2FNUZ_to_FLOAT',
        'test_cast_FLOAT8E5M2FNUZ_to_FLOAT16', 'test_cast_INT2_to_FLOAT', 'test_cast_INT2_to_FLOAT16',
        'test_cast_INT2_to_INT8', 'test_cast_INT4_to_FLOAT', 'test_cast_INT4_to_FLOAT16', 'test_cast_INT4_to_INT8',
        'test_cast_UINT2_to_FLOAT', 'test_cast_UINT2_to_FLOAT16', 'test_cast_UINT2_to_UINT8',
        'test_cast_UINT4_to_FLOAT', 'test_cast_UINT4_to_FLOAT16', 'test_cast_UINT4_to_UINT8',
        'test_cast_e8m0_FLOAT8E8M0_to_FLOAT', 'test_cast_e8m0_FLOAT8E8M0_to_FLOAT16',
        'test_castlike_BFLOAT16_to_FLOAT', 'test_castlike_BFLOAT16_to_FLOAT_expanded',
        'test_castlike_FLOAT16_to_FLOAT4E2M1', 'test_castlike_FLOAT16_to_FLOAT4E2M1_expanded',
        'test_castlike_FLOAT16_to_FLOAT8E4M3FN', 'test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ',
        'test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ_expanded', 'test_castlike_FLOAT16_to_FLOAT8E4M3FN_expanded',
        'test_castlike_FLOAT16_to_FLOAT8E5M2', 'test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ',
        'test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ_expanded', 'test_castlike_FLOAT16_to_INT2',
        'test_castlike_FLOAT16_to_INT2_expanded', 'test_castlike_FLOAT16_to_INT4',
        'test_castlike_FLOAT16_to_INT4_expanded', 'test_castlike_FLOAT16_to_UINT2',
        'test_castlike_FLOAT16_to_UINT2_expanded', 'test_castlike_FLOAT16_to_UINT4',
        'test_castlike_FLOAT16_to_UINT4_expanded', 'test_castlike_FLOAT4E2M1_to_FLOAT',
        'test_castlike_FLOAT4E2M1_to_FLOAT16', 'test_castlike_FLOAT4E2M1_to_FLOAT16_expanded',
        'test_castlike_FLOAT4E2M1_to_FLOAT_expanded', 'test_castlike_FLOAT8E4M3FNUZ_to_FLOAT',
        'test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16', 'test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16_expanded',
        'test_castlike_FLOAT8E4M3FNUZ_to_FLOAT_expanded', 'test_castlike_FLOAT8E4M3FN_to_FLOAT',
        'test_castlike_FLOAT8E4M3FN_to_FLOAT16', 'test_castlike_FLOAT8E4M3FN_to_FLOAT16_expanded',
        'test_castlike_FLOAT8E4M3FN_to_FLOAT_expanded', 'test_castlike_FLOAT8E5M2FNUZ_to_FLOAT',
        'test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16', 'test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16_expanded',
        'test_castlike_FLOAT8E5M2FNUZ_to_FLOAT_expanded', 'test_castlike_FLOAT_to_BFLOAT16',
        'test_castlike_FLOAT_to_BFLOAT16_expanded', 'test_castlike_FLOAT_to_FLOAT4E2M1',
        'test_castlike_FLOAT_to_FLOAT4E2M1_expanded', 'test_castlike_FLOAT_to_FLOAT8E4M3FN',
        'test_castlike_FLOAT_to_FLOAT8E4M3FNUZ', 'test_castlike_FLOAT_to_FLOAT8E4M3FNUZ_expanded',
        'test_castlike_FLOAT_to_FLOAT8E4M3FN_expanded', 'test_castlike_FLOAT_to_FLOAT8E5M2',
        'test_castlike_FLOAT_to_FLOAT8E5M2FNUZ', 'test_castlike_FLOAT_to_FLOAT8E5M2FNUZ_expanded',
        'test_castlike_FLOAT_to_INT2', 'test_castlike_FLOAT_to_INT2_expanded', 'test_castlike_FLOAT_to_INT4',
        'test_castlike_FLOAT_to_INT4_expanded', 'test_castlike_FLOAT_to_UINT2',
        'test_castlike_FLOAT_to_UINT2_expanded', 'test_castlike_FLOAT_to_UINT4',
        'test_castlike_FLOAT_to_UINT4_expanded', 'test_castlike_INT2_to_FLOAT', 'test_castlike_INT2_to_FLOAT16',
        'test_castlike_INT2_to_FLOAT16_expanded', 'test_castlike_INT2_to_FLOAT_expanded',
        'test_castlike_INT2_to_INT8', 'test_castlike_INT2_to_INT8_expanded', 'test_castlike_INT4_to_FLOAT',
        'test_castlike_INT4_to_FLOAT16', 'test_castlike_INT4_to_FLOAT16_expanded',
        'test_castlike_INT4_to_FLOAT_expanded', 'test_castlike_INT4_to_INT8', 'test_castlike_INT4_to_INT8_expanded',
        'test_castlike_UINT2_to_FLOAT', 'test_castlike_UINT2_to_FLOAT16', 'test_castlike_UINT2_to_FLOAT16_expanded',
        'test_castlike_UINT2_to_FLOAT_expanded', 'test_castlike_UINT2_to_UINT8',
        'test_castlike_UINT2_to_UINT8_expanded', 'test_castlike_UINT4_to_FLOAT', 'test_castlike_UINT4_to_FLOAT16',
        'test_castlike_UINT4_to_FLOAT16_expanded', 'test_castlike_UINT4_to_FLOAT_expanded',
        'test_castlike_UINT4_to_UINT8', 'test_castlike_UINT4_to_UINT8_expanded',
        'test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN', 'test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ',
        'test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ_expanded',
        'test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN_expanded',
        'test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2', 'test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ',
        'test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ_expanded',
        'test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN', 'test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ',
        'test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ_expanded',
        'test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN_expanded', 'test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2',
        'test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ',
        'test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ_expanded', 'test_celu_bfloat16',
        'test_celu_bfloat16_expanded', 'test_compress_bfloat16', 'test_dequantizelinear_e4m3fn',
        'test_dequantizelinear_e4m3fn_float16', 'test_dequantizelinear_e4m3fn_zero_point',
        'test_dequantizelinear_float4e2m1', 'test_dequantizelinear_int16', 'test_dequantizelinear_int2',
        'test_dequantizelinear_int4', 'test_dequantizelinear_uint16', 'test_dequantizelinear_uint2',
        'test_dequantizelinear_uint4', 'test_div_int16', 'test_div_uint16', 'test_div_uint32', 'test_div_uint64',
        'test_einsum_batch_matmul_bfloat16', 'test_einsum_sum_bfloat16', 'test_einsum_transpose_bfloat16',
        'test_equal_int16', 'test_equal_string', 'test_equal_string_broadcast', 'test_equal_uint16',
        'test_equal_uint32', 'test_equal_uint64', 'test_greater_equal_int16', 'test_greater_equal_int16_expanded',
        'test_greater_equal_uint16', 'test_greater_equal_uint16_expanded', 'test_greater_equal_uint32',
        'test_greater_equal_uint32_expanded', 'test_greater_equal_uint64', 'test_greater_equal_uint64_expanded',
        'test_greater_int16', 'test_greater_uint16', 'test_greater_uint32', 'test_greater_uint64',
        'test_less_equal_int16', 'test_less_equal_int16_expanded', 'test_less_equal_uint16',
        'test_less_equal_uint16_expanded', 'test_less_equal_uint32', 'test_less_equal_uint32_expanded',
        'test_less_equal_uint64', 'test_less_equal_uint64_expanded', 'test_less_int16', 'test_less_uint16',
        'test_less_uint32', 'test_less_uint64', 'test_max_int16', 'test_max_uint16', 'test_max_uint32',
        'test_max_uint64', 'test_min_int16', 'test_min_uint16', 'test_min_uint32', 'test_min_uint64',
        'test_mod_mixed_sign_int16', 'test_mod_uint16', 'test_mod_uint32', 'test_mod_uint64', 'test_mul_int16',
        'test_mul_uint16', 'test_mul_uint32', 'test_mul_uint64', 'test_onehot_with_bfloat16_values',
        'test_pow_types_float32_uint32', 'test_pow_types_float32_uint64', 'test_quantizelinear_e4m3fn',
        'test_quantizelinear_float4e2m1', 'test_quantizelinear_int16', 'test_quantizelinear_int2',
        'test_quantizelinear_int4', 'test_quantizelinear_uint16', 'test_quantizelinear_uint2',
        'test_quantizelinear_uint4', 'test_range_bfloat16_type_positive_delta', 'test_regex_full_match_basic',
        'test_regex_full_match_email_domain', 'test_regex_full_match_empty', 'test_reversesequence_bfloat16',
        'test_string_concat', 'test_string_concat_broadcasting', 'test_string_concat_empty_string',
        'test_string_concat_utf8', 'test_string_concat_zero_dimensional', 'test_string_split_basic',
        'test_string_split_consecutive_delimiters', 'test_string_split_empty_string_delimiter',
        'test_string_split_empty_tensor', 'test_string_split_maxsplit', 'test_string_split_no_delimiter',
        'test_strnormalizer_export_monday_casesensintive_lower',
        'test_strnormalizer_export_monday_casesensintive_nochangecase',
        'test_strnormalizer_export_monday_casesensintive_upper', 'test_strnormalizer_export_monday_empty_output',
        'test_strnormalizer_export_monday_insensintive_upper_twodim', 'test_strnormalizer_nostopwords_nochangecase',
        'test_sub_int16', 'test_sub_uint16', 'test_sub_uint32', 'test_sub_uint64', 'test_top_k_uint64',
        'test_unique_bfloat16_sorted_without_axis',
    ],
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
        'test_range_float_type_positive_delta_expanded', 'test_range_int32_type_negative_delta_expanded',
        'test_split_to_sequence_1', 'test_split_to_sequence_2', 'test_split_to_sequence_nokeepdims',
    ],
    'sequence/optional values are not tensors': [
        'test_identity_opt', 'test_identity_sequence', 'test_loop13_seq', 'test_loop16_seq_none',
        'test_optional_get_element_optional_sequence', 'test_optional_get_element_optional_tensor',
        'test_optional_get_element_sequence', 'test_optional_has_element_empty_optional_input',
        'test_optional_has_element_optional_input', 'test_optional_has_element_tensor_input',
        'test_sequence_insert_at_back', 'test_sequence_insert_at_front',
        'test_sequence_map_add_1_sequence_1_tensor', 'test_sequence_map_add_1_sequence_1_tensor_expanded',
        'test_sequence_map_add_2_sequences', 'test_sequence_map_add_2_sequences_expanded',
        'test_sequence_map_extract_shapes', 'test_sequence_map_extract_shapes_expanded',
        'test_sequence_map_identity_1_sequence', 'test_sequence_map_identity_1_sequence_1_tensor',
        'test_sequence_map_identity_1_sequence_1_tensor_expanded', 'test_sequence_map_identity_1_sequence_expanded',
        'test_sequence_map_identity_2_sequences', 'test_sequence_map_identity_2_sequences_expanded',
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
    'shape from an unresolved annotation (unk__N): a dim nothing binds': [
        'test_blackmanwindow_expanded', 'test_blackmanwindow_symmetric_expanded',
        'test_center_crop_pad_crop_and_pad_expanded', 'test_center_crop_pad_crop_axes_chw_expanded',
        'test_center_crop_pad_crop_axes_hwc_expanded', 'test_center_crop_pad_crop_expanded',
        'test_center_crop_pad_crop_negative_axes_hwc_expanded', 'test_center_crop_pad_pad_expanded',
        'test_hammingwindow_expanded', 'test_hammingwindow_symmetric_expanded', 'test_hannwindow_expanded',
        'test_hannwindow_symmetric_expanded', 'test_unique_length_1', 'test_unique_not_sorted_without_axis',
        'test_unique_sorted_with_axis', 'test_unique_sorted_with_axis_3d', 'test_unique_sorted_with_negative_axis',
        'test_unique_sorted_without_axis',
    ],
    "random output: values cannot match the reference generator's": [
        'test_bernoulli', 'test_bernoulli_double', 'test_bernoulli_double_expanded', 'test_bernoulli_expanded',
        'test_bernoulli_seed', 'test_bernoulli_seed_expanded', 'test_training_dropout',
        'test_training_dropout_default', 'test_training_dropout_default_mask', 'test_training_dropout_mask',
    ],
    'Cast to bfloat16: no NumPy dtype in the Cast table': [
        'test_attention_3d_causal_bf16_expanded', 'test_attention_4d_attn_mask_causal_bf16_expanded',
        'test_attention_4d_causal_bf16_expanded', 'test_attention_4d_causal_padded_kv_bf16_expanded',
        'test_attention_4d_padded_kv_bf16_expanded',
    ],
    'no reference of ours (Scan, QuantizeLinear float8) and onnx.reference fails on the inputs': [
        'test_quantizelinear_e5m2', 'test_scan_sum',
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

"""ONNX backend node tests (``onnx.backend.test``) run through tilework.

A node test is *attempted* when every op in its graph (subgraphs included) has a converter for
the schema version its opset selects; the others are skipped as unsupported. Attempted tests
that fail are listed, with the reason, in ``onnx_expected_failures.txt``; they run as expected
failures, so a listed test that starts passing fails the run (unexpected success) and the
list stays honest. Entries must name attempted node tests.

    TILEWORK_ONNX_FULL=1 python -m pytest tests/frontend/test_onnx_conformance.py   # every node test
    python -m pytest tests/frontend/test_onnx_conformance.py                        # the CI subset
    TILEWORK_ONNX_ONLY='^test_dft' python -m pytest tests/frontend/test_onnx_conformance.py  # node tests matching a regex

Models are compiled in groups (one kernel library per group), each group a test class whose
class-scoped fixture compiles it when its first test runs in the process (so xdist workers do not
each compile every group); see
``onnx_backend.TileworkBackend.prepare_group``. Only the selected node tests are collected (the
others are not listed as skipped). Results are recorded in docs/conformance.md.
"""

from __future__ import annotations

import os
import re
import unittest
import warnings
from pathlib import Path
from typing import Iterator

import onnx
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the case generators warn about overflowing casts
    from onnx.backend.test import BackendTest
    from onnx.backend.test.case.test_case import TestCase as NodeCase
    from onnx.backend.test.loader import load_model_tests

from tests.frontend.onnx_backend import TileworkBackend
from tilework.frontend.onnx import supported
from tilework.frontend.onnx.importer import default_opset, domain_opsets

FULL = os.environ.get("TILEWORK_ONNX_FULL", "") == "1"
ONLY = os.environ.get("TILEWORK_ONNX_ONLY", "")  # a regex over node-test names: run only those (attempted) tests
GROUP_SIZE = 40
HERE = Path(__file__).parent

# A representative subset for CI: every op family, old and new opsets, symbolic shape
# folding, static operands, control flow, data-dependent shapes and expected failures.
CI_SUBSET = """
test_abs test_add_bcast test_sub_uint8 test_mul_example test_div_int8 test_pow_types_int64_float32
test_mod_mixed_sign_int32 test_mod_mixed_sign_float32 test_equal_bcast test_less_equal_bcast
test_and_bcast4v4d test_not_3d test_where_long_example test_max_example test_mean_example
test_sum_two_inputs test_clip_default_inbounds test_clip_example test_relu test_sigmoid
test_tanh test_erf test_exp test_log test_sqrt test_reciprocal test_sign test_ceil test_round
test_tan test_atan test_acosh test_sinh test_softplus test_softsign test_elu test_selu
test_leakyrelu test_hardsigmoid test_hardswish test_mish test_thresholdedrelu test_shrink_soft
test_prelu_broadcast test_gelu_tanh_2 test_isnan test_isinf_negative test_cast_FLOAT_to_FLOAT16
test_castlike_FLOAT_to_DOUBLE test_identity test_shape test_shape_start_1_end_negative_1
test_size_example test_reshape_reordered_all_dims test_reshape_negative_extended_dims
test_reshape_allowzero_reordered test_flatten_negative_axis1 test_squeeze_negative_axes
test_unsqueeze_three_axes test_transpose_default test_concat_2d_axis_negative_1
test_split_equal_parts_1d_opset18 test_split_variable_parts_2d_opset13
test_split_1d_uneven_split_opset18 test_slice_neg_steps test_slice_start_out_of_bounds
test_gather_2d_indices test_gather_negative_indices test_gather_elements_1
test_scatter_elements_with_reduction_max test_expand_dim_changed test_tile
test_constantofshape_int_zeros test_range_int32_type_negative_delta test_edge_pad
test_reflect_pad test_wrap_pad test_constant_pad_axes test_depthtospace_crd_mode_example
test_spacetodepth_example test_tril_neg test_cumsum_1d_reverse_exclusive
test_onehot_negative_indices test_eyelike_with_dtype test_reduce_sum_keepdims_example
test_reduce_mean_default_axes_keepdims_random test_reduce_max_keepdims_example
test_reduce_l2_do_not_keepdims_example test_reduce_log_sum_exp_keepdims_random
test_reduce_sum_empty_axes_input_noop test_reduce_prod_do_not_keepdims_random
test_argmax_negative_axis_keepdims_example test_argmin_keepdims_example_select_last_index
test_softmax_axis_0 test_logsoftmax_axis_1 test_hardmax_example test_softmax_example_expanded
test_top_k_smallest test_nonzero_example test_unique_sorted_without_axis test_matmul_4d
test_gemm_all_attributes test_layer_normalization_4d_axis1
test_layer_normalization_2d_axis0_expanded test_batchnorm_example test_group_normalization_example
test_instancenorm_example test_lpnormalization_default test_mvn test_conv_with_strides_padding
test_conv_with_autopad_same test_maxpool_2d_pads test_averagepool_2d_ceil
test_maxpool_1d_default test_globalaveragepool test_dropout_default_mask
test_if test_if_seq test_rms_normalization_2d_axis1 test_swish test_bitshift_left_uint8
test_bitshift_right_int32_negative_shift test_attention_4d_gqa_with_past_and_present
test_attention_3d_causal test_attention_4d_attn_mask_bool test_attention_4d_softcap
test_sce_mean_weight_ii test_nllloss_NCd1d2_with_weight_reduction_mean test_sce_none_log_prob
test_resize_upsample_scales_linear test_resize_downsample_scales_cubic_align_corners
test_resize_upsample_sizes_nearest_not_larger test_compress_default_axis test_center_crop_pad_crop_and_pad
test_convtranspose_output_shape test_gridsample_bicubic test_lstm_with_peepholes test_gru_seq_length
test_simple_rnn_batchwise test_quantizelinear_axis test_dequantizelinear_blocked test_qlinearmatmul_2D_uint8_float32
test_dynamicquantizelinear test_add_uint32
test_lppool_2d_pads test_reversesequence_batch test_scatter_with_axis test_reduce_sum_empty_set
test_averagepool_3d_default test_maxpool_2d_dilations test_add_uint16
test_resize_downsample_scales_linear_antialias test_training_dropout
test_einsum_batch_diagonal test_cumprod_1d_reverse_exclusive test_rotary_embedding_interleaved
test_gathernd_example_float32 test_scatternd_add test_attention_local_window_with_past
test_sequence_map_add_2_sequences_expanded test_split_to_sequence_1 test_optional_has_element_empty_optional_input
test_flexattention_score_mod test_nonmaxsuppression_two_batches test_deform_conv_with_mask_bias
test_linear_attention_gated_delta_gqa test_linear_attention_gated test_causal_conv_with_state_silu_with_past_state test_scan9_multi_state
test_dft_irfft test_bitwise_xor_ui64_bcast_3v1d test_det_nd
""".split()


def _ops(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _ops(a.g)


def attempted(case: NodeCase) -> bool:
    """Every op of the test's model has a converter at its opset."""
    model = case.model
    if model is None:
        return False
    try:
        default_opset(model)
    except Exception:  # noqa: BLE001 - a model without the default domain is not attempted
        return False
    opsets = domain_opsets(model)
    return all(supported(n.op_type, opsets.get("" if n.domain == "ai.onnx" else n.domain, 0), n.domain) for n in _ops(model.graph))


def load_expected_failures() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (HERE / "onnx_expected_failures.txt").read_text().splitlines():
        name, _, reason = line.partition("#")
        name = name.strip()
        if name:
            out[name] = reason.strip()
    return out


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    NODE_CASES = {c.name: c for c in load_model_tests(kind="node")}
ATTEMPTED = {name for name, c in NODE_CASES.items() if attempted(c)}
EXPECTED_FAILURES = load_expected_failures()
if ONLY:
    SELECTED = sorted(n for n in ATTEMPTED if re.search(ONLY, n))
else:
    SELECTED = sorted(ATTEMPTED if FULL else set(CI_SUBSET) & ATTEMPTED)


def test_expected_failure_names_are_attempted_node_tests() -> None:
    stale = sorted(n for n in EXPECTED_FAILURES if n not in ATTEMPTED)
    assert not stale, f"onnx_expected_failures.txt names tests that are not attempted node tests: {stale}"


def test_ci_subset_names_are_node_tests() -> None:
    unknown = sorted(n for n in CI_SUBSET if n not in NODE_CASES)
    assert not unknown, f"CI_SUBSET names unknown node tests: {unknown}"
    assert len(set(CI_SUBSET) & ATTEMPTED) >= 0.9 * len(CI_SUBSET)


# The runnable selected tests in name order, in groups of GROUP_SIZE: each group is a test class
# of its own whose class-scoped fixture compiles the group's models as one kernel library when
# the class's first test runs in the process, so an xdist worker compiles only the groups of the
# tests it is sent (a module-scoped fixture compiled every group on every worker).
RUNNABLE = sorted((n for n in SELECTED if NODE_CASES[n].data_sets), key=lambda n: n + "_cpu")
GROUPS = [RUNNABLE[k : k + GROUP_SIZE] for k in range(0, len(RUNNABLE), GROUP_SIZE)]


@pytest.fixture(scope="class", autouse=True)
def _compile_group(request: pytest.FixtureRequest) -> None:
    """Compile the models of the test class's group (one module) before its tests run."""
    k = getattr(request.cls, "group", None)
    if k is not None:
        TileworkBackend.prepare_group([(n, NODE_CASES[n].model, NODE_CASES[n].data_sets[0][0]) for n in GROUPS[k]])  # type: ignore[index, misc]


def _names_pattern(names: list[str]) -> str:
    return "^(" + "|".join(re.escape(n) for n in names) + ")_cpu$"


_backend_test = BackendTest(TileworkBackend, __name__)
_backend_test.include(_names_pattern(SELECTED) if SELECTED else "^$")
# only the selected node tests become test items: the thousands of others (and every _cuda
# variant) would be collected only to be skipped, each paying the per-test fixtures
_cpu_names = {f"{n}_cpu" for n in SELECTED}
for _category, _items in _backend_test._test_items.items():
    if "Node" in _category:
        _backend_test._test_items[_category] = {k: v for k, v in _items.items() if k in _cpu_names}
for _name in sorted(EXPECTED_FAILURES):
    if _name in SELECTED:
        _backend_test.xfail(f"^{re.escape(_name)}_cpu$")

_node_tests = {k: v for cls in (c for name, c in _backend_test.test_cases.items() if "Node" in name) for k, v in vars(cls).items() if k.startswith("test_")}
for _k, _group in enumerate(GROUPS):
    _cls = type(f"OnnxBackendNodeGroup{_k:02d}Test", (unittest.TestCase,), {"group": _k, **{f"{n}_cpu": _node_tests.pop(f"{n}_cpu") for n in _group}})
    _cls.__module__ = __name__
    globals()[_cls.__name__] = _cls
del _cls  # pytest collects every TestCase subclass bound in the module, by any name
if _node_tests:  # selected tests without data sets: each compiles its own model
    OnnxBackendNodeModelTest = type("OnnxBackendNodeModelTest", (unittest.TestCase,), _node_tests)
    OnnxBackendNodeModelTest.__module__ = __name__

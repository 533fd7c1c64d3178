"""Every op of the core set has a legalization, and the numeric tests exercise each of them."""

from __future__ import annotations

from tests.op import (
    test_bitwise,
    test_conv,
    test_detection,
    test_einsum,
    test_index,
    test_legalize_create,
    test_legalize_elementwise,
    test_legalize_linalg,
    test_legalize_manipulate,
    test_legalize_nn,
    test_legalize_reduce,
    test_logsumexp_cumprod,
    test_math,
    test_norm_extra,
    test_one_hot,
    test_pad,
    test_rnn_vision_ops,
    test_rotary,
    test_search,
    test_shape,
)
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, Call, OpRef, Var, bindings_of
from tilework.op import all_ops

NOT_LEGALIZED = {"call_tensor", "call_lib", "call_packed", "assert_dims"}  # and the vm_* ops
TESTED_APART = {"shape_of"}  # no kernel: see test_shape_of_is_the_shape_value
# tensor_to_shape has no kernel, nonzero and unique bind a run-time count between two kernels:
# tests/op/test_shape.py and test_search.py run them end to end
TESTED_APART |= {"tensor_to_shape", "nonzero", "unique"}
# the LLM ops: tests/op/test_quant_ops.py (quant_linear, quant_take against dequantized NumPy), tests/op/test_expert_linear.py,
# tests/llm/test_paged_attention.py (paged_attention against NumPy, decode and prefill;
# paged_rotary against NumPy's cosines and sines, and given to paged_attention)
TESTED_APART |= {"quant_linear", "quant_take", "expert_linear", "paged_attention", "paged_rotary"}
# check_nonzero raises at run time: tests/codegen/test_int_division.py (torch's x // 0)
TESTED_APART |= {"check_nonzero"}
# check_index raises at run time: tests/codegen/test_index_check.py (torch's IndexError)
TESTED_APART |= {"check_index"}
# the channel-last conv ops of conv_gemm: tests/op/test_im2col.py (im2col, max_pool2d_nhwc,
# depthwise_conv2d_nhwc and global_avg_pool_nhwc against NumPy at symbolic batch, height and width),
# tests/op/test_direct_conv.py (direct_conv2d_nhwc against the float64 conv at symbolic dims)
TESTED_APART |= {"im2col", "max_pool2d_nhwc", "depthwise_conv2d_nhwc", "global_avg_pool_nhwc", "direct_conv2d_nhwc"}
# the Winograd convolution's three ops: tests/transform/test_winograd.py (against the float64
# reference and the im2col path, at a symbolic batch and odd sizes)
TESTED_APART |= {"winograd_input_nhwc", "batch_linear_io", "winograd_output_nhwc", "winograd_conv_nhwc"}
# tests/op/test_grouped_conv.py (grouped_conv2d_nhwc against the float64 conv at symbolic dims)
TESTED_APART |= {"grouped_conv2d_nhwc"}


def _ops_in_cases() -> set[str]:
    names: set[str] = set()
    bb = BlockBuilder()
    for mod in (test_legalize_create, test_legalize_elementwise, test_legalize_linalg, test_legalize_manipulate, test_legalize_nn, test_legalize_reduce, test_conv, test_index, test_norm_extra, test_rotary, test_pad, test_math, test_shape, test_one_hot, test_logsumexp_cumprod, test_einsum, test_search, test_rnn_vision_ops, test_bitwise, test_detection):
        for case in mod.CASES:  # type: ignore[attr-defined]
            params = [Var(f"p{i}", info) for i, info in enumerate(case.infos)]
            with bb.function(f"{mod.__name__.rsplit('.', 1)[1]}_{case.name}", params):
                bb.emit_func_output(bb.emit(case.make(*params)))
    for _, func in bb.get().graph_funcs():
        for b in bindings_of(func):
            if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef):
                names.add(b.value.callee.name)
    return names


def test_every_op_has_a_legalization() -> None:
    missing = sorted(name for name, op in all_ops().items() if op.legalize is None and name not in NOT_LEGALIZED and not name.startswith("vm_"))
    assert missing == []


def test_every_legalized_op_runs_against_a_reference() -> None:
    legalized = {name for name, op in all_ops().items() if op.legalize is not None}
    assert sorted(legalized - _ops_in_cases() - TESTED_APART) == []

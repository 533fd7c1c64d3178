"""ONNX ``LinearAttention``, ``CausalConvWithState`` and ``Scan`` beyond the node tests: symbolic
sequence lengths (one compilation, several lengths), grouped heads with a past state in the
closed-form rules (the three of them as nodes of one model, compiled once), scan directions and
axes, and the errors for what must be static. Nothing here is in the long tier only."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.frontend.onnx_util import assert_matches_ort, assert_matches_reference, model, tensor
from tilework.errors import UnsupportedError
from tilework.frontend.onnx import from_onnx

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _out(name: str, rank: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, F, [None] * rank)


def _check(m: onnx.ModelProto, runs: Sequence[Sequence[np.ndarray]]) -> None:
    """Against onnx's reference evaluator (onnxruntime has no opset 27 yet)."""
    assert_matches_reference(m, runs, rtol=1e-4, atol=1e-5)


def _la_model(rule: str, hq: int, hkv: int, dk: int, decay_n: int | None, seq: int | str = "seq", **attrs: Any) -> onnx.ModelProto:
    ins = [tensor("q", F, [2, seq, hq * dk]), tensor("k", F, [2, seq, hkv * dk]), tensor("v", F, [2, seq, hkv * dk]), tensor("past", F, [2, hkv, dk, dk])]
    operands = ["q", "k", "v", "past"]
    if decay_n is not None:
        ins.append(tensor("decay", F, [2, seq, decay_n]))
        operands.append("decay")
    if rule in ("delta", "gated_delta"):
        ins.append(tensor("beta", F, [2, seq, hkv]))
        operands += [""] * (5 - len(operands)) + ["beta"]
    node = helper.make_node("LinearAttention", operands, ["o", "state"], name="la", update_rule=rule, q_num_heads=hq, kv_num_heads=hkv, **attrs)
    return model([node], ins, [_out("o", 3), _out("state", 4)], opset=27)


def _la_inputs(t: int, hq: int, hkv: int, dk: int, decay_n: int | None) -> list[np.ndarray]:
    arrs = [RNG.standard_normal(s).astype(np.float32) for s in ((2, t, hq * dk), (2, t, hkv * dk), (2, t, hkv * dk), (2, hkv, dk, dk))]
    if decay_n is not None:
        arrs.append(-RNG.uniform(0.05, 0.5, (2, t, decay_n)).astype(np.float32))
    return arrs


def test_closed_form_rules_with_a_symbolic_length_grouped_heads_and_a_past_state() -> None:
    """The linear rule, and the gated one with a decay per head and per dim: three nodes of one
    model over the same q, k, v and past state, compiled once (one build, not three)."""
    hq, hkv, dk = 4, 2, 4
    ins = [tensor("q", F, [2, "seq", hq * dk]), tensor("k", F, [2, "seq", hkv * dk]), tensor("v", F, [2, "seq", hkv * dk]), tensor("past", F, [2, hkv, dk, dk])]
    ins += [tensor("decay_head", F, [2, "seq", hkv]), tensor("decay_dim", F, [2, "seq", hkv * dk])]
    heads: dict[str, Any] = dict(q_num_heads=hq, kv_num_heads=hkv)
    nodes = [
        helper.make_node("LinearAttention", ["q", "k", "v", "past"], ["o_linear", "state_linear"], name="linear", update_rule="linear", **heads),
        helper.make_node("LinearAttention", ["q", "k", "v", "past", "decay_head"], ["o_head", "state_head"], name="per_head", update_rule="gated", **heads),
        helper.make_node("LinearAttention", ["q", "k", "v", "past", "decay_dim"], ["o_dim", "state_dim"], name="per_dim", update_rule="gated", **heads),
    ]
    outs = [_out(f"{o}_{n}", 3 if o == "o" else 4) for n in ("linear", "head", "dim") for o in ("o", "state")]
    m = model(nodes, ins, outs, opset=27)
    runs = [_la_inputs(t, hq, hkv, dk, hkv) + [-RNG.uniform(0.05, 0.5, (2, t, hkv * dk)).astype(np.float32)] for t in (1, 5)]
    _check(m, runs)


def test_delta_rule_with_a_symbolic_length_is_refused_naming_the_dim() -> None:
    m = _la_model("gated_delta", 2, 2, 4, 2)
    with pytest.raises(UnsupportedError, match=r"LinearAttention \(node 'la'.*sequence length \(dim 1 of query\) is the symbolic dim seq"):
        from_onnx(m)


def test_causal_conv_with_a_symbolic_length() -> None:
    node = helper.make_node("CausalConvWithState", ["x", "w", "b", "past"], ["y", "state"], activation="silu")
    ins = [tensor("x", F, [1, 3, "n"]), tensor("w", F, [3, 1, 3]), tensor("b", F, [3]), tensor("past", F, [1, 3, 2])]
    m = model([node], ins, [_out("y", 3), _out("state", 3)], opset=27)
    runs = [[RNG.standard_normal(s).astype(np.float32) for s in ((1, 3, n), (3, 1, 3), (3,), (1, 3, 2))] for n in (1, 6)]
    _check(m, runs)


def _scan_model(length: int | str, **attrs: Any) -> onnx.ModelProto:
    """A running sum over the rows of ``x`` that also emits each partial sum and each row doubled."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "row"], ["acc_out"]), helper.make_node("Identity", ["acc_out"], ["sum_out"]), helper.make_node("Add", ["row", "row"], ["twice"])],
        "body",
        [tensor("acc", F, [3]), tensor("row", F, [3])],
        [tensor("acc_out", F, [3]), tensor("sum_out", F, [3]), tensor("twice", F, [3])],
    )
    node = helper.make_node("Scan", ["init", "x"], ["final", "sums", "twice"], name="scan", body=body, num_scan_inputs=1, **attrs)
    ins = [tensor("init", F, [3]), tensor("x", F, [3, length] if attrs.get("scan_input_axes") else [length, 3])]
    return model([node], ins, [_out("final", 1), _out("sums", 2), _out("twice", 2)], opset=16)


def test_scan_directions_and_axes() -> None:
    m = _scan_model(4, scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1, -1], scan_output_directions=[0, 1])
    assert_matches_ort(m, [[RNG.standard_normal(3).astype(np.float32), RNG.standard_normal((3, 4)).astype(np.float32)]])


def test_scan_with_a_symbolic_length_is_refused_naming_the_dim() -> None:
    with pytest.raises(UnsupportedError, match=r"Scan \(node 'scan'.*scan length \(dim 0 of scan input 'x'\) is the symbolic dim steps"):
        from_onnx(_scan_model("steps"))

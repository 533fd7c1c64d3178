"""ONNX sequences and optionals: their layout is fixed at conversion time, their tensors stay
symbolic; whatever would make the layout depend on run-time data is refused with an error
naming the op and the node. Numerics are checked against onnx's reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.frontend.onnx_backend import TileworkBackend
from tests.frontend.onnx_util import compile_onnx, model, tensor
from tilework.errors import UnsupportedError
from tilework.frontend.onnx import from_onnx

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
rng = np.random.default_rng(0)


def seq(name: str, elem: int, shape: list[int | str | None]) -> object:
    return helper.make_tensor_sequence_value_info(name, elem, shape)


def test_split_insert_concat_with_symbolic_dims() -> None:
    """A sequence made by SplitToSequence over a symbolic dim, edited, joined and returned:
    compiled once, right for several sizes; the sequence output is a tuple."""
    nodes = [
        helper.make_node("Constant", [], ["split"], value=helper.make_tensor("split", I64, [2], [2, 4])),
        helper.make_node("SplitToSequence", ["x", "split"], ["s"], axis=1),
        helper.make_node("SequenceInsert", ["s", "x"], ["s2"]),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", I64, [], [0])),
        helper.make_node("SequenceErase", ["s2", "zero"], ["s3"]),
        helper.make_node("ConcatFromSequence", ["s3"], ["y"], axis=1),
        helper.make_node("SequenceLength", ["s3"], ["n"]),
    ]
    m = model(nodes, [tensor("x", F, ["n", 6])], [tensor("y", F, ["n", None]), seq("s3", F, ["n", None]), tensor("n", I64, [])], opset=17)
    fn = compile_onnx(m)
    ref = ReferenceEvaluator(m)
    for rows in (1, 3, 5):
        x = rng.standard_normal((rows, 6)).astype(np.float32)
        y, s3, n = fn(x)
        want_y, want_s3, want_n = ref.run(None, {"x": x})
        np.testing.assert_allclose(y, want_y)
        assert isinstance(s3, tuple) and len(s3) == len(want_s3) == 2
        for got, want in zip(s3, want_s3):
            np.testing.assert_allclose(got, want)
        assert int(n) == int(want_n) == 2


def test_sequence_input_needs_its_length() -> None:
    m = model([helper.make_node("SequenceAt", ["s", "i"], ["y"])], [seq("s", F, [3]), tensor("i", I64, [])], [tensor("y", F, [3])], opset=17)
    with pytest.raises(UnsupportedError, match=r"graph input 's' is a sequence.*sequence_lengths=\{'s': n\}"):
        from_onnx(m)


def test_runtime_position_is_refused() -> None:
    """A position computed at run time would make the result depend on data: refused, naming
    the op and the node."""
    m = model([helper.make_node("SequenceAt", ["s", "i"], ["y"], name="pick")], [seq("s", F, [3]), tensor("i", I64, [])], [tensor("y", F, [3])], opset=17)
    with pytest.raises(UnsupportedError, match=r"ONNX op SequenceAt \(node 'pick'.*position.*known only at run time"):
        from_onnx(m, sequence_lengths={"s": 2})


def test_runtime_piece_count_is_refused() -> None:
    m = model([helper.make_node("SplitToSequence", ["x"], ["s"], name="rows")], [tensor("x", F, ["n", 4])], [seq("s", F, [4])], opset=17)
    with pytest.raises(UnsupportedError, match=r"ONNX op SplitToSequence \(node 'rows'.*number of pieces.*known only at run time"):
        from_onnx(m)


def test_if_on_run_time_condition_needs_one_layout() -> None:
    def branch(name: str, n: int) -> object:
        node = helper.make_node("SequenceConstruct", ["x"] * n, [f"{name}_out"])
        return helper.make_graph([node], name, [], [seq(f"{name}_out", F, [2])])

    node = helper.make_node("If", ["c"], ["s"], name="choose", then_branch=branch("then", 1), else_branch=branch("else", 2))
    m = model([node], [tensor("c", B, []), tensor("x", F, [2])], [seq("s", F, [2])], opset=17)
    with pytest.raises(UnsupportedError, match=r"ONNX op If \(node 'choose'.*then branch gives a sequence of 1 tensor\(s\), the else branch a sequence of 2"):
        from_onnx(m)
    same = model([helper.make_node("If", ["c"], ["s"], then_branch=branch("then", 2), else_branch=branch("else", 2))], [tensor("c", B, []), tensor("x", F, [2])], [seq("s", F, [2])], opset=17)
    x = np.array([1, 2], np.float32)
    out = compile_onnx(same)(np.array(False), x)
    assert len(out) == 2 and all(np.array_equal(o, x) for o in out)


def test_loop16_seq_none_result() -> None:
    """The node test test_loop16_seq_none: a Loop carrying an optional sequence. The onnx test
    runner cannot compare its output (a sequence holding a 0-d tensor), so it is compared here."""
    import onnx.backend.test.case.node.loop  # noqa: F401  (importing it generates the Loop cases)
    from onnx.backend.test.case.node import _NodeTestCases

    case = next(c for c in _NodeTestCases if c.name == "test_loop16_seq_none")
    assert case.model is not None and case.data_sets is not None
    inputs, want = case.data_sets[0]
    (got,) = TileworkBackend.run_model(case.model, inputs)
    assert isinstance(got, list) and len(got) == len(want[0]) == 6
    for g, w in zip(got, want[0]):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w)


def test_optional_presence_known_through_a_run_time_if() -> None:
    """Both branches give an empty optional: the If carries nothing for it, and whether it has
    an element stays known at conversion time."""
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, [2]))

    def branch(name: str) -> object:
        node = helper.make_node("Optional", [], [f"{name}_o"], type=seq_t)
        return helper.make_graph([node], name, [], [helper.make_value_info(f"{name}_o", helper.make_optional_type_proto(seq_t))])

    nodes = [
        helper.make_node("If", ["c"], ["o"], then_branch=branch("then"), else_branch=branch("else")),
        helper.make_node("OptionalHasElement", ["o"], ["h"]),
        helper.make_node("Add", ["x", "x"], ["y"]),
    ]
    m = model(nodes, [tensor("c", B, []), tensor("x", F, [2])], [tensor("h", B, []), tensor("y", F, [2])], opset=18)
    h, y = compile_onnx(m)(np.array(True), np.ones(2, np.float32))
    assert not bool(h) and np.array_equal(y, [2, 2])

"""The ONNX importer: symbolic dims, shape folding, parameters, opset-versioned converters,
data-dependent shapes, control flow and errors. Numerics are checked against onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import tilework
from tests.frontend.onnx_util import assert_matches_ort, compile_onnx, model, ort_run, outputs, tensor
from tilework.errors import RuntimeCheckError, TileworkError, UnsupportedError
from tilework.frontend.onnx import from_onnx, param_arrays
from tilework.ir.graph import GraphFunc, If, MatchCast, bindings_of
from tilework.ir.info import TensorInfo
from tilework.ir.sym import SymVar

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
rng = np.random.default_rng(0)


def randn(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def main_of(mod: tilework.IRModule) -> GraphFunc:
    f = mod["main"]
    assert isinstance(f, GraphFunc)
    return f


# -- dims -----------------------------------------------------------------------------------


def test_named_dims_are_shared_and_bounded() -> None:
    m = model(
        [helper.make_node("Add", ["x", "y"], ["z"])],
        [tensor("x", F, ["batch", "seq"]), tensor("y", F, ["batch", None])],
        [tensor("z", F, ["batch", "seq"])],
    )
    f = main_of(from_onnx(m, dim_bounds={"seq": (1, 64)}))
    (b1, s), (b2, other) = (p.info.shape for p in f.params)  # type: ignore[attr-defined, misc]
    assert b1 is b2 and isinstance(b1, SymVar) and b1.name == "batch" and b1.lo == 1 and b1.hi is None
    assert isinstance(s, SymVar) and (s.lo, s.hi) == (1, 64)
    assert isinstance(other, SymVar) and other is not s and other is not b1


def test_dim_bounds_must_name_model_dims() -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", F, ["n"])], [tensor("y", F, ["n"])])
    with pytest.raises(TileworkError, match="seq"):
        from_onnx(m, dim_bounds={"seq": (1, 8)})


def test_dim_upper_bound_is_checked_at_run_time() -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", F, ["n"])], [tensor("y", F, ["n"])])
    fn = compile_onnx(m, dim_bounds={"n": 8})
    assert fn(randn(8)).shape == (8,)
    with pytest.raises(RuntimeCheckError, match="n <= 8"):
        fn(randn(9))


def test_shape_arithmetic_folds_into_a_symbolic_reshape() -> None:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, the exporters' idiom, becomes a
    reshape to shape(batch, seq, 2, 4): no tensor holds a shape at run time."""
    c = lambda name, v: helper.make_node("Constant", [], [name], value=helper.make_tensor(name, I64, [len(v)] if isinstance(v, list) else [], v if isinstance(v, list) else [v]))  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        c("i0", 0), c("i1", 1), c("ax", [0]), c("tail", [2, 4]),
        helper.make_node("Gather", ["s", "i0"], ["b"]),
        helper.make_node("Gather", ["s", "i1"], ["q"]),
        helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
        helper.make_node("Unsqueeze", ["q", "ax"], ["q1"]),
        helper.make_node("Concat", ["b1", "q1", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]  # fmt: skip
    m = model(nodes, [tensor("x", F, ["batch", "seq", 8])], [tensor("y", F, ["batch", "seq", 2, 4])])
    mod = from_onnx(m)
    text = str(mod)
    assert "shape_to_tensor" not in text and "tensor_to_shape" not in text
    assert "reshape(x, shape(batch, seq, 2, 4))" in text
    f = main_of(mod)
    b, s = f.params[0].info.shape[:2]  # type: ignore[attr-defined]
    assert f.ret_info == TensorInfo((b, s, 2, 4), "float32")
    assert_matches_ort(m, [[randn(2, 3, 8)], [randn(1, 7, 8)]])


def test_dim_arithmetic_becomes_data_only_when_a_tensor_op_needs_it() -> None:
    """Shape(x)[1] * 2 added to a tensor: the dim is materialized once, as a tensor."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["i"], value=helper.make_tensor("i", I64, [], [1])),
        helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", I64, [], [2])),
        helper.make_node("Gather", ["s", "i"], ["n"]),
        helper.make_node("Mul", ["n", "two"], ["n2"]),
        helper.make_node("Cast", ["n2"], ["f"], to=F),
        helper.make_node("Add", ["x", "f"], ["y"]),
    ]
    m = model(nodes, [tensor("x", F, [2, "seq"])], [tensor("y", F, [2, "seq"])])
    assert "shape_to_tensor(shape(2 * seq)" in str(from_onnx(m))
    assert_matches_ort(m, [[randn(2, 3)], [randn(2, 5)]])


# -- parameters -----------------------------------------------------------------------------


def test_initializers_as_constants_or_trailing_params() -> None:
    w = randn(8, 6)
    shape = np.array([0, 3, 2], np.int64)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "shape"], ["y"])]
    m = model(nodes, [tensor("x", F, ["n", 8])], [tensor("y", F, ["n", 3, 2])], [("w", w), ("shape", shape)])
    const_mod = main_of(from_onnx(m))
    assert [p.name for p in const_mod.params] == ["x"] and "num_inputs" not in const_mod.attrs
    f = main_of(from_onnx(m, keep_params_as_inputs=True))
    assert [p.name for p in f.params] == ["x", "w"] and f.attrs["num_inputs"] == 1
    weights = param_arrays(m)
    assert len(weights) == 1 and np.array_equal(weights[0], w)  # the small int shape stays a constant
    fn = tilework.VM(tilework.build(from_onnx(m, keep_params_as_inputs=True)))["main"]
    x = randn(5, 8)
    np.testing.assert_allclose(fn(x, *weights), ort_run(m, x)[0], rtol=1e-5, atol=1e-5)


# -- converters keyed by opset --------------------------------------------------------------


def _reduce_sum(opset: int) -> None:
    axes = np.array([1], np.int64)
    if opset >= 13:
        node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
        inits = [("axes", axes)]
    else:
        node = helper.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)
        inits = []
    m = model([node], [tensor("x", F, ["n", 4])], [tensor("y", F, ["n"])], inits, opset)
    assert_matches_ort(m, [[randn(3, 4)]])


@pytest.mark.parametrize("opset", [11, 13])
def test_reduce_axes_attribute_or_input(opset: int) -> None:
    _reduce_sum(opset)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze_axes_attribute_or_input(opset: int) -> None:
    if opset >= 13:
        nodes = [helper.make_node("Unsqueeze", ["x", "a"], ["u"]), helper.make_node("Squeeze", ["u", "b"], ["y"])]
        inits = [("a", np.array([0, 3], np.int64)), ("b", np.array([0], np.int64))]
    else:
        nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0, 3]), helper.make_node("Squeeze", ["u"], ["y"], axes=[0])]
        inits = []
    m = model(nodes, [tensor("x", F, ["n", 2])], [tensor("y", F, ["n", 2, 1])], inits, opset)
    assert_matches_ort(m, [[randn(3, 2)]])


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_split_forms(opset: int) -> None:
    inits: list[tuple[str, np.ndarray]] = []
    if opset == 11:
        node = helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=[2, 4])
    elif opset == 13:
        node = helper.make_node("Split", ["x", "s"], ["a", "b"], axis=1)
        inits = [("s", np.array([2, 4], np.int64))]
    else:
        node = helper.make_node("Split", ["x"], ["a", "b"], axis=1, num_outputs=2)
    shapes = ([3, 2], [3, 4]) if opset != 18 else ([3, 3], [3, 3])
    m = model([node], [tensor("x", F, [3, 6])], [tensor("a", F, shapes[0]), tensor("b", F, shapes[1])], inits, opset)
    assert_matches_ort(m, [[randn(3, 6)]])


@pytest.mark.parametrize("opset", [6, 13])
def test_clip_bounds_attributes_or_inputs(opset: int) -> None:
    if opset < 11:
        node = helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.5)
        m = model([node], [tensor("x", F, ["n"])], [tensor("y", F, ["n"])], opset=opset)
        m.ir_version = 3
    else:
        node = helper.make_node("Clip", ["x", "lo", ""], ["y"])
        m = model([node], [tensor("x", F, ["n"])], [tensor("y", F, ["n"])], [("lo", np.array(-0.5, np.float32))], opset)
    assert_matches_ort(m, [[randn(10)]])


@pytest.mark.parametrize("opset", [2, 13])
def test_pad_attributes_or_inputs(opset: int) -> None:
    if opset < 11:
        node = helper.make_node("Pad", ["x"], ["y"], pads=[0, 1, 0, 2], mode="reflect")
        m = model([node], [tensor("x", F, [2, 4])], [tensor("y", F, [2, 7])], opset=opset)
        m.ir_version = 3
    else:
        node = helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")
        m = model([node], [tensor("x", F, ["n", 4])], [tensor("y", F, ["n", 7])], [("p", np.array([0, 1, 0, 2], np.int64))], opset)
    assert_matches_ort(m, [[randn(2, 4)]])


# -- data-dependent shapes ------------------------------------------------------------------


def test_runtime_shape_tensor_is_lifted_into_fresh_dims() -> None:
    """A target shape that only exists at run time: tensor_to_shape + match_cast to fresh sym
    vars, compiled once for every value."""
    m = model([helper.make_node("Reshape", ["x", "shape"], ["y"])], [tensor("x", F, [12]), tensor("shape", I64, [2])], [tensor("y", F, [None, None])])
    mod = from_onnx(m)
    f = main_of(mod)
    casts = [b for b in bindings_of(f) if isinstance(b, MatchCast)]
    assert casts and "tensor_to_shape" in str(mod)
    fn = tilework.VM(tilework.build(mod))["main"]
    x = np.arange(12, dtype=np.float32)
    for shape in ([3, 4], [6, 2], [12, 1]):
        np.testing.assert_array_equal(fn(x, np.array(shape, np.int64)), x.reshape(shape))
    with pytest.raises(RuntimeCheckError):
        fn(x, np.array([5, 2], np.int64))


def test_nonzero_length_is_a_fresh_sym_var() -> None:
    nodes = [helper.make_node("NonZero", ["x"], ["idx"]), helper.make_node("Transpose", ["idx"], ["y"])]
    m = model(nodes, [tensor("x", F, [3, "n"])], [tensor("y", I64, [None, 2])])
    mod = from_onnx(m)
    (cast,) = [b for b in bindings_of(main_of(mod)) if isinstance(b, MatchCast)]
    assert isinstance(cast.cast_info, TensorInfo) and cast.cast_info.shape is not None
    rows, n = cast.cast_info.shape
    assert rows == 2 and isinstance(n, SymVar)  # the count, bound where nonzero runs
    fn = tilework.VM(tilework.build(mod))["main"]
    for x in (np.array([[0, 1], [2, 0], [0, 0]], np.float32), randn(3, 5), np.zeros((3, 4), np.float32)):
        np.testing.assert_array_equal(fn(x), np.transpose(np.nonzero(x)))


# -- control flow ---------------------------------------------------------------------------


def _branch(name: str, op: str) -> object:
    return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_out"])], name, [], [tensor(f"{name}_out", F, ["n"])])


def test_if_with_constant_condition_is_inlined() -> None:
    nodes = [
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", B, [], [False])),
        helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", "Relu"), else_branch=_branch("else", "Neg")),
    ]
    m = model(nodes, [tensor("x", F, ["n"])], [tensor("y", F, ["n"])])
    f = main_of(from_onnx(m))
    assert not any(isinstance(b.value, If) for b in bindings_of(f))
    x = randn(6)
    np.testing.assert_allclose(compile_onnx(m)(x), -x)


def test_if_with_data_dependent_condition() -> None:
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", "Relu"), else_branch=_branch("else", "Neg"))]
    m = model(nodes, [tensor("x", F, ["n"]), tensor("c", B, [])], [tensor("y", F, ["n"])])
    f = main_of(from_onnx(m))
    assert any(isinstance(b.value, If) for b in bindings_of(f))
    fn = compile_onnx(m)
    x = randn(7)
    np.testing.assert_allclose(fn(x, np.array(True)), np.maximum(x, 0))
    np.testing.assert_allclose(fn(x, np.array(False)), -x)


# -- errors ---------------------------------------------------------------------------------


def test_unsupported_op_names_op_node_and_opset() -> None:
    node = helper.make_node("Bernoulli", ["x"], ["y"], name="my_coin")  # random: no converter
    m = model([node], [tensor("x", F, [4, 2])], [tensor("y", F, [4, 2])], opset=20)
    with pytest.raises(UnsupportedError, match=r"Bernoulli .*'my_coin'.*opset 20"):
        from_onnx(m)


def test_an_opset_the_installed_onnx_does_not_define_is_refused(tmp_path: Path) -> None:
    """Past the newest opset of the installed onnx, ``get_schema`` answers with its newest
    schema, which says nothing of what an op means there: such a model is refused, naming the
    file (or "the ONNX model"), the domain and both opsets. Its newest opset converts; an
    opset of a domain whose ops tilework never converts is no reason to refuse a model that
    uses none of them (ai.onnx.ml here)."""
    import re

    import onnx

    last = onnx.defs.onnx_opset_version()
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [tensor("x", F, ["n"])], [tensor("y", F, ["n"])])

    def relu(*opsets: tuple[str, int]) -> onnx.ModelProto:
        return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])

    path = tmp_path / "future.onnx"
    onnx.save(relu(("", last + 1)), path)
    want = f"{path} imports opset {last + 1} of domain ai.onnx, which the installed onnx {onnx.__version__} does not define (it knows opsets 1 to {last} of that domain): export the model at opset {last} or lower, or install a newer onnx"
    with pytest.raises(UnsupportedError, match=f"^{re.escape(want)}$"):
        from_onnx(path)
    with pytest.raises(UnsupportedError, match=r"^the ONNX model imports opset 99 of domain ai\.onnx, .* \(it knows opsets 1 to \d+ of that domain\)"):
        tilework.compile(relu(("ai.onnx", 99)))
    with pytest.raises(UnsupportedError, match=r"^the ONNX model imports opset 0 of domain ai\.onnx, .* \(it knows opsets 1 to \d+ of that domain\)$"):
        from_onnx(relu(("", 0)))
    with pytest.raises(UnsupportedError, match=r"imports opset 2 of domain ai\.onnx\.preview, .* \(it knows opset 1 of that domain\)"):
        from_onnx(relu(("", 17), ("ai.onnx.preview", 2)))  # FlexAttention's domain: tilework converts its ops
    x = np.array([-1.0, 0.0, 2.5], np.float32)
    for m in (relu(("", last)), relu(("", 17), ("ai.onnx.ml", 99), ("com.microsoft", 1))):
        np.testing.assert_array_equal(outputs(tilework.compile(m)(x))[0], np.maximum(x, 0))


def test_unsupported_dtype_names_the_input() -> None:
    m = model([helper.make_node("Abs", ["x"], ["y"])], [tensor("x", TensorProto.COMPLEX64, [3])], [tensor("y", TensorProto.COMPLEX64, [3])])
    with pytest.raises(UnsupportedError, match=r"'x'.*COMPLEX64"):
        from_onnx(m)


def test_static_operand_that_is_data_is_refused_where_rank_depends_on_it() -> None:
    m = model([helper.make_node("Squeeze", ["x", "axes"], ["y"])], [tensor("x", F, [1, 3]), tensor("axes", I64, [1])], [tensor("y", F, [3])], opset=13)
    with pytest.raises(UnsupportedError, match="axes .* must be a constant"):
        from_onnx(m)


# -- tilework.compile -------------------------------------------------------------------------


def test_compile_accepts_onnx_models_and_paths(tmp_path: object) -> None:
    import os

    w = randn(4, 3)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tensor("x", F, ["n", 4])], [tensor("y", F, ["n", 3])], [("w", w)])
    path = os.path.join(str(tmp_path), "m.onnx")
    import onnx

    onnx.save(m, path)
    x = randn(5, 4)
    from tilework.compiled import compile as compile_model

    for source, weights in ((m, "inputs"), (path, "constants")):
        cm = compile_model(source, weights=weights)
        np.testing.assert_allclose(outputs(cm(x))[0], x @ w, rtol=1e-5, atol=1e-5)


def test_reshape_to_a_run_time_target_with_minus_one_and_zero() -> None:
    """A target shape computed from data (here a graph input) may hold -1 and 0: both are
    resolved at run time before the target becomes dims (a vision transformer's
    ``reshape(B, -1, heads, head_dim)`` exported with a data-dependent ``B``)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    m = model(nodes, [tensor("x", F, ["b", "s", 12]), tensor("shape", I64, [4])], [tensor("y", F, ["o0", "o1", "o2", "o3"])])
    fn = compile_onnx(m)
    for x_shape, target in (((2, 5, 12), [0, -1, 3, 4]), ((1, 3, 12), [-1, 3, 2, 6]), ((3, 1, 12), [3, 0, 12, 1])):
        x = randn(*x_shape)
        shape = np.asarray(target, np.int64)
        got = outputs(fn(x, shape))[0]
        np.testing.assert_array_equal(got, ort_run(m, x, shape)[0])

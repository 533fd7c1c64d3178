"""Elementwise inference: symbolic broadcasting, dtypes, unknown ranks, and the constructors."""

from __future__ import annotations

import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, holds, infer, info_of
from tilework.errors import InferenceError, ShapeError
from tilework.ir import sym
from tilework.ir.graph import OpRef, Var
from tilework.ir.info import TensorInfo
from tilework.op import elementwise

n, m = tw.dim("n"), tw.dim("m")


def test_every_elementwise_op_has_an_exported_constructor() -> None:
    x = Var("x", T(2))
    for name in elementwise.UNARY + elementwise.ARITH + elementwise.COMPARE + elementwise.LOGICAL:
        args = [x] if name in elementwise.UNARY else [x, x]
        call = getattr(op, name)(*args)
        assert isinstance(call.callee, OpRef) and call.callee.name == name
        assert name in op.__all__


@pytest.mark.parametrize("name", ["relu", "gelu", "silu", "sigmoid", "tanh"])
def test_activations_keep_shape(name: str) -> None:
    assert info_of(getattr(op, name), T(n, 4, dtype="float16")) == T(n, 4, dtype="float16")


def test_float_only_unary_rejects_ints() -> None:
    with pytest.raises(InferenceError, match="exp: .*floating-point.*int32"):
        infer(op.exp, T(3, dtype="int32"))
    assert info_of(op.relu, T(3, dtype="int32")) == T(3, dtype="int32")
    assert info_of(op.logical_not, T(n, dtype="bool")) == T(n, dtype="bool")


def test_static_and_equal_symbolic_broadcast() -> None:
    assert info_of(op.add, T(2, 1, 4), T(3, 1)) == T(2, 3, 4)
    assert info_of(op.multiply, T(n, 4), T(n, 4)) == T(n, 4)
    assert info_of(op.add, T(n + 1, m * n), T(1, n * m)) == T(n + 1, n * m)
    assert info_of(op.add, T(n, 1), T(1, m)) == T(n, m)


def test_static_vs_symbolic_broadcast_keeps_shape_and_checks() -> None:
    info, checks = infer(op.add, T(2, 3), T(2, n))
    assert info == T(2, 3)
    assert [c.kind for c in checks] == ["broadcast"]
    assert checks[0].dims == (3, n)
    assert "add" in checks[0].message
    assert holds(checks, {n: 3}) and holds(checks, {n: 1})
    assert not holds(checks, {n: 2})


def test_two_unrelated_vars_broadcast_to_their_max() -> None:
    info, checks = infer(op.add, T(n), T(m))
    assert info == T(sym.max_(n, m))
    assert len(checks) == 1 and checks[0].kind == "broadcast"
    assert holds(checks, {n: 5, m: 5}) and holds(checks, {n: 1, m: 7})
    assert not holds(checks, {n: 5, m: 4})


def test_static_mismatch_names_both_shapes() -> None:
    with pytest.raises(ShapeError, match=r"add: shapes \(2, 3\) and \(2, 4\) do not broadcast"):
        infer(op.add, T(2, 3), T(2, 4))


def test_unknown_rank_and_dtype() -> None:
    assert info_of(op.add, R(), T(2, 3)) == R(-1)
    assert info_of(op.add, R(2), R(3)) == R(3)
    assert info_of(op.add, T(2, 3, dtype=None), T(2, 3)) == T(2, 3)
    assert info_of(op.add, T(2, dtype=None), T(2, dtype=None)) == T(2, dtype=None)
    with pytest.raises(InferenceError, match="add: dtypes disagree"):
        infer(op.add, T(2, dtype="float16"), T(2))


def test_compare_logical_where_astype() -> None:
    assert info_of(op.less, T(n, 1), T(1, 4)) == T(n, 4, dtype="bool")
    assert info_of(op.logical_and, T(n, dtype="bool"), T(n, dtype="bool")) == T(n, dtype="bool")
    with pytest.raises(InferenceError, match="logical_or: expects bool"):
        infer(op.logical_or, T(2), T(2, dtype="bool"))
    assert info_of(op.where, T(n, 1, dtype="bool"), T(1, m), T(n, m)) == T(n, m)
    assert info_of(lambda x: op.astype(x, "float16"), T(n, 2)) == T(n, 2, dtype="float16")
    assert info_of(lambda x: op.astype(x, "int8"), R(3)) == TensorInfo(None, "int8", 3)


def _text_value(v: object) -> bool:
    if isinstance(v, tuple):
        return all(_text_value(x) for x in v)
    return v is None or isinstance(v, (bool, int, float, str, sym.SymExpr))


def test_attribute_values_are_text_values() -> None:
    """Every op's defaults and a sample of constructed attrs print and parse as text values."""
    for name, o in op.all_ops().items():
        assert all(_text_value(v) for v in o.attrs.values()), name
    x = Var("x", T(n, 4))
    samples = [
        op.sum(x, axis=[0, 1]),
        op.strided_slice(x, [0], [n - 1], [None], [2]),
        op.split(x, [1, n]),
        op.arange(0, n, 2),
        op.full((n,), 0.5),
        op.attention(x, x, x, scale=1),
        op.layer_norm(x, x, x, axes=[-1], eps=1),
    ]
    for call in samples:
        assert all(_text_value(v) for v in call.attrs.values()), call.attrs

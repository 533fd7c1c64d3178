"""matmul (NumPy semantics, batched, broadcast, 1-D operands) and linear (torch weight layout)."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, holds, infer, info_of
from tilework.errors import InferenceError, ShapeError
from tilework.ir.sym import SymVar

b, n, m, k = tw.dim("b"), tw.dim("n"), tw.dim("m"), tw.dim("k")


@pytest.mark.parametrize(
    "sa, sb",
    [((2, 3), (3, 4)), ((3,), (3, 4)), ((2, 3), (3,)), ((3,), (3,)), ((5, 1, 2, 3), (4, 3, 2)), ((3,), (6, 3, 2))],
)
def test_static_shapes_match_numpy(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    expected = np.matmul(np.zeros(sa), np.zeros(sb)).shape
    assert info_of(op.matmul, T(*sa), T(*sb)) == T(*expected)


def test_symbolic_batched() -> None:
    assert info_of(op.matmul, T(b, n, k), T(k, m)) == T(b, n, m)
    assert info_of(op.matmul, T(b, 1, n, n + 1), T(4, n + 1, m * n)) == T(b, 4, n, m * n)
    assert info_of(op.matmul, T(n * m), T(n * m, 7)) == T(7)
    assert info_of(op.matmul, T(b, n, k), T(k)) == T(b, n)


def test_unprovable_contraction_is_checked() -> None:
    info, checks = infer(op.matmul, T(n, k), T(m, 4))
    assert info == T(n, 4)
    assert [(c.kind, c.dims) for c in checks] == [("eq", (k, m))]
    assert "matmul: contracted dims of (n, k) and (m, 4)" in checks[0].message
    assert holds(checks, {k: 3, m: 3, n: 1}) and not holds(checks, {k: 3, m: 2, n: 1})


def test_batch_broadcast_is_checked() -> None:
    info, checks = infer(op.matmul, T(2, n, 3), T(b, 3, 4))
    assert info == T(2, n, 4)
    assert [c.kind for c in checks] == ["broadcast"]
    assert holds(checks, {b: 1, n: 1}) and holds(checks, {b: 2, n: 1}) and not holds(checks, {b: 3, n: 1})


def test_errors_name_both_shapes() -> None:
    with pytest.raises(ShapeError, match=r"matmul: contracted dims of \(2, 3\) and \(4, 5\) differ: 3 != 4"):
        infer(op.matmul, T(2, 3), T(4, 5))
    with pytest.raises(ShapeError, match=r"matmul: contracted dims of \(n, n \+ 1\) and \(n, 2\)"):
        infer(op.matmul, T(n, n + 1), T(n, 2))
    with pytest.raises(ShapeError, match=r"matmul: shapes \(2, 4, 3\) and \(3, 3, 5\) do not broadcast"):
        infer(op.matmul, T(2, 4, 3), T(3, 3, 5))
    with pytest.raises(ShapeError, match=r"matmul: operands must have at least one dim, got shapes \(\) and \(3,\)"):
        infer(op.matmul, T(), T(3))


def test_unknown_rank_and_dtype() -> None:
    assert info_of(op.matmul, R(), T(3, 4)) == R()
    assert info_of(op.matmul, R(3), R(2)) == R(3)
    assert info_of(op.matmul, R(1), R(1)) == R(0)
    assert info_of(op.matmul, R(1), R(4)) == R(3)
    assert info_of(op.matmul, T(2, 3, dtype=None), T(3, 4, dtype="float16")) == T(2, 4, dtype="float16")
    assert info_of(lambda x, y: op.matmul(x, y, out_dtype="float32"), T(n, 8, dtype="int8"), T(8, 2, dtype="int8")) == T(n, 2)
    with pytest.raises(InferenceError, match="matmul: dtypes disagree"):
        infer(op.matmul, T(2, 3, dtype="float16"), T(3, 4))
    with pytest.raises(InferenceError, match="matmul: attribute out_dtype: unknown dtype 'f32'"):
        infer(lambda x, y: op.matmul(x, y, out_dtype="f32"), T(2, 3), T(3, 4))


def test_linear() -> None:
    assert info_of(op.linear, T(b, n, 768), T(3072, 768)) == T(b, n, 3072)
    assert info_of(op.linear, T(b, n, 768), T(3072, 768), T(3072)) == T(b, n, 3072)
    assert info_of(op.linear, T(k), T(m, k), T(m)) == T(m)
    # unknown weight shape: the bias still tells out_features
    assert info_of(op.linear, T(n, 4), R(2), T(8)) == T(n, 8)
    assert info_of(op.linear, T(n, 4), R(2)) == R(2)
    assert info_of(op.linear, R(), T(8, 4)) == R()
    assert info_of(op.linear, T(n, 4, dtype=None), T(8, 4, dtype=None)) == T(n, 8, dtype=None)


def test_linear_checks_and_errors() -> None:
    j = SymVar("j", 1)
    info, checks = infer(op.linear, T(n, k), T(m, j), T(8))
    assert info == T(n, m)
    assert [(c.kind, c.dims) for c in checks] == [("eq", (k, j)), ("eq", (m, 8))]
    assert holds(checks, {n: 1, k: 4, j: 4, m: 8}) and not holds(checks, {n: 1, k: 4, j: 4, m: 7})
    with pytest.raises(ShapeError, match=r"linear: in_features of input \(n, 4\) and weight \(8, 5\) differ: 4 != 5"):
        infer(op.linear, T(n, 4), T(8, 5))
    with pytest.raises(ShapeError, match=r"linear: out_features of weight \(8, 4\) and bias \(7,\) differ"):
        infer(op.linear, T(n, 4), T(8, 4), T(7))
    with pytest.raises(ShapeError, match=r"linear: weight must be 2-D \[out_features, in_features\], got shape \(4,\)"):
        infer(op.linear, T(n, 4), T(4))
    with pytest.raises(ShapeError, match=r"linear: bias must be 1-D"):
        infer(op.linear, T(n, 4), T(8, 4), T(1, 8))
    with pytest.raises(InferenceError, match="linear: takes .* got 1 argument"):
        infer(lambda x: op.make_call("linear", [x]), T(4))

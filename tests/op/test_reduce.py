"""Reductions: axes, keepdims, dtypes, unknown ranks, empty-axis checks."""

from __future__ import annotations

import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, holds, infer, info_of
from tilework.errors import InferenceError, ShapeError
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.ir.sym import SymVar

n, m = tw.dim("n"), tw.dim("m")
REDUCE = [op.sum, op.mean, op.max, op.min, op.prod]


@pytest.mark.parametrize("f", REDUCE)
def test_static_and_symbolic_axes(f) -> None:  # type: ignore[no-untyped-def]
    x = T(n, n + 1, n * m, 4)
    assert info_of(lambda v: f(v, axis=1), x) == T(n, n * m, 4)
    assert info_of(lambda v: f(v, axis=(0, -1)), x) == T(n + 1, n * m)
    assert info_of(lambda v: f(v, axis=(-2, 1), keepdims=True), x) == T(n, 1, 1, 4)
    assert info_of(f, x) == T()
    assert info_of(lambda v: f(v, keepdims=True), x) == T(1, 1, 1, 1)
    assert info_of(lambda v: f(v, axis=()), T(2, 3)) == T(2, 3)
    assert info_of(lambda v: f(v, axis=0), T()) == T()
    assert info_of(lambda v: f(v, axis=0), R(0)) == R(0)


@pytest.mark.parametrize("f", REDUCE)
def test_unknown_rank_and_dtype(f) -> None:  # type: ignore[no-untyped-def]
    assert info_of(lambda v: f(v, axis=0), R()) == R()
    assert info_of(f, R()) == T()
    assert info_of(lambda v: f(v, keepdims=True), R()) == R()
    assert info_of(lambda v: f(v, axis=(0, 2)), R(4)) == R(2)
    assert info_of(lambda v: f(v, axis=(0, 2), keepdims=True), R(4)) == R(4)
    assert info_of(lambda v: f(v, axis=1), T(n, 3, dtype=None)) == T(n, dtype=None)


@pytest.mark.parametrize("f", REDUCE)
def test_bad_axes(f) -> None:  # type: ignore[no-untyped-def]
    name = f.__name__
    with pytest.raises(InferenceError, match=f"{name}: axis 2 is out of range for a tensor of rank 2"):
        infer(lambda v: f(v, axis=2), T(n, 3))
    with pytest.raises(InferenceError, match=rf"{name}: repeated axis in \(1, -1\)"):
        infer(lambda v: f(v, axis=(1, -1)), T(n, 3))


def test_dtypes() -> None:
    assert info_of(lambda v: op.sum(v, axis=0), T(n, dtype="bool")) == T(dtype="int64")
    assert info_of(op.prod, T(n, dtype="int32")) == T(dtype="int32")
    assert info_of(op.max, T(3, dtype="bool")) == T(dtype="bool")
    with pytest.raises(InferenceError, match="mean: input must be a floating-point tensor, got int32"):
        infer(op.mean, T(3, dtype="int32"))


def test_max_of_possibly_empty_axis_is_checked() -> None:
    k = SymVar("k")  # may be 0
    info, checks = infer(lambda v: op.max(v, axis=1), T(3, k))
    assert info == T(3)
    assert [(c.kind, c.dims) for c in checks] == [("ge", (k, 1))]
    assert "max: reduced axis 1 of shape (3, k) must not be empty" in checks[0].message
    assert holds(checks, {k: 2}) and not holds(checks, {k: 0})
    # a sum over an empty axis is fine (0), n >= 1 is declared: no checks
    assert infer(lambda v: op.sum(v, axis=1), T(3, k))[1] == []
    assert infer(lambda v: op.min(v, axis=0), T(n, k))[1] == []
    with pytest.raises(ShapeError, match=r"min: cannot reduce the empty axis 0 of shape \(0, 3\)"):
        infer(lambda v: op.min(v, axis=0), T(0, 3))


@pytest.mark.parametrize("f", [op.argmax, op.argmin])
def test_arg_reductions(f) -> None:  # type: ignore[no-untyped-def]
    x = T(n, m + 2, 5)
    assert info_of(lambda v: f(v, axis=1), x) == T(n, 5, dtype="int64")
    assert info_of(lambda v: f(v, axis=-1, keepdims=True), x) == T(n, m + 2, 1, dtype="int64")
    assert info_of(f, x) == T(dtype="int64")
    assert info_of(lambda v: f(v, keepdims=True), x) == T(1, 1, 1, dtype="int64")
    assert info_of(lambda v: f(v, axis=0), R()) == R(dtype="int64")
    assert info_of(lambda v: f(v, axis=0), R(3, dtype=None)) == TensorInfo(None, "int64", 2)
    with pytest.raises(InferenceError, match=f"{f.__name__}: axis -4 is out of range"):
        infer(lambda v: f(v, axis=-4), x)


def test_attribute_validation() -> None:
    with pytest.raises(InferenceError, match="sum: attribute axis must be None, an int or a tuple of ints"):
        infer(lambda v: op.make_call("sum", [v], axis=1.5), T(3))
    with pytest.raises(InferenceError, match="argmax: attribute axis must be None or an int"):
        infer(lambda v: op.make_call("argmax", [v], axis=(0,)), T(3))
    with pytest.raises(InferenceError, match="sum: attribute keepdims must be a bool"):
        infer(lambda v: op.make_call("sum", [v], keepdims=1), T(3))


def test_constructor_fills_defaults() -> None:
    x = Var("x", T(2, 3, 4))
    assert dict(op.sum(x, axis=2).attrs) == {"axis": (2,), "keepdims": False}
    assert dict(op.argmin(x).attrs) == {"axis": None, "keepdims": False}

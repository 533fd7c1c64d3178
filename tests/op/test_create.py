"""Creation ops: full/zeros/ones from shape values, the *_like forms, arange with symbolic ends."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, holds, infer, info_of
from tilework.errors import InferenceError, ShapeError
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.graph import ShapeExpr, Var
from tilework.ir.info import AnyInfo, ShapeInfo, TensorInfo
from tilework.ir.sym import SymVar

n, m = tw.dim("n"), tw.dim("m")


def test_full_zeros_ones() -> None:
    assert info_of(lambda: op.full((n, 4), 1.5)) == T(n, 4)
    assert info_of(lambda: op.zeros((n, m + 1), "int32")) == T(n, m + 1, dtype="int32")
    assert info_of(lambda: op.ones((), "bool")) == T(dtype="bool")
    assert info_of(lambda s: op.ones(s, "float16"), ShapeInfo((n * m, 2))) == T(n * m, 2, dtype="float16")
    assert info_of(lambda s: op.zeros(s), ShapeInfo(None, 3)) == R(3)
    assert info_of(lambda s: op.full(s, 0), AnyInfo()) == R()
    c = op.full((2,), 7, dtype="int64")
    assert isinstance(c.args[0], ShapeExpr) and dict(c.attrs) == {"fill_value": 7, "dtype": "int64"}


def test_creation_of_a_computed_shape() -> None:
    info = info_of(lambda x: op.zeros(op.shape_of(x), "int8"), T(n, m))
    assert info == T(n, m, dtype="int8")


def test_creation_errors_and_checks() -> None:
    with pytest.raises(ShapeError, match=r"zeros: shape \(2, -1\) has a negative dim -1"):
        infer(lambda: op.zeros((2, -1)))
    with pytest.raises(InferenceError, match="full: attribute dtype: unknown dtype 'float'"):
        infer(lambda: op.full((2,), 1.0, "float"))
    with pytest.raises(InferenceError, match="ones: attribute dtype is required"):
        infer(lambda: op.make_call("ones", [ShapeExpr((2,))], dtype=None))
    with pytest.raises(InferenceError, match="full: attribute fill_value must be a number or a bool"):
        infer(lambda: op.make_call("full", [ShapeExpr((2,))], fill_value="x"))
    with pytest.raises(InferenceError, match="zeros: argument 0 must be a shape, got TensorInfo"):
        infer(op.zeros, T(2))
    info, checks = infer(lambda: op.zeros((n - m,)))
    assert info == T(n - m)
    assert [(c.kind, c.dims) for c in checks] == [("ge", (n - m, 0))]
    assert holds(checks, {n: 3, m: 3}) and not holds(checks, {n: 3, m: 4})


def test_like_forms() -> None:
    assert info_of(lambda x: op.zeros_like(x), T(n, 3, dtype="float16")) == T(n, 3, dtype="float16")
    assert info_of(lambda x: op.ones_like(x, "int64"), T(n, 3)) == T(n, 3, dtype="int64")
    assert info_of(lambda x: op.full_like(x, 2.0), R(2, dtype=None)) == R(2, dtype=None)
    assert info_of(lambda x: op.full_like(x, 2.0, "bool"), R()) == R(dtype="bool")


@pytest.mark.parametrize("args", [(5,), (2, 9), (0, 10, 3), (10, 0, -3), (5, 2), (0.0, 1.0, 0.25), (1, 2.5, 0.5)])
def test_arange_static_matches_numpy(args: tuple) -> None:  # type: ignore[type-arg]
    expected = np.arange(*args)
    info = info_of(lambda: op.arange(*args))
    assert info == T(len(expected), dtype="float32" if expected.dtype.kind == "f" else "int64")


def test_arange_symbolic() -> None:
    assert info_of(lambda: op.arange(n)) == T(n, dtype="int64")
    assert info_of(lambda: op.arange(0, n, 2)) == T(sym.floordiv(n + 1, 2), dtype="int64")
    assert info_of(lambda: op.arange(m, m + n, dtype="float32")) == T(n)
    assert info_of(lambda: op.arange(n, 0, -1)) == T(n, dtype="int64")
    k = SymVar("k")
    info = info_of(lambda: op.arange(k, n, 3))
    assert isinstance(info, TensorInfo) and info.shape is not None
    for kv, nv in [(0, 7), (5, 3), (2, 11), (4, 4)]:
        assert sym_walk.evaluate(info.shape[0], {k: kv, n: nv}) == len(range(kv, nv, 3))


def test_arange_errors() -> None:
    with pytest.raises(InferenceError, match="arange: step must not be zero"):
        infer(lambda: op.arange(0, 4, 0))
    with pytest.raises(InferenceError, match="arange: symbolic bounds need an integer start and step"):
        infer(lambda: op.arange(0, n, 0.5))
    with pytest.raises(InferenceError, match="arange: attribute step must be a static number"):
        infer(lambda: op.make_call("arange", [], start=0, end=4, step=n))
    with pytest.raises(InferenceError, match="arange: attribute end must be a number or a symbolic dim"):
        infer(lambda: op.make_call("arange", [], end="x"))


def test_shape_argument_may_be_a_var() -> None:
    s = Var("s", ShapeInfo((n, 2)))
    assert op.zeros(s).args[0] is s

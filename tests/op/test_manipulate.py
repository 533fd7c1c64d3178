"""Shape manipulation: reshape (-1 inferred symbolically), permute/expand/squeeze/flatten,
broadcast_to, concat, split, strided_slice, take and shape_of."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, holds, infer, info_of
from tilework.errors import InferenceError, ShapeError
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.graph import ShapeExpr, Tuple, Var
from tilework.ir.info import AnyInfo, ShapeInfo, TensorInfo, TupleInfo
from tilework.ir.sym import SymVar

b, s, n, m = tw.dim("b"), tw.dim("s"), tw.dim("n"), tw.dim("m")
z = SymVar("z")  # may be 0

# -- reshape ------------------------------------------------------------------------------------


def test_reshape_infers_minus_one_symbolically() -> None:
    assert info_of(lambda x: op.reshape(x, (b, s, 12, -1)), T(b, s, 768)) == T(b, s, 12, 64)
    assert info_of(lambda x: op.reshape(x, (-1, 768)), T(b, s, 768)) == T(b * s, 768)
    assert info_of(lambda x: op.reshape(x, (b * s, -1)), T(b, s, 12, 64)) == T(b * s, 768)
    assert info_of(lambda x: op.reshape(x, (2, n, -1)), T(n, 3, 4)) == T(2, n, 6)
    assert info_of(lambda x: op.reshape(x, (-1,)), T(n, m + 1)) == T(n * m + n)
    # shared dims cancel even when they may be 0
    assert info_of(lambda x: op.reshape(x, (z, 12, -1)), T(z, 768)) == T(z, 12, 64)


def test_reshape_without_minus_one_checks_the_element_count() -> None:
    assert info_of(lambda x: op.reshape(x, (b * s, 768)), T(b, s, 768)) == T(b * s, 768)
    assert info_of(lambda x: op.reshape(x, (6, n)), T(2, n, 3)) == T(6, n)
    info, checks = infer(lambda x: op.reshape(x, (n, 4)), T(m, 4))
    assert info == T(n, 4)
    assert [(c.kind, c.dims) for c in checks] == [("eq", (4 * m, 4 * n))]
    assert holds(checks, {n: 3, m: 3}) and not holds(checks, {n: 3, m: 2})


def test_reshape_unprovable_divisibility_is_checked() -> None:
    info, checks = infer(lambda x: op.reshape(x, (n, -1)), T(m, 4))
    assert info == T(n, sym.floordiv(4 * m, n))
    assert [(c.kind, c.dims) for c in checks] == [("divides", (4 * m, n))]
    assert "reshape: cannot reshape (m, 4) to (n, -1)" in checks[0].message
    assert holds(checks, {n: 8, m: 6}) and not holds(checks, {n: 8, m: 3})


def test_reshape_errors_name_both_shapes() -> None:
    with pytest.raises(ShapeError, match=r"reshape: cannot reshape \(2, 3\) to \(4, 2\): element counts differ: 6 != 8"):
        infer(lambda x: op.reshape(x, (4, 2)), T(2, 3))
    with pytest.raises(ShapeError, match=r"reshape: cannot reshape \(n, 2\) to \(n \+ 1, 2\)"):
        infer(lambda x: op.reshape(x, (n + 1, 2)), T(n, 2))
    with pytest.raises(ShapeError, match=r"reshape: cannot reshape \(2, 3\) to \(4, -1\): 6 is not divisible by 4"):
        infer(lambda x: op.reshape(x, (4, -1)), T(2, 3))
    with pytest.raises(ShapeError, match=r"at most one -1 is allowed in the new shape \(-1, -1\)"):
        infer(lambda x: op.reshape(x, (-1, -1)), T(2, 3))
    with pytest.raises(ShapeError, match=r"-1 is ambiguous next to a zero-size dim"):
        infer(lambda x: op.reshape(x, (0, -1)), T(0, 3))
    with pytest.raises(ShapeError, match=r"new shape \(-2, 3\) has a negative dim -2"):
        infer(lambda x: op.reshape(x, (-2, 3)), T(2, 3))


def test_reshape_unknowns_and_shape_values() -> None:
    assert info_of(lambda x: op.reshape(x, (n, 4)), R()) == T(n, 4)
    assert info_of(lambda x: op.reshape(x, (n, -1)), R(3)) == R(2)
    assert info_of(lambda x: op.reshape(x, (6,)), T(2, 3, dtype=None)) == T(6, dtype=None)
    assert info_of(op.reshape, T(2, 3), ShapeInfo((3, 2))) == T(3, 2)
    assert info_of(op.reshape, T(2, 3), ShapeInfo(None, 4)) == R(4)
    assert info_of(op.reshape, T(2, 3), AnyInfo()) == R()
    with pytest.raises(InferenceError, match="reshape: argument 1 must be a shape, got TensorInfo"):
        infer(op.reshape, T(2, 3), T(6))
    with pytest.raises(InferenceError, match="reshape: shape entries must be ints or symbolic dims"):
        op.reshape(Var("x", T(2)), (2.0,))  # type: ignore[arg-type]


# -- permute, expand, squeeze, flatten ------------------------------------------------------------


def test_permute_dims() -> None:
    assert info_of(lambda x: op.permute_dims(x, (0, 2, 1, 3)), T(b, s, 12, 64)) == T(b, 12, s, 64)
    assert info_of(op.permute_dims, T(n, m + 1, 3)) == T(3, m + 1, n)
    assert info_of(lambda x: op.permute_dims(x, (-1, 0)), T(n, m)) == T(m, n)
    assert info_of(lambda x: op.permute_dims(x, (1, 0)), R()) == R(2)
    assert info_of(op.permute_dims, R(dtype=None)) == R(dtype=None)
    assert info_of(lambda x: op.permute_dims(x, (1, 2, 0)), R(3)) == R(3)
    with pytest.raises(ShapeError, match=r"permute_dims: axes \(1, 0\) do not permute the 3 dims of shape \(n, 2, 3\)"):
        infer(lambda x: op.permute_dims(x, (1, 0)), T(n, 2, 3))
    with pytest.raises(InferenceError, match="permute_dims: repeated axis"):
        infer(lambda x: op.permute_dims(x, (0, 0)), T(n, 2))


def test_expand_dims() -> None:
    assert info_of(lambda x: op.expand_dims(x, 0), T(n, m)) == T(1, n, m)
    assert info_of(lambda x: op.expand_dims(x, -1), T(n, m)) == T(n, m, 1)
    assert info_of(lambda x: op.expand_dims(x, (0, 3)), T(n, m)) == T(1, n, m, 1)
    assert info_of(lambda x: op.expand_dims(x, (-1,)), T()) == T(1)
    assert info_of(lambda x: op.expand_dims(x, 1), R(2)) == R(3)
    assert info_of(lambda x: op.expand_dims(x, 1), R()) == R()
    assert np.expand_dims(np.zeros((2, 3)), (0, 3)).shape == (1, 2, 3, 1)
    with pytest.raises(InferenceError, match="expand_dims: axis 3 is out of range for a tensor of rank 3"):
        infer(lambda x: op.expand_dims(x, 3), T(n, m))


def test_squeeze() -> None:
    assert info_of(op.squeeze, T(1, n, 1, m)) == T(n, m)
    assert info_of(lambda x: op.squeeze(x, (0, -2)), T(1, n, 1, m)) == T(n, m)
    assert info_of(op.squeeze, R(3)) == R()  # which dims are 1 is unknown
    assert info_of(lambda x: op.squeeze(x, 0), R(3)) == R(2)
    assert info_of(lambda x: op.squeeze(x, 0), R()) == R()
    info, checks = infer(lambda x: op.squeeze(x, 1), T(1, n, m))
    assert info == T(1, m)
    assert [(c.kind, c.dims) for c in checks] == [("eq", (n, 1))]
    assert holds(checks, {n: 1, m: 5}) and not holds(checks, {n: 2, m: 5})
    with pytest.raises(ShapeError, match=r"squeeze: cannot squeeze axis 1 of shape \(1, 3\): 3 != 1"):
        infer(lambda x: op.squeeze(x, 1), T(1, 3))
    with pytest.raises(ShapeError, match=r"squeeze: cannot squeeze axis 0 of shape \(n \+ 1, 2\)"):
        infer(lambda x: op.squeeze(x, 0), T(n + 1, 2))


def test_flatten() -> None:
    assert info_of(op.flatten, T(b, s, 12)) == T(12 * b * s)
    assert info_of(lambda x: op.flatten(x, 1), T(b, s, 12, 64)) == T(b, 768 * s)
    assert info_of(lambda x: op.flatten(x, 1, 2), T(b, n, m, 4)) == T(b, n * m, 4)
    assert info_of(lambda x: op.flatten(x, -2, -1), T(n, 3)) == T(n * 3)
    assert info_of(op.flatten, T()) == T(1)
    assert info_of(op.flatten, R()) == R(1)
    assert info_of(lambda x: op.flatten(x, 1), R()) == R()
    assert info_of(lambda x: op.flatten(x, 1, 2), R(4)) == R(3)
    with pytest.raises(InferenceError, match=r"flatten: start_dim 2 comes after end_dim 1 for shape \(n, 3, 4\)"):
        infer(lambda x: op.flatten(x, 2, 1), T(n, 3, 4))


def test_broadcast_to() -> None:
    assert info_of(lambda x: op.broadcast_to(x, (b, n, 4)), T(n, 1)) == T(b, n, 4)
    assert info_of(lambda x: op.broadcast_to(x, (n, m)), R()) == T(n, m)
    assert info_of(op.broadcast_to, T(3), ShapeInfo(None, 2)) == R(2)
    k = SymVar("k", 1)
    info, checks = infer(lambda x: op.broadcast_to(x, (n, m)), T(k))
    assert info == T(n, m)
    assert [(c.kind, c.dims) for c in checks] == [("expands", (k, m))]
    assert holds(checks, {k: 1, m: 5, n: 1}) and holds(checks, {k: 5, m: 5, n: 1})
    assert not holds(checks, {k: 5, m: 1, n: 1})  # one way: 5 does not broadcast to 1
    with pytest.raises(ShapeError, match=r"broadcast_to: cannot broadcast input \(3,\) to \(n, 4\) \(3 vs 4\)"):
        infer(lambda x: op.broadcast_to(x, (n, 4)), T(3))
    with pytest.raises(ShapeError, match=r"broadcast_to: cannot broadcast input \(n \+ 1,\) to \(n,\)"):
        infer(lambda x: op.broadcast_to(x, (n,)), T(n + 1))
    with pytest.raises(ShapeError, match=r"cannot broadcast input \(2, 3\) to \(3,\): too many dims"):
        infer(lambda x: op.broadcast_to(x, (3,)), T(2, 3))


# -- concat, split --------------------------------------------------------------------------------


def test_concat_adds_dims_symbolically() -> None:
    assert info_of(lambda x, y: op.concat([x, y], axis=1), T(b, n, 8), T(b, m, 8)) == T(b, n + m, 8)
    assert info_of(lambda x, y, w: op.concat([x, y, w], -1), T(2, n), T(2, 1), T(2, n)) == T(2, 2 * n + 1)
    assert info_of(lambda x: op.concat([x]), T(n, 3)) == T(n, 3)
    tup = TupleInfo((T(n, 3), T(m, 3)))
    assert info_of(op.concat, tup) == T(n + m, 3)
    assert info_of(op.concat, AnyInfo()) == R(dtype=None)


def test_concat_unknowns() -> None:
    assert info_of(lambda x, y: op.concat([x, y]), R(), T(n, 3)) == R(2)
    assert info_of(lambda x, y: op.concat([x, y]), R(), R()) == R()
    assert info_of(lambda x, y: op.concat([x, y]), T(n, 3, dtype=None), T(m, 3)) == T(n + m, 3)
    assert info_of(op.concat, TupleInfo((AnyInfo(), T(2, 2)))) == R(2)


def test_concat_checks_and_errors() -> None:
    info, checks = infer(lambda x, y: op.concat([x, y], 0), T(2, n), T(3, m))
    assert info == T(5, n)
    assert [(c.kind, c.dims) for c in checks] == [("eq", (n, m))]
    with pytest.raises(ShapeError, match=r"concat: dim 1 of \(2, 3\) and \(2, 4\) differ: 3 != 4"):
        infer(lambda x, y: op.concat([x, y]), T(2, 3), T(2, 4))
    with pytest.raises(ShapeError, match=r"concat: tensors of different ranks: \(2, 3\), \(2,\)"):
        infer(lambda x, y: op.concat([x, y]), T(2, 3), T(2))
    with pytest.raises(InferenceError, match="concat: dtypes disagree"):
        infer(lambda x, y: op.concat([x, y]), T(2, 3), T(2, 3, dtype="int32"))
    with pytest.raises(InferenceError, match="concat: needs at least one tensor"):
        infer(lambda: op.concat(Tuple(())))
    with pytest.raises(ShapeError, match="concat: cannot concatenate 0-d tensors"):
        infer(lambda x: op.concat([x, x]), T())
    with pytest.raises(InferenceError, match="concat: axis 2 is out of range"):
        infer(lambda x: op.concat([x, x], 2), T(2, 2))


def test_split_sections() -> None:
    assert info_of(lambda x: op.split(x, 3, axis=1), T(n, 2304)) == TupleInfo((T(n, 768),) * 3)
    info, checks = infer(lambda x: op.split(x, 2, axis=-1), T(b, n))
    assert info == TupleInfo((T(b, sym.floordiv(n, 2)),) * 2)
    assert [(c.kind, c.dims) for c in checks] == [("divides", (n, 2))]
    assert holds(checks, {n: 6, b: 1}) and not holds(checks, {n: 7, b: 1})
    assert info_of(lambda x: op.split(x, 2), T(2 * n, 3)) == TupleInfo((T(n, 3),) * 2)
    with pytest.raises(ShapeError, match=r"split: dim 7 of shape \(7, 2\) does not split into 2 equal sections"):
        infer(lambda x: op.split(x, 2), T(7, 2))
    with pytest.raises(InferenceError, match="split: number of sections must be positive, got 0"):
        infer(lambda x: op.split(x, 0), T(4))


def test_split_indices_match_numpy() -> None:
    for idx in [(1, 3), (0, 10), (4, 2), (-3,), (2, 2, 20)]:
        expected = tuple(p.shape for p in np.split(np.zeros((6, 2)), list(idx)))
        assert info_of(lambda x: op.split(x, idx), T(6, 2)) == TupleInfo(tuple(T(*e) for e in expected)), idx
    assert info_of(lambda x: op.split(x, (768, 1536), axis=1), T(n, 2304)) == TupleInfo((T(n, 768),) * 3)
    assert info_of(lambda x: op.split(x, (1,)), T(n, 4)) == TupleInfo((T(1, 4), T(n - 1, 4)))


def test_split_unknowns() -> None:
    assert info_of(lambda x: op.split(x, 3), R()) == TupleInfo((R(),) * 3)
    assert info_of(lambda x: op.split(x, (1, 2), axis=1), R(2, dtype=None)) == TupleInfo((R(2, dtype=None),) * 3)
    with pytest.raises(ShapeError, match="split: cannot split a 0-d tensor"):
        infer(lambda x: op.split(x, 1), T())


# -- strided_slice, take, shape_of ----------------------------------------------------------------


SLICES = [(1, None, 1), (None, None, -1), (-3, None, 1), (2, 8, 3), (8, 2, -2), (-100, 100, 1), (5, 1, 1), (None, -2, 2)]


@pytest.mark.parametrize("begin, end, step", SLICES)
def test_strided_slice_static_matches_python(begin: int | None, end: int | None, step: int) -> None:
    expected = len(range(10)[begin:end:step])
    info = info_of(lambda x: op.strided_slice(x, [1], [begin], [end], [step]), T(4, 10))
    assert info == T(4, expected)


@pytest.mark.parametrize("begin, end, step", SLICES)
def test_strided_slice_symbolic_matches_python(begin: int | None, end: int | None, step: int) -> None:
    info, checks = infer(lambda x: op.strided_slice(x, [0], [begin], [end], [step]), T(n))
    assert checks == []
    assert isinstance(info, TensorInfo) and info.shape is not None
    for value in (1, 2, 5, 13):
        assert sym_walk.evaluate(info.shape[0], {n: value}) == len(range(value)[begin:end:step])


def test_strided_slice_common_symbolic_cases_are_exact() -> None:
    kv = tw.dim("kv")
    assert info_of(lambda x: op.strided_slice(x, [1], [1], [None]), T(b, n, 4)) == T(b, n - 1, 4)
    assert info_of(lambda x: op.strided_slice(x, [1], [0], [n]), T(b, n, 4)) == T(b, n, 4)
    assert info_of(lambda x: op.strided_slice(x, [0], [-1], [None]), T(n)) == T(1)
    assert info_of(lambda x: op.strided_slice(x, [0], [n], [n + m]), T(n + m)) == T(m)
    assert info_of(lambda x: op.strided_slice(x, [0, 1], [0, 0], [2, 2]), T(n + 2, m + 2)) == T(2, 2)
    # an end that is not provably in range stays exact with min
    assert info_of(lambda x: op.strided_slice(x, [0], [0], [kv]), T(n)) == T(sym.min_(kv, n))


def test_strided_slice_symbolic_bound_of_unknown_sign_is_checked() -> None:
    info, checks = infer(lambda x: op.strided_slice(x, [0], [n - m], [None]), T(n))
    assert info == T(m)
    assert [(c.kind, c.dims) for c in checks] == [("ge", (n - m, 0))]
    assert holds(checks, {n: 5, m: 2}) and not holds(checks, {n: 2, m: 5})


def test_strided_slice_unknowns_and_errors() -> None:
    assert info_of(lambda x: op.strided_slice(x, [0], [1], [3]), R()) == R()
    assert info_of(lambda x: op.strided_slice(x, [1], [1], [3]), R(2, dtype=None)) == R(2, dtype=None)
    with pytest.raises(InferenceError, match="strided_slice: strides must be non-zero static ints"):
        infer(lambda x: op.strided_slice(x, [0], [0], [1], [0]), T(4))
    with pytest.raises(InferenceError, match=r"strided_slice: end must be a tuple with one entry per axis \(1\)"):
        infer(lambda x: op.strided_slice(x, [0], [0], [1, 2]), T(4))
    with pytest.raises(InferenceError, match="strided_slice: axis 1 is out of range for a tensor of rank 1"):
        infer(lambda x: op.strided_slice(x, [1], [0], [1]), T(4))
    with pytest.raises(InferenceError, match="strided_slice: begin entries must be ints, symbolic dims or None"):
        infer(lambda x: op.strided_slice(x, [0], [0.5], [1]), T(4))  # type: ignore[list-item]


def test_take() -> None:
    vocab = tw.dim("vocab")
    assert info_of(op.take, T(vocab, 4096), T(b, s, dtype="int64")) == T(b, s, 4096)
    assert info_of(lambda x, i: op.take(x, i, axis=1), T(n, m, 3), T(5, dtype="int32")) == T(n, 5, 3)
    assert info_of(lambda x, i: op.take(x, i, axis=-1), T(n, m), T(dtype="int32")) == T(n)
    assert info_of(lambda x, i: op.take(x, i, axis=None), T(n, m), T(b, 2, dtype="int64")) == T(b, 2)
    assert info_of(op.take, R(), T(3, dtype="int64")) == R()
    assert info_of(op.take, T(n, 4), R(2, dtype=None)) == R(3)
    assert info_of(op.take, T(n, 4, dtype=None), R(dtype="int64")) == R(dtype=None)
    with pytest.raises(InferenceError, match="take: indices must be an integer tensor, got float32"):
        infer(op.take, T(n, 4), T(3))
    with pytest.raises(ShapeError, match="take: cannot take from a 0-d tensor"):
        infer(op.take, T(), T(3, dtype="int64"))


def test_shape_of() -> None:
    assert info_of(op.shape_of, T(n, m + 1)) == ShapeInfo((n, m + 1))
    assert info_of(op.shape_of, R(3)) == ShapeInfo(None, 3)
    assert info_of(op.shape_of, R()) == ShapeInfo(None, -1)
    # a computed shape feeds reshape
    assert info_of(lambda x, y: op.reshape(x, op.shape_of(y)), T(n, 6), T(n, 2, 3)) == T(n, 2, 3)


def test_constructors_store_tuples() -> None:
    x = Var("x", T(4, 4))
    assert dict(op.expand_dims(x, 1).attrs) == {"axis": (1,)}
    assert dict(op.squeeze(x, [0]).attrs) == {"axis": (0,)}
    assert dict(op.split(x, [1, 2]).attrs) == {"indices_or_sections": (1, 2), "axis": 0}
    call = op.strided_slice(x, [0], [n], [None])
    assert dict(call.attrs) == {"axes": (0,), "begin": (n,), "end": (None,), "strides": None}
    assert isinstance(op.reshape(x, (16,)).args[1], ShapeExpr)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda x: op.expand_dims(x, 0), (1, 2, 3)),
        (lambda x: op.squeeze(x), (2, 3)),
        (lambda x: op.flatten(x), (6,)),
        (lambda x: op.broadcast_to(x, (n, 2, 3)), (n, 2, 3)),
        (lambda x: op.permute_dims(x), (3, 2)),
        (lambda x: op.strided_slice(x, [1], [1], [None]), (2, 2)),
        (lambda x: op.reshape(x, (3, -1)), (3, 2)),
    ],
)
def test_unknown_dtype_is_kept(make, expected) -> None:  # type: ignore[no-untyped-def]
    assert info_of(make, T(2, 3, dtype=None)) == T(*expected, dtype=None)
    assert info_of(make, T(2, 3, dtype="int8")) == T(*expected, dtype="int8")

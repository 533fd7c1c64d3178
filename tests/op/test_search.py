"""Searching and ordering (``tilework.op.search``): ``topk`` with symbolic ``k``, and the
data-dependent ``nonzero`` and ``unique``, whose lengths are bound at run time (a counting
kernel, the VM reading the count into a fresh sym var, a filling kernel) — compiled once and run
on inputs with different counts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, holds, infer
from tests.op.legalize_harness import Built, Case, build, check, envs, shape_at
from tilework.errors import InferenceError, ShapeError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import MatchCast, TupleGetItem, Var, bindings_of
from tilework.ir.info import TensorInfo, TupleInfo
from tilework.ir.sym import SymVar
from tilework.transform.legalize import Legalize

n, m, k = tw.dim("n"), tw.dim("m"), tw.dim("k")
search = op.search


def test_inference() -> None:
    info, checks = infer(lambda x: search.topk(x, k, 1), T(n, m))
    assert info == TupleInfo((T(n, k), T(n, k, dtype="int64")))
    assert [c.kind for c in checks] == ["ge"] and holds(checks, {n: 2, m: 5, k: 5}) and not holds(checks, {n: 2, m: 5, k: 6})
    with pytest.raises(ShapeError, match=r"k = 7 exceeds dim 0 \(4\)"):
        infer(lambda x: search.topk(x, 7, 0), T(4))
    with pytest.raises(InferenceError, match="attribute k must be an int or a symbolic dim"):
        infer(lambda x: search.topk(x, 1.5), T(4))  # type: ignore[arg-type]
    assert infer(search.nonzero, T(n, 3))[0] == R(2, "int64")
    with pytest.raises(ShapeError, match="nonzero of a 0-d tensor"):
        infer(search.nonzero, T())
    unique, _ = infer(search.unique, T(n, m, dtype="int32"))
    assert isinstance(unique, TupleInfo) and unique.fields[2] == T(n * m, dtype="int64") and unique.fields[0] == R(1, "int32")
    along, _ = infer(lambda x: search.unique(x, axis=-2), T(n, m, 3))
    assert isinstance(along, TupleInfo) and along.fields[0] == R(3) and along.fields[2] == T(m, dtype="int64")


def _topk_ref(x: np.ndarray, kk: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(kk), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx


def _ties(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.integers(0, 3, size=shape_at((n, m), env)).astype(np.float32), np.zeros(env[k], np.float32)]


ENVS = envs({n: 1, m: 1, k: 1}, {n: 4, m: 9, k: 3}, {n: 3, m: 6, k: 6})
CASES = [
    Case("topk_largest_sym_k", lambda x, y: search.topk(x, k, 1), [T(n, m), T(k)], lambda x, y: _topk_ref(x, y.shape[0], 1, True), ENVS, inputs=_ties),
    Case("topk_smallest_axis0", lambda x: search.topk(x, 2, 0, largest=False), [T(5, m, dtype="int32")], lambda x: _topk_ref(x, 2, 0, False), ENVS),
]


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_topk_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def _compiled(make: Any, info: TensorInfo) -> Any:
    x = Var("x", info)
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = make(bb, x)
            outs = [bb.emit_output(o) for o in out]
        bb.emit_func_output(outs)
    mod = bb.get()
    legal = Legalize()(mod)
    assert any(isinstance(b, MatchCast) for b in bindings_of(legal["main"]))  # type: ignore[arg-type]
    return tw.VM(tw.build(mod))["main"]


def test_nonzero_compiles_once_for_every_count() -> None:
    fn = _compiled(lambda bb, x: [bb.emit(search.nonzero(x))], T(n, 3))
    rng = np.random.default_rng(1)
    samples: list[np.ndarray] = [rng.integers(0, 2, size=(5, 3)), np.zeros((2, 3)), np.ones((4, 3)), rng.standard_normal((7, 3)) > 0.8]
    for sample in samples:
        x = sample.astype(np.float32)
        (got,) = fn(x)
        np.testing.assert_array_equal(got, np.stack(np.nonzero(x)).astype(np.int64).reshape(2, -1))


@pytest.mark.parametrize("is_sorted", [True, False])
def test_unique_matches_numpy(is_sorted: bool) -> None:
    def make(bb: BlockBuilder, x: Var) -> list[Any]:
        u = bb.emit(search.unique(x, is_sorted))
        return [bb.emit(TupleGetItem(u, i)) for i in range(4)]

    fn = _compiled(make, T(n, 2, dtype="int64"))
    for x in (np.array([[2, 1], [1, 3], [0, 2]]), np.array([[5, 5]]), np.random.default_rng(2).integers(-3, 3, size=(9, 2))):
        values, first, inverse, counts = fn(x.astype(np.int64))
        flat = x.reshape(-1)
        u, f, inv, c = np.unique(flat, return_index=True, return_inverse=True, return_counts=True)
        if not is_sorted:  # order of first occurrence
            order = np.argsort(f, kind="stable")
            u, f, c = u[order], f[order], c[order]
            inv = np.argsort(order)[inv]
        np.testing.assert_array_equal(values, u)
        np.testing.assert_array_equal(first, f)
        np.testing.assert_array_equal(inverse, inv.reshape(-1))
        np.testing.assert_array_equal(counts, c)


def _unique_ref(x: np.ndarray, axis: int | None, is_sorted: bool) -> tuple[np.ndarray, ...]:
    u, f, inv, c = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    if not is_sorted:  # order of first occurrence
        order = np.argsort(f, kind="stable")
        u, f, c = np.take(u, order, axis=0 if axis is None else axis), f[order], c[order]
        inv = np.argsort(order)[inv]
    return u, f, inv.reshape(-1), c


@pytest.mark.parametrize("is_sorted", [True, False])
def test_unique_along_an_axis_matches_numpy(is_sorted: bool) -> None:
    """Slices along axis 1 of ``[2, n, 3]`` compared whole (lexicographically when sorted)."""

    def make(bb: BlockBuilder, x: Var) -> list[Any]:
        u = bb.emit(search.unique(x, is_sorted, axis=1))
        return [bb.emit(TupleGetItem(u, i)) for i in range(4)]

    fn = _compiled(make, T(2, n, 3, dtype="int32"))
    rng = np.random.default_rng(3)
    base = rng.integers(-1, 2, size=(2, 4, 3))
    for x in (base[:, :1], base[:, [2, 0, 2, 1, 0, 3, 3]], rng.integers(0, 2, size=(2, 9, 3)), np.zeros((2, 5, 3))):
        got = fn(x.astype(np.int32))
        for g, w in zip(got, _unique_ref(x.astype(np.int32), 1, is_sorted)):
            np.testing.assert_array_equal(g, w)


def _unique_items_ref(items: list[tuple[float, ...]], is_sorted: bool) -> tuple[list[int], list[int], list[int]]:
    """Brute-force unique over items compared whole: NaN equal to NaN and after every number.
    Returns the first index of each distinct item (in output order), the inverse and the counts."""

    def key(item: tuple[float, ...]) -> tuple[tuple[int, float], ...]:
        return tuple((1, 0.0) if np.isnan(v) else (0, v) for v in item)

    firsts: list[int] = []
    for p, item in enumerate(items):
        if all(key(items[f]) != key(item) for f in firsts):
            firsts.append(p)
    if is_sorted:
        firsts.sort(key=lambda p: key(items[p]))
    inverse = [next(j for j, f in enumerate(firsts) if key(items[f]) == key(item)) for item in items]
    counts = [inverse.count(j) for j in range(len(firsts))]
    return firsts, inverse, counts


_NAN_CASES = [[np.nan, 1, 2], [3, np.nan, np.nan, 1], [1, 3, 3, 0, 2, 2, np.nan, 1, 0, 5], [2, 1, np.nan],
              [np.nan], [np.nan, np.nan, np.nan], [4, 1, 4], [7], [], [0.0, -0.0, np.inf, np.nan, -np.inf, np.nan]]  # fmt: skip


@pytest.mark.parametrize("is_sorted", [True, False])
def test_unique_treats_nans_as_one_value_last(is_sorted: bool) -> None:
    """NaN at the start, middle, end, only NaNs, no NaN: NumPy's ``unique`` (``equal_nan``), and
    no index outside the input (a NaN used to get the minimum's key, and the first index summed
    over every NaN ran past the end)."""

    def make(bb: BlockBuilder, x: Var) -> list[Any]:
        u = bb.emit(search.unique(x, is_sorted))
        return [bb.emit(TupleGetItem(u, i)) for i in range(4)]

    fn = _compiled(make, T(tw.dim("z", min=0), dtype="float32"))  # the empty input too
    for case in _NAN_CASES:
        x = np.array(case, np.float32)
        values, first, inverse, counts = fn(x)
        assert first.size == 0 or (0 <= first.min() and first.max() < x.size)
        u, f, inv, c = _unique_ref(x, None, is_sorted)
        np.testing.assert_array_equal(values, u)  # NaN == NaN in assert_array_equal
        np.testing.assert_array_equal(first, f)
        np.testing.assert_array_equal(inverse, inv)
        np.testing.assert_array_equal(counts, c)
        firsts, want_inv, want_counts = _unique_items_ref([(v,) for v in x.tolist()], is_sorted)
        assert first.tolist() == firsts and inverse.tolist() == want_inv and counts.tolist() == want_counts


@pytest.mark.parametrize("is_sorted", [True, False])
def test_unique_along_an_axis_with_nans(is_sorted: bool) -> None:
    """Slices holding NaNs: equal when their NaNs are in the same places, NaN after every number
    in the lexicographic order."""

    def make(bb: BlockBuilder, x: Var) -> list[Any]:
        u = bb.emit(search.unique(x, is_sorted, axis=0))
        return [bb.emit(TupleGetItem(u, i)) for i in range(4)]

    fn = _compiled(make, T(n, 2, dtype="float32"))
    nan = np.nan
    for rows in ([[nan, 1], [1, 2], [nan, 1], [1, nan]], [[1, 2], [1, nan], [1, 2], [nan, nan], [nan, nan]],
                 [[nan, nan]], [[3, 1], [0, 2], [3, 1]], [[1, nan], [nan, 0], [0, nan], [1, nan]]):  # fmt: skip
        x = np.array(rows, np.float32)
        values, first, inverse, counts = fn(x)
        firsts, want_inv, want_counts = _unique_items_ref([tuple(r) for r in x.tolist()], is_sorted)
        assert first.tolist() == firsts and inverse.tolist() == want_inv and counts.tolist() == want_counts
        np.testing.assert_array_equal(values, x[firsts])

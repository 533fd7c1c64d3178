"""Indexing ops (gather, scatter, index_tensor, cumsum, tril, triu): symbolic inference, and
legalized kernels compiled to C and run at several values of their symbolic dims against NumPy
references (checked against torch where torch is installed)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, holds, infer, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, random_array, shape_at
from tilework.errors import InferenceError, ShapeError
from tilework.ir import sym
from tilework.ir.sym import SymVar

n, m, k = tw.dim("n"), tw.dim("m"), tw.dim("k")

# -- inference ------------------------------------------------------------------------------


def test_gather_and_scatter_inference() -> None:
    assert info_of(lambda x, i: op.gather(x, i, 1), T(n, m), T(n, 3, dtype="int64")) == T(n, 3)
    assert info_of(lambda x, i: op.gather(x, i, -1), R(2), T(n, 3, dtype="int32")) == T(n, 3)
    info, checks = infer(lambda x, i: op.gather(x, i, 1), T(n, m), T(k, 3, dtype="int64"))
    assert info == T(k, 3) and [c.kind for c in checks] == ["ge"]
    assert holds(checks, {n: 4, m: 2, k: 4}) and not holds(checks, {n: 4, m: 2, k: 5})
    assert info_of(lambda x, i, s: op.scatter(x, i, s, 0, "add"), T(n, m), T(2, m, dtype="int64"), T(2, m)) == T(n, m)
    with pytest.raises(ShapeError, match=r"gather: index \(n,\) must have the rank of input \(n, m\)"):
        infer(lambda x, i: op.gather(x, i, 0), T(n, m), T(n, dtype="int64"))
    with pytest.raises(InferenceError, match="gather: indices must be an integer tensor, got float32"):
        infer(lambda x, i: op.gather(x, i, 0), T(n, m), T(n, m))
    with pytest.raises(InferenceError, match="scatter: reduction must be one of none, add, mul, max, min"):
        infer(lambda x, i, s: op.scatter(x, i, s, 0, "mean"), T(n), T(n, dtype="int64"), T(n))
    with pytest.raises(ShapeError, match=r"gather: index \(3, 5\) is larger than input \(3, 4\) in dim 1"):
        infer(lambda x, i: op.gather(x, i, 0), T(3, 4), T(3, 5, dtype="int64"))


def test_index_tensor_inference() -> None:
    i0, i1 = T(n, 1, 1, 1, dtype="int64"), T(1, 1, 1, m, dtype="int64")
    assert info_of(lambda x, a, b: op.index_tensor(x, [a, b]), T(n, m), i0, i1) == T(n, 1, 1, m)
    assert info_of(lambda x, a: op.index_tensor(x, [a], axis=1), T(2, 10, 3), T(k, dtype="int32")) == T(2, k, 3)
    with pytest.raises(InferenceError, match="index_tensor: axis 2 with 1 index tensor"):
        infer(lambda x, a: op.index_tensor(x, [a], axis=2), T(2, 3), T(k, dtype="int64"))


def test_cumsum_and_tri_inference() -> None:
    assert info_of(op.cumsum, T(n, m)) == T(n, m)
    assert info_of(lambda x: op.cumsum(x, 0), T(n, m, dtype="bool")) == T(n, m, dtype="int64")
    assert info_of(lambda x: op.cumsum(x, 0, dtype="float32"), T(n, dtype="int32")) == T(n)
    assert info_of(lambda x: op.tril(x, k), T(n, m)) == T(n, m)
    with pytest.raises(ShapeError, match=r"triu: input must have at least 2 dims"):
        infer(op.triu, T(n))
    with pytest.raises(InferenceError, match="tril: attribute k must be an int or a symbolic dim"):
        infer(lambda x: op.tril(x, 1.5), T(n, m))  # type: ignore[arg-type]


# -- NumPy references ------------------------------------------------------------------------


def scatter_ref(x: np.ndarray, idx: np.ndarray, src: np.ndarray, axis: int, reduction: str) -> np.ndarray:
    """Positions are visited in row-major order, so for "none" the last hit along axis wins."""
    out = x.copy()
    d = x.shape[axis]
    for pos in np.ndindex(*idx.shape):
        target = list(pos)
        target[axis] = int(idx[pos]) % d
        t, v = tuple(target), src[pos]
        if reduction == "none":
            out[t] = v
        elif reduction == "add":
            out[t] += v
        elif reduction == "mul":
            out[t] *= v
        elif reduction == "max":
            out[t] = max(out[t], v)
        else:
            out[t] = min(out[t], v)
    return out


def cumsum_ref(x: np.ndarray, axis: int, exclusive: bool = False, reverse: bool = False, dtype: Any = None) -> np.ndarray:
    y = np.flip(x, axis) if reverse else x
    c = np.cumsum(y, axis=axis, dtype=dtype or (np.int64 if x.dtype.kind in "biu" else x.dtype))
    if exclusive:
        c = c - y
    return np.flip(c, axis) if reverse else c


# -- legalized kernels ---------------------------------------------------------------------------

ENVS = envs({n: 1, m: 1, k: 1}, {n: 7, m: 5, k: 3}, {n: 33, m: 4, k: 9})


def _indices(x_shape: tuple, idx_shape: tuple, axis: int, negative: bool = True) -> Callable[[dict[SymVar, int], np.random.Generator], list[np.ndarray]]:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        xs = shape_at(x_shape, env)
        d = xs[axis]
        return [random_array(xs, "float32", rng), rng.integers(-d if negative else 0, d, size=shape_at(idx_shape, env)).astype(np.int64)]

    return make


def _scatter_inputs(x_shape: tuple, idx_shape: tuple, axis: int, unique: bool) -> Callable[[dict[SymVar, int], np.random.Generator], list[np.ndarray]]:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        xs, ish = shape_at(x_shape, env), shape_at(idx_shape, env)
        d = xs[axis]
        if unique:  # a permutation prefix along axis: no two positions hit one element
            idx = np.argsort(rng.random(ish[:axis] + (d,) + ish[axis + 1 :]), axis=axis).take(range(ish[axis]), axis=axis)
        else:
            idx = rng.integers(-d, d, size=ish)
        return [random_array(xs, "float32", rng), idx.astype(np.int64), (rng.random(ish) + 0.5).astype(np.float32)]

    return make


def _gather_ref(x: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    return np.take_along_axis(x, np.where(idx < 0, idx + x.shape[axis], idx), axis=axis)


def _cases() -> list[Case]:
    c = [
        Case("gather_axis1", lambda x, i: op.gather(x, i, 1), [T(n, m), T(n, k, dtype="int64")], lambda x, i: _gather_ref(x, i, 1), ENVS, inputs=_indices((n, m), (n, k), 1)),
        Case("gather_axis0_smaller", lambda x, i: op.gather(x, i, 0), [T(n, 4), T(k, 2, dtype="int64")], lambda x, i: _gather_ref(x[:, :2], i, 0), envs({n: 1, k: 1}, {n: 7, k: 3}, {n: 4, k: 9}), inputs=_indices((n, 4), (k, 2), 0)),
        Case("index_two_tensors", lambda x, a, b: op.index_tensor(x, [a, b]), [T(n, m), T(n, 1, 1, 1, dtype="int64"), T(1, 1, 1, m, dtype="int64")], lambda x, a, b: x[a, b], ENVS, inputs=lambda env, rng: [random_array(shape_at((n, m), env), "float32", rng), np.arange(env[n]).reshape(-1, 1, 1, 1)[::-1].copy(), rng.integers(-env[m], env[m], size=(1, 1, 1, env[m]))]),
        Case("index_middle_axis", lambda x, a: op.index_tensor(x, [a], axis=1), [T(2, m, 3, dtype="int32"), T(k, 2, dtype="int64")], lambda x, a: x[:, a], ENVS, inputs=lambda env, rng: [random_array(shape_at((2, m, 3), env), "int32", rng), rng.integers(-env[m], env[m], size=(env[k], 2))]),
        Case("cumsum_last", op.cumsum, [T(n, m)], lambda x: cumsum_ref(x, -1), ENVS, tol=1e-4),
        Case("cumsum_axis0_bool", lambda x: op.cumsum(x, 0), [T(n, m, dtype="bool")], lambda x: cumsum_ref(x, 0), ENVS),
        Case("cumsum_exclusive_reverse", lambda x: op.cumsum(x, 1, exclusive=True, reverse=True), [T(n, m, dtype="int32")], lambda x: cumsum_ref(x, 1, True, True), ENVS),
        Case("cumsum_exclusive", lambda x: op.cumsum(x, 0, exclusive=True), [T(n, 3)], lambda x: cumsum_ref(x, 0, True), ENVS, tol=1e-4),
        Case("tril_0", op.tril, [T(n, m)], np.tril, ENVS),
        Case("tril_neg_batched", lambda x: op.tril(x, -1), [T(2, n, m, dtype="bool")], lambda x: np.tril(x, -1), ENVS),
        Case("triu_1", lambda x: op.triu(x, 1), [T(n, m, dtype="int64")], lambda x: np.triu(x, 1), ENVS),
        Case("triu_sym_k", lambda x, y: op.triu(x, sym.sub(k, 2)), [T(n, m), T(k)], lambda x, y: np.triu(x, y.shape[0] - 2), ENVS),
    ]
    for red in ("none", "add", "mul", "max", "min"):
        unique = red == "none"
        c.append(Case(f"scatter_{red}_axis0", lambda x, i, s, red=red: op.scatter(x, i, s, 0, red), [T(n, m), T(k, m, dtype="int64"), T(k, m)], lambda x, i, s, red=red: scatter_ref(x, i, s, 0, red), envs({n: 1, m: 1, k: 1}, {n: 7, m: 5, k: 3 if unique else 12}, {n: 9, m: 4, k: 9}), inputs=_scatter_inputs((n, m), (k, m), 0, unique), tol=1e-4))
    c.append(Case("scatter_partial_axis1", lambda x, i, s: op.scatter(x, i, s, 1), [T(n, m), T(k, 2, dtype="int64"), T(k, 3)], lambda x, i, s: scatter_ref(x, i, s[:, :2], 1, "none"), envs({n: 3, m: 2, k: 1}, {n: 7, m: 5, k: 3}, {n: 9, m: 4, k: 9}), inputs=_scatter_inputs_partial))
    return c


def _scatter_inputs_partial(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
    """index (k, 2) over x (n, m) with k <= n: rows of x past k and columns are untouched."""
    nn, mm, kk = env[n], env[m], env[k]
    idx = np.stack([rng.permutation(mm)[:2] for _ in range(kk)])
    return [random_array((nn, mm), "float32", rng), idx.astype(np.int64), random_array((kk, 3), "float32", rng)]


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


def test_references_match_torch() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra; the NumPy references are checked against it when present")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4))
    idx = np.argsort(rng.random((5, 4)), axis=0)[:3]
    src = rng.standard_normal((3, 4))
    t = torch.from_numpy
    np.testing.assert_allclose(scatter_ref(x, idx, src, 0, "none"), torch.scatter(t(x), 0, t(idx), t(src)).numpy())
    dup = rng.integers(0, 5, size=(6, 4))
    src6 = rng.standard_normal((6, 4))
    np.testing.assert_allclose(scatter_ref(x, dup, src6, 0, "add"), torch.scatter_add(t(x), 0, t(dup), t(src6)).numpy(), atol=1e-12)
    for red, name in (("mul", "prod"), ("max", "amax"), ("min", "amin")):
        np.testing.assert_allclose(scatter_ref(x, dup, src6, 0, red), torch.scatter_reduce(t(x), 0, t(dup), t(src6), name).numpy(), atol=1e-12)
    np.testing.assert_array_equal(cumsum_ref(x > 0, 1), torch.cumsum(t(x > 0), 1).numpy())

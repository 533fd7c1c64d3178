"""Ops whose results are 0/1 patterns: ``one_hot`` (``tilework.op.index``), ``hardmax`` (the
one-hot of ``argmax``, ``tilework.op.reduce``) and ``eye_like`` (``tilework.op.create``):
inference, and kernels run at several sym values against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tests.op.helpers import R, T, infer, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, shape_at
from tilework.errors import ShapeError
from tilework.op import create, index, reduce

n, m = tw.dim("n"), tw.dim("m")


def test_inference() -> None:
    assert info_of(lambda i, v: index.one_hot(i, v, 10, 1), T(n, m, dtype="int64"), T(2)) == T(n, 10, m)
    assert info_of(lambda i, v: index.one_hot(i, v, n), T(m, dtype="int32"), T(2, dtype="int64")) == T(m, n, dtype="int64")
    with pytest.raises(ShapeError, match=r"values must have shape \(2,\)"):
        infer(lambda i, v: index.one_hot(i, v, 3), T(m, dtype="int32"), T(3))
    assert info_of(lambda x: create.eye_like(x, 1, "int32"), T(n, m)) == T(n, m, dtype="int32")
    assert info_of(reduce.hardmax, R(3)) == R(3)


def _one_hot_ref(idx: np.ndarray, values: np.ndarray, depth: int, axis: int) -> np.ndarray:
    norm = np.where(idx < 0, idx + depth, idx)
    hot = np.expand_dims(norm, axis) == np.arange(depth).reshape([depth if k == axis else 1 for k in range(idx.ndim + 1)])
    return np.where(hot, values[1], values[0]).astype(values.dtype)


ENVS = envs({n: 1, m: 3}, {n: 5, m: 7}, {n: 9, m: 2})
CASES = [
    Case("one_hot_axis1", lambda i, v: index.one_hot(i, v, 5, 1), [T(n, m, dtype="int64"), T(2)], lambda i, v: _one_hot_ref(i, v, 5, 1), ENVS, inputs=lambda env, rng: [rng.integers(-6, 6, size=shape_at((n, m), env)), np.array([-1.0, 3.0], np.float32)]),
    Case("hardmax_axis0", lambda x: reduce.hardmax(x, 0), [T(n, m)], lambda x: (np.arange(x.shape[0])[:, None] == np.argmax(x, 0)[None, :]).astype(np.float32), ENVS),
    Case("eye_like_k1", lambda x: create.eye_like(x, 1, "int64"), [T(n, m)], lambda x: np.eye(x.shape[0], x.shape[1], 1, dtype=np.int64), ENVS),
]


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)

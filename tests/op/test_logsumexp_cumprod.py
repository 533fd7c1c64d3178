"""``logsumexp`` (``tilework.op.reduce``) and ``cumprod`` (``tilework.op.index``, beside
``cumsum``): inference, and kernels run at several sym values against NumPy, including inputs
whose ``exp`` overflows float32."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tests.op.helpers import T, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, shape_at
from tilework.op import index, reduce

n, m = tw.dim("n"), tw.dim("m")


def test_inference() -> None:
    assert info_of(lambda x: reduce.logsumexp(x, 1, True), T(n, m)) == T(n, 1)


ENVS = envs({n: 1, m: 3}, {n: 5, m: 7}, {n: 9, m: 2})
CASES = [
    Case("cumprod_axis1", lambda x: index.cumprod(x, 1), [T(n, m)], lambda x: np.cumprod(x.astype(np.float64), 1).astype(np.float32), ENVS, inputs=lambda env, rng: [rng.uniform(0.5, 1.5, size=(env[n], env[m])).astype(np.float32)], tol=1e-5),
    Case("cumprod_exclusive_reverse_int", lambda x: index.cumprod(x, 0, exclusive=True, reverse=True), [T(n, 2, dtype="int64")], lambda x: np.flip(np.cumprod(np.flip(np.concatenate([x[1:], np.ones((1, 2), np.int64)]), 0), 0), 0), ENVS),
    Case("logsumexp_axis1_keep", lambda x: reduce.logsumexp(x, 1, True), [T(n, m)], lambda x: np.log(np.sum(np.exp(x.astype(np.float64)), 1, keepdims=True)).astype(np.float32), ENVS),
    Case("logsumexp_large", lambda x: reduce.logsumexp(x), [T(n, m)], lambda x: np.float32(np.max(x) + np.log(np.sum(np.exp(x - np.max(x))))), ENVS, inputs=lambda env, rng: [(rng.standard_normal(shape_at((n, m), env)) * 50 + 200).astype(np.float32)], tol=1e-5),
]


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)

"""``einsum`` (``tilework.op.linalg``): parsing the equation, inference, and one kernel per
equation run at several sym values against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tests.op.helpers import T, infer, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs
from tilework.errors import InferenceError, ShapeError
from tilework.op import linalg

n, m = tw.dim("n"), tw.dim("m")


def test_einsum_inference_and_parsing() -> None:
    assert linalg.parse_einsum("bij, bjk -> bik", [3, 3]) == (["bij", "bjk"], "bik")
    assert linalg.parse_einsum("...ii", [4]) == (["YZii"], "YZ")
    assert info_of(lambda a, b: linalg.einsum("ij,jk", a, b), T(n, 4), T(4, m)) == T(n, m)
    with pytest.raises(InferenceError, match="do not match an operand of rank 2"):
        infer(lambda a: linalg.einsum("ijk->i", a), T(n, m))
    with pytest.raises(ShapeError, match="dims labelled 'j'"):
        infer(lambda a, b: linalg.einsum("ij,jk", a, b), T(n, 4), T(5, m))


ENVS = envs({n: 1, m: 3}, {n: 5, m: 7}, {n: 9, m: 2})
CASES = [
    Case("einsum_batch_matmul", lambda a, b: linalg.einsum("bij,bjk->bik", a, b), [T(2, n, m), T(2, m, 3)], lambda a, b: np.einsum("bij,bjk->bik", a, b), ENVS, tol=1e-5),
    Case("einsum_ellipsis_diagonal", lambda a: linalg.einsum("...ii->...i", a), [T(n, 3, 3)], lambda a: np.einsum("...ii->...i", a), ENVS),
    Case("einsum_implicit_outer", lambda a, b: linalg.einsum("i,j", a, b), [T(n), T(m)], lambda a, b: np.einsum("i,j", a, b), ENVS),
    Case("einsum_broadcast_one", lambda a, b: linalg.einsum("ij,ij->i", a, b), [T(n, 1), T(n, m)], lambda a, b: np.einsum("ij,ij->i", np.broadcast_to(a, b.shape), b), ENVS, tol=1e-5),
]


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)

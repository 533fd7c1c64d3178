"""Legalized creation ops (full, zeros, ones, their *_like forms, arange), compiled to C and run
at several values of their symbolic dims, against NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.legalize_harness import BF16, Built, Case, assert_round_trips, build, check, envs, kernel_call
from tilework.ir.info import TensorInfo

n, m, k = tw.dim("n"), tw.dim("m"), tw.dim("k")
ENVS = envs({n: 1, m: 1, k: 1}, {n: 7, m: 33, k: 3}, {n: 256, m: 5, k: 200})


def T(*shape: Any, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(tuple(shape), dtype)


def _cases() -> list[Case]:
    # The params only define the sym vars (and give *_like their shape); the kernels read none.
    nm = [T(n, m)]
    return [
        Case("full_f32", lambda x: op.full((n, m), 2.5), nm, lambda x: np.full(x.shape, 2.5, np.float32), ENVS),
        Case("full_i32_trunc", lambda x: op.full((m, n, 2), 3.7, "int32"), nm, lambda x: np.full((x.shape[1], x.shape[0], 2), 3, np.int32), ENVS),
        Case("full_bool", lambda x: op.full((n,), True, "bool"), nm, lambda x: np.ones(x.shape[:1], bool), ENVS),
        Case("full_bf16", lambda x: op.full((n, m), 0.1, "bfloat16"), nm, lambda x: np.full(x.shape, 0.1, BF16), ENVS, tol=0.0),
        Case("full_compound", lambda x: op.full((n + 1, 2 * m), -1.0), nm, lambda x: np.full((x.shape[0] + 1, 2 * x.shape[1]), -1.0, np.float32), ENVS),
        Case("zeros", lambda x: op.zeros((n, m), "int64"), nm, lambda x: np.zeros(x.shape, np.int64), ENVS),
        Case("ones", lambda x: op.ones((m,), "float16"), nm, lambda x: np.ones(x.shape[1:], np.float16), ENVS),
        Case("zeros_like", op.zeros_like, nm, np.zeros_like, ENVS),
        Case("ones_like_int32", lambda x: op.ones_like(x, "int32"), nm, lambda x: np.ones_like(x, np.int32), ENVS),
        Case("full_like", lambda x: op.full_like(x, 7.0), [T(n, m, dtype="int32")], lambda x: np.full_like(x, 7), ENVS),
        Case("ones_like_scalar", op.ones_like, [T(dtype="bool")], np.ones_like, ENVS),
        Case("arange_n", lambda x: op.arange(n), nm, lambda x: np.arange(x.shape[0], dtype=np.int64), ENVS),
        Case("arange_step3", lambda x: op.arange(2, n + 5, 3), nm, lambda x: np.arange(2, x.shape[0] + 5, 3, dtype=np.int64), ENVS),
        Case("arange_down", lambda x: op.arange(n, 0, -2, "int32"), nm, lambda x: np.arange(x.shape[0], 0, -2, dtype=np.int32), ENVS),
        Case("arange_sym_start", lambda x, y: op.arange(k, n), [T(n), T(k)], lambda x, y: np.arange(y.shape[0], x.shape[0], dtype=np.int64), ENVS),
        Case("arange_float", lambda x: op.arange(0.5, 10.0, 0.25), nm, lambda x: np.arange(0.5, 10.0, 0.25, dtype=np.float32), ENVS, tol=0.0),
        Case("arange_n_float32", lambda x: op.arange(0, n, 1, "float32"), nm, lambda x: np.arange(x.shape[0], dtype=np.float32), ENVS, tol=0.0),
    ]


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_numpy(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


def test_creation_kernels_read_no_tensor(built: Built) -> None:
    call, _ = kernel_call(built.module["zeros_like"])  # type: ignore[arg-type]
    assert call.args[1].fields == ()  # type: ignore[attr-defined]

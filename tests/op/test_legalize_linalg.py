"""Legalized matmul (batched, broadcast, 1-D operands, out_dtype) and linear (weight
[out, in], optional bias), compiled to C and run at several values of their symbolic dims.

Only in the long tier (the module is built without them otherwise): ``matmul_bcast_both``
(each side's broadcast runs alone and both at run time, ``bcast_sym``), ``matmul_vec_batched``
(``vec_mat`` and ``batched_vec`` run), ``matmul_2d_float16`` (float16 operands run in
``2d_to_f32`` and ``linear_float16``) and ``linear_bfloat16`` (bfloat16 runs in
``matmul_batched_bfloat16``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, tiered
from tilework.ir.info import TensorInfo
from tilework.op.linalg import linear_io

n, m, k, b, c = tw.dim("n"), tw.dim("m"), tw.dim("k"), tw.dim("b"), tw.dim("c")
ENVS = envs({n: 1, m: 1, k: 1, b: 1, c: 1}, {n: 7, m: 33, k: 5, b: 3, c: 3}, {n: 256, m: 9, k: 64, b: 2, c: 1}, {n: 2, m: 3, k: 3, b: 1, c: 4})


def T(*shape: Any, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(tuple(shape), dtype)


def _mm(a: np.ndarray, b_: np.ndarray) -> np.ndarray:
    return np.matmul(a.astype(np.float64), b_.astype(np.float64))


def _matmul(name: str, sa: tuple, sb: tuple, dtype: str = "float32", out_dtype: str | None = None, tol: float | None = 1e-4) -> Case:
    def ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if out_dtype is not None and not out_dtype.startswith("float"):
            return np.matmul(x.astype(out_dtype), y.astype(out_dtype))
        if not dtype.startswith(("float", "bfloat")):
            return np.matmul(x, y)
        return _mm(x, y)

    return Case(f"matmul_{name}_{dtype}", lambda x, y: op.matmul(x, y, out_dtype=out_dtype), [T(*sa, dtype=dtype), T(*sb, dtype=dtype)], ref, ENVS, tol=tol)


def _linear_ref(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    out = x.astype(np.float64) @ w.astype(np.float64).T
    return out if bias is None else out + bias.astype(np.float64)


def _linear_io_ref(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    panels, k_, width = w.shape
    cols = panels * width if bias is None else bias.shape[0]
    dense = w.transpose(1, 0, 2).reshape(k_, panels * width)[:, :cols]  # [in, out]
    out = x.astype(np.float64) @ dense.astype(np.float64)
    return out if bias is None else out + bias.astype(np.float64)


def _cases() -> list[Case]:
    cases = [
        _matmul("2d", (n, k), (k, m)),
        _matmul("2d_static_k", (n, 16), (16, m)),
        _matmul("batched", (b, n, k), (b, k, m)),
        _matmul("bcast_rhs", (b, n, k), (k, m)),
        _matmul("bcast_lhs", (n, k), (c, b, k, m)),
        _matmul("bcast_both", (b, 1, n, k), (c, k, m)),
        _matmul("bcast_sym", (b, n, k), (c, k, m)),  # b and c broadcast at run time
        _matmul("vec_mat", (k,), (k, m)),
        _matmul("mat_vec", (n, k), (k,)),
        _matmul("vec_vec", (k,), (k,)),
        _matmul("batched_vec", (b, n, k), (k,)),
        _matmul("vec_batched", (k,), (b, k, m)),
        _matmul("2d", (n, k), (k, m), dtype="int32"),
        _matmul("2d_i8_to_i32", (n, k), (k, m), dtype="int8", out_dtype="int32"),
        _matmul("2d_to_f32", (n, k), (k, m), dtype="float16", out_dtype="float32"),
        _matmul("2d", (n, k), (k, m), dtype="float16", tol=None),
        _matmul("batched", (b, n, k), (k, m), dtype="bfloat16", tol=None),
        Case("linear_bias", op.linear, [T(b, n, 16), T(m, 16), T(m)], _linear_ref, ENVS, tol=1e-4),
        Case("linear_nobias", op.linear, [T(n, k), T(m, k)], _linear_ref, ENVS, tol=1e-4),
        Case("linear_1d", op.linear, [T(k), T(m, k), T(m)], _linear_ref, ENVS, tol=1e-4),
        Case("linear_float16", op.linear, [T(n, k, dtype="float16"), T(m, k, dtype="float16"), T(m, dtype="float16")], _linear_ref, ENVS),
        Case("linear_bfloat16", op.linear, [T(b, n, k, dtype="bfloat16"), T(m, k, dtype="bfloat16")], _linear_ref, ENVS),
        # the weight packed in column panels [panels, in, width]: columns past out are never read
        Case("linear_io_bias", lambda x, w, bias: linear_io(x, w, bias, 17), [T(b, n, k), T(3, k, 8), T(17)], _linear_io_ref, ENVS, tol=1e-4),
        Case("linear_io_nobias", lambda x, w: linear_io(x, w, None, 5), [T(n, 16), T(1, 16, 5)], _linear_io_ref, ENVS, tol=1e-4),
    ]
    return cases


CASES = _cases()
# name: why the case runs only in the long tier
LONG_CASES = {
    "matmul_bcast_both_float32": "each side's broadcast runs alone, and both at run time",
    "matmul_vec_batched_float32": "vec_mat and batched_vec run",
    "matmul_2d_float16": "float16 operands run in 2d_to_f32 and linear_float16",
    "linear_bfloat16": "bfloat16 runs in matmul_batched_bfloat16",
}
BUILT_CASES, CASE_PARAMS = tiered(CASES, LONG_CASES)


@pytest.fixture(scope="module")
def built() -> Built:
    return build(BUILT_CASES)


@pytest.mark.parametrize("name", CASE_PARAMS)
def test_matches_numpy(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)

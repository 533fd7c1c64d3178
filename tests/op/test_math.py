"""Elementwise math beyond the core set (``tilework.op.math``): trigonometric, hyperbolic and
parameterized activations, sign, isnan/isinf, fmod and bit shifts: inference, and kernels run
at several sym values against NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tests.op.helpers import T, infer, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, shape_at, tiered
from tilework.errors import InferenceError
from tilework.ir.sym import SymVar
from tilework.op import math as op_math

n, m = tw.dim("n"), tw.dim("m")


def test_inference() -> None:
    assert info_of(lambda x: op_math.math("atan", x), T(n, m)) == T(n, m)
    assert info_of(lambda x: op_math.math("reciprocal", x), T(n, dtype="int32")) == T(n, dtype="int32")
    with pytest.raises(InferenceError, match="tan: input must be a floating-point tensor"):
        infer(lambda x: op_math.math("tan", x), T(n, dtype="int64"))
    assert info_of(op_math.isinf, T(n)) == T(n, dtype="bool")
    assert info_of(op_math.fmod, T(n, 1), T(m)) == T(n, m)
    with pytest.raises(InferenceError, match="bitshift: expects integer tensors"):
        infer(op_math.bitshift, T(n), T(n))


_SCALAR = {
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
    "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "softplus": lambda x: np.log1p(np.exp(x)), "softsign": lambda x: x / (1 + np.abs(x)),
    "reciprocal": lambda x: 1 / x, "elu": lambda x: np.where(x < 0, np.expm1(x), x),
    "celu": lambda x: np.maximum(x, 0) + np.minimum(0, np.expm1(x)),
    "selu": lambda x: 1.0507009873554805 * np.where(x <= 0, 1.6732632423543772 * np.expm1(x), x),
    "leaky_relu": lambda x: np.where(x < 0, 0.01 * x, x), "thresholded_relu": lambda x: np.where(x > 1, x, 0),
    "hard_sigmoid": lambda x: np.clip(0.2 * x + 0.5, 0, 1), "hard_swish": lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
    "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))), "shrink": lambda x: np.where(x < -0.5, x, np.where(x > 0.5, x, 0)),
    "sign": np.sign, "log1p": np.log1p, "expm1": np.expm1, "log2": np.log2, "exp2": np.exp2, "trunc": np.trunc,
}  # fmt: skip
_DOMAIN = {"asin": (-0.99, 0.99), "acos": (-0.99, 0.99), "atanh": (-0.99, 0.99), "acosh": (1.01, 5.0), "atan": (-40.0, 40.0), "log1p": (-0.99, 3.0), "log2": (0.01, 5.0)}
ENVS = envs({n: 1, m: 3}, {n: 5, m: 7}, {n: 9, m: 2})


def _uniform(name: str) -> Any:
    lo, hi = _DOMAIN.get(name, (-3.0, 3.0))

    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.uniform(lo, hi, size=shape_at((n, m), env)).astype(np.float32)]

    return make


def _shifts(dtype: str) -> Any:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        bits = 8 if dtype == "int8" else 32
        return [rng.integers(-20, 20, size=env[n]).astype(dtype), rng.integers(-2, bits + 2, size=env[n]).astype(dtype)]

    return make


def _right_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    inside = (b >= 0) & (b < 32)
    return np.where(inside, np.right_shift(a, np.clip(b, 0, 31)), np.where(a < 0, -1, 0)).astype(a.dtype)


def _cases() -> list[Case]:
    c = [Case(f"math_{k}", lambda x, k=k: op_math.math(k, x), [T(n, m)], lambda x, f=f: f(x.astype(np.float64)).astype(np.float32), ENVS, inputs=_uniform(k), tol=2e-5) for k, f in _SCALAR.items()]
    c.append(Case("math_sign_int", lambda x: op_math.math("sign", x), [T(n, dtype="int32")], np.sign, ENVS))
    special = np.array([0.0, -1.5, np.inf, -np.inf, np.nan], np.float32)
    c.append(Case("isinf_positive", lambda x: op_math.isinf(x, detect_negative=False), [T(5)], lambda x: np.isposinf(x), ENVS[:1], inputs=lambda env, rng: [special]))
    c.append(Case("isnan", op_math.isnan, [T(5)], np.isnan, ENVS[:1], inputs=lambda env, rng: [special]))
    c.append(Case("fmod_float", op_math.fmod, [T(n, m), T(m)], lambda a, b: np.fmod(a, b), ENVS, tol=1e-5))
    c.append(Case("fmod_int", op_math.fmod, [T(n, m, dtype="int32"), T(n, m, dtype="int32")], lambda a, b: np.fmod(a, b), ENVS))
    c.append(Case("shift_left_int8", op_math.bitshift, [T(n, dtype="int8"), T(n, dtype="int8")], lambda a, b: np.where((b >= 0) & (b < 8), np.left_shift(a, np.clip(b, 0, 7)), 0).astype(np.int8), ENVS, inputs=_shifts("int8")))
    c.append(Case("shift_right_int32", lambda a, b: op_math.bitshift(a, b, "right"), [T(n, dtype="int32"), T(n, dtype="int32")], _right_ref, ENVS, inputs=_shifts("int32")))
    c.extend(_atan2_hypot_cases())
    return c


_SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.0], np.float32)


def _pairs(scale: float, dtype: str = "float32") -> Any:
    """Two inputs ``[n, m]`` and ``[m]``, some entries zero (both signs)."""

    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        a = rng.uniform(-3, 3, size=shape_at((n, m), env)) * scale
        b = rng.uniform(-3, 3, size=shape_at((m,), env)) * scale
        a.flat[::4], b.flat[::3] = 0.0, -0.0
        return [a.astype(dtype), b.astype(dtype)]

    return make


def _atan2_hypot_cases() -> list[Case]:
    grid = lambda env, rng: [_SPECIAL[:, None].copy(), _SPECIAL.copy()]  # noqa: E731  (every pair of special values)
    return [
        Case("atan2", op_math.atan2, [T(n, m), T(m)], np.arctan2, ENVS, inputs=_pairs(1.0), tol=1e-6),
        Case("atan2_float64", op_math.atan2, [T(n, m, dtype="float64"), T(m, dtype="float64")], np.arctan2, ENVS, inputs=_pairs(1e3, "float64"), tol=1e-13),
        Case("atan2_special", op_math.atan2, [T(7, 1), T(7)], np.arctan2, ENVS[:1], inputs=grid, tol=1e-6),
        # 1e30 squared is past float32 (and 1e200 past float64): the result is not
        Case("hypot", op_math.hypot, [T(n, m), T(m)], np.hypot, ENVS, inputs=_pairs(1e30), tol=1e-6),
        Case("hypot_float64", op_math.hypot, [T(n, m, dtype="float64"), T(m, dtype="float64")], np.hypot, ENVS, inputs=_pairs(1e200, "float64"), tol=1e-13),
        Case("hypot_special", op_math.hypot, [T(7, 1), T(7)], np.hypot, ENVS[:1], inputs=grid, tol=1e-6),
    ]


CASES = _cases()
BUILT_CASES, CASE_PARAMS = tiered(CASES, {})


@pytest.fixture(scope="module")
def built() -> Built:
    return build(BUILT_CASES)


@pytest.mark.parametrize("name", CASE_PARAMS)
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)

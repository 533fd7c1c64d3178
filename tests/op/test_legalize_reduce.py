"""Legalized reductions (sum, mean, max, min, prod, argmax, argmin over axes, with keepdims),
compiled to C and run at several values of their symbolic dims, against NumPy."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, run, shape_at
from tilework.ir.info import TensorInfo
from tilework.ir.sym import SymVar

n, m = tw.dim("n"), tw.dim("m")
ENVS = envs({n: 1, m: 1}, {n: 7, m: 33}, {n: 256, m: 5})


def T(*shape: Any, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(tuple(shape), dtype)


def _axis(axis: Any) -> Any:
    return tuple(axis) if isinstance(axis, list) else axis


def _reduce(name: str, axis: Any, keepdims: bool = False, dtype: str = "float32", shape: tuple = (n, m, 3), tol: float | None = None, **kw: Any) -> Case:
    ref_fn: Callable[..., Any] = getattr(np, name)

    def ref(x: np.ndarray) -> np.ndarray:
        acc = np.float64 if x.dtype.kind == "f" or str(x.dtype) == "bfloat16" else (np.int64 if x.dtype == np.bool_ else x.dtype)
        args = {"dtype": acc} if name in ("sum", "mean", "prod") else {}
        return np.asarray(ref_fn(x.astype(acc) if acc == np.float64 else x, axis=_axis(axis), keepdims=keepdims, **args))

    tag = "all" if axis is None else str(axis).replace(" ", "").replace("(", "").replace(")", "").replace(",", "_").replace("-", "m")
    return Case(
        f"{name}_{tag}{'_keep' if keepdims else ''}_{dtype}_{len(shape)}d",
        lambda x: getattr(op, name)(x, axis=axis, keepdims=keepdims),
        [T(*shape, dtype=dtype)],
        ref,
        ENVS,
        tol=tol,
        **kw,
    )


def _near_one(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
    return [(1 + 0.05 * rng.standard_normal(shape_at((n, m, 3), env))).astype(np.float32)]


def _ties(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.integers(0, 3, size=shape_at((n, m, 3), env)).astype(np.int32)]


def _arg(name: str, axis: int | None, keepdims: bool = False, dtype: str = "float32", **kw: Any) -> Case:
    f = np.argmax if name == "argmax" else np.argmin
    tag = "all" if axis is None else str(axis).replace("-", "m")
    return Case(
        f"{name}_{tag}{'_keep' if keepdims else ''}_{dtype}",
        lambda x: getattr(op, name)(x, axis=axis, keepdims=keepdims),
        [T(n, m, 3, dtype=dtype)],
        lambda x: np.asarray(f(x, axis=axis, keepdims=keepdims)),
        ENVS,
        **kw,
    )


def _cases() -> list[Case]:
    cases = []
    for name in ("sum", "mean", "max", "min"):
        for axis, keep in ((None, False), (1, False), ((0, 2), True), (-1, True), ((0, 1, 2), False)):
            cases.append(_reduce(name, axis, keep, tol=1e-4 if name in ("sum", "mean") else None))
    cases.append(_reduce("prod", 1, inputs=_near_one, tol=1e-4))
    cases.append(_reduce("prod", None, True, inputs=_near_one, tol=1e-4))
    cases.append(_reduce("sum", 1, dtype="int32"))
    cases.append(_reduce("sum", None, dtype="int64"))
    cases.append(_reduce("max", (0, 2), dtype="int32"))
    cases.append(_reduce("min", -1, True, dtype="int64"))
    cases.append(_reduce("prod", 2, dtype="int32"))
    cases.append(_reduce("sum", 1, dtype="bool"))
    cases.append(_reduce("sum", None, dtype="bool"))
    cases.append(_reduce("max", 0, dtype="bool"))
    for dt in ("float16", "bfloat16"):
        cases.append(_reduce("sum", -1, dtype=dt))
        cases.append(_reduce("mean", (1, 2), dtype=dt))
        cases.append(_reduce("max", 1, dtype=dt))
    cases.append(_reduce("sum", None, shape=()))
    cases.append(_reduce("mean", 0, True, shape=(n,)))
    for name in ("argmax", "argmin"):
        for axis, keep in ((None, False), (1, False), (-1, True), (0, False)):
            cases.append(_arg(name, axis, keep))
        cases.append(_arg(name, 1, dtype="int32", inputs=_ties))
        cases.append(_arg(name, None, dtype="int32", inputs=_ties))
        cases.append(_arg(name, 2, dtype="float16"))
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_numpy(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


def test_nan_propagates(built: Built) -> None:
    """max propagates NaN and argmax points at the first NaN, as NumPy does."""
    env = {n: 4, m: 3}
    for name, ref in (("max_1_float32_3d", lambda x: np.max(x, axis=1)), ("argmax_1_float32", lambda x: np.argmax(x, axis=1))):
        case = built.cases[name]
        x = np.arange(4 * 3 * 3, dtype=np.float32).reshape(4, 3, 3)
        x[1, 1, 2] = np.nan
        case.inputs = lambda env, rng, x=x: [x]
        try:
            _, (out,) = run(built, name, env)
        finally:
            case.inputs = None
        np.testing.assert_array_equal(out, ref(x))

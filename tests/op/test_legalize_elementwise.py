"""Legalized elementwise ops, compiled to C and run at several values of their symbolic dims,
against NumPy (float64 references for float math; exact for ints and bools)."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.legalize_harness import BF16, Built, Case, assert_round_trips, build, check, envs, kernel_call, random_array, shape_at
from tilework.ir.info import TensorInfo
from tilework.ir.sym import SymVar

n, m, k = tw.dim("n"), tw.dim("m"), tw.dim("k")
ENVS_NM = envs({n: 1, m: 1}, {n: 7, m: 33}, {n: 256, m: 5})


def T(*shape: Any, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(tuple(shape), dtype)


_erf = np.vectorize(math.erf)


def f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


UNARY_REF: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": lambda x: -f64(x),
    "abs": lambda x: np.abs(f64(x)),
    "exp": lambda x: np.exp(f64(x)),
    "log": lambda x: np.log(f64(x)),
    "sqrt": lambda x: np.sqrt(f64(x)),
    "rsqrt": lambda x: 1 / np.sqrt(f64(x)),
    "tanh": lambda x: np.tanh(f64(x)),
    "erf": lambda x: _erf(f64(x)),
    "sigmoid": lambda x: 1 / (1 + np.exp(-f64(x))),
    "relu": lambda x: np.maximum(f64(x), 0),
    "gelu": lambda x: 0.5 * f64(x) * (1 + _erf(f64(x) / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * f64(x) * (1 + np.tanh(math.sqrt(2 / math.pi) * (f64(x) + 0.044715 * f64(x) ** 3))),
    "silu": lambda x: f64(x) / (1 + np.exp(-f64(x))),
    "sin": lambda x: np.sin(f64(x)),
    "cos": lambda x: np.cos(f64(x)),
    "floor": lambda x: np.floor(f64(x)),
    "ceil": lambda x: np.ceil(f64(x)),
    "round": lambda x: np.round(f64(x)),
    "square": lambda x: f64(x) ** 2,
}
POSITIVE = {"log", "sqrt", "rsqrt"}


def _unary_inputs(name: str, dtype: str) -> Callable[[dict[SymVar, int], np.random.Generator], list[np.ndarray]]:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        x = rng.standard_normal(shape_at((n, m), env)) * (3 if name in ("floor", "ceil", "round") else 1)
        if name in POSITIVE:
            x = np.abs(x) + 0.1
        if name == "round":
            x.flat[: min(x.size, 4)] = [0.5, 1.5, 2.5, -0.5][: min(x.size, 4)]  # half to even
        return [x.astype(BF16 if dtype == "bfloat16" else np.dtype(dtype))]

    return make


def _unary_case(name: str, dtype: str = "float32") -> Case:
    return Case(
        f"{name}_{dtype}",
        lambda x: getattr(op, name)(x),
        [T(n, m, dtype=dtype)],
        UNARY_REF[name],
        ENVS_NM,
        inputs=_unary_inputs(name, dtype),
    )


def _halves(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
    """Floats on a coarse grid, so that comparisons see equal values."""
    return [np.round(rng.standard_normal(shape_at(s, env)) * 2).astype(np.float32) / 2 for s in ((n, m), (m,))]


def _int_pair(dtype: str, with_zero: bool = False) -> Callable[[dict[SymVar, int], np.random.Generator], list[np.ndarray]]:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        a = rng.integers(-20, 21, size=shape_at((n, m), env)).astype(dtype)
        b = rng.integers(-6, 7, size=shape_at((m,), env)).astype(dtype)
        if not with_zero:
            b[b == 0] = 5
        return [a, b]

    return make


def _int_ref(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """A NumPy integer op with division by zero giving 0 (NumPy's result, without the warning)."""

    def ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(b == 0, 0, f(a, np.where(b == 0, 1, b))).astype(a.dtype)

    return ref


def _pow_inputs(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
    a = (np.abs(rng.standard_normal(shape_at((n, m), env))) + 0.5).astype(np.float32)
    return [a, rng.standard_normal(shape_at((m,), env)).astype(np.float32)]


def _ipow_inputs(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.integers(-5, 6, size=shape_at((n, m), env)).astype(np.int64), rng.integers(0, 4, size=shape_at((m,), env)).astype(np.int64)]


def _floats(scale: float) -> Callable[[dict[SymVar, int], np.random.Generator], list[np.ndarray]]:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        return [(rng.standard_normal(shape_at((n, m), env)) * scale).astype(np.float32), (rng.standard_normal(shape_at((m,), env)) + 0.3).astype(np.float32)]

    return make


def _binary(name: str, ref: Callable[..., Any], dtype: str = "float32", **kw: Any) -> Case:
    """``name`` on ``(n, m)`` and ``(m,)``: broadcasting along a leading dim."""
    return Case(f"{name}_{dtype}", lambda a, b: getattr(op, name)(a, b), [T(n, m, dtype=dtype), T(m, dtype=dtype)], ref, ENVS_NM, **kw)


def _astype(src: str, dst: str, scale: float = 1.0) -> Case:
    def inputs(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        x = random_array(shape_at((n, m), env), src, rng)
        if src.startswith("float"):
            x = (x.astype(np.float64) * scale).astype(x.dtype)
            x.flat[0] = 0
        return [x]

    want = BF16 if dst == "bfloat16" else np.dtype(dst)
    return Case(f"astype_{src}_{dst}", lambda x: op.astype(x, dst), [T(n, m, dtype=src)], lambda x: x.astype(want), ENVS_NM, inputs=inputs, tol=0.0)


def _bool_pair(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.random(shape_at((n, m), env)) < 0.5, rng.random(shape_at((m,), env)) < 0.5]


def _cases() -> list[Case]:
    cases = [_unary_case(name) for name in UNARY_REF]
    cases += [_unary_case(name, dt) for name in ("gelu", "silu", "exp", "rsqrt", "sigmoid") for dt in ("float16", "bfloat16")]
    cases.append(Case("logical_not_bool", op.logical_not, [T(n, m, dtype="bool")], np.logical_not, ENVS_NM))
    cases.append(Case("logical_not_int32", op.logical_not, [T(n, m, dtype="int32")], np.logical_not, ENVS_NM))
    cases += [Case(f"{u}_int32", getattr(op, u), [T(n, m, dtype="int32")], getattr(np, u if u != "neg" else "negative"), ENVS_NM) for u in ("neg", "abs")]
    cases.append(Case("relu_int64", op.relu, [T(n, m, dtype="int64")], lambda x: np.maximum(x, 0), ENVS_NM))
    cases.append(Case("square_int32", op.square, [T(n, m, dtype="int32")], np.square, ENVS_NM))
    cases.append(Case("floor_int32", op.floor, [T(n, m, dtype="int32")], lambda x: x, ENVS_NM))
    cases += [Case(f"{u}_bool", getattr(op, u), [T(n, m, dtype="bool")], lambda x: x, ENVS_NM) for u in ("abs", "relu", "square")]

    arith = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide, "maximum": np.maximum, "minimum": np.minimum}
    cases += [_binary(name, lambda a, b, f=f: f(f64(a), f64(b))) for name, f in arith.items()]
    cases += [_binary(name, lambda a, b, f=f: f(a, b), dtype="float32", inputs=_floats(5.0)) for name, f in (("floor_divide", np.floor_divide), ("mod", np.mod))]
    cases.append(_binary("power", lambda a, b: f64(a) ** f64(b), inputs=_pow_inputs, tol=1e-4))
    for dt in ("float16", "bfloat16"):
        cases += [_binary(name, lambda a, b, f=f: f(f64(a), f64(b)), dtype=dt) for name, f in (("add", np.add), ("multiply", np.multiply), ("divide", np.divide))]
    for dt in ("int32", "int64"):
        cases += [_binary(name, lambda a, b, f=f: f(a, b), dtype=dt, inputs=_int_pair(dt)) for name, f in (("add", np.add), ("subtract", np.subtract), ("multiply", np.multiply), ("maximum", np.maximum), ("minimum", np.minimum))]
        cases.append(_binary("floor_divide", _int_ref(np.floor_divide), dtype=dt, inputs=_int_pair(dt, with_zero=True)))
        cases.append(_binary("mod", _int_ref(np.mod), dtype=dt, inputs=_int_pair(dt, with_zero=True)))
        cases.append(_binary("divide", _int_ref(lambda a, b: np.trunc(a / b)), dtype=dt, inputs=_int_pair(dt, with_zero=True)))
    cases.append(_binary("power", lambda a, b: a**b, dtype="int64", inputs=_ipow_inputs))

    compare = {"equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal}
    cases += [_binary(name, f, inputs=_halves) for name, f in compare.items()]
    cases += [_binary(name, f, dtype="int32", inputs=_int_pair("int32")) for name, f in compare.items()]
    cases += [_binary(name, f, dtype="bool", inputs=_bool_pair) for name, f in (("logical_and", np.logical_and), ("logical_or", np.logical_or), ("logical_xor", np.logical_xor), ("equal", np.equal))]

    # symbolic broadcasting that inference could not prove: run-time checks, every allowed value
    cases.append(Case("add_max_nm", op.add, [T(n), T(m)], lambda a, b: f64(a) + f64(b), envs({n: 1, m: 7}, {n: 33, m: 1}, {n: 256, m: 256}, {n: 1, m: 1})))
    cases.append(Case("add_static_sym", op.add, [T(2, 3), T(2, k)], lambda a, b: f64(a) + f64(b), envs({k: 1}, {k: 3})))
    cases.append(Case("add_sym_static", op.add, [T(n, k), T(1, 5)], lambda a, b: f64(a) + f64(b), envs({n: 7, k: 1}, {n: 1, k: 5})))
    # (the last param only defines n and m: a graph function's dims need a bare occurrence)
    cases.append(Case("add_compound_dims", lambda a, b, _: op.add(a, b), [T(n * 2, m + 1), T(m + 1), T(n, m)], lambda a, b, _: f64(a) + f64(b), ENVS_NM))
    cases.append(Case("add_scalar", op.add, [T(), T(n, m)], lambda a, b: f64(a) + f64(b), ENVS_NM))
    cases.append(Case("multiply_outer", op.multiply, [T(n, 1), T(1, m)], lambda a, b: f64(a) * f64(b), ENVS_NM))
    where_envs = envs({n: 1, m: 9}, {n: 33, m: 1}, {n: 256, m: 256})
    cases.append(Case("where_bcast", op.where, [T(n, dtype="bool"), T(m), T(1)], lambda c, a, b: np.where(c, a, b), where_envs))
    cases.append(Case("where_int32", op.where, [T(n, m, dtype="bool"), T(n, 1, dtype="int32"), T(m, dtype="int32")], np.where, ENVS_NM))
    cases.append(Case("where_bool", op.where, [T(n, m, dtype="bool"), T(n, m, dtype="bool"), T(m, dtype="bool")], np.where, ENVS_NM))

    cases += [
        _astype("float32", "int32", 10.0),
        _astype("float32", "int64", 10.0),
        _astype("int32", "float32"),
        _astype("float32", "bool"),
        _astype("int32", "bool"),
        _astype("bool", "float32"),
        _astype("float32", "float16"),
        _astype("float32", "bfloat16"),
        _astype("float16", "float32"),
        _astype("bfloat16", "float32"),
        _astype("int64", "int32"),
        _astype("float32", "float64"),
    ]
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


def test_broadcast_checks_become_asserts(built: Built) -> None:
    """The unprovable broadcast is kept as an assert_dims right before the kernel call."""
    func = built.module["add_max_nm"]
    _, asserts = kernel_call(func)  # type: ignore[arg-type]
    assert [c[0] for a in asserts for c in a.attrs["checks"]] == ["broadcast"]
    _, asserts = kernel_call(built.module["multiply_outer"])  # type: ignore[arg-type]
    assert asserts == []


def test_compound_dims_pass_sym_params(built: Built) -> None:
    """A var that no kernel buffer has as a bare dim is passed as a sym arg: the caller's var."""
    call, _ = kernel_call(built.module["add_compound_dims"])  # type: ignore[arg-type]
    assert len(call.args) == 3 and call.args[2].values == (n, m)  # type: ignore[attr-defined]


def test_neg_of_bool_is_refused() -> None:
    from tilework.errors import UnsupportedError
    from tilework.ir.builder import BlockBuilder
    from tilework.ir.graph import Var
    from tilework.transform.legalize import Legalize

    x = Var("x", T(n, dtype="bool"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(op.neg(x)))
    with pytest.raises(UnsupportedError, match="neg of a bool tensor is undefined"):
        Legalize()(bb.get())

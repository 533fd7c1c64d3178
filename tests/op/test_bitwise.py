"""Bitwise ops and ``bitcast`` (``tilework.op.bitwise``): inference, kernels at symbolic shapes
(sizes 0, 1 and odd ones) against NumPy, on the C target and the interpreter."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
from tests.op.helpers import T, infer, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, kernel_call, shape_at
from tilework.codegen import interp
from tilework.errors import InferenceError
from tilework.ir.dtype import np_dtype
from tilework.ir.sym import SymVar
from tilework.op import bitwise as bw

n, m = tw.dim("n", min=0), tw.dim("m")
ENVS = envs({n: 0, m: 3}, {n: 1, m: 1}, {n: 5, m: 7}, {n: 3, m: 2})
DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")


def test_inference() -> None:
    assert info_of(bw.bitwise_and, T(n, 1, dtype="int32"), T(m, dtype="int32")) == T(n, m, dtype="int32")
    assert info_of(bw.bitwise_not, T(n, dtype="uint8")) == T(n, dtype="uint8")
    assert info_of(bw.bitwise_xor, T(n, dtype="bool"), T(n, dtype="bool")) == T(n, dtype="bool")
    assert info_of(lambda x: bw.bitcast(x, "int32"), T(n, m)) == T(n, m, dtype="int32")
    with pytest.raises(InferenceError, match="bitwise_or: expects integer or bool tensors, got float32"):
        infer(bw.bitwise_or, T(n), T(n))
    with pytest.raises(InferenceError, match="bitcast: cannot reinterpret float32 .4 bytes. as int64 .8 bytes."):
        infer(lambda x: bw.bitcast(x, "int64"), T(n))


def _full_range(*dtypes: str) -> Callable[[dict[SymVar, int], np.random.Generator], list[np.ndarray]]:
    """Integers over the whole range of each dtype (high bits and signs included)."""

    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        shapes = [(env[n], env[m]), (env[m],)]
        out = []
        for dt, shape in zip(dtypes, shapes):
            raw = rng.integers(0, 2**63, size=shape, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, size=shape, dtype=np.uint64)
            out.append(raw.astype(np.dtype(dt)))
        return out

    return make


def _floats(dtype: str) -> Callable[[dict[SymVar, int], np.random.Generator], list[np.ndarray]]:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        x = rng.standard_normal(shape_at((n, m), env)) * 1e3
        flat = x.reshape(-1)
        flat[: min(3, flat.size)] = [np.inf, -0.0, np.nan][: min(3, flat.size)]
        return [x.astype(np_dtype(dtype))]

    return make


_BIN: dict[str, Callable[[Any, Any], Any]] = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor}
_OPS: dict[str, Callable[..., Any]] = {"bitwise_and": bw.bitwise_and, "bitwise_or": bw.bitwise_or, "bitwise_xor": bw.bitwise_xor}
_BITCASTS = (("float32", "int32"), ("int32", "float32"), ("float64", "int64"), ("uint64", "float64"), ("uint32", "int32"), ("int8", "uint8"),
             ("float16", "int16"), ("uint16", "float16"), ("bfloat16", "uint16"), ("float16", "bfloat16"), ("bool", "uint8"))  # fmt: skip


def _view(src: str, dst: str) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: x.astype(np_dtype(src)).view(np_dtype(dst))


def _cases() -> list[Case]:
    c = []
    for k, dt in enumerate(DTYPES):
        name = list(_BIN)[k % 3]
        c.append(Case(f"{name}_{dt}", _OPS[name], [T(n, m, dtype=dt), T(m, dtype=dt)], _BIN[name], ENVS, inputs=_full_range(dt, dt)))
        c.append(Case(f"bitwise_not_{dt}", bw.bitwise_not, [T(n, m, dtype=dt)], np.invert, ENVS, inputs=_full_range(dt)))
    c.append(Case("bitwise_and_bool", bw.bitwise_and, [T(n, m, dtype="bool"), T(m, dtype="bool")], np.logical_and, ENVS))
    c.append(Case("bitwise_xor_bool", bw.bitwise_xor, [T(n, m, dtype="bool"), T(m, dtype="bool")], np.logical_xor, ENVS))
    c.append(Case("bitwise_or_bool", bw.bitwise_or, [T(n, m, dtype="bool"), T(m, dtype="bool")], np.logical_or, ENVS))
    c.append(Case("bitwise_not_bool", bw.bitwise_not, [T(n, m, dtype="bool")], np.logical_not, ENVS))
    for src, dst in _BITCASTS:
        make = _floats(src) if src.startswith(("float", "bfloat")) else (_full_range(src) if src != "bool" else None)
        c.append(Case(f"bitcast_{src}_{dst}", lambda x, dst=dst: bw.bitcast(x, dst), [T(n, m, dtype=src)], _view(src, dst), ENVS, inputs=make))
    return c


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


@pytest.mark.parametrize("name", ["bitwise_and_int64", "bitwise_xor_uint32", "bitwise_not_uint8", "bitwise_and_bool", "bitcast_float32_int32", "bitcast_float16_bfloat16", "bitcast_bool_uint8", "bitcast_uint64_float64"])
def test_interpreter_agrees(built: Built, name: str) -> None:
    """The NumPy interpreter computes the same bits as the C kernel."""

    case = built.cases[name]
    func = built.module[name]
    call, _ = kernel_call(func)  # type: ignore[arg-type]
    kernel = built.module[call.args[0].name]  # type: ignore[attr-defined]
    for k, env in enumerate(ENVS):
        rng = np.random.default_rng(k)
        inputs = case.inputs(env, rng) if case.inputs is not None else [np.asarray(rng.random(shape_at(i.shape, env)) < 0.5) for i in case.infos]  # type: ignore[arg-type]
        want = np.asarray(case.ref(*inputs))
        got = np.zeros(want.shape, want.dtype)
        interp.run(kernel, [*inputs, got])  # type: ignore[arg-type]
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"{name} at {env}")

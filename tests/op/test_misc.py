"""The ONNX frontend's miscellaneous ops (``tilework.op.misc``): shapes as tensors and back,
unary math and activations, isnan/isinf, fmod, bit shifts, one_hot, hardmax, eye_like and
logsumexp: inference, and kernels run at several sym values against NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, infer, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, shape_at
from tilework.errors import InferenceError, ShapeError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import ShapeInfo, TensorInfo
from tilework.ir.sym import SymVar

n, m = tw.dim("n"), tw.dim("m")
misc = op.misc


def test_inference() -> None:
    assert info_of(lambda x: misc.math("atan", x), T(n, m)) == T(n, m)
    assert info_of(lambda x: misc.math("reciprocal", x), T(n, dtype="int32")) == T(n, dtype="int32")
    with pytest.raises(InferenceError, match="tan: input must be a floating-point tensor"):
        infer(lambda x: misc.math("tan", x), T(n, dtype="int64"))
    assert info_of(misc.isinf, T(n)) == T(n, dtype="bool")
    assert info_of(misc.fmod, T(n, 1), T(m)) == T(n, m)
    with pytest.raises(InferenceError, match="bitshift: expects integer tensors"):
        infer(misc.bitshift, T(n), T(n))
    assert info_of(lambda i, v: misc.one_hot(i, v, 10, 1), T(n, m, dtype="int64"), T(2)) == T(n, 10, m)
    assert info_of(lambda i, v: misc.one_hot(i, v, n), T(m, dtype="int32"), T(2, dtype="int64")) == T(m, n, dtype="int64")
    with pytest.raises(ShapeError, match=r"values must have shape \(2,\)"):
        infer(lambda i, v: misc.one_hot(i, v, 3), T(m, dtype="int32"), T(3))
    assert info_of(lambda x: misc.eye_like(x, 1, "int32"), T(n, m)) == T(n, m, dtype="int32")
    assert info_of(lambda x: misc.logsumexp(x, 1, True), T(n, m)) == T(n, 1)
    assert info_of(misc.hardmax, R(3)) == R(3)
    assert info_of(lambda x: misc.shape_to_tensor((n, 4, m * 2)), T(1)) == T(3, dtype="int64")
    assert info_of(misc.tensor_to_shape, T(3, dtype="int64")) == ShapeInfo(None, 3)
    with pytest.raises(InferenceError, match="static length"):
        infer(misc.tensor_to_shape, T(n, dtype="int64"))


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
    "sign": np.sign,
}  # fmt: skip
_DOMAIN = {"asin": (-0.99, 0.99), "acos": (-0.99, 0.99), "atanh": (-0.99, 0.99), "acosh": (1.01, 5.0), "atan": (-40.0, 40.0)}
ENVS = envs({n: 1, m: 3}, {n: 5, m: 7}, {n: 9, m: 2})


def _uniform(name: str) -> Any:
    lo, hi = _DOMAIN.get(name, (-3.0, 3.0))

    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.uniform(lo, hi, size=shape_at((n, m), env)).astype(np.float32)]

    return make


def _cases() -> list[Case]:
    c = [Case(f"math_{k}", lambda x, k=k: misc.math(k, x), [T(n, m)], lambda x, f=f: f(x.astype(np.float64)).astype(np.float32), ENVS, inputs=_uniform(k), tol=2e-5) for k, f in _SCALAR.items()]  # type: ignore[arg-type]
    c.append(Case("math_sign_int", lambda x: misc.math("sign", x), [T(n, dtype="int32")], np.sign, ENVS))
    special = np.array([0.0, -1.5, np.inf, -np.inf, np.nan], np.float32)
    c.append(Case("isinf_positive", lambda x: misc.isinf(x, detect_negative=False), [T(5)], lambda x: np.isposinf(x), ENVS[:1], inputs=lambda env, rng: [special]))
    c.append(Case("isnan", misc.isnan, [T(5)], np.isnan, ENVS[:1], inputs=lambda env, rng: [special]))
    c.append(Case("fmod_float", misc.fmod, [T(n, m), T(m)], lambda a, b: np.fmod(a, b), ENVS, tol=1e-5))
    c.append(Case("fmod_int", misc.fmod, [T(n, m, dtype="int32"), T(n, m, dtype="int32")], lambda a, b: np.fmod(a, b), ENVS))
    c.append(Case("shift_left_int8", misc.bitshift, [T(n, dtype="int8"), T(n, dtype="int8")], lambda a, b: np.where((b >= 0) & (b < 8), np.left_shift(a, np.clip(b, 0, 7)), 0).astype(np.int8), ENVS, inputs=_shifts("int8")))
    c.append(Case("shift_right_int32", lambda a, b: misc.bitshift(a, b, "right"), [T(n, dtype="int32"), T(n, dtype="int32")], _right_ref, ENVS, inputs=_shifts("int32")))
    c.append(Case("one_hot_axis1", lambda i, v: misc.one_hot(i, v, 5, 1), [T(n, m, dtype="int64"), T(2)], lambda i, v: _one_hot_ref(i, v, 5, 1), ENVS, inputs=lambda env, rng: [rng.integers(-6, 6, size=shape_at((n, m), env)), np.array([-1.0, 3.0], np.float32)]))
    c.append(Case("hardmax_axis0", lambda x: misc.hardmax(x, 0), [T(n, m)], lambda x: (np.arange(x.shape[0])[:, None] == np.argmax(x, 0)[None, :]).astype(np.float32), ENVS))
    c.append(Case("eye_like_k1", lambda x: misc.eye_like(x, 1, "int64"), [T(n, m)], lambda x: np.eye(x.shape[0], x.shape[1], 1, dtype=np.int64), ENVS))
    c += [
    Case("cumprod_axis1", lambda x: misc.cumprod(x, 1), [T(n, m)], lambda x: np.cumprod(x.astype(np.float64), 1).astype(np.float32), ENVS, inputs=lambda env, rng: [rng.uniform(0.5, 1.5, size=(env[n], env[m])).astype(np.float32)], tol=1e-5),
    Case("cumprod_exclusive_reverse_int", lambda x: misc.cumprod(x, 0, exclusive=True, reverse=True), [T(n, 2, dtype="int64")], lambda x: np.flip(np.cumprod(np.flip(np.concatenate([x[1:], np.ones((1, 2), np.int64)]), 0), 0), 0), ENVS),
    Case("einsum_batch_matmul", lambda a, b: misc.einsum("bij,bjk->bik", a, b), [T(2, n, m), T(2, m, 3)], lambda a, b: np.einsum("bij,bjk->bik", a, b), ENVS, tol=1e-5),
    Case("einsum_ellipsis_diagonal", lambda a: misc.einsum("...ii->...i", a), [T(n, 3, 3)], lambda a: np.einsum("...ii->...i", a), ENVS),
    Case("einsum_implicit_outer", lambda a, b: misc.einsum("i,j", a, b), [T(n), T(m)], lambda a, b: np.einsum("i,j", a, b), ENVS),
    Case("einsum_broadcast_one", lambda a, b: misc.einsum("ij,ij->i", a, b), [T(n, 1), T(n, m)], lambda a, b: np.einsum("ij,ij->i", np.broadcast_to(a, b.shape), b), ENVS, tol=1e-5),
    ]
    c.append(Case("shape_to_tensor", lambda x: misc.shape_to_tensor((n, 4, m * 2)), [T(n, m)], lambda x: np.array([x.shape[0], 4, 2 * x.shape[1]], np.int64), ENVS))
    c.append(Case("logsumexp_axis1_keep", lambda x: misc.logsumexp(x, 1, True), [T(n, m)], lambda x: np.log(np.sum(np.exp(x.astype(np.float64)), 1, keepdims=True)).astype(np.float32), ENVS))
    c.append(Case("logsumexp_large", lambda x: misc.logsumexp(x), [T(n, m)], lambda x: np.float32(np.max(x) + np.log(np.sum(np.exp(x - np.max(x))))), ENVS, inputs=lambda env, rng: [(rng.standard_normal(shape_at((n, m), env)) * 50 + 200).astype(np.float32)], tol=1e-5))
    return c


def _shifts(dtype: str) -> Any:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        bits = 8 if dtype == "int8" else 32
        return [rng.integers(-20, 20, size=env[n]).astype(dtype), rng.integers(-2, bits + 2, size=env[n]).astype(dtype)]

    return make


def _right_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    inside = (b >= 0) & (b < 32)
    return np.where(inside, np.right_shift(a, np.clip(b, 0, 31)), np.where(a < 0, -1, 0)).astype(a.dtype)


def _one_hot_ref(idx: np.ndarray, values: np.ndarray, depth: int, axis: int) -> np.ndarray:
    norm = np.where(idx < 0, idx + depth, idx)
    hot = np.expand_dims(norm, axis) == np.arange(depth).reshape([depth if k == axis else 1 for k in range(idx.ndim + 1)])
    return np.where(hot, values[1], values[0]).astype(values.dtype)


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


def test_shapes_to_tensors_and_back_at_run_time() -> None:
    """shape_to_tensor of symbolic dims, and tensor_to_shape + match_cast lifting a tensor's
    values into fresh dims that shape a later op, compiled once."""
    a, b = SymVar("a", 1), SymVar("b", 1)
    x = Var("x", TensorInfo((n, m), "float32"))
    t = Var("t", TensorInfo((2,), "int64"))
    bb = BlockBuilder()
    with bb.function("main", [x, t]):
        with bb.dataflow():
            dims = bb.emit(misc.shape_to_tensor((n, m * 2)))
            s = bb.emit(misc.tensor_to_shape(t))
            s2 = bb.match_cast(s, ShapeInfo((a, b)))
            y = bb.emit(op.reshape(x, s2))
            out = bb.emit_output(op.concat([dims, bb.emit(misc.shape_to_tensor(s2))]))
            yo = bb.emit_output(y)
        bb.emit_func_output([out, yo])
    fn = tw.VM(tw.build(bb.get()))["main"]
    xs = np.arange(12, dtype=np.float32).reshape(3, 4)
    d, y = fn(xs, np.array([2, 6], np.int64))
    np.testing.assert_array_equal(d, [3, 8, 2, 6])
    np.testing.assert_array_equal(y, xs.reshape(2, 6))
    d, y = fn(xs[:2], np.array([8, 1], np.int64))
    np.testing.assert_array_equal(d, [2, 8, 8, 1])
    assert y.shape == (8, 1)


def test_einsum_inference_and_parsing() -> None:
    assert misc.parse_einsum("bij, bjk -> bik", [3, 3]) == (["bij", "bjk"], "bik")
    assert misc.parse_einsum("...ii", [4]) == (["YZii"], "YZ")
    assert info_of(lambda a, b: misc.einsum("ij,jk", a, b), T(n, 4), T(4, m)) == T(n, m)
    with pytest.raises(InferenceError, match="do not match an operand of rank 2"):
        infer(lambda a: misc.einsum("ijk->i", a), T(n, m))
    with pytest.raises(ShapeError, match="dims labelled 'j'"):
        infer(lambda a, b: misc.einsum("ij,jk", a, b), T(n, 4), T(5, m))

"""batch_norm (inference) and group_norm: symbolic inference, and legalized kernels compiled to C
and run at several values of their symbolic dims against float64 NumPy references (checked
against torch where torch is installed)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, holds, infer, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, random_array, shape_at
from tilework.errors import InferenceError, ShapeError
from tilework.ir.sym import SymVar

n, c, h, w = tw.dim("n"), tw.dim("c"), tw.dim("h"), tw.dim("w")


def test_batch_norm_inference() -> None:
    p = T(8)
    assert info_of(op.batch_norm, T(n, 8, h, w), p, p, p, p) == T(n, 8, h, w)
    assert info_of(lambda x, m, v, g, b: op.batch_norm(x, m, v, g, b, axis=-1), T(n, h, 8), p, p, p, p) == T(n, h, 8)
    assert info_of(op.batch_norm, R(), p, p, p, p) == R()
    info, checks = infer(op.batch_norm, T(n, c), T(8), T(8), T(8), T(8))
    assert info == T(n, c) and holds(checks, {n: 2, c: 8}) and not holds(checks, {n: 2, c: 7})
    with pytest.raises(ShapeError, match=r"batch_norm: var \(7,\) does not match the channels of input \(n, 8\)"):
        infer(op.batch_norm, T(n, 8), T(8), T(7), T(8), T(8))
    with pytest.raises(ShapeError, match=r"batch_norm: gamma must be 1-D"):
        infer(op.batch_norm, T(n, 8), T(8), T(8), T(1, 8), T(8))
    with pytest.raises(InferenceError, match="batch_norm: input must be a floating-point tensor"):
        infer(op.batch_norm, T(n, 8, dtype="int32"), T(8), T(8), T(8), T(8))


def test_group_norm_inference() -> None:
    assert info_of(lambda x, g, b: op.group_norm(x, g, b, 4), T(n, 8, h, w), T(8), T(8)) == T(n, 8, h, w)
    info, checks = infer(lambda x, g, b: op.group_norm(x, g, b, 4), T(n, c, h), T(c), T(c))
    assert info == T(n, c, h) and [k.kind for k in checks] == ["divides"]
    assert holds(checks, {n: 1, c: 8, h: 1}) and not holds(checks, {n: 1, c: 6, h: 1})
    with pytest.raises(ShapeError, match=r"group_norm: channels 6 of input \(n, 6\) do not split into 4 groups"):
        infer(lambda x, g, b: op.group_norm(x, g, b, 4), T(n, 6), T(6), T(6))
    with pytest.raises(InferenceError, match="group_norm: num_groups must be >= 1"):
        infer(lambda x, g, b: op.group_norm(x, g, b, 0), T(n, 6), T(6), T(6))


def batch_norm_ref(x: np.ndarray, mean: np.ndarray, var: np.ndarray, g: np.ndarray, b: np.ndarray, axis: int = 1, eps: float = 1e-5) -> np.ndarray:
    shape = [1] * x.ndim
    shape[axis] = -1

    def p(a: np.ndarray) -> np.ndarray:
        return a.astype(np.float64).reshape(shape)

    return (x.astype(np.float64) - p(mean)) / np.sqrt(p(var) + eps) * p(g) + p(b)


def group_norm_ref(x: np.ndarray, g: np.ndarray, b: np.ndarray, groups: int, eps: float = 1e-5) -> np.ndarray:
    x = x.astype(np.float64)
    xs = x.reshape(x.shape[0], groups, -1)
    mu = xs.mean(axis=2, keepdims=True)
    var = ((xs - mu) ** 2).mean(axis=2, keepdims=True)
    y = ((xs - mu) / np.sqrt(var + eps)).reshape(x.shape)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return y * g.astype(np.float64).reshape(shape) + b.astype(np.float64).reshape(shape)


def _bn_inputs(shape: tuple, channels: int, dtype: str = "float32") -> Callable[[dict[SymVar, int], np.random.Generator], list[np.ndarray]]:
    """Random inputs with a positive running variance."""

    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        x = random_array(shape_at(shape, env), dtype, rng)
        mean, g, b = (random_array((channels,), dtype, rng) for _ in range(3))
        var = (rng.random(channels) + 0.5).astype(x.dtype)
        return [x, mean, var, g, b]

    return make


ENVS = envs({n: 1, h: 1, w: 1}, {n: 2, h: 7, w: 5}, {n: 3, h: 16, w: 9})


def _cases() -> list[Case]:
    p8, p6 = T(8), T(6)
    return [
        Case("batch_norm_nchw", op.batch_norm, [T(n, 8, h, w), p8, p8, p8, p8], batch_norm_ref, ENVS, inputs=_bn_inputs((n, 8, h, w), 8), tol=1e-4),
        Case("batch_norm_last_axis", lambda x, m, v, g, b: op.batch_norm(x, m, v, g, b, axis=-1, eps=1e-3), [T(n, h, 6), p6, p6, p6, p6], lambda x, m, v, g, b: batch_norm_ref(x, m, v, g, b, axis=2, eps=1e-3), ENVS, inputs=_bn_inputs((n, h, 6), 6), tol=1e-4),
        Case("batch_norm_float16", op.batch_norm, [T(n, 6, w, dtype="float16")] + [T(6, dtype="float16")] * 4, batch_norm_ref, ENVS, inputs=_bn_inputs((n, 6, w), 6, "float16"), tol=5e-3),
        Case("group_norm_4d", lambda x, g, b: op.group_norm(x, g, b, 4), [T(n, 8, h, w), p8, p8], lambda x, g, b: group_norm_ref(x, g, b, 4), ENVS, tol=1e-4),
        Case("group_norm_3d_one_group", lambda x, g, b: op.group_norm(x, g, b, 1, eps=1e-3), [T(n, 6, w), p6, p6], lambda x, g, b: group_norm_ref(x, g, b, 1, 1e-3), ENVS, tol=1e-4),
        Case("group_norm_2d_per_channel", lambda x, g, b: op.group_norm(x, g, b, 6), [T(n, 6, h), p6, p6], lambda x, g, b: group_norm_ref(x, g, b, 6), envs({n: 1, h: 2}, {n: 4, h: 33}), tol=1e-4),
        Case("group_norm_bfloat16", lambda x, g, b: op.group_norm(x, g, b, 2), [T(n, 4, w, dtype="bfloat16"), T(4, dtype="bfloat16"), T(4, dtype="bfloat16")], lambda x, g, b: group_norm_ref(x, g, b, 2), ENVS, tol=3e-2),
    ]


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [k.name for k in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


def test_references_match_torch() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra; the NumPy references are checked against it when present")
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 5, 3))
    mean, g, b = (rng.standard_normal(6) for _ in range(3))
    var = rng.random(6) + 0.5
    t = torch.from_numpy
    np.testing.assert_allclose(batch_norm_ref(x, mean, var, g, b, eps=1e-3), F.batch_norm(t(x), t(mean), t(var), t(g), t(b), False, 0.1, 1e-3).numpy(), atol=1e-10)
    np.testing.assert_allclose(group_norm_ref(x, g, b, 3), F.group_norm(t(x), 3, t(g), t(b)).numpy(), atol=1e-10)


def test_batch_norm_takes_one_rsqrt_a_channel(built: Built) -> None:
    """The scale ``rsqrt(var + eps) * gamma`` is a stage of its own, ``[C]``: channel-last data
    (the channel innermost) would otherwise take an rsqrt per element."""
    from tilework.ir.loop import Intrin, stmt_scalars, walk_scalars
    from tilework.schedule.tree import blocks_of

    funcs = dict(built.module.tensor_funcs())
    f = next(f for name, f in funcs.items() if "batch_norm" in name and f.params[0].shape[-1] == 6)  # type: ignore[union-attr]
    with_rsqrt = [b for b in blocks_of(f) if any(isinstance(e, Intrin) and e.name == "rsqrt" for s in [b.body] for x in stmt_scalars(s) for e in walk_scalars(x))]
    assert [len(b.iter_vars) for b in with_rsqrt] == [1]

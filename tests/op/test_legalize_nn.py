"""Legalized nn ops (softmax, log_softmax, layer_norm, rms_norm, attention with causal masks,
grouped KV heads and bool/float masks), compiled to C and run at several values of their
symbolic dims, against float64 NumPy references (the attention reference is checked against
torch where torch is installed).

Only in the long tier (each kernel's module is built without them otherwise): softmax's
bfloat16 and log_softmax's float16 and axis-0 cases (the other op's cases of that dtype and
axis run), layer_norm's bfloat16 and rms_norm's float16 (each keeps its other low-precision
case), and the attention cases but ``plain`` and ``bool_mask``: ``op.attention`` legalizes to
the hand-built kernel, whose causal, grouped, scaled, masked, symbolic-head-dim, more-queries
and bfloat16 cases ``test_attention_kernel`` runs through the same legalization."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, random_array, run, shape_at, tiered
from tilework.ir.info import TensorInfo
from tilework.ir.sym import SymVar

n, m, b, s, kv, d = tw.dim("n"), tw.dim("m"), tw.dim("b"), tw.dim("s"), tw.dim("kv"), tw.dim("d")
ENVS = envs({n: 1, m: 1, b: 1}, {n: 7, m: 33, b: 3}, {n: 256, m: 5, b: 2})


def T(*shape: Any, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(tuple(shape), dtype)


def f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def softmax_ref(x: np.ndarray, axis: int, log: bool = False) -> np.ndarray:
    x = f64(x)
    z = x - x.max(axis=axis, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=axis, keepdims=True))
    return z - lse if log else np.exp(z - lse)


def layer_norm_ref(x: np.ndarray, g: np.ndarray, beta: np.ndarray, axes: tuple[int, ...], eps: float = 1e-5) -> np.ndarray:
    x = f64(x)
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * _param(g, x.ndim, axes) + _param(beta, x.ndim, axes)


def rms_norm_ref(x: np.ndarray, w: np.ndarray, axes: tuple[int, ...], eps: float = 1e-6) -> np.ndarray:
    x = f64(x)
    return x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps) * _param(w, x.ndim, axes)


def _param(p: np.ndarray, ndim: int, axes: tuple[int, ...]) -> np.ndarray:
    """A norm parameter over ``axes`` (in that order) placed to broadcast against the input."""
    order = sorted(range(len(axes)), key=lambda i: axes[i])
    shape = [1] * ndim
    q = np.transpose(f64(p), order)
    for a, size in zip(sorted(axes), q.shape):
        shape[a] = size
    return q.reshape(shape)


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, causal: bool = False, scale: float | None = None) -> np.ndarray:
    """Attention in float64; a query that sees no key gets zeros (tilework's convention)."""
    q, k, v = f64(q), f64(k), f64(v)
    nb, sq, nh, hd = q.shape
    skv, nkv = k.shape[1], k.shape[2]
    k = np.repeat(k, nh // nkv, axis=2)
    v = np.repeat(v, nh // nkv, axis=2)
    scores = np.einsum("bihd,bjhd->bhij", q, k) * (1 / math.sqrt(hd) if scale is None else scale)
    visible = np.ones(scores.shape, dtype=bool)
    if mask is not None and mask.dtype == np.bool_:
        visible &= np.broadcast_to(mask, scores.shape)
    elif mask is not None:
        scores = scores + f64(mask)
    if causal:
        i = np.arange(sq)[:, None]
        j = np.arange(skv)[None, :]
        visible &= j <= i + skv - sq
    scores = np.where(visible, scores, -np.inf)
    mx = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    with np.errstate(invalid="ignore"):
        w = np.where(visible & (mx > -np.inf), np.exp(scores - mx), 0.0)
    total = w.sum(axis=-1, keepdims=True)
    out = np.einsum("bhij,bjhd->bihd", w, v)
    safe = np.where(total > 0, total, 1.0)
    return np.where(np.transpose(total, (0, 2, 1, 3)) > 0, out / np.transpose(safe, (0, 2, 1, 3)), 0.0)


def _scaled(scale: float) -> Callable[[dict[SymVar, int], np.random.Generator], list[np.ndarray]]:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        return [(rng.standard_normal(shape_at((b, n, m), env)) * scale).astype(np.float32)]

    return make


def _softmax_cases() -> list[Case]:
    cases = []
    for log in (False, True):
        name = "log_softmax" if log else "softmax"
        f = op.log_softmax if log else op.softmax
        cases += [
            Case(f"{name}_last", lambda x, f=f: f(x), [T(n, m)], lambda x, log=log: softmax_ref(x, -1, log), ENVS),
            Case(f"{name}_axis0", lambda x, f=f: f(x, 0), [T(n, m)], lambda x, log=log: softmax_ref(x, 0, log), ENVS),
            Case(f"{name}_middle_large", lambda x, f=f: f(x, 1), [T(b, n, m)], lambda x, log=log: softmax_ref(x, 1, log), ENVS, inputs=_scaled(300.0), tol=1e-4),
            Case(f"{name}_float16", lambda x, f=f: f(x), [T(b, n, m, dtype="float16")], lambda x, log=log: softmax_ref(x, -1, log), ENVS, tol=4e-3),
            Case(f"{name}_bfloat16", lambda x, f=f: f(x), [T(n, m, dtype="bfloat16")], lambda x, log=log: softmax_ref(x, -1, log), ENVS, tol=3e-2),
        ]
    return cases


def _norm_cases() -> list[Case]:
    cases = [
        Case("layer_norm_last", op.layer_norm, [T(b, n, 16), T(16), T(16)], lambda x, g, bb: layer_norm_ref(x, g, bb, (2,)), ENVS, tol=1e-4),
        Case("layer_norm_sym_width", op.layer_norm, [T(n, m), T(m), T(m)], lambda x, g, bb: layer_norm_ref(x, g, bb, (1,)), ENVS, tol=1e-4),
        Case("layer_norm_two_axes", lambda x, g, bb: op.layer_norm(x, g, bb, axes=(1, 2)), [T(b, n, 4), T(n, 4), T(n, 4)], lambda x, g, bb: layer_norm_ref(x, g, bb, (1, 2)), ENVS, tol=1e-4),
        Case("layer_norm_leading_axis", lambda x, g, bb: op.layer_norm(x, g, bb, axes=0, eps=1e-3), [T(n, m), T(n), T(n)], lambda x, g, bb: layer_norm_ref(x, g, bb, (0,), 1e-3), ENVS, tol=1e-4),
        Case("layer_norm_float16", op.layer_norm, [T(b, n, 64, dtype="float16"), T(64, dtype="float16"), T(64, dtype="float16")], lambda x, g, bb: layer_norm_ref(x, g, bb, (2,)), ENVS, tol=4e-3),
        Case("layer_norm_bfloat16", op.layer_norm, [T(n, m, dtype="bfloat16"), T(m, dtype="bfloat16"), T(m, dtype="bfloat16")], lambda x, g, bb: layer_norm_ref(x, g, bb, (1,)), ENVS, tol=3e-2),
        Case("rms_norm_last", op.rms_norm, [T(b, n, 16), T(16)], lambda x, w: rms_norm_ref(x, w, (2,)), ENVS, tol=1e-4),
        Case("rms_norm_sym_width", op.rms_norm, [T(n, m), T(m)], lambda x, w: rms_norm_ref(x, w, (1,)), ENVS, tol=1e-4),
        Case("rms_norm_two_axes", lambda x, w: op.rms_norm(x, w, axes=(2, 1), eps=1e-2), [T(b, n, 4), T(4, n)], lambda x, w: rms_norm_ref(x, w, (2, 1), 1e-2), ENVS, tol=1e-4),
        Case("rms_norm_float16", op.rms_norm, [T(b, n, 64, dtype="float16"), T(64, dtype="float16")], lambda x, w: rms_norm_ref(x, w, (2,)), ENVS, tol=4e-3),
        Case("rms_norm_bfloat16", op.rms_norm, [T(n, m, dtype="bfloat16"), T(m, dtype="bfloat16")], lambda x, w: rms_norm_ref(x, w, (1,)), ENVS, tol=3e-2),
    ]
    return cases


ATT_ENVS = envs({b: 1, s: 1, kv: 1}, {b: 2, s: 7, kv: 33}, {b: 1, s: 33, kv: 33}, {b: 1, s: 1, kv: 256})


def _attention(name: str, infos: list[TensorInfo], mask: bool = False, env_list: Any = ATT_ENVS, tol: float | None = 1e-4, **attrs: Any) -> Case:
    def make(*args: Any) -> Any:
        return op.attention(args[0], args[1], args[2], mask=args[3] if mask else None, **attrs)

    def ref(*arrays: np.ndarray) -> np.ndarray:
        return attention_ref(arrays[0], arrays[1], arrays[2], mask=arrays[3] if mask else None, **attrs)

    return Case(f"attention_{name}", make, infos, ref, env_list, tol=tol)


def _attention_cases() -> list[Case]:
    q, kk = T(b, s, 4, 8), T(b, kv, 4, 8)
    gq, gkv = T(b, s, 4, 8), T(b, kv, 2, 8)
    return [
        _attention("plain", [q, kk, kk]),
        _attention("causal", [q, kk, kk], causal=True),
        _attention("gqa_causal", [gq, gkv, gkv], causal=True),
        _attention("mqa_scale", [gq, T(b, kv, 1, 8), T(b, kv, 1, 5)], scale=0.3),
        _attention("bool_mask", [gq, gkv, gkv, T(b, 1, s, kv, dtype="bool")], mask=True),
        _attention("float_mask_causal", [q, kk, kk, T(s, kv)], mask=True, causal=True),
        _attention("sym_head_dim", [T(b, s, 2, d), T(b, kv, 2, d), T(b, kv, 2, d)], env_list=envs({b: 1, s: 3, kv: 5, d: 1}, {b: 2, s: 4, kv: 9, d: 64})),
        _attention("causal_more_queries", [q, kk, kk], causal=True, env_list=envs({b: 1, s: 9, kv: 4}, {b: 2, s: 33, kv: 33})),
        _attention("float16_gqa", [T(b, s, 4, 16, dtype="float16"), T(b, kv, 2, 16, dtype="float16"), T(b, kv, 2, 16, dtype="float16")], causal=True, tol=None),
        _attention("bfloat16", [T(b, s, 2, 16, dtype="bfloat16"), T(b, kv, 2, 16, dtype="bfloat16"), T(b, kv, 2, 16, dtype="bfloat16")], tol=None),
    ]


CASES = _softmax_cases() + _norm_cases() + _attention_cases()
# name: why the case runs only in the long tier
LONG_CASES = {
    "softmax_bfloat16": "softmax_float16 and log_softmax_bfloat16 run",
    "log_softmax_float16": "log_softmax_bfloat16 and softmax_float16 run",
    "log_softmax_axis0": "softmax_axis0 runs",
    "layer_norm_bfloat16": "layer_norm_float16 runs",
    "rms_norm_float16": "rms_norm_bfloat16 runs",
    **{
        f"attention_{name}": "test_attention_kernel runs the same legalization in such cases"
        for name in ("causal", "gqa_causal", "mqa_scale", "float_mask_causal", "sym_head_dim", "causal_more_queries", "float16_gqa", "bfloat16")
    },
}
BUILT_CASES, CASE_PARAMS = tiered(CASES, LONG_CASES)


@pytest.fixture(scope="module")
def built() -> Built:
    return build(BUILT_CASES)


@pytest.mark.parametrize("name", CASE_PARAMS)
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


def test_fully_masked_query_gives_zeros(built: Built) -> None:
    case = built.cases["attention_bool_mask"]
    rng = np.random.default_rng(1)
    env = {b: 1, s: 3, kv: 4}
    q, k, v = (random_array(shape_at(i.shape or (), env), "float32", rng) for i in case.infos[:3])
    mask = np.ones((1, 1, 3, 4), dtype=bool)
    mask[0, 0, 1, :] = False
    case.inputs = lambda env, rng: [q, k, v, mask]
    try:
        _, (out,) = run(built, "attention_bool_mask", env)
    finally:
        case.inputs = None
    assert np.all(out[0, 1] == 0) and np.all(np.isfinite(out))
    np.testing.assert_allclose(out, attention_ref(q, k, v, mask=mask), rtol=1e-5, atol=1e-5)


def test_attention_reference_matches_torch() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra; the NumPy reference is checked against it when present")
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 5, 4, 8))
    k = rng.standard_normal((2, 9, 2, 8))
    v = rng.standard_normal((2, 9, 2, 6))
    mask = rng.random((2, 1, 5, 9)) < 0.7
    mask[..., -1] = True  # every query sees a key (torch gives NaN otherwise)
    fmask = rng.standard_normal((5, 9))

    def sdpa(mask_: Any = None, causal: bool = False, scale: float | None = None) -> np.ndarray:
        t = [torch.from_numpy(np.ascontiguousarray(np.transpose(a, (0, 2, 1, 3)))) for a in (q, k, v)]
        m_ = None if mask_ is None else torch.from_numpy(mask_)
        if causal:  # torch's is_causal aligns at the start; build the end-aligned mask
            causal_mask = torch.from_numpy(np.arange(9)[None, :] <= np.arange(5)[:, None] + 9 - 5)
            m_ = causal_mask if m_ is None else m_ + torch.where(causal_mask, 0.0, -math.inf).double()
        out = F.scaled_dot_product_attention(*t, attn_mask=m_, scale=scale, enable_gqa=True)
        return np.transpose(out.numpy(), (0, 2, 1, 3))

    np.testing.assert_allclose(attention_ref(q, k, v), sdpa(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(attention_ref(q, k, v, mask=mask), sdpa(mask), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(attention_ref(q, k, v, mask=fmask, causal=True, scale=0.2), sdpa(fmask, True, 0.2), rtol=1e-10, atol=1e-10)

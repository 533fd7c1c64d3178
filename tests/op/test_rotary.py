"""rotary_embedding: symbolic inference and its errors, and the legalized kernel compiled to C and
run at several values of its symbolic dims against a float64 NumPy reference (itself checked
against transformers' Llama rotary functions when transformers is installed)."""

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

b, s, h, d = tw.dim("b"), tw.dim("s"), tw.dim("h"), tw.dim("d")


def rope_ref(x: np.ndarray, pos: np.ndarray, theta: float = 10000.0, rotary_dim: int | None = None, factor: float = 1.0) -> np.ndarray:
    """Rotate-half RoPE in float64, written from the formula in the op's docstring."""
    x = x.astype(np.float64)
    rd = x.shape[3] if rotary_dim is None else rotary_dim
    half = rd // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / rd) / factor  # (half,)
    p = np.broadcast_to(pos, x.shape[:2]).astype(np.float64)  # (batch, seq)
    angle = p[:, :, None, None] * inv_freq  # (batch, seq, 1, half)
    cos, sin = np.cos(angle), np.sin(angle)
    lo, hi = x[..., :half], x[..., half:rd]
    out = x.copy()
    out[..., :half] = lo * cos - hi * sin
    out[..., half:rd] = hi * cos + lo * sin
    return out


def test_rotary_inference() -> None:
    assert info_of(op.rotary_embedding, T(b, s, h, 8), T(s, dtype="int64")) == T(b, s, h, 8)
    assert info_of(op.rotary_embedding, T(b, s, h, 8, dtype="float16"), T(b, s, dtype="int32")) == T(b, s, h, 8, dtype="float16")
    assert info_of(op.rotary_embedding, R(), R(dtype="int64")) == R()
    # a symbolic head_dim must be even; the seq of x and positions must agree
    info, checks = infer(op.rotary_embedding, T(1, s, 2, d), T(s, dtype="int64"))
    assert info == T(1, s, 2, d) and [c.kind for c in checks] == ["divides"]
    assert holds(checks, {s: 3, d: 8}) and not holds(checks, {s: 3, d: 7})
    m = tw.dim("m")
    info, checks = infer(op.rotary_embedding, T(1, s, 2, 8), T(m, dtype="int64"))
    assert holds(checks, {s: 4, m: 4}) and not holds(checks, {s: 4, m: 5})


def test_rotary_errors() -> None:
    with pytest.raises(InferenceError, match="rotary_embedding: positions must be an integer tensor, got float32"):
        infer(op.rotary_embedding, T(1, s, 2, 8), T(s))
    with pytest.raises(ShapeError, match=r"rotary_embedding: x must be 4-D \[batch, seq, heads, head_dim\], got shape \(s, 8\)"):
        infer(op.rotary_embedding, T(s, 8), T(s, dtype="int64"))
    with pytest.raises(ShapeError, match=r"rotary_embedding: head_dim 7 must be even"):
        infer(op.rotary_embedding, T(1, s, 2, 7), T(s, dtype="int64"))
    with pytest.raises(ShapeError, match=r"rotary_embedding: positions \(5,\) and the seq dim of x \(1, 4, 2, 8\): 5 != 4"):
        infer(op.rotary_embedding, T(1, 4, 2, 8), T(5, dtype="int64"))
    with pytest.raises(ShapeError, match="rotary_embedding: rotary_dim 16 exceeds head_dim 8"):
        infer(lambda x, p: op.rotary_embedding(x, p, rotary_dim=16), T(1, s, 2, 8), T(s, dtype="int64"))
    with pytest.raises(InferenceError, match="rotary_dim must be a positive even int"):
        infer(lambda x, p: op.rotary_embedding(x, p, rotary_dim=3), T(1, s, 2, 8), T(s, dtype="int64"))
    with pytest.raises(InferenceError, match="theta must be a positive number"):
        infer(lambda x, p: op.rotary_embedding(x, p, theta=-1.0), T(1, s, 2, 8), T(s, dtype="int64"))
    with pytest.raises(InferenceError, match="factor must be a positive number, got 0.0"):
        infer(lambda x, p: op.rotary_embedding(x, p, factor=0.0), T(1, s, 2, 8), T(s, dtype="int64"))


def _inputs(xshape: tuple, pshape: tuple, dtype: str = "float32", offset: int = 0) -> Callable[[dict[SymVar, int], np.random.Generator], list[np.ndarray]]:
    """Random x; positions ``offset + arange(seq)`` (with a random shift per batch row when
    positions are 2-D), as a cache of ``offset`` earlier tokens would give."""

    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        x = random_array(shape_at(xshape, env), dtype, rng)
        ps = shape_at(pshape, env)
        pos = offset + np.broadcast_to(np.arange(ps[-1]), ps) + (rng.integers(0, 50, size=(ps[0], 1)) if len(ps) == 2 else 0)
        return [x, pos.astype(np.int64)]

    return make


ENVS = envs({b: 1, s: 1, h: 1}, {b: 2, s: 7, h: 3}, {b: 1, s: 33, h: 2})


def _cases() -> list[Case]:
    i64 = "int64"
    return [
        Case("rope_seq_positions", op.rotary_embedding, [T(b, s, h, 8), T(s, dtype=i64)], rope_ref, ENVS, inputs=_inputs((b, s, h, 8), (s,)), tol=1e-5),
        Case("rope_batch_positions_theta", lambda x, p: op.rotary_embedding(x, p, theta=500000.0), [T(b, s, h, 16), T(b, s, dtype=i64)], lambda x, p: rope_ref(x, p, 500000.0), ENVS, inputs=_inputs((b, s, h, 16), (b, s)), tol=1e-5),
        Case("rope_decode_offset", op.rotary_embedding, [T(b, s, h, 8), T(1, s, dtype=i64)], rope_ref, ENVS, inputs=_inputs((b, s, h, 8), (1, s), offset=4000), tol=1e-4),
        Case("rope_linear_factor", lambda x, p: op.rotary_embedding(x, p, factor=4.0), [T(b, s, h, 8), T(s, dtype=i64)], lambda x, p: rope_ref(x, p, factor=4.0), ENVS, inputs=_inputs((b, s, h, 8), (s,), offset=100), tol=1e-5),
        Case("rope_partial", lambda x, p: op.rotary_embedding(x, p, rotary_dim=4), [T(b, s, h, 10), T(s, dtype=i64)], lambda x, p: rope_ref(x, p, rotary_dim=4), ENVS, inputs=_inputs((b, s, h, 10), (s,)), tol=1e-5),
        Case("rope_symbolic_head_dim", op.rotary_embedding, [T(1, s, 2, d), T(s, dtype=i64)], rope_ref, envs({s: 3, d: 8}, {s: 5, d: 2}), inputs=_inputs((1, s, 2, d), (s,)), tol=1e-5),
        Case("rope_float16", op.rotary_embedding, [T(b, s, h, 8, dtype="float16"), T(s, dtype=i64)], rope_ref, ENVS, inputs=_inputs((b, s, h, 8), (s,), "float16"), tol=2e-3),
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


def test_reference_matches_transformers() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra; the NumPy reference is checked against it when present")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama", reason="transformers is an optional extra")
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=2)  # rope_theta 10000 by default
    rotary = llama.LlamaRotaryEmbedding(cfg)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 5, 2, 16))  # [batch, seq, heads, head_dim]
    pos = np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    qt = torch.from_numpy(q).permute(0, 2, 1, 3).float()  # transformers' [batch, heads, seq, dim]
    cos, sin = rotary(qt, torch.from_numpy(pos))
    want, _ = llama.apply_rotary_pos_emb(qt, qt, cos, sin)
    np.testing.assert_allclose(rope_ref(q, pos), want.permute(0, 2, 1, 3).double().numpy(), atol=2e-5)

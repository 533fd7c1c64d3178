"""Helpers for backend tests: one-op modules with symbolic dims, built and run with a
backend list, and NumPy references."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

import tilework
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Expr, Var
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.backend.offload import OffloadByRules, offload_calls

Shape = tuple[Any, ...]


def module(params: Sequence[tuple[str, Shape, str]], body: Callable[..., Expr]) -> IRModule:
    """``main(params) = body(*params)`` in one dataflow block."""
    vs = [Var(name, TensorInfo(shape, dtype)) for name, shape, dtype in params]
    bb = BlockBuilder()
    with bb.function("main", vs):
        with bb.dataflow():
            out = bb.emit_output(body(*vs), name="out")
        bb.emit_func_output(out)
    return bb.get()


def offloaded(mod: IRModule, backends: Sequence[str]) -> dict[str, int]:
    """The extern symbols the rules-based placement calls."""
    return offload_calls(OffloadByRules(tuple(backends))(mod))


def run(mod: IRModule, backends: Sequence[str] | None, args: Sequence[np.ndarray]) -> Any:
    exe = tilework.build(mod, backends=backends)
    return tilework.VM(exe)["main"](*args)


def rand(rng: np.random.Generator, shape: Shape, dtype: str = "float32") -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, causal: bool = False, scale: float | None = None) -> np.ndarray:
    """tilework's attention in NumPy ([batch, seq, heads, dim]; end-aligned causal mask; grouped
    KV heads; a query that sees no key gives zeros)."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k64, v64 = np.repeat(k64, group, axis=2), np.repeat(v64, group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q64, k64) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    keep = np.ones(s.shape, bool)
    if mask is not None and mask.dtype == np.bool_:
        keep &= np.broadcast_to(mask, s.shape)
    elif mask is not None:
        s = s + mask
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        keep &= np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
    s = np.where(keep, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    e = np.where(keep, np.exp(s - np.where(np.isfinite(mx), mx, 0)), 0.0)
    tot = e.sum(-1, keepdims=True)
    p = np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)
    return np.einsum("bhqk,bkhd->bqhd", p, v64).astype(q.dtype)


def layer_norm_ref(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    return ((x64 - mu) / np.sqrt(var + eps) * g + b).astype(x.dtype)


def rms_norm_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w).astype(x.dtype)


def softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis, keepdims=True))
    return (e / e.sum(axis, keepdims=True)).astype(x.dtype)


def gelu_ref(x: np.ndarray) -> np.ndarray:
    from math import erf

    return (0.5 * x * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))).astype(x.dtype)


def close(got: Any, want: np.ndarray, tol: float = 1e-4) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{got.shape} {got.dtype} vs {want.shape} {want.dtype}"
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bf16 (to nearest, ties to even), as float32."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)).view(np.float32)


# the byte offsets of each k-quant's fp16 scale fields (d, dmin) in its 256-weight block (and of
# iq4_nl's and iq4_xs's d): every other byte of a block is a valid payload, so random bytes there
# make valid random blocks
K_QUANT_HALVES = {"q4_k": (0, 2), "q6_k": (208,), "q5_k": (0, 2), "q3_k": (108,), "q2_k": (80, 82), "iq4_nl": (0,), "iq4_xs": (0,)}


def k_quant_blocks(rng: np.random.Generator, fmt: str, n: int, k: int, scale: float = 0.01) -> np.ndarray:
    """``uint8 [n, row_bytes]`` random ``fmt`` blocks (``gguf`` cannot quantize the k-quants, nor iq4):
    random payload bytes, finite fp16 scales of about ``scale``."""
    from tilework.op.quant import QUANT_FORMATS

    f = QUANT_FORMATS[fmt]
    b = rng.integers(0, 256, (n, f.row_bytes(k)), dtype=np.uint8)
    blocks = b.reshape(n, k // f.block, f.nbytes)
    for at in K_QUANT_HALVES[fmt]:
        blocks[:, :, at : at + 2] = (rng.standard_normal((n, k // f.block, 1)) * scale).astype(np.float16).view(np.uint8)
    return b

"""NumPy references for the models in ``tilework.models.reference`` (the numerics oracle)."""

from __future__ import annotations

import math

import numpy as np

from tilework.models.reference import EncoderConfig, TransformerConfig


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _gelu(x: np.ndarray) -> np.ndarray:
    from math import erf

    verf = np.vectorize(erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + verf(x / math.sqrt(2.0)))


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, mask: np.ndarray | None = None) -> np.ndarray:
    # [b, s, h, d] layout
    d = q.shape[-1]
    groups = q.shape[2] // k.shape[2]
    k = np.repeat(k, groups, axis=2)
    v = np.repeat(v, groups, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        mask = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        scores = np.where(mask, scores, -np.inf)
    elif mask is not None:
        scores = scores + mask
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def transformer_block_ref(x: np.ndarray, weights: list[np.ndarray], cfg: TransformerConfig) -> np.ndarray:
    """The transformer block in float64 NumPy; ``weights`` in ``transformer_weights`` order."""
    w = [a.astype(np.float64) for a in weights]
    cur = x.astype(np.float64)
    b, s, h = cur.shape
    nh = cfg.heads
    per_layer = 16
    for i in range(cfg.layers):
        (g1, b1, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2, w1, c1, w2, c2) = w[i * per_layer : (i + 1) * per_layer]
        hn = _layer_norm(cur, g1, b1)
        q = (hn @ wq.T + bq).reshape(b, s, nh, h // nh)
        k = (hn @ wk.T + bk).reshape(b, s, nh, h // nh)
        v = (hn @ wv.T + bv).reshape(b, s, nh, h // nh)
        att = _attention(q, k, v, causal=True).reshape(b, s, h)
        cur = cur + att @ wo.T + bo
        hn2 = _layer_norm(cur, g2, b2)
        cur = cur + _gelu(hn2 @ w1.T + c1) @ w2.T + c2
    return cur


def encoder_ref(x: np.ndarray, mask: np.ndarray, weights: list[np.ndarray], cfg: EncoderConfig) -> np.ndarray:
    """The MiniLM-shaped encoder in float64 NumPy; ``weights`` in ``encoder_weights`` order."""
    w = [a.astype(np.float64) for a in weights]
    cur = x.astype(np.float64)
    b, s, h = cur.shape
    nh = cfg.heads
    for i in range(cfg.layers):
        (wq, bq, wk, bk, wv, bv, wo, bo, g1, b1, w1, c1, w2, c2, g2, b2) = w[i * 16 : (i + 1) * 16]
        q = (cur @ wq.T + bq).reshape(b, s, nh, h // nh)
        k = (cur @ wk.T + bk).reshape(b, s, nh, h // nh)
        v = (cur @ wv.T + bv).reshape(b, s, nh, h // nh)
        att = _attention(q, k, v, causal=False, mask=mask.astype(np.float64)).reshape(b, s, h)
        cur = _layer_norm(cur + att @ wo.T + bo, g1, b1, 1e-12)
        cur = _layer_norm(cur + _gelu(cur @ w1.T + c1) @ w2.T + c2, g2, b2, 1e-12)
    return cur

"""The quant library's integer path in NumPy, the reference of its tests: ``x`` quantized to
8-bit blocks of 32 as the C library does it (``quantize_x``), each format's integer weights and
float factors (``block_fields``), the exact value of the file header's float32 sequence
(``int8_reference``), and the checks every integer-path format takes (``assert_int8_matches``,
``assert_rows_in_every_build``)."""

from __future__ import annotations

import numpy as np

from tilework.backend import quant as Q
from tilework.op.quant import IQ4_VALUES, QUANT_FORMATS, interleave_rows

INT8_ROWS = (0, 1, 3, 8, 9, 33)  # the GEMV's pass sizes and the switch to the GEMM
Q5 = ("q5_0", "q5_1")


def quantize_x(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The integer path's quantization of ``x [M, K]`` in NumPy: ``q`` (int64 ``[M, K/32, 32]``)
    and ``d`` (float32 ``[M, K/32]``), every operation in float32 as the C library does it."""
    m, k = x.shape
    xb = x.astype(np.float32).reshape(m, k // 32, 32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.abs(xb).max(axis=2) if k else np.zeros((m, 0), np.float32)
        d = (amax / np.float32(127)).astype(np.float32)
        finite = amax <= np.finfo(np.float32).max  # False for NaN too
        scaled = amax > np.float32(2.0**-100)
        inv = np.where(scaled & finite, np.float32(127) / np.where(scaled, amax, np.float32(1)), np.float32(0)).astype(np.float32)
        q = np.rint((xb * inv[..., None]).astype(np.float32))
    return np.where(finite[..., None], q, 0).astype(np.int64), d


def block_fields(b: np.ndarray, fmt: str, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The integer weights ``q_w`` (``[N, K/32, 32]``), ``d`` and ``m`` (q4_1, q5_1, q4_k; else
    zeros) of blocks; q4_k per 32-weight sub-block: ``d * scale`` and ``-(dmin * min)``; q6_k,
    q3_k and q2_k (``q6_k_fields``, ``q3_k_fields``, ``q2_k_fields``) ``q_w`` times its
    16-weight scale and the super-block's ``d`` (q2_k's mins: ``q2_k_mins``)."""
    n, size = b.shape[0], QUANT_FORMATS[fmt].nbytes
    if fmt in ("q4_k", "q5_k"):
        return k45_fields(b, k, fmt)
    if fmt == "q6_k":
        return q6_k_fields(b, k)
    if fmt == "q3_k":
        return q3_k_fields(b, k)
    if fmt == "q2_k":
        return q2_k_fields(b, k)
    if fmt in ("iq4_nl", "iq4_xs"):
        return iq4_fields(b, k, fmt)
    bb = b.reshape(n, k // 32, size)
    half = lambda at: bb[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)  # noqa: E731
    if fmt in Q5:  # the nibbles with bit l of the uint32 qh after d (and m) as weight l's fifth
        head = 2 if fmt == "q5_0" else 4
        high = np.unpackbits(bb[..., head : head + 4], axis=-1, bitorder="little").astype(np.int64) << 4
        nib = bb[..., head + 4 :]
        qw = np.concatenate([nib & 15, nib >> 4], axis=-1).astype(np.int64) | high
        return (qw - 16, half(0), np.zeros((n, k // 32), np.float32)) if fmt == "q5_0" else (qw, half(0), half(2))
    if fmt == "q8_0":
        return bb[..., 2:].view(np.int8).astype(np.int64), half(0), np.zeros((n, k // 32), np.float32)
    nib = bb[..., 2 if fmt == "q4_0" else 4 :]
    qw = np.concatenate([nib & 15, nib >> 4], axis=-1).astype(np.int64)
    if fmt == "q4_0":
        return qw - 8, half(0), np.zeros((n, k // 32), np.float32)
    return qw, half(0), half(2)


def k45_fields(b: np.ndarray, k: int, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``block_fields`` of q4_k super-blocks (d, dmin, 12 bytes of 6-bit scales and mins, 128 of
    nibbles: sub-block ``s``'s weights the low (``s`` even) or high nibbles of bytes ``32 (s // 2) ..``)
    or q5_k ones (the scales, then 32 bytes of ``qh``, bit ``s`` of ``qh[l]`` weight ``l``'s fifth
    in sub-block ``s``, then the nibbles)."""
    n = b.shape[0]
    sb = b.reshape(n, k // 256, QUANT_FORMATS[fmt].nbytes).astype(np.int64)
    d = sb[..., 0:2].astype(np.uint8).copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = sb[..., 2:4].astype(np.uint8).copy().view(np.float16)[..., 0].astype(np.float32)
    sc6 = sb[..., 4:16]
    scale = np.concatenate([sc6[..., 0:4] & 63, (sc6[..., 8:12] & 15) | (sc6[..., 0:4] >> 6) << 4], axis=-1)
    mins = np.concatenate([sc6[..., 4:8] & 63, (sc6[..., 8:12] >> 4) | (sc6[..., 4:8] >> 6) << 4], axis=-1)
    pairs = sb[..., 16 if fmt == "q4_k" else 48 :].reshape(n, k // 256, 4, 32)
    qw = np.stack([pairs & 15, pairs >> 4], axis=3).reshape(n, k // 256, 8, 32)  # sub-block 2c: low nibbles of pair c, 2c + 1: high
    if fmt == "q5_k":
        qh = sb[..., 16:48]  # [n, super-block, l]
        qw = qw | ((qh[:, :, None, :] >> np.arange(8)[None, None, :, None]) & 1) << 4
    qw = qw.reshape(n, k // 32, 32)
    dw = (d[..., None] * scale.astype(np.float32)).reshape(n, k // 32)
    mw = -(dmin[..., None] * mins.astype(np.float32)).reshape(n, k // 32)
    return qw, dw.astype(np.float32), mw.astype(np.float32)


def q6_k_fields(b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``block_fields`` of q6_k super-blocks (128 bytes of low nibbles, 64 of high bit pairs, 16
    int8 scales, d): sub-block ``s`` (half ``h = s // 4``, quarter ``t = s % 4``) takes nibble
    ``t // 2`` of bytes ``64 h + 32 (t % 2) ..`` and bits ``2 t`` of bytes ``128 + 32 h ..``, ``q =
    that - 32``; its weights ``l < 16`` scale ``2 s``, the rest ``2 s + 1``. ``q_w`` comes times
    the scale (the integer path's ``sc0 * sum + sc1 * sum``, exact) and ``d`` is the
    super-block's for each of its sub-blocks."""
    n = b.shape[0]
    sb = b.reshape(n, k // 256, 210).astype(np.int64)
    d = sb[..., 208:210].astype(np.uint8).copy().view(np.float16)[..., 0].astype(np.float32)
    ql, qh = sb[..., :128].reshape(n, -1, 2, 2, 32), sb[..., 128:192].reshape(n, -1, 2, 1, 32)  # [.., half, t % 2, l]
    qs = [((ql[:, :, :, t % 2] >> (4 * (t // 2))) & 15 | ((qh[:, :, :, 0] >> (2 * t)) & 3) << 4) - 32 for t in range(4)]
    q = np.stack(qs, axis=3)  # [n, super-block, half, t, l]
    scale = sb[..., 192:208].astype(np.uint8).view(np.int8).astype(np.int64).reshape(n, -1, 2, 4, 2, 1)  # [.., half, t, l // 16]
    qw = (q.reshape(n, -1, 2, 4, 2, 16) * scale).reshape(n, k // 32, 32)
    return qw, np.repeat(d, 8, axis=1), np.zeros((n, k // 32), np.float32)


def _half(sb: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at byte ``at`` of each super-block of ``sb`` (``[n, super-blocks, bytes]``), as float32."""
    return sb[..., at : at + 2].astype(np.uint8).copy().view(np.float16)[..., 0].astype(np.float32)


def q3_k_fields(b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``block_fields`` of q3_k super-blocks (32 bytes of hmask, 64 of 2-bit fields, 12 of 6-bit
    scales, d): sub-block ``s`` (half ``h = s // 4``, quarter ``t = s % 4``) takes bits ``2 t``
    of bytes ``32 + 32 h ..``, less 4 where bit ``s`` of ``hmask[l]`` is clear (``q`` in -4..3);
    scale ``g`` (``2 s``, ``2 s + 1``: weights ``l < 16``, the rest) is nibble ``g // 8`` of byte
    ``96 + g % 8`` with bits ``2 (g // 4)`` of byte ``104 + g % 4`` above it, less 32. ``q_w``
    comes times the scale, ``d`` the super-block's for each of its sub-blocks."""
    n = b.shape[0]
    sb = b.reshape(n, k // 256, 110).astype(np.int64)
    hmask, qs, sc = sb[..., :32], sb[..., 32:96].reshape(n, -1, 2, 32), sb[..., 96:108]
    q = np.stack([((qs[:, :, s // 4] >> (2 * (s % 4))) & 3) - 4 + 4 * ((hmask >> s) & 1) for s in range(8)], axis=2)  # [n, super-block, s, l]
    g = np.arange(16)
    scale = ((sc[..., g % 8] >> (4 * (g // 8))) & 15 | ((sc[..., 8 + g % 4] >> (2 * (g // 4))) & 3) << 4) - 32  # [n, super-block, g]
    qw = (q.reshape(n, -1, 8, 2, 16) * scale.reshape(n, -1, 8, 2, 1)).reshape(n, k // 32, 32)
    return qw, np.repeat(_half(sb, 108), 8, axis=1), np.zeros((n, k // 32), np.float32)


def q2_k_fields(b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``block_fields`` of q2_k super-blocks (16 scale bytes, 64 of 2-bit fields, d, dmin):
    sub-block ``s`` takes bits ``2 (s % 4)`` of bytes ``16 + 32 (s // 4) ..`` (``q`` in 0..3);
    its weights ``l < 16`` scale byte ``2 s``, the rest ``2 s + 1``, each ``sc | mn << 4``.
    ``q_w`` comes times ``sc``, ``d`` the super-block's; the mins are ``q2_k_mins``'."""
    n = b.shape[0]
    sb = b.reshape(n, k // 256, 84).astype(np.int64)
    qs = sb[..., 16:80].reshape(n, -1, 2, 32)
    q = np.stack([(qs[:, :, s // 4] >> (2 * (s % 4))) & 3 for s in range(8)], axis=2)
    qw = (q.reshape(n, -1, 8, 2, 16) * (sb[..., :16] & 15).reshape(n, -1, 8, 2, 1)).reshape(n, k // 32, 32)
    return qw, np.repeat(_half(sb, 80), 8, axis=1), np.zeros((n, k // 32), np.float32)


def q2_k_mins(b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """q2_k's mins per weight (``[N, K/32, 32]``: ``mn`` of the weight's scale byte) and dmin per
    32-weight sub-block: the integer path adds ``fma(sum(mn * q_x), -(dmin * d_x), acc)``."""
    n = b.shape[0]
    sb = b.reshape(n, k // 256, 84).astype(np.int64)
    mq = np.broadcast_to((sb[..., :16] >> 4).reshape(n, -1, 8, 2, 1), (n, k // 256, 8, 2, 16)).reshape(n, k // 32, 32)
    return mq, np.repeat(_half(sb, 82), 8, axis=1)


def iq4_fields(b: np.ndarray, k: int, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``block_fields`` of iq4_nl blocks (``d``, 16 nibble bytes: ``q_w`` the values the nibbles
    index) or iq4_xs super-blocks (``d``, ``scales_h``, 4 bytes of ``scales_l``, 16 nibble bytes a
    sub-block; ``d`` per sub-block ``d * (ls - 32)``, exact)."""
    n, size = b.shape[0], QUANT_FORMATS[fmt].nbytes
    sb = b.reshape(n, -1, size)
    d = sb[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    nib = sb[..., 2:] if fmt == "iq4_nl" else sb[..., 8:].reshape(n, -1, 8, 16)
    qw = np.array(IQ4_VALUES, np.int64)[np.concatenate([nib & 15, nib >> 4], axis=-1)].reshape(n, k // 32, 32)
    if fmt == "iq4_xs":
        sh = sb[..., 2:4].copy().view(np.uint16)[..., 0].astype(np.int64)
        ls = np.stack([sb[..., 4:8] & 15, sb[..., 4:8] >> 4], axis=-1).reshape(n, -1, 8) | ((sh[..., None] >> (2 * np.arange(8))) & 3) << 4
        d = (d[..., None] * (ls - 32).astype(np.float32)).reshape(n, k // 32)
    return qw, d.astype(np.float32), np.zeros((n, k // 32), np.float32)


def int8_reference(x: np.ndarray, b: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """The exact value of the integer path's ``[M, N]`` result (its float32 factors, summed in
    float64) and the magnitude sum of its terms (the float32 rounding scale)."""
    k = x.shape[1]
    q, dx = quantize_x(x)
    qw, dw, mw = block_fields(b, fmt, k)
    isum = np.einsum("mbl,nbl->mnb", q, qw).astype(np.float64)
    terms = isum * (dw[None] * dx[:, None]).astype(np.float32)  # d_w * d_x rounded to float32
    if fmt == "q2_k":  # msum * -(dmin * d_x), msum = sum(min * q_x) exactly
        mq, dmin = q2_k_mins(b, k)
        mterms = np.einsum("mbl,nbl->mnb", q, mq).astype(np.float64) * -(dmin[None] * dx[:, None]).astype(np.float32)
    else:
        cx = (dx * q.sum(axis=2).astype(np.float32)).astype(np.float32)
        mterms = mw[None].astype(np.float64) * cx[:, None]
    return terms.sum(axis=2) + mterms.sum(axis=2), np.abs(terms).sum(axis=2) + np.abs(mterms).sum(axis=2)


def assert_int8_matches(y: np.ndarray, x: np.ndarray, b: np.ndarray, fmt: str, wf: np.ndarray) -> None:
    """``y`` is the integer path's value up to float32 summation, and within the documented
    ``activation_bound`` (plus float32 rounding) of the dequantized float32 product."""
    x2 = x.reshape(int(np.prod(x.shape[:-1])), x.shape[-1])
    y2 = y.reshape(x2.shape[0], b.shape[0])
    ref, scale = int8_reference(x2, b, fmt)
    err = np.abs(y2 - ref) / (scale + 1e-30)
    assert err.max(initial=0) < 2e-6, f"worst error {err.max():.3g} of the term magnitudes"
    x64, w64 = x2.astype(np.float64), wf.astype(np.float64)
    slack = Q.activation_bound(x2, wf) * (1 + 1e-5) + 2e-6 * (np.abs(x64) @ np.abs(w64).T) + 1e-30
    worst = (np.abs(y2 - x64 @ w64.T) / slack).max(initial=0)
    assert worst <= 1, f"off the dequantized product by {worst:.3g} x the bound"



def extreme_activations(rng: np.random.Generator, k: int, width: int) -> np.ndarray:
    """33 rows of ``k`` normal activations whose first ``width`` columns are +-1 (they quantize to
    +-127, the widest products), rows 0 and 1 all +1 and all -1 there."""
    x = rng.standard_normal((33, k)).astype(np.float32)
    w = min(k, width)
    x[:, :w] = np.where(rng.random((33, w)) < 0.5, -1.0, 1.0)
    x[0, :w], x[1, :w] = 1.0, -1.0
    return x


def assert_rows_in_every_build(x: np.ndarray, b: np.ndarray, fmt: str, wf: np.ndarray) -> None:
    """``fmt``'s product of the first 0, 1, 3, 8, 9, 33 rows of ``x`` (GEMV passes and the GEMM):
    the emulation and the bound (``assert_int8_matches``), and each row's bits the same alone and
    in any batch, without VNNI, in the portable build and, where the rows are whole groups of
    16, on the rows interleaved (``<fmt>x16``) in each of those builds."""
    n = b.shape[0]
    full = Q.qlinear(x, b, fmt)
    bx = interleave_rows(b, fmt) if n % 16 == 0 else None
    for m in INT8_ROWS:
        y = Q.qlinear(x[:m], b, fmt)
        assert y.shape == (m, n)
        if m:
            assert_int8_matches(y, x[:m], b, fmt, wf)
        np.testing.assert_array_equal(y, full[:m])
        np.testing.assert_array_equal(Q.qlinear(x[:m], b, fmt, vnni=False), y)
        np.testing.assert_array_equal(Q.qlinear(x[:m], b, fmt, portable=True), y)
        if bx is not None:
            for variant in ({}, {"vnni": False}, {"portable": True}):
                np.testing.assert_array_equal(Q.qlinear(x[:m], bx, fmt + "x16", **variant), y)
    for i in (0, 1, 32):
        np.testing.assert_array_equal(Q.qlinear(x[i : i + 1], b, fmt)[0], full[i])

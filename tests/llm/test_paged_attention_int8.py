"""``paged_attention`` over an int8 pool: each new key and value is quantized as it is
written (a bfloat16 scale a key and a value, the largest magnitude to 127; the keys' bytes
offset binary), and each new token's attention over the cached and new tokens matches NumPy's
over the pool's dequantized keys and values: decode with its query quantized as the kernel
quantizes it (its probabilities' bytes, a page at a time, within 1e-2), prefill over the pages
made bfloat16 (as a bfloat16 pool's products). Small heads (the portable loops) and SmolLM2's
(64 dims, pages of 16: one ``vpdpbusd`` a vector where the CPU has AVX-512 VNNI), pages in any
order, batches of unequal lengths, on the C target and the interpreter."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tilework.ir.builder import BlockBuilder
from tilework.ir.dtype import np_dtype
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.llm.kv_cache import PagedKVCache, kv_shapes
from tilework.op import paged_attention

L, NH, NKV, THETA = 2, 6, 3, 500.0
BF16 = np_dtype("bfloat16")
SMALL, SMOLLM2 = (8, 4), (64, 16)  # (head dim, page)


def _bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def _quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's quantization of ``x [..., n]`` (float32) along its last axis: int8 values
    and a bfloat16 scale each (``max |x| / 127`` rounded)."""
    top = np.abs(x).max(axis=-1, keepdims=True)
    scale = _bf16(top / np.float32(127.0))
    inv = np.where(scale > 0, np.float32(1.0) / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    q = np.clip(np.rint(x * inv), -127, 127).astype(np.int8)
    return q, scale[..., 0]


def _scale_bytes(scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    top = (scale.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return (top & 0xFF).astype(np.uint8).view(np.int8), (top >> 8).astype(np.uint8).view(np.int8)


def _pack(kq: np.ndarray, ks: np.ndarray, vq: np.ndarray, vs: np.ndarray, hd: int, page: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys ``[L, pages, NKV, hd, page]`` (int8) with scales ``[L, pages, NKV, page]`` and values
    ``[L, pages, page, NKV, hd]`` with ``[L, pages, page, NKV]`` in the int8 pool's layout (a
    key's scale and its value's in the row after its head's dims)."""
    n = kq.shape[1]
    k_shape, v_shape = kv_shapes(L, n, NKV, hd, page, "int8")
    k = np.zeros(k_shape, np.int8)
    k[:, :, :, : hd // 4] = (kq.astype(np.int16) + 128).astype(np.uint8).view(np.int8).reshape(L, n, NKV, hd // 4, 4, page).transpose(0, 1, 2, 3, 5, 4)
    k[:, :, :, hd // 4, :, 0], k[:, :, :, hd // 4, :, 1] = _scale_bytes(ks)
    k[:, :, :, hd // 4, :, 2], k[:, :, :, hd // 4, :, 3] = _scale_bytes(vs.transpose(0, 1, 3, 2))
    v = np.ascontiguousarray(vq.reshape(L, n, page // 4, 4, NKV, hd).transpose(0, 1, 2, 4, 5, 3))
    assert v.shape == v_shape
    return k, v


def _unpack(k: np.ndarray, v: np.ndarray, hd: int, page: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The dequantized keys ``[L, pages, NKV, hd, page]`` and values ``[L, pages, page, NKV, hd]``
    (float32) of a pool, and the values' scales ``[L, pages, page, NKV]``."""
    n = k.shape[1]

    def scale(i: int) -> np.ndarray:
        lo, hi = k[:, :, :, hd // 4, :, i], k[:, :, :, hd // 4, :, i + 1]
        return ((hi.view(np.uint8).astype(np.uint32) << 24) | (lo.view(np.uint8).astype(np.uint32) << 16)).view(np.float32)

    kq = k[:, :, :, : hd // 4].view(np.uint8).astype(np.float32) - 128
    keys = kq.transpose(0, 1, 2, 3, 5, 4).reshape(L, n, NKV, hd, page) * scale(0)[:, :, :, None, :]
    values = v.astype(np.float32).transpose(0, 1, 2, 5, 3, 4).reshape(L, n, page, NKV, hd)
    vs = scale(2).transpose(0, 1, 3, 2)  # [L, n, page, NKV]
    return keys, values * vs[..., None], vs


def _module(decode: bool, hd: int, page: int) -> tw.IRModule:
    b = tw.dim("b", max=8)
    s: Any = 1 if decode else tw.dim("s", max=64)
    pages, width = tw.dim("pages"), tw.dim("width", max=256)
    k_shape, v_shape = kv_shapes(L, pages, NKV, hd, page, "int8")
    qkv = Var("qkv", TensorInfo((b, s, NH + 2 * NKV, hd), "float32"))
    kc, vc = Var("kc", TensorInfo(k_shape, "int8")), Var("vc", TensorInfo(v_shape, "int8"))
    kl, pt = Var("kl", TensorInfo((b,), "int32")), Var("pt", TensorInfo((b, width), "int32"))
    bb = BlockBuilder()
    with bb.function("main", [qkv, kc, vc, kl, pt]):
        with bb.dataflow():
            out = bb.emit_output(paged_attention(qkv, kc, vc, kl, pt, layer=1, kv_heads=NKV, rope_theta=THETA))
        bb.emit_func_output(out)
    return bb.get()


_VMS: dict[tuple[str, bool, int, int], Any] = {}


def _vm(target: str, decode: bool, hd: int, page: int) -> Any:
    key = (target, decode, hd, page)
    if key not in _VMS:
        _VMS[key] = tw.VM(tw.build(_module(decode, hd, page), target=target))
    return _VMS[key]


def _rotate(x: np.ndarray, pos: int) -> np.ndarray:
    hd = x.shape[-1]
    half = hd // 2
    angle = pos * THETA ** (-2.0 * np.arange(half) / hd)
    cos, sin = np.cos(np.concatenate([angle, angle])), np.sin(np.concatenate([angle, angle]))
    x64 = x.astype(np.float64)
    return (x64 * cos + np.concatenate([-x64[..., half:], x64[..., :half]], axis=-1) * sin).astype(np.float32)


def _case(target: str, decode: bool, lens: list[int], s: int, dims: tuple[int, int] = SMALL, pool: int = 64, seed: int = 0) -> None:
    hd, page = dims
    rng = np.random.default_rng(seed)
    # stale random bytes everywhere (they must not leak in), cached tokens quantized as the kernel would
    kq = rng.integers(-127, 128, (L, pool, NKV, hd, page)).astype(np.int8)
    vq = rng.integers(-127, 128, (L, pool, page, NKV, hd)).astype(np.int8)
    ks = _bf16(rng.uniform(0.001, 0.05, (L, pool, NKV, page)))
    vs = _bf16(rng.uniform(0.001, 0.05, (L, pool, page, NKV)))
    width = max(-(-(n + s) // page) for n in lens)
    order = rng.permutation(pool)
    pages = np.zeros((len(lens), width), np.int32)
    qkv = (rng.standard_normal((len(lens), s, NH + 2 * NKV, hd)) * 2).astype(np.float32)
    qkv[..., 1] *= 8  # a large dim: the scale follows the largest magnitude
    used = 0
    for b, n in enumerate(lens):
        need = -(-(n + s) // page)
        pages[b, :need] = order[used : used + need]
        used += need
    k, v = _pack(kq, ks, vq, vs, hd, page)
    other = k[0].copy(), v[0].copy()
    out = np.asarray(_vm(target, decode, hd, page)["main"](qkv, k, v, np.array(lens, np.int32), pages))
    keys, values, vscales = _unpack(k, v, hd, page)
    group = NH // NKV
    for b, n in enumerate(lens):
        for t in range(s):
            pos = n + t
            at = (1, pages[b, pos // page])
            # the new key (turned) and value, quantized: within one step of NumPy's bytes (the
            # kernel's rotation may differ from NumPy's in the last bit)
            for got, raw in ((keys[at][:, :, pos % page], _rotate(qkv[b, t, NH : NH + NKV], pos)), (values[at][pos % page], qkv[b, t, NH + NKV :])):
                want_q, want_s = _quantize(raw)
                np.testing.assert_allclose(got, want_q.astype(np.float32) * want_s[:, None], rtol=0, atol=float(want_s.max()) * 1.01)
        pk = np.stack([keys[1, pages[b, p // page], :, :, p % page] for p in range(n + s)])  # [tokens, NKV, hd]
        pv = np.stack([values[1, pages[b, p // page], p % page] for p in range(n + s)])
        pvs = np.stack([vscales[1, pages[b, p // page], p % page] for p in range(n + s)])  # [tokens, NKV]
        for t in range(s):
            pos = n + t
            q = _rotate(qkv[b, t, :NH], pos) * np.float32(1 / np.sqrt(hd))
            for h in range(NH):
                kh = h // group
                if decode:  # the query quantized as the kernel quantizes it
                    q8, qs = _quantize(q[h])
                    scores = pk[: pos + 1, kh] @ (q8.astype(np.float64) * qs)
                else:  # the page made bfloat16 pairs: bfloat16 products, as from a bfloat16 pool
                    scores = _bf16(pk[: pos + 1, kh]) @ _bf16(q[h]).astype(np.float64)
                p = np.exp(scores - scores.max())
                if decode:
                    # each page's probabilities times the values' scales rounded to bytes (the
                    # largest to 255): at most half the page's step off, times each value's byte
                    weighted, byte = p * pvs[: pos + 1, kh], np.abs(pv[: pos + 1, kh] / pvs[: pos + 1, kh, None])
                    bound = sum(weighted[i : i + page].max() / 510 * byte[i : i + page].sum(axis=0) for i in range(0, pos + 1, page)) / p.sum()
                    ref_v = pv[: pos + 1, kh]
                else:  # the keys, values, query and probabilities rounded to bfloat16: a few of its units of the values
                    ref_v = _bf16(pv[: pos + 1, kh])
                    bound = 2.0**-8 * np.abs(ref_v).max() + 1e-3
                want = (p / p.sum()) @ ref_v
                assert np.all(np.abs(out[b, t, h] - want) <= bound + 1e-4 + 2e-5 * np.abs(want)), f"sequence {b} token {t} head {h}: {np.abs(out[b, t, h] - want).max()} off"
    np.testing.assert_array_equal(k[0], other[0])  # another layer's slice is untouched
    np.testing.assert_array_equal(v[0], other[1])


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("lens", [[0], [6], [4, 1, 11]], ids=["kv1", "odd", "page-crossing"])
def test_decode(target: str, lens: list[int]) -> None:
    _case(target, True, lens, 1)


@pytest.mark.parametrize("lens", [[0], [17], [31, 0, 5, 200, 64, 1, 15, 130]], ids=["kv1", "odd", "batch-8-split"])
def test_decode_of_smollm2_heads(lens: list[int]) -> None:
    """64 dims, pages of 16: the vectorized ``dot_u8i8x4`` loops; at batch 8 long sequences
    are split and merged."""
    _case("cpu", True, lens, 1, dims=SMOLLM2, pool=64)


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("lens, s", [([0], 1), ([5], 6), ([2, 13], 5)], ids=["kv1", "page-crossing", "batch"])
def test_prefill(target: str, lens: list[int], s: int) -> None:
    _case(target, False, lens, s)


def test_prefill_of_smollm2_heads() -> None:
    _case("cpu", False, [0, 21], 19, dims=SMOLLM2)


def test_a_cache_of_int8_holds_its_scales_beside_the_bytes() -> None:
    """The pool's arrays: a row of scales after each head's keys (a key's and its value's)."""
    cache = PagedKVCache(30, 3, 64, 8, dtype="int8")
    assert cache.k.shape == (30, 8, 3, 64 // 4 + 1, 16, 4) and cache.v.shape == (30, 8, 16 // 4, 3, 64, 4)
    assert cache.k.dtype == np.int8 and cache.bytes < PagedKVCache(30, 3, 64, 8, dtype="bfloat16").bytes * 0.55

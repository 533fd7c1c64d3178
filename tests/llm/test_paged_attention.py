"""``paged_attention``: the new keys and values land in their page slots, and the attention of
each new token over the sequence's cached and new tokens matches NumPy, for decode (one token,
splits merged for long sequences) and prefill (several tokens, with and without a cached
prefix), pages in any order, batches of unequal lengths, on the C target and the interpreter.

16-bit pools: bfloat16 runs by default; the float16 pool's decode and prefill runs are in the
long tier (``TILEWORK_LONG_TESTS=1``)."""

from __future__ import annotations

import sys
from typing import Any, cast

import numpy as np
import pytest

import tilework as tw
from tilework.errors import TileworkError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.dtype import np_dtype
from tilework.ir.info import TensorInfo
from tilework.op import paged_attention, paged_rotary
from tilework.llm.kv_cache import kv_shapes
from tilework.op.paged_attention import pair_width
from tilework.op.paged_attention_kernel import CHUNK_PAGES
from tests.long import long_param

L, NKV, HD, PAGE, NH = 2, 3, 8, 4, 6


THETA = 500.0


def _pool(pages: Any, kv: str = "float32") -> tuple[TensorInfo, TensorInfo]:
    """The infos of a pool's keys and values (in the layout of its dtype's pairs)."""
    k_shape, v_shape = kv_shapes(L, pages, NKV, HD, PAGE, kv)
    return TensorInfo(k_shape, kv), TensorInfo(v_shape, kv)


def _pack(kc: np.ndarray, vc: np.ndarray, kv: str) -> tuple[np.ndarray, np.ndarray]:
    """Keys ``[L, pages, NKV, HD, PAGE]`` and values ``[L, pages, PAGE, NKV, HD]`` in the pool's
    layout for ``kv`` (pairs of dims side by side, and pairs of keys' values: see
    ``tilework.op.paged_attention``)."""
    w = pair_width(kv)
    n = kc.shape[1]
    k = kc.reshape(L, n, NKV, HD // w, w, PAGE).transpose(0, 1, 2, 3, 5, 4)
    v = vc.reshape(L, n, PAGE // w, w, NKV, HD).transpose(0, 1, 2, 4, 5, 3)
    return np.ascontiguousarray(k), np.ascontiguousarray(v)


def _unpack(k: np.ndarray, v: np.ndarray, kv: str) -> tuple[np.ndarray, np.ndarray]:
    """``_pack``'s inverse."""
    n = k.shape[1]
    return k.transpose(0, 1, 2, 3, 5, 4).reshape(L, n, NKV, HD, PAGE), v.transpose(0, 1, 2, 5, 3, 4).reshape(L, n, PAGE, NKV, HD)


def _module(decode: bool, theta: float | None, kv: str = "float32", table: bool = False, window: int | None = None, softcap: float | None = None, rope_dim: int | None = None) -> tw.IRModule:
    b = tw.dim("b", max=8)
    s: Any = 1 if decode else tw.dim("s", max=64)
    pages, width = tw.dim("pages"), tw.dim("width", max=256)
    qkv = Var("qkv", TensorInfo((b, s, NH + 2 * NKV, HD), "float32"))
    k_info, v_info = _pool(pages, kv)
    kc, vc = Var("kc", k_info), Var("vc", v_info)
    kl = Var("kl", TensorInfo((b,), "int32"))
    pt = Var("pt", TensorInfo((b, width), "int32"))
    tokens = Var("tokens", TensorInfo((b, s), "int32"))  # with a table: the step's tokens (their shape)
    bb = BlockBuilder()
    with bb.function("main", [qkv, kc, vc, kl, pt] + ([tokens] if table else [])):
        with bb.dataflow():
            rotary = bb.emit(paged_rotary(tokens, kl, head_dim=HD, rope_theta=cast(float, theta), rope_dim=rope_dim)) if table else None
            out = bb.emit_output(paged_attention(qkv, kc, vc, kl, pt, layer=1, kv_heads=NKV, rope_theta=theta, rotary=rotary, window=window, softcap=softcap, rope_dim=rope_dim))
        bb.emit_func_output(out)
    return bb.get()


_VMS: dict[tuple[str, bool, float | None, str, bool, int | None, float | None, int | None], Any] = {}


def _vm(target: str, decode: bool, theta: float | None, kv: str = "float32", table: bool = False, window: int | None = None, softcap: float | None = None, rope_dim: int | None = None) -> Any:
    key = (target, decode, theta, kv, table, window, softcap, rope_dim)
    if key not in _VMS:
        _VMS[key] = tw.VM(tw.build(_module(decode, theta, kv, table, window, softcap, rope_dim), target=target))
    return _VMS[key]


def _tokens(qkv: np.ndarray, table: bool) -> list[np.ndarray]:
    """The tokens argument of a module with a rotary table (none without)."""
    return [np.zeros(qkv.shape[:2], np.int32)] if table else []


def _rotate(x: np.ndarray, pos: int, theta: float, rope_dim: int | None = None) -> np.ndarray:
    """``x [..., HD]`` turned by the angles of position ``pos`` ("rotate half", in float64); with
    ``rope_dim`` ``r`` its first ``r`` dims only (frequencies over ``r``), the others as they are."""
    r = HD if rope_dim is None else rope_dim
    half = r // 2
    angle = pos * theta ** (-2.0 * np.arange(half) / r)
    cos, sin = np.cos(np.concatenate([angle, angle])), np.sin(np.concatenate([angle, angle]))
    x64 = x[..., :r].astype(np.float64)
    turned = np.concatenate([-x64[..., half:], x64[..., :half]], axis=-1)
    return np.concatenate([(x64 * cos + turned * sin).astype(np.float32), x[..., r:]], axis=-1)


def _case(target: str, decode: bool, lens: list[int], s: int, pool: int = 64, seed: int = 0, theta: float | None = None, kv: str = "float32", table: bool = False,
          window: int | None = None, softcap: float | None = None, rope_dim: int | None = None) -> np.ndarray:
    """Random pages (stale data must not leak in), a random cached prefix of ``lens[b]`` tokens
    per sequence and ``s`` new ones. The new keys and values must be cached as the pool's dtype
    rounds them; each new token's attention must be NumPy's over the cached keys and values (with
    a ``window``, over those of positions ``(pos - window, pos]``: transformers' sliding-window
    mask; with a ``softcap`` ``c``, of the scores ``c * tanh(score / c)``: Gemma 2's; with a
    ``rope_dim``, the queries and keys turned in their first ``rope_dim`` dims only). Returns
    the kernel's output."""
    rng = np.random.default_rng(seed)
    kvdt = np_dtype(kv)
    kc = rng.standard_normal((L, pool, NKV, HD, PAGE)).astype(kvdt)
    vc = rng.standard_normal((L, pool, PAGE, NKV, HD)).astype(kvdt)
    width = max(-(-(n + s) // PAGE) for n in lens)
    order = rng.permutation(pool)
    pages = np.zeros((len(lens), width), np.int32)
    keys, values, used = [], [], 0  # per sequence: every position's key (as cached: rotated) and value
    qkv = rng.standard_normal((len(lens), s, NH + 2 * NKV, HD)).astype(np.float32)
    for b, n in enumerate(lens):
        need = -(-(n + s) // PAGE)
        pages[b, :need] = order[used : used + need]
        used += need
        kb = rng.standard_normal((n + s, NKV, HD)).astype(kvdt).astype(np.float32)  # as cached
        vb = rng.standard_normal((n + s, NKV, HD)).astype(kvdt).astype(np.float32)
        for p in range(n):
            kc[1, pages[b, p // PAGE], :, :, p % PAGE] = kb[p]
            vc[1, pages[b, p // PAGE], p % PAGE] = vb[p]
        for t in range(s):
            raw_k = qkv[b, t, NH : NH + NKV]
            kb[n + t] = raw_k if theta is None else _rotate(raw_k, n + t, theta, rope_dim)
            vb[n + t] = qkv[b, t, NH + NKV :]
        keys.append(kb)
        values.append(vb)
    other = kc[0].copy(), vc[0].copy()
    pool = _pack(kc, vc, kv)
    out = _vm(target, decode, theta, kv, table, window, softcap, rope_dim)["main"](qkv, *pool, np.array(lens, np.int32), pages, *_tokens(qkv, table))
    kc, vc = _unpack(*pool, kv)
    group = NH // NKV
    dot = kv == "bfloat16"  # from a bfloat16 pool: bfloat16 products (dot_bf16x2)
    # a rotated key rounds to float32 then to the pool's dtype: one unit in its last place apart
    key_tol = {"float32": 1e-6, "bfloat16": 2.0**-7, "float16": 2.0**-10}[kv]
    for b, n in enumerate(lens):
        for t in range(s):
            pos = n + t
            cached_k = kc[1, pages[b, pos // PAGE], :, :, pos % PAGE].astype(np.float32)
            np.testing.assert_allclose(cached_k, keys[b][pos].astype(kvdt).astype(np.float32), rtol=key_tol, atol=1e-6)
            np.testing.assert_array_equal(vc[1, pages[b, pos // PAGE], pos % PAGE].astype(np.float32), values[b][pos].astype(kvdt).astype(np.float32))
            keys[b][pos], values[b][pos] = cached_k, values[b][pos].astype(kvdt).astype(np.float32)
        for t in range(s):
            pos = n + t
            lo = 0 if window is None else max(0, pos - window + 1)  # the first key the query sees
            q = qkv[b, t, :NH] if theta is None else _rotate(qkv[b, t, :NH], pos, theta, rope_dim)
            for h in range(NH):
                if dot:  # the query (scaled) rounded to bfloat16, as the kernel rounds it
                    qh = (q[h] * np.float32(1 / np.sqrt(HD))).astype(kvdt).astype(np.float64)
                    scores = keys[b][lo : pos + 1, h // group] @ qh
                else:
                    scores = keys[b][lo : pos + 1, h // group] @ q[h] / np.sqrt(HD)
                if softcap is not None:
                    scores = softcap * np.tanh(scores / softcap)
                p = np.exp(scores - scores.max())
                # with dot the probabilities are rounded to bfloat16 too (each against the
                # running maximum of its page's or chunk's step): within bfloat16's unit of the values
                np.testing.assert_allclose(out[b, t, h], (p / p.sum()) @ values[b][lo : pos + 1, h // group], rtol=2e-5, atol=4e-3 if dot else 2e-6)
    np.testing.assert_array_equal(kc[0], other[0])  # another layer's slice is untouched
    np.testing.assert_array_equal(vc[0], other[1])
    return np.asarray(out)


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("lens", [[0], [3], [4, 1, 9]], ids=["empty", "partial-page", "batch"])
def test_decode(target: str, lens: list[int]) -> None:
    _case(target, True, lens, 1)


@pytest.mark.parametrize("lens", [[130], [40, 200]], ids=["one-long", "two-long"])
def test_decode_splits_long_sequences_and_merges(lens: list[int]) -> None:
    _case("cpu", True, lens, 1, pool=128)


def test_decode_of_a_split_over_several_chunks() -> None:
    """At batch 8 a sequence's pages are split in 4 (``TASKS``); 300 cached tokens are 76 pages
    of 4, 19 a split: two chunks of ``CHUNK_PAGES``, the second rescaling the first's
    accumulators; the other sequences end inside a split, a chunk, a page, or are empty."""
    assert CHUNK_PAGES < 19
    _case("cpu", True, [300, 5, 0, 77, 150, 1, 64, 299], 1, pool=256, theta=THETA)
    _case("cpu", True, [299, 3, 64, 1, 0, 150, 77, 63], 1, pool=256, seed=1, kv="bfloat16")


@pytest.mark.parametrize("heads", [(8, 1), (7, 7)], ids=["group-8", "group-1"])
def test_decode_of_other_groups(monkeypatch: pytest.MonkeyPatch, heads: tuple[int, int]) -> None:
    """A group wider than ``MAX_TILE_HEADS`` (8 query heads on one kv head: not unrolled into
    registers), and one head a group (7 kv heads), with a head dim of 24 (three 8-lane vectors,
    a divisor of no wider tile), on the compiled kernel and the interpreter."""
    monkeypatch.setattr(sys.modules[__name__], "NH", heads[0])
    monkeypatch.setattr(sys.modules[__name__], "NKV", heads[1])
    monkeypatch.setattr(sys.modules[__name__], "HD", 24)
    monkeypatch.setattr(sys.modules[__name__], "_VMS", {})
    for target in ("cpu", "interp"):
        _case(target, True, [0, 9, 22], 1, theta=THETA)


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("lens, s", [([0], 1), ([0], 7), ([5], 6), ([2, 13], 5)], ids=["one", "fresh", "continued", "batch"])
def test_prefill(target: str, lens: list[int], s: int) -> None:
    _case(target, False, lens, s)


def test_prefill_of_many_rows_uses_several_row_blocks() -> None:
    _case("cpu", False, [3], 20)  # 20 tokens x 2 heads per kv head: 40 rows, three blocks of 16


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("window", [1, 5, 8])
def test_a_sliding_window(target: str, window: int) -> None:
    """A window of 1 (a query sees its own key only), 5 (not a whole number of pages of 4) and 8
    (two pages): decode after prefixes inside and past the window, splits of a long sequence
    (whose first splits are wholly before it), and prefill, fresh and continued, whose rows'
    windows start on different pages; with rotation, pages in any order."""
    _case(target, True, [0, 3, 4, 9, 30], 1, theta=THETA, window=window)
    _case(target, False, [0, 2, 13], 7, theta=THETA, window=window)
    if target == "cpu":
        _case(target, True, [130, 0, 200, 6], 1, pool=256, window=window)
        _case(target, False, [40], 21, pool=128, window=window)


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
def test_a_sliding_window_with_a_bfloat16_pool(decode: bool) -> None:
    """The window over a bfloat16 pool (the pair products), across splits and chunks."""
    if decode:
        _case("cpu", True, [299, 3, 64, 1, 0, 150, 77, 63], 1, pool=256, seed=2, kv="bfloat16", window=6, theta=THETA)
    else:
        _case("cpu", False, [5, 30], 9, pool=64, seed=3, kv="bfloat16", window=6, theta=THETA)


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
def test_soft_capped_scores(kv: str) -> None:
    """Gemma 2's soft cap ``c * tanh(score / c)`` of the scaled scores, with a window (its sliding
    layers) and without: decode, also across splits and chunks, and prefill over cached and new
    keys, compiled and on the interpreter. The cap, 0.5, is below most scores of unit-normal
    queries and keys: the same cases uncapped give other outputs."""
    for target in ("cpu", "interp"):
        capped = _case(target, True, [0, 3, 9, 30], 1, theta=THETA, kv=kv, window=6, softcap=0.5)
        _case(target, False, [0, 13], 7, theta=THETA, kv=kv, softcap=0.5)
    assert np.abs(capped - _case("interp", True, [0, 3, 9, 30], 1, theta=THETA, kv=kv, window=6)).max() > 0.1
    _case("cpu", True, [299, 64, 1, 150], 1, pool=256, seed=2, kv=kv, softcap=0.5)


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
def test_rotary_embedding_inside(target: str, decode: bool) -> None:
    """With rope_theta, the queries and the new keys are turned at position kv_len + t, as
    ``rotary_embedding`` turns them (the keys are cached turned)."""
    _case(target, decode, [0, 6, 13], 1 if decode else 5, theta=THETA)


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
@pytest.mark.parametrize("rope_dim", [None, 6], ids=["full", "partial"])
def test_a_given_rotary_table_turns_as_the_kernel_does(target: str, decode: bool, rope_dim: int | None) -> None:
    """``paged_rotary``'s table given to the op: the same rotation as computed inside, to the
    bit (the same loop makes both), for the output and the cached keys; also of a partial
    rotation (6 of the 8 dims, the table of 3 angles)."""
    s = 1 if decode else 5
    _case(target, decode, [0, 6, 13], s, theta=THETA, table=True, rope_dim=rope_dim)
    rng = np.random.default_rng(5)
    lens = np.array([2, 9], np.int32)
    qkv = rng.standard_normal((2, s, NH + 2 * NKV, HD)).astype(np.float32)
    kc, vc = _pack(rng.standard_normal((L, 16, NKV, HD, PAGE)).astype(np.float32), rng.standard_normal((L, 16, PAGE, NKV, HD)).astype(np.float32), "float32")
    pages = rng.permutation(16)[:8].astype(np.int32).reshape(2, 4)
    runs = []
    for table in (False, True):
        k, v = kc.copy(), vc.copy()
        runs.append((_vm(target, decode, THETA, table=table, rope_dim=rope_dim)["main"](qkv, k, v, lens, pages, *_tokens(qkv, table)), k, v))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
def test_a_partial_rotation_turns_the_first_rope_dim_dims(target: str, decode: bool) -> None:
    """``rope_dim`` 6 of a head dim of 8 (Phi-4-mini's 96 of 128, small): the first 6 dims of
    each query and key turned as a head of 6 would be (pairs ``i, i + 3``, frequencies over 6),
    the last 2 as they are, the keys cached so; a whole head's worth (``rope_dim`` 8) is the
    full rotation to the bit, and the full rotation gives other outputs. Compiled: also over a
    bfloat16 pool, and a decode across splits."""
    s = 1 if decode else 5
    lens = [0, 6, 13]
    partial = _case(target, decode, lens, s, theta=THETA, rope_dim=6)
    full = _case(target, decode, lens, s, theta=THETA)
    np.testing.assert_array_equal(_case(target, decode, lens, s, theta=THETA, rope_dim=HD), full)
    assert np.abs(partial - full).max() > 0.1
    if target == "cpu":
        _case(target, decode, [5, 30] if not decode else [299, 3, 64, 1], s, pool=256, seed=4, theta=THETA, kv="bfloat16", rope_dim=6)
        if decode:
            _case(target, decode, [40, 201], s, pool=128, theta=THETA, rope_dim=2)  # one pair turned, splits merged


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("lens, s, rope_dim", [([0], 1, None), ([4, 0, 17], 1, None), ([3], 5, None), ([1, 8], 3, None), ([4, 0, 17], 3, 6)])
def test_paged_rotary_is_the_cosines_and_sines_of_the_positions(target: str, lens: list[int], s: int, rope_dim: int | None) -> None:
    """(With a ``rope_dim`` of 6: 3 angles, the frequencies over 6.)"""
    r = HD if rope_dim is None else rope_dim
    b = tw.dim("b", max=8)
    seq = tw.dim("s", max=64)
    tokens = Var("tokens", TensorInfo((b, seq), "int64"))
    kl = Var("kl", TensorInfo((b,), "int32"))
    bb = BlockBuilder()
    with bb.function("main", [tokens, kl]):
        with bb.dataflow():
            out = bb.emit_output(paged_rotary(tokens, kl, head_dim=HD, rope_theta=THETA, rope_dim=rope_dim))
        bb.emit_func_output(out)
    got = tw.VM(tw.build(bb.get(), target=target))["main"](np.zeros((len(lens), s), np.int64), np.array(lens, np.int32))
    assert got.shape == (len(lens), s, 2, r // 2) and got.dtype == np.float64
    pos = np.array(lens)[:, None] + np.arange(s)[None, :]
    angle = pos[:, :, None] * THETA ** (-2.0 * np.arange(r // 2) / r)
    np.testing.assert_allclose(got[:, :, 0], np.cos(angle), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(got[:, :, 1], np.sin(angle), rtol=1e-13, atol=1e-13)



_LONGROPE = dict(short_factor=tuple(1 + 0.1 * np.arange(HD // 2)), long_factor=tuple(2 + 0.5 * np.arange(HD // 2)))
ROTARY_SCALINGS: dict[str, dict[str, Any]] = {
    "linear": dict(type="linear", factor=4.0),
    "llama3": dict(type="llama3", factor=8.0, original_context=40, low_freq_factor=1.0, high_freq_factor=4.0),
    "yarn": dict(type="yarn", factor=4.0, original_context=40, attention_factor=1.25, beta_fast=4.0, beta_slow=1.0, truncate=False),
    "longrope": dict(type="longrope", factor=4.0, original_context=40, attention_factor=1.5, **_LONGROPE),
}


@pytest.mark.parametrize("kind, rope_dim", [(kind, None) for kind in ROTARY_SCALINGS] + [("yarn", 6), ("longrope", 6)])
def test_paged_rotary_scales_the_frequencies_as_the_config_does(kind: str, rope_dim: int | None) -> None:
    """``rope_scaling``: the angles are the positions times ``LlmConfig.rope_inv_freq`` of the
    same scaling (transformers' inverse frequencies; llama3's three bands and yarn's ramp all
    present here), the cosines and sines times its attention factor; longrope's sequence whose
    step ends past the original context (37 + 5 > 40) has its long factors, the other its short
    ones. With a ``rope_dim`` of 6 (a partial rotation): 3 frequencies over 6 dims, yarn's ramp
    and longrope's 3 factors over them."""
    from tilework.llm.config import LlmConfig, RopeScaling

    r = HD if rope_dim is None else rope_dim
    params = {**ROTARY_SCALINGS[kind], **({k: v[: r // 2] for k, v in _LONGROPE.items()} if kind == "longrope" else {})}
    cfg = LlmConfig("llama", HD, 1, 1, 1, HD, HD, 8, THETA, 1e-5, 64, rope_scaling=RopeScaling(**params), rope_dim=rope_dim)
    b, seq = tw.dim("b", max=8), tw.dim("s", max=64)
    tokens, kl = Var("tokens", TensorInfo((b, seq), "int64")), Var("kl", TensorInfo((b,), "int32"))
    bb = BlockBuilder()
    with bb.function("main", [tokens, kl]):
        with bb.dataflow():
            out = bb.emit_output(paged_rotary(tokens, kl, head_dim=HD, rope_theta=THETA, rope_scaling=cfg.rope_op_scaling(), rope_dim=rope_dim))
        bb.emit_func_output(out)
    lens, s = [0, 37], 5
    got = tw.VM(tw.build(bb.get()))["main"](np.zeros((len(lens), s), np.int64), np.array(lens, np.int32))
    assert got.shape == (2, s, 2, r // 2) and cfg.rope_inv_freq().shape == (r // 2,)
    plain = THETA ** (-2.0 * np.arange(r // 2) / r)
    ratio = plain / cfg.rope_inv_freq()
    assert not np.allclose(ratio, 1)
    if kind in ("llama3", "yarn") and rope_dim is None:
        top = cfg.rope_scaling.factor
        assert np.isclose(ratio, 1).any() and np.isclose(ratio, top).any() and ((ratio > 1.01) & (ratio < top - 0.01)).any()
    for row, start in enumerate(lens):
        inv = cfg.rope_inv_freq(step_end=start + s).astype(np.float64)
        angle = (start + np.arange(s))[:, None] * inv
        m = cfg.rope_scaling.attention_factor
        np.testing.assert_allclose(got[row, :, 0], m * np.cos(angle), rtol=0, atol=1e-5)  # rope_inv_freq is float32
        np.testing.assert_allclose(got[row, :, 1], m * np.sin(angle), rtol=0, atol=1e-5)
    if kind == "longrope":
        assert not np.allclose(cfg.rope_inv_freq(step_end=40), cfg.rope_inv_freq(step_end=41))


KV16 = ["bfloat16", long_param("float16", why="the second 16-bit pool dtype (bfloat16 runs by default)")]


@pytest.mark.parametrize("kv", KV16)
@pytest.mark.parametrize("lens", [[0], [6], [4, 1, 11]], ids=["kv1", "odd", "page-crossing"])
def test_decode_with_a_16_bit_pool(kv: str, lens: list[int]) -> None:
    """The pool holds 16-bit keys and values: each new one is rounded as it is written, and
    read back widened to float32 (kv lengths 1, 7, and 5, 2, 12: the new token of the first
    and the last starts a page). (float16: long tier only.)"""
    _case("cpu", True, lens, 1, theta=THETA, kv=kv)


@pytest.mark.parametrize("kv", KV16)
@pytest.mark.parametrize("lens, s", [([0], 1), ([5], 6), ([2, 13], 5)], ids=["kv1", "page-crossing", "batch"])
def test_prefill_with_a_16_bit_pool(kv: str, lens: list[int], s: int) -> None:
    """(float16: long tier only.)"""
    _case("cpu", False, lens, s, theta=THETA, kv=kv)


def test_16_bit_pool_on_the_interpreter_and_long_splits() -> None:
    _case("interp", True, [3, 9], 1, theta=THETA, kv="bfloat16")
    _case("interp", False, [5], 6, theta=THETA, kv="bfloat16")
    _case("cpu", True, [40, 201], 1, pool=128, theta=THETA, kv="bfloat16")


def test_rotation_matches_the_rotary_embedding_op() -> None:
    """The kernel's rotation and ``tilework.op.rotary_embedding``'s agree to the last bit."""
    from tilework.op import rotary_embedding

    x = Var("x", TensorInfo((1, 3, NH + 2 * NKV, HD), "float32"))
    pos = Var("pos", TensorInfo((1, 3), "int64"))
    bb = BlockBuilder()
    with bb.function("main", [x, pos]):
        with bb.dataflow():
            out = bb.emit_output(rotary_embedding(x, pos, THETA))
        bb.emit_func_output(out)
    rng = np.random.default_rng(3)
    qkv = rng.standard_normal((1, 3, NH + 2 * NKV, HD)).astype(np.float32)
    turned = tw.VM(tw.build(bb.get()))["main"](qkv, np.array([[7, 8, 9]], np.int64))
    kc, vc = _pack(np.zeros((L, 8, NKV, HD, PAGE), np.float32), np.zeros((L, 8, PAGE, NKV, HD), np.float32), "float32")
    table = np.arange(4, dtype=np.int32)[None]
    _vm("cpu", False, THETA)["main"](qkv, kc, vc, np.array([7], np.int32), table)
    kc, vc = _unpack(kc, vc, "float32")
    for t in range(3):
        p = 7 + t
        np.testing.assert_array_equal(kc[1, table[0, p // PAGE], :, :, p % PAGE], turned[0, t, NH : NH + NKV])


def test_shapes_are_checked() -> None:
    b = tw.dim("b")
    kc, vc = (Var(name, info) for name, info in zip(("kc", "vc"), _pool(4)))
    kl = Var("kl", TensorInfo((b,), "int32"))
    pt = Var("pt", TensorInfo((b, 2), "int32"))
    bad = Var("bad", TensorInfo((b, 1, 5 + 2 * NKV, HD), "float32"))
    good = Var("good", TensorInfo((b, 1, NH + 2 * NKV, HD), "float32"))
    odd = Var("odd", TensorInfo((b, 1, NH + 2 * NKV, 7), "float32"))
    cases: list[tuple[Var, dict[str, Any], str]] = [
        (bad, {"layer": 0}, "positive multiple of 3"),
        (good, {"layer": 2}, "layer 2 is out of range"),
        (good, {"layer": 0, "kv_heads": 0}, "kv_heads must be a positive int"),
        (good, {"layer": 0, "rope_theta": -1.0}, "rope_theta must be a positive number"),
        (good, {"layer": 0, "window": 0}, "window must be a positive int or None"),
        (good, {"layer": 0, "softcap": 0.0}, "softcap must be a positive finite number or None"),
        (good, {"layer": 0, "softcap": float("inf")}, "softcap must be a positive finite number or None"),
        (good, {"layer": 0, "rope_theta": THETA, "rope_dim": 5}, "rope_dim must be a positive even int or None"),
        (good, {"layer": 0, "rope_theta": THETA, "rope_dim": HD + 2}, f"rope_dim {HD + 2} exceeds the head dim {HD}"),
        (good, {"layer": 0, "rope_dim": 6}, "a rope_dim is given but rope_theta is None"),
    ]
    half = Var("kc16", TensorInfo((L, 4, NKV, HD // 2, PAGE, 2), "bfloat16"))
    ints = Var("kci", TensorInfo((L, 4, NKV, HD, PAGE, 1), "int32"))
    unpaired = Var("kcu", TensorInfo((L, 4, NKV, HD, PAGE, 1), "bfloat16"))  # a bfloat16 pool is in pairs
    half_v = Var("vc16", _pool(4, "bfloat16")[1])
    for k, v, message in (
        (half, vc, "one dtype, got bfloat16 and float32"),
        (ints, vc, "k_cache must be one of float32, bfloat16, float16"),
        (unpaired, half_v, "k_cache's pair width .its last dim. for a bfloat16 pool: 1 != 2"),
        (Var("kc5", TensorInfo((L, 4, NKV, HD, PAGE), "float32")), vc, "k_cache must have rank 6"),
        # an int8 pool without its row of scales
        (Var("kc8", TensorInfo((L, 4, NKV, HD // 4, PAGE, 4), "int8")), Var("vc8", _pool(4, "int8")[1]), r"k_cache's head dim / pair width \+ 1 \(the scales\)"),
    ):
        bb = BlockBuilder()
        with pytest.raises(TileworkError, match=message):
            with bb.function("main", [good, k, v, kl, pt]):
                bb.emit(paged_attention(good, k, v, kl, pt, layer=0, kv_heads=NKV))
    for x, attrs, message in cases:
        bb = BlockBuilder()
        with pytest.raises(TileworkError, match=message):
            with bb.function("main", [x, kc, vc, kl, pt]):
                bb.emit(paged_attention(x, kc, vc, kl, pt, **{"kv_heads": NKV, **attrs}))
    for rotary, attrs, message in (
        (Var("r", TensorInfo((b, 1, 2, HD // 2), "float64")), {}, "rope_theta is None: nothing would be rotated"),
        (Var("r", TensorInfo((b, 1, 2, HD // 2), "float32")), {"rope_theta": THETA}, "rotary must be float64"),
        (Var("r", TensorInfo((b, 2, 2, HD // 2), "float64")), {"rope_theta": THETA}, "rotary's dim 1 and the new tokens"),
        (Var("r", TensorInfo((b, 1, 2, HD), "float64")), {"rope_theta": THETA}, "rotary's dim 3 and half the head dim"),
        (Var("r", TensorInfo((b, 1, 2, HD // 2), "float64")), {"rope_theta": THETA, "rope_dim": 6}, r"rotary's dim 3 and half the rotated dims \(rope_dim 6\)"),
    ):
        bb = BlockBuilder()
        with pytest.raises(TileworkError, match=message):
            with bb.function("main", [good, kc, vc, kl, pt, rotary]):
                bb.emit(paged_attention(good, kc, vc, kl, pt, layer=0, kv_heads=NKV, rotary=rotary, **attrs))
    ids = Var("ids", TensorInfo((b, 1), "int32"))
    rotary_cases: list[tuple[dict[str, Any], str]] = [({"head_dim": HD, "rope_theta": 0.0}, "rope_theta must be a positive number"), ({"head_dim": 7, "rope_theta": THETA}, "head_dim must be a positive even int")]
    bad_scalings = [("yarn", 2.0), ("linear", 0.0), ("llama3", 8.0, 64.0, 4.0, 1.0), ("yarn", 2.0, 3.0, 3.0, 1.0), ("longrope", 40.0, 1.0, (1.0,) * (HD // 2), (1.0,) * (HD // 2 - 1))]
    rotary_cases += [({"head_dim": HD, "rope_theta": THETA, "rope_scaling": bad}, "rope_scaling must be None, .'linear', factor.") for bad in bad_scalings]
    rotary_cases += [({"head_dim": HD, "rope_theta": THETA, "rope_dim": r}, "rope_dim must be a positive even int of at most head_dim") for r in (HD + 2, 3, 0)]
    # longrope's factors: rope_dim / 2 of them (3), not head_dim / 2
    rotary_cases.append(({"head_dim": HD, "rope_theta": THETA, "rope_dim": 6, "rope_scaling": ("longrope", 40.0, 1.0, (1.0,) * (HD // 2), (1.0,) * (HD // 2))}, "rope_scaling must be None"))
    for attrs, message in rotary_cases:
        bb = BlockBuilder()
        with pytest.raises(TileworkError, match=message):
            with bb.function("main", [ids, kl]):
                bb.emit(paged_rotary(ids, kl, **attrs))
    bb = BlockBuilder()
    odd_kc = Var("kc7", TensorInfo((L, 4, NKV, 7, PAGE, 1), "float32"))
    odd_vc = Var("vc7", TensorInfo((L, 4, PAGE, NKV, 7, 1), "float32"))
    with pytest.raises(TileworkError, match="must be even to be rotated"):
        with bb.function("main", [odd, odd_kc, odd_vc, kl, pt]):
            bb.emit(paged_attention(odd, odd_kc, odd_vc, kl, pt, layer=0, kv_heads=NKV, rope_theta=THETA))
    bb = BlockBuilder()
    odd_kc, odd_vc = Var("kc7", TensorInfo((L, 4, NKV, 3, PAGE, 2), "bfloat16")), Var("vc7", TensorInfo((L, 4, PAGE // 2, NKV, 7, 2), "bfloat16"))
    with pytest.raises(TileworkError, match="a bfloat16 pool stores groups of 2: its head dim 7 must be a multiple of 2"):
        with bb.function("main", [odd, odd_kc, odd_vc, kl, pt]):
            bb.emit(paged_attention(odd, odd_kc, odd_vc, kl, pt, layer=0, kv_heads=NKV))


def test_decode_hints_the_next_tasks_pages_during_the_value_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every sequence as long and its splits even, each task's value pass hints every
    cache line (keys and values) of every page the next task reads (``NEXT_TASK_HINTS``; within a
    thread's chunk of tasks, its next task): on the interpreter, which runs the tasks in
    order, every line task t reads was hinted while task t - 1 ran. The hints are recorded in
    place of the interpreter's no-op prefetch, the pool's reads beside them, each with the task
    running."""
    from tilework.codegen import interp
    from tilework.ir.loop import PREFETCHES
    from tilework.ir.sym import SymExpr

    per_page = NKV * HD * PAGE
    hinted: dict[int, set[tuple[str, int, int]]] = {}  # task -> (cache, page, line) hinted
    read: dict[int, set[tuple[str, int, int]]] = {}  # task -> (cache, page, line) read

    def line(name: str, idx: tuple[int, ...]) -> tuple[str, int, int]:
        a, b, c, d = idx[2:]  # a page's flat offset: keys [kv, hd, page, 1], values [page, kv, hd, 1]
        off = (a * HD + b) * PAGE + c + d if name == "k_cache" else (a * NKV + b) * HD + c + d
        return name, idx[1] + off // per_page, off % per_page * 4 // 64

    def record(kind: str, task: int, name: str, idx: tuple[int, ...], value: Any = 0.0) -> Any:
        (hinted if kind == "hint" else read).setdefault(task, set()).add(line(name, idx))
        return value

    def args(self: Any, at: Any) -> str:
        task = next((v for v in self.scope if v.name == "task"), None)
        idx = ", ".join(self.dim(i) if isinstance(i, (int, SymExpr)) else f"int({self.expr(i)})" for i in at.indices)
        return f"{-1 if task is None else self.dim(task)}, {at.buffer.name!r}, ({idx},)"

    plain_intrin, plain_load = interp._Translator.render_intrin, interp._Translator.render_load

    def render_intrin(self: Any, x: Any) -> str:
        return f"_tw_record('hint', {args(self, x.args[0])})" if x.name in PREFETCHES else plain_intrin(self, x)

    def render_load(self: Any, x: Any) -> str:
        text = plain_load(self, x)
        return f"_tw_record('read', {args(self, x)}, {text})" if x.buffer.name in ("k_cache", "v_cache") else text

    monkeypatch.setitem(interp._HELPERS, "_tw_record", record)
    monkeypatch.setattr(interp._Translator, "render_intrin", render_intrin)
    monkeypatch.setattr(interp._Translator, "render_load", render_load)
    monkeypatch.setattr(sys.modules[__name__], "_VMS", {})
    _case("interp", True, [47, 47], 1, pool=64)  # 12 pages of 4 tokens each: 3 splits of 4 pages
    tasks = sorted(t for t in read if t >= 0)
    assert len(tasks) >= 4, tasks
    for t in tasks[1:]:
        missed = read[t] - hinted.get(t - 1, set())
        assert not missed, f"task {t} read {len(missed)} lines its predecessor did not hint, e.g. {sorted(missed)[:3]}"


def _smollm2_kernel_text(kv: str, decode: bool) -> str:
    """The C of the kernel for SmolLM2's shapes (head dim 64, pages of 16, 9 query heads on 3 kv
    heads) over a pool of ``kv``."""
    from tilework.codegen.c import emit_function
    from tilework.op.paged_attention_kernel import paged_attention_kernel

    b, s, pages, width = tw.dim("b", max=8), 1 if decode else tw.dim("s", max=512), tw.dim("pages"), tw.dim("width", max=256)
    k_shape, v_shape = kv_shapes(30, pages, 3, 64, 16, kv)
    shapes = [((b, s, 15, 64), "float32"), (k_shape, kv), (v_shape, kv), ((b,), "int32"), ((b, width), "int32")]
    func, _ = paged_attention_kernel(shapes, ((b, s, 9, 64), "float32"), 3, None, 10000.0)
    return emit_function(func, "tw_x")


def test_decode_scores_two_dims_of_a_page_in_one_vector_loop() -> None:
    """From a float32 pool: a page's keys of two dims are one loop of 32 lanes over contiguous
    keys (a loop per dim of 16 lanes left gcc with half-width vectors of a 16-bit pool), the
    key's offset in its page one linear term."""
    text = _smollm2_kernel_text("float32", True)
    loop = text[text.index("for (int64_t s_j = 0;"):]
    assert loop.startswith("for (int64_t s_j = 0; s_j < 32; ++s_j)")
    assert "* 3072 + (32 * s_dd + s_j + 1024 * s_kh))]" in loop[: loop.index("}")]  # the page's block, then the key


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
def test_a_bfloat16_pool_is_multiplied_in_the_pairs_it_is_stored_in(decode: bool) -> None:
    """From a bfloat16 pool the scores and the values are ``dot_bf16x2`` (one ``vdpbf16ps`` a
    vector where the compiler targets AVX-512 BF16), the pool's pairs loaded as they lie (no
    interleaving shuffle, no copy of the pages); a float32 pool stays float32."""
    for kv, dot in (("bfloat16", True), ("float32", False)):
        text = _smollm2_kernel_text(kv, decode)
        assert ("_mm512_dpbf16_ps(" in text) == dot
        assert "tw_bf16_pairs(" not in text and "pp_kbf" not in text

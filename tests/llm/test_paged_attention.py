"""``paged_attention``: the new keys and values land in their page slots, and the attention of
each new token over the sequence's cached and new tokens matches NumPy, for decode (one token,
splits merged for long sequences) and prefill (several tokens, with and without a cached
prefix), pages in any order, batches of unequal lengths, on the C target and the interpreter."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tilework.errors import TileworkError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.op import paged_attention

L, NKV, HD, PAGE, NH = 2, 3, 8, 4, 6


def _module(decode: bool) -> tw.IRModule:
    b = tw.dim("b", max=8)
    s: Any = 1 if decode else tw.dim("s", max=64)
    pages, width = tw.dim("pages"), tw.dim("width", max=256)
    q = Var("q", TensorInfo((b, s, NH, HD), "float32"))
    k = Var("k", TensorInfo((b, s, NKV, HD), "float32"))
    v = Var("v", TensorInfo((b, s, NKV, HD), "float32"))
    kc = Var("kc", TensorInfo((L, pages, NKV, HD, PAGE), "float32"))
    vc = Var("vc", TensorInfo((L, pages, PAGE, NKV, HD), "float32"))
    kl = Var("kl", TensorInfo((b,), "int32"))
    pt = Var("pt", TensorInfo((b, width), "int32"))
    bb = BlockBuilder()
    with bb.function("main", [q, k, v, kc, vc, kl, pt]):
        with bb.dataflow():
            out = bb.emit_output(paged_attention(q, k, v, kc, vc, kl, pt, layer=1))
        bb.emit_func_output(out)
    return bb.get()


_VMS: dict[tuple[str, bool], Any] = {}


def _vm(target: str, decode: bool) -> Any:
    key = (target, decode)
    if key not in _VMS:
        _VMS[key] = tw.VM(tw.build(_module(decode), target=target))
    return _VMS[key]


def _case(target: str, decode: bool, lens: list[int], s: int, pool: int = 64, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    kc = rng.standard_normal((L, pool, NKV, HD, PAGE)).astype(np.float32)  # stale data must not leak in
    vc = rng.standard_normal((L, pool, PAGE, NKV, HD)).astype(np.float32)
    width = max(-(-(n + s) // PAGE) for n in lens)
    order = rng.permutation(pool)
    table = np.zeros((len(lens), width), np.int32)
    keys, values, used = [], [], 0
    for b, n in enumerate(lens):
        need = -(-(n + s) // PAGE)
        table[b, :need] = order[used : used + need]
        used += need
        kb = rng.standard_normal((n + s, NKV, HD)).astype(np.float32)
        vb = rng.standard_normal((n + s, NKV, HD)).astype(np.float32)
        for p in range(n):
            kc[1, table[b, p // PAGE], :, :, p % PAGE] = kb[p]
            vc[1, table[b, p // PAGE], p % PAGE] = vb[p]
        keys.append(kb)
        values.append(vb)
    other = kc[0].copy(), vc[0].copy()
    q = rng.standard_normal((len(lens), s, NH, HD)).astype(np.float32)
    k = np.stack([keys[b][n:] for b, n in enumerate(lens)])
    v = np.stack([values[b][n:] for b, n in enumerate(lens)])
    out = _vm(target, decode)["main"](q, k, v, kc, vc, np.array(lens, np.int32), table)
    group = NH // NKV
    for b, n in enumerate(lens):
        for t in range(s):
            pos = n + t
            np.testing.assert_array_equal(kc[1, table[b, pos // PAGE], :, :, pos % PAGE], keys[b][pos])
            np.testing.assert_array_equal(vc[1, table[b, pos // PAGE], pos % PAGE], values[b][pos])
            for h in range(NH):
                scores = keys[b][: pos + 1, h // group] @ q[b, t, h] / np.sqrt(HD)
                p = np.exp(scores - scores.max())
                np.testing.assert_allclose(out[b, t, h], (p / p.sum()) @ values[b][: pos + 1, h // group], rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(kc[0], other[0])  # another layer's slice is untouched
    np.testing.assert_array_equal(vc[0], other[1])


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("lens", [[0], [3], [4, 1, 9]], ids=["empty", "partial-page", "batch"])
def test_decode(target: str, lens: list[int]) -> None:
    _case(target, True, lens, 1)


@pytest.mark.parametrize("lens", [[130], [40, 200]], ids=["one-long", "two-long"])
def test_decode_splits_long_sequences_and_merges(lens: list[int]) -> None:
    _case("cpu", True, lens, 1, pool=128)


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("lens, s", [([0], 1), ([0], 7), ([5], 6), ([2, 13], 5)], ids=["one", "fresh", "continued", "batch"])
def test_prefill(target: str, lens: list[int], s: int) -> None:
    _case(target, False, lens, s)


def test_prefill_of_many_rows_uses_several_row_blocks() -> None:
    _case("cpu", False, [3], 20)  # 20 tokens x 2 heads per kv head: 40 rows, three blocks of 16


def test_shapes_are_checked() -> None:
    b = tw.dim("b")
    q = Var("q", TensorInfo((b, 1, 5, HD), "float32"))
    k = Var("k", TensorInfo((b, 1, NKV, HD), "float32"))
    kc = Var("kc", TensorInfo((L, 4, NKV, HD, PAGE), "float32"))
    vc = Var("vc", TensorInfo((L, 4, PAGE, NKV, HD), "float32"))
    kl = Var("kl", TensorInfo((b,), "int32"))
    pt = Var("pt", TensorInfo((b, 2), "int32"))
    bb = BlockBuilder()
    with pytest.raises(TileworkError, match="multiple of kv heads"):
        with bb.function("main", [q, k, kc, vc, kl, pt]):
            bb.emit(paged_attention(q, k, k, kc, vc, kl, pt, layer=0))
    bb = BlockBuilder()
    with pytest.raises(TileworkError, match="layer 2 is out of range"):
        with bb.function("main", [k, kc, vc, kl, pt]):
            bb.emit(paged_attention(k, k, k, kc, vc, kl, pt, layer=2))

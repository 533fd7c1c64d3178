"""The paged KV cache's bookkeeping: pages reserved per step, reused after removal, shared by
forks and copied before a shared page is written, a full pool reported, truncation."""

from __future__ import annotations

import numpy as np
import pytest

from tilework.errors import TileworkError
from tilework.llm.kv_cache import KVCacheFull, PagedKVCache


def cache(pages: int = 8, page: int = 4) -> PagedKVCache:
    return PagedKVCache(layers=2, kv_heads=1, head_dim=2, pages=pages, page=page)


def test_steps_reserve_pages_and_give_the_table() -> None:
    c = cache()
    a, b = c.add(), c.add()
    kv_len, table = c.step_inputs([a, b], 6)  # 6 tokens: 2 pages each
    assert kv_len.tolist() == [0, 0] and table.shape == (2, 2) and kv_len.dtype == np.int32 and table.dtype == np.int32
    assert len({*table[0], *table[1]}) == 4 and c.free_pages == 4
    c.advance([a, b], 6)
    kv_len, table = c.step_inputs([a], 1)  # 7th token: still page 2
    assert kv_len.tolist() == [6] and table.shape == (1, 2) and c.free_pages == 4
    c.advance([a], 1)
    kv_len, table = c.step_inputs([a, b], 2)  # a: 9 tokens -> 3 pages; b: 8 -> 2 pages
    assert kv_len.tolist() == [7, 6] and table.shape == (2, 3) and c.free_pages == 3
    with pytest.raises(TileworkError, match="advance past its reserved pages"):
        c.advance([b], 3)


def test_removed_sequences_give_their_pages_back_for_reuse() -> None:
    c = cache(pages=4)
    a = c.add()
    _, table = c.step_inputs([a], 16)
    c.advance([a], 16)
    assert c.free_pages == 0
    with pytest.raises(KVCacheFull, match="needs 1 more page"):
        c.step_inputs([c.add()], 1)
    c.remove(a)
    assert c.free_pages == 4
    b = c.add()
    _, again = c.step_inputs([b], 16)
    assert sorted(again[0].tolist()) == sorted(table[0].tolist())
    with pytest.raises(TileworkError, match="no sequence"):
        c.length(a)


def test_a_fork_shares_pages_until_it_writes_into_a_shared_one() -> None:
    c = cache()
    a = c.add()
    _, ta = c.step_inputs([a], 6)
    c.advance([a], 6)
    c.k[:, ta[0, 1]] = 7.0  # the partly filled page (tokens 4..5) holds data
    b = c.fork(a)
    assert c.length(b) == 6 and c.free_pages == 6  # nothing copied yet
    _, tb = c.step_inputs([b], 1)  # b writes token 6 into the shared page: it gets a copy
    assert tb[0, 0] == ta[0, 0] and tb[0, 1] != ta[0, 1]
    assert np.all(c.k[:, tb[0, 1]] == 7.0)
    c.advance([b], 1)
    _, ta2 = c.step_inputs([a], 1)  # a's page is its own again: written in place
    assert ta2[0, 1] == ta[0, 1]
    c.remove(a)
    assert c.length(b) == 7
    c.remove(b)
    assert c.free_pages == 8


def test_truncate_frees_the_pages_past_the_new_length() -> None:
    c = cache()
    a = c.add()
    c.step_inputs([a], 10)
    c.advance([a], 10)
    assert c.free_pages == 5
    c.truncate(a, 4)
    assert c.length(a) == 4 and c.free_pages == 7
    c.truncate(a, 0)
    assert c.free_pages == 8
    with pytest.raises(TileworkError, match="cannot truncate"):
        c.truncate(a, 1)


def test_bad_sizes_are_errors() -> None:
    with pytest.raises(TileworkError, match="positive sizes"):
        PagedKVCache(0, 1, 1, 1)
    c = cache()
    with pytest.raises(TileworkError, match="at least one token"):
        c.step_inputs([c.add()], 0)
    assert PagedKVCache.for_tokens(1, 1, 1, 33, page=16).num_pages == 3
    for head_dim, page in ((7, 16), (8, 5)):  # a bfloat16 pool is stored in pairs of dims and of keys
        with pytest.raises(TileworkError, match=f"groups of 2: head_dim={head_dim} and page={page} must be multiples of 2"):
            PagedKVCache(1, 1, head_dim, 1, page=page, dtype="bfloat16")
    odd = PagedKVCache(1, 1, 7, 1, page=5, dtype="float32")  # the others are not
    assert odd.k.shape == (1, 1, 1, 7, 5, 1) and odd.v.shape == (1, 1, 5, 1, 7, 1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_pool_takes_half_the_bytes_and_copies_shared_pages_exactly(dtype: str) -> None:
    c = PagedKVCache(layers=2, kv_heads=1, head_dim=2, pages=8, page=4, dtype=dtype)
    assert c.k.dtype.name == c.v.dtype.name == dtype and c.bytes == 2 * 2 * 8 * 4 * 2 * 2
    a = c.add()
    _, ta = c.step_inputs([a], 6)
    c.k[:, ta[0, 1]] = 1.0 / 3  # rounded to the pool's dtype
    c.advance([a], 6)
    b = c.fork(a)
    _, tb = c.step_inputs([b], 1)  # b writes into the shared second page: a copy of it
    assert tb[0, 1] != ta[0, 1]
    np.testing.assert_array_equal(c.k[:, tb[0, 1]], c.k[:, ta[0, 1]])


def test_the_pool_dtype_is_checked_and_the_cli_offers_every_one() -> None:
    from tilework.cli.llm import KV_DTYPE_CHOICES
    from tilework.llm.kv_cache import KV_DTYPES

    assert sorted(KV_DTYPE_CHOICES) == sorted(KV_DTYPES)
    with pytest.raises(TileworkError, match="holds one of float32, bfloat16, float16, int8, got 'uint8'"):
        PagedKVCache(1, 1, 1, 1, dtype="uint8")
    with pytest.raises(TileworkError, match="an int8 KV cache stores groups of 4: head_dim=6 and page=16 must be multiples of 4"):
        PagedKVCache(1, 1, 6, 1, dtype="int8")


def fill(c: PagedKVCache, sid: int, n: int, value: float | None = None) -> np.ndarray:
    """Append ``n`` tokens to ``sid`` (each written page set to ``value``); its page table."""
    _, table = c.step_inputs([sid], n)
    if value is not None:
        first = c.length(sid) // c.page
        c.k[:, table[0, first:]] = value
    c.advance([sid], n)
    return table[0]


def test_a_prefix_starts_on_the_published_pages_it_begins_with() -> None:
    c = cache(pages=8, page=4)
    prompt = list(range(10, 21))  # 11 tokens: 2 full pages
    a = c.add(prompt)
    assert c.length(a) == 0  # nothing published yet
    table = fill(c, a, len(prompt))
    assert c.publish(a, prompt) == 2 and c.published_pages == 2
    assert c.publish(a, prompt) == 0  # already findable
    b = c.add(prompt + [99, 98])
    assert c.length(b) == 8 and c._seqs[b].pages == list(table[:2])
    assert c.length(c.add(prompt[:9])) == 8  # 9 tokens: 2 pages, one token left to feed
    assert c.length(c.add(prompt[:8])) == 4  # 8 tokens: the last page would leave nothing to feed
    assert c.length(c.add([10, 11, 12, 13, 0, 0, 0, 0, 0])) == 4  # the second page differs
    assert c.length(c.add([0] + prompt)) == 0  # the same tokens at other positions: no match
    with pytest.raises(TileworkError, match="holds 11 tokens; cannot publish 12"):
        c.publish(a, prompt + [1])


def test_published_pages_outlive_their_sequence_and_are_taken_back_last() -> None:
    c = cache(pages=6, page=4)
    prompt = list(range(12))
    a = c.add()
    pages = fill(c, a, 12, 5.0)
    c.publish(a, prompt)
    c.remove(a)
    assert c.free_pages == 6 and c.published_pages == 3
    b = c.add(prompt + [1])  # found after its sequence went: the same pages, the same data
    assert c.length(b) == 12 and c._seqs[b].pages == list(pages) and np.all(c.k[:, pages] == 5.0)
    c.remove(b)
    d = c.add()
    fill(c, d, 16)  # 4 pages: the 3 never-used ones, then the published chain's last page
    assert c.published_pages == 2 and c.length(c.add(prompt + [1])) == 8


def test_a_published_page_is_never_written() -> None:
    c = cache(pages=8, page=4)
    prompt = list(range(8))
    a = c.add()
    pages = fill(c, a, 8, 3.0)
    c.publish(a, prompt)
    b = c.add(prompt + [1])  # shares both pages
    c.truncate(b, 6)
    fill(c, b, 2, 9.0)  # writes into the shared second page: b gets a copy
    assert c._seqs[b].pages[1] != pages[1] and np.all(c.k[:, pages[1]] == 3.0)
    c.remove(b)
    c.truncate(a, 6)
    fill(c, a, 1, 4.0)  # a alone writes into its published page: unpublished first
    assert c.published_pages == 1 and c.length(c.add(prompt + [1])) == 4
    c.forget_prefixes()
    assert c.published_pages == 0 and c.length(c.add(prompt + [1])) == 0

"""The paged KV cache: a pool of fixed-size pages and the page tables of the sequences in it.

The pool is two arrays the compiled ``paged_attention`` kernels read and write in place
(``tilework.op.paged_attention`` documents the layout): ``k [layers, pages, kv_heads, head_dim /
w, page, w]`` and ``v [layers, pages, page / w, kv_heads, head_dim, w]``, in pairs of width ``w``
(2 for bfloat16: a key's dims two by two side by side, and two keys' values; 1 for the others:
a page's keys contiguous per dim), of ``dtype``: float32, or bfloat16 or float16 (half the bytes
a decode step reads for its attention; the kernels round each new key and value once as they
write it), or int8 (a quarter, and a row of scales: ``k`` has ``head_dim / 4 + 1`` rows a kv
head, the kernels quantize each new key and value as they write it; ``kv_shapes``).
A sequence is a list of pages and a length. ``add`` starts one, ``remove`` frees its pages,
``fork`` makes a sequence that shares the pages of another (a page is freed when its last user
goes; a shared page is copied before anyone writes into it), ``step_inputs`` gives the
``kv_len``/``page_table`` arrays of a step after reserving the pages it writes, and ``advance``
records what a step appended. Freed pages are reused first. Running out of pages is a
``KVCacheFull`` error that says how many are free; nothing is ever grown behind the caller's
back.

**Prefix caching.** ``publish(sid, tokens)`` records the sequence's full pages under the tokens
they hold (a digest chained page by page: a page is found only after the same tokens before
it), and ``add(prefix=tokens)`` starts a sequence on the longest run of published pages its
tokens begin with, always leaving at least one of ``tokens`` to feed (a step's logits are those
of its last token). A published page outlives its sequences: when its last user goes it is kept,
still findable, among the free pages, and taken back (least recently freed first, a chain's
later pages before its earlier ones) only when no never-used or unpublished page is left.
``free_pages`` counts them free. A published page is never written: a sequence that truncates
into one and writes there copies it first when others share it, else unpublishes it. Callers
publish pages that prefill computed: prefill gives a token's keys and values the same bits
however the prompt is cut into steps (tested; not for longrope models, whose callers publish
nothing: ``LlmConfig.prefill_boundary``), so a sequence started on published pages goes on
exactly as if it had fed the whole prompt; a decode step's keys and values may differ from
prefill's in the last bits, so generated tokens are not published.

The pool's memory is committed as pages are first written (an anonymous map of ordinary pages),
so a large pool costs only what the sequences in it use.

``k_bits``/``v_bits`` are the same memory as storage NumPy has without ml_dtypes (uint16 for
bfloat16; the arrays themselves otherwise): what the native runtime is given (``LLM`` binds it
with ``bits=``). ``k``/``v`` are typed views made on first use: NumPy's bfloat16 comes from
ml_dtypes, whose import registers its casts for about a second, and a start of ``tilework
generate`` does not need it.

The per-step work here is list bookkeeping and filling two small int32 arrays; the attention
itself runs in the compiled kernels.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import mmap
from dataclasses import dataclass, field
from typing import Sequence, TypeVar

import numpy as np

from tilework.errors import TileworkError
from tilework.ir.dtype import np_dtype
from tilework.op.paged_attention import KV_DTYPES, SCALE_ROWS, a_pool, pair_width

PAGE = 16
P = TypeVar("P")


class KVCacheFull(TileworkError):
    """The pool has no free page for a step; finish or remove sequences, or make a larger pool."""


@dataclass
class _Sequence:
    pages: list[int] = field(default_factory=list)
    length: int = 0  # tokens in the cache


def _lazy_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros in anonymous memory of ordinary pages, committed as they are first written.
    (A large NumPy allocation asks for 2 MiB huge pages: one token written to each layer's slice
    would then commit 2 MiB per layer.)"""
    count = int(np.prod(shape))
    buf = mmap.mmap(-1, max(count * dtype.itemsize, 1))
    return np.frombuffer(buf, dtype, count).reshape(shape)


def kv_shapes(layers: int, pages: P, kv_heads: int, head_dim: int, page: int, dtype: str) -> tuple[tuple[int | P, ...], tuple[int | P, ...]]:
    """The shapes of a pool of ``pages`` pages (a count, or a dim of a spec) of keys and values
    (``tilework.op.paged_attention``'s layout): one home for the cache and the compiled
    functions' spec."""
    w = pair_width(dtype)
    rows = SCALE_ROWS.get(dtype, 0)  # an int8 pool's scales: a row after each kv head's keys
    return (layers, pages, kv_heads, head_dim // w + rows, page, w), (layers, pages, page // w, kv_heads, head_dim, w)


class PagedKVCache:
    """See the module docstring. ``pages`` is the pool size; ``page`` tokens per page."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, pages: int, page: int = PAGE, dtype: str = "float32") -> None:
        if min(layers, kv_heads, head_dim, pages, page) < 1:
            raise TileworkError(f"a KV cache needs positive sizes, got layers={layers} kv_heads={kv_heads} head_dim={head_dim} pages={pages} page={page}")
        if dtype not in KV_DTYPES:
            raise TileworkError(f"a KV cache holds one of {', '.join(KV_DTYPES)}, got {dtype!r}")
        w = pair_width(dtype)
        if head_dim % w or page % w:
            raise TileworkError(f"{a_pool(dtype)} KV cache stores groups of {w}: head_dim={head_dim} and page={page} must be multiples of {w}")
        self.layers, self.kv_heads, self.head_dim, self.page, self.dtype = layers, kv_heads, head_dim, page, dtype
        storage = np.dtype(np.uint16) if dtype == "bfloat16" else np_dtype(dtype)
        k_shape, v_shape = kv_shapes(layers, pages, kv_heads, head_dim, page, dtype)
        self.k_bits = _lazy_zeros(k_shape, storage)
        self.v_bits = _lazy_zeros(v_shape, storage)
        self._free = list(range(pages - 1, -1, -1))  # popped from the end: page 0 first
        self._refs = [0] * pages
        self._page_of: dict[bytes, int] = {}  # published pages by digest
        self._digest_of: dict[int, bytes] = {}
        self._kept: collections.OrderedDict[int, None] = collections.OrderedDict()  # published pages no sequence uses, least recently freed first
        self._seqs: dict[int, _Sequence] = {}
        self._next_id = 0

    @functools.cached_property
    def k(self) -> np.ndarray:
        """The keys as an array of ``dtype`` (a view of ``k_bits``)."""
        return self.k_bits.view(np_dtype(self.dtype))

    @functools.cached_property
    def v(self) -> np.ndarray:
        """The values as an array of ``dtype`` (a view of ``v_bits``)."""
        return self.v_bits.view(np_dtype(self.dtype))

    @staticmethod
    def for_tokens(layers: int, kv_heads: int, head_dim: int, tokens: int, page: int = PAGE, dtype: str = "float32") -> "PagedKVCache":
        """A pool holding ``tokens`` tokens in all (rounded up to whole pages)."""
        return PagedKVCache(layers, kv_heads, head_dim, max(1, -(-tokens // page)), page, dtype)

    # -- sequences ---------------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        return len(self._refs)

    @property
    def free_pages(self) -> int:
        """Pages a step may take: never-used or released ones, and published ones no sequence uses."""
        return len(self._free) + len(self._kept)

    @property
    def published_pages(self) -> int:
        """Pages findable by ``add(prefix=...)`` (in use or kept among the free)."""
        return len(self._page_of)

    @property
    def bytes(self) -> int:
        return int(self.k_bits.nbytes + self.v_bits.nbytes)

    def add(self, prefix: Sequence[int] = ()) -> int:
        """A new sequence; its id. Empty, or holding the longest run of published pages that
        ``prefix`` (token ids) begins with, short of its last token (``length`` says how many
        tokens it holds: feed it ``prefix[length:]``)."""
        sid = self._next_id
        self._next_id += 1
        seq = self._seqs[sid] = _Sequence()
        for digest in _digests(prefix[: max(len(prefix) - 1, 0)], self.page):
            p = self._page_of.get(digest)
            if p is None:
                break
            if self._refs[p] == 0:
                del self._kept[p]
            self._refs[p] += 1
            seq.pages.append(p)
        seq.length = len(seq.pages) * self.page
        return sid

    def publish(self, sid: int, tokens: Sequence[int]) -> int:
        """Make the full pages of sequence ``sid`` findable by the tokens they hold: ``tokens``
        are its first tokens (at most its length), fed by prefill (see the module docstring).
        Pages already published under the same tokens stay the ones found. Returns how many
        pages are newly published."""
        seq = self._get(sid)
        if len(tokens) > seq.length:
            raise TileworkError(f"sequence {sid} holds {seq.length} tokens; cannot publish {len(tokens)}")
        new, digest = 0, b""
        for i, p in enumerate(seq.pages[: len(tokens) // self.page]):
            known = self._digest_of.get(p)
            if known is not None:  # published already (by this sequence's chunks, or found): its digest chains on
                digest = known
                continue
            digest = _digest(digest, tokens[i * self.page : (i + 1) * self.page])
            if digest not in self._page_of:
                self._page_of[digest], self._digest_of[p] = p, digest
                new += 1
        return new

    def forget_prefixes(self) -> None:
        """Unpublish every page (those no sequence uses become plain free pages)."""
        for p in self._kept:
            self._free.append(p)
        self._kept.clear()
        self._page_of.clear()
        self._digest_of.clear()

    def remove(self, sid: int) -> None:
        """Free the sequence's pages (those it shares stay with the other users)."""
        seq = self._get(sid)
        for p in reversed(seq.pages):  # a chain's last pages are taken back first
            self._release(p)
        del self._seqs[sid]

    def fork(self, sid: int) -> int:
        """A new sequence with the same tokens, sharing the pages."""
        src = self._get(sid)
        new = self.add()
        self._seqs[new] = _Sequence(list(src.pages), src.length)
        for p in src.pages:
            self._refs[p] += 1
        return new

    def length(self, sid: int) -> int:
        return self._get(sid).length

    def sequences(self) -> list[int]:
        return list(self._seqs)

    def truncate(self, sid: int, length: int) -> None:
        """Forget the tokens from ``length`` on (pages past it are freed)."""
        seq = self._get(sid)
        if not 0 <= length <= seq.length:
            raise TileworkError(f"cannot truncate sequence {sid} of {seq.length} tokens to {length}")
        keep = -(-length // self.page)
        for p in reversed(seq.pages[keep:]):
            self._release(p)
        del seq.pages[keep:]
        seq.length = length

    # -- steps -------------------------------------------------------------------------------

    def step_inputs(self, sids: Sequence[int], new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """``(kv_len int32[b], page_table int32[b, width])`` for a step appending ``new_tokens``
        to each of ``sids``, after reserving the pages it writes (copying any shared page that
        would be written). ``width`` covers the longest sequence after the step."""
        if new_tokens < 1:
            raise TileworkError(f"a step appends at least one token, got {new_tokens}")
        seqs = [self._get(s) for s in sids]
        need = sum(max(0, -(-(s.length + new_tokens) // self.page) - len(s.pages)) + len(self._shared_tail(s, new_tokens)) for s in seqs)
        if need > self.free_pages:
            raise KVCacheFull(f"the KV cache needs {need} more page(s) of {self.page} tokens for this step and has {self.free_pages} free of {self.num_pages}")
        for s in seqs:
            self._own_tail(s, new_tokens)
            while len(s.pages) * self.page < s.length + new_tokens:
                s.pages.append(self._take())
        width = max(len(s.pages) for s in seqs)
        kv_len = np.fromiter((s.length for s in seqs), np.int32, len(seqs))
        table = np.zeros((len(seqs), width), np.int32)
        for i, s in enumerate(seqs):
            table[i, : len(s.pages)] = s.pages
        return kv_len, table

    def advance(self, sids: Sequence[int], new_tokens: int) -> None:
        """Record that a step appended ``new_tokens`` to each of ``sids``."""
        for sid in sids:
            seq = self._get(sid)
            if seq.length + new_tokens > len(seq.pages) * self.page:
                raise TileworkError(f"sequence {sid}: advance past its reserved pages (call step_inputs first)")
            seq.length += new_tokens

    # -- pages -------------------------------------------------------------------------------

    def _get(self, sid: int) -> _Sequence:
        seq = self._seqs.get(sid)
        if seq is None:
            raise TileworkError(f"no sequence {sid} in the KV cache")
        return seq

    def _take(self) -> int:
        if self._free:
            p = self._free.pop()
        else:  # the published page least recently freed
            p, _ = self._kept.popitem(last=False)
            self._unpublish(p)
        self._refs[p] = 1
        return p

    def _release(self, p: int) -> None:
        self._refs[p] -= 1
        if self._refs[p] == 0:
            if p in self._digest_of:
                self._kept[p] = None
            else:
                self._free.append(p)

    def _unpublish(self, p: int) -> None:
        del self._page_of[self._digest_of.pop(p)]

    def _shared_tail(self, seq: _Sequence, new_tokens: int) -> list[int]:
        """Indices of the sequence's pages that a step of ``new_tokens`` writes into and that
        another sequence shares (only a partly filled last page can be, or a published page
        truncated into)."""
        return [i for i in self._written(seq, new_tokens) if self._refs[seq.pages[i]] > 1]

    def _written(self, seq: _Sequence, new_tokens: int) -> range:
        first = seq.length // self.page
        last = (seq.length + new_tokens - 1) // self.page
        return range(first, min(last + 1, len(seq.pages)))

    def _own_tail(self, seq: _Sequence, new_tokens: int) -> None:
        """Copy the shared pages this step writes into; unpublish the published ones it alone uses."""
        for i in self._written(seq, new_tokens):
            p = seq.pages[i]
            if self._refs[p] == 1:
                if p in self._digest_of:
                    self._unpublish(p)
                continue
            q = self._take()
            self.k_bits[:, q] = self.k_bits[:, p]
            self.v_bits[:, q] = self.v_bits[:, p]
            self._release(p)
            seq.pages[i] = q


def _digest(before: bytes, page: Sequence[int]) -> bytes:
    """The digest of a page of tokens after the pages whose digest is ``before``: it covers every
    token up to the end of the page."""
    return hashlib.blake2b(before + np.asarray(page, np.int64).tobytes(), digest_size=16).digest()


def _digests(tokens: Sequence[int], page: int) -> list[bytes]:
    """The chained digests of the full pages of ``tokens``."""
    out, digest = [], b""
    for start in range(0, len(tokens) - page + 1, page):
        digest = _digest(digest, tokens[start : start + page])
        out.append(digest)
    return out


__all__ = ["PagedKVCache", "KVCacheFull", "kv_shapes", "PAGE", "KV_DTYPES"]

"""The VM's memory: planned storage, a pooled allocator for dynamic sizes, and counters.

Each VM owns one ``Memory``. It hands out three kinds of memory:

- *static* storage: one block per planned static arena (``plan_memory`` sized it for the
  declared upper bounds of the dims). It is obtained on the first call that reaches it and kept
  for the life of the VM, so later calls obtain no new memory for their intermediates. An
  arena planned for more than ``GROW_ABOVE`` bytes is sized by need instead: its block holds
  what the shapes seen so far carved from it and grows (at least doubling, never beyond the
  planned bound) when a carve needs more, so a 3-row call of a model declared for a million
  rows holds kilobytes, not gigabytes. Tensors carved before a growth keep the old block
  (they are views of it); the plan never needs two tensors to share memory, only not to
  overlap while both live, which holds across blocks.
- *pooled* storage: blocks whose size is only known per call (unbounded dims). Sizes are
  rounded up to a size class (four classes per power of two, at least 256 bytes); a released
  block goes to the free list of its class and serves the next request of that class, in
  this call or a later one. ``trim()`` gives the free lists back.
- *fresh* tensors: outputs (the caller owns them) and allocations that were not planned; each
  is a new NumPy array.

Tensors are carved from storage as NumPy views (``carve``): C-contiguous, of the requested
dtype, at an offset that the plan keeps a multiple of ``ALIGN``; every block starts at an
``ALIGN``-byte boundary. Counters record every time new memory is obtained (``allocations``,
``allocated_bytes``) and, per kind, what is held, reused and used at the current shapes; with
``track_live`` the live and peak bytes of fresh tensors are followed too (a weak reference per
array, so it is off by default). A VM's memory is not shared between threads.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from tilework.errors import RuntimeCheckError

ALIGN = 64
MIN_CLASS = 256
GROW_ABOVE = 64 << 20  # bytes: a larger static arena is sized by need, up to its bound


def size_class(nbytes: int) -> int:
    """The pooled block size serving a request of ``nbytes``: the next of four steps per power
    of two (at most 25% above the request), and at least ``MIN_CLASS``."""
    if nbytes <= MIN_CLASS:
        return MIN_CLASS
    step = 1 << (nbytes.bit_length() - 3)
    return -(-nbytes // step) * step


def _aligned_block(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + ALIGN, np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return raw[skip : skip + nbytes]


def empty_tensor(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty(shape, dtype)``; a tensor whose byte size does not fit in int64, or that cannot
    be allocated, is a ``RuntimeCheckError`` with the exported C runtime's message
    (``twrt_alloc_fresh``) instead of NumPy's "array is too big"."""
    try:
        return np.empty(shape, dtype)
    except (ValueError, MemoryError):
        dims = tuple(int(d) for d in shape)
        if any(d < 0 for d in dims):
            raise  # NumPy's "negative dimensions are not allowed"
        nbytes = np.dtype(dtype).itemsize
        for d in dims:  # as the C runtime multiplies: a partial product past int64 overflows
            nbytes *= d
            if nbytes > 2**63 - 1:
                break
        if nbytes > 2**63 - 1:
            raise RuntimeCheckError(f"out of memory: a {np.dtype(dtype).name} tensor of shape {dims} is too large (its byte size exceeds 2^63 - 1)") from None
        raise RuntimeCheckError(f"out of memory: a tensor of {nbytes} bytes") from None


class Storage:
    """A block of bytes that tensors are carved from. ``used`` is the high-water mark of the
    carves since the block was last handed out (the bytes the current shapes need). A storage
    with a ``limit`` above its ``capacity`` (a static arena sized by need) is given a larger
    block by ``carve`` when a tensor does not fit, up to ``limit`` bytes."""

    __slots__ = ("buf", "capacity", "used", "requested", "limit", "owner")

    def __init__(self, capacity: int, limit: int | None = None, owner: "Memory | None" = None) -> None:
        self.buf = _aligned_block(capacity)
        self.capacity = capacity
        self.used = 0
        self.requested = 0
        self.limit = capacity if limit is None else limit
        self.owner = owner  # whose counters a growth updates

    def grow(self, need: int) -> None:
        """A new block of at least ``need`` bytes (at least double the old one, at most
        ``limit``); tensors carved from the old block keep it alive."""
        size = min(self.limit, max(need, 2 * self.capacity))
        if self.owner is not None:
            self.owner.static_allocations += 1
            self.owner.static_bytes += size - self.capacity
        self.buf = _aligned_block(size)
        self.capacity = size


def carve(storage: Storage, shape: tuple[int, ...], offset: int, dtype: np.dtype) -> np.ndarray:
    """A C-contiguous ``dtype`` tensor of ``shape`` over ``storage`` at byte ``offset``."""
    try:
        a = np.ndarray(shape, dtype, storage.buf, offset)
    except TypeError:
        need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if need <= storage.limit:
            storage.grow(need)
            return carve(storage, shape, offset, dtype)
        raise RuntimeCheckError(
            f"planned storage of {storage.capacity} bytes is too small for a {dtype} tensor of shape {tuple(shape)} "
            f"at offset {offset} ({need} bytes): a dim exceeds the upper bound the plan was made for"
        ) from None
    end = offset + a.nbytes
    if end > storage.used:
        storage.used = end
    return a


class CarveSite:
    """``carve`` at one call site of one VM, remembering its last tensor: when the storage's
    block, the shape and the offset are those of the last call, that tensor is handed out again
    (the same view of the same bytes), so a decoding step, which carves the same tensors at
    every step, builds no new array objects."""

    __slots__ = ("dtype", "buf", "shape", "offset", "array", "end")

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.buf: Any = None
        self.shape: tuple[int, ...] = ()
        self.offset = -1
        self.array: Any = None
        self.end = 0

    def __call__(self, storage: Storage, shape: tuple[int, ...], offset: int) -> np.ndarray:
        if storage.buf is self.buf and offset == self.offset and shape == self.shape:
            if self.end > storage.used:
                storage.used = self.end
            return self.array
        a = carve(storage, shape, offset, self.dtype)
        self.buf, self.shape, self.offset, self.array, self.end = storage.buf, shape, offset, a, offset + a.nbytes
        return a


class StaticSlot:
    """One planned static arena of one VM: its block is obtained on the first call and kept."""

    __slots__ = ("memory", "capacity", "name", "storage")

    def __init__(self, memory: "Memory", capacity: int, name: str) -> None:
        self.memory = memory
        self.capacity = capacity
        self.name = name
        self.storage: Storage | None = None
        memory.static_slots.append(self)

    def get(self) -> Storage:
        s = self.storage
        if s is None:
            s = self.storage = self.memory._obtain_static(self.capacity)
        s.used = 0
        return s


class Memory:
    """Planned storage, the pooled allocator and the counters of one VM."""

    def __init__(self, track_live: bool = False) -> None:
        self.track_live = track_live
        self.static_slots: list[StaticSlot] = []
        self.free: dict[int, list[Storage]] = {}
        self.lent: dict[int, Storage] = {}  # pooled blocks handed out and not yet released
        self.static_allocations = 0
        self.static_bytes = 0
        self.pooled_allocations = 0
        self.pooled_reuses = 0
        self.pooled_bytes = 0  # held by the pool: in use and on the free lists
        self.pooled_obtained_bytes = 0  # every block the pool ever obtained
        self.pooled_in_use = 0  # requested bytes of the blocks handed out
        self.pooled_peak = 0
        self.fresh_allocations = 0
        self.fresh_bytes = 0
        self.live_bytes = 0
        self.peak_live_bytes = 0
        self._live: dict[int, tuple[Any, int]] = {}

    # -- static ----------------------------------------------------------------------------

    def _obtain_static(self, capacity: int) -> Storage:
        """The block of a static arena planned for ``capacity`` bytes: all of it, or for a large
        arena a small block that ``carve`` grows as the shapes need (see ``GROW_ABOVE``)."""
        size = capacity if capacity <= GROW_ABOVE else MIN_CLASS
        self.static_allocations += 1
        self.static_bytes += size
        return Storage(size, capacity, self)

    def static_slot(self, capacity: int, name: str) -> StaticSlot:
        return StaticSlot(self, capacity, name)

    # -- pooled ----------------------------------------------------------------------------

    def acquire(self, nbytes: int) -> Storage:
        """A block of at least ``nbytes`` from the pool (new memory only when the free list of
        its size class is empty)."""
        cls = size_class(nbytes)
        bucket = self.free.get(cls)
        if bucket:
            s = bucket.pop()
            self.pooled_reuses += 1
        else:
            s = Storage(cls)
            self.pooled_allocations += 1
            self.pooled_bytes += cls
            self.pooled_obtained_bytes += cls
        s.used = 0
        s.requested = nbytes
        self.lent[id(s)] = s
        self.pooled_in_use += nbytes
        if self.pooled_in_use > self.pooled_peak:
            self.pooled_peak = self.pooled_in_use
        return s

    def release(self, s: Storage) -> None:
        """Give a block from ``acquire`` back to its free list."""
        del self.lent[id(s)]
        self.pooled_in_use -= s.requested
        s.requested = 0
        self.free.setdefault(s.capacity, []).append(s)

    def reclaim(self) -> None:
        """Release every block still lent: a call that raised never reached its releases."""
        for s in list(self.lent.values()):
            self.release(s)

    def trim(self) -> int:
        """Drop every block on the free lists; returns the bytes given back."""
        dropped = sum(s.capacity for bucket in self.free.values() for s in bucket)
        self.free.clear()
        self.pooled_bytes -= dropped
        return dropped

    # -- fresh -----------------------------------------------------------------------------

    def alloc_fresh(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A new tensor that no plan shares (an output, or an allocation left unplanned)."""
        a = empty_tensor(shape, dtype)
        n = a.nbytes
        self.fresh_allocations += 1
        self.fresh_bytes += n
        if self.track_live:
            self._follow(a, n)
        return a

    def _follow(self, a: np.ndarray, n: int) -> None:
        self.live_bytes += n
        if self.live_bytes > self.peak_live_bytes:
            self.peak_live_bytes = self.live_bytes
        ref = weakref.ref(a, self._gone)
        self._live[id(ref)] = (ref, n)

    def _gone(self, ref: Any) -> None:
        _, n = self._live.pop(id(ref), (None, 0))
        self.live_bytes -= n

    # -- reporting -------------------------------------------------------------------------

    def reset_peaks(self) -> None:
        """Start measuring peaks afresh (from what is live now)."""
        self.peak_live_bytes = self.live_bytes
        self.pooled_peak = self.pooled_in_use

    def stats(self) -> dict[str, int]:
        """Counters: ``allocations``/``allocated_bytes`` count every time new memory was
        obtained (static blocks, pooled blocks, fresh tensors); ``static_used_bytes`` is what
        the latest call carved from the static arenas (the bytes the current shapes need) and
        ``static_bytes`` what they hold (sized for the upper bounds, or by need); ``pooled_*`` describe the
        pool, ``fresh_*`` the unplanned tensors, ``live_bytes``/``peak_live_bytes`` the fresh
        tensors still referenced (with ``track_live``). An arena sized by need holds (in
        ``static_bytes``) what the largest shapes so far needed, not its bound."""
        static_used = sum(s.storage.used for s in self.static_slots if s.storage is not None)
        return {
            "allocations": self.static_allocations + self.pooled_allocations + self.fresh_allocations,
            "allocated_bytes": self.static_bytes + self.pooled_obtained_bytes + self.fresh_bytes,
            "static_allocations": self.static_allocations,
            "static_bytes": self.static_bytes,
            "static_used_bytes": static_used,
            "pooled_allocations": self.pooled_allocations,
            "pooled_reuses": self.pooled_reuses,
            "pooled_bytes": self.pooled_bytes,
            "pooled_in_use_bytes": self.pooled_in_use,
            "pooled_peak_bytes": self.pooled_peak,
            "fresh_allocations": self.fresh_allocations,
            "fresh_bytes": self.fresh_bytes,
            "live_bytes": self.live_bytes,
            "peak_live_bytes": self.peak_live_bytes,
        }

"""A model's weights in 2 MiB pages: :class:`HugePageArena`.

A decode step of an LLM at batch 1 streams every weight from memory once; with 4 KiB pages
that is a TLB miss every 4 KiB (about 130 000 a step for SmolLM2-135M in float32), and each page
boundary is one the hardware prefetchers stop at. NumPy asks the kernel for transparent huge
pages only for its own allocations of 4 MiB and more: measured, 127 of SmolLM2's 540 MB of
float32 weights were in huge pages. Measured on SmolLM2-135M with every weight in huge pages
(same-process A/B, 2 threads): decode at batch 1 1.03-1.05x faster in float32, 1.06-1.09x in
bfloat16, 1.01x at batch 8. The quantized weights (a quarter of the bytes, the step bound by the
int8 dot products more than by memory) measured 0.97-1.0x, so ``tilework.llm`` puts the float
precisions' weights there only.

An arena is one private anonymous mapping advised ``MADV_HUGEPAGE`` (2 MiB aligned) that hands
out arrays one after the other (:meth:`HugePageArena.take`): the loader writes each weight
straight into it, no copy after. Finding free 2 MiB pages may make the kernel compact memory
when the arena's pages are first touched: measured 0.05-1.1 s for SmolLM2's 540 MB here,
depending on how fragmented free memory happens to be. With ``prefault`` a thread populates the
pages from the moment the arena is made, so that the loader's work meanwhile (decoding the
weights) hides that time; it populates them without writing them (``MADV_POPULATE_WRITE``), so
the loader may fill the first ones meanwhile. Where the kernel has no transparent huge pages
(``never``, or built without them) the arena is of ordinary pages; without POSIX ``mmap``
(Windows) there is none (:func:`huge_page_arena` gives None).

:func:`hold_all` moves a compiled model's weights into one arena (``tilework.compiled``: all of
them, which a call at a few rows streams; NumPy advises only its 4 MiB arrays, and
all-MiniLM-L6-v2's 91 MB of weights held 45 MB of huge pages before, 133 MB after).

:func:`release_file_pages` takes the pages of a read-only file map out of the resident set once
the loader has copied what they held.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
import threading
from typing import Any, Callable

import numpy as np

from tilework.errors import TileworkError

HUGE_PAGE = 2 << 20
MADV_POPULATE_WRITE = 23  # Linux's code (5.14 on); Python's mmap module names it from 3.13 only
POPULATE_PIECE = 16 << 20  # bytes a prefault call populates
ALIGN = 64  # each array starts on a cache line, as NumPy's and the VM's own allocations do


@functools.lru_cache(maxsize=1)
def _trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere)."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim_heap() -> None:
    """Hand the C heap's free memory back to the system: NumPy frees a loader's temporaries
    (a weight decoded before it is laid out) into the heap, which keeps them resident."""
    trim = _trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _madvise() -> Callable[[int, int, int], int] | None:
    """The C library's ``madvise`` on Linux (None elsewhere: no ``MADV_POPULATE_WRITE``)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to ``ALIGN``: what an array of that size takes of an arena."""
    return -(-int(nbytes) // ALIGN) * ALIGN


class HugePageArena:
    """``nbytes`` of private anonymous memory in 2 MiB pages (see the module docstring), handed
    out by ``take``; ``prefault``: a thread faults its pages in from the start."""

    def __init__(self, nbytes: int, prefault: bool = False) -> None:
        self.nbytes = int(nbytes)
        self.used = 0
        self._map = mmap.mmap(-1, self.nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._map.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: each fault then takes 2 MiB
            except OSError:  # a kernel built without transparent huge pages: ordinary pages
                pass
        raw = np.frombuffer(self._map, np.uint8)
        start = (-raw.ctypes.data) % HUGE_PAGE
        self._raw = raw[start : start + self.nbytes]
        self._thread: threading.Thread | None = None
        if prefault and self.nbytes:
            self._thread = threading.Thread(target=self._fault, name="tilework-huge-pages", daemon=True)
            self._thread.start()

    def _fault(self) -> None:
        """Fault the pages in without writing them (``MADV_POPULATE_WRITE``, Linux 5.14 on: the
        caller may be writing its first arrays already), a piece at a time (the call holds the
        process's memory-map lock, which the caller's own allocations need meanwhile); ctypes
        lets go of the GIL around each call. Nothing where the kernel does not know the call."""
        madvise = _madvise()
        if madvise is None:
            return
        base = self._raw.ctypes.data
        for at in range(0, self.nbytes, POPULATE_PIECE):
            if madvise(base + at, min(POPULATE_PIECE, self.nbytes - at), MADV_POPULATE_WRITE) != 0:
                return

    def take(self, shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
        """The next piece of the arena as a C-contiguous, writable array of ``shape`` and
        ``dtype`` (zeros), starting on an ``ALIGN`` boundary."""
        dt = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if self.used + nbytes > self.nbytes:
            raise TileworkError(f"huge-page arena of {self.nbytes} bytes is full: {self.used} used, {nbytes} more asked for (shape {shape}, {dt})")
        piece = self._raw[self.used : self.used + nbytes].view(dt).reshape(shape)
        self.used += aligned(nbytes)
        return piece

    def hold(self, a: np.ndarray, read_only: bool = True) -> np.ndarray:
        """``a`` in the arena, read-only unless not ``read_only``: itself where it is a piece of
        the arena already, else a copy in the next piece."""
        if not np.may_share_memory(a, self._raw):
            copy = self.take(a.shape, a.dtype)
            copy[...] = a
            a = copy
        if read_only:
            a.flags.writeable = False
        return a


def huge_page_arena(nbytes: int, prefault: bool = False) -> HugePageArena | None:
    """``HugePageArena(nbytes, prefault)``, or None without POSIX ``mmap`` or bytes to hold."""
    if not nbytes or not hasattr(mmap, "MAP_PRIVATE"):
        return None
    return HugePageArena(nbytes, prefault)


def hold_all(arrays: list[np.ndarray]) -> bool:
    """Move the arrays of the list, in place and in order, side by side into one
    ``HugePageArena`` (each on an ``ALIGN`` boundary): a compiled model's weights, which every
    call at a few rows streams from memory (``tilework.compiled``). Each is replaced by its copy
    as the copy is made, so an array that only the list held is freed before the next is copied
    (the peak is one array more, not the list twice). The copies stay writable, as the arrays
    were (a read-only one makes ``torch.from_numpy`` warn: the torch backend's externs wrap the
    weights so). False, the list as it was, where there is no arena (no POSIX ``mmap``) or no
    byte to hold."""
    arena = huge_page_arena(sum(aligned(a.nbytes) for a in arrays))
    if arena is None:
        return False
    for i in range(len(arrays)):
        arrays[i] = arena.hold(arrays[i], read_only=False)
    return True


def release_file_pages(a: np.ndarray) -> bool:
    """Take the pages of a file map that ``a`` views (a weight copied into another layout,
    whose file bytes the process no longer reads) out of the process's resident set
    (``MADV_DONTNEED``: they stay in the system's page cache, and a later read of them maps them
    again; the whole pages inside ``a``'s bytes only). SmolLM2's q load: the GGUF's 100 MB were
    resident beside the interleaved copies of its matrices. False where ``a`` views no file map
    read-only, or the system cannot)."""
    base: Any = a
    while isinstance(base, np.ndarray) and not isinstance(base, np.memmap):
        base = base.base
    # a read-only map only: dropping the pages of a copy-on-write one would drop its changes
    mm = getattr(base, "_mmap", None) if isinstance(base, np.memmap) and base.mode == "r" else None
    if not isinstance(mm, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED") or not a.nbytes:
        return False
    try:
        start = a.ctypes.data - np.frombuffer(mm, np.uint8).ctypes.data
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (start + a.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end <= first:
            return False
        mm.madvise(mmap.MADV_DONTNEED, first, end - first)
    except (OSError, ValueError):  # a closed map, or a system without the call
        return False
    return True

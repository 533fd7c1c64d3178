"""A model's weights in 2 MiB pages: :func:`move_to_huge_pages`.

A decode step of an LLM at batch 1 streams every weight from memory once; with 4 KiB pages
that is a TLB miss every 4 KiB (about 130 000 a step for SmolLM2-135M in float32), and each page
boundary is one the hardware prefetchers stop at. NumPy asks the kernel for transparent huge
pages only for its own allocations of 4 MiB and more: measured, 127 of SmolLM2's 540 MB of
float32 weights were in huge pages.

``move_to_huge_pages`` copies arrays into one private anonymous mapping advised
``MADV_HUGEPAGE`` (2 MiB aligned), one at a time, replacing each list entry as it goes and
handing the original's memory back (``malloc_trim``), so the load's peak memory is what it was
without the move. Measured on SmolLM2-135M (same-process A/B, 2 threads): decode at batch 1
1.03-1.05x faster in float32, 1.06-1.09x in bfloat16, 1.01x at batch 8. The quantized weights
(a quarter of the bytes, the step bound by the int8 dot products more than by memory) measured
0.97-1.0x, so ``tilework.llm`` moves the float precisions' weights only.

Arrays that view a map stay where they are: a file's (a GGUF's quantized blocks, used as they
are), whose copy would add its size to the process's anonymous memory while the file stays
mapped, and an arena of this module's (moved already). Where the kernel has no transparent huge
pages (``never``, or built without them) the arena is of ordinary pages; without POSIX ``mmap``
nothing is moved.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
from typing import Any, Callable

import numpy as np

HUGE_PAGE = 2 << 20
ALIGN = 64  # each array starts on a cache line, as NumPy's and the VM's own allocations do
TRIM_BYTES = 1 << 20  # the C heap is trimmed after moving an array of this size or more


@functools.lru_cache(maxsize=1)
def _trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere): NumPy frees a moved array into the C heap,
    which keeps it resident; without the trim the load's peak rose by 180 MiB for SmolLM2 in
    float32 (928 -> 1085 MiB), with it the peak is the same as without the move."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def _mapped(a: np.ndarray) -> bool:
    """Whether ``a``'s memory is a map (of a file, ``np.memmap`` or a view of one; or an arena
    this module made already)."""
    base: Any = a
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            return True
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's base
        base = base.obj
    return isinstance(base, mmap.mmap)


def move_to_huge_pages(arrays: list[np.ndarray]) -> int:
    """Copy the arrays of ``arrays`` that NumPy owns into one huge-page arena, replacing each
    entry by its copy (read-only, same dtype, shape and values); returns the bytes moved. An
    array listed twice is copied once, and both entries get the copy."""
    picked = [i for i, a in enumerate(arrays) if isinstance(a, np.ndarray) and a.nbytes and not _mapped(a)]
    offsets: dict[int, int] = {}
    total = 0
    for i in picked:
        if id(arrays[i]) not in offsets:
            offsets[id(arrays[i])] = total
            total += -(-arrays[i].nbytes // ALIGN) * ALIGN
    if not total or not hasattr(mmap, "MAP_PRIVATE"):  # nothing to move, or no POSIX mmap (Windows)
        return 0
    arena = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            arena.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: each fault then takes 2 MiB
        except OSError:  # a kernel built without transparent huge pages: ordinary pages
            pass
    raw = np.frombuffer(arena, np.uint8)
    start = (-raw.ctypes.data) % HUGE_PAGE
    copies: dict[int, np.ndarray] = {}
    trim = _trim()
    for i in picked:
        a = arrays[i]
        key = id(a)
        if key not in copies:
            off = start + offsets[key]
            copy = raw[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
            copy[...] = a
            copy.flags.writeable = False
            copies[key] = copy
        arrays[i] = copies[key]  # the original goes as soon as no entry holds it
        if trim is not None and a.nbytes >= TRIM_BYTES:
            del a
            trim(0)  # and its memory back to the system, before the next copy grows the arena
    return total

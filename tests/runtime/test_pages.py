"""``move_to_huge_pages``: the copies hold the same values, read-only, one arena; maps stay."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest

from tilework.runtime.pages import ALIGN, HUGE_PAGE, move_to_huge_pages


def test_copies_hold_the_values_in_one_aligned_arena() -> None:
    rng = np.random.default_rng(0)
    originals = [rng.standard_normal((3, 5)).astype(np.float32), rng.integers(0, 255, (7,), dtype=np.uint8), np.arange(6, dtype=np.int64).reshape(2, 3), rng.standard_normal((1,))]
    arrays = list(originals)
    moved = move_to_huge_pages(arrays)
    assert moved == sum(-(-a.nbytes // ALIGN) * ALIGN for a in originals)
    for a, o in zip(arrays, originals):
        assert a is not o and a.dtype == o.dtype and a.shape == o.shape
        np.testing.assert_array_equal(a, o)
        assert not a.flags.writeable and a.flags.c_contiguous
        assert a.ctypes.data % ALIGN == 0
    assert arrays[0].ctypes.data % HUGE_PAGE == 0
    starts = [a.ctypes.data for a in arrays]
    assert starts == sorted(starts) and starts[-1] - starts[0] < moved  # one arena, in order


def test_an_array_listed_twice_is_copied_once() -> None:
    w = np.ones((4, 4), np.float32)
    arrays = [w, np.zeros(3, np.float32), w]
    move_to_huge_pages(arrays)
    assert arrays[0] is arrays[2]
    np.testing.assert_array_equal(arrays[2], w)


def test_maps_and_empty_arrays_stay(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    np.arange(16, dtype=np.float32).tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r")
    view = mapped[4:8].view(np.ndarray)
    empty = np.zeros((0, 3), np.float32)
    arrays = [mapped, view, empty]
    assert move_to_huge_pages(arrays) == 0
    assert arrays[0] is mapped and arrays[1] is view and arrays[2] is empty
    assert move_to_huge_pages([]) == 0


def test_moving_twice_moves_nothing_more() -> None:
    arrays = [np.full((5,), 2.0)]
    assert move_to_huge_pages(arrays) > 0
    first = arrays[0]
    assert move_to_huge_pages(arrays) == 0 and arrays[0] is first


def test_a_kernel_without_huge_pages_gets_ordinary_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """madvise(MADV_HUGEPAGE) fails with EINVAL where the kernel has no transparent huge pages:
    the arena is then made of ordinary pages, the values the same."""

    class NoHugePages(mmap.mmap):
        def madvise(self, *args: int) -> None:
            raise OSError(22, "Invalid argument")

    monkeypatch.setattr(mmap, "mmap", NoHugePages)
    arrays = [np.arange(10, dtype=np.float32)]
    assert move_to_huge_pages(arrays) == 64
    np.testing.assert_array_equal(arrays[0], np.arange(10, dtype=np.float32))


def test_the_heap_is_trimmed_after_each_large_array(monkeypatch: pytest.MonkeyPatch) -> None:
    """A moved array's memory goes back to the system (glibc's malloc_trim) before the next
    copy, so the load's peak does not hold both; small arrays do not pay for a trim."""
    from tilework.runtime import pages

    calls: list[int] = []
    monkeypatch.setattr(pages, "_trim", lambda: calls.append)
    big = np.ones(pages.TRIM_BYTES // 4, np.float32)
    arrays = [big, np.ones(3, np.float32), big.copy()]
    move_to_huge_pages(arrays)
    assert calls == [0, 0]
    monkeypatch.setattr(pages, "_trim", lambda: None)  # no glibc: nothing to call
    arrays = [np.ones(pages.TRIM_BYTES // 4, np.float32)]
    assert move_to_huge_pages(arrays) == pages.TRIM_BYTES

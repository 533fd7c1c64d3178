"""``HugePageArena``: aligned pieces in order, a full arena refused, ``hold`` copies what is not
in it, the prefault keeps what the caller wrote meanwhile; no huge pages or no ``madvise``: the
same values. ``hold_all``: copies side by side in place; a compiled model's weights held, compiled
and loaded. ``release_file_pages``: a read-only file map's pages leave the resident set and read
back the same; other arrays are left alone."""

from __future__ import annotations

import mmap
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tilework.errors import TileworkError
from tilework.runtime import pages
from tilework.runtime.pages import ALIGN, HUGE_PAGE, HugePageArena, aligned, huge_page_arena, release_file_pages


def test_pieces_are_aligned_contiguous_and_in_order() -> None:
    arena = HugePageArena(1000)
    a = arena.take((3, 5), np.float32)
    b = arena.take((7,), np.uint8)
    c = arena.take((2, 3), "int64")
    assert a.ctypes.data % HUGE_PAGE == 0
    for x, shape, dtype in ((a, (3, 5), np.float32), (b, (7,), np.uint8), (c, (2, 3), np.int64)):
        assert x.shape == shape and x.dtype == dtype and x.flags.c_contiguous and x.flags.writeable
        assert x.ctypes.data % ALIGN == 0 and not x.any()
    assert b.ctypes.data - a.ctypes.data == aligned(a.nbytes) == 64
    assert c.ctypes.data - b.ctypes.data == 64 and arena.used == 192
    a[...] = 1.5
    assert not b.any() and not c.any()  # pieces do not overlap


def test_a_full_arena_is_refused_with_the_sizes() -> None:
    arena = HugePageArena(128)
    arena.take((16,), np.float32)
    with pytest.raises(TileworkError, match="arena of 128 bytes is full: 64 used, 80 more"):
        arena.take((20,), np.float32)
    assert arena.take((0,), np.float32).shape == (0,)


def test_hold_copies_what_is_not_in_the_arena_read_only() -> None:
    arena = HugePageArena(4096)
    outside = np.arange(6, dtype=np.float32).reshape(2, 3)
    held = arena.hold(outside)
    assert held is not outside and np.may_share_memory(held, arena._raw)
    np.testing.assert_array_equal(held, outside)
    assert not held.flags.writeable and outside.flags.writeable
    piece = arena.take((4,), np.int32)
    piece[...] = 7
    assert arena.hold(piece) is piece and not piece.flags.writeable  # in the arena already: no copy


def test_the_prefault_keeps_what_the_caller_wrote_meanwhile() -> None:
    """The thread populates the pages without writing them: values written before or while it
    runs stay."""
    arena = HugePageArena(64 << 20, prefault=True)
    first = arena.take((1 << 20,), np.float32)
    first[...] = 3.0
    rest = arena.take(((64 << 20) // 4 - (1 << 20),), np.float32)
    rest[::1024] = 2.0
    if arena._thread is not None:
        arena._thread.join()
    assert (first == 3.0).all() and (rest[::1024] == 2.0).all() and not rest[1::1024].any()


def test_without_madvise_nothing_is_prefaulted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pages, "_madvise", lambda: None)
    arena = HugePageArena(1 << 20, prefault=True)
    if arena._thread is not None:
        arena._thread.join()
    piece = arena.take((4,), np.float64)
    piece[...] = 1.0
    np.testing.assert_array_equal(piece, 1.0)


def test_a_kernel_without_huge_pages_gets_ordinary_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """madvise(MADV_HUGEPAGE) fails with EINVAL where the kernel has no transparent huge pages:
    the arena is then made of ordinary pages, the values the same."""

    class NoHugePages(mmap.mmap):
        def madvise(self, *args: int) -> None:
            raise OSError(22, "Invalid argument")

    monkeypatch.setattr(mmap, "mmap", NoHugePages)
    arena = HugePageArena(4096)
    held = arena.hold(np.arange(10, dtype=np.float32))
    np.testing.assert_array_equal(held, np.arange(10, dtype=np.float32))


def test_no_arena_without_bytes_or_posix_mmap(monkeypatch: pytest.MonkeyPatch) -> None:
    assert huge_page_arena(0) is None
    assert isinstance(huge_page_arena(64), HugePageArena)
    monkeypatch.delattr(mmap, "MAP_PRIVATE")
    assert huge_page_arena(64) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_the_populate_call_is_linux_madvise() -> None:
    fn = pages._madvise()
    assert fn is not None
    arena = HugePageArena(HUGE_PAGE)
    rc = fn(arena._raw.ctypes.data, HUGE_PAGE, pages.MADV_POPULATE_WRITE)
    assert rc in (0, -1)  # -1: a kernel before 5.14 (EINVAL); the prefault then stops at once


def _resident_kib(m: np.memmap) -> int:
    """Resident KiB of the mapping that holds ``m`` in this process (``/proc/self/smaps``)."""
    at = np.frombuffer(m._mmap, np.uint8).ctypes.data
    inside, total = False, 0
    for line in open("/proc/self/smaps"):
        field = line.split()
        if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", field[0]):
            start, end = (int(x, 16) for x in field[0].split("-"))
            inside = start <= at < end
        elif inside and field[0] == "Rss:":
            total += int(field[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_release_file_pages_of_a_read_only_map(tmp_path: Path) -> None:
    values = np.arange(3 << 18, dtype=np.float32)  # 3 MiB
    values.tofile(tmp_path / "w.bin")
    m = np.memmap(tmp_path / "w.bin", dtype=np.uint8, mode="r")
    view = m[5000:].view(np.float32)[: (3 << 18) - 2000]  # not page-aligned at either end
    assert float(view.sum(dtype=np.float64)) > 0  # read: resident
    before = _resident_kib(m)
    assert release_file_pages(view)
    assert _resident_kib(m) < before - 2048
    np.testing.assert_array_equal(view, values.view(np.uint8)[5000:].view(np.float32)[: (3 << 18) - 2000])  # read back the same


def test_release_file_pages_leaves_other_arrays(tmp_path: Path) -> None:
    np.zeros(1 << 16, np.uint8).tofile(tmp_path / "w.bin")
    assert not release_file_pages(np.ones(1 << 16, np.uint8))  # no map
    cow = np.memmap(tmp_path / "w.bin", dtype=np.uint8, mode="c")
    cow[:] = 7
    assert not release_file_pages(cow)  # copy-on-write: its changes stay
    assert (cow == 7).all()
    small = np.memmap(tmp_path / "w.bin", dtype=np.uint8, mode="r")[10:100]
    assert not release_file_pages(small)  # no whole page inside


def test_hold_all_moves_arrays_side_by_side_in_place() -> None:
    src: list[np.ndarray] = [np.arange(15, dtype=np.float32).reshape(3, 5), np.zeros((0, 4), np.float32), np.arange(7, dtype=np.uint16)[::2], np.ones((2, 3), np.int64)]
    got = list(src)
    assert pages.hold_all(got) and len(got) == len(src)
    for a, b in zip(src, got):
        np.testing.assert_array_equal(a, b)
        assert b.dtype == a.dtype and b.flags.c_contiguous and b.flags.writeable and not np.shares_memory(a, b)
    # in order, each on an ALIGN boundary after the one before: one mapping (an empty array
    # takes no byte, and its address means nothing)
    full = [b for b in got if b.size]
    starts = [b.ctypes.data for b in full]
    assert starts[0] % HUGE_PAGE == 0 and all(s % ALIGN == 0 for s in starts)
    assert [t - s for s, t in zip(starts, starts[1:])] == [aligned(b.nbytes) for b in full[:-1]]


def test_hold_all_frees_each_array_the_list_alone_held_as_it_goes() -> None:
    import weakref

    class Tracked(np.ndarray):
        pass

    arrays: list[np.ndarray] = [np.full(1000, float(i), np.float32).view(Tracked) for i in range(3)]
    refs = [weakref.ref(a) for a in arrays]
    seen = []
    real = pages.HugePageArena.take

    def take(self: pages.HugePageArena, shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
        seen.append([r() is not None for r in refs])  # which originals are alive at each copy
        return real(self, shape, dtype)

    pages.HugePageArena.take = take  # type: ignore[method-assign]
    try:
        assert pages.hold_all(arrays)
    finally:
        pages.HugePageArena.take = real  # type: ignore[method-assign]
    # each copy is made after the ones before replaced their originals (the loop's own
    # reference to the array being copied is the only other one)
    assert seen == [[True, True, True], [False, True, True], [False, False, True]]
    assert [float(a[0]) for a in arrays] == [0.0, 1.0, 2.0] and all(r() is None for r in refs)


def test_hold_all_keeps_the_list_without_bytes_or_posix_mmap(monkeypatch: pytest.MonkeyPatch) -> None:
    empty: list[np.ndarray] = []
    zero = [np.zeros(0, np.float32)]
    assert not pages.hold_all(empty) and not pages.hold_all(zero) and zero[0].flags.writeable
    monkeypatch.delattr(mmap, "MAP_PRIVATE")
    one = [np.ones(3, np.float32)]
    first = one[0]
    assert not pages.hold_all(one) and one[0] is first


def test_a_compiled_models_weights_are_held_compiled_and_loaded(tmp_path: Path) -> None:
    """``tilework.compile`` and ``CompiledModel.load`` keep the weights in one arena: copies
    (not views of the torch model), the results unchanged."""
    torch = pytest.importorskip("torch")
    import tilework
    from tilework.compiled import CompiledModel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 7)).eval()
    x = torch.randn(5, 24)
    cm = tilework.compile(model, (x,), ({0: torch.export.Dim("n", min=1, max=64)},))
    cm.save(str(tmp_path / "m.tw"))
    back = CompiledModel.load(str(tmp_path / "m.tw"))
    params = [p.detach().numpy() for p in model.parameters()]
    for c in (cm, back):
        starts = [w.ctypes.data for w in c.weights]
        assert len(starts) >= 4 and starts[0] % HUGE_PAGE == 0 and starts == sorted(starts)
        assert not any(np.shares_memory(w, p) for w in c.weights for p in params)
        for rows in (1, 5, 64):
            xi = torch.randn(rows, 24)
            np.testing.assert_allclose(c(xi).numpy(), model(xi).detach().numpy(), rtol=1e-5, atol=1e-5)

"""Which tiles of the many-rows matmul (``matmul.schedule_matmul``) run outside: the column
tiles (each streaming all of A past one panel of B that stays in L2: the default), or the row
tiles (each ``MR x K`` block of A in L1 while the tile runs across every column, B in L2: for
MobileNet's pointwise convs, whose A is large and B small), and how tall a row tile is then."""

from __future__ import annotations

from tilework.ir.dtype import DTYPE_TABLE
from tilework.ir.sym import Dim
from tilework.schedule.analysis import MatmulParts

ROWS_OUTER_B_BYTES = 768 * 1024  # B within a Zen 4 core's 1 MB of L2: the row tiles may run outside the column tiles
ROWS_OUTER_A_BYTES = 512 * 1024  # a slice's rows of A beyond half of that L2: they do (``rows_outer``)
PREFETCH_ROWS_MIN_K = 64  # a tile as wide as B prefetches the next tile's rows of A from this K ...
PREFETCH_ROWS_A_BYTES = 384 * 1024  # ... and this many bytes of A a slice (``prefetch_rows``)


def rows_outer(parts: MatmulParts, rows: Dim, mr: int) -> bool:
    """Whether the row tiles run outside the column tiles (each row tile across every column,
    the row tiles in parallel): where B is shared by every row (no batch dims), fits in
    ``ROWS_OUTER_B_BYTES`` and a static count of rows a slice (``rows``) either reads more of
    A than ``ROWS_OUTER_A_BYTES`` (the column tiles outside would read it again from memory:
    MobileNetV2's 16 -> 96 conv over 8 x 12544 rows, 4.4-5.2 ms -> 3.7-3.8 ms) or is divided
    better by a tile of fewer rows (``least_waste``: 49 rows in 7-row tiles, not 6 of 8 and
    a rest tile; its 576 -> 160 conv 0.81 -> 0.72 ms; one thread, Zen 4). Elsewhere the column
    tiles stay outside: A read again from L2 cost less than B from L2 for each row tile (its
    32 -> 192 conv over 8 x 784 rows 0.85 -> 1.0 ms with the rows outside)."""
    if parts.batch or not isinstance(rows, int) or rows < 2 * mr:
        return False
    b = parts.b.buffer
    item = DTYPE_TABLE[b.dtype].itemsize if b.dtype in DTYPE_TABLE else 4
    k, n = parts.k.extent, parts.j[0].extent
    if not isinstance(k, int) or not isinstance(n, int) or k * n * item > ROWS_OUTER_B_BYTES:
        return False
    return rows * k * item > ROWS_OUTER_A_BYTES or least_waste(rows, mr) != mr


def least_waste(rows: int, mr: int) -> int:
    """The tile height from ``mr - 2`` to ``mr`` that computes the fewest rows past ``rows``
    (the tallest of those)."""
    return min(range(max(1, mr - 2), mr + 1), key=lambda m: (-(-rows // m) * m - rows, -m))


def prefetch_rows(parts: MatmulParts, rows: Dim) -> bool:
    """Whether a many-rows tile as wide as all of B prefetches the next tile's rows of A
    (``matmul_prefetch.prefetch_next_rows``): where K is at least ``PREFETCH_ROWS_MIN_K`` and a
    static count of rows a slice (``rows``) reads at least ``PREFETCH_ROWS_A_BYTES`` of A, too
    much to stay in L2 from one call to the next. MobileNetV2's convs to 24 and 32 channels at
    batch 8 (one thread, Zen 4): 144 -> 24 over 3136 rows a slice 3.5 -> 2.4 ms, 192 -> 32 over
    784 1.17 -> 0.96 ms; below those bounds the hints cost more than they brought (32 -> 16
    over 12544 rows 1.0 -> 1.2 ms; MobileNetV3-Small's 88 -> 24 over 784 rows, 276 KB of A,
    0.33 -> 0.38 ms)."""
    a, k = parts.a.buffer, parts.k.extent
    item = DTYPE_TABLE[a.dtype].itemsize if a.dtype in DTYPE_TABLE else 4
    return isinstance(rows, int) and isinstance(k, int) and k >= PREFETCH_ROWS_MIN_K and rows * k * item >= PREFETCH_ROWS_A_BYTES

"""Software prefetch of the next column panel in the many-rows matmul tiles.

The row tiles of one column panel each stream the panel's ``K x P`` block of B: the first from
memory, the others from L2. That first pass ran at the pace of memory, not of the FMAs, while
the other passes left the memory idle: at M = 32, K = 1024, N = 4096 (float32, 6 x 16 tiles
on Zen 3) the panels' first passes took 0.7 of the kernel's 3.6 ms, and with two threads both
streamed at once. Here the first ``PARTS`` row tiles ``io`` of a panel also prefetch part
``io`` of the next panel, one line per ``PARTS`` steps of their ``k`` loop, so that the stream
overlaps their compute (same M: 4.0 -> 3.2 ms with one thread, 2.1 -> 1.6 ms with two; M = 256
unchanged: its later row tiles run without the hint). With fewer row tiles than ``PARTS`` (the
rest tile counts; known at run time) the panel goes in 2 parts (2 or 3 tiles), a line every
2 steps, or 1 (one tile, a line a step), so that two tiles (8 .. 12 rows of 6-row tiles)
cover all of it where they covered half: 8 .. 16 rows 1.06-1.23x at (K, N) = (384, 1536),
(1536, 384), (576, 1536) and (1024, 4096), 32 rows and more level (two parts always lost
3-17% there; a second test in the ``k`` loop choosing between the schemes cost 5-10%: the
part's row is one expression with a loop-invariant factor instead). With few rows (one row
tile a panel: decoding, the MLP at n = 1) that tile prefetches all of the next panel, a line
a ``k`` step (the MLP 1024 -> 4096 -> 1024 at n = 1 and 4: 1.04-1.05x; a SmolLM2 fp32 decode
step 1.03x; same-process A/B on Zen 3, 2 threads).

A panel row wider than a cache line (AVX-512: 32 floats, two lines) takes a hint per line at
each of those steps; hinting its first line alone left half of the next panel unhinted
(MiniLM's linears at 32 rows on Zen 5, 2 threads: 1.1x).

A tile spanning several panels (AVX-512's 32-column tiles over the 16-column panels that
``tilework.compile`` lays weights out in) prefetches the next tile's panels, the same part of
each. Such tiles took no hint before: SmolLM2-135M's fp32 decode at batch 8 ran 1.41x faster
with them (32 cached tokens; 1.26x at 512), its M = 8 linear 576 -> 3072 alone 1.8x with the
weights out of cache (same-process A/Bs, Zen 5, 2 threads). With 1 or 2 rows they still take
none (``matmul.SPAN_HINT_ROWS``).

A tile as wide as all of B (one column tile: MobileNet's 1x1 convs to 24 and 32 channels)
reads nothing but its rows of A from memory, ``MR`` rows at once, a float of each a ``k``
step: too slow a stream for the hardware prefetcher. It prefetches the next tile's rows, a
line a ``k`` step (``prefetch_next_rows``): MobileNetV2's 144 -> 24 conv over 8 x 3136 rows
3.5 -> 2.4 ms, 96 -> 24 2.0 -> 1.5 ms (one thread, Zen 4). Where there are more column
tiles, K is short or a slice's rows of A few (``matmul_order.prefetch_rows``), the hints cost
more than they brought.

The prefetch is a block writing the ``prefetch`` intrinsic (a hint: its value is 0) to a
scratch buffer of a row's lines that nothing reads; its loads are never performed (C emits
``__builtin_prefetch`` of their addresses), and clamp to the last panel and row of B.
"""

from __future__ import annotations

from dataclasses import replace

from tilework.ir import sym
from tilework.ir.dtype import DTYPE_TABLE
from tilework.ir.loop import Allocate, Block, Buffer, IfThenElse, Intrin, IterVar, Load, Store, TensorFunc
from tilework.ir.sym import Dim, SymVar
from tilework.schedule.analysis import MatmulParts
from tilework.schedule.rules.common import loop, path_of
from tilework.ir import sym_walk
from tilework.schedule.tree import block_names, find_block, fresh_name, less_than, replace_at, seq, used_names

PARTS = 4  # the next panel is prefetched in this many parts, one a row tile
LINE_BYTES = 64  # a cache line: a panel row wider than this takes a hint per line


def prefetch_next_panel(
    func: TensorFunc,
    parts: MatmulParts,
    panel: SymVar,
    io: SymVar,
    k: SymVar,
    pieces: int = PARTS,
    tiles: Dim | None = None,
    groups: int = 1,
) -> TensorFunc:
    """``func`` (many-rows tiles: loop ``panel`` over column panels of a packed B, one panel a
    tile (``groups`` panels with ``groups``), ``io`` over row tiles inside it, ``k`` the tile's reduction loop) with row tile
    ``io < PARTS`` prefetching part ``io`` of panel ``panel + 1`` in its ``k`` loop. Unchanged
    when B is not read as ``B[j // P, k, j % P]`` with static extents, or the ``k`` loop is not
    all of K. ``pieces=1``: the panel's one row tile (few rows) prefetches all of the next
    panel, a line a step. ``tiles``: the row tile count (the rest tile included); under
    ``pieces`` (4) tiles the panel is prefetched in 2 parts (2 or 3 tiles) or 1 (see the
    module doc), picked at run time when symbolic. ``groups``: a tile spans that many adjacent
    panels (loop ``panel`` over groups of them); it prefetches the next group, the same part
    of each panel."""
    b = parts.b
    buf, idx = b.buffer, b.indices
    if len(buf.shape) != 3 or len(idx) != 3:
        return func
    npanels, depth, width = buf.shape
    if not (isinstance(npanels, int) and isinstance(depth, int) and isinstance(width, int)) or npanels < 2:
        return func
    j, first = parts.j[0].var, idx[0]
    if idx[1] is not parts.k.var or not isinstance(first, (int, sym.SymExpr)) or not sym.prove_eq(first, sym.floordiv(j, width)):
        return func
    kl = loop(func, k)
    if kl.extent != depth:
        return func
    used, names = used_names(func), block_names(func)
    vp, vq, vk = (SymVar(fresh_name(used, f"v{buf.name}_next_{c}")) for c in "pqk")
    ivs = (
        IterVar(vp, -(-npanels // groups), "spatial", panel),
        IterVar(vq, pieces, "spatial", io),
        IterVar(vk, depth, "spatial", k),
    )
    row: Dim = sym.min_(sym.add(sym.mul(vq, -(-depth // pieces)), sym.floordiv(vk, pieces)), depth - 1)
    cond = less_than(io, pieces)
    if tiles is not None and pieces == 4 and depth % pieces == 0:
        # n parts: 4 with 4 row tiles or more, 2 with 2 or 3, 1 with one. Part io of n is the
        # rows (io * depth + k) // n, i.e. ((io * depth + k) * m) // 4 with m = 4 // n (loop
        # invariant): no test in the k loop, no division but by the constant
        few = sym.min_(sym.max_(sym.sub(pieces, tiles), 0), 1)  # under 4 tiles
        one = sym.min_(sym.max_(sym.sub(2, tiles), 0), 1)  # one tile
        m = sym.add(sym.add(1, few), sym.mul(2, one))
        row = sym.floordiv(sym.mul(sym.add(sym.mul(vq, depth), vk), m), pieces)
        cond = less_than(sym.mul(io, m), pieces)
    lines = max(1, width * DTYPE_TABLE[buf.dtype].itemsize // LINE_BYTES)  # a panel row's cache lines
    step = width // lines
    hint = Buffer(fresh_name(used, f"{buf.name}_hint"), (groups * lines,), buf.dtype)
    first_next = sym.add(sym.mul(vp, groups), groups)  # the next tile's first panel
    hints = []
    for g in range(groups):
        nxt = sym.min_(sym.add(first_next, g), npanels - 1)
        hints += [Store(hint, (g * lines + c,), Intrin("prefetch", (Load(buf, (nxt, row, c * step)),), buf.dtype)) for c in range(lines)]
    body = seq(hints)
    block = Block(fresh_name(names, f"{buf.name}_next"), ivs, (buf,), (hint,), body, None)
    hinted = IfThenElse(cond, Allocate(hint, block))  # C unswitches the k loop on it
    new = replace(kl, body=seq([hinted, kl.body]))
    return func.replace(body=replace_at(func.body, path_of(func, kl), new))


def prefetch_next_rows(func: TensorFunc, parts: MatmulParts, block: str, ii: SymVar, k: SymVar, mr: int) -> TensorFunc:
    """``func`` (many-rows tiles of ``mr`` rows: loop ``ii`` over a tile's rows, ``k`` the
    tile's reduction loop, ``block`` its update block) with each ``k`` step prefetching a line
    of the next row tile's rows of A, ``A[.., r + mr + (k * L) // K, (k * L) % K]`` (``L`` the
    floats a line holds) from the tile's first row ``r``: the ``mr x K`` block of rows that
    the next tile reads, line after line, in the first ``mr * K / L`` steps of this one (past
    them, and past the last row, the address stays at the block's (the rows') last element).
    Unchanged unless A is read as ``A[.., row, k]`` with ``K`` static and the tiled row
    among its indices."""
    a = parts.a
    row, kv = parts.i[-1], parts.k
    if not a.indices or a.indices[-1] is not kv.var or row.var not in a.indices or not isinstance(kv.extent, int):
        return func
    depth = kv.extent
    path, b = find_block(func, block)
    ivs = {iv.var: iv for iv in b.iter_vars}
    index = [x for x in a.indices if isinstance(x, SymVar) and x in ivs]
    if len(index) != len(a.indices):
        return func
    line = max(1, LINE_BYTES // DTYPE_TABLE[a.buffer.dtype].itemsize)
    flat = sym.min_(sym.mul(k, line), mr * depth - 1)
    used, names = used_names(func), block_names(func)
    new_ivs, idx = [], []
    for x in index:
        iv = ivs[x]
        v = SymVar(fresh_name(used, f"{iv.var.name}_next"))
        binding: Dim = iv.binding
        if x is row.var:
            first = sym_walk.substitute(binding, {ii: 0})
            binding = sym.min_(sym.add(sym.add(first, mr), sym.floordiv(flat, depth)), sym.sub(iv.extent, 1))
        elif x is kv.var:
            binding = sym.floormod(flat, depth)
        new_ivs.append(IterVar(v, iv.extent, "spatial", binding))
        idx.append(v)
    hint = Buffer(fresh_name(used, f"{a.buffer.name}_hint"), (1,), a.buffer.dtype)
    store = Store(hint, (0,), Intrin("prefetch", (Load(a.buffer, tuple(idx)),), a.buffer.dtype))
    pb = Block(fresh_name(names, f"{a.buffer.name}_next_rows"), tuple(new_ivs), (a.buffer,), (hint,), store, None)
    kl = loop(func, k)
    new = replace(kl, body=seq([Allocate(hint, pb), kl.body]))
    return func.replace(body=replace_at(func.body, path_of(func, kl), new))

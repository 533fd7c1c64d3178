"""The matmul rule: ``out[b.., i.., j] = sum_k a[.., i.., k] * b[.., k, j]`` (B contiguous
in ``j``) or ``* b[.., j, k]`` (a linear layer's weight), batched or not, any dim symbolic.

Many rows: the loop nest becomes tiles of ``MR x NR`` outputs (``register_tile``: ``NR`` two
vectors, ``MR`` as many rows as the host's vector registers hold: 8 x 32 floats with AVX-512,
6 x 16 with AVX2), ordered ``j_0, i_0``; the column tiles (with the row tiles when there are
few columns) run in parallel. Each tile accumulates in registers through a local buffer (``cache_write``),
initialised once (``decompose_reduction``), and its micro-kernel runs ``k`` outside an
unrolled ``i_1`` and a vectorized ``j_1``: per ``k`` it broadcasts ``MR`` values of A and
loads ``NR`` contiguous values of B, whose ``K x NR`` column stays in L2 while ``i_0`` runs
down the rows. A ``B[j, k]`` is first copied transposed (``cache_read``), a ``B[k, j]`` packed
in column panels (``pack_panels``). Sizes that do not divide are guarded, but only in the
store (``unguard_tiles``): the last row tile computes its rows past the end as copies of the
last row, the last column tile whole panels of a panel-packed B (zero past the end), so that
its ``k`` loop is a full tile's; its store runs unguarded when its last lane is in bounds
(``split_store``). Where the column tiles alone run in parallel, the rows left after the full
row tiles run in a tile of as many rows rounded up to an even count, picked at run time
(``rest_rows``), and the first row tiles of a panel prefetch the next one (``matmul_prefetch``;
with few rows the one row tile prefetches all of it).
Where B is small and A large (MobileNet's pointwise convs: ``matmul_order.rows_outer``) the
row tiles run outside instead, in parallel, each across every column, a static row count in
tiles of 6 .. 8 rows that divide it best; a tile as wide as B prefetches the next tile's rows
of A (``prefetch_next_rows``). An elementwise epilogue is inlined into the tile store.

Few rows (decoding, short prompts): for ``B[k, j]`` one tile holds every row, ``r x NR``,
its accumulators in L1: ``NR`` a thread's share of the columns, within ``WIDE_TILE_BYTES``
(``wide_vectors``), adding ``ONE_ROW_JAM`` rows of B at a time (``jam_k``); a packed B
``r x 2 panels`` in registers; a symbolic row count picks the tile
of its exact value (1 .. 7) at run time, so that no tile tests bounds in its ``k`` loop
(one panel wide where two would not fit the registers: ``panel_columns``). For
``B[j, k]`` vectorized dot products. With a symbolic row count the kernel holds the few-rows
and many-rows schedules and picks one at run time (``specialize.branch``).

A B packed in column panels, ``B[j // P, k, j % P]`` (``MatmulParts.panel``: the linear
weights ``tilework.compile`` lays out, ``layout_weights``), takes the same tiles: a tile one
panel wide streams one contiguous ``K x P`` block of B, one ``NR`` wide across ``NR / P``
panels streams as many (AVX-512 with 16-column panels), and a panel wider than ``NR`` is run
in strips of ``NR`` columns.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from tilework.errors import ScheduleError
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.dtype import DTYPE_TABLE
from tilework.ir.loop import (
    Allocate,
    Binary,
    Block,
    Buffer,
    For,
    IfThenElse,
    IterVar,
    Load,
    PExpr,
    Scalar,
    Select,
    SeqStmt,
    Stmt,
    Store,
    TensorFunc,
    const,
    stmt_scalars,
    walk_scalars,
)
from tilework.ir.sym import Dim, SymVar
from tilework.schedule import loop_primitives as lp
from tilework.schedule.analysis import FuncKind, MatmulParts, classify, main_block, matmul_parts, spatial_vars
from tilework.schedule.block_primitives import cache_read, reverse_compute_inline
from tilework.schedule.reduction_primitives import cache_write, decompose_reduction
from tilework.schedule.rules.common import (
    attempt,
    block_loops,
    host_registers,
    host_threads,
    lanes,
    loop,
    new_blocks,
    out_dtype,
    path_of,
    spatial_nest,
    top_nests,
)
from tilework.schedule.rules.inline import inline_producers
from tilework.schedule.rules.matmul_order import least_waste, prefetch_rows, rows_outer
from tilework.schedule.rules.matmul_prefetch import PARTS, prefetch_next_panel, prefetch_next_rows
from tilework.schedule.rules.reduction import schedule_reduction
from tilework.schedule.specialize import branch, select
from tilework.schedule.tree import (
    block_names,
    blocks_of,
    children,
    conj,
    conjuncts,
    dim_vars,
    find_block,
    find_loop,
    fresh_name,
    get_at,
    leaves,
    less_than,
    map_stmt_scalars,
    new_loop_var,
    rebind,
    rename_blocks,
    replace_at,
    seq,
    splice_at,
    subst_stmt,
    used_names,
    walk,
    with_children,
)

NAME = "matmul"
MR = 8  # rows of a register tile
NR_VECTORS = 2  # vectors per row of a register tile
SMALL_NR_VECTORS = 16  # vectors per one-row tile when there are few rows
ONE_ROW_VECTORS = 128  # at most, for a one-row tile spread over the threads
ONE_ROW_JAM = 4  # rows of B a wide few-rows tile adds to its accumulators at a time
WIDE_TILE_BYTES = 16 * 1024  # the accumulators of a wide few-rows tile: half of L1
# A few-rows tile spanning several panels prefetches the next tile's from this many rows on:
# with 1 or 2 rows a k step has 2 or 4 FMAs, and the two hints beside them cost more than they
# bring when B is partly in L3 (the MLP 1024 -> 4096 -> 1024 at n = 1, 2: 0.87x, 0.91x; from
# n = 3 on 1.03-1.13x; same-process A/B, Zen 5, 2 threads)
SPAN_HINT_ROWS = 3
NN_SMALL_ROWS = 8  # fewer rows than this: one-row tiles (B[k, j])
NT_SMALL_ROWS = 64  # fewer rows than this: dot products (B[j, k]); else transpose B and tile
MIN_COLUMN_TILES = 8  # parallelize over column tiles alone when there are this many
PACK_GROUP = 8  # column panels of a runtime B packed together, row by row


def apply(func: TensorFunc) -> TensorFunc | None:
    if classify(func) != FuncKind.MATMUL:
        return None
    func = inline_producers(func)
    parts = _parts(func)
    if parts is None or not parts.i:
        return None
    b = parts.b.indices
    nt = b[-1] is parts.k.var  # B[.., j, k]: the weight layout of a linear layer
    if not nt and b[-1] is not parts.j[0].var and parts.panel is None:
        return None
    limit = NT_SMALL_ROWS if nt else NN_SMALL_ROWS
    rows = parts.i[-1].extent  # the row dim that gets tiled
    try:
        if isinstance(rows, int):
            return _few_rows(func, nt, rows) if rows < limit else _big(func, nt)
        return branch(less_than(rows, limit), _few_rows(func, nt, rows), _big(func, nt))
    except ScheduleError:
        return None


def _parts(func: TensorFunc) -> MatmulParts | None:
    mb = main_block(func)
    return None if mb is None else matmul_parts(mb)


def _few_rows(func: TensorFunc, nt: bool, rows: Dim) -> TensorFunc:
    """Few rows (``rows < limit``): the work is streaming B once. With B[j, k] a dot product
    per output, vectorized along k, columns outside rows so that a row of B serves every row
    of A from L1. With B[k, j] one register tile holds every row: a symbolic row count picks
    the tile of its exact value at run time, so that no tile needs a bounds test in its
    ``k`` loop."""
    if nt:
        parts = _parts(func)
        assert parts is not None
        loops = iv_loops(func, parts.block)
        if loops is not None:
            batch = [loops[iv.var].var for iv in parts.batch]
            row_loops = [loops[iv.var].var for iv in parts.i]
            func = lp.reorder(func, *batch, loops[parts.j[0].var].var, *row_loops)
        return schedule_reduction(func)
    if isinstance(rows, int):
        return _rows_tile(func, max(rows, 1))
    last = NN_SMALL_ROWS - 1  # the else of every test below: rows == last when rows >= 1
    lo = sym.bounds(rows)[0]
    out = _rows_tile(func, last)
    if lo is not None and lo >= 1:
        out = _rows_fixed(out, rows, last)
    cases = [(Binary("==", rows, r, "bool"), _rows_fixed(_rows_tile(func, r), rows, r)) for r in range(1, NN_SMALL_ROWS - 1)]
    return select(cases, out)


def _rows_fixed(func: TensorFunc, rows: Dim, r: int) -> TensorFunc:
    """A schedule of ``func`` for the run-time case ``rows == r``: a sym var row count
    becomes ``r`` in the body (the params keep it), so that the full tile runs once and the
    partial one not at all, both known to the C compiler."""
    if not isinstance(rows, SymVar):
        return func
    body = subst_stmt(func.body, {rows: r})
    return func.replace(body=_drop_empty(body) or body)


def _drop_empty(s: Stmt) -> Stmt | None:
    """``s`` without the loops that run zero times (the partial tile of an exact one), None
    when nothing is left."""
    if isinstance(s, For) and isinstance(s.extent, int) and s.extent <= 0:
        return None
    cs = children(s)
    if not cs:
        return s
    new = [_drop_empty(c) for c in cs]
    if isinstance(s, SeqStmt):
        kept = [c for c in new if c is not None]
        return seq(kept) if kept else None
    if any(c is None for c in new):
        return None if isinstance(s, (For, Allocate)) else s
    return with_children(s, [c for c in new if c is not None])


def _rows_tile(func: TensorFunc, r: int) -> TensorFunc:
    """Tiles of ``r`` rows: over a plain B as wide as ``wide_vectors`` (accumulators in L1);
    over a packed B one or two panels wide (``panel_columns``: in registers)."""
    parts = _parts(func)
    assert parts is not None
    if parts.panel is not None:  # a packed B: the tile's accumulators in registers
        return schedule_matmul(func, parts, r, panel_columns(parts.panel, r, out_dtype(func)))
    return schedule_matmul(func, parts, r, lanes(out_dtype(func)) * wide_vectors(parts, r), jam=ONE_ROW_JAM)


def panel_columns(panel: int, r: int, dtype: str) -> int:
    """Columns of an ``r``-row tile over a B packed in ``panel``-wide column panels:
    ``NR_VECTORS`` 64-byte vectors (two 16-float panels: two streams of B), or one panel where
    ``r`` rows of those accumulators, a vector of B and a broadcast of A would not fit the
    host's registers. AVX-512 holds 7 rows x 32 floats in 14 of its 32 registers; AVX2 needs
    4 registers a row for them, so from 4 rows on they spilled to the stack (a 7-row tile
    wanted 28 of its 16 registers): one 16-float panel there, 1.2-1.5x at 4 .. 7 rows."""
    regs = host_registers()
    columns = lanes(dtype) * NR_VECTORS
    if columns > panel and r * -(-columns // regs.lanes(dtype)) + 2 > regs.count:
        return panel
    return columns


def wide_vectors(parts: MatmulParts, r: int) -> int:
    """Vectors of an ``r``-row tile over a plain B: a thread's share of the columns, at most
    ``ONE_ROW_VECTORS`` and as many (a power of two) as keep the accumulators within
    ``WIDE_TILE_BYTES`` of L1, at least ``SMALL_NR_VECTORS``. The tile streams its columns of
    each row of B: 1 KB of each 16 KB row of a 4096-wide B (a new page every time) ran at 0.7
    of the speed of 8 KB; 2 .. 7 rows in register tiles 256 B wide at 0.3 .. 0.7 of the speed
    of these."""
    n = parts.j[0].extent
    if not isinstance(n, int):
        return SMALL_NR_VECTORS
    item = DTYPE_TABLE[parts.b.buffer.dtype].itemsize if parts.b.buffer.dtype in DTYPE_TABLE else 4
    width = lanes(parts.b.buffer.dtype)
    share = -(-n // (width * host_threads()))
    fit = max(1, WIDE_TILE_BYTES // (r * width * item))
    wide = max(SMALL_NR_VECTORS, min(ONE_ROW_VECTORS, share, 1 << (fit.bit_length() - 1)))
    return min(wide, -(-n // width))  # no wider than B


def _big(func: TensorFunc, nt: bool) -> TensorFunc:
    """Many rows: register tiles; B[j, k] is first copied to B[k, j] (``cache_read``)."""
    parts = _parts(func)
    assert parts is not None
    if nt:
        pos = [d for d, x in enumerate(parts.b.indices) if x is parts.j[0].var][0]
        order = [d for d in range(len(parts.b.indices)) if d != pos] + [pos]
        func = cache_read(func, parts.block.name, parts.b.buffer.name, order)
        parts = _parts(func)
        assert parts is not None
    mr, nr = register_tile(out_dtype(func))
    n, width = parts.j[0].extent, host_registers().lanes(out_dtype(func))
    if parts.panel is not None and isinstance(n, int):
        mr, nr = exact_tile(n, parts.panel, width, (mr, nr))
    if parts.panel is None and isinstance(n, int) and 0 < n < nr:  # no wider than B, in vectors
        nr = -(-n // width) * width
    if not nt and parts.panel is None:
        func = pack_panels(func, parts, nr)
        parts = _parts(func)
        assert parts is not None
    return schedule_matmul(func, parts, mr, nr, rest=True)


def pack_panels(func: TensorFunc, parts: MatmulParts, panel: int) -> TensorFunc:
    """B read through a copy packed in column panels, ``Bp[.., j // panel, k, j % panel] =
    B[.., k, j]``, made once per call before the tiles: a tile then streams one contiguous
    ``K x panel`` block instead of ``K`` rows a B row apart (which share cache sets: at a
    4096-float row every one maps to the same L1 set). Columns past ``N`` in the last panel
    are zero: the tiles compute them (unstored), as they do a laid-out weight's padding.
    ``PACK_GROUP`` panels are packed together, row by row of B (512 contiguous bytes of each
    row, the panels written as streams), the groups in parallel: k outside all the panels
    wrote each 64 bytes to another page (M = 32, K = 1024, N = 4096: 1.25x the GFLOP/s).
    Unchanged when B is not read as ``B[.., k, j]`` or something in ``func`` writes it."""
    src, idx = parts.b.buffer, parts.b.indices
    k, j = parts.k.var, parts.j[0].var
    if len(idx) < 2 or idx[-2] is not k or idx[-1] is not j or len(src.shape) != len(idx):
        return func
    if any(src in b.writes for b in blocks_of(func)):
        return func
    used = used_names(func)
    lead, (kk, nn) = src.shape[:-2], src.shape[-2:]
    shape = (*lead, sym.ceildiv(nn, panel), kk, panel)
    copy = Buffer(fresh_name(used, f"{src.name}_panels"), shape, src.dtype)
    loops = [new_loop_var(fresh_name(used, f"{copy.name}_{d}"), e) for d, e in enumerate(shape)]
    ivs = [IterVar(SymVar(fresh_name(used, f"v{copy.name}_{d}")), e, "spatial", v) for d, (v, e) in enumerate(zip(loops, shape))]
    v = [iv.var for iv in ivs]
    col = sym.add(sym.mul(v[-3], panel), v[-1])
    fill = Store(copy, tuple(v), Select(less_than(col, nn), Load(src, (*v[:-3], v[-2], col)), const(0, src.dtype), src.dtype))
    names = {b.name for b in blocks_of(func)}
    npanels = shape[-3]
    group = next((g for g in (PACK_GROUP, 4, 2) if isinstance(npanels, int) and npanels % g == 0 and npanels // g >= 2), 0)
    if group:  # groups of panels in parallel, each along its rows of B: k inside the group
        outer, inner = (new_loop_var(fresh_name(used, f"{copy.name}_{d}"), e) for d, e in (("g", npanels // group), ("p", group)))
        ivs[-3] = replace(ivs[-3], binding=sym.add(sym.mul(outer, group), inner))
    nest: Stmt = Block(fresh_name(names, f"{src.name}_panels"), tuple(ivs), (src,), (copy,), fill, None)
    if group:
        nest = For(inner, group, For(loops[-1], panel, nest, "vectorized"))
        nest = For(outer, npanels // group, For(loops[-2], kk, nest), "parallel")
        for d in reversed(range(len(lead))):
            nest = For(loops[d], shape[d], nest)
    else:
        order = [*range(len(lead)), len(lead) + 1, len(lead), len(lead) + 2]  # k outside the panels:
        for d in reversed(order):  # B is read along its rows
            nest = For(loops[d], shape[d], nest)
    packed = (*idx[:-2], sym.floordiv(j, panel), k, sym.floormod(j, panel))

    def through_copy(n: PExpr) -> Scalar | None:
        return Load(copy, packed) if isinstance(n, Load) and n.buffer is src and tuple(n.indices) == tuple(idx) else None

    path, b = find_block(func, parts.block.name)
    nb = map_stmt_scalars(b, through_copy)
    assert isinstance(nb, Block)
    nb = replace(nb, reads=tuple(copy if r is src else r for r in nb.reads))
    body = replace_at(func.body, path, nb)
    top = next((p for p in (path[:n] for n in range(len(path) + 1)) if isinstance(get_at(body, p), For)), path)
    return func.replace(body=replace_at(body, top, Allocate(copy, seq([nest, get_at(body, top)]))))


def register_tile(dtype: str) -> tuple[int, int]:
    """``(rows, columns)`` of a many-rows register tile: ``NR_VECTORS`` vectors a row and as
    many rows (up to ``MR``) as leave registers for those vectors of B and a broadcast of A:
    8 x 32 floats with AVX-512's 32 registers, 6 x 16 with AVX2's 16."""
    regs = host_registers()
    rows = (regs.count - NR_VECTORS - 2) // NR_VECTORS
    return max(1, min(MR, rows)), regs.lanes(dtype) * NR_VECTORS


EXACT_TILE_VECTORS = (3, 5)  # vectors a row of a register tile that a column count may split into exactly (``exact_tile``)
EXACT_TILE_ROWS = 4  # fewest rows of such a tile


def exact_tile(n: int, panel: int, width: int, tile: tuple[int, int]) -> tuple[int, int]:
    """``(rows, columns)`` of the register tile for ``n`` columns of a B packed in panels of
    ``panel``: ``tile`` (``register_tile``) where its columns divide ``n``; else, where ``n``
    is whole panels, a tile as wide as 3 or 5 vectors (whole panels) that divides ``n``,
    with as many rows as leave registers for its vectors of B and a broadcast of A (at most
    ``tile``'s, at least ``EXACT_TILE_ROWS``). The last column tile of a tile that does not
    divide ``n`` computes a whole tile all the same: EfficientNet's 1x1 convs of 80 and 112
    outputs ran as slowly as 96 and 128 (8 x 32 tiles; 196 rows, 480 and 672 inputs, one
    AVX-512 core), and MobileNetV2's of 144 outputs as 160. With 8 x 48 and 5 x 80 tiles,
    EfficientNet-B0's kernels of 48, 80, 144 and 240 outputs ran 1.1-1.7x faster (one AVX-512
    core, 196-6272 rows); its 112-output ones, in a 3 x 112 tile (7 vectors), 1.4x slower
    (three rows stream B for few products), so 7 vectors are not tried."""
    mr, nr = tile
    if n % nr == 0 or n % panel or n < nr:
        return tile
    regs = host_registers().count
    for vectors in EXACT_TILE_VECTORS:
        cols = vectors * width
        rows = min(mr, (regs - vectors - 2) // vectors)
        if cols % panel == 0 and n % cols == 0 and rows >= EXACT_TILE_ROWS:
            return rows, cols
    return tile


def iv_loops(func: TensorFunc, block: Block) -> dict[SymVar, For] | None:
    """The loop of each iter var of ``block`` when every loop around it binds exactly one iter
    var, as itself (the nest ``te`` builds), else None."""
    loops = block_loops(func, block.name)
    by_var = {f.var: f for f in loops}
    out: dict[SymVar, For] = {}
    for iv in block.iter_vars:
        f = by_var.get(iv.binding) if isinstance(iv.binding, SymVar) else None
        if f is None:
            return None
        out[iv.var] = f
    if len(out) != len(loops) or len({id(f) for f in out.values()}) != len(loops):
        return None
    return out


def schedule_matmul(func: TensorFunc, parts: MatmulParts, mr: int, nr: int, rest: bool = False, jam: int = 1) -> TensorFunc:
    """Register tiles of ``mr x nr`` outputs (see the module doc). With a B packed in column
    panels a tile's column ``j_0 * panel + j_1`` indexes B as ``[j_0, k, j_1]``: when ``nr`` is
    a multiple of the panel width a tile spans ``nr / panel`` adjacent panels (a loop ``j_m``
    unrolled inside ``k``, one contiguous stream of B each); when it divides the panel a row
    tile runs the panel's strips of ``nr`` columns one after the other (``j_m`` between ``i_0``
    and ``k``); else it is one panel wide. ``rest``: the rows left after the full row tiles
    run in a tile of as many rows rounded up to ``REST_STEP`` (``rest_rows``), not a full
    tile's. ``jam``: ``k`` runs that many steps a vector of outputs (``jam_k``)."""
    groups = strips = 1
    if parts.panel is not None:
        if nr > parts.panel and nr % parts.panel == 0:
            groups = nr // parts.panel
        elif nr < parts.panel and parts.panel % nr == 0:
            strips = parts.panel // nr
        nr = parts.panel // strips
    name = parts.block.name
    loops = iv_loops(func, parts.block)
    if loops is None:
        raise ScheduleError("matmul: the block's loops are not one per iter var")
    batch = [loops[iv.var].var for iv in parts.batch]
    rows = [loops[iv.var].var for iv in parts.i]
    j, k = loops[parts.j[0].var], loops[parts.k.var]
    order = [f.var for f in block_loops(func, name)]
    if order[-2:] != [j.var, k.var]:
        raise ScheduleError("matmul: the loops do not end with the column and reduction loops")
    if order[:-2] != batch + rows:  # every spatial loop is independent: reorder freely
        func = lp.reorder(func, *batch, *rows)
    # With several row dims (a linear layer on [batch, seq, k]) the last one is tiled and the
    # others join the batch loops.
    batch, i = batch + rows[:-1], loop(func, rows[-1])
    by_rows = rest and rows_outer(parts, i.extent, mr)
    if isinstance(i.extent, int):
        mr = min(mr, i.extent)
        if by_rows:
            mr = least_waste(i.extent, mr)
    func, (io, ii) = lp.split_vars(func, i.var, [None, mr])
    jm: SymVar | None = None
    if strips > 1 or groups > 1:
        func, (jo, jm, ji) = lp.split_vars(func, j.var, [None, max(strips, groups), nr])
        inner = [jm, k.var, ii, ji] if strips > 1 else [k.var, ii, jm, ji]
    else:
        func, (jo, ji) = lp.split_vars(func, j.var, [None, nr])
        inner = [k.var, ii, ji]
    func = lp.reorder(func, *batch, *((io, jo) if by_rows else (jo, io)), *inner)
    before = func
    tile = jm if strips > 1 and jm is not None else jo if by_rows else io
    func = cache_write(func, name, tile)
    store = new_blocks(before, func)[0]
    before = func
    func = decompose_reduction(func, name, k.var)
    init = new_blocks(before, func)[0]
    inside = {}  # how many loops of the init and store blocks are inside the tile
    for blk in (init, store):
        vs = [f.var for f in block_loops(func, blk)]
        inside[blk] = len(vs) - 1 - vs.index(tile)
    # Enough column tiles keep every thread busy without fusing in the row tiles, whose
    # index would then need a division in the inner loops.
    ncol = loop(func, jo).extent
    if by_rows:
        par = batch + [io]
    else:
        par = batch + [jo] if isinstance(ncol, int) and ncol >= MIN_COLUMN_TILES else batch + [jo, io]
    p = path_of(func, loop(func, par[0]))
    if len(par) > 1:
        func = lp.fuse(func, *par)
    tiles = get_at(func.body, p)
    assert isinstance(tiles, For)
    func = lp.parallel(func, tiles.var)
    func = attempt(func, lp.unroll, ii)
    if groups > 1 and jm is not None:
        func = attempt(func, lp.unroll, jm)
    func = lp.vectorize(func, ji)
    if jam > 1:
        func = jam_k(func, k.var, ii, ji, jam)
    for blk in (init, store):  # loops inside the tile: unrolled, the last vectorized
        ls = block_loops(func, blk)[-inside[blk] :]
        for f in ls[:-1]:
            func = attempt(func, lp.unroll, f.var)
        func = attempt(func, lp.vectorize, ls[-1].var)
    func = inline_epilogue(func, parts.block.writes[0], store)
    func = schedule_rest(func, tiles.var)
    if par == [jo] and strips == 1 and (groups == 1 or rest or mr >= SPAN_HINT_ROWS):  # one or ``groups`` panels a tile, the tiles in parallel
        # (few rows: the tile's one row tile prefetches all of the next, a line a k step)
        row_tiles = sym.ceildiv(i.extent, mr)
        func = prefetch_next_panel(func, parts, jo, io, k.var, pieces=PARTS if rest else 1, tiles=row_tiles, groups=groups)
    if rest and ncol == 1 and prefetch_rows(parts, i.extent):
        func = prefetch_next_rows(func, parts, name, ii, k.var, mr)
    # Every tile's k loop runs without bounds tests: the last row (column) tile computes
    # copies of the last row (whole panels); only the store is guarded, and split where its
    # last lane is in bounds. A guard that stays in k (a column read that is not a panel's)
    # goes to a copy of the last tile (``partition``); else one copy of the tile code serves
    # every tile (a copy per partial tile doubled the kernel's C, and its compile time).
    spatial = spatial_vars(parts.block)
    row, col = spatial.index(parts.i[-1]), spatial.index(parts.j[0])
    tiled = frozenset((name, init))
    func = unguard_tiles(func, tiled, row, col, nr * max(strips, groups))
    if not outside_guards(func.body, tiled):
        func = attempt(func, lp.partition, io)
        func = attempt(func, lp.partition, tiles.var)
        return split_store(func, store)
    func = split_store(func, store)
    return rest_rows(func, io, mr, i.extent) if rest and io not in par else func


def rest_rows(func: TensorFunc, io: SymVar, mr: int, rows: Dim) -> TensorFunc:
    """The row tiles (loop ``io`` over ``ceil(rows / mr)`` tiles of ``mr`` rows, every one
    computing whole tiles) as ``rows // mr`` full tiles and, when rows are left, one tile of
    as many rows rounded up to ``REST_STEP`` (a copy of the tile with its row loops that
    long, chosen at run time): an 8-row matmul on 6-row tiles computed 12 rows."""
    full, left = sym.floordiv(rows, mr), sym.floormod(rows, mr)
    if mr <= REST_STEP or isinstance(left, int) and left == 0:  # whole tiles only (static or symbolic: 16 * batch rows)
        return func
    path, f = find_loop(func, io)
    rowl = {x.var for _, x in walk(f.body) if isinstance(x, For) and x.extent == mr and _row_loop(x, io)}
    used, names = used_names(func), block_names(func)

    def tile(n: int) -> Stmt:
        body = subst_stmt(_row_extents(f.body, rowl, n), {io: full})
        return rename_blocks(rebind(body, used), names)

    sizes = sorted({min(mr, -(-r // REST_STEP) * REST_STEP) for r in range(1, mr)})
    if isinstance(left, int):
        rest: Stmt = tile(next(n for n in sizes if n >= left))
    else:
        rest = tile(sizes[-1])
        for n in reversed(sizes[:-1]):
            rest = IfThenElse(less_than(left, n + 1), tile(n), rest)
        rest = IfThenElse(less_than(0, left), rest)
    return func.replace(body=splice_at(func.body, path, [replace(f, extent=full), rest]))


REST_STEP = 2  # the rows of a partial row tile: a multiple of this many


def _row_loop(f: For, io: SymVar) -> bool:
    """Whether ``f`` (inside row tile ``io``) runs over the tile's rows: a block under it has
    an iter var bound to both."""
    return any(
        isinstance(b, Block) and any({f.var, io} <= dim_vars(iv.binding) for iv in b.iter_vars)
        for _, b in walk(f.body)
    )  # fmt: skip


def _row_extents(s: Stmt, loops: set[SymVar], n: int) -> Stmt:
    """``s`` with the loops ``loops`` running ``n`` times."""
    s = with_children(s, [_row_extents(c, loops, n) for c in children(s)])
    return replace(s, extent=n) if isinstance(s, For) and s.var in loops else s


def outside_guards(s: Stmt, names: frozenset[str]) -> bool:
    """Whether no block named in ``names`` runs under a bounds guard in ``s`` (an ``if``
    without ``else``; the run-time choice between schedules has one)."""
    for path, x in walk(s):
        if isinstance(x, Block) and x.name in names:
            ancestors = (get_at(s, path[:n]) for n in range(len(path)))
            if any(isinstance(a, IfThenElse) and a.else_body is None for a in ancestors):
                return False
    return True


def jam_k(func: TensorFunc, k: SymVar, ii: SymVar, ji: SymVar, factor: int) -> TensorFunc:
    """The tile's ``k`` loop in steps of ``factor`` outside its rows and vector of columns, the
    steps unrolled inside: a wide one-row tile (its accumulators in L1, not registers) loads
    and stores each once per ``factor`` rows of B, not per row (a 1 x 2048 tile: 1.2x).
    Unchanged when ``factor`` does not divide K."""
    f = loop(func, k)
    if not isinstance(f.extent, int) or f.extent % factor:
        return func
    func, (ko, ki) = lp.split_vars(func, k, [None, factor])
    func = attempt(func, lp.reorder, ko, ii, ji, ki)
    return attempt(func, lp.unroll, ki)


def unguard_tiles(func: TensorFunc, names: frozenset[str], row: int, col: int, width: int) -> TensorFunc:
    """The accumulator's init and update blocks (``names``) run as full tiles; only the store
    keeps its bounds guards. ``row`` and ``col`` are the positions of the tiled row and the
    column among the blocks' spatial iter vars, ``width`` the columns a tile spans.

    Rows past the end compute copies of the last row (row ``min(i, rows - 1)``): a guard per
    row inside ``k`` made the C compiler spill the accumulators. Columns past the end compute
    from a B packed in column panels (``B[.., j // P, .., j % P]``, the panel index clamped to
    the last panel where a tile reaches past it): a guard per column turned the vectorized
    loop over them scalar (N = 24: ~15x slower than N = 32). A block that reads anything else
    by its column keeps its column guard."""
    tile = _TileSpec(names, row, col, width, used_names(func))
    return func.replace(body=_unguard(func.body, tile, False, False))


@dataclass(frozen=True)
class _TileSpec:
    names: frozenset[str]  # the accumulator's init and update blocks
    row: int  # the tiled row among their spatial iter vars
    col: int  # the column among them
    width: int  # columns a tile spans
    used: set[str]  # names taken in the function (grows)


def _unguard(s: Stmt, t: _TileSpec, rows_off: bool, cols_off: bool) -> Stmt:
    if isinstance(s, IfThenElse) and s.else_body is None:
        blocks = [b for _, b in walk(s.then_body) if isinstance(b, Block)]
        if blocks and all(b.name in t.names for b in blocks):
            col_ok = all(_panel_reads(b, t.col, t.width) is not None for b in blocks)
            keep = []
            for c in conjuncts(s.cond):
                if all(_bounds_guard(c, spatial_vars(b)[t.row]) for b in blocks):
                    rows_off = True
                elif col_ok and all(_bounds_guard(c, spatial_vars(b)[t.col]) for b in blocks):
                    cols_off = True
                else:
                    keep.append(c)
            body = _unguard(s.then_body, t, rows_off, cols_off)
            return IfThenElse(conj(keep), body) if keep else body
    if isinstance(s, Block) and s.name in t.names:
        return _full_tile(s, t, rows_off, cols_off)
    return with_children(s, [_unguard(c, t, rows_off, cols_off) for c in children(s)])


def _bounds_guard(c: Scalar, iv: IterVar) -> bool:
    """Whether ``c`` is the test ``binding < extent`` of ``iv``, however arranged."""
    if not (isinstance(c, Binary) and c.op == "<"):
        return False
    a, b = c.a, c.b
    if not all(isinstance(x, (int, sym.SymExpr)) and not isinstance(x, bool) for x in (a, b)):
        return False
    return sym.prove_eq(sym.sub(a, b), sym.sub(iv.binding, iv.extent))  # type: ignore[arg-type]


def _panel_reads(b: Block, col: int, width: int) -> dict[Buffer, tuple[int, bool]] | None:
    """The buffers ``b`` reads by its column ``j`` (other than those it writes), each as
    ``{buffer: (d, clamp)}`` when every such read is ``[.., j // P (at d), .., j % P]`` with
    ``P`` its last extent (as simplified for ``j < N``: ``[0, .., j]`` when ``N <= P``);
    ``clamp`` when the tiles (``width`` columns each) reach past its last panel. None when
    some read by ``j`` is not of that form."""
    j = spatial_vars(b)[col]
    cols = sym.mul(sym.ceildiv(j.extent, width), width)
    out: dict[Buffer, tuple[int, bool]] = {}
    for x in stmt_scalars(b.body):
        for n in walk_scalars(x):
            if not isinstance(n, Load) or n.buffer in b.writes:
                continue
            idx: list[Dim] = []
            for i in n.indices:
                if isinstance(i, PExpr):  # a gather: not followed
                    return None
                idx.append(i)
            if not any(j.var in dim_vars(i) for i in idx):
                continue
            shape, p = n.buffer.shape, n.buffer.shape[-1]
            if not isinstance(p, int) or not sym.prove_eq(idx[-1], sym.floormod(j.var, p)):
                return None
            by_j = [d for d, i in enumerate(idx[:-1]) if j.var in dim_vars(i)]
            at = [d for d, i in enumerate(idx[:-1]) if sym.prove_eq(i, sym.floordiv(j.var, p))]
            if len(by_j) > 1 or not at or not set(by_j) <= set(at):
                return None
            d = (by_j or at)[0]
            out[n.buffer] = (d, not sym.prove_le(cols, sym.mul(shape[d], p)))
    return out


def _full_tile(b: Block, t: _TileSpec, rows_off: bool, cols_off: bool) -> Block:
    """``b`` as a full tile runs it: its row clamped to the last one when its row guard is off;
    when its column guard is off, its column ``j`` ranging over whole tiles (a new iter var)
    and its panel reads rebuilt from it, the panel index clamped where a tile reaches past
    the last panel (the indices were simplified for ``j < N``)."""
    ivs = list(b.iter_vars)
    if rows_off:
        iv = spatial_vars(b)[t.row]
        ivs[ivs.index(iv)] = replace(iv, binding=sym.min_(iv.binding, sym.sub(iv.extent, 1)))
    reads = _panel_reads(b, t.col, t.width) if cols_off else None
    if reads is None:
        return replace(b, iter_vars=tuple(ivs))
    j = spatial_vars(b)[t.col]
    cols = sym.mul(sym.ceildiv(j.extent, t.width), t.width)
    j2 = new_loop_var(fresh_name(t.used, j.var.name), cols)
    ivs[ivs.index(j)] = IterVar(j2, cols, j.kind, j.binding)

    def from_tile_column(n: PExpr) -> Scalar | None:
        if not isinstance(n, Load) or n.buffer not in reads:
            return None
        d, clamp = reads[n.buffer]
        p = n.buffer.shape[-1]
        panel = sym.floordiv(j2, p)
        panel = sym.min_(panel, sym.sub(n.buffer.shape[d], 1)) if clamp else panel
        idx = [panel if e == d else i for e, i in enumerate(n.indices[:-1])]
        return Load(n.buffer, (*idx, sym.floormod(j2, p)))

    body = map_stmt_scalars(b.body, from_tile_column)
    return replace(b, iter_vars=tuple(ivs), body=subst_stmt(body, {j.var: j2}))


def split_store(func: TensorFunc, store: str) -> TensorFunc:
    """A tile's store nest (the loops around block ``store``) that tests its vector lanes
    against the column count runs, when the tile's last lane passes that test, as a copy
    without it: ``if (last lane in bounds) store else guarded store``. The guarded vector
    loop compiles to masked loads and stores (on AVX2 ``vmaskmovps``, microcoded on AMD),
    which with a short ``k`` cost more than the tile's FMAs (K = 16, N = 72: ~3x). Where the
    count of columns in bounds in the last tile is a constant, the copy for it stores that
    many lanes without a test (``_exact_rest``)."""
    return func.replace(body=_split_store(func.body, store, used_names(func)))


def _split_store(s: Stmt, store: str, used: set[str]) -> Stmt:
    if not isinstance(s, For):
        return with_children(s, [_split_store(c, store, used) for c in children(s)])
    blocks = [b for _, b in walk(s) if isinstance(b, Block)]
    if not blocks or any(b.name != store for b in blocks):
        return with_children(s, [_split_store(c, store, used) for c in children(s)])
    loops = [f for _, f in walk(s) if isinstance(f, For)]
    lanes_ = {f.var for f in loops if f.kind == "vectorized"}
    ivs = [iv for b in blocks for iv in spatial_vars(b) if dim_vars(iv.binding) & lanes_]
    guards = [
        c for _, g in walk(s) if isinstance(g, IfThenElse) and g.else_body is None
        for c in conjuncts(g.cond) if any(_bounds_guard(c, iv) for iv in ivs)
    ]  # fmt: skip
    last = [_at_last(c, loops) for c in guards]
    if not guards or any(c is None for c in last):
        return s
    held = [c for c in last if isinstance(c, Binary) and not sym.prove_le(c.b, c.a)]  # type: ignore[arg-type]
    if len(held) < len(last):  # the last lane is past the end in every tile
        return s
    if all(sym.prove_le(sym.add(c.a, 1), c.b) for c in held):  # type: ignore[arg-type]
        return _without(s, guards)
    return IfThenElse(conj(held), _without(s, guards), rebind(_exact_rest(s, guards, loops) or s, used))


def _exact_rest(s: Stmt, guards: Sequence[Scalar], loops: Sequence[For]) -> Stmt | None:
    """The store nest ``s`` for a tile whose last lane is out of bounds, without lane tests:
    when its one guard is ``start + lane < N`` (``N`` a constant, ``lane`` the vector loop of
    ``E`` lanes, ``start`` a multiple of ``E`` set outside ``s``), such a tile starts at the
    last multiple of ``E`` below ``N``, and its first ``N % E`` lanes are the ones in bounds:
    the vector loop runs that many, under one scalar test of the start. A guarded vector loop
    reads the tile's accumulators under a mask, so GCC keeps them in memory for the whole
    tile, the full tiles too: stored after the ``k`` loop (K = 16, N = 72 on AVX2: 1.2x the
    kernel's time; for AVX-512, a tile across two panels, ``-march=sapphirerapids`` code had
    224 stores of accumulators to the stack, none without the test). None when the guard is
    of another form."""
    lane_loops = [f for f in loops if f.kind == "vectorized"]
    if len(guards) != 1 or len(lane_loops) != 1 or not isinstance(lane_loops[0].extent, int):
        return None
    (c,), (lane,) = guards, lane_loops
    assert isinstance(c, Binary)
    a, n, e = c.a, c.b, lane_loops[0].extent
    if not isinstance(n, int) or n % e == 0 or not isinstance(a, sym.SymExpr):
        return None
    inner = {f.var for f in loops}
    start = sym_walk.substitute(a, {lane.var: 0})
    if dim_vars(a) & inner != {lane.var} or not sym.prove_eq(a, sym.add(start, lane.var)) or sym.floormod(start, e) != 0:
        return None

    def narrow(x: Stmt) -> Stmt:
        x = with_children(x, [narrow(y) for y in children(x)])
        return replace(x, extent=n % e) if isinstance(x, For) and x.var is lane.var else x

    return IfThenElse(less_than(start, n), narrow(_without(s, guards)))


def _at_last(c: Scalar, loops: Sequence[For]) -> Scalar | None:
    """The guard ``c`` (``a < b``, ``a`` increasing along each of ``loops`` it uses) at the
    last iteration of those loops: it holds there iff it holds at every iteration. None when
    ``a`` is not of that form."""
    assert isinstance(c, Binary)
    a = c.a
    assert isinstance(a, (int, sym.SymExpr))
    for f in loops:
        if f.var not in dim_vars(a):
            continue
        at0 = sym_walk.substitute(a, {f.var: 0})
        step = sym.sub(sym_walk.substitute(a, {f.var: 1}), at0)
        if not (isinstance(step, int) and step > 0 and sym.prove_eq(a, sym.add(at0, sym.mul(f.var, step)))):
            return None
        a = sym_walk.substitute(a, {f.var: sym.sub(f.extent, 1)})
    return less_than(a, c.b)  # type: ignore[arg-type]


def _without(s: Stmt, guards: Sequence[Scalar]) -> Stmt:
    """``s`` without the conditions ``guards`` (by identity) in its ``if``s."""
    s = with_children(s, [_without(c, guards) for c in children(s)])
    if not isinstance(s, IfThenElse) or s.else_body is not None:
        return s
    keep = [c for c in conjuncts(s.cond) if not any(c is g for g in guards)]
    return IfThenElse(conj(keep), s.then_body) if keep else s.then_body


def inline_epilogue(func: TensorFunc, out: object, store: str) -> TensorFunc:
    """Inline elementwise consumers of ``out`` into the tile-store block, one after another."""
    while True:
        consumers = [
            b.name for b in blocks_of(func)
            if b.name != store and any(r is out for r in b.reads)
        ]  # fmt: skip
        if len(consumers) != 1:
            return func
        try:
            func = reverse_compute_inline(func, consumers[0])
        except ScheduleError:
            return func
        out = next(b for b in blocks_of(func) if b.name == store).writes[0]


def schedule_rest(func: TensorFunc, main: SymVar) -> TensorFunc:
    """Give every other loop nest (not the one holding loop ``main``) the spatial treatment."""
    for top in top_nests(func):
        if any(isinstance(s, For) and s.var is main for _, s in walk(top)):
            continue
        if all(isinstance(c.leaf, Block) for c in leaves(top)):
            func = spatial_nest(func, top, out_dtype(func))
    return func

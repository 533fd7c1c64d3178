"""The stencil rule: a channel-last window op with per-channel weights
(``depthwise_conv2d_nhwc``), alone or with its fused epilogue, as one nest ``[batch, rows,
columns, channels]`` whose value reads one input at several columns around the output's (the
taps) and a table ``w[tap, channel]``.

The elementwise rule would fuse the three outer loops and run every channel of a pixel in one
vector loop: each output vector then loads its taps' weights again (a 5 x 5 depthwise conv of
576 channels streams 57 KB of weights from L2 for every pixel), and the taps that can fall in
the padding are masked and clamped at every column. Here instead:

- the rows (batch x output rows) run in parallel, and the channels in blocks of one vector
  of the host (``host_registers``; all of them where the vector does not divide them or they
  are two vectors at most): a block's weights stay in L1 while a row of outputs is made;
- the columns run as consecutive loops (``peel``): the left border, the interior, the rest
  (the right border). In the interior no tap leaves the input, and the C compiler, which
  knows each loop's range, folds the masks and clamps away; the interior's columns go up to
  ``JAM`` at a time (fewer where a block is several vectors: each column's accumulators are
  registers, and where taps x columns would pass ``JAM_TERMS``), a border whole, and these
  columns are made tap by tap (``_interleave``): each loaded weight vector serves all of them,
  and their sums are independent chains of FMAs. Each column's accumulators start at a
  whole vector (a block of 24 channels in 16 lanes takes 32 floats): packed tight, vectors
  shared by two columns had their products added apart from the multiplies (a lost FMA, other
  bits than one expression per output), and the 72-, 88- and 120-channel depthwise convs of
  MobileNetV3-Small ran 1.2-1.6x slower on AVX-512 (batch 8, in one process). A 7 x 7 stem
  of 3 channels has 147 taps:
  8 columns at a time unrolled 1176 steps, which ran slower than 4 (AVX2 Zen, 224 x 224,
  3 -> 8 channels: 1.63 ms, 0.82 at 4) and took gcc 2-3x as long (a 29 x 23 image: 52 s of
  gcc, 17.5 at 4);
- a row's body is there twice, under a test of the row: interior rows (their row masks and
  clamps fold the same way), then the border rows (one output at a time where they are few).

Measured on MobileNetV3-Small (AMD Zen-class AVX-512, 2 threads, one process, the model
compiled both ways and called in turn; with ``inline_scalar_constants``, whose literal clamp
bounds the hardswish epilogues of these kernels need): batch 1 1.18x, batch 8 1.19x the whole
model with the elementwise schedule and the constants as buffers.

On the AVX2-only first Zen cores (16 registers of 32 bytes, 2 threads, in-process minima),
MobileNetV3-Small at batch 8: its depthwise convs 9.4 -> 4.1 ms; its stem (a direct conv of 3
channels, taken here since it has taps and a weight table too, reading the image unpadded)
4.0 ms + 1.1 ms for a padded copy -> 2.0-2.3 ms; the whole model 0.68x -> 0.86-0.95x
onnxruntime (``bench/bench_vision.py``, several runs on a noisy machine; 0.77x -> 0.75-1.22x
at batch 1).

Declines (the elementwise rule takes the function) unless the function is one perfect nest of
four loops over one block, the channel loop static and at least a vector long, the column
loop static, with at least ``MIN_TAPS`` distinct column indices of one 4-d input in the value
(channel-last or channel-first) and a per-tap, per-channel table read (a pool has none: it is
bound by memory, see ``_per_channel``).
"""

from __future__ import annotations

from tilework.ir import sym, sym_walk
from tilework.ir.loop import Allocate, Binary, Block, Buffer, For, IfThenElse, IterVar, Load, Scalar, Store, TensorFunc, walk_scalars
from tilework.ir.sym import Dim, SymVar
from tilework.schedule import loop_primitives as lp
from tilework.schedule.analysis import FuncKind, classify
from tilework.schedule.rules.common import attempt, chain, host_registers, loop, out_dtype, top_nests, worth_parallel
from tilework.schedule.rules.inline import inline_producers
from tilework.schedule.tree import block_names, conj, find_loop, fresh_name, map_scalars, rebind, rename_blocks, replace_at, scalar_equal, seq, subst_stmt, used_names, walk

NAME = "stencil"

MIN_TAPS = 3  # distinct column indices of one input: fewer is not a window
JAM = 8  # most interior columns unrolled inside the channel loop
BORDER_ROWS_SHARE = 8  # border rows fewer than 1 / this of the rows: their copy is not jammed
WHOLE_BLOCK_VECTORS = 2  # channels in at most this many vectors: one block (``_channel_block``)
SPARE_REGISTERS = 4  # vector registers a jammed step needs besides the accumulators (a weight, an input, ...)
JAM_TERMS = 640  # most taps x jammed columns in one step (``_plan``)
_COMPARISONS = ("<", "<=", ">", ">=")


def apply(func: TensorFunc) -> TensorFunc | None:
    if classify(func) not in (FuncKind.ELEMWISE, FuncKind.BROADCAST, FuncKind.INJECTIVE):
        return None
    func = inline_producers(func)
    tops = top_nests(func)
    if len(tops) != 1:
        return None
    nest = chain(tops[0])
    if len(nest) != 4 or any(f.kind != "serial" for f in nest) or not isinstance(nest[-1].body, Block):
        return None
    plan = _plan(nest, nest[-1].body, host_registers().lanes(out_dtype(func)))
    if plan is None:
        return None
    return _schedule(func, nest, *plan)


def _plan(nest: list[For], block: Block, vector: int) -> tuple[int, tuple[int, int], tuple[int, int], int] | None:
    """(channel block, interior columns, interior rows, jam) for the nest, or None if it is
    not a stencil along its column loop (an interior is a range ``[start, end)``)."""
    rows, cols, chans = nest[1], nest[2], nest[3]
    if not all(isinstance(f.extent, int) for f in (rows, cols, chans)) or chans.extent < vector:  # type: ignore[operator]
        return None
    by_loop = {iv.binding: iv.var for iv in block.iter_vars if isinstance(iv.binding, SymVar)}
    col, chan = by_loop.get(cols.var), by_loop.get(chans.var)
    if col is None or chan is None or not isinstance(block.body, Store):
        return None
    value = block.body.value
    taps: dict[object, set[Dim]] = {}
    for ld in (x for x in walk_scalars(value) if isinstance(x, Load)):
        moving = [d for d in ld.indices if isinstance(d, (int, sym.SymExpr)) and col in sym_walk.free_vars(d)]
        if len(ld.indices) == 4 and len(moving) == 1:  # channel-last (a depthwise conv) or channel-first (an image's conv)
            taps.setdefault(ld.buffer, set()).add(moving[0])
    if not taps or max(len(v) for v in taps.values()) < MIN_TAPS:
        return None
    if not any(_per_channel(ld, chan) for ld in walk_scalars(value) if isinstance(ld, Load)):
        return None
    lo, hi = _interior_range(value, col, cols.extent)  # type: ignore[arg-type]
    row = by_loop.get(rows.var)
    row_range = _interior_range(value, row, rows.extent) if row is not None else (0, 0)  # type: ignore[arg-type]
    width = _channel_block(chans.extent, vector)  # type: ignore[arg-type]
    most = max(1, min(JAM, (host_registers().count - SPARE_REGISTERS) // -(-width // vector)))
    total = _longest_sum(value)
    most = max(1, min(most, JAM_TERMS // (len(_terms(total)) if total is not None else 1)))
    return width, (lo, hi), row_range, _jam(hi - lo, most)


def _per_channel(ld: Load, chan: SymVar) -> bool:
    """``ld`` reads a per-tap, per-channel table (a depthwise conv's weights ``w[tap, c]``):
    what a channel block keeps in L1 while a row of outputs is made. A window without one (a
    pool) streams its pixels and is bound by memory: the elementwise schedule, all channels of
    a pixel at once, was 1.15x faster on ResNet-18's max pool."""
    *taps, last = ld.indices
    return bool(taps) and last is chan and all(isinstance(t, int) for t in taps)


def _jam(length: int, most: int = JAM) -> int:
    """Columns jammed at a time into an interior of ``length``: a divisor of it from 4 to
    ``most``, else ``most`` (the rest of the interior runs as one more jammed piece), at most
    the interior (1: nothing to jam)."""
    if length < 2:
        return 1
    if length <= most:
        return length
    return next((u for u in range(most, 3, -1) if length % u == 0), most)


def _interior_range(value: object, var: SymVar, extent: int) -> tuple[int, int]:
    """The first run of positions of ``var`` where no tap is in the padding."""
    tests, clamps = _tests_of(value, var)
    inside = [_interior(tests, clamps, var, x) for x in range(extent)]
    lo = next((x for x in range(extent) if inside[x]), extent)
    hi = lo
    while hi < extent and inside[hi]:
        hi += 1
    return lo, hi


def _channel_block(channels: int, vector: int) -> int:
    """One vector of channels where it divides ``channels``, else all of them; all of them
    too where they are at most ``WHOLE_BLOCK_VECTORS`` vectors: a jammed column then holds
    that many accumulators, a direct conv's input value broadcast once serves them all, and
    the columns are swept once. 16 channels on AVX2, MobileNetV3-Small at batch 8: its stem
    (3 -> 16) 2.43 -> 2.26 ms, its first depthwise conv 0.72 -> 0.58 ms (kernel minima)."""
    return vector if channels % vector == 0 and channels > WHOLE_BLOCK_VECTORS * vector else channels


def _tests_of(value: object, var: SymVar) -> tuple[list[Binary], list[sym.SymExpr]]:
    """The comparisons of ``var`` alone in ``value`` (a tap's mask) and the clamps of ``var``
    alone in its load indices (a min or max: a tap's position kept in the input)."""
    tests: list[Binary] = []
    clamps: list[sym.SymExpr] = []
    for e in walk_scalars(value):  # type: ignore[arg-type]
        if isinstance(e, Binary) and e.op in _COMPARISONS and _only(e.a, var) and _only(e.b, var):
            tests.append(e)
        elif isinstance(e, Load):
            clamps += [c for d in e.indices if isinstance(d, (int, sym.SymExpr)) for c in _clamps(d) if _only(c, var)]
    return tests, clamps


def _interior(tests: list[Binary], clamps: list[sym.SymExpr], var: SymVar, x: int) -> bool:
    """Whether at ``var = x`` (a column, or a row) every test holds and every clamp is
    inactive: no tap is in the padding."""
    env = {var: x}
    for t in tests:
        a, b = sym_walk.evaluate(t.a, env), sym_walk.evaluate(t.b, env)  # type: ignore[arg-type]
        if not {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[t.op]:
            return False
    return all(_inactive(c, var, env) for c in clamps)


def _only(d: object, var: SymVar) -> bool:
    """``d`` is an index of ``var`` (and constants) alone."""
    if not isinstance(d, (int, sym.SymExpr)) or isinstance(d, bool):
        return False
    return set(sym_walk.free_vars(d)) == {var}


def _clamps(d: Dim) -> list[sym.SymExpr]:
    """The min and max terms in ``d``."""
    out: list[sym.SymExpr] = []

    def go(e: Dim) -> Dim:
        if isinstance(e, (sym.Min, sym.Max)):
            out.append(e)
        sym.substitute_atoms(e, go)
        return e

    go(d)
    return out


def _inactive(c: sym.SymExpr, var: SymVar, env: dict[SymVar, int]) -> bool:
    """The clamp ``c`` of ``var`` returns its operand that moves with ``var`` at ``env``."""
    a, b = c.a, c.b  # type: ignore[attr-defined]
    moving = a if var in sym_walk.free_vars(a) else b
    return sym_walk.evaluate(c, env) == sym_walk.evaluate(moving, env)


def _schedule(func: TensorFunc, nest: list[For], block: int, columns: tuple[int, int], rows_inside: tuple[int, int], jam: int) -> TensorFunc:
    batch, rows, cols, chans = (f.var for f in nest)
    lo, hi = columns
    extents = [f.extent for f in nest]
    width: int = nest[2].extent  # type: ignore[assignment]
    height: int = nest[1].extent  # type: ignore[assignment]
    if block < nest[3].extent:  # type: ignore[operator]
        func, (cblock, chans) = lp.split_vars(func, chans, [None, block])
        func = lp.reorder(func, batch, rows, cblock, cols, chans)
    steady = lo + (hi - lo) // jam * jam if jam > 1 else lo
    cuts = sorted({lo, steady, hi} - {0, width})  # left border, jammed, unjammed interior, right border
    func, pieces = lp.peel(func, cols, cuts)
    fast = func
    for piece, start in zip(pieces, [0, *cuts]):
        inner = _inner(func, piece)
        unroll = _unroll(start, loop(func, piece).extent, (lo, steady, hi), jam)
        if unroll == 1:
            fast = attempt(fast, lp.vectorize, inner)
            continue
        fast, (outer, lane) = lp.split_vars(fast, piece, [None, unroll])
        fast = lp.reorder(fast, outer, inner, lane)
        fast = lp.unroll(fast, lane)
        fast = _interleave(attempt(fast, lp.vectorize, inner), outer)
    if not worth_parallel(extents):
        return fast
    fused = attempt(fast, lp.fuse, batch, rows)
    if fused is fast:
        return attempt(fast, lp.parallel, batch)
    fused = attempt(fused, lp.parallel, top_nests(fused)[0].var)
    lo_row, hi_row = rows_inside
    if (height - max(0, hi_row - lo_row)) * BORDER_ROWS_SHARE < height:  # few border rows: their copy plain
        plain = func
        for piece in pieces:
            plain = attempt(plain, lp.vectorize, _inner(func, piece))
        other = attempt(plain, lp.fuse, batch, rows)
        return _version_rows(fused, height, rows_inside, top_nests(other)[0] if other is not plain else None)
    return _version_rows(fused, height, rows_inside)


def _unroll(start: int, extent: Dim, interior: tuple[int, int, int], jam: int) -> int:
    """Columns made at a time by the column piece from ``start`` (``interior``: where the
    interior starts, where its jammed part ends, where it ends): the steady interior ``jam``
    at a time; a border piece whole, if short; else one (the interior's rest, less than a jam,
    one output at a time: jammed, it cost more compile time than it saved run time)."""
    lo, steady, hi = interior
    if jam > 1 and start == lo and extent == steady - lo:
        return jam
    border = start < lo or start >= hi
    return extent if border and isinstance(extent, int) and 2 <= extent <= jam else 1


def _interleave(func: TensorFunc, outer: SymVar) -> TensorFunc:
    """The jammed columns under ``outer`` (``outer -> channel vector loop -> unrolled columns
    -> block``) made tap by tap: the window's sum of taps ``((t0 + t1) + t2) + ...`` goes into
    an accumulator per column, ``acc = t0``, then ``acc = acc + t1`` for every column, then
    ``t2``..., then the epilogue of each column from its accumulator. A depthwise conv's sum is
    one chain: each output adds its taps in the same order as before (the same bits); a sum of
    partial chains (a direct conv's, one per kernel row) becomes one chain, which rounds
    differently. In one expression per output the compiler makes each output's sum a chain of
    dependent FMAs (latency-bound) and loads every weight vector again for every output; tap
    by tap, the jammed columns are independent chains side by side and one loaded weight
    serves them all (a 5 x 5 depthwise conv of 240 channels, 14 x 14, on one AVX2 core: 1.18
    -> 0.46 ms for the interior). ``func`` unchanged where the nest is not that shape or the
    value has no sum of at least ``MIN_TAPS`` terms."""
    path, f = find_loop(func, outer)
    inner = f.body
    if not isinstance(inner, For) or inner.kind != "vectorized" or not isinstance(inner.body, For) or inner.body.kind != "unrolled":
        return func
    lane = inner.body
    block = lane.body
    if not isinstance(block, Block) or block.init is not None or not isinstance(block.body, Store):
        return func
    store = block.body
    total = _longest_sum(store.value)
    if total is None:
        return func
    terms = _terms(total)
    if len(terms) < MIN_TAPS:
        return func
    used, names = used_names(func), block_names(func)
    # each column's accumulators start at a whole vector: a column of channels that is not one
    # (24 channels in 16 lanes) is not packed with its neighbour's into shared vectors, whose
    # products the compiler then added apart from their multiplies (an FMA lost, other bits)
    row = inner.extent
    if isinstance(row, int):
        vector = host_registers().lanes(total.dtype)
        row = -(-row // vector) * vector
    acc = Buffer(fresh_name(used, f"{store.buffer.name}_acc"), (lane.extent, row), total.dtype)

    def nest(name: str, write: Buffer, value: Scalar, indices: tuple[Scalar, ...] | None = None) -> For:
        at_lane = IterVar(SymVar(fresh_name(used, "vjam")), lane.extent, "spatial", lane.var)
        at_chan = IterVar(SymVar(fresh_name(used, "vjam_c")), inner.extent, "spatial", inner.var)
        here: tuple[Scalar, ...] = (at_lane.var, at_chan.var)
        value = map_scalars(value, lambda e: Load(acc, here) if isinstance(e, Load) and e.buffer is acc else None)
        reads = block.reads + ((acc,) if any(isinstance(e, Load) and e.buffer is acc for e in walk_scalars(value)) else ())
        body = Store(write, here if indices is None else indices, value)
        b = Block(fresh_name(names, name), (*block.iter_vars, at_lane, at_chan), reads, (write,), body)
        return rebind(For(lane.var, lane.extent, For(inner.var, inner.extent, b, "vectorized"), "unrolled"), used)  # type: ignore[return-value]

    slot = Load(acc, (0, 0))  # a placeholder for the accumulator of the nest's own column and lanes
    steps = [nest(f"{block.name}_acc", acc, terms[0])]
    steps += [nest(f"{block.name}_acc", acc, Binary("+", slot, t, total.dtype)) for t in terms[1:]]
    result = map_scalars(store.value, lambda e: slot if scalar_equal(e, total) else None)
    steps.append(nest(block.name, store.buffer, result, store.indices))
    return func.replace(body=replace_at(func.body, path, For(f.var, f.extent, Allocate(acc, seq(steps)), f.kind)))


def _longest_sum(value: Scalar) -> Binary | None:
    """The ``+`` chain in ``value`` with the most terms (a window's sum of taps)."""
    best: tuple[int, Binary | None] = (0, None)
    for e in walk_scalars(value):
        if isinstance(e, Binary) and e.op == "+":
            n = len(_terms(e))
            if n > best[0]:
                best = (n, e)
    return best[1]


def _terms(total: Binary) -> list[Scalar]:
    """The terms of the sum ``total`` left to right: a left-deep chain ``((t0 + t1) + t2) +
    ...`` in the order its terms are added; a tree of partial sums (a direct conv's one chain
    per kernel row, added at the end) flattened into one chain."""
    if not (isinstance(total, Binary) and total.op == "+"):
        return [total]
    return [t for side in (total.a, total.b) for t in (_terms(side) if isinstance(side, Binary) and side.op == "+" and side.dtype == total.dtype else [side])]


def _version_rows(func: TensorFunc, height: int, inside: tuple[int, int], plain: For | None = None) -> TensorFunc:
    """The row's body twice under a test of the row (the fused batch-and-row loop modulo the
    rows): interior rows (no tap in the padding) first, so that the compiler folds their row
    masks and clamps too; the other rows in a copy with its own names, or given ``plain`` (the
    same fused loop scheduled without jammed columns) that loop's body: ``_schedule`` gives it
    where the border rows are fewer than ``1 / BORDER_ROWS_SHARE`` of the rows, whose jammed
    copy would double the kernel's C and its compile time for little (in-process A/B on AVX2,
    MobileNetV3-Small at batch 8: its stem 5.3 -> 2.1 s of gcc, the 56 x 56 and 28 x 28
    depthwise convs, 1 or 2 border rows, as fast or faster plain; the 14 x 14 and 7 x 7 ones,
    4 border rows, 1.3-1.4x slower plain, so jammed). Nothing changes where every row or none
    is interior. (Either copy computes any row: the test only picks one.)"""
    lo, hi = inside
    if hi <= lo or (lo == 0 and hi == height):
        return func
    top = top_nests(func)[0]
    if top.kind != "parallel":
        return func
    row = sym.floormod(top.var, height)
    used, names = used_names(func), block_names(func)
    body = top.body if plain is None else subst_stmt(plain.body, {plain.var: top.var})
    other = rename_blocks(rebind(body, used), names)
    test = conj([Binary(">=", row, lo, "bool"), Binary("<", row, hi, "bool")])
    path = next(p for p, s in walk(func.body) if s is top)
    return func.replace(body=replace_at(func.body, path, For(top.var, top.extent, IfThenElse(test, top.body, other), top.kind)))


def _inner(func: TensorFunc, piece: SymVar) -> SymVar:
    """The channel loop under the column loop ``piece``."""
    _, f = find_loop(func, piece)
    return next(s.var for _, s in walk(f.body) if isinstance(s, For))



__all__ = ["NAME", "apply"]

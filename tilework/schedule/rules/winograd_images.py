"""The rule for the per-image Winograd conv (``tilework.op.winograd_images``): its serial loop
over the images stays, and each step inside it (input transform, the 16 products, output
transform) is scheduled by the other rules as the function of one image it is: the buffers
indexed by the image (``[N, ...]`` read or written at ``[image + i, ...]``) are seen as ``[1,
...]`` buffers while the step is scheduled, so the step gets the schedule it would get at
batch 1 (the products the matmul rule's, the transforms the stencil or spatial rules'), and
its parallel loops nest in the loop over the images. Every image's scratch stays in cache.

Elementwise ops fused after the conv (``fuse_tensor``: a bias-free residual add, a relu) are
top-level nests over the batch after the loop: each moves into the loop as the image's own
nest, after the output transform, and the output transform's block is inlined into it
(``compute_inline``, as fusion inlines it into the three-kernel form's), so the conv's
result is not written and read again.

The kernel is recognized as a top-level serial loop whose var is the op's ``IMAGE_VAR``, under
it scratch allocations and a sequence of loop nests holding the steps' blocks.
"""

from __future__ import annotations

from typing import Any, Sequence

from tilework.errors import ScheduleError, TileworkError
from tilework.ir import sym, sym_walk
from tilework.ir.loop import Allocate, Block, Buffer, For, IterVar, Load, Scalar, SeqStmt, Stmt, Store, TensorFunc, free_sym_vars, stmt_scalars, walk_scalars, walk_stmts
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.op.winograd_images import IMAGE_VAR, IndexMap, rebase
from tilework.schedule.analysis import is_reduction
from tilework.schedule.block_primitives import compute_inline
from tilework.schedule.rules.common import out_dtype, spatial_nest, top_nests
from tilework.schedule.rules.inline import repeats_work
from tilework.schedule.tree import blocks_of, children, leaves, with_children

NAME = "winograd_images"
STEP_RULES: tuple[Any, ...] = ()  # the rules for one step, in order, the fallback last (set by ``tilework.schedule.rules``)


def _image_loop(func: TensorFunc) -> For | None:
    for top in top_nests(func):
        if top.kind == "serial" and top.var.name.startswith(IMAGE_VAR):
            return top
    return None


def _same(a: Dim, b: Dim) -> bool:
    return a is b or (isinstance(a, int) and isinstance(b, int) and a == b)


def _accesses(s: Stmt) -> list[tuple[Buffer, tuple[Scalar, ...]]]:
    out: list[tuple[Buffer, tuple[Scalar, ...]]] = []
    for st in walk_stmts(s):
        if isinstance(st, Store):
            out.append((st.buffer, st.indices))
        for x in stmt_scalars(st):
            out.extend((y.buffer, y.indices) for y in walk_scalars(x) if isinstance(y, Load))
    return out


def _buffers(s: Stmt) -> tuple[list[Buffer], list[Buffer]]:
    """The buffers ``s`` only reads and those it writes, in order of first use (scratch it
    allocates itself left out)."""
    local = {st.buffer for st in walk_stmts(s) if isinstance(st, Allocate)}
    written = {st.buffer: None for st in walk_stmts(s) if isinstance(st, Store) and st.buffer not in local}
    used = {b: None for b, _ in _accesses(s) if b not in local}
    return [b for b in used if b not in written], list(written)


def _per_image(s: Stmt, image: SymVar, batch: Dim) -> dict[Buffer, Buffer]:
    """The buffers of ``[batch, ...]`` that ``s`` reads and writes only at ``[image + i, ...]``
    (``i`` free of ``image``), each with its ``[1, ...]`` stand-in."""
    ok: dict[Buffer, bool] = {}
    for b, idx in _accesses(s):
        if not b.shape or not _same(b.shape[0], batch):
            continue
        i0 = idx[0] if idx else None
        good = isinstance(i0, (int, SymExpr)) and image not in sym_walk.free_vars(sym.sub(i0, image))
        ok[b] = ok.get(b, True) and good
    return {b: Buffer(b.name, (1, *b.shape[1:]), b.dtype) for b, good in ok.items() if good}


def _epilogue(nest: For, batch: Dim, per: dict[Buffer, Buffer]) -> Stmt | None:
    """The nest over the batch ``nest`` (fused after the conv) as one image's: its loop over
    the batch of one iteration, the ``[batch, ...]`` buffers it indexes by that loop replaced
    by their ``[1, ...]`` stand-ins (added to ``per``); None where it indexes one otherwise."""
    outer: list[SymVar] = [nest.var]
    for st in walk_stmts(nest.body):
        if isinstance(st, Block):
            outer.extend(iv.var for iv in st.iter_vars if iv.binding is nest.var)
    touched: dict[Buffer, None] = {}
    for b, idx in _accesses(nest.body):
        if not b.shape or not _same(b.shape[0], batch):
            continue
        if not idx or not any(idx[0] is v for v in outer):
            return None
        touched[b] = None
    for b in touched:
        per.setdefault(b, Buffer(b.name, (1, *b.shape[1:]), b.dtype))
    body = rebase(nest.body, {b: (per[b], _same_index) for b in touched})
    return For(nest.var, 1, _one_iteration(body, nest.var), nest.kind)


def _same_index(idx: tuple[Scalar, ...]) -> tuple[Scalar, ...]:
    return idx


def _one_iteration(s: Stmt, var: SymVar) -> Stmt:
    """``s`` with the block iter vars bound to ``var`` ranging over one value."""
    if isinstance(s, Block):
        ivs = tuple(IterVar(iv.var, 1, iv.kind, iv.binding) if iv.binding is var else iv for iv in s.iter_vars)
        return Block(s.name, ivs, s.reads, s.writes, _one_iteration(s.body, var), None if s.init is None else _one_iteration(s.init, var))
    return with_children(s, [_one_iteration(c, var) for c in children(s)])


def _shift(by: Dim) -> IndexMap:
    def f(idx: tuple[Scalar, ...]) -> tuple[Scalar, ...]:
        i0 = idx[0]
        assert isinstance(i0, (int, SymExpr))
        return (sym.add(i0, by), *idx[1:])

    return f


def _schedule_step(step: Stmt, image: SymVar, batch: Dim, per: dict[Buffer, Buffer], epilogue: Sequence[Stmt] = (), scratch: Sequence[Buffer] = ()) -> Stmt:
    """``step`` (with the image's ``epilogue`` nests after it) scheduled as one image's
    function (``per``: the stand-ins of the buffers it indexes by the image). ``scratch``:
    buffers the step writes and its epilogue reads that nothing else needs (the conv's
    result): they become the step's own scratch of one image, inlined into their readers
    where valid."""
    one: Stmt = rebase(step, {b: (p, _shift(sym.sub(0, image))) for b, p in per.items()})
    if epilogue:
        one = SeqStmt((one, *epilogue))
    own = [per.get(b, b) for b in scratch]
    for b in own:
        one = Allocate(b, one)
    ins, outs = _buffers(one)
    bufs = [*ins, *outs]
    func = TensorFunc((*bufs, *free_sym_vars(one, bufs)), one, len(outs))
    for b in own:
        writers = [blk for blk in blocks_of(func) if b in blk.writes]
        if len(writers) == 1 and not is_reduction(writers[0]) and not repeats_work(func, writers[0]):
            try:
                func = compute_inline(func, writers[0].name)
            except ScheduleError:
                pass
    done = _scheduled(func)
    back = {p: (b, _shift(image)) for b, p in per.items() if b not in scratch}
    return rebase(done.body, back)


def _scheduled(func: TensorFunc) -> TensorFunc:
    """``func`` scheduled by the first of ``STEP_RULES`` that applies (as
    ``tilework.schedule.default_schedule`` does; left as it is where none does)."""
    for rule in STEP_RULES:
        try:
            out = rule.apply(func)
        except TileworkError:
            out = None
        if out is not None:
            return out
    return func


def _strip(s: Stmt, drop: set[Buffer]) -> Stmt:
    """``s`` without the top-level allocations of ``drop``."""
    if isinstance(s, Allocate):
        body = _strip(s.body, drop)
        return body if s.buffer in drop else Allocate(s.buffer, body)
    if isinstance(s, SeqStmt):
        return SeqStmt(tuple(_strip(c, drop) for c in s.stmts))
    return s


def _top_allocs(s: Stmt) -> list[Buffer]:
    out: list[Buffer] = []
    while isinstance(s, Allocate):
        out.append(s.buffer)
        s = s.body
    if isinstance(s, SeqStmt):
        for c in s.stmts:
            out.extend(_top_allocs(c))
    return out


def apply(func: TensorFunc) -> TensorFunc | None:
    top = _image_loop(func)
    if top is None:
        return None
    image, batch = top.var, top.extent
    allocs: list[Buffer] = []
    s = top.body
    while isinstance(s, Allocate):
        allocs.append(s.buffer)
        s = s.body
    steps = list(s.stmts if isinstance(s, SeqStmt) else (s,))
    pers = [_per_image(st, image, batch) for st in steps]
    # the epilogue: the nests over the batch after the loop, moved into it
    tops = top_nests(func)
    after = tops[tops.index(top) + 1 :]
    epilogue: list[Stmt] = []
    if after:
        per = dict(pers[-1])
        nests = [_epilogue(t, batch, per) for t in after]
        if all(e is not None for e in nests):
            epilogue, pers[-1] = [e for e in nests if e is not None], per
    moved = set(after) if epilogue else set()
    outer = set(_top_allocs(func.body))
    scratch: list[Buffer] = []
    if epilogue:
        ins_last, outs_last = _buffers(SeqStmt((steps[-1], *after)))
        scratch = [b for b in outs_last if b in outer and b in pers[-1]]
    last = len(steps) - 1
    body: Stmt = SeqStmt(tuple(_schedule_step(st, image, batch, pers[i], epilogue if i == last else (), scratch if i == last else ()) for i, st in enumerate(steps)))
    for b in reversed(allocs):
        body = Allocate(b, body)
    new_top = For(image, batch, body, "serial")
    out = func.replace(body=_strip(_replace_tops(func.body, top, new_top, moved), set(scratch)))
    for other in top_nests(out):  # any other nest: the spatial treatment
        if other is not new_top and all(isinstance(c.leaf, Block) for c in leaves(other)):
            out = spatial_nest(out, other, out_dtype(out))
    return out


def _replace_tops(s: Stmt, old: For, new: For, gone: set[For]) -> Stmt:
    if s is old:
        return new
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _replace_tops(s.body, old, new, gone))
    if isinstance(s, SeqStmt):
        kept = tuple(_replace_tops(c, old, new, gone) for c in s.stmts if c not in gone)
        return kept[0] if len(kept) == 1 else SeqStmt(kept)
    return s

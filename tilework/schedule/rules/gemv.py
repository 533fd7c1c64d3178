"""The GEMV rule: a matrix-vector product (a matmul whose free row dim is absent or 1).

Two layouts:

- *dot*: ``y[j] = sum_k M[j, k] * x[k]`` (the matrix contiguous along ``k``): parallel over
  ``j``, and each dot product accumulates into several vector registers at once (``k`` split
  by four vector widths and ``rfactor``-ed), then sums them.
- *axpy*: ``y[j] = sum_k x[k] * M[k, j]`` (contiguous along ``j``): ``j`` in tiles of eight
  vectors run in parallel; per ``k`` a tile adds ``x[k]`` times a row segment of ``M`` into
  register accumulators (``cache_write`` + ``decompose_reduction``), streaming ``M`` once.
"""

from __future__ import annotations

from tilework.errors import ScheduleError
from tilework.ir.loop import For, TensorFunc
from tilework.schedule import loop_primitives as lp
from tilework.schedule.analysis import FuncKind, MatmulParts, classify, main_block, matmul_parts
from tilework.schedule.reduction_primitives import cache_write, decompose_reduction
from tilework.schedule.rules.common import attempt, block_loops, lanes, loop, new_blocks, out_dtype, path_of
from tilework.schedule.rules.inline import inline_producers
from tilework.schedule.rules.matmul import inline_epilogue, iv_loops, schedule_rest
from tilework.schedule.rules.reduction import schedule_reduction
from tilework.schedule.tree import get_at

NAME = "gemv"
TILE_VECTORS = 16  # vectors per tile of the axpy form


def apply(func: TensorFunc) -> TensorFunc | None:
    if classify(func) != FuncKind.GEMV:
        return None
    func = inline_producers(func)
    mb = main_block(func)
    parts = None if mb is None else matmul_parts(mb)
    if parts is None:
        return None
    if parts.b.indices[-1] is parts.k.var:
        return schedule_reduction(func)
    try:
        return schedule_axpy(func, parts)
    except ScheduleError:
        return None


def schedule_axpy(func: TensorFunc, parts: MatmulParts) -> TensorFunc:
    name = parts.block.name
    loops = iv_loops(func, parts.block)
    if loops is None:
        raise ScheduleError("gemv: the block's loops are not one per iter var")
    outer = [loops[iv.var].var for iv in (*parts.batch, *parts.i)]
    j, k = loops[parts.j[0].var], loops[parts.k.var]
    order = [f.var for f in block_loops(func, name)]
    if order != outer + [j.var, k.var]:
        raise ScheduleError("gemv: loops are not batch, j, k")
    width = parts.panel or lanes(out_dtype(func)) * TILE_VECTORS  # a packed B: one panel a tile
    func, (jo, ji) = lp.split_vars(func, j.var, [None, width])
    func = lp.reorder(func, jo, k.var, ji)
    before = func
    func = cache_write(func, name, jo)
    store = new_blocks(before, func)[0]
    before = func
    func = decompose_reduction(func, name, k.var)
    init = new_blocks(before, func)[0]
    tiled = outer + [jo]
    p = path_of(func, loop(func, tiled[0]))
    if len(tiled) > 1:
        func = lp.fuse(func, *tiled)
    tiles = get_at(func.body, p)
    assert isinstance(tiles, For)
    func = lp.parallel(func, tiles.var)
    func = lp.vectorize(func, ji)
    for blk in (init, store):
        func = attempt(func, lp.vectorize, block_loops(func, blk)[-1].var)
    func = inline_epilogue(func, parts.block.writes[0], store)
    return schedule_rest(func, tiles.var)

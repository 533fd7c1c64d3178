"""The elementwise/injective rule: inline scratch producers, split a nest at a concat's pieces
(``pieces.split_at_pieces``), then for every loop nest fuse the outer loops into one parallel
loop and vectorize the innermost (contiguous) loop.

Applies to functions whose blocks are all elementwise, broadcast or injective.
"""

from __future__ import annotations

from tilework.ir.loop import TensorFunc
from tilework.schedule.analysis import FuncKind, classify
from tilework.schedule.rules.common import loop, out_dtype, spatial_nest, top_nests
from tilework.schedule.rules.inline import inline_producers
from tilework.schedule.rules.pieces import split_at_pieces

NAME = "elementwise"


def apply(func: TensorFunc) -> TensorFunc | None:
    if classify(func) not in (FuncKind.ELEMWISE, FuncKind.BROADCAST, FuncKind.INJECTIVE):
        return None
    func = inline_producers(func)
    for var in [top.var for top in top_nests(func)]:
        func, nests = split_at_pieces(func, loop(func, var))
        for v in nests:
            func = spatial_nest(func, loop(func, v), out_dtype(func))
    return func

"""The fallback rule, valid on every TensorFunc: in each loop nest, fuse the independent
loops at the top and run them in parallel, and vectorize innermost loops whose iterations are
independent. Anything else stays serial, so the rule always applies and never changes a
result."""

from __future__ import annotations

from tilework.ir.loop import For, TensorFunc
from tilework.schedule import loop_primitives as lp
from tilework.schedule.rules.common import attempt, parallel_rows, top_nests
from tilework.schedule.tree import walk

NAME = "fallback"


def apply(func: TensorFunc) -> TensorFunc:
    for top in top_nests(func):
        func = parallel_rows(func, top)
    innermost = [s.var for _, s in walk(func.body) if isinstance(s, For) and s.kind == "serial" and not _has_loop(s)]
    for v in innermost:
        func = attempt(func, lp.vectorize, v)
    return func


def _has_loop(f: For) -> bool:
    return any(isinstance(s, For) for _, s in walk(f.body))

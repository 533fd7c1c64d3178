"""The schedule primitives, in one place. Each is a pure function ``TensorFunc -> TensorFunc``
that refuses a transformation it cannot prove correct with a ``ScheduleError`` naming the loop
or block and the reason.

Loops are addressed by their var or its name, blocks by name (``loop_names(func, block)``
lists the loops around a block). New loops and blocks get fresh names derived from the old
ones: splitting ``i`` gives ``i_0, i_1``; fusing ``i, j`` gives ``i_j_fused``.

- loops: ``split``, ``fuse``, ``reorder``, ``tile``, ``merge_loops``, ``peel`` (a loop as
  consecutive loops over constant ranges), ``parallel``, ``vectorize``, ``unroll``, ``serial``
  (``loop_primitives``); block loops can be named
  ``"block/loop"`` when loop names repeat across nests;
- blocks: ``compute_inline``, ``reverse_compute_inline``, ``cache_read``
  (``block_primitives``);
- accumulation: ``cache_write``, ``decompose_reduction``, ``rfactor``
  (``reduction_primitives``);
- last steps (loops stop being perfectly nested): ``partition`` (full tiles without bounds
  tests), ``hoist_guards``, and ``branch`` (pick one of two schedules at run time by a
  condition on sym vars; ``select`` one of several; ``specialize``).
"""

from __future__ import annotations

from tilework.schedule.block_primitives import cache_read, compute_inline, reverse_compute_inline
from tilework.schedule.dependence import Dependence, loop_dependence
from tilework.schedule.loop_primitives import (
    fuse,
    hoist_guards,
    merge_loops,
    parallel,
    partition,
    peel,
    reorder,
    serial,
    split,
    tile,
    unroll,
    vectorize,
)
from tilework.schedule.reduction_primitives import cache_write, decompose_reduction, rfactor
from tilework.schedule.specialize import branch, select
from tilework.schedule.tree import loop_names

__all__ = [
    "Dependence", "branch", "cache_read", "cache_write", "compute_inline", "decompose_reduction", "fuse", "loop_dependence",
    "hoist_guards", "loop_names", "merge_loops", "partition", "parallel", "peel", "reorder", "reverse_compute_inline", "rfactor",
    "select", "serial", "split", "tile", "unroll", "vectorize",
]  # fmt: skip

"""The attention rule: a function holding the hand-built attention kernel
(``tilework.op.attention_kernel``, alone or fused with the copies around it) keeps the loop
kinds that kernel was built with (its task loop parallel, row loops vectorized, register-tile
loops unrolled); every other loop nest of the function (a fused reshape of the output, a
prologue that could not be inlined) gets the spatial treatment: outer loops fused and run in
parallel, the innermost vectorized.

The kernel's nest is recognized as a parallel top-level loop holding blocks named with the
kernel's prefix, or two of them in the branches of a top-level test (the kernel's copies for
few rows and for many, ``tilework.op.attention_kernel.NARROW_LANES``).
"""

from __future__ import annotations

from tilework.ir.loop import Block, For, TensorFunc
from tilework.op.attention_kernel import BLOCK_PREFIX
from tilework.schedule.rules.common import out_dtype, spatial_nest, top_nests
from tilework.schedule.tree import leaves, walk

NAME = "attention"


def apply(func: TensorFunc) -> TensorFunc | None:
    tops = top_nests(func)
    kernels = [t for t in top_nests(func, branches=True) if is_attention_nest(t)]
    if not kernels:
        return None
    for top in tops:
        if top in kernels or not all(isinstance(c.leaf, Block) for c in leaves(top)):
            continue
        func = spatial_nest(func, top, out_dtype(func))
    return func


def is_attention_nest(top: For) -> bool:
    """Whether the loop nest ``top`` is the attention kernel's."""
    if top.kind != "parallel":
        return False
    return any(isinstance(s, Block) and s.name.startswith(BLOCK_PREFIX) for _, s in walk(top))

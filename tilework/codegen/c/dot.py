"""Which vectorized loops of ``dot_bf16x2`` (``tilework.ir.loop.DOT_BF16X2``) the C emitter
writes as one ``vdpbf16ps`` a 16 lanes (``tilework.codegen.c.emit``: ``emit_dot_bf16``), and how
their operands are read: the matching, apart from the emitter's text.
"""

from __future__ import annotations

from tilework.ir import sym, sym_walk
from tilework.ir.loop import DOT_BF16X2, DOT_BF16X2_LANES, Block, Buffer, Cast, For, Intrin, Load, Scalar, Store, index_dims, walk_scalars
from tilework.ir.structural import structural_equal
from tilework.ir.sym import Dim, SymExpr


def dot_bf16_loop(s: For) -> tuple[Store, Intrin, str] | None:
    """The store and the ``dot_bf16x2`` of vectorized loop ``s`` when it is one ``vdpbf16ps``
    per 16 lanes, and how ``a0`` and ``a1`` are read (``"rows"``, ``"pairs"``, ``"round"``);
    else None. That is: a static extent that 16 divides, a body (inside blocks without iter
    vars) of one float32 store ``acc[..., i] = dot_bf16x2(acc[..., i], a0, a1, b0, b1)`` whose
    ``acc`` is contiguous in the loop's var ``i`` (in the last index only, with coefficient 1),
    whose ``b0``, ``b1`` do not depend on it, and whose ``a0`` and ``a1`` are two bfloat16 rows
    contiguous in ``i`` (``a0[..., i]``, ``a1[..., i]``: interleaved in registers), pairs side
    by side (elements ``2 i`` and ``2 i + 1`` of one buffer: one load), or two float32 rows
    contiguous in ``i`` cast to bfloat16 (rounded and interleaved in registers:
    ``vcvtne2ps2bf16``, which flushes subnormals to zero)."""
    if not isinstance(s.extent, int) or s.extent % DOT_BF16X2_LANES:
        return None
    body = s.body
    while isinstance(body, Block) and not body.iter_vars and body.init is None:
        body = body.body
    if not isinstance(body, Store) or not isinstance(body.value, Intrin) or body.value.name != DOT_BF16X2:
        return None
    acc, a0, a1, b0, b1 = body.value.args
    v = s.var

    def uses(x: Scalar) -> bool:
        return any(v in sym_walk.free_vars(e) for e in walk_scalars(x) if isinstance(e, SymExpr))

    def contiguous(indices: tuple[Scalar, ...]) -> bool:
        *outer, last = indices
        return isinstance(last, (int, SymExpr)) and not uses(sym.sub(last, v)) and uses(last) and not any(uses(i) for i in outer)

    same = isinstance(acc, Load) and acc.buffer is body.buffer and len(acc.indices) == len(body.indices) and all(x is y or x == y for x, y in zip(acc.indices, body.indices))
    if not same or body.buffer.dtype != "float32" or not contiguous(body.indices):
        return None
    if uses(b0) or uses(b1) or any(isinstance(e, Load) and e.buffer is body.buffer for x in (a0, a1, b0, b1) for e in walk_scalars(x)):
        return None  # b0, b1 are read once before the loop, a0, a1 16 lanes at a time
    rounded = [a.value for a in (a0, a1) if isinstance(a, Cast) and a.dtype == "bfloat16" and isinstance(a.value, Load) and a.value.buffer.dtype == "float32"]
    if len(rounded) == 2 and all(isinstance(a, Load) and contiguous(a.indices) for a in rounded):
        return body, body.value, "round"
    if not all(isinstance(a, Load) and a.buffer.dtype == "bfloat16" for a in (a0, a1)):
        return None
    assert isinstance(a0, Load) and isinstance(a1, Load)
    if all(contiguous(a.indices) for a in (a0, a1)):
        return body, body.value, "rows"
    flat0 = flat_dim(a0.buffer, a0.indices, loads_as_zero=True)
    if not side_by_side(a0, a1) or flat0 is None or any(uses(i) for i in a0.indices if not isinstance(i, (int, SymExpr))):
        return None
    step = sym.sub(sym_walk.substitute(flat0, {v: sym.add(v, 1)}), flat0)
    return (body, body.value, "pairs") if step == 2 else None


def side_by_side(x: Scalar, y: Scalar) -> bool:
    """``x`` and ``y`` are loads of consecutive elements of one buffer (``y`` the next); an
    index computed from a loaded value (a page table's entry) must be the same in both."""
    if not (isinstance(x, Load) and isinstance(y, Load) and x.buffer is y.buffer and len(x.indices) == len(y.indices)):
        return False
    for i, j in zip(x.indices, y.indices):
        if not isinstance(i, (int, SymExpr)) or not isinstance(j, (int, SymExpr)):
            if not structural_equal(i, j):
                return False
    fx, fy = flat_dim(x.buffer, x.indices, loads_as_zero=True), flat_dim(y.buffer, y.indices, loads_as_zero=True)
    return fx is not None and fy is not None and sym.sub(fy, fx) == 1


def flat_dim(b: Buffer, indices: tuple[Scalar, ...], loads_as_zero: bool = False) -> Dim | None:
    """The row-major element offset of ``indices`` in ``b`` as a dim (None if an index is a
    loaded value, unless ``loads_as_zero``: then such an index counts as 0, for offsets
    between elements that share it)."""
    dims = index_dims(tuple(0 if loads_as_zero and not isinstance(i, (int, SymExpr)) else i for i in indices))
    if dims is None or len(dims) != len(b.shape):
        return None
    off: Dim = 0
    for d, ext in zip(dims, b.shape):
        off = sym.add(sym.mul(off, ext), d)
    return off


__all__ = ["dot_bf16_loop", "flat_dim", "side_by_side"]

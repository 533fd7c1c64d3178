"""Which vectorized loops of ``dot_bf16x2`` (``tilework.ir.loop.DOT_BF16X2``) and of
``dot_u8i8x4`` (``DOT_U8I8X4``) the C emitter writes as one ``vdpbf16ps`` or ``vpdpbusd`` a 16
lanes, and how their operands are read (``dot_bf16_loop``, ``dot_u8i8_loop``); and the text of
such a loop (``DotEmitter``, a base of the C emitter ``tilework.codegen.c.emit``): the
instruction's form and the portable copy beside it. Also two bytes side by side made one 16-bit
word (``byte_pair``), which the emitter reads in one load.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Iterator, Sequence

from tilework.codegen.loop_emit import LoopEmitter
from tilework.ir import sym, sym_walk
from tilework.ir.loop import DOT_BF16X2, DOT_BF16X2_LANES, DOT_U8I8X4, DOT_U8I8X4_LANES, Binary, Block, Buffer, Cast, Const, For, Intrin, Load, Scalar, Store, index_dims, walk_scalars
from tilework.ir.structural import structural_equal
from tilework.ir.sym import Dim, SymExpr, SymVar


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
    body = _dot_store(s, DOT_BF16X2, DOT_BF16X2_LANES, "float32")
    if body is None:
        return None
    assert isinstance(body.value, Intrin)
    _, a0, a1, b0, b1 = body.value.args
    v = s.var
    if _uses(b0, v) or _uses(b1, v):
        return None  # b0, b1 are read once before the loop, a0, a1 16 lanes at a time
    rounded = [a.value for a in (a0, a1) if isinstance(a, Cast) and a.dtype == "bfloat16" and isinstance(a.value, Load) and a.value.buffer.dtype == "float32"]
    if len(rounded) == 2 and all(isinstance(a, Load) and _contiguous(a.indices, v) for a in rounded):
        return body, body.value, "round"
    if not all(isinstance(a, Load) and a.buffer.dtype == "bfloat16" for a in (a0, a1)):
        return None
    assert isinstance(a0, Load) and isinstance(a1, Load)
    if all(_contiguous(a.indices, v) for a in (a0, a1)):
        return body, body.value, "rows"
    return (body, body.value, "pairs") if _side_by_side_run((a0, a1), v) else None


def dot_u8i8_loop(s: For) -> tuple[Store, Intrin, str] | None:
    """The store and the ``dot_u8i8x4`` of vectorized loop ``s`` when it is one ``vpdpbusd``
    per 16 lanes, and which operands are the lanes' own (``"u"``: ``u0``..``u3``, or ``"s"``:
    ``s0``..``s3``); else None. That is: a static extent that 16 divides, a body (inside blocks
    without iter vars) of one int32 store ``acc[..., i] = dot_u8i8x4(acc[..., i], u0, .., s3)``
    whose ``acc`` is contiguous in the loop's var ``i`` (as for ``dot_bf16_loop``), whose lanes'
    four operands are four bytes side by side of one buffer (elements ``4 i`` to ``4 i + 3`` of
    it, as flat offsets: one 64-byte load), each a load of the operand's dtype or of the other
    byte dtype's buffer cast to it (``Cast("uint8", Load(int8 buffer))``: the same bits), and
    whose other four operands do not depend on ``i`` (broadcast)."""
    body = _dot_store(s, DOT_U8I8X4, DOT_U8I8X4_LANES, "int32")
    if body is None:
        return None
    assert isinstance(body.value, Intrin)
    us, ss = body.value.args[1:5], body.value.args[5:]
    for form, lanes, dtype, other in (("u", us, "uint8", ss), ("s", ss, "int8", us)):
        loads = _byte_loads(lanes, dtype)
        if loads is not None and not any(_uses(x, s.var) for x in other) and _side_by_side_run(loads, s.var):
            return body, body.value, form
    return None


def _dot_store(s: For, name: str, lanes: int, acc_dtype: str) -> Store | None:
    """The body of loop ``s`` (inside blocks without iter vars) when it is one store
    ``acc[..., i] = name(acc[..., i], ...)`` of ``acc_dtype`` contiguous in the loop's var
    ``i``, the other operands not reading ``acc``, and ``lanes`` divides the static extent (not
    0: the broadcast operands are read before the loop)."""
    if not isinstance(s.extent, int) or s.extent <= 0 or s.extent % lanes:
        return None
    body = s.body
    while isinstance(body, Block) and not body.iter_vars and body.init is None:
        body = body.body
    if not isinstance(body, Store) or not isinstance(body.value, Intrin) or body.value.name != name:
        return None
    acc, *rest = body.value.args
    same = isinstance(acc, Load) and acc.buffer is body.buffer and len(acc.indices) == len(body.indices) and all(x is y or x == y for x, y in zip(acc.indices, body.indices))
    if not same or body.buffer.dtype != acc_dtype or not _contiguous(body.indices, s.var):
        return None
    if any(isinstance(e, Load) and e.buffer is body.buffer for x in rest for e in walk_scalars(x)):
        return None  # the other operands are read before the loop or a vector at a time
    return body


def _uses(x: Scalar, v: SymVar) -> bool:
    return any(v in sym_walk.free_vars(e) for e in walk_scalars(x) if isinstance(e, SymExpr))


def _contiguous(indices: tuple[Scalar, ...], v: SymVar) -> bool:
    """``indices`` advance by one element a step of ``v``, in the last index only."""
    *outer, last = indices
    return isinstance(last, (int, SymExpr)) and not _uses(sym.sub(last, v), v) and _uses(last, v) and not any(_uses(i, v) for i in outer)


def _side_by_side_run(xs: Sequence[Load], v: SymVar) -> bool:
    """Loads ``xs`` are consecutive elements of one buffer (``side_by_side``) and the run
    advances by its length a step of ``v`` (an index computed from a loaded value may not
    depend on ``v``)."""
    flat0 = flat_dim(xs[0].buffer, xs[0].indices, loads_as_zero=True)
    if flat0 is None or not all(side_by_side(x, y) for x, y in zip(xs, xs[1:])):
        return False
    if any(_uses(i, v) for i in xs[0].indices if not isinstance(i, (int, SymExpr))):
        return False
    return sym.sub(sym_walk.substitute(flat0, {v: sym.add(v, 1)}), flat0) == len(xs)


def _byte_load(x: Scalar, dtype: str) -> Load | None:
    """The load of byte operand ``x`` of ``dtype`` (``int8`` or ``uint8``): ``x`` itself, or the
    load of either byte dtype that ``x`` casts (reinterprets: the same bits); else None."""
    if isinstance(x, Cast) and x.dtype == dtype:
        x = x.value
        return x if isinstance(x, Load) and x.buffer.dtype in ("int8", "uint8") else None
    return x if isinstance(x, Load) and x.buffer.dtype == dtype else None


def _byte_loads(xs: Sequence[Scalar], dtype: str) -> list[Load] | None:
    loads = [_byte_load(x, dtype) for x in xs]
    return [x for x in loads if x is not None] if all(x is not None for x in loads) else None


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


def byte_pair(x: Binary) -> Load | None:
    """The load of the low byte where ``x`` is ``int32(uint8(hi)) * 256 + int32(uint8(lo))``
    of two bytes side by side (``side_by_side(lo, hi)``): the 16-bit little-endian word there,
    which the prelude's ``tw_u16_at`` reads in one load. An int8 KV pool's bfloat16 scales are
    such pairs (``tilework.op.paged_attention_base.scale_of``); GCC did not merge the two byte
    loads, and in a vector loop over keys they were gathers (SmolLM2's batch-8 decode attention
    over 512 cached tokens, pool in the L3, 1 thread: 128.8 -> 117.9 us a layer, means of six
    runs' minima)."""
    high = x.a
    if x.op != "+" or not isinstance(high, Binary) or high.op != "*" or not isinstance(high.b, Const) or high.b.dtype != "int32" or high.b.value != 256:
        return None
    hi, lo = (_byte_load(w.value, "uint8") if isinstance(w, Cast) and w.dtype == "int32" else None for w in (high.a, x.b))
    return lo if hi is not None and lo is not None and side_by_side(lo, hi) else None


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


__all__ = ["byte_pair", "dot_bf16_loop", "dot_u8i8_loop", "flat_dim", "side_by_side"]


class DotEmitter(LoopEmitter):
    """The C of a vectorized ``dot_bf16x2`` or ``dot_u8i8x4`` loop (``dot_bf16_loop``,
    ``dot_u8i8_loop``), for the C emitter that derives from it."""

    dot_fallback: bool  # emitting the portable copy of such a loop (set by the emitter)

    @abc.abstractmethod
    def element(self, x: Load | Store) -> str:
        """The C lvalue of the element ``x`` loads or stores."""

    @contextlib.contextmanager
    def dot_loop(self, s: For, step: int | None, head: list[str]) -> Iterator[None]:
        """A braced scope holding the lines ``head`` and then loop ``s`` (``step`` lanes an
        iteration, or one under ``#pragma omp simd``), its body emitted inside the ``with``."""
        self.line("{")
        self.depth += 1
        for text in head:
            self.line(text)
        var = self.bind(s.var, s.var.name)
        if step is None:
            self.line("#pragma omp simd")
        self.line(f"for (int64_t {var} = 0; {var} < {self.dim(s.extent)}; {var} += {step or 1}) {{")
        self.scope.add(s.var)
        self.depth += 1
        yield
        self.depth -= 1
        self.scope.discard(s.var)
        self.line("}")
        self.depth -= 1
        self.line("}")

    def emit_dot(self, s: For) -> bool:
        """Vectorized loop ``s`` (whose iterations write distinct elements) as one ``vdpbf16ps``
        or ``vpdpbusd`` a 16 lanes and its portable copy, if it is such a loop; whether it was."""
        bf16 = dot_bf16_loop(s)
        if bf16 is not None:
            self.emit_dot_bf16(s, *bf16)
            return True
        u8i8 = dot_u8i8_loop(s)
        if u8i8 is not None:
            self.emit_dot_u8i8(s, *u8i8)
            return True
        return False

    def emit_dot_u8i8(self, s: For, store: Store, dot: Intrin, form: str) -> None:
        """Vectorized loop ``s`` of ``acc[i] = dot_u8i8x4(acc[i], u0, .., s3)``: with AVX-512
        VNNI one ``vpdpbusd`` a 16 lanes (the lanes' 64 bytes one load; the other operands'
        four bytes one word broadcast, one 32-bit load where they lie side by side), else the
        portable copy (the loop as it is: ``tw_dot_u8i8x4`` a lane)."""
        us, ss = dot.args[1:5], dot.args[5:]
        lanes, other = (us, ss) if form == "u" else (ss, us)
        first = _byte_load(lanes[0], "uint8" if form == "u" else "int8")
        assert first is not None
        self.line("#if defined(TW_DOT_U8I8)")
        word = self.bind(("dot_bytes", s), "bytes")
        loads = _byte_loads(other, "int8" if form == "u" else "uint8")
        if loads is not None and all(side_by_side(x, y) for x, y in zip(loads, loads[1:])):
            bits = f"tw_u32_at(&{self.element(loads[0])})"  # the C compiler does not merge four loads
        else:
            bits = "(int)(" + " | ".join(f"(uint32_t)(uint8_t)({self.expr(x)})" + (f" << {8 * k}" if k else "") for k, x in enumerate(other)) + ")"
        with self.dot_loop(s, DOT_U8I8X4_LANES, [f"const __m512i {word} = _mm512_set1_epi32({bits});"]):
            acc = f"&{self.element(store)}"
            vec = f"_mm512_loadu_si512(&{self.element(first)})"
            u, s8 = (vec, word) if form == "u" else (word, vec)
            self.line(f"_mm512_storeu_si512({acc}, _mm512_dpbusd_epi32(_mm512_loadu_si512({acc}), {u}, {s8}));")
        self.line("#else")
        self.dot_fallback = True
        self.emit_for(s)
        self.dot_fallback = False
        self.line("#endif")

    def emit_dot_bf16(self, s: For, store: Store, dot: Intrin, form: str) -> None:
        """Vectorized loop ``s`` of ``acc[i] = dot_bf16x2(acc[i], a0, a1, b0, b1)``: with
        AVX-512 BF16 one ``vdpbf16ps`` a 16 lanes (``a0``'s and ``a1``'s lanes as pairs: loaded
        so, or two rows interleaved; ``b0, b1`` broadcast), else the portable copy (pairs side
        by side: ``emit_dot_pairs``; else the loop as it is)."""
        _, a0, a1, b0, b1 = dot.args
        if form == "round":
            assert isinstance(a0, Cast) and isinstance(a1, Cast)
            a0, a1 = a0.value, a1.value
        assert isinstance(a0, Load) and isinstance(a1, Load)
        self.line("#if defined(TW_DOT_BF16)")
        pair = self.bind(("dot_pair", s), "pair")
        if side_by_side(b0, b1):  # one 32-bit load broadcast (the C compiler does not merge two)
            assert isinstance(b0, Load)
            broadcast = f"const __m512i {pair} = _mm512_set1_epi32(tw_u32_at(&{self.element(b0)}));"
        else:
            bits = [self.bf16_bits(x) for x in (b0, b1)]
            broadcast = f"const __m512i {pair} = _mm512_set1_epi32((int)((uint32_t){bits[1]} << 16 | {bits[0]}));"
        with self.dot_loop(s, DOT_BF16X2_LANES, [broadcast]):
            acc = f"&{self.element(store)}"
            a = [f"&{self.element(x)}" for x in (a0, a1)]
            pairs = {"pairs": f"_mm512_loadu_si512({a[0]})", "rows": f"tw_bf16_pairs({a[0]}, {a[1]})", "round": f"tw_f32_pairs({a[0]}, {a[1]})"}[form]
            self.line(f"_mm512_storeu_ps({acc}, _mm512_dpbf16_ps(_mm512_loadu_ps({acc}), (__m512bh){pairs}, (__m512bh){pair}));")
        self.line("#else")
        if form == "pairs":
            self.emit_dot_pairs(s, store, a0, b0, b1)
        else:
            self.dot_fallback = True
            self.emit_for(s)
            self.dot_fallback = False
        self.line("#endif")

    def emit_dot_pairs(self, s: For, store: Store, a0: Load, b0: Scalar, b1: Scalar) -> None:
        """The portable copy of a ``dot_bf16x2`` loop over pairs side by side: each pair read
        as one 32-bit word (``tw_pair_at``), its halves widened by a shift and a mask, ``b0`` and
        ``b1`` once before the loop; the same operations in the same order as ``tw_dot_bf16x2``.
        Without vdpbf16ps (AVX2) the loop as written read each half with a 16-bit load at a
        stride of 2, which the C compiler vectorized with shuffles. SmolLM2's paged attention,
        bfloat16 pool, 512 cached tokens, Zen 3, 2 threads: at batch 8 0.28 -> 0.22 ms a layer
        (``bench/bench_paged_attention.py``), the `q` decode step 18.45 -> 17.0 ms (434 -> 470
        tok/s), at batch 1 6.23 -> 5.70 ms (160 -> 175 tok/s; ``bench/profile_decode.py``, step
        minima, old and new code in alternating processes)."""
        bv = [self.bind(("dot_b", s, i), f"pair_b{i}") for i in range(2)]
        with self.dot_loop(s, None, [f"const float {name} = {self.expr(x)};" for name, x in zip(bv, (b0, b1))]):
            word = self.bind(("dot_word", s), "pair_w")
            acc = self.element(store)
            self.line(f"const uint32_t {word} = tw_pair_at(&{self.element(a0)});")
            self.line(f"{acc} = ({acc} + tw_pair_hi({word}) * {bv[1]}) + tw_pair_lo({word}) * {bv[0]};")

    def bf16_bits(self, x: Scalar) -> str:
        """The bits of bfloat16 value ``x``: a load's element as stored, else its value rounded."""
        if isinstance(x, Load) and x.buffer.dtype == "bfloat16":
            return self.element(x)
        return f"tw_f2bf({self.expr(x)})"

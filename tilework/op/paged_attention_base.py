"""What the two ``paged_attention`` kernels (``tilework.op.paged_attention_decode``,
``tilework.op.paged_attention_prefill``) share: ``PagedKernel`` (the buffers, the pool's
layout in pairs, the loops, the rotation and the append of the new keys and values), the
angles of the rotary embedding (``angles``, also ``paged_rotary``'s loop) and the small
helpers of their loop IR.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from tilework.ir import sym
from tilework.ir.loop import Allocate, Buffer, Cast, For, Intrin, Load, Scalar, Select, Stmt, Store, TensorFunc, binary, const
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.op.kernel import block, free_syms, hand_kernel, named_loop, seq, serial_var

ACC_REGISTERS = 12  # vector registers of accumulators a register tile keeps


def scheduled(buffers: list[Buffer], body: Stmt) -> TensorFunc:
    """A hand-built kernel whose loops carry their kinds (the ``paged_attention`` schedule rule
    keeps them)."""
    func = hand_kernel([*buffers, *free_syms(body, buffers)], body, "opaque")
    return func.replace(attrs=func.attrs.with_(scheduled=True, schedule_rule="paged_attention"))


Body = Callable[[SymVar], Stmt]
F32 = "float32"


def i64(x: Scalar) -> Scalar:
    return Cast("int64", x)


def ld(buf: Buffer, *idx: Scalar) -> Load:
    return Load(buf, tuple(idx))


def widened(x: Load) -> Scalar:
    """A cached key or value as float32 (widened in registers from a 16-bit pool)."""
    return x if x.dtype == F32 else Cast(F32, x)


def pair_index(x: Scalar, w: int) -> tuple[Scalar, Scalar]:
    """Index ``x`` of a pool axis stored in pairs of ``w``: (its pair, its place in the pair)."""
    if w == 1:
        return x, 0
    if isinstance(x, (int, SymExpr)):
        return sym.floordiv(x, w), sym.floormod(x, w)
    return binary("//", x, w), binary("%", x, w)


def fconst(v: float) -> Scalar:
    return const(v, F32)


def as_byte(x: Scalar) -> Scalar:
    """Integer ``x`` in ``[0, 256)`` or ``[-128, 128)`` as the int8 of its low 8 bits (an int8
    pool's byte)."""
    return Cast("int8", Cast("uint8", x))


def unsigned(x: Scalar) -> Scalar:
    """An int8 pool's byte read as the uint8 of the same bits (a key's offset binary)."""
    return Cast("uint8", x)


def scale_bytes(s: Scalar) -> tuple[Scalar, Scalar]:
    """The low and high bytes of the bfloat16 of float32 ``s`` (a non-negative bfloat16 value:
    its bits are the float32's high half), as an int8 pool keeps a scale."""
    top = binary("//", Intrin("bitcast", (s,), "int32"), const(65536, "int32"))
    return as_byte(binary("%", top, const(256, "int32"))), as_byte(binary("//", top, const(256, "int32")))


def scale_of(lo: Scalar, hi: Scalar) -> Scalar:
    """``scale_bytes``' inverse: the float32 of a scale's two bytes."""
    word = binary("+", binary("*", Cast("int32", unsigned(hi)), const(256, "int32")), Cast("int32", unsigned(lo)))
    return Intrin("bitcast", (binary("*", word, const(65536, "int32")),), F32)


def _table(j: Scalar, values: tuple[float, ...], lo: int, hi: int) -> Scalar:
    """``values[j]`` for ``lo <= j < hi`` as a balanced tree of selects (depth ``log2`` of
    their number): a constant table the loop IR can index."""
    if hi - lo == 1:
        return const(float(values[lo]), "float64")
    mid = (lo + hi) // 2
    return Select(binary("<", j, mid), _table(j, values, lo, mid), _table(j, values, mid, hi), "float64")


def angles(trig: Buffer, b: Dim, t: Dim, cached: Scalar, hd: Dim, theta: float, scaling: tuple[Any, ...] | None = None, step_end: Scalar | None = None) -> Stmt:
    """The cosine and sine of token ``t``'s rotary angles (one per pair of channels, at position
    ``cached + t``) into ``trig[b, t]``, in float64: a token's heads share them. One home for
    both kernels that compute them (the attention's scratch and ``paged_rotary``'s table).
    ``hd``: the rotated dims (the head dim, or a partial rotation's fewer): the inverse
    frequencies are ``theta ** (-2 j / hd)``, ``j < hd / 2``.

    ``scaling`` scales the inverse frequencies as transformers' rotary types do:
    ``("linear", factor)`` divides each by ``factor``; ``("llama3", factor, original_context,
    low_freq_factor, high_freq_factor)`` divides those of wavelengths above ``original_context /
    low_freq_factor`` by ``factor``, keeps those below ``original_context / high_freq_factor``
    and blends between (``1 / factor + (1 - 1 / factor) * smooth``, ``smooth`` clamped to [0, 1]
    is transformers' three cases in one expression); ``("yarn", factor, low, high,
    attention_factor)`` multiplies frequency ``j`` by ``1 - ramp * (1 - 1 / factor)``, ``ramp =
    clamp((j - low) / (high - low), 0, 1)``; ``("longrope", original_context,
    attention_factor, short_factors, long_factors)`` divides frequency ``j`` by
    ``long_factors[j]`` where ``step_end`` (one past the step's last position) is above
    ``original_context``, else by ``short_factors[j]``; ``("freq_factors", factors)`` divides
    frequency ``j`` by ``factors[j]`` (llama.cpp's ``rope_freqs``). ``yarn`` and ``longrope``
    multiply the cosines and sines by ``attention_factor``."""
    f64 = "float64"
    step = -2.0 * math.log(theta)
    scale = const(step / hd, f64) if isinstance(hd, int) else binary("/", const(step, f64), Cast(f64, hd))
    kind = None if scaling is None else scaling[0]

    def inv_freq(j: SymVar) -> Scalar:
        inv: Scalar = Intrin("exp", (binary("*", Cast(f64, j), scale),), f64)
        if scaling is None:
            return inv
        if kind == "longrope":
            assert step_end is not None, "longrope needs the step's end"
            short, long = scaling[3], scaling[4]
            factor_j = Select(binary(">", step_end, const(int(scaling[1]), "int64")), _table(j, long, 0, len(long)), _table(j, short, 0, len(short)), f64)
            return binary("/", inv, factor_j)
        if kind == "freq_factors":
            return binary("/", inv, _table(j, scaling[1], 0, len(scaling[1])))
        factor = float(scaling[1])
        if kind == "linear":
            return binary("/", inv, const(factor, f64))
        if kind == "yarn":
            low, high = float(scaling[2]), float(scaling[3])
            ramp = binary("/", binary("-", Cast(f64, j), const(low, f64)), const(high - low, f64))
            clamped = binary("min", binary("max", ramp, const(0.0, f64)), const(1.0, f64))
            return binary("*", inv, binary("-", const(1.0, f64), binary("*", clamped, const(1 - 1 / factor, f64))))
        assert kind == "llama3", scaling
        original, low, high = (float(x) for x in scaling[2:])
        smooth = binary("-", binary("*", inv, const(original / (2 * math.pi) / (high - low), f64)), const(low / (high - low), f64))
        clamped = binary("min", binary("max", smooth, const(0.0, f64)), const(1.0, f64))
        return binary("*", inv, binary("+", const(1 / factor, f64), binary("*", const(1 - 1 / factor, f64), clamped)))

    attention = float(scaling[4] if kind == "yarn" else scaling[2]) if kind in ("yarn", "longrope") and scaling is not None else 1.0

    def scaled(x: Scalar) -> Scalar:
        return x if attention == 1.0 else binary("*", x, const(attention, f64))

    def one(j: SymVar) -> Stmt:
        angle = binary("*", Cast(f64, binary("+", cached, t)), inv_freq(j))
        return block("pa_angle", seq([Store(trig, (b, t, 0, j), scaled(Intrin("cos", (angle,), f64))), Store(trig, (b, t, 1, j), scaled(Intrin("sin", (angle,), f64)))]))

    half = sym.floordiv(hd, 2)
    j = serial_var("angle_j", half)
    return For(j, half, one(j), "serial")



class PagedKernel:
    """What both kernels share: the buffers, naming, loops and the append of the new keys."""

    def __init__(
        self,
        qkv: Buffer,
        nkv: int,
        kc: Buffer,
        vc: Buffer,
        kv_len: Buffer,
        pt: Buffer,
        out: Buffer,
        layer: SymVar,
        scale: float | None,
        theta: float | None,
        vector_bytes: int,
        rotary: Buffer | None = None,
        window: int | None = None,
        softcap: float | None = None,
        rope_dim: int | None = None,
    ) -> None:
        self.window = window  # a sliding window: the keys a query at p sees are (p - window, p]
        self.softcap = softcap  # scores soft-capped to softcap * tanh(score / softcap) (Gemma 2)
        self.qkv, self.kc, self.vc, self.kv_len, self.pt, self.out = qkv, kc, vc, kv_len, pt, out
        self.lanes = max(1, vector_bytes // 4)  # float32 lanes of a vector register (sizes the tiles)
        self.layer = layer
        self.nb, self.sq, self.nh, self.hd = out.shape
        self.nkv = nkv
        self.theta = theta
        # the rotated dims of a head, its first ones (partial rotation: fewer than the head dim,
        # the rest passed as they are); a whole head's rotation is the same kernel as without one
        self.partial = rope_dim is not None and not (isinstance(self.hd, int) and rope_dim == self.hd)
        self.rope: Dim = rope_dim if rope_dim is not None and self.partial else self.hd
        self.page = kc.shape[4]
        w = kc.shape[5]  # the pool's pair width (``pair_width``)
        assert isinstance(w, int), "a pool's pair width is static"
        self.w = w
        # from a bfloat16 pool (in pairs) the products are bfloat16: one vdpbf16ps a vector
        self.dot = self.kc.dtype == "bfloat16" and self.w == 2
        # an int8 pool: bytes in quads and a bfloat16 scale a key and a value (``quantized``)
        self.int8 = self.kc.dtype == "int8"
        self.width = pt.shape[1]
        self.group = sym.floordiv(self.nh, self.nkv)
        if scale is not None:
            self.scale: Scalar = fconst(float(scale))
        elif isinstance(self.hd, int):
            self.scale = fconst(1.0 / math.sqrt(self.hd))
        else:
            self.scale = Intrin("rsqrt", (Cast(F32, self.hd),), F32)
        self.names: set[str] = set()
        # the angles' cosines and sines [b, s, 2, rope / 2]: given (paged_rotary's), or computed
        # into a scratch as each token's key is appended
        self.given = rotary is not None
        self.trig = rotary if rotary is not None else Buffer("pa_trig", (self.nb, self.sq, 2, sym.floordiv(self.rope, 2)), "float64")

    def capped(self, score: Scalar) -> Scalar:
        """A (scaled) score soft-capped, ``c * tanh(score / c)`` with ``softcap`` ``c`` (as it is
        without one)."""
        if self.softcap is None:
            return score
        c = float(self.softcap)
        return binary("*", fconst(c), Intrin("tanh", (binary("/", score, fconst(c)),), F32))

    def loop(self, name: str, extent: Dim, body: Body, kind: str = "serial") -> For:
        return named_loop(self.names, name, extent, body, kind)

    def key(self, page: Scalar, kh: Dim, d: Dim, j: Scalar) -> Load:
        """Key ``j`` of pool page ``page``, kv head ``kh``, dim ``d`` (in the pool's pairs: see
        ``tilework.op.paged_attention``)."""
        d_pair, d_in = pair_index(d, self.w)
        return ld(self.kc, self.layer, page, kh, d_pair, j, d_in)

    def value(self, page: Scalar, j: Scalar, kh: Dim, e: Dim) -> Load:
        """Dim ``e`` of the value of key ``j`` of pool page ``page``, kv head ``kh``."""
        j_pair, j_in = pair_index(j, self.w)
        return ld(self.vc, self.layer, page, j_pair, kh, e, j_in)

    def scale_byte(self, page: Scalar, kh: Dim, j: Scalar, i: int) -> Load:
        """Byte ``i`` of key ``j``'s scales (an int8 pool: the row after kv head ``kh``'s dims
        holds a key's scale and its value's, the bytes of two bfloat16 side by side)."""
        return ld(self.kc, self.layer, page, kh, sym.floordiv(self.hd, self.w), j, i)

    def key_scale(self, page: Scalar, kh: Dim, j: Scalar) -> Scalar:
        """The scale of key ``j`` of pool page ``page``, kv head ``kh`` (an int8 pool)."""
        return scale_of(self.scale_byte(page, kh, j, 0), self.scale_byte(page, kh, j, 1))

    def value_scale(self, page: Scalar, j: Scalar, kh: Dim) -> Scalar:
        """The scale of the value of key ``j`` of pool page ``page``, kv head ``kh``."""
        return scale_of(self.scale_byte(page, kh, j, 2), self.scale_byte(page, kh, j, 3))

    def cached(self, b: Dim) -> Scalar:
        return i64(ld(self.kv_len, b))

    def q_at(self, b: Dim, t: Dim, h: Dim, d: Dim) -> Scalar:
        """Query head ``h`` of token ``t``, dim ``d``, rotated."""
        return self._rotated(b, t, h, d)

    def v_at(self, b: Dim, t: Dim, kh: Dim, d: Dim) -> Scalar:
        return ld(self.qkv, b, t, sym.add(sym.add(self.nh, self.nkv), kh), d)

    def rotated_dims(self, name: str, b: Dim, t: Dim, h: Dim, put: Callable[[Dim, Scalar], Stmt]) -> Stmt:
        """``put(d, value)`` for every dim ``d`` of head ``h`` of token ``t``, the value turned
        as ``_rotated`` turns it (term for term: the same bits): with ``rope_theta`` as one loop
        over the pairs ``j, j + rope / 2``, whose loads are contiguous in each half (the per-dim
        form reads its partner and angle through selects, which GCC vectorized as gathers), then
        (partial rotation) one over the dims from ``rope`` on, as they are."""
        if self.theta is None:
            return self.loop(name, self.hd, lambda d: put(d, ld(self.qkv, b, t, h, d)), "vectorized")
        half = sym.floordiv(self.rope, 2)
        f64 = "float64"

        def pair(j: SymVar) -> Stmt:
            lo, hi = Cast(f64, ld(self.qkv, b, t, h, j)), Cast(f64, ld(self.qkv, b, t, h, sym.add(j, half)))
            cos, sin = ld(self.trig, b, t, 0, j), ld(self.trig, b, t, 1, j)

            def turned(mine: Scalar, signed: Scalar) -> Scalar:
                return Cast(F32, binary("+", binary("*", mine, cos), binary("*", signed, sin)))

            return seq([put(j, turned(lo, binary("-", const(0.0, f64), hi))), put(sym.add(j, half), turned(hi, lo))])

        pairs = self.loop(name, half, pair, "vectorized")
        if not self.partial:
            return pairs

        def passed(e: SymVar) -> Stmt:
            d = sym.add(e, self.rope)
            return put(d, ld(self.qkv, b, t, h, d))

        return seq([pairs, self.loop(f"{name}_pass", sym.sub(self.hd, self.rope), passed, "vectorized")])

    def _rotated(self, b: Dim, t: Dim, h: Dim, d: Dim) -> Scalar:
        """``qkv[b, t, h, d]`` turned by the rotary angle of its position (``rotary_embedding``'s
        arithmetic: float64, rounded once; the cosine and sine from ``self.trig``, given or filled
        by ``append``; a dim from ``rope`` on, of a partial rotation, as it is); as it is without
        ``rope_theta``."""
        if self.theta is None:
            return ld(self.qkv, b, t, h, d)
        half = sym.floordiv(self.rope, 2)
        f64 = "float64"
        lower = binary("<", d, half)
        # the dim's angle; past the rotated dims any in-bounds one (its product is not used)
        j = sym.floormod(d, half) if self.partial else Select(lower, d, sym.sub(d, half), "int64")
        partner = Select(lower, sym.add(d, half), sym.sub(d, half), "int64")  # one in-bounds load
        mine = Cast(f64, ld(self.qkv, b, t, h, d))
        other = Cast(f64, ld(self.qkv, b, t, h, partner))
        signed = Select(lower, binary("-", const(0.0, f64), other), other, f64)
        turned = Cast(F32, binary("+", binary("*", mine, ld(self.trig, b, t, 0, j)), binary("*", signed, ld(self.trig, b, t, 1, j))))
        return Select(binary("<", d, self.rope), turned, ld(self.qkv, b, t, h, d), F32) if self.partial else turned

    def with_trig(self, body: Stmt) -> Stmt:
        """``body`` with the angle table allocated around it (when the op rotates and the table
        is not given)."""
        return body if self.theta is None or self.given else Allocate(self.trig, body)

    def append(self, queries: Callable[[Dim, Dim], Stmt] | None = None) -> Stmt:
        """Every new token's key and value into its page slot (and ``queries(b, t)`` after
        them, where given: the token's angles are at hand)."""

        def token(bt: SymVar) -> Stmt:
            b, t = sym.floordiv(bt, self.sq), sym.floormod(bt, self.sq)
            pos = binary("+", self.cached(b), t)
            # the token's pool page and slot, looked up once: in the element loops that write
            # there, the index read the page table and divided per element (a store of an int8
            # pool's byte may alias the table for the C compiler). With the scales read as
            # 16-bit words (codegen.c.dot.byte_pair), SmolLM2's decode attention over 512
            # cached tokens of an int8 pool, a C harness around the generated kernel, 30
            # layers in turn (pool from memory), 2 threads: batch 8 91.8 -> 85.3 us a layer,
            # batch 1 13.9 -> 11.4 (means of six runs' minima)
            slot = Buffer("paged_slot", (2,), "int64")
            page, off = ld(slot, 0), ld(slot, 1)
            where = [Store(slot, (0,), i64(ld(self.pt, b, binary("//", pos, self.page)))), Store(slot, (1,), binary("%", pos, self.page))]

            def put(kh: SymVar) -> Stmt:
                def key(d: Dim, value: Scalar) -> Stmt:
                    return block("paged_append", Store(self.kc, self.key(page, kh, d, off).indices, value))

                def value(d: SymVar) -> Stmt:
                    return block("paged_append_v", Store(self.vc, self.value(page, off, kh, d).indices, self.v_at(b, t, kh, d)))

                if self.int8:
                    return self.append_quantized(page, off, b, t, kh)
                return seq([self.rotated_dims("append_d", b, t, sym.add(self.nh, kh), key), self.loop("append_v", self.hd, value, "vectorized")])

            steps = [Allocate(slot, seq([*where, self.loop("append_h", self.nkv, put)]))] + ([] if queries is None else [queries(b, t)])
            if self.theta is None or self.given:
                return seq(steps)
            return seq([angles(self.trig, b, t, self.cached(b), self.rope, self.theta), *steps])

        return self.loop("append_bt", sym.mul(self.nb, self.sq), token, "parallel")

    def quantize(self, name: str, extent: Dim, fill: Callable[[Buffer], Stmt], scale: Callable[[Scalar], Stmt], put: Callable[[Dim, Scalar], Stmt], offset: int = 0) -> Stmt:
        """``extent`` values, written into a float32 scratch by ``fill``, quantized to int8 (the
        largest magnitude to 127): ``scale(s)`` with their scale ``s`` (a bfloat16's value:
        ``scale_bytes``), then ``put(i, byte)`` for each, the byte the int8 of ``round(x / s)``
        plus ``offset`` (128: the keys' offset binary), as the int8 of the same bits."""
        x = Buffer(f"{name}_x", (extent,), F32)
        top = Buffer(f"{name}_max", (1,), F32)
        step = Buffer(f"{name}_s", (1,), F32)
        inv = Select(binary(">", ld(step, 0), fconst(0.0)), binary("/", fconst(1.0), ld(step, 0)), fconst(0.0), F32)

        def byte(i: SymVar) -> Stmt:
            q = binary("min", binary("max", Intrin("round", (binary("*", ld(x, i), inv),), F32), fconst(-127.0)), fconst(127.0))
            return block(name, put(i, as_byte(binary("+", Cast("int32", q), offset))))

        body = seq([
            fill(x),
            self.fold(f"{name}_m", lambda i: Intrin("abs", (ld(x, i),), F32), extent, "max", top),
            Store(step, (0,), Cast(F32, Cast("bfloat16", binary("/", ld(top, 0), fconst(127.0))))),
            scale(ld(step, 0)),
            self.loop(f"{name}_q", extent, byte, "vectorized"),
        ])
        for buf in (step, top, x):
            body = Allocate(buf, body)
        return body

    def fold(self, name: str, value: Callable[[Dim], Scalar], n: Dim, op: str, out: Buffer) -> Stmt:
        """``out[0]``: ``op`` (``"max"`` or ``"+"``, float32) over ``value(i)`` for ``i <
        n``: halves folded onto each other in vector loops where ``n`` is a power of two (a chain
        of ``n`` dependent steps, one at a time, took most of a quantization), else one at a
        time."""
        if not isinstance(n, int) or n & (n - 1) or n < 2:
            return seq([Store(out, (0,), value(0)), self.loop(f"{name}_i", sym.sub(n, 1), lambda i: Store(out, (0,), binary(op, ld(out, 0), value(sym.add(i, 1)))))])
        half = Buffer(f"{name}_half", (n // 2,), F32)
        steps = [self.loop(f"{name}_f", n // 2, lambda i: block(name, Store(half, (i,), binary(op, value(i), value(sym.add(i, n // 2))))), "vectorized")]

        def folded(w: int) -> Body:
            return lambda i: block(name, Store(half, (i,), binary(op, ld(half, i), ld(half, sym.add(i, w)))))

        steps += [self.loop(f"{name}_f", 1 << k, folded(1 << k), "vectorized") for k in range(n.bit_length() - 3, -1, -1)]
        return Allocate(half, seq([*steps, Store(out, (0,), ld(half, 0))]))

    def append_quantized(self, page: Scalar, off: Scalar, b: Dim, t: Dim, kh: SymVar) -> Stmt:
        """Token ``t``'s key (turned) and value of kv head ``kh`` into an int8 pool's slot
        ``off`` of ``page``: quantized, their scales beside them."""

        def scale(first: int) -> Callable[[Scalar], Stmt]:
            def put(s: Scalar) -> Stmt:
                return seq([Store(self.kc, self.scale_byte(page, kh, off, first + i).indices, byte) for i, byte in enumerate(scale_bytes(s))])

            return put

        def turned(x: Buffer) -> Stmt:
            return self.rotated_dims("append_d", b, t, sym.add(self.nh, kh), lambda d, value: block("paged_append", Store(x, (d,), value)))

        def values(x: Buffer) -> Stmt:
            return self.loop("append_v", self.hd, lambda d: block("paged_append_v", Store(x, (d,), self.v_at(b, t, kh, d))), "vectorized")

        return seq([
            self.quantize("paged_kq", self.hd, turned, scale(0), lambda d, byte: Store(self.kc, self.key(page, kh, d, off).indices, byte), offset=128),
            self.quantize("paged_vq", self.hd, values, scale(2), lambda d, byte: Store(self.vc, self.value(page, off, kh, d).indices, byte)),
        ])


__all__ = ["PagedKernel", "ACC_REGISTERS", "F32", "Body", "angles", "as_byte", "fconst", "i64", "ld", "pair_index", "scale_bytes", "scale_of", "scheduled", "unsigned", "widened"]

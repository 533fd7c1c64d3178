"""The prefill kernel of ``paged_attention`` (several new tokens a sequence; see
``tilework.op.paged_attention_kernel``): tasks over (sequence, kv head, block of ``LANES``
query rows, rows being tokens times the heads of the group), the rows as lanes, keys a page at a time, skipping pages no row
of the block sees. A page's scores are summed in register tiles of a few keys x the rows, its
values added in register tiles of a few head dims x the rows (``tile_rows``: within
``ACC_REGISTERS`` vectors; the accumulators rescaled as a tile loads them). From a bfloat16
pool the products are bfloat16 (``dot_bf16x2``: one ``vdpbf16ps`` a vector of rows where the
CPU has AVX-512 BF16, float32 sums): a key's pairs of dims and two keys' values of a dim
are read where the pool keeps them side by side, the rows' queries stored rounded as pairs,
the probabilities rounded as they are read; SmolLM2's 30 layers of prefill attention at 512
tokens, q, 2 threads: 100 -> 68 ms. From an int8 pool a first parallel loop makes the pages of
the sequences (those that hold a token) bfloat16 pairs, each byte times its scale, into a
scratch in that layout, and the tasks read it as from a bfloat16 pool (dequantized in each
task instead, a page once for every block of rows that sees it, 8 prompts of 512 tokens took
about twice as long as from a bfloat16 pool, 4.5-4.8 s against 2.3-2.5; this way 2.40-2.46 s
against 2.26-2.32).
"""

from __future__ import annotations

import math

from tilework.ir import sym
from tilework.ir.loop import DOT_BF16X2, DOT_BF16X2_LANES, Allocate, Buffer, Cast, IfThenElse, Intrin, Load, Select, Stmt, Store, binary, const
from tilework.ir.sym import Dim, SymVar
from tilework.op.kernel import block, seq
from tilework.op.paged_attention_base import ACC_REGISTERS, F32, Body, PagedKernel, fconst, i64, ld, unsigned, widened

LANES = 16  # float32 lanes of an AVX-512 register: the rows of a prefill task


class Prefill(PagedKernel):
    """Several new tokens per sequence; see the module docstring."""

    def body(self) -> Stmt:
        self.rows = sym.mul(self.sq, self.group)
        self.blocks = sym.floordiv(sym.add(self.rows, LANES - 1), LANES)
        tasks = sym.mul(sym.mul(self.nb, self.nkv), self.blocks)
        # a bfloat16 pool: the products in bfloat16 (dot_bf16x2), its pairs read where they lie;
        # an int8 pool: each page's keys and values made bfloat16 pairs first, then the same
        self.dot = (self.dot or self.int8) and LANES % DOT_BF16X2_LANES == 0
        if not self.int8:
            return self.with_trig(seq([self.append(), self.loop("task", tasks, self.task, "parallel")]))
        # an int8 pool: the sequences' pages made bfloat16 pairs once, before the tasks that read
        # them (each page by every block of rows that sees it)
        HD, P = self.hd, self.page
        self.kp = Buffer("pp_kp", (self.nb, self.width, self.nkv, sym.floordiv(HD, 2), P, 2), "bfloat16")
        self.vp = Buffer("pp_vp", (self.nb, self.width, self.nkv, sym.floordiv(P, 2), HD, 2), "bfloat16")
        pages = sym.mul(sym.mul(self.nb, self.width), self.nkv)
        body = seq([self.append(), self.loop("dq", pages, self.dequantized, "parallel"), self.loop("task", tasks, self.task, "parallel")])
        return self.with_trig(Allocate(self.kp, Allocate(self.vp, body)))

    def dequantized(self, v: SymVar) -> Stmt:
        """Page ``pi`` of sequence ``b``'s table, kv head ``kh`` (``v`` is ``(b * width + pi) *
        kv_heads + kh``), of an int8 pool into ``kp`` and ``vp`` if it holds a token: each byte
        times its key's or value's scale, rounded to bfloat16."""
        kh, bp = sym.floormod(v, self.nkv), sym.floordiv(v, self.nkv)
        b, pi = sym.floordiv(bp, self.width), sym.floormod(bp, self.width)
        P, HD = self.page, self.hd
        page = Buffer("pp_dq_page", (1,), "int64")
        ksc, vsc = Buffer("pp_ksc", (P,), F32), Buffer("pp_vsc", (P,), F32)

        def scales(j: SymVar) -> Stmt:
            at = ld(page, 0)
            return block("pp_scales", seq([Store(ksc, (j,), self.key_scale(at, kh, j)), Store(vsc, (j,), self.value_scale(at, j, kh))]))

        def key(d: SymVar) -> Stmt:
            def one(j: SymVar) -> Stmt:
                byte = binary("-", Cast("int32", unsigned(self.key(ld(page, 0), kh, d, j))), const(128, "int32"))
                return block("pp_kdq", Store(self.kp, (b, pi, kh, sym.floordiv(d, 2), j, sym.floormod(d, 2)), Cast("bfloat16", binary("*", Cast(F32, byte), ld(ksc, j)))))

            return self.loop("kdq_j", P, one, "vectorized")

        def value(j: SymVar) -> Stmt:
            def one(e: SymVar) -> Stmt:
                byte = Cast(F32, self.value(ld(page, 0), j, kh, e))
                return block("pp_vdq", Store(self.vp, (b, pi, kh, sym.floordiv(j, 2), e, sym.floormod(j, 2)), Cast("bfloat16", binary("*", byte, ld(vsc, j)))))

            return self.loop("vdq_e", HD, one, "vectorized")

        holds = binary("<", sym.mul(pi, P), binary("+", self.cached(b), self.sq))
        body = seq([
            Store(page, (0,), i64(ld(self.pt, b, pi))),
            self.loop("sc_j", P, scales, "vectorized"),
            self.loop("kdq_d", HD, key),
            self.loop("vdq_j", P, value),
        ])
        return IfThenElse(holds, Allocate(page, Allocate(ksc, Allocate(vsc, body))))

    def task(self, tv: SymVar) -> Stmt:
        per_seq = sym.mul(self.nkv, self.blocks)
        b = sym.floordiv(tv, per_seq)
        kh = sym.floormod(sym.floordiv(tv, self.blocks), self.nkv)
        row0 = sym.mul(sym.floormod(tv, self.blocks), LANES)
        G, HD, P, R = self.group, self.hd, self.page, LANES
        cached = self.cached(b)
        qt = Buffer("pp_qt", (HD // 2, R, 2), "bfloat16") if self.dot else Buffer("pp_qt", (HD, R), F32)  # with dot: each row's pairs side by side
        st = Buffer("pp_s", (P, R), F32)
        m = Buffer("pp_m", (R,), F32)
        l = Buffer("pp_l", (R,), F32)
        mx = Buffer("pp_mx", (R,), F32)
        alpha = Buffer("pp_alpha", (R,), F32)
        acc = Buffer("pp_acc", (HD, R), F32)
        JT, ET = self.tile_rows(P), self.tile_rows(HD)  # keys, dims of a register tile
        t = Buffer("pp_t", (JT, R), F32)  # scores of JT keys x the rows
        a = Buffer("pp_a", (ET, R), F32)  # ET dims of the rows' accumulators

        def lane(r: Dim) -> tuple[Dim, Dim]:
            """Token and head of row ``r`` (rows past the last repeat it)."""
            t = sym.min_(sym.add(row0, r), sym.sub(self.rows, 1))
            return sym.floordiv(t, G), sym.add(sym.mul(kh, G), sym.floormod(t, G))

        def rows(name: str, body: Body) -> Stmt:
            return self.loop(f"{name}_r", R, lambda r: block("pp_" + name, body(r)), "vectorized")

        def fill(d: SymVar) -> Stmt:
            def one(r: SymVar) -> Stmt:
                t, h = lane(r)
                at = (sym.floordiv(d, 2), r, sym.floormod(d, 2)) if self.dot else (d, r)
                return Store(qt, at, binary("*", self.q_at(b, t, h, d), self.scale))

            return rows("q", one)

        last_t, _ = lane(R - 1)
        horizon = binary("+", cached, sym.add(last_t, 1))  # keys any row of the block sees
        first_t, _ = lane(0)
        # with a sliding window the block's first row sees keys from this position on (a page
        # that ends at or before it is skipped: every row's scores there are -inf)
        window_start = None if self.window is None else binary("-", binary("+", cached, sym.add(first_t, 1)), self.window)

        at = Buffer("pp_page", (1,), "int64")  # the page's pool index, looked up once a page

        def page_step(pi: SymVar) -> Stmt:
            first = sym.mul(pi, P)
            page = ld(at, 0)

            def key_at(d: Dim, j: Dim) -> Load:
                """Dim ``d`` of key ``j`` of the page (of an int8 pool: its bfloat16 copy)."""
                return ld(self.kp, b, pi, kh, sym.floordiv(d, 2), j, sym.floormod(d, 2)) if self.int8 else self.key(page, kh, d, j)

            def value_at(j: Dim, e: Dim) -> Load:
                return ld(self.vp, b, pi, kh, sym.floordiv(j, 2), e, sym.floormod(j, 2)) if self.int8 else self.value(page, j, kh, e)

            def scores(jt: SymVar) -> Stmt:
                """Keys ``jt * JT ..`` of the page against every row: a register tile of JT keys x
                the rows, summed over the head dim (independent chains), then stored."""

                def dim(d: SymVar) -> Stmt:
                    def key(j: SymVar) -> Stmt:
                        kv = widened(key_at(d, sym.add(sym.mul(jt, JT), j)))
                        return rows("score", lambda r: Store(t, (j, r), binary("+", ld(t, j, r), binary("*", kv, ld(qt, d, r)))))

                    return self.loop("qk_j", JT, key, "unrolled")

                def pair(i: SymVar) -> Stmt:
                    """Dims ``2 i``, ``2 i + 1``: one ``dot_bf16x2`` a key and vector of rows."""

                    def key(j: SymVar) -> Stmt:
                        slot = sym.add(sym.mul(jt, JT), j)  # the key's place in its page
                        ks = (key_at(sym.mul(i, 2), slot), key_at(sym.add(sym.mul(i, 2), 1), slot))
                        return rows("score", lambda r: Store(t, (j, r), Intrin(DOT_BF16X2, (ld(t, j, r), ld(qt, i, r, 0), ld(qt, i, r, 1), *ks), F32)))

                    return self.loop("qk_j", JT, key, "unrolled")

                return seq([
                    self.loop("t0_j", JT, lambda j: rows("t0", lambda r: Store(t, (j, r), fconst(0.0))), "unrolled"),
                    self.loop("qk_i", HD // 2, pair) if self.dot else self.loop("qk_d", HD, dim),
                    self.loop("t1_j", JT, lambda j: rows("t1", lambda r: Store(st, (sym.add(sym.mul(jt, JT), j), r), ld(t, j, r))), "unrolled"),
                ])

            def masked(j: SymVar) -> Stmt:
                def one(r: SymVar) -> Stmt:
                    t, _ = lane(r)
                    seen = binary("<=", sym.add(first, j), binary("+", cached, t))
                    if self.window is not None:  # and inside the row's window: key > position - window
                        seen = binary("and", seen, binary(">", sym.add(sym.add(first, j), self.window), binary("+", cached, t)))
                    return Store(st, (j, r), Select(seen, self.capped(ld(st, j, r)), fconst(-math.inf), F32))

                return rows("mask", one)

            def prob_rows(j: SymVar) -> Stmt:
                def one(r: SymVar) -> Stmt:
                    unseen = binary("==", ld(m, r), fconst(-math.inf))
                    p = Intrin("exp", (binary("-", ld(st, j, r), ld(m, r)),), F32)
                    return Store(st, (j, r), Select(unseen, fconst(0.0), p, F32))

                return rows("p", one)

            def values(et: SymVar) -> Stmt:
                """Dims ``et * ET ..`` of every row's accumulator: rescaled as they are loaded into
                a register tile, the page's values added (independent chains), stored back."""

                def col(e: Dim) -> Dim:
                    return sym.add(sym.mul(et, ET), e)

                def key(j: SymVar) -> Stmt:
                    def dim(e: SymVar) -> Stmt:
                        vv = widened(value_at(j, col(e)))
                        return rows("pv", lambda r: Store(a, (e, r), binary("+", ld(a, e, r), binary("*", ld(st, j, r), vv))))

                    return self.loop("pv_e", ET, dim, "unrolled")

                def key_pair(u: SymVar) -> Stmt:
                    """Keys ``2 u``, ``2 u + 1``: one ``dot_bf16x2`` a dim and vector of rows (the
                    probabilities rounded to bfloat16 as they are read)."""

                    def dim(e: SymVar) -> Stmt:
                        vs = (value_at(sym.mul(u, 2), col(e)), value_at(sym.add(sym.mul(u, 2), 1), col(e)))

                        def one(r: SymVar) -> Stmt:
                            ps = (Cast("bfloat16", ld(st, sym.add(sym.mul(u, 2), c), r)) for c in (0, 1))
                            return Store(a, (e, r), Intrin(DOT_BF16X2, (ld(a, e, r), *ps, *vs), F32))

                        return rows("pv", one)

                    return self.loop("pv_e", ET, dim, "unrolled")

                return seq([
                    self.loop("a0_e", ET, lambda e: rows("a0", lambda r: Store(a, (e, r), binary("*", ld(acc, col(e), r), ld(alpha, r)))), "unrolled"),
                    self.loop("pv_u", P // 2, key_pair) if self.dot else self.loop("pv_j", P, key),
                    self.loop("a1_e", ET, lambda e: rows("a1", lambda r: Store(acc, (col(e), r), ld(a, e, r))), "unrolled"),
                ])

            def alpha_of(r: SymVar) -> Stmt:
                unseen = binary("==", ld(mx, r), fconst(-math.inf))
                shrink = Intrin("exp", (binary("-", ld(m, r), ld(mx, r)),), F32)
                return Store(alpha, (r,), Select(unseen, fconst(1.0), shrink, F32))

            steps = [
                self.loop("qk_jt", sym.floordiv(P, JT), scores),
                self.loop("mask_j", P, masked),
                rows("mx0", lambda r: Store(mx, (r,), ld(m, r))),
                self.loop("max_j", P, lambda j: rows("max", lambda r: Store(mx, (r,), binary("max", ld(mx, r), ld(st, j, r))))),
                rows("alpha", alpha_of),
                rows("l_scale", lambda r: Store(l, (r,), binary("*", ld(l, r), ld(alpha, r)))),
                rows("m_set", lambda r: Store(m, (r,), ld(mx, r))),
                self.loop("p_j", P, prob_rows),
                self.loop("l_j", P, lambda j: rows("l_sum", lambda r: Store(l, (r,), binary("+", ld(l, r), ld(st, j, r))))),
                self.loop("pv_et", sym.floordiv(HD, ET), values),
            ]
            visible = binary("<", first, horizon)
            if window_start is not None:
                visible = binary("and", visible, binary(">", sym.add(first, P), window_start))
            return IfThenElse(visible, seq([Store(at, (0,), i64(ld(self.pt, b, pi))), *steps]))

        def store_row(r: SymVar) -> Stmt:
            t, h = lane(r)
            valid = binary("<", sym.add(row0, r), self.rows)
            total = ld(l, r)
            inv = Select(binary(">", total, fconst(0.0)), binary("/", fconst(1.0), total), fconst(0.0), F32)
            put = self.loop("out_e", HD, lambda e: block("pp_out", Store(self.out, (b, t, h, e), binary("*", ld(acc, e, r), inv))), "vectorized")
            return IfThenElse(valid, put)

        body: Stmt = seq([
            self.loop("qt_d", HD, fill),
            rows("m0", lambda r: Store(m, (r,), fconst(-math.inf))),
            rows("l0", lambda r: Store(l, (r,), fconst(0.0))),
            self.loop("acc0_e", HD, lambda e: rows("acc0", lambda r: Store(acc, (e, r), fconst(0.0)))),
            self.loop("page", self.width, page_step),
            self.loop("out_r", R, store_row),
        ])
        for buf in (at, a, t, acc, alpha, mx, l, m, st, qt):
            body = Allocate(buf, body)
        return body

    def tile_rows(self, extent: Dim) -> int:
        """Rows of a register tile over ``LANES`` lanes (keys or head dims; each row
        ``LANES * 4`` bytes of vectors): as many as keep ``ACC_REGISTERS`` vectors and divide
        ``extent`` (1 where the extent is symbolic)."""
        per_row = -(-LANES // self.lanes)
        if not isinstance(extent, int):
            return 1
        rows = max(1, min(8, ACC_REGISTERS // per_row))
        while extent % rows:
            rows -= 1
        return rows


__all__ = ["Prefill", "LANES"]

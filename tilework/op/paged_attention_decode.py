"""The decode kernel of ``paged_attention`` (``s`` is 1; see ``tilework.op.paged_attention_kernel``):
tasks over (sequence, split). A task reads whole pages, every kv head of each (a page's keys, and its values, are one contiguous block: scattered 2 KB pieces
of it, one kv head's, read at about half the bandwidth). A sequence's pages are split across
tasks while a step has fewer than ``TASKS`` of them (small batches; at least
``MIN_SPLIT_PAGES`` pages a split, at most ``MAX_SPLITS`` splits), and a final loop merges the
splits' partial maxima, sums and accumulators. A task takes its pages ``CHUNK_PAGES`` at a
time: the chunk's scores (a register tile of the group's heads x a page's keys per kv head,
summed over the head dim in ``PARTIALS`` independent chains: one vector loop over the
``PARTIALS`` dims' keys, contiguous in the page, each lane multiplied by its dim's query,
where a loop per dim of a page's 16 keys left gcc with 16-bit loads of half a register and
twice the instructions: the 30 layers of a batch-8 step at 512 cached tokens, bf16 pool,
4.8-5.0 ms where they took 5.0-5.1, within this machine's noise; SmolLM2 q decode at batch 1
and 512 cached tokens 278-300 tok/s where it ran 246-248, in alternating processes), then one
online-softmax update per head over the whole chunk
(lane-wise maxima and sums, across the lanes once), then the values added into register
tiles of ``ACC_REGISTERS`` accumulator vectors (columns of a group's accumulators, rescaled
as they are loaded). Each step of a page's scores hints a cache line of the next page (keys
and values), so the page's lines are on their way before it is read; and each step of the
value pass hints lines of the page at the same place in the next task (``NEXT_TASK_HINTS``:
the task the thread runs next: the generated loop runs each thread's share of tasks front to
back, ``tw_shares_take``; under chunks taken as threads came free, a fourth of these hints
missed at batch 8, 5% of the kernel's time), so that
memory keeps reading while the task computes from its cache, not only while it scores
(measured at batch 8 and 512 cached tokens with the pool out of cache: 1.05-1.12x, under the
static schedule of the time). The hints are ``prefetch_l2``
(into L2): a chunk's pages and the next task's are more than L1 holds, and sent to L1 they
evicted the lines the loops were reading (the 30 layers' attention of a batch-8 step at 512
cached tokens, bf16 pool, Zen 4, 2 threads: 6.0-6.2 -> 4.7-4.8 ms; batch 1 0.68-0.70 ->
0.66-0.68). A sequence's queries are turned and scaled once, beside its new key, for all
its splits. From a bfloat16 pool (stored in pairs: ``tilework.op.paged_attention``) the
products are bfloat16 (``dot_bf16x2``: one ``vdpbf16ps`` a vector, float32 sums): a page's
scores a pair of dims at a time in ``DOT_PARTIALS`` chains, its values a pair of keys at a
time, the pool's pairs loaded as they lie, the queries rounded to bfloat16 once and the
probabilities as they are stored (with the pool in the L3, a batch-8 step at 512 cached
tokens, 3 layers: 0.29 -> 0.25 ms; from memory, 30 layers, barely faster: medians 4.8-5.4 ->
4.7-4.9 ms, where the memory's reads hardly overlap the arithmetic).

From an int8 pool (``tilework.op.paged_attention``) the products are of bytes (``dot_u8i8x4``:
one ``vpdpbusd`` a vector of 16 keys, or of 16 dims of the values): a sequence's queries are
quantized to int8 once a head (``qs`` their scale, ``qsum`` 128 times their bytes' sum, which
takes the keys' offset back); a page's keys are scored a quad of dims at a time, the sums made
scores by the scales (the page's key scales, and its value scales for the value pass, read
once a page and kv head); a page's probabilities times its values' scales are quantized to
uint8 a head (the largest to 255; ``fold`` finds it), four keys' bytes one ``dot_u8i8x4`` a
vector of dims, the int32 sums added into the accumulators times the head's scale. Each
quantization's largest magnitude and sum fold halves in vector loops (a chain of 64 dependent
steps was most of a step's appends). SmolLM2 q, batch 8 and 512 cached tokens, native code,
2 threads (step minima, alternating processes): 7.6-7.8 ms against 8.6-8.9 from a bfloat16
pool; batch 1 3.1-3.2 against 3.3-3.6 ms.
"""

from __future__ import annotations

import math
from typing import Callable

from tilework.ir import sym
from tilework.ir.dtype import DTYPE_TABLE
from tilework.ir.loop import DOT_BF16X2, DOT_U8I8X4, Allocate, Buffer, Cast, IfThenElse, Intrin, Scalar, Select, Stmt, Store, binary, const
from tilework.ir.sym import Dim, SymVar
from tilework.op.kernel import block, seq
from tilework.op.paged_attention_base import ACC_REGISTERS, F32, PagedKernel, fconst, i64, ld, unsigned, widened

MAX_SPLITS = 16  # most tasks one sequence's pages are split into
MIN_SPLIT_PAGES = 4  # a split covers at least this many pages
TASKS = 32  # splits are added while a step has fewer tasks than this (threads to feed)
CHUNK_PAGES = 16  # pages whose scores a task holds at once (one softmax update each)
PARTIALS = 2  # partial sums of a key's score (independent chains) where they fit
DOT_PARTIALS = 4  # the same with dot_bf16x2 (a longer latency: more chains)
MAX_TILE_HEADS = 6  # a group of more heads than this is not unrolled into registers
LINE_BYTES = 64  # a cache line: the stride of the prefetch hints
NEXT_TASK_HINTS = True  # the value pass hints the pages of the thread's next task


class Decode(PagedKernel):
    """One new token per sequence; see the module docstring."""

    def body(self) -> Stmt:
        # splits of a sequence's pages: enough tasks for the threads at small batches, never
        # fewer than MIN_SPLIT_PAGES pages a split
        wanted = sym.floordiv(sym.add(TASKS, sym.sub(self.nb, 1)), self.nb)
        self.splits = sym.max_(1, sym.min_(sym.min_(MAX_SPLITS, sym.floordiv(self.width, MIN_SPLIT_PAGES)), wanted))
        self.per_split = sym.floordiv(sym.add(self.width, sym.sub(self.splits, 1)), self.splits)
        tasks = sym.mul(self.nb, self.splits)
        self.pm = Buffer("pa_pm", (tasks, self.nh), F32)
        self.pl = Buffer("pa_pl", (tasks, self.nh), F32)
        self.pacc = Buffer("pa_pacc", (tasks, self.nh, self.hd), F32)
        self.dot = self.dot and isinstance(self.group, int)
        # queries turned and scaled, once a sequence (rounded to bfloat16 for the pair products;
        # from an int8 pool quantized, a head's scale and its bytes' sum beside them)
        self.qr = Buffer("pa_qr", (self.nb, self.nh, self.hd), "bfloat16" if self.dot else "int8" if self.int8 else F32)
        self.qs = Buffer("pa_qs", (self.nb, self.nh), F32)
        self.qsum = Buffer("pa_qsum", (self.nb, self.nh), F32)  # exact: below 2 ** 24
        steps = [
            self.append(self.queries),
            self.loop("task", tasks, self.task, "parallel"),
            self.loop("merge", sym.mul(self.nb, self.nkv), self.merge, "parallel"),
        ]
        body: Stmt = self.with_trig(seq(steps))
        for buf in (self.qr, self.pacc, self.pl, self.pm, *((self.qs, self.qsum) if self.int8 else ())):
            body = Allocate(buf, body)
        return body

    def queries(self, b: Dim, t: Dim) -> Stmt:
        """Sequence ``b``'s query heads turned and scaled into ``qr`` (the splits of a sequence
        all read them)."""

        def head(h: SymVar) -> Stmt:
            if self.int8:
                return self.quantized_query(b, t, h)
            return self.rotated_dims("q_d", b, t, h, lambda d, value: block("pa_q", Store(self.qr, (b, h, d), binary("*", value, self.scale))))

        return self.loop("q_h", self.nh, head)

    def quantized_query(self, b: Dim, t: Dim, h: SymVar) -> Stmt:
        """Query head ``h`` turned, scaled and quantized to int8 (its scale into ``qs``, and
        ``128`` times the sum of its bytes into ``qsum``: the keys' offset taken back)."""

        def turned(x: Buffer) -> Stmt:
            return self.rotated_dims("q_d", b, t, h, lambda d, value: block("pa_q", Store(x, (d,), binary("*", value, self.scale))))

        total = Buffer("pa_qtotal", (1,), F32)  # the bytes' sum, in float32: exact (below 2 ** 24)
        return seq([
            self.quantize("pa_qq", self.hd, turned, lambda scale: Store(self.qs, (b, h), scale), lambda d, byte: Store(self.qr, (b, h, d), byte)),
            Allocate(total, seq([self.fold("pa_qsum", lambda d: Cast(F32, ld(self.qr, b, h, d)), self.hd, "+", total), Store(self.qsum, (b, h), binary("*", ld(total, 0), fconst(128.0)))])),
        ])

    def acc_columns(self) -> Dim:
        """Columns of a kv head's accumulators added in registers at once: as many vectors as
        keep the group's heads within ``ACC_REGISTERS`` and divide the head dim (the whole
        head dim where no vector count does)."""
        if isinstance(self.hd, int) and isinstance(self.group, int):
            for vectors in range(max(1, ACC_REGISTERS // self.group), 0, -1):
                if self.hd % (self.lanes * vectors) == 0:
                    return self.lanes * vectors
        return self.hd

    def partials(self) -> int:
        """Partial scores a key's sum over the head dim is split into (``PARTIALS`` independent
        chains of multiply-adds where their register tiles fit ``ACC_REGISTERS``, else one)."""
        hd, group, page = self.hd, self.group, self.page
        if not (isinstance(hd, int) and isinstance(group, int) and isinstance(page, int)):
            return 1
        tile = group * -(-page // self.lanes)
        chains = DOT_PARTIALS if self.dot or self.int8 else PARTIALS
        for c in range(chains, 1, -1):
            if hd % (self.dims_a_partial() * c) == 0 and c * tile <= ACC_REGISTERS:
                return c
        return 1

    def dims_a_partial(self) -> int:
        """Dims a partial score takes a step: a pair with dot_bf16x2, a quad with dot_u8i8x4."""
        return 2 if self.dot else 4 if self.int8 else 1

    def page_lines(self) -> int | None:
        """Cache lines of a page's keys (as many again of its values); None if not static."""
        dims = [x for x in self.kc.shape[2:] if isinstance(x, int)]
        if len(dims) < len(self.kc.shape[2:]):
            return None
        return -(-math.prod(dims) * DTYPE_TABLE[self.kc.dtype].itemsize // LINE_BYTES)

    def hint(self, page: Scalar, line: Dim, name: str) -> Stmt:
        """A prefetch of cache line ``line`` of ``page``'s keys and the same of its values (a
        page's keys, and its values, are one contiguous block: the line is addressed by its
        flat offset along the last axis)."""
        per_line = max(1, LINE_BYTES // DTYPE_TABLE[self.kc.dtype].itemsize)
        hint = Buffer(name, (1,), F32)
        stores = [Store(hint, (0,), Intrin("prefetch_l2", (ld(c, self.layer, page, 0, 0, 0, sym.mul(line, per_line)),), F32)) for c in (self.kc, self.vc)]
        return Allocate(hint, block(name, seq(stores)))

    def task(self, tv: SymVar) -> Stmt:
        b = sym.floordiv(tv, self.splits)
        sp = sym.floormod(tv, self.splits)
        total = binary("+", self.cached(b), 1)
        # a sliding window: the query (at total - 1) sees keys from `start` on; a chunk or page
        # that ends at or before it is neither scored nor read (-inf scores, no values)
        start = None if self.window is None else binary("-", total, self.window)

        def ends_after_start(end: Dim, cond: Scalar) -> Scalar:
            """``cond``, and (with a window) keys before position ``end`` reach the window."""
            return cond if start is None else binary("and", cond, binary(">", end, start))

        NH, NKV, G, HD, P, CH = self.nh, self.nkv, self.group, self.hd, self.page, CHUNK_PAGES
        EC = self.acc_columns()
        tile = "unrolled" if isinstance(G, int) and G <= MAX_TILE_HEADS else "serial"
        sc = Buffer("pa_sc", (NH, CH * P), F32)  # the chunk's scores, then its probabilities
        # with dot_bf16x2 the probabilities are rounded to bfloat16 here (their sum too is theirs)
        prob = Buffer("pa_pb", (NH, CH * P), "bfloat16") if self.dot else sc
        C = self.partials()
        s = Buffer("pa_s", (G, sym.mul(C, P)), "int32" if self.int8 else F32)  # one page's partial scores of a kv head's group: a register tile
        ksc = Buffer("pa_ksc", (P,), F32)  # an int8 pool: the page's keys' scales
        raw = Buffer("pa_raw", (P,), F32)  # and a head's scores of the page
        lane = Buffer("pa_lane", (P,), F32)  # lane-wise maxima, then sums
        mx = Buffer("pa_mx", (1,), F32)
        m = Buffer("pa_m", (NH,), F32)
        l = Buffer("pa_l", (NH,), F32)
        alpha = Buffer("pa_alpha", (NH,), F32)
        acc = Buffer("pa_acc", (NH, HD), F32)
        a = Buffer("pa_a", (G, EC), F32)  # columns of a group's accumulators: a register tile
        # an int8 pool's value pass: the chunk's values' scales, a head's probabilities times them,
        # their maximum, the heads' scales of their bytes, the bytes, and the sums of the bytes'
        # products (a register tile)
        vsc, pw, top = Buffer("pa_vsc", (NKV, CH * P), F32), Buffer("pa_pw", (P,), F32), Buffer("pa_top", (1,), F32)
        pstep, pq, ai = Buffer("pa_pstep", (G,), F32), Buffer("pa_pq", (G, P), "uint8"), Buffer("pa_ai", (G, EC), "int32")
        nxt = Buffer("pa_next", (1,), "int64")
        split0 = sym.mul(sp, self.per_split)
        lines = self.page_lines()
        tasks = sym.mul(self.nb, self.splits)
        nt = sym.min_(sym.add(tv, 1), sym.sub(tasks, 1))  # the task this thread runs next (within its share: tw_shares_take)
        nb_ = sym.floordiv(nt, self.splits)
        nsplit0 = sym.mul(sym.floormod(nt, self.splits), self.per_split)
        ntotal = binary("+", self.cached(nb_), 1)
        tnext = Buffer("pa_tnext", (1,), "int64")
        KS = sym.floordiv(P, 2) if self.dot else P  # a page's key steps: pairs of keys with dot_bf16x2
        vsteps = sym.mul(sym.mul(sym.floordiv(HD, EC), NKV), KS)  # a page's value steps
        per_vstep = -(-lines // vsteps) if NEXT_TASK_HINTS and lines is not None and isinstance(vsteps, int) else 0

        def next_task_page(ci: Dim, pc: Dim, page: Scalar) -> Scalar:
            """The pool page of the next task's page ``pc`` of chunk ``ci`` (``page`` where
            that task has none there, or there is no next task)."""
            npidx = sym.add(sym.add(nsplit0, sym.mul(ci, CH)), pc)
            nvalid = binary("and", binary("<", sym.add(tv, 1), tasks), binary("and", binary("<", npidx, self.width), binary("<", sym.mul(npidx, P), ntotal)))
            return Select(nvalid, i64(ld(self.pt, nb_, sym.min_(npidx, sym.sub(self.width, 1)))), page, "int64")
        D = self.dims_a_partial() * C  # dims a scoring step takes: C pairs with dot_bf16x2, C quads with dot_u8i8x4, else C
        steps = sym.mul(NKV, sym.floordiv(HD, D))  # a page's scoring steps: static where lines is
        per_step = -(-lines // steps) if lines is not None and isinstance(steps, int) else 0  # hints a step

        def seen(pidx: Dim) -> Scalar:
            """Page ``pidx`` of the table holds a token of the sequence."""
            return binary("and", binary("<", pidx, self.width), binary("<", sym.mul(pidx, P), total))

        def init(h: SymVar) -> Stmt:
            return seq([
                Store(m, (h,), fconst(-math.inf)),
                Store(l, (h,), fconst(0.0)),
                self.loop("acc0_e", HD, lambda e: block("pa_acc0", Store(acc, (h, e), fconst(0.0))), "vectorized"),
            ])

        def chunk(ci: SymVar) -> Stmt:
            p0 = sym.add(split0, sym.mul(ci, CH))
            # the chunk's pages (those past the table's width hold no token: -inf scores, never read)
            count = sym.min_(CH, sym.sub(self.per_split, sym.mul(ci, CH)))

            def table_page(pc: Dim) -> tuple[Dim, Scalar]:
                """Page ``pc`` of the chunk: its index in the sequence's table, its pool page."""
                pidx = sym.add(p0, pc)
                return pidx, i64(ld(self.pt, b, pidx))

            def head_of(kh: Dim, g: Dim) -> Dim:
                return sym.add(sym.mul(kh, G), g)

            def scores(pc: SymVar) -> Stmt:
                """Page ``p0 + pc``'s scores into ``sc`` (-inf past the last token)."""
                pidx, page = table_page(pc)
                first = sym.mul(pidx, P)

                ahead = ld(nxt, 0)  # the next page's pool index, looked up once a page

                def group(kh: SymVar) -> Stmt:
                    def dims(dd: SymVar) -> Stmt:
                        """Dims ``dd * D .. dd * D + D - 1`` of the group's keys into the ``C``
                        partial scores (``D`` is ``C``, or ``2 C``: a pair of dims a partial with
                        dot_bf16x2), and lines of the next page hinted: the page's
                        ``NKV * HD / D`` steps spread its lines (the page itself again when it is
                        the last)."""
                        step = sym.add(sym.mul(kh, sym.floordiv(HD, D)), dd)
                        hinted = [self.hint(ahead, sym.min_(sym.add(sym.mul(step, per_step), r), (lines or 1) - 1), "pa_hint") for r in range(per_step)]

                        d0 = sym.mul(dd, D)

                        def pairs(g: SymVar) -> Stmt:
                            """The ``C`` pairs of dims from ``d0`` into the ``C`` partial scores,
                            one ``dot_bf16x2`` a key (a page's rows of two dims are its pairs)."""
                            h = sym.add(sym.mul(kh, G), g)

                            def partial(c: SymVar) -> Stmt:
                                d = sym.add(d0, sym.mul(c, 2))

                                def lane(j: SymVar) -> Stmt:
                                    at = (g, sym.add(sym.mul(c, P), j))
                                    keys = (self.key(page, kh, d, j), self.key(page, kh, sym.add(d, 1), j))
                                    dot = Intrin(DOT_BF16X2, (ld(s, *at), *keys, ld(self.qr, b, h, d), ld(self.qr, b, h, sym.add(d, 1))), F32)
                                    return block("pa_score", Store(s, at, dot))

                                return self.loop("s_j", P, lane, "vectorized")

                            return self.loop("s_c", C, partial, "unrolled")

                        def quads(g: SymVar) -> Stmt:
                            """The ``C`` quads of dims from ``d0`` into the ``C`` partial scores,
                            one ``dot_u8i8x4`` a key (a page's rows of four dims are its quads;
                            the keys' bytes are offset binary)."""
                            h = sym.add(sym.mul(kh, G), g)

                            def partial(c: SymVar) -> Stmt:
                                d = sym.add(d0, sym.mul(c, 4))

                                def lane(j: SymVar) -> Stmt:
                                    at = (g, sym.add(sym.mul(c, P), j))
                                    keys = tuple(unsigned(self.key(page, kh, sym.add(d, i), j)) for i in range(4))
                                    queries = tuple(ld(self.qr, b, h, sym.add(d, i)) for i in range(4))
                                    return block("pa_score", Store(s, at, Intrin(DOT_U8I8X4, (ld(s, *at), *keys, *queries), "int32")))

                                return self.loop("s_j", P, lane, "vectorized")

                            return self.loop("s_c", C, partial, "unrolled")

                        def one(g: SymVar) -> Stmt:
                            h = sym.add(sym.mul(kh, G), g)
                            qs = Buffer("pa_qs", (C,), F32)  # the C dims' queries: a select in the loop reads them safely

                            def lane(j: SymVar) -> Stmt:
                                # lane j of the C * P: dim d0 + j // P, key j % P (a page's keys
                                # are contiguous per dim: one loop over C dims' keys)
                                q: Scalar = ld(qs, C - 1)
                                for c in range(C - 2, -1, -1):
                                    q = Select(binary("<", j, (c + 1) * P), ld(qs, c), q, F32)
                                key = self.key(page, kh, sym.add(d0, sym.floordiv(j, P)), sym.floormod(j, P))
                                return block("pa_score", Store(s, (g, j), binary("+", ld(s, g, j), binary("*", q, widened(key)))))

                            put_q = [Store(qs, (c,), ld(self.qr, b, h, sym.add(d0, c))) for c in range(C)]
                            return Allocate(qs, seq([*put_q, self.loop("s_j", sym.mul(C, P), lane, "vectorized")]))

                        return seq([*hinted, self.loop("s_g", G, pairs if self.dot else quads if self.int8 else one, tile)])

                    def put(g: SymVar) -> Stmt:
                        def one(j: SymVar) -> Stmt:
                            seen_j = binary("<", sym.add(first, j), total)
                            if start is not None:
                                seen_j = binary("and", seen_j, binary(">=", sym.add(first, j), start))
                            score: Scalar = ld(raw, j) if self.int8 else partials(j)
                            return block("pa_mask", Store(sc, (sym.add(sym.mul(kh, G), g), sym.add(sym.mul(pc, P), j)), Select(seen_j, self.capped(score), fconst(-math.inf), F32)))

                        def partials(j: Dim) -> Scalar:
                            score: Scalar = ld(s, g, j)
                            for c in range(1, C):
                                score = binary("+", score, ld(s, g, sym.add(j, c * P)))
                            return score

                        lanes = self.loop("put_j", P, one, "vectorized")
                        if not self.int8:
                            return lanes
                        # the sum of the bytes' products, less the keys' offset, scaled: first, and
                        # for every key (GCC leaves a loop scalar that converts an int under a select)
                        h = sym.add(sym.mul(kh, G), g)

                        def exact(j: SymVar) -> Stmt:
                            return block("pa_raw", Store(raw, (j,), binary("*", binary("*", binary("-", Cast(F32, partials(j)), ld(self.qsum, b, h)), ld(self.qs, b, h)), ld(ksc, j))))

                        return seq([self.loop("raw_j", P, exact, "vectorized"), lanes])

                    def key_scales(j: SymVar) -> Stmt:
                        """Key ``j``'s scale, and its value's for the value pass."""
                        at = (kh, sym.add(sym.mul(pc, P), j))
                        return block("pa_ksc", seq([Store(ksc, (j,), self.key_scale(page, kh, j)), Store(vsc, at, self.value_scale(page, j, kh))]))

                    naught = const(0, "int32") if self.int8 else fconst(0.0)
                    zero = self.loop("s0_g", G, lambda g: self.loop("s0_j", sym.mul(C, P), lambda j: block("pa_s0", Store(s, (g, j), naught)), "vectorized"), tile)
                    scales = [self.loop("ksc_j", P, key_scales, "vectorized")] if self.int8 else []
                    return seq([zero, self.loop("s_dd", sym.floordiv(HD, D), dims), *scales, self.loop("put_g", G, put, tile)])

                def unseen(h: SymVar) -> Stmt:
                    return self.loop("inf_j", P, lambda j: block("pa_unseen", Store(sc, (h, sym.add(sym.mul(pc, P), j)), fconst(-math.inf))), "vectorized")

                computed = seq([
                    Store(nxt, (0,), i64(ld(self.pt, b, Select(seen(sym.add(pidx, 1)), sym.add(pidx, 1), pidx, "int64")))),
                    self.loop("s_kh", NKV, group),
                ])
                return IfThenElse(ends_after_start(sym.add(first, P), binary("<", first, total)), computed, self.loop("inf_h", NH, unseen))

            def softmax(h: SymVar) -> Stmt:
                """Head ``h``'s running maximum, its accumulators' rescale factor, the chunk's
                probabilities and their sum; lane-wise first, across the lanes once."""

                def pages(name: str, body: Callable[[Dim], Stmt]) -> Stmt:
                    return self.loop(f"{name}_pc", count, lambda pc: self.loop(f"{name}_j", P, lambda j: block("pa_" + name, body(sym.add(sym.mul(pc, P), j))), "vectorized"))

                def lanes(name: str, value: float) -> Stmt:
                    return self.loop(f"{name}_j", P, lambda j: block("pa_" + name, Store(lane, (j,), fconst(value))), "vectorized")

                return seq([
                    lanes("max0", -math.inf),
                    pages("max", lambda i: Store(lane, (sym.floormod(i, P),), binary("max", ld(lane, sym.floormod(i, P)), ld(sc, h, i)))),
                    Store(mx, (0,), ld(m, h)),
                    self.loop("mx_j", P, lambda j: Store(mx, (0,), binary("max", ld(mx, 0), ld(lane, j)))),
                    Store(alpha, (h,), Intrin("exp", (binary("-", ld(m, h), ld(mx, 0)),), F32)),
                    Store(m, (h,), ld(mx, 0)),
                    pages("exp", lambda i: Store(prob, (h, i), Intrin("exp", (binary("-", ld(sc, h, i), ld(mx, 0)),), F32))),
                    lanes("sum0", 0.0),
                    pages("sum", lambda i: Store(lane, (sym.floormod(i, P),), binary("+", ld(lane, sym.floormod(i, P)), widened(ld(prob, h, i))))),
                    Store(l, (h,), binary("*", ld(l, h), ld(alpha, h))),
                    self.loop("l_j", P, lambda j: Store(l, (h,), binary("+", ld(l, h), ld(lane, j)))),
                ])

            def values(kc: SymVar) -> Stmt:
                """Columns ``[c * EC, c * EC + EC)`` of kv head ``kh``'s group's accumulators
                (``kc`` is ``c * NKV + kh``): rescaled, then the chunk's values added in registers."""
                kh, col = sym.floormod(kc, NKV), sym.mul(sym.floordiv(kc, NKV), EC)

                def head(g: Dim) -> Dim:
                    return head_of(kh, g)

                def page_values(pc: SymVar) -> Stmt:
                    pidx, page = table_page(pc)

                    def key(j: SymVar) -> Stmt:
                        """Key ``j`` of the page (with dot_bf16x2 keys ``2j`` and ``2j + 1``)."""

                        def one(g: SymVar) -> Stmt:
                            p = ld(sc, head(g), sym.add(sym.mul(pc, P), j))
                            return self.loop("pv_e", EC, lambda e: block("pa_pv", Store(a, (g, e), binary("+", ld(a, g, e), binary("*", p, widened(self.value(page, j, kh, sym.add(col, e))))))), "vectorized")

                        def pair(g: SymVar) -> Stmt:
                            at = sym.add(sym.mul(pc, P), sym.mul(j, 2))
                            probs = (ld(prob, head(g), at), ld(prob, head(g), sym.add(at, 1)))

                            def lane(e: SymVar) -> Stmt:
                                vals = (self.value(page, sym.mul(j, 2), kh, sym.add(col, e)), self.value(page, sym.add(sym.mul(j, 2), 1), kh, sym.add(col, e)))
                                return block("pa_pv", Store(a, (g, e), Intrin(DOT_BF16X2, (ld(a, g, e), *vals, *probs), F32)))

                            return self.loop("pv_e", EC, lane, "vectorized")

                        vstep = sym.add(sym.mul(kc, KS), j)
                        hinted = [self.hint(ld(tnext, 0), sym.min_(sym.add(sym.mul(vstep, per_vstep), r), (lines or 1) - 1), "pa_thint") for r in range(per_vstep)]
                        return seq([*hinted, self.loop("pv_g", G, pair if self.dot else one, tile)])

                    body: Stmt = self.loop("pv_j", KS, key)
                    if per_vstep:
                        body = seq([Store(tnext, (0,), next_task_page(ci, pc, page)), body])
                    return IfThenElse(ends_after_start(sym.mul(sym.add(pidx, 1), P), binary("<", sym.mul(pidx, P), total)), body)

                return seq([
                    self.loop("a0_g", G, lambda g: self.loop("a0_e", EC, lambda e: block("pa_a0", Store(a, (g, e), binary("*", ld(acc, head(g), sym.add(col, e)), ld(alpha, head(g))))), "vectorized"), tile),
                    self.loop("pv_pc", count, page_values),
                    self.loop("a1_g", G, lambda g: self.loop("a1_e", EC, lambda e: block("pa_a1", Store(acc, (head(g), sym.add(col, e)), ld(a, g, e))), "vectorized"), tile),
                ])

            # (with a window, a chunk scored has a key in it: its softmax update never sees only -inf)
            def quantized_values(kh: SymVar) -> Stmt:
                """Kv head ``kh``'s group's accumulators (already rescaled) plus the chunk's
                values of an int8 pool: a page at a time, the probabilities times the values'
                scales quantized to uint8 (the largest to 255, a head's scale of them each), then
                one ``dot_u8i8x4`` a four keys' values of a register tile of dims."""

                def head(g: Dim) -> Dim:
                    return head_of(kh, g)

                def page_values(pc: SymVar) -> Stmt:
                    pidx, page = table_page(pc)

                    def quantized(g: SymVar) -> Stmt:
                        h = head(g)
                        inv = Select(binary(">", ld(top, 0), fconst(0.0)), binary("/", fconst(255.0), ld(top, 0)), fconst(0.0), F32)

                        def weight(j: SymVar) -> Stmt:
                            at = sym.add(sym.mul(pc, P), j)
                            return block("pa_pw", Store(pw, (j,), binary("*", ld(sc, h, at), ld(vsc, kh, at))))

                        def byte(j: SymVar) -> Stmt:
                            return block("pa_pq", Store(pq, (g, j), Cast("uint8", Cast("int32", Intrin("round", (binary("*", ld(pw, j), inv),), F32)))))

                        return seq([
                            self.loop("pw_j", P, weight, "vectorized"),
                            self.fold("pa_top", lambda j: ld(pw, j), P, "max", top),
                            Store(pstep, (g,), binary("/", ld(top, 0), fconst(255.0))),
                            self.loop("pq_j", P, byte, "vectorized"),
                        ])

                    def columns(ec: SymVar) -> Stmt:
                        col = sym.mul(ec, EC)

                        def quad(u: SymVar) -> Stmt:
                            def one(g: SymVar) -> Stmt:
                                probs = tuple(ld(pq, g, sym.add(sym.mul(u, 4), i)) for i in range(4))

                                def lane(e: SymVar) -> Stmt:
                                    vals = tuple(self.value(page, sym.add(sym.mul(u, 4), i), kh, sym.add(col, e)) for i in range(4))
                                    return block("pa_pv", Store(ai, (g, e), Intrin(DOT_U8I8X4, (ld(ai, g, e), *probs, *vals), "int32")))

                                return self.loop("pv_e", EC, lane, "vectorized")

                            return self.loop("pv_g", G, one, tile)

                        def add(g: SymVar) -> Stmt:
                            def lane(e: SymVar) -> Stmt:
                                at = (head(g), sym.add(col, e))
                                return block("pa_a1", Store(acc, at, binary("+", ld(acc, *at), binary("*", ld(pstep, g), Cast(F32, ld(ai, g, e))))))

                            return self.loop("pa1_e", EC, lane, "vectorized")

                        return seq([
                            self.loop("ai0_g", G, lambda g: self.loop("ai0_e", EC, lambda e: block("pa_ai0", Store(ai, (g, e), const(0, "int32"))), "vectorized"), tile),
                            self.loop("pv_u", sym.floordiv(P, 4), quad),
                            self.loop("pa1_g", G, add, tile),
                        ])

                    return IfThenElse(ends_after_start(sym.mul(sym.add(pidx, 1), P), binary("<", sym.mul(pidx, P), total)), seq([
                        self.loop("pq_g", G, quantized),
                        self.loop("pv_ec", sym.floordiv(HD, EC), columns),
                    ]))

                return self.loop("pv_pc", count, page_values)

            def rescaled(h: SymVar) -> Stmt:
                return self.loop("ra_e", HD, lambda e: block("pa_ra", Store(acc, (h, e), binary("*", ld(acc, h, e), ld(alpha, h)))), "vectorized")

            value_steps = [self.loop("ra_h", NH, rescaled), self.loop("pv_kh", NKV, quantized_values)] if self.int8 else [self.loop("pv_kc", sym.mul(sym.floordiv(HD, EC), NKV), values)]
            return IfThenElse(ends_after_start(sym.mul(sym.add(p0, count), P), binary("<", sym.mul(p0, P), total)), seq([
                self.loop("sc_pc", count, scores),
                self.loop("sm_h", NH, softmax),
                *value_steps,
            ]))

        def save(h: SymVar) -> Stmt:
            return seq([
                Store(self.pm, (tv, h), ld(m, h)),
                Store(self.pl, (tv, h), ld(l, h)),
                self.loop("save_e", HD, lambda e: block("pa_save", Store(self.pacc, (tv, h, e), ld(acc, h, e))), "vectorized"),
            ])

        chunks = sym.floordiv(sym.add(self.per_split, CH - 1), CH)
        first_page = [] if lines is None else [IfThenElse(seen(split0), self.loop("pf_line", lines, lambda ln: self.hint(i64(ld(self.pt, b, split0)), ln, "pa_hint0"), "unrolled"))]
        body: Stmt = seq([
            *first_page,
            self.loop("init", NH, init),
            self.loop("chunk", chunks, chunk),
            self.loop("save", NH, save),
        ])
        int8_bufs = [ksc, raw, vsc, pw, top, pstep, pq, ai] if self.int8 else []
        for buf in (tnext, nxt, a, acc, alpha, l, m, mx, lane, s, sc, *([prob] if self.dot else []), *int8_bufs):
            body = Allocate(buf, body)
        return body

    def merge(self, bk: SymVar) -> Stmt:
        b, kh = sym.floordiv(bk, self.nkv), sym.floormod(bk, self.nkv)
        G, HD = self.group, self.hd
        mm = Buffer("pa_mm", (1,), F32)
        ll = Buffer("pa_ll", (1,), F32)
        w = Buffer("pa_w", (MAX_SPLITS,), F32)
        o = Buffer("pa_o", (HD,), F32)

        def task_of(sp: Dim) -> Dim:
            return sym.add(sym.mul(b, self.splits), sp)

        def for_head(g: SymVar) -> Stmt:
            h = sym.add(sym.mul(kh, G), g)

            def weight(sp: SymVar) -> Stmt:
                pm = ld(self.pm, task_of(sp), h)
                wt = Select(binary("==", pm, fconst(-math.inf)), fconst(0.0), Intrin("exp", (binary("-", pm, ld(mm, 0)),), F32), F32)
                return seq([Store(w, (sp,), wt), Store(ll, (0,), binary("+", ld(ll, 0), binary("*", wt, ld(self.pl, task_of(sp), h))))])

            def add(sp: SymVar) -> Stmt:
                return self.loop("mo_e", HD, lambda e: block("pa_merge", Store(o, (e,), binary("+", ld(o, e), binary("*", ld(w, sp), ld(self.pacc, task_of(sp), h, e))))), "vectorized")

            inv = Select(binary(">", ld(ll, 0), fconst(0.0)), binary("/", fconst(1.0), ld(ll, 0)), fconst(0.0), F32)
            return seq([
                Store(mm, (0,), fconst(-math.inf)),
                self.loop("mm_sp", self.splits, lambda sp: Store(mm, (0,), binary("max", ld(mm, 0), ld(self.pm, task_of(sp), h)))),
                Store(ll, (0,), fconst(0.0)),
                self.loop("w_sp", self.splits, weight),
                self.loop("o0_e", HD, lambda e: block("pa_o0", Store(o, (e,), fconst(0.0))), "vectorized"),
                self.loop("o_sp", self.splits, add),
                self.loop("out_e", HD, lambda e: block("pa_out", Store(self.out, (b, 0, h, e), binary("*", ld(o, e), inv))), "vectorized"),
            ])

        body: Stmt = self.loop("mg", G, for_head)
        for buf in (o, w, ll, mm):
            body = Allocate(buf, body)
        return body


__all__ = ["Decode", "CHUNK_PAGES", "MAX_SPLITS", "MIN_SPLIT_PAGES"]

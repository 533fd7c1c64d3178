"""The kernels of ``tilework.op.paged_attention`` (see its docstring for the op): hand-built
TensorFuncs that read the pages.

Two kernels:

- **decode** (``s`` is 1): tasks over (sequence, split): a task reads whole pages, every kv
  head of each (a page's keys, and its values, are one contiguous block: scattered 2 KB pieces
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
  under the static schedule, the task the thread runs next), so that memory keeps reading
  while the task computes from its cache, not only while it scores (measured at batch 8 and
  512 cached tokens with the pool out of cache: 1.05-1.12x). The hints are ``prefetch_l2``
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
- **prefill**: tasks over (sequence, kv head, block of ``LANES`` query rows, rows being tokens
  times the heads of the group), the rows as lanes, keys a page at a time, skipping pages no row
  of the block sees. A page's scores are summed in register tiles of a few keys x the rows, its
  values added in register tiles of a few head dims x the rows (``tile_rows``: within
  ``ACC_REGISTERS`` vectors; the accumulators rescaled as a tile loads them). From a bfloat16
  pool the products are bfloat16 (``dot_bf16x2``: one ``vdpbf16ps`` a vector of rows where the
  CPU has AVX-512 BF16, float32 sums): a key's pairs of dims and two keys' values of a dim
  are read where the pool keeps them side by side, the rows' queries stored rounded as pairs,
  the probabilities rounded as they are read; SmolLM2's 30 layers of prefill attention at 512
  tokens, q, 2 threads: 100 -> 68 ms.
- **the rotary table** (``paged_rotary``): the cosines and sines of a step's positions, computed
  by the same loop (``_angles``) as a kernel that is given no table.
"""

from __future__ import annotations

import math
from typing import Callable

from tilework.ir import sym
from tilework.ir.dtype import DTYPE_TABLE
from tilework.ir.loop import DOT_BF16X2, DOT_BF16X2_LANES, Allocate, Buffer, Cast, For, IfThenElse, Intrin, Load, Scalar, Select, Stmt, Store, TensorFunc, binary, const
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.op.attention_kernel import VECTOR_BYTES
from tilework.op.kernel import block, free_syms, hand_kernel, named_loop, seq, serial_var

LANES = 16  # float32 lanes of an AVX-512 register: the rows of a prefill task
MAX_SPLITS = 16  # decode: most tasks one sequence's pages are split into
MIN_SPLIT_PAGES = 4  # decode: a split covers at least this many pages
TASKS = 32  # decode: splits are added while a step has fewer tasks than this (threads to feed)
CHUNK_PAGES = 16  # decode: pages whose scores a task holds at once (one softmax update each)
ACC_REGISTERS = 12  # decode: vector registers of accumulators a register tile keeps
PARTIALS = 2  # decode: partial sums of a key's score (independent chains) where they fit
DOT_PARTIALS = 4  # the same with dot_bf16x2 (a longer latency: more chains)
MAX_TILE_HEADS = 6  # decode: a group of more heads than this is not unrolled into registers
LINE_BYTES = 64  # a cache line: the stride of the prefetch hints
NEXT_TASK_HINTS = True  # decode: the value pass hints the pages of the thread's next task


def paged_attention_kernel(
    shapes: list[tuple[tuple[Dim, ...], str]], out_shape: tuple[tuple[Dim, ...], str], kv_heads: int, scale: float | None, theta: float | None, vector_bytes: int = VECTOR_BYTES
) -> tuple[TensorFunc, SymVar]:
    """The kernel of a ``paged_attention`` call (operand shapes and dtypes, with the rotary table
    last where it is given) and its ``layer`` sym param: every layer calls the same kernel."""
    params = [Buffer(name, shape, dtype) for name, (shape, dtype) in zip(("qkv", "k_cache", "v_cache", "kv_len", "page_table", "rotary"), shapes)]
    out = Buffer("out", *out_shape)
    layer = SymVar("layer", 0, None)  # a sym param: every layer calls the same kernel
    kernel = _Decode if out_shape[0][1] == 1 else _Prefill
    qkv, kc, vc, kv_len, pt = params[:5]
    given = params[5] if len(params) == 6 else None
    body = kernel(qkv, kv_heads, kc, vc, kv_len, pt, out, layer, None if scale is None else float(scale), None if theta is None else float(theta), vector_bytes, given).body()
    return _scheduled([*params, out], body), layer


def rotary_kernel(tokens_info: tuple[tuple[Dim, ...], str], kv_len_info: tuple[tuple[Dim, ...], str], out_info: tuple[tuple[Dim, ...], str], hd: int, theta: float) -> TensorFunc:
    """The kernel of a ``paged_rotary`` call: ``_angles`` of every new token, in parallel."""
    tokens, kv_len, out = Buffer("tokens", *tokens_info), Buffer("kv_len", *kv_len_info), Buffer("out", *out_info)
    nb, sq = tokens_info[0]
    bt = serial_var("rotary_bt", sym.mul(nb, sq))
    b, t = sym.floordiv(bt, sq), sym.floormod(bt, sq)
    body = For(bt, sym.mul(nb, sq), _angles(out, b, t, _i64(_ld(kv_len, b)), hd, theta), "parallel")
    return _scheduled([tokens, kv_len, out], body)


def _scheduled(buffers: list[Buffer], body: Stmt) -> TensorFunc:
    """A hand-built kernel whose loops carry their kinds (the ``paged_attention`` schedule rule
    keeps them)."""
    func = hand_kernel([*buffers, *free_syms(body, buffers)], body, "opaque")
    return func.replace(attrs=func.attrs.with_(scheduled=True, schedule_rule="paged_attention"))


Body = Callable[[SymVar], Stmt]
F32 = "float32"


def _i64(x: Scalar) -> Scalar:
    return Cast("int64", x)


def _ld(buf: Buffer, *idx: Scalar) -> Load:
    return Load(buf, tuple(idx))


def _f32(x: Load) -> Scalar:
    """A cached key or value as float32 (widened in registers from a 16-bit pool)."""
    return x if x.dtype == F32 else Cast(F32, x)


def _pair(x: Scalar, w: int) -> tuple[Scalar, Scalar]:
    """Index ``x`` of a pool axis stored in pairs of ``w``: (its pair, its place in the pair)."""
    if w == 1:
        return x, 0
    if isinstance(x, (int, SymExpr)):
        return sym.floordiv(x, w), sym.floormod(x, w)
    return binary("//", x, w), binary("%", x, w)


def _c(v: float) -> Scalar:
    return const(v, F32)


def _angles(trig: Buffer, b: Dim, t: Dim, cached: Scalar, hd: Dim, theta: float) -> Stmt:
    """The cosine and sine of token ``t``'s rotary angles (one per pair of channels, at position
    ``cached + t``) into ``trig[b, t]``, in float64: a token's heads share them. One home for
    both kernels that compute them (the attention's scratch and ``paged_rotary``'s table)."""
    f64 = "float64"
    step = -2.0 * math.log(theta)
    scale = const(step / hd, f64) if isinstance(hd, int) else binary("/", const(step, f64), Cast(f64, hd))

    def one(j: SymVar) -> Stmt:
        angle = binary("*", Cast(f64, binary("+", cached, t)), Intrin("exp", (binary("*", Cast(f64, j), scale),), f64))
        return block("pa_angle", seq([Store(trig, (b, t, 0, j), Intrin("cos", (angle,), f64)), Store(trig, (b, t, 1, j), Intrin("sin", (angle,), f64))]))

    half = sym.floordiv(hd, 2)
    j = serial_var("angle_j", half)
    return For(j, half, one(j), "serial")


class _Kernel:
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
    ) -> None:
        self.qkv, self.kc, self.vc, self.kv_len, self.pt, self.out = qkv, kc, vc, kv_len, pt, out
        self.lanes = max(1, vector_bytes // 4)  # float32 lanes of a vector register (sizes the tiles)
        self.layer = layer
        self.nb, self.sq, self.nh, self.hd = out.shape
        self.nkv = nkv
        self.theta = theta
        self.page = kc.shape[4]
        w = kc.shape[5]  # the pool's pair width (``pair_width``)
        assert isinstance(w, int), "a pool's pair width is static"
        self.w = w
        # from a bfloat16 pool (in pairs) the products are bfloat16: one vdpbf16ps a vector
        self.dot = self.kc.dtype == "bfloat16" and self.w == 2
        self.width = pt.shape[1]
        self.group = sym.floordiv(self.nh, self.nkv)
        if scale is not None:
            self.scale: Scalar = _c(float(scale))
        elif isinstance(self.hd, int):
            self.scale = _c(1.0 / math.sqrt(self.hd))
        else:
            self.scale = Intrin("rsqrt", (Cast(F32, self.hd),), F32)
        self.names: set[str] = set()
        # the angles' cosines and sines [b, s, 2, hd / 2]: given (paged_rotary's), or computed
        # into a scratch as each token's key is appended
        self.given = rotary is not None
        self.trig = rotary if rotary is not None else Buffer("pa_trig", (self.nb, self.sq, 2, sym.floordiv(self.hd, 2)), "float64")

    def loop(self, name: str, extent: Dim, body: Body, kind: str = "serial") -> For:
        return named_loop(self.names, name, extent, body, kind)

    def key(self, page: Scalar, kh: Dim, d: Dim, j: Scalar) -> Load:
        """Key ``j`` of pool page ``page``, kv head ``kh``, dim ``d`` (in the pool's pairs: see
        ``tilework.op.paged_attention``)."""
        d_pair, d_in = _pair(d, self.w)
        return _ld(self.kc, self.layer, page, kh, d_pair, j, d_in)

    def value(self, page: Scalar, j: Scalar, kh: Dim, e: Dim) -> Load:
        """Dim ``e`` of the value of key ``j`` of pool page ``page``, kv head ``kh``."""
        j_pair, j_in = _pair(j, self.w)
        return _ld(self.vc, self.layer, page, j_pair, kh, e, j_in)

    def cached(self, b: Dim) -> Scalar:
        return _i64(_ld(self.kv_len, b))

    def q_at(self, b: Dim, t: Dim, h: Dim, d: Dim) -> Scalar:
        """Query head ``h`` of token ``t``, dim ``d``, rotated."""
        return self._rotated(b, t, h, d)

    def v_at(self, b: Dim, t: Dim, kh: Dim, d: Dim) -> Scalar:
        return _ld(self.qkv, b, t, sym.add(sym.add(self.nh, self.nkv), kh), d)

    def rotated_dims(self, name: str, b: Dim, t: Dim, h: Dim, put: Callable[[Dim, Scalar], Stmt]) -> Stmt:
        """``put(d, value)`` for every dim ``d`` of head ``h`` of token ``t``, the value turned
        as ``_rotated`` turns it (term for term: the same bits): with ``rope_theta`` as one loop
        over the pairs ``j, j + hd / 2``, whose loads are contiguous in each half (the per-dim
        form reads its partner and angle through selects, which GCC vectorized as gathers)."""
        if self.theta is None:
            return self.loop(name, self.hd, lambda d: put(d, _ld(self.qkv, b, t, h, d)), "vectorized")
        half = sym.floordiv(self.hd, 2)
        f64 = "float64"

        def pair(j: SymVar) -> Stmt:
            lo, hi = Cast(f64, _ld(self.qkv, b, t, h, j)), Cast(f64, _ld(self.qkv, b, t, h, sym.add(j, half)))
            cos, sin = _ld(self.trig, b, t, 0, j), _ld(self.trig, b, t, 1, j)

            def turned(mine: Scalar, signed: Scalar) -> Scalar:
                return Cast(F32, binary("+", binary("*", mine, cos), binary("*", signed, sin)))

            return seq([put(j, turned(lo, binary("-", const(0.0, f64), hi))), put(sym.add(j, half), turned(hi, lo))])

        return self.loop(name, half, pair, "vectorized")

    def _rotated(self, b: Dim, t: Dim, h: Dim, d: Dim) -> Scalar:
        """``qkv[b, t, h, d]`` turned by the rotary angle of its position (``rotary_embedding``'s
        arithmetic: float64, rounded once; the cosine and sine from ``self.trig``, given or filled
        by ``append``); as it is without ``rope_theta``."""
        if self.theta is None:
            return _ld(self.qkv, b, t, h, d)
        half = sym.floordiv(self.hd, 2)
        f64 = "float64"
        lower = binary("<", d, half)
        j = Select(lower, d, sym.sub(d, half), "int64")
        partner = Select(lower, sym.add(d, half), sym.sub(d, half), "int64")  # one in-bounds load
        mine = Cast(f64, _ld(self.qkv, b, t, h, d))
        other = Cast(f64, _ld(self.qkv, b, t, h, partner))
        signed = Select(lower, binary("-", const(0.0, f64), other), other, f64)
        return Cast(F32, binary("+", binary("*", mine, _ld(self.trig, b, t, 0, j)), binary("*", signed, _ld(self.trig, b, t, 1, j))))

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
            page = _i64(_ld(self.pt, b, binary("//", pos, self.page)))
            off = binary("%", pos, self.page)

            def put(kh: SymVar) -> Stmt:
                def key(d: Dim, value: Scalar) -> Stmt:
                    return block("paged_append", Store(self.kc, self.key(page, kh, d, off).indices, value))

                def value(d: SymVar) -> Stmt:
                    return block("paged_append_v", Store(self.vc, self.value(page, off, kh, d).indices, self.v_at(b, t, kh, d)))

                return seq([self.rotated_dims("append_d", b, t, sym.add(self.nh, kh), key), self.loop("append_v", self.hd, value, "vectorized")])

            steps = [self.loop("append_h", self.nkv, put)] + ([] if queries is None else [queries(b, t)])
            if self.theta is None or self.given:
                return seq(steps)
            return seq([_angles(self.trig, b, t, self.cached(b), self.hd, self.theta), *steps])

        return self.loop("append_bt", sym.mul(self.nb, self.sq), token, "parallel")


class _Decode(_Kernel):
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
        # queries turned and scaled, once a sequence (rounded to bfloat16 for the pair products)
        self.qr = Buffer("pa_qr", (self.nb, self.nh, self.hd), "bfloat16" if self.dot else F32)
        steps = [
            self.append(self.queries),
            self.loop("task", tasks, self.task, "parallel"),
            self.loop("merge", sym.mul(self.nb, self.nkv), self.merge, "parallel"),
        ]
        body: Stmt = self.with_trig(seq(steps))
        for buf in (self.qr, self.pacc, self.pl, self.pm):
            body = Allocate(buf, body)
        return body

    def queries(self, b: Dim, t: Dim) -> Stmt:
        """Sequence ``b``'s query heads turned and scaled into ``qr`` (the splits of a sequence
        all read them)."""

        def head(h: SymVar) -> Stmt:
            return self.rotated_dims("q_d", b, t, h, lambda d, value: block("pa_q", Store(self.qr, (b, h, d), binary("*", value, self.scale))))

        return self.loop("q_h", self.nh, head)

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
        chains = DOT_PARTIALS if self.dot else PARTIALS
        dims = 2 * chains if self.dot else chains  # a step's dims: a pair per partial with dot_bf16x2
        for c in range(chains, 1, -1):
            if hd % (dims // chains * c) == 0 and c * tile <= ACC_REGISTERS:
                return c
        return 1

    def page_lines(self) -> int | None:
        """Cache lines of a page's keys (as many again of its values); None if not static."""
        size = sym.mul(sym.mul(self.nkv, self.hd), self.page)
        return -(-size * DTYPE_TABLE[self.kc.dtype].itemsize // LINE_BYTES) if isinstance(size, int) else None

    def hint(self, page: Scalar, line: Dim, name: str) -> Stmt:
        """A prefetch of cache line ``line`` of ``page``'s keys and the same of its values (a
        page's keys, and its values, are one contiguous block: the line is addressed by its
        flat offset along the last axis)."""
        per_line = max(1, LINE_BYTES // DTYPE_TABLE[self.kc.dtype].itemsize)
        hint = Buffer(name, (1,), F32)
        stores = [Store(hint, (0,), Intrin("prefetch_l2", (_ld(c, self.layer, page, 0, 0, 0, sym.mul(line, per_line)),), F32)) for c in (self.kc, self.vc)]
        return Allocate(hint, block(name, seq(stores)))

    def task(self, tv: SymVar) -> Stmt:
        b = sym.floordiv(tv, self.splits)
        sp = sym.floormod(tv, self.splits)
        total = binary("+", self.cached(b), 1)
        NH, NKV, G, HD, P, CH = self.nh, self.nkv, self.group, self.hd, self.page, CHUNK_PAGES
        EC = self.acc_columns()
        tile = "unrolled" if isinstance(G, int) and G <= MAX_TILE_HEADS else "serial"
        sc = Buffer("pa_sc", (NH, CH * P), F32)  # the chunk's scores, then its probabilities
        # with dot_bf16x2 the probabilities are rounded to bfloat16 here (their sum too is theirs)
        prob = Buffer("pa_pb", (NH, CH * P), "bfloat16") if self.dot else sc
        C = self.partials()
        s = Buffer("pa_s", (G, sym.mul(C, P)), F32)  # one page's partial scores of a kv head's group: a register tile
        lane = Buffer("pa_lane", (P,), F32)  # lane-wise maxima, then sums
        mx = Buffer("pa_mx", (1,), F32)
        m = Buffer("pa_m", (NH,), F32)
        l = Buffer("pa_l", (NH,), F32)
        alpha = Buffer("pa_alpha", (NH,), F32)
        acc = Buffer("pa_acc", (NH, HD), F32)
        a = Buffer("pa_a", (G, EC), F32)  # columns of a group's accumulators: a register tile
        nxt = Buffer("pa_next", (1,), "int64")
        split0 = sym.mul(sp, self.per_split)
        lines = self.page_lines()
        tasks = sym.mul(self.nb, self.splits)
        nt = sym.min_(sym.add(tv, 1), sym.sub(tasks, 1))  # the task this thread runs next (a static schedule)
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
            return Select(nvalid, _i64(_ld(self.pt, nb_, sym.min_(npidx, sym.sub(self.width, 1)))), page, "int64")
        D = 2 * C if self.dot else C  # dims a scoring step takes: C pairs with dot_bf16x2, else C
        steps = sym.mul(NKV, sym.floordiv(HD, D))  # a page's scoring steps: static where lines is
        per_step = -(-lines // steps) if lines is not None and isinstance(steps, int) else 0  # hints a step

        def seen(pidx: Dim) -> Scalar:
            """Page ``pidx`` of the table holds a token of the sequence."""
            return binary("and", binary("<", pidx, self.width), binary("<", sym.mul(pidx, P), total))

        def init(h: SymVar) -> Stmt:
            return seq([
                Store(m, (h,), _c(-math.inf)),
                Store(l, (h,), _c(0.0)),
                self.loop("acc0_e", HD, lambda e: block("pa_acc0", Store(acc, (h, e), _c(0.0))), "vectorized"),
            ])

        def chunk(ci: SymVar) -> Stmt:
            p0 = sym.add(split0, sym.mul(ci, CH))
            # the chunk's pages (those past the table's width hold no token: -inf scores, never read)
            count = sym.min_(CH, sym.sub(self.per_split, sym.mul(ci, CH)))

            def scores(pc: SymVar) -> Stmt:
                """Page ``p0 + pc``'s scores into ``sc`` (-inf past the last token)."""
                pidx = sym.add(p0, pc)
                first = sym.mul(pidx, P)
                page = _i64(_ld(self.pt, b, pidx))

                ahead = _ld(nxt, 0)  # the next page's pool index, looked up once a page

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
                                    dot = Intrin(DOT_BF16X2, (_ld(s, *at), *keys, _ld(self.qr, b, h, d), _ld(self.qr, b, h, sym.add(d, 1))), F32)
                                    return block("pa_score", Store(s, at, dot))

                                return self.loop("s_j", P, lane, "vectorized")

                            return self.loop("s_c", C, partial, "unrolled")

                        def one(g: SymVar) -> Stmt:
                            h = sym.add(sym.mul(kh, G), g)
                            qs = Buffer("pa_qs", (C,), F32)  # the C dims' queries: a select in the loop reads them safely

                            def lane(j: SymVar) -> Stmt:
                                # lane j of the C * P: dim d0 + j // P, key j % P (a page's keys
                                # are contiguous per dim: one loop over C dims' keys)
                                q: Scalar = _ld(qs, C - 1)
                                for c in range(C - 2, -1, -1):
                                    q = Select(binary("<", j, (c + 1) * P), _ld(qs, c), q, F32)
                                key = self.key(page, kh, sym.add(d0, sym.floordiv(j, P)), sym.floormod(j, P))
                                return block("pa_score", Store(s, (g, j), binary("+", _ld(s, g, j), binary("*", q, _f32(key)))))

                            put_q = [Store(qs, (c,), _ld(self.qr, b, h, sym.add(d0, c))) for c in range(C)]
                            return Allocate(qs, seq([*put_q, self.loop("s_j", sym.mul(C, P), lane, "vectorized")]))

                        return seq([*hinted, self.loop("s_g", G, pairs if self.dot else one, tile)])

                    def put(g: SymVar) -> Stmt:
                        def one(j: SymVar) -> Stmt:
                            seen_j = binary("<", sym.add(first, j), total)
                            score: Scalar = _ld(s, g, j)
                            for c in range(1, C):
                                score = binary("+", score, _ld(s, g, sym.add(j, c * P)))
                            return block("pa_mask", Store(sc, (sym.add(sym.mul(kh, G), g), sym.add(sym.mul(pc, P), j)), Select(seen_j, score, _c(-math.inf), F32)))

                        return self.loop("put_j", P, one, "vectorized")

                    zero = self.loop("s0_g", G, lambda g: self.loop("s0_j", sym.mul(C, P), lambda j: block("pa_s0", Store(s, (g, j), _c(0.0))), "vectorized"), tile)
                    return seq([zero, self.loop("s_dd", sym.floordiv(HD, D), dims), self.loop("put_g", G, put, tile)])

                def unseen(h: SymVar) -> Stmt:
                    return self.loop("inf_j", P, lambda j: block("pa_unseen", Store(sc, (h, sym.add(sym.mul(pc, P), j)), _c(-math.inf))), "vectorized")

                computed = seq([
                    Store(nxt, (0,), _i64(_ld(self.pt, b, Select(seen(sym.add(pidx, 1)), sym.add(pidx, 1), pidx, "int64")))),
                    self.loop("s_kh", NKV, group),
                ])
                return IfThenElse(binary("<", first, total), computed, self.loop("inf_h", NH, unseen))

            def softmax(h: SymVar) -> Stmt:
                """Head ``h``'s running maximum, its accumulators' rescale factor, the chunk's
                probabilities and their sum; lane-wise first, across the lanes once."""

                def pages(name: str, body: Callable[[Dim], Stmt]) -> Stmt:
                    return self.loop(f"{name}_pc", count, lambda pc: self.loop(f"{name}_j", P, lambda j: block("pa_" + name, body(sym.add(sym.mul(pc, P), j))), "vectorized"))

                def lanes(name: str, value: float) -> Stmt:
                    return self.loop(f"{name}_j", P, lambda j: block("pa_" + name, Store(lane, (j,), _c(value))), "vectorized")

                return seq([
                    lanes("max0", -math.inf),
                    pages("max", lambda i: Store(lane, (sym.floormod(i, P),), binary("max", _ld(lane, sym.floormod(i, P)), _ld(sc, h, i)))),
                    Store(mx, (0,), _ld(m, h)),
                    self.loop("mx_j", P, lambda j: Store(mx, (0,), binary("max", _ld(mx, 0), _ld(lane, j)))),
                    Store(alpha, (h,), Intrin("exp", (binary("-", _ld(m, h), _ld(mx, 0)),), F32)),
                    Store(m, (h,), _ld(mx, 0)),
                    pages("exp", lambda i: Store(prob, (h, i), Intrin("exp", (binary("-", _ld(sc, h, i), _ld(mx, 0)),), F32))),
                    lanes("sum0", 0.0),
                    pages("sum", lambda i: Store(lane, (sym.floormod(i, P),), binary("+", _ld(lane, sym.floormod(i, P)), _f32(_ld(prob, h, i))))),
                    Store(l, (h,), binary("*", _ld(l, h), _ld(alpha, h))),
                    self.loop("l_j", P, lambda j: Store(l, (h,), binary("+", _ld(l, h), _ld(lane, j)))),
                ])

            def values(kc: SymVar) -> Stmt:
                """Columns ``[c * EC, c * EC + EC)`` of kv head ``kh``'s group's accumulators
                (``kc`` is ``c * NKV + kh``): rescaled, then the chunk's values added in registers."""
                kh, col = sym.floormod(kc, NKV), sym.mul(sym.floordiv(kc, NKV), EC)

                def head(g: Dim) -> Dim:
                    return sym.add(sym.mul(kh, G), g)

                def page_values(pc: SymVar) -> Stmt:
                    pidx = sym.add(p0, pc)
                    page = _i64(_ld(self.pt, b, pidx))

                    def key(j: SymVar) -> Stmt:
                        """Key ``j`` of the page (with dot_bf16x2 keys ``2j`` and ``2j + 1``)."""

                        def one(g: SymVar) -> Stmt:
                            p = _ld(sc, head(g), sym.add(sym.mul(pc, P), j))
                            return self.loop("pv_e", EC, lambda e: block("pa_pv", Store(a, (g, e), binary("+", _ld(a, g, e), binary("*", p, _f32(self.value(page, j, kh, sym.add(col, e))))))), "vectorized")

                        def pair(g: SymVar) -> Stmt:
                            at = sym.add(sym.mul(pc, P), sym.mul(j, 2))
                            probs = (_ld(prob, head(g), at), _ld(prob, head(g), sym.add(at, 1)))

                            def lane(e: SymVar) -> Stmt:
                                vals = (self.value(page, sym.mul(j, 2), kh, sym.add(col, e)), self.value(page, sym.add(sym.mul(j, 2), 1), kh, sym.add(col, e)))
                                return block("pa_pv", Store(a, (g, e), Intrin(DOT_BF16X2, (_ld(a, g, e), *vals, *probs), F32)))

                            return self.loop("pv_e", EC, lane, "vectorized")

                        vstep = sym.add(sym.mul(kc, KS), j)
                        hinted = [self.hint(_ld(tnext, 0), sym.min_(sym.add(sym.mul(vstep, per_vstep), r), (lines or 1) - 1), "pa_thint") for r in range(per_vstep)]
                        return seq([*hinted, self.loop("pv_g", G, pair if self.dot else one, tile)])

                    body: Stmt = self.loop("pv_j", KS, key)
                    if per_vstep:
                        body = seq([Store(tnext, (0,), next_task_page(ci, pc, page)), body])
                    return IfThenElse(binary("<", sym.mul(pidx, P), total), body)

                return seq([
                    self.loop("a0_g", G, lambda g: self.loop("a0_e", EC, lambda e: block("pa_a0", Store(a, (g, e), binary("*", _ld(acc, head(g), sym.add(col, e)), _ld(alpha, head(g))))), "vectorized"), tile),
                    self.loop("pv_pc", count, page_values),
                    self.loop("a1_g", G, lambda g: self.loop("a1_e", EC, lambda e: block("pa_a1", Store(acc, (head(g), sym.add(col, e)), _ld(a, g, e))), "vectorized"), tile),
                ])

            return IfThenElse(binary("<", sym.mul(p0, P), total), seq([
                self.loop("sc_pc", count, scores),
                self.loop("sm_h", NH, softmax),
                self.loop("pv_kc", sym.mul(sym.floordiv(HD, EC), NKV), values),
            ]))

        def save(h: SymVar) -> Stmt:
            return seq([
                Store(self.pm, (tv, h), _ld(m, h)),
                Store(self.pl, (tv, h), _ld(l, h)),
                self.loop("save_e", HD, lambda e: block("pa_save", Store(self.pacc, (tv, h, e), _ld(acc, h, e))), "vectorized"),
            ])

        chunks = sym.floordiv(sym.add(self.per_split, CH - 1), CH)
        first_page = [] if lines is None else [IfThenElse(seen(split0), self.loop("pf_line", lines, lambda ln: self.hint(_i64(_ld(self.pt, b, split0)), ln, "pa_hint0"), "unrolled"))]
        body: Stmt = seq([
            *first_page,
            self.loop("init", NH, init),
            self.loop("chunk", chunks, chunk),
            self.loop("save", NH, save),
        ])
        for buf in (tnext, nxt, a, acc, alpha, l, m, mx, lane, s, sc, *([prob] if self.dot else [])):
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
                pm = _ld(self.pm, task_of(sp), h)
                wt = Select(binary("==", pm, _c(-math.inf)), _c(0.0), Intrin("exp", (binary("-", pm, _ld(mm, 0)),), F32), F32)
                return seq([Store(w, (sp,), wt), Store(ll, (0,), binary("+", _ld(ll, 0), binary("*", wt, _ld(self.pl, task_of(sp), h))))])

            def add(sp: SymVar) -> Stmt:
                return self.loop("mo_e", HD, lambda e: block("pa_merge", Store(o, (e,), binary("+", _ld(o, e), binary("*", _ld(w, sp), _ld(self.pacc, task_of(sp), h, e))))), "vectorized")

            inv = Select(binary(">", _ld(ll, 0), _c(0.0)), binary("/", _c(1.0), _ld(ll, 0)), _c(0.0), F32)
            return seq([
                Store(mm, (0,), _c(-math.inf)),
                self.loop("mm_sp", self.splits, lambda sp: Store(mm, (0,), binary("max", _ld(mm, 0), _ld(self.pm, task_of(sp), h)))),
                Store(ll, (0,), _c(0.0)),
                self.loop("w_sp", self.splits, weight),
                self.loop("o0_e", HD, lambda e: block("pa_o0", Store(o, (e,), _c(0.0))), "vectorized"),
                self.loop("o_sp", self.splits, add),
                self.loop("out_e", HD, lambda e: block("pa_out", Store(self.out, (b, 0, h, e), binary("*", _ld(o, e), inv))), "vectorized"),
            ])

        body: Stmt = self.loop("mg", G, for_head)
        for buf in (o, w, ll, mm):
            body = Allocate(buf, body)
        return body


class _Prefill(_Kernel):
    """Several new tokens per sequence; see the module docstring."""

    def body(self) -> Stmt:
        self.rows = sym.mul(self.sq, self.group)
        self.blocks = sym.floordiv(sym.add(self.rows, LANES - 1), LANES)
        tasks = sym.mul(sym.mul(self.nb, self.nkv), self.blocks)
        # a bfloat16 pool: the products in bfloat16 (dot_bf16x2), its pairs read where they lie
        self.dot = self.dot and LANES % DOT_BF16X2_LANES == 0
        return self.with_trig(seq([self.append(), self.loop("task", tasks, self.task, "parallel")]))

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

        at = Buffer("pp_page", (1,), "int64")  # the page's pool index, looked up once a page

        def page_step(pi: SymVar) -> Stmt:
            first = sym.mul(pi, P)
            page = _ld(at, 0)

            def scores(jt: SymVar) -> Stmt:
                """Keys ``jt * JT ..`` of the page against every row: a register tile of JT keys x
                the rows, summed over the head dim (independent chains), then stored."""

                def dim(d: SymVar) -> Stmt:
                    def key(j: SymVar) -> Stmt:
                        kv = _f32(self.key(page, kh, d, sym.add(sym.mul(jt, JT), j)))
                        return rows("score", lambda r: Store(t, (j, r), binary("+", _ld(t, j, r), binary("*", kv, _ld(qt, d, r)))))

                    return self.loop("qk_j", JT, key, "unrolled")

                def pair(i: SymVar) -> Stmt:
                    """Dims ``2 i``, ``2 i + 1``: one ``dot_bf16x2`` a key and vector of rows."""

                    def key(j: SymVar) -> Stmt:
                        slot = sym.add(sym.mul(jt, JT), j)  # the key's place in its page
                        ks = (self.key(page, kh, sym.mul(i, 2), slot), self.key(page, kh, sym.add(sym.mul(i, 2), 1), slot))
                        return rows("score", lambda r: Store(t, (j, r), Intrin(DOT_BF16X2, (_ld(t, j, r), _ld(qt, i, r, 0), _ld(qt, i, r, 1), *ks), F32)))

                    return self.loop("qk_j", JT, key, "unrolled")

                return seq([
                    self.loop("t0_j", JT, lambda j: rows("t0", lambda r: Store(t, (j, r), _c(0.0))), "unrolled"),
                    self.loop("qk_i", HD // 2, pair) if self.dot else self.loop("qk_d", HD, dim),
                    self.loop("t1_j", JT, lambda j: rows("t1", lambda r: Store(st, (sym.add(sym.mul(jt, JT), j), r), _ld(t, j, r))), "unrolled"),
                ])

            def masked(j: SymVar) -> Stmt:
                def one(r: SymVar) -> Stmt:
                    t, _ = lane(r)
                    seen = binary("<=", sym.add(first, j), binary("+", cached, t))
                    return Store(st, (j, r), Select(seen, _ld(st, j, r), _c(-math.inf), F32))

                return rows("mask", one)

            def prob_rows(j: SymVar) -> Stmt:
                def one(r: SymVar) -> Stmt:
                    unseen = binary("==", _ld(m, r), _c(-math.inf))
                    p = Intrin("exp", (binary("-", _ld(st, j, r), _ld(m, r)),), F32)
                    return Store(st, (j, r), Select(unseen, _c(0.0), p, F32))

                return rows("p", one)

            def values(et: SymVar) -> Stmt:
                """Dims ``et * ET ..`` of every row's accumulator: rescaled as they are loaded into
                a register tile, the page's values added (independent chains), stored back."""

                def col(e: Dim) -> Dim:
                    return sym.add(sym.mul(et, ET), e)

                def key(j: SymVar) -> Stmt:
                    def dim(e: SymVar) -> Stmt:
                        vv = _f32(self.value(page, j, kh, col(e)))
                        return rows("pv", lambda r: Store(a, (e, r), binary("+", _ld(a, e, r), binary("*", _ld(st, j, r), vv))))

                    return self.loop("pv_e", ET, dim, "unrolled")

                def key_pair(u: SymVar) -> Stmt:
                    """Keys ``2 u``, ``2 u + 1``: one ``dot_bf16x2`` a dim and vector of rows (the
                    probabilities rounded to bfloat16 as they are read)."""

                    def dim(e: SymVar) -> Stmt:
                        vs = (self.value(page, sym.mul(u, 2), kh, col(e)), self.value(page, sym.add(sym.mul(u, 2), 1), kh, col(e)))

                        def one(r: SymVar) -> Stmt:
                            ps = (Cast("bfloat16", _ld(st, sym.add(sym.mul(u, 2), c), r)) for c in (0, 1))
                            return Store(a, (e, r), Intrin(DOT_BF16X2, (_ld(a, e, r), *ps, *vs), F32))

                        return rows("pv", one)

                    return self.loop("pv_e", ET, dim, "unrolled")

                return seq([
                    self.loop("a0_e", ET, lambda e: rows("a0", lambda r: Store(a, (e, r), binary("*", _ld(acc, col(e), r), _ld(alpha, r)))), "unrolled"),
                    self.loop("pv_u", P // 2, key_pair) if self.dot else self.loop("pv_j", P, key),
                    self.loop("a1_e", ET, lambda e: rows("a1", lambda r: Store(acc, (col(e), r), _ld(a, e, r))), "unrolled"),
                ])

            def alpha_of(r: SymVar) -> Stmt:
                unseen = binary("==", _ld(mx, r), _c(-math.inf))
                shrink = Intrin("exp", (binary("-", _ld(m, r), _ld(mx, r)),), F32)
                return Store(alpha, (r,), Select(unseen, _c(1.0), shrink, F32))

            steps = [
                self.loop("qk_jt", sym.floordiv(P, JT), scores),
                self.loop("mask_j", P, masked),
                rows("mx0", lambda r: Store(mx, (r,), _ld(m, r))),
                self.loop("max_j", P, lambda j: rows("max", lambda r: Store(mx, (r,), binary("max", _ld(mx, r), _ld(st, j, r))))),
                rows("alpha", alpha_of),
                rows("l_scale", lambda r: Store(l, (r,), binary("*", _ld(l, r), _ld(alpha, r)))),
                rows("m_set", lambda r: Store(m, (r,), _ld(mx, r))),
                self.loop("p_j", P, prob_rows),
                self.loop("l_j", P, lambda j: rows("l_sum", lambda r: Store(l, (r,), binary("+", _ld(l, r), _ld(st, j, r))))),
                self.loop("pv_et", sym.floordiv(HD, ET), values),
            ]
            return IfThenElse(binary("<", first, horizon), seq([Store(at, (0,), _i64(_ld(self.pt, b, pi))), *steps]))

        def store_row(r: SymVar) -> Stmt:
            t, h = lane(r)
            valid = binary("<", sym.add(row0, r), self.rows)
            total = _ld(l, r)
            inv = Select(binary(">", total, _c(0.0)), binary("/", _c(1.0), total), _c(0.0), F32)
            put = self.loop("out_e", HD, lambda e: block("pp_out", Store(self.out, (b, t, h, e), binary("*", _ld(acc, e, r), inv))), "vectorized")
            return IfThenElse(valid, put)

        body: Stmt = seq([
            self.loop("qt_d", HD, fill),
            rows("m0", lambda r: Store(m, (r,), _c(-math.inf))),
            rows("l0", lambda r: Store(l, (r,), _c(0.0))),
            self.loop("acc0_e", HD, lambda e: rows("acc0", lambda r: Store(acc, (e, r), _c(0.0)))),
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


__all__ = ["paged_attention_kernel", "rotary_kernel", "LANES", "MAX_SPLITS", "MIN_SPLIT_PAGES", "CHUNK_PAGES"]

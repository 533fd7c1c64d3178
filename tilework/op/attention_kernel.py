"""The ``attention`` kernel: a hand-built TensorFunc with O(block) scratch per task, whatever
the sequence lengths (the online-softmax idea of FlashAttention, written as loops and blocks).

The work is split into tasks, one per (batch, kv head, block of ``R`` query rows). The rows of a
block are the query positions times the query heads sharing the kv head (grouped-query
attention): row ``t`` is query ``t // group`` of head ``kv_head * group + t % group``, so a
decoding step (one query) still fills its rows with the group's heads. The ``R`` rows are the
lanes of every vector operation (``R`` values fill one vector register), so no step needs a
horizontal sum, and every key and value is loaded once per block and broadcast to the lanes.
``R`` is 16 floats (a 64-byte vector); where a task may have ``NARROW_LANES`` (8) rows or fewer
(a decoding step: the 3 .. 8 query heads of a kv head) the kernel holds a copy 8 lanes wide
too, picked at run time, so that such a task's vector steps are half as many (AVX2: one
instruction each, not two, for the same useful lanes; decode with grouped heads 1.2-1.9x):

1. ``qt[d, r]``: the block's queries, transposed and scaled.
2. Keys in blocks of ``BK``: scores ``s[j, r] = sum_d k[j, d] * qt[d, r]``, accumulated in
   register tiles of ``JT`` keys; a score that is masked out (causal, False in a bool mask, a
   key past the end) becomes ``-inf``, a float mask is added.
3. Online softmax: per row the running max ``m`` and sum ``l``; ``alpha = exp(m_old -
   m_new)`` rescales ``l`` and the accumulator, the scores become ``p = exp(s - m_new)``.
   The new maximum is taken as the scores are stored, the sum as the probabilities are (no
   pass of their own over the block).
4. ``acc[e, r] = alpha * acc[e, r] + sum_j p[j, r] * v[j, e]`` in register tiles of ``ET``
   value columns, over the keys that exist only (their loads need no clamp, and the key is
   the loop's counter: one pointer stepping a row a key). The narrow copy instead takes the
   columns as its lanes (``value_rows``): ``acc[r, :]`` row by row, in register tiles of up
   to ``ET`` vectors of columns, each key's values loaded once per row and its probability
   broadcast: a key costs a row ``head_dim / lanes`` multiply-adds, not ``head_dim`` of mostly
   idle lanes (decode with grouped heads, AVX-512, 1 thread: 1.2-1.34x the whole kernel, the
   same bits). With the fused maximum and sum and the unclamped value loads, the encoder case
   of ``bench/bench_kernels.py`` 1.09-1.10x (Zen 4, 1 and 2 threads, the same bits).
5. ``out = acc / l``, or 0 for a row that sees no key.

With ``bf16`` (the op's attr: ``tilework.compile(..., precision="bf16")`` where the CPU has
AVX-512 BF16) the wide copy multiplies in bfloat16 with float32 sums (``dot_bf16x2``: one
``vdpbf16ps`` a vector of rows and pair): the keys, and the values with each pair of keys'
values of a column side by side, are rounded once a call into scratch (``kbf``, ``vbf``); the
block's queries are stored rounded with each row's pairs of dims side by side, and the
probabilities are rounded as the values' products read them (their float32 sum is the
denominator). all-MiniLM-L6-v2's attention at (8, 256), 2 threads: 6.1 -> 4.8 ms a call. A
task of up to 8 rows (the narrow copy) and an odd head dim stay float32.

A mask that is the same for every row of a task (broadcast over the heads and the queries: a
padding mask ``[b, 1, 1, kv]``) becomes one bias a key per block (``key_biases``: 0 or -inf for
a bool mask), added to the scores, instead of a load (and a select) a score.

A register tile's rows (``JT`` keys, ``ET`` value columns) fill 8 vector registers of the
target (``vector_bytes``, from the legalization context): 8 rows where ``R`` lanes fill one
register, 4 where they take two (AVX2's 32-byte registers and 16 lanes: 8 rows were all 16 of
its registers and spilled; prefill 1.13 -> 1.24x torch SDPA).

Few tasks (a decoding step of one sequence: one task per kv head) would leave threads idle
while each reads all the keys of its head: while a call has at most ``TASKS // 2`` tasks,
each task's key blocks are split into ``splits`` ranges (about ``TASKS`` tasks in all, at most
``MAX_SPLITS`` ranges, at least ``MIN_SPLIT_BLOCKS`` key blocks each; decided at run time when
the dims are symbolic). A split task keeps its running max, sum and unnormalized accumulator in
a scratch of the call (``attention_pm``/``pl``/``pacc``: ``TASKS`` rows, as tasks x splits never
exceeds it), and a second parallel loop merges a task's splits:
``M = max m_s``, ``w_s = exp(m_s - M)``, ``out = sum w_s acc_s / sum w_s l_s``. With one split
the task stores its rows as before (the same operations, the same bits).

The last key block stops at the tile of ``JT`` keys that holds the last key, so a short
sequence (8 keys) computes one tile, not a block of ``BK``. Causal attention skips the key
blocks past the diagonal of the block's last row (aligned at
the end: query ``i`` sees keys ``j <= i + seq_kv - seq_q``). Loads of keys and value columns
past the end are clamped to the last one (their scores are masked, their columns never
stored), so the inner loops have static extents. The loops carry their kinds: the task loop
is parallel, the row loops vectorized, the tile loops unrolled; the ``attention`` schedule
rule keeps them.
"""

from __future__ import annotations

import math
from typing import Callable

from tilework.ir import sym
from tilework.ir.loop import (
    Allocate,
    Buffer,
    Cast,
    Const,
    For,
    IfThenElse,
    Intrin,
    Load,
    Scalar,
    Select,
    Stmt,
    Store,
    TensorFunc,
    binary,
    const,
    convert,
)
from tilework.ir.dtype import DTYPE_TABLE
from tilework.ir.loop import DOT_BF16X2, DOT_BF16X2_LANES
from tilework.ir.sym import Dim, SymVar
from tilework.op.kernel import bcast_index, block, compute_dtype, free_syms, hand_kernel, named_loop, seq

RowBody = Callable[[SymVar], Stmt]
TileBody = Callable[[SymVar, SymVar], Stmt]

VECTOR_BYTES = 64  # the rows of a task fill one (AVX-512) vector register
BK = 32  # keys per block of the online softmax
JT = 8  # keys per register tile of the scores (where a row of the tile is one vector register)
ET = 8  # value columns per register tile of the accumulator (the same)
BLOCK_PREFIX = "attention_"  # every block of the kernel is named so (the schedule rule looks)
NARROW_LANES = 8  # a task of this many rows or fewer runs in a copy of the kernel this wide
TASKS = 15  # split the keys of at most TASKS // 2 tasks into ranges: about this many tasks
MAX_SPLITS = 8  # at most this many key ranges per task
MIN_SPLIT_BLOCKS = 4  # key blocks per range, at least (128 keys)


def attention_kernel(
    q: Buffer, k: Buffer, v: Buffer, mask: Buffer | None, out: Buffer, causal: bool, scale: float | None, vector_bytes: int = VECTOR_BYTES, bf16: bool = False
) -> TensorFunc:
    """The kernel computing ``out = attention(q, k, v, mask)`` (see ``tilework.op.nn``); its
    params are the buffers (mask only when given) and the sym vars no buffer has as a dim.
    Where a task's rows (query positions times the heads of a kv head) may be
    ``NARROW_LANES`` or fewer, a copy of the kernel that many lanes wide runs then (decided
    at run time when the count is symbolic). ``vector_bytes``: the target's vector register
    width; a register tile has as many rows as fill 8 registers (fewer than ``JT`` / ``ET``
    where the lanes of a row take two). ``bf16``: the wide copy's products in bfloat16 (see
    the module docstring)."""
    wide = _Attention(q, k, v, mask, out, causal, scale, vector_bytes=vector_bytes, bf16=bf16)
    narrow = _Attention(q, k, v, mask, out, causal, scale, NARROW_LANES, wide.names, vector_bytes)
    body: Stmt
    if wide.lanes <= NARROW_LANES or sym.prove_ge(wide.rows, NARROW_LANES + 1):
        body = wide.body()
    elif sym.prove_le(wide.rows, NARROW_LANES):
        body = narrow.body()
    else:
        many = wide.body()  # built first: its loops keep the plain names
        body = IfThenElse(binary("<=", wide.rows, NARROW_LANES), narrow.body(), many)
    buffers = [q, k, v, out] if mask is None else [q, k, v, mask, out]
    return hand_kernel([*buffers, *free_syms(body, buffers)], body, "reduction")


def _ceil_div(a: Dim, b: int) -> Dim:
    return sym.floordiv(sym.add(a, b - 1), b)


def _ld(buf: Buffer, *idx: Scalar) -> Load:
    return Load(buf, tuple(idx))


class _Attention:
    def __init__(
        self,
        q: Buffer,
        k: Buffer,
        v: Buffer,
        mask: Buffer | None,
        out: Buffer,
        causal: bool,
        scale: float | None,
        lanes: int | None = None,
        names: set[str] | None = None,
        vector_bytes: int = VECTOR_BYTES,
        bf16: bool = False,
    ) -> None:
        """``lanes``: the rows of a task (default: one 64-byte vector of the compute dtype);
        ``names``: the loop names taken (shared by the copies of one kernel);
        ``vector_bytes``: the width of the target's vector registers (sizes the tiles);
        ``bf16``: products in bfloat16 where this copy can (see ``dot``)."""
        self.q, self.k, self.v, self.mask, self.out, self.causal = q, k, v, mask, out, causal
        self.acc = compute_dtype(out.dtype)
        item = DTYPE_TABLE[self.acc].itemsize
        self.lanes = lanes or VECTOR_BYTES // item
        self.nb, self.sq, self.nh, self.hd = q.shape
        self.skv, self.nkv, self.hdv = k.shape[1], k.shape[2], v.shape[3]
        self.group = sym.floordiv(self.nh, self.nkv)
        self.rows = sym.mul(self.group, self.sq)
        self.nqb = _ceil_div(self.rows, self.lanes)
        # a register tile holds JT (ET) rows of R lanes: as many registers as that where R lanes
        # fill one, else fewer rows (AVX2, 16 float lanes: 2 registers a row, 4 rows)
        per_row = -(-self.lanes * item // vector_bytes)
        self.jt, self.et = max(2, JT // per_row), max(2, ET // per_row)
        self.etiles = _ceil_div(self.hdv, self.et)
        # the narrow copy adds the values by columns (see ``value_rows``): register tiles of
        # ``cvec`` vectors of ``vl`` value columns, ``ctiles`` of them across the head dim
        self.by_columns = lanes is not None
        self.vl = max(1, vector_bytes // item)
        self.cvec = min(ET, -(-self.hdv // self.vl)) if isinstance(self.hdv, int) else ET
        self.ctiles = _ceil_div(self.hdv, self.cvec * self.vl)
        self.scale: Scalar
        if scale is not None:
            self.scale = const(scale, self.acc)
        elif isinstance(self.hd, int):
            self.scale = const(1.0 / math.sqrt(self.hd), self.acc)
        else:
            self.scale = Intrin("rsqrt", (Cast(self.acc, self.hd),), self.acc)
        R, acc = self.lanes, self.acc
        self.tag = "" if lanes is None else str(lanes)  # the scratch of a copy is named apart
        # bfloat16 products (``dot_bf16x2``): the rows as lanes (not the narrow copy's columns),
        # float32, an even head dim, whole vectors of 16 lanes
        self.dot = bf16 and lanes is None and acc == "float32" and isinstance(self.hd, int) and self.hd % 2 == 0 and R % DOT_BF16X2_LANES == 0
        if self.dot:  # the queries as pairs of dims, each row's pair side by side
            self.qt = Buffer(f"attention_qt{self.tag}", (self.hd // 2, R, 2), "bfloat16")
            pairs = _ceil_div(self.skv, 2)
            self.kbf = Buffer(f"attention_kbf{self.tag}", (self.nb, self.nkv, self.skv, self.hd), "bfloat16")
            self.vbf = Buffer(f"attention_vbf{self.tag}", (self.nb, self.nkv, pairs, self.hdv, 2), "bfloat16")
        else:
            self.qt = Buffer(f"attention_qt{self.tag}", (self.hd, R), acc)
        if self.by_columns:  # a row's accumulators side by side: [row, column]
            self.acc_buf = Buffer(f"attention_acc{self.tag}", (R, sym.mul(self.ctiles, self.cvec * self.vl)), acc)
        else:  # a column's accumulators of the rows side by side: [column, row]
            self.acc_buf = Buffer(f"attention_acc{self.tag}", (sym.mul(self.etiles, self.et), R), acc)
        self.s = Buffer(f"attention_s{self.tag}", (BK, R), acc)
        self.m = Buffer(f"attention_m{self.tag}", (R,), acc)
        self.l = Buffer(f"attention_l{self.tag}", (R,), acc)
        self.mx = Buffer(f"attention_mx{self.tag}", (R,), acc)
        self.alpha = Buffer(f"attention_alpha{self.tag}", (R,), acc)
        self.names: set[str] = set() if names is None else names
        # the split of the keys (see the module doc): ``splits`` ranges of each task's blocks
        self.ntask = sym.mul(sym.mul(self.nb, self.nkv), self.nqb)
        by_tasks = sym.floordiv(TASKS, sym.max_(self.ntask, 1))
        by_keys = sym.floordiv(_ceil_div(self.skv, BK), MIN_SPLIT_BLOCKS)
        self.splits = sym.max_(1, sym.min_(MAX_SPLITS, sym.min_(by_tasks, by_keys)))
        self.split = not sym.prove_eq(self.splits, 1)
        # the partial results of split tasks: at most TASKS of them (tasks x splits <= TASKS)
        self.pm = Buffer(f"attention_pm{self.tag}", (TASKS, R), acc)
        self.pl = Buffer(f"attention_pl{self.tag}", (TASKS, R), acc)
        self.pacc = Buffer(f"attention_pacc{self.tag}", (TASKS, self.hdv, R), acc)
        # a row-invariant mask's bias of a block's keys (``key_biases``), and the block's first key
        self.key_bias = Buffer(f"attention_kbias{self.tag}", (BK,), acc) if self.row_invariant_mask() else None
        self.key_bias_j0: Dim = 0
        # per task (set by ``task``): batch, kv head, first row
        self.b: Dim = 0
        self.hk: Dim = 0
        self.row0: Dim = 0

    # -- helpers ----------------------------------------------------------------------------

    def c(self, value: float) -> Const:
        return const(value, self.acc)

    def up(self, x: Scalar) -> Scalar:
        """A loaded value in the compute dtype."""
        return convert(x, self.acc)

    def acc_at(self, e: Dim, r: Dim) -> tuple[Dim, Dim]:
        """The index of row ``r``'s accumulator of value column ``e`` (see ``acc_buf``)."""
        return (r, e) if self.by_columns else (e, r)

    def lane(self, r: Dim) -> tuple[Dim, Dim]:
        """The query position and query head of row ``r`` of the task (rows past the last one
        repeat it: their loads stay in bounds, their results are not stored)."""
        t = sym.min_(sym.add(self.row0, r), sym.sub(self.rows, 1))
        return sym.floordiv(t, self.group), sym.add(sym.mul(self.hk, self.group), sym.floormod(t, self.group))

    def key(self, j: Dim) -> Dim:
        """Key ``j`` clamped to the last key (for loads past the end)."""
        return sym.min_(j, sym.sub(self.skv, 1))

    def column(self, e: Dim) -> Dim:
        """Value column ``e`` clamped to the last one, unless it is provably in range."""
        last = sym.sub(self.hdv, 1)
        return e if sym.prove_le(e, last) else sym.min_(e, last)

    def loop(self, name: str, extent: Dim, body: RowBody, kind: str = "serial") -> For:
        """A loop with a var named uniquely in the kernel (names survive printing)."""
        return named_loop(self.names, name, extent, body, kind)

    def rows_loop(self, name: str, body: RowBody) -> Stmt:
        """The vector loop over the task's rows around block ``attention_<name>``."""
        return self.loop(f"{name}_r", self.lanes, lambda r: block(BLOCK_PREFIX + name, body(r)), "vectorized")

    def tile_loop(self, name: str, extent: int, body: TileBody) -> Stmt:
        """An unrolled loop over a register tile's rows, each a vector loop over the lanes."""
        return self.loop(name, extent, lambda x: self.rows_loop(name, lambda r: body(x, r)), "unrolled")

    # -- the kernel ------------------------------------------------------------------------

    def body(self) -> Stmt:
        tasks = self.loop("task", sym.mul(self.ntask, self.splits), self.task, "parallel")
        out: Stmt = tasks
        if self.split:
            merge = IfThenElse(binary(">", self.splits, 1), self.loop("merge", self.ntask, self.merge, "parallel"))
            out = seq([tasks, merge])
            for buf in (self.pacc, self.pl, self.pm):
                out = Allocate(buf, out)
        if self.dot:
            out = Allocate(self.kbf, Allocate(self.vbf, seq([*self.to_bf16(), out])))
        return out

    def to_bf16(self) -> list[Stmt]:
        """The keys and values rounded to bfloat16 once a call: ``kbf[b, kv head, key]`` (a
        key's pairs of dims side by side, as the scores read them) and ``vbf[b, kv head, pair
        of keys, column]`` (the two keys' values of a column side by side; past the last key the
        last again, whose probability is 0)."""
        nbk = sym.mul(self.nb, self.nkv)
        pairs = self.vbf.shape[2]

        def key(x: SymVar) -> Stmt:
            b, hk, j = sym.floordiv(x, sym.mul(self.nkv, self.skv)), sym.floormod(sym.floordiv(x, self.skv), self.nkv), sym.floormod(x, self.skv)
            return self.loop("kbf_d", self.hd, lambda d: block(BLOCK_PREFIX + "kbf", Store(self.kbf, (b, hk, j, d), _ld(self.k, b, j, hk, d))), "vectorized")

        def pair(x: SymVar) -> Stmt:
            b, hk, t = sym.floordiv(x, sym.mul(self.nkv, pairs)), sym.floormod(sym.floordiv(x, pairs), self.nkv), sym.floormod(x, pairs)

            def col(e: SymVar) -> Stmt:
                two = [Store(self.vbf, (b, hk, t, e, c), _ld(self.v, b, self.key(sym.add(sym.mul(t, 2), c)), hk, e)) for c in (0, 1)]
                return block(BLOCK_PREFIX + "vbf", seq(two))

            return self.loop("vbf_e", self.hdv, col, "vectorized")

        return [self.loop("kbf", sym.mul(nbk, self.skv), key, "parallel"), self.loop("vbf", sym.mul(nbk, pairs), pair, "parallel")]

    def at_task(self, t: Dim) -> None:
        """Set the batch, kv head and first row of task ``t`` (splits apart)."""
        self.b = sym.floordiv(t, sym.mul(self.nkv, self.nqb))
        self.hk = sym.floormod(sym.floordiv(t, self.nqb), self.nkv)
        self.row0 = sym.mul(sym.floormod(t, self.nqb), self.lanes)

    def task(self, tv: SymVar) -> Stmt:
        self.at_task(sym.floordiv(tv, self.splits) if self.split else tv)
        inf = self.c(-math.inf)
        blocks = self.key_blocks()
        first: Dim = 0
        if self.split:  # this task's range of the key blocks
            chunk = sym.ceildiv(blocks, self.splits)
            first = sym.mul(sym.floormod(tv, self.splits), chunk)
            blocks = sym.max_(0, sym.sub(sym.min_(blocks, sym.add(first, chunk)), first))
        final: Stmt = self.loop("out_r", self.lanes, self.store_row)
        if self.split:
            final = IfThenElse(binary("==", self.splits, 1), final, self.store_part(tv))
        if self.dot:
            fill = self.loop("qt_i", self.hd // 2, lambda i: self.rows_loop("q", lambda r: seq([self.fill_q(sym.add(sym.mul(i, 2), c), r) for c in (0, 1)])))
        else:
            fill = self.loop("qt_d", self.hd, lambda d: self.rows_loop("q", lambda r: self.fill_q(d, r)))
        steps = [
            fill,
            self.rows_loop("m_init", lambda r: Store(self.m, (r,), inf)),
            self.rows_loop("l_init", lambda r: self.zero(self.l, r)),
            self.acc_init(),
            self.loop("kb", blocks, lambda kb: self.key_block(sym.add(first, kb))),
            final,
        ]
        body: Stmt = seq(steps)
        for buf in (self.alpha, self.mx, self.l, self.m, self.s, self.acc_buf, self.qt, *([self.key_bias] if self.key_bias is not None else [])):
            body = Allocate(buf, body)
        return body

    def acc_init(self) -> Stmt:
        """Every accumulator 0."""
        if self.by_columns:
            cols = sym.mul(self.ctiles, self.cvec * self.vl)
            return self.loop("acc_r", self.lanes, lambda r: self.loop("acc_e", cols, lambda e: block(BLOCK_PREFIX + "acc_init", self.zero(self.acc_buf, r, e)), "vectorized"))
        return self.loop("acc_e", sym.mul(self.etiles, self.et), lambda e: self.rows_loop("acc_init", lambda r: self.zero(self.acc_buf, e, r)))

    def zero(self, buf: Buffer, *idx: Dim) -> Stmt:
        return Store(buf, idx, self.c(0.0))

    def fill_q(self, d: Dim, r: SymVar) -> Stmt:
        i, h = self.lane(r)
        at = (sym.floordiv(d, 2), r, sym.floormod(d, 2)) if self.dot else (d, r)
        return Store(self.qt, at, binary("*", self.up(_ld(self.q, self.b, i, h, d)), self.scale))

    def key_blocks(self) -> Dim:
        """How many blocks of keys the task's rows see."""
        if not self.causal:
            return _ceil_div(self.skv, BK)
        last = sym.min_(sym.add(self.row0, self.lanes - 1), sym.sub(self.rows, 1))
        end = sym.add(sym.floordiv(last, self.group), sym.add(sym.sub(self.skv, self.sq), 1))
        return _ceil_div(sym.max_(0, sym.min_(end, self.skv)), BK)

    def key_block(self, kb: Dim) -> Stmt:
        j0 = sym.mul(kb, BK)
        tiles = sym.min_(BK // self.jt, _ceil_div(sym.sub(self.skv, j0), self.jt))  # the last block stops at the last tile of keys
        keys = sym.mul(tiles, self.jt)
        # the values are added for the keys that exist only (the tile's past the last have
        # probability 0): their loads need no clamp, and the key is the loop's own counter
        seen = sym.min_(keys, sym.sub(self.skv, j0))
        self.key_bias_j0 = j0
        steps = [] if self.key_bias is None else [self.key_biases(j0, keys)]
        steps += [
            self.rows_loop("mx_init", lambda r: Store(self.mx, (r,), _ld(self.m, r))),
            self.loop("st_j", tiles, lambda jt: self.score_tile(j0, jt)),  # and the new maximum
            self.rows_loop("alpha", self.alpha_of),
            self.rows_loop("l_scale", lambda r: self.accumulate(self.l, "*", _ld(self.alpha, r), r)),
            self.rows_loop("m_set", lambda r: Store(self.m, (r,), _ld(self.mx, r))),
            self.loop("p_j", keys, lambda j: self.rows_loop("p", lambda r: self.prob(j, r))),  # and their sum
            self.value_rows(j0, seen) if self.by_columns else self.loop("pv_e", self.etiles, lambda e: self.value_tile(j0, e, seen)),
        ]
        return seq(steps)

    def accumulate(self, buf: Buffer, op: str, value: Scalar, *idx: Dim) -> Stmt:
        """``buf[idx] = buf[idx] op value``."""
        return Store(buf, idx, binary(op, _ld(buf, *idx), value))

    def score_tile(self, j0: Dim, jt: SymVar) -> Stmt:
        """Scores of keys ``j0 + jt * JT ...`` in a register tile ``st``."""
        st = Buffer(f"attention_st{self.tag}", (self.jt, self.lanes), self.acc)
        first = sym.add(j0, sym.mul(jt, self.jt))

        def tile(body: TileBody) -> Stmt:
            return self.tile_loop("st", self.jt, body)

        def update(ji: SymVar, r: SymVar, d: SymVar) -> Stmt:
            kval = self.up(_ld(self.k, self.b, self.key(sym.add(first, ji)), self.hk, d))
            return Store(st, (ji, r), binary("+", _ld(st, ji, r), binary("*", kval, _ld(self.qt, d, r))))

        def update_pair(ji: SymVar, r: SymVar, i: SymVar) -> Stmt:
            """Dims ``2 i``, ``2 i + 1`` of the key and the rows' queries: one ``dot_bf16x2``."""
            key = (self.b, self.hk, self.key(sym.add(first, ji)))
            ks = (_ld(self.kbf, *key, sym.mul(i, 2)), _ld(self.kbf, *key, sym.add(sym.mul(i, 2), 1)))
            return Store(st, (ji, r), Intrin(DOT_BF16X2, (_ld(st, ji, r), _ld(self.qt, i, r, 0), _ld(self.qt, i, r, 1), *ks), self.acc))

        def put(ji: SymVar, r: SymVar) -> Stmt:
            """The score stored, and the row's running maximum taken with it (one pass over the
            scores fewer than a loop of its own)."""
            j = sym.add(sym.mul(jt, self.jt), ji)
            return seq([Store(self.s, (j, r), self.masked(_ld(st, ji, r), sym.add(first, ji), r)), self.accumulate(self.mx, "max", _ld(self.s, j, r), r)])

        steps = [
            tile(lambda ji, r: self.zero(st, ji, r)),
            self.loop("qk_i", self.hd // 2, lambda i: tile(lambda ji, r: update_pair(ji, r, i)))
            if self.dot
            else self.loop("qk_d", self.hd, lambda d: tile(lambda ji, r: update(ji, r, d))),
            tile(put),
        ]
        return Allocate(st, seq(steps))

    def masked(self, score: Scalar, j: Dim, r: SymVar) -> Scalar:
        """The score of key ``j`` for row ``r`` after the mask: ``-inf`` where it is not seen."""
        i, h = self.lane(r)
        conds: list[Scalar] = [binary("<", j, self.skv)]
        if self.causal:
            conds = [binary("<=", j, sym.add(i, sym.sub(self.skv, self.sq)))]
        if self.key_bias is not None:  # the block's bias of key j, the same for every row
            bias = _ld(self.key_bias, sym.sub(j, self.key_bias_j0))
            return Select(binary("==", bias, self.c(-math.inf)), self.c(-math.inf), binary("+", score, bias), self.acc)
        value = score
        mask = self.mask
        if mask is not None:
            target = (self.nb, self.nh, self.sq, self.skv)
            mval = _ld(mask, *bcast_index((self.b, h, i, self.key(j)), mask.shape, target))
            if mask.dtype == "bool":
                conds.append(mval)
            else:
                value = binary("+", value, self.up(mval))
        cond = conds[0]
        for x in conds[1:]:
            cond = binary("and", cond, x)
        return Select(cond, value, self.c(-math.inf), self.acc)

    def row_invariant_mask(self) -> bool:
        """The mask (with no causal mask) is the same for every row of a task: broadcast over
        the heads and the queries (a padding mask, ``[b, 1, 1, kv]``)."""
        m = self.mask
        return m is not None and not self.causal and len(m.shape) == 4 and sym.prove_eq(m.shape[1], 1) and sym.prove_eq(m.shape[2], 1)

    def key_biases(self, j0: Dim, keys: Dim) -> Stmt:
        """``key_bias[j]``: the mask's bias of key ``j0 + j`` (a float mask's value; a bool
        mask's 0 where it keeps the key; -inf where it does not and past the last key), once a
        block rather than once a row (the rows' vector loop would load and select it again for
        every score: a [b, 1, 1, kv] bool mask at MiniLM's (8, 256), 2 threads, 7.7 -> 6.0 ms a
        call). A score whose bias is -inf is -inf (whatever the score), else score + bias."""
        out, mask = self.key_bias, self.mask
        assert out is not None and mask is not None

        def one(j: SymVar) -> Stmt:
            key = sym.add(j0, j)
            mval = _ld(mask, *bcast_index((self.b, 0, 0, self.key(key)), mask.shape, (self.nb, self.nh, self.sq, self.skv)))
            given = Select(mval, self.c(0.0), self.c(-math.inf), self.acc) if mask.dtype == "bool" else self.up(mval)
            bias = Select(binary("<", key, self.skv), given, self.c(-math.inf), self.acc)
            return block(BLOCK_PREFIX + "key_bias", Store(out, (j,), bias))

        return self.loop("kbias_j", keys, one, "vectorized")

    def alpha_of(self, r: SymVar) -> Stmt:
        """How much the running sums shrink as the max grows (1 while nothing was seen)."""
        unseen = binary("==", _ld(self.mx, r), self.c(-math.inf))
        shrink = Intrin("exp", (binary("-", _ld(self.m, r), _ld(self.mx, r)),), self.acc)
        return Store(self.alpha, (r,), Select(unseen, self.c(1.0), shrink, self.acc))

    def prob(self, j: SymVar, r: SymVar) -> Stmt:
        """Key ``j``'s probability for row ``r`` into the scores, and added to the row's sum (in
        the order of the keys, as a pass of its own would)."""
        unseen = binary("==", _ld(self.m, r), self.c(-math.inf))
        p = Intrin("exp", (binary("-", _ld(self.s, j, r), _ld(self.m, r)),), self.acc)
        return seq([Store(self.s, (j, r), Select(unseen, self.c(0.0), p, self.acc)), self.accumulate(self.l, "+", _ld(self.s, j, r), r)])

    def value_tile(self, j0: Dim, et: SymVar, keys: Dim) -> Stmt:
        """``acc[et * ET ...] = alpha * acc + p @ v`` through a register tile ``at``."""
        at = Buffer(f"attention_at{self.tag}", (self.et, self.lanes), self.acc)
        e0 = sym.mul(et, self.et)

        def tile(body: TileBody) -> Stmt:
            return self.tile_loop("at", self.et, body)

        def update(ei: SymVar, r: SymVar, j: SymVar) -> Stmt:
            vval = self.up(_ld(self.v, self.b, sym.add(j0, j), self.hk, self.column(sym.add(e0, ei))))
            return Store(at, (ei, r), binary("+", _ld(at, ei, r), binary("*", _ld(self.s, j, r), vval)))

        def update_pair(ei: SymVar, r: SymVar, t: SymVar) -> Stmt:
            """Keys ``2 t``, ``2 t + 1`` of the block: one ``dot_bf16x2`` of their probabilities
            (rounded to bfloat16 as they are read) and their values of the column."""
            at_col = (self.b, self.hk, sym.add(sym.floordiv(j0, 2), t), self.column(sym.add(e0, ei)))
            vs = (_ld(self.vbf, *at_col, 0), _ld(self.vbf, *at_col, 1))
            ps = (Cast("bfloat16", _ld(self.s, sym.add(sym.mul(t, 2), c), r)) for c in (0, 1))
            return Store(at, (ei, r), Intrin(DOT_BF16X2, (_ld(at, ei, r), *ps, *vs), self.acc))

        def rescaled(ei: SymVar, r: SymVar) -> Stmt:
            return Store(at, (ei, r), binary("*", _ld(self.acc_buf, sym.add(e0, ei), r), _ld(self.alpha, r)))

        steps = [
            tile(rescaled),
            self.loop("pv_t", _ceil_div(keys, 2), lambda t: tile(lambda ei, r: update_pair(ei, r, t)))
            if self.dot
            else self.loop("pv_j", keys, lambda j: tile(lambda ei, r: update(ei, r, j))),
            tile(lambda ei, r: Store(self.acc_buf, (sym.add(e0, ei), r), _ld(at, ei, r))),
        ]
        return Allocate(at, seq(steps))

    def value_rows(self, j0: Dim, keys: Dim) -> Stmt:
        """``acc[r] = alpha[r] * acc[r] + sum_j p[j, r] * v[j]`` row by row, the values' columns
        as the lanes: a register tile ``av`` of ``cvec`` vectors of columns, each key's values
        loaded once per row and its probability broadcast. With the rows as the lanes (the
        wide copy's ``value_tile``) a task of few rows (a decoding step's 3 query heads of a
        kv head in 8 lanes) spent one broadcast and one multiply-add of mostly idle lanes per
        key and column; here a key costs a row ``cvec`` multiply-adds of full vectors (SmolLM2's
        head dim 64 in 16 lanes: 4, not 64). Rows past the task's last are not computed."""
        VL, CV = self.vl, self.cvec
        av = Buffer(f"attention_av{self.tag}", (CV, VL), self.acc)
        nrows = sym.min_(self.lanes, sym.sub(self.rows, self.row0))

        def row(r: SymVar) -> Stmt:
            def ctile(ct: SymVar) -> Stmt:
                def col(c: Dim, el: Dim) -> Dim:
                    return sym.add(sym.mul(ct, CV * VL), sym.add(sym.mul(c, VL), el))

                def tile(name: str, body: TileBody) -> Stmt:
                    """An unrolled loop over the tile's vectors, each a vector loop over its columns."""
                    return self.loop(name, CV, lambda c: self.loop(f"{name}_l", VL, lambda el: block(BLOCK_PREFIX + name, body(c, el)), "vectorized"), "unrolled")

                def add(c: SymVar, el: SymVar, j: SymVar) -> Stmt:
                    vval = self.up(_ld(self.v, self.b, sym.add(j0, j), self.hk, self.column(col(c, el))))
                    return Store(av, (c, el), binary("+", _ld(av, c, el), binary("*", _ld(self.s, j, r), vval)))

                steps = [
                    tile("av0", lambda c, el: Store(av, (c, el), binary("*", _ld(self.acc_buf, r, col(c, el)), _ld(self.alpha, r)))),
                    self.loop("pvc_j", keys, lambda j: tile("av", lambda c, el: add(c, el, j))),
                    tile("av1", lambda c, el: Store(self.acc_buf, (r, col(c, el)), _ld(av, c, el))),
                ]
                return Allocate(av, seq(steps))

            return self.loop("pvc_ct", self.ctiles, ctile)

        return self.loop("pvc_r", nrows, row)

    def store_row(self, r: SymVar) -> Stmt:
        """Row ``r`` of the task into the output (rows past the last one are skipped)."""
        i, h = self.lane(r)
        valid = binary("<", sym.add(self.row0, r), self.rows)
        total = _ld(self.l, r)
        inv = Select(binary(">", total, self.c(0.0)), binary("/", self.c(1.0), total), self.c(0.0), self.acc)

        def put(e: SymVar) -> Stmt:
            value = binary("*", _ld(self.acc_buf, *self.acc_at(e, r)), inv)
            return block(BLOCK_PREFIX + "out", Store(self.out, (self.b, i, h, e), convert(value, self.out.dtype)))

        return IfThenElse(valid, self.loop("out_e", self.hdv, put, "vectorized"))

    def store_part(self, tv: SymVar) -> Stmt:
        """Split task ``tv``'s running max, sum and accumulator into the scratch."""
        return seq(
            [
                self.rows_loop("pm", lambda r: Store(self.pm, (tv, r), _ld(self.m, r))),
                self.rows_loop("pl", lambda r: Store(self.pl, (tv, r), _ld(self.l, r))),
                self.loop("pacc_e", self.hdv, lambda e: self.rows_loop("pacc", lambda r: Store(self.pacc, (tv, e, r), _ld(self.acc_buf, *self.acc_at(e, r))))),
            ]
        )

    def merge(self, t: SymVar) -> Stmt:
        """Task ``t``'s rows from its splits: ``M = max m_s``, ``w_s = exp(m_s - M)`` (0 for a
        split that saw no key), ``out = sum w_s acc_s / sum w_s l_s`` (0 where no key was seen)."""
        self.at_task(t)
        R, acc = self.lanes, self.acc
        gm = Buffer(f"attention_gm{self.tag}", (R,), acc)
        gl = Buffer(f"attention_gl{self.tag}", (R,), acc)
        gw = Buffer(f"attention_gw{self.tag}", (MAX_SPLITS, R), acc)
        ga = Buffer(f"attention_ga{self.tag}", (self.hdv, R), acc)

        def part(s: SymVar) -> Dim:
            return sym.add(sym.mul(t, self.splits), s)

        def weight(s: SymVar, r: SymVar) -> Stmt:
            ms = _ld(self.pm, part(s), r)
            w = Intrin("exp", (binary("-", ms, _ld(gm, r)),), acc)
            return Store(gw, (s, r), Select(binary("==", ms, self.c(-math.inf)), self.c(0.0), w, acc))

        def put(r: SymVar) -> Stmt:
            i, h = self.lane(r)

            def one(e: SymVar) -> Stmt:
                value = binary("*", _ld(ga, e, r), _ld(gl, r))
                return block(BLOCK_PREFIX + "out", Store(self.out, (self.b, i, h, e), convert(value, self.out.dtype)))

            return IfThenElse(binary("<", sym.add(self.row0, r), self.rows), self.loop("mg_out_e", self.hdv, one, "vectorized"))

        steps = [
            self.rows_loop("mg_m0", lambda r: Store(gm, (r,), self.c(-math.inf))),
            self.loop("mg_m_s", self.splits, lambda s: self.rows_loop("mg_m", lambda r: self.accumulate(gm, "max", _ld(self.pm, part(s), r), r))),
            self.loop("mg_w_s", self.splits, lambda s: self.rows_loop("mg_w", lambda r: weight(s, r))),
            self.rows_loop("mg_l0", lambda r: self.zero(gl, r)),
            self.loop("mg_l_s", self.splits, lambda s: self.rows_loop("mg_l", lambda r: self.accumulate(gl, "+", binary("*", _ld(self.pl, part(s), r), _ld(gw, s, r)), r))),
            self.rows_loop("mg_inv", lambda r: Store(gl, (r,), Select(binary(">", _ld(gl, r), self.c(0.0)), binary("/", self.c(1.0), _ld(gl, r)), self.c(0.0), acc))),
            self.loop("mg_a0_e", self.hdv, lambda e: self.rows_loop("mg_a0", lambda r: self.zero(ga, e, r))),
            self.loop(
                "mg_a_s",
                self.splits,
                lambda s: self.loop(
                    "mg_a_e", self.hdv, lambda e: self.rows_loop("mg_a", lambda r: self.accumulate(ga, "+", binary("*", _ld(self.pacc, part(s), e, r), _ld(gw, s, r)), e, r))
                ),
            ),
            self.loop("mg_out_r", self.lanes, put),
        ]
        body: Stmt = seq(steps)
        for buf in (ga, gw, gl, gm):
            body = Allocate(buf, body)
        return body


__all__ = ["attention_kernel", "BLOCK_PREFIX"]

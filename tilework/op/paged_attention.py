"""``paged_attention``: attention over a paged KV cache, one op per layer, as hand-built
TensorFuncs that read the pages.

    out = paged_attention(qkv, k_cache, v_cache, kv_len, page_table[, rotary], layer=i, kv_heads=n, rope_theta=t)
    rotary = paged_rotary(tokens, kv_len, head_dim=hd, rope_theta=t)

- ``qkv [b, s, heads + 2 * kv_heads, hd]``: this step's queries, keys and values side by side
  (the output of one fused projection, reshaped: heads ``[0, heads)`` are the queries, the next
  ``kv_heads`` the keys, the last ``kv_heads`` the values), for ``s`` new tokens of each of ``b``
  sequences. With ``rope_theta`` the op applies the rotary embedding to the queries and keys
  itself (as ``tilework.op.rotary_embedding`` does, "rotate half", at position ``kv_len[b] + t``);
  with None they are taken as they are.
- ``k_cache [layers, pages, kv_heads, hd, page]`` (keys transposed within a page, so the keys of a
  page are contiguous for each dim) and ``v_cache [layers, pages, page, kv_heads, hd]``: the page
  pool (``tilework.llm.kv_cache`` owns it). ``page`` tokens per page. The pool is float32,
  bfloat16 or float16 (``KV_DTYPES``, both caches the same): a 16-bit pool halves the bytes the
  attention reads; each new key and value is rounded once as it is written, and the kernels
  widen what they read to float32 in registers and compute in float32. (bfloat16 widens by a
  shift, which gcc vectorizes; gcc 12 leaves ``_Float16`` conversions scalar without
  AVX-512-FP16, so a float16 pool is slower than float32 there.)
- ``kv_len int32 [b]``: how many tokens each sequence has cached before this step;
  ``page_table int32 [b, p]``: the pool pages of each sequence in order (``p`` columns are enough
  for the longest sequence after the step; unused entries are never read).
- ``rotary float64 [b, s, 2, hd / 2]`` (optional, with ``rope_theta``): the cosines
  (``[:, :, 0]``) and sines of each new token's rotary angles, as ``paged_rotary`` computes them
  (the same loop, the same bits). The angles depend on the position only, so a step's layers can
  share one table: without it each layer's op computes them again (at batch 8, SmolLM2's 30
  layers spent 3-6% of a quantized decode step on them).

The result is ``[b, s, heads, hd]``. Taking the three together (rather than three tensors)
lets one projection feed the op with no copy in between: a slice of the projection's output
would be a kernel of its own.

The op first writes the new keys and values into the pages (positions ``kv_len[b] ..
kv_len[b] + s - 1``), then computes causal attention of each new token over the sequence's
cached and new tokens (query ``t`` sees positions ``<= kv_len[b] + t``) with an online softmax,
grouped-query heads sharing a kv head. Without ``rotary``, the cosines and sines of the rotary
angles are computed once per new token (``head_dim / 2`` of each, in float64, as its key is
appended) into a table that the rotation of its queries and keys reads. Writing into the pool
is the op's effect: it is kept though its result is what the graph uses, and each layer writes
its own slice of the pool.

Two kernels:

- **decode** (``s`` is 1): tasks over (sequence, split): a task reads whole pages, every kv
  head of each (a page's keys, and its values, are one contiguous block: scattered 2 KB pieces
  of it, one kv head's, read at about half the bandwidth). A sequence's pages are split across
  tasks while a step has fewer than ``TASKS`` of them (small batches; at least
  ``MIN_SPLIT_PAGES`` pages a split, at most ``MAX_SPLITS`` splits), and a final loop merges the
  splits' partial maxima, sums and accumulators. A task takes its pages ``CHUNK_PAGES`` at a
  time: the chunk's scores (a register tile of the group's heads x a page's keys per kv head,
  summed over the head dim), then one online-softmax update per head over the whole chunk
  (lane-wise maxima and sums, across the lanes once), then the values added into register
  tiles of ``ACC_REGISTERS`` accumulator vectors (columns of a group's accumulators, rescaled
  as they are loaded). Each step of a page's scores hints a cache line of the next page (keys
  and values), so the page's lines are on their way before it is read; and each step of the
  value pass hints lines of the page at the same place in the next task (``NEXT_TASK_HINTS``:
  under the static schedule, the task the thread runs next), so that memory keeps reading
  while the task computes from its cache, not only while it scores (measured at batch 8 and
  512 cached tokens with the pool out of cache: 1.05-1.12x). A sequence's queries are turned
  and scaled once, beside its new key, for all its splits.
- **prefill**: tasks over (sequence, kv head, block of ``LANES`` query rows, rows being tokens
  times the heads of the group), the rows as lanes, keys a page at a time, skipping pages no row
  of the block sees. A page's scores are summed in register tiles of a few keys x the rows, its
  values added in register tiles of a few head dims x the rows (``tile_rows``: within
  ``ACC_REGISTERS`` vectors; the accumulators rescaled as a tile loads them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from tilework.ir import sym
from tilework.ir.dtype import DTYPE_TABLE
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo
from tilework.ir.loop import (
    Allocate,
    Buffer,
    Cast,
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
)
from tilework.ir.sym import Dim, SymVar
from tilework.op.attention_kernel import VECTOR_BYTES
from tilework.op.base import InferCtx, Op, OpPattern, make_call, register, require_equal, tensor_arg
from tilework.op.calls import call_tensor
from tilework.op.kernel import block, free_syms, hand_kernel, known_tensor, out_tensor, seq, serial_var

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

KV_DTYPES = ("float32", "bfloat16", "float16")  # what the pages may hold
LANES = 16  # float32 lanes of an AVX-512 register: the rows of a prefill task
MAX_SPLITS = 16  # decode: most tasks one sequence's pages are split into
MIN_SPLIT_PAGES = 4  # decode: a split covers at least this many pages
TASKS = 32  # decode: splits are added while a step has fewer tasks than this (threads to feed)
CHUNK_PAGES = 16  # decode: pages whose scores a task holds at once (one softmax update each)
ACC_REGISTERS = 12  # decode: vector registers of accumulators a register tile keeps
PARTIALS = 2  # decode: partial sums of a key's score (independent chains) where they fit
MAX_TILE_HEADS = 6  # decode: a group of more heads than this is not unrolled into registers
LINE_BYTES = 64  # a cache line: the stride of the prefetch hints
NEXT_TASK_HINTS = True  # decode: the value pass hints the pages of the thread's next task


def _infer(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.args) not in (5, 6):
        raise ctx.error(f"takes 5 arguments and an optional rotary table, got {len(call.args)}")
    qkv, kc, vc, kv_len, pt = (tensor_arg(call, i, ctx) for i in range(5))
    rot = tensor_arg(call, 5, ctx) if len(call.args) == 6 else None
    for t, name, rank in ((qkv, "qkv", 4), (kc, "k_cache", 5), (vc, "v_cache", 5), (kv_len, "kv_len", 1), (pt, "page_table", 2)):
        if t.ndim not in (-1, rank):
            raise ctx.shape_error(f"{name} must have rank {rank}, got {t.ndim}")
    for t, name, dtype in ((qkv, "qkv", "float32"), (kv_len, "kv_len", "int32"), (pt, "page_table", "int32")):
        if t.dtype is not None and t.dtype != dtype:
            raise ctx.error(f"{name} must be {dtype}, got {t.dtype}")
    for t, name in ((kc, "k_cache"), (vc, "v_cache")):
        if t.dtype is not None and t.dtype not in KV_DTYPES:
            raise ctx.error(f"{name} must be one of {', '.join(KV_DTYPES)}, got {t.dtype}")
    if None not in (kc.dtype, vc.dtype) and kc.dtype != vc.dtype:
        raise ctx.error(f"k_cache and v_cache must have one dtype, got {kc.dtype} and {vc.dtype}")
    layer, nkv, theta = call.attrs["layer"], call.attrs["kv_heads"], call.attrs["rope_theta"]
    if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
        raise ctx.error(f"layer must be a non-negative int, got {layer!r}")
    if not isinstance(nkv, int) or isinstance(nkv, bool) or nkv < 1:
        raise ctx.error(f"kv_heads must be a positive int, got {nkv!r}")
    if theta is not None and (isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0):
        raise ctx.error(f"rope_theta must be a positive number or None, got {theta!r}")
    if rot is not None:
        if theta is None:
            raise ctx.error("a rotary table is given but rope_theta is None: nothing would be rotated")
        if rot.ndim not in (-1, 4):
            raise ctx.shape_error(f"rotary must have rank 4, got {rot.ndim}")
        if rot.dtype is not None and rot.dtype != "float64":
            raise ctx.error(f"rotary must be float64, got {rot.dtype}")
    if None in (qkv.shape, kc.shape, vc.shape, kv_len.shape, pt.shape):
        return TensorInfo(None, "float32", 4)
    assert qkv.shape and kc.shape and vc.shape and kv_len.shape and pt.shape
    b, s, all_heads, hd = qkv.shape
    if not isinstance(all_heads, int):
        raise ctx.shape_error(f"qkv's heads dim must be static, got {sym.to_str(all_heads)}")
    nh = all_heads - 2 * nkv
    if nh < nkv or nh % nkv:
        raise ctx.shape_error(f"qkv has {all_heads} heads: with {nkv} kv heads that leaves {nh} query heads, which must be a positive multiple of {nkv}")
    if theta is not None and isinstance(hd, int) and hd % 2:
        raise ctx.shape_error(f"head dim {hd} must be even to be rotated")
    page = kc.shape[4]
    require_equal(kc.shape[1], vc.shape[1], ctx, "pages of k_cache and v_cache")
    require_equal(kc.shape[2], nkv, ctx, "k_cache's kv heads")
    require_equal(kc.shape[3], hd, ctx, "k_cache's head dim")
    require_equal(vc.shape[2], page, ctx, "v_cache's page size and k_cache's")
    require_equal(vc.shape[3], nkv, ctx, "v_cache's kv heads")
    require_equal(vc.shape[4], hd, ctx, "v_cache's head dim")
    require_equal(kv_len.shape[0], b, ctx, "kv_len's length and the batch")
    require_equal(pt.shape[0], b, ctx, "page_table's rows and the batch")
    if isinstance(kc.shape[0], int) and layer >= kc.shape[0]:
        raise ctx.error(f"layer {layer} is out of range for a cache of {kc.shape[0]} layers")
    if rot is not None and rot.shape is not None:
        for i, (dim, want, what) in enumerate(zip(rot.shape, (b, s, 2, sym.floordiv(hd, 2)), ("the batch", "the new tokens", "cos and sin", "half the head dim"))):
            require_equal(dim, want, ctx, f"rotary's dim {i} and {what}")
    return TensorInfo((b, s, nh, hd), "float32")


def _legalize(call: Call, ctx: "LegalizeCtx") -> Expr:
    shapes = [known_tensor(a.info, call, f"argument {i}") for i, a in enumerate(call.args)]
    shape, dtype = out_tensor(call)
    scale, theta = call.attrs["scale"], call.attrs["rope_theta"]
    # every layer calls the same kernel (the layer is its sym param): built once per operand shapes
    vector_bytes = ctx.vector_bytes
    key = ("paged_attention", tuple(shapes), (shape, dtype), call.attrs["kv_heads"], scale, theta, vector_bytes)
    gv, func, layer = ctx.kernel_for(key, "paged_attention", lambda: _kernel(shapes, (shape, dtype), int(call.attrs["kv_heads"]), scale, theta, vector_bytes))
    sym_args = tuple(int(call.attrs["layer"]) if p is layer else p for p in func.sym_params)
    return call_tensor(gv, list(call.args), call.info, sym_args)


def _kernel(
    shapes: list[tuple[tuple[Dim, ...], str]], out_shape: tuple[tuple[Dim, ...], str], kv_heads: int, scale: float | None, theta: float | None, vector_bytes: int = VECTOR_BYTES
) -> tuple[TensorFunc, SymVar]:
    params = [Buffer(name, shape, dtype) for name, (shape, dtype) in zip(("qkv", "k_cache", "v_cache", "kv_len", "page_table", "rotary"), shapes)]
    out = Buffer("out", *out_shape)
    layer = SymVar("layer", 0, None)  # a sym param: every layer calls the same kernel
    kernel = _Decode if out_shape[0][1] == 1 else _Prefill
    qkv, kc, vc, kv_len, pt = params[:5]
    given = params[5] if len(params) == 6 else None
    body = kernel(qkv, kv_heads, kc, vc, kv_len, pt, out, layer, None if scale is None else float(scale), None if theta is None else float(theta), vector_bytes, given).body()
    buffers = [*params, out]
    func = hand_kernel([*buffers, *free_syms(body, buffers)], body, "opaque")
    return func.replace(attrs=func.attrs.with_(scheduled=True, schedule_rule="paged_attention")), layer  # its loops carry their kinds


register(Op("paged_attention", _infer, OpPattern.OPAQUE, attrs={"layer": 0, "kv_heads": 1, "rope_theta": None, "scale": None}, num_args=None, legalize=_legalize, effect=True))


def paged_attention(
    qkv: Expr,
    k_cache: Expr,
    v_cache: Expr,
    kv_len: Expr,
    page_table: Expr,
    layer: int,
    kv_heads: int,
    rope_theta: float | None = None,
    scale: float | None = None,
    rotary: Expr | None = None,
) -> Call:
    """See the module docstring; ``scale`` defaults to ``1 / sqrt(head_dim)``; ``rotary``: the
    step's ``paged_rotary`` table (else each call computes the angles itself)."""
    theta = None if rope_theta is None else float(rope_theta)
    args = [qkv, k_cache, v_cache, kv_len, page_table] + ([] if rotary is None else [rotary])
    return make_call("paged_attention", args, layer=layer, kv_heads=kv_heads, rope_theta=theta, scale=scale)


def _rotary_infer(call: Call, ctx: InferCtx) -> StructInfo:
    tokens, kv_len = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    for t, name, rank in ((tokens, "tokens", 2), (kv_len, "kv_len", 1)):
        if t.ndim not in (-1, rank):
            raise ctx.shape_error(f"{name} must have rank {rank}, got {t.ndim}")
    if kv_len.dtype is not None and kv_len.dtype != "int32":
        raise ctx.error(f"kv_len must be int32, got {kv_len.dtype}")
    hd, theta = call.attrs["head_dim"], call.attrs["rope_theta"]
    if not isinstance(hd, int) or isinstance(hd, bool) or hd < 2 or hd % 2:
        raise ctx.error(f"head_dim must be a positive even int, got {hd!r}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ctx.error(f"rope_theta must be a positive number, got {theta!r}")
    if tokens.shape is None or kv_len.shape is None:
        return TensorInfo(None, "float64", 4)
    b, s = tokens.shape
    require_equal(kv_len.shape[0], b, ctx, "kv_len's length and the batch")
    return TensorInfo((b, s, 2, hd // 2), "float64")


def _rotary_legalize(call: Call, ctx: "LegalizeCtx") -> Expr:
    (ts, td), (ks, kd) = (known_tensor(call.args[i].info, call, f"argument {i}") for i in range(2))
    shape, dtype = out_tensor(call)
    hd, theta = int(call.attrs["head_dim"]), float(call.attrs["rope_theta"])
    key = ("paged_rotary", (ts, td), (ks, kd), (shape, dtype), hd, theta)

    def build() -> tuple[TensorFunc, None]:
        tokens, kv_len, out = Buffer("tokens", ts, td), Buffer("kv_len", ks, kd), Buffer("out", shape, dtype)
        nb, sq = ts

        def loop(name: str, extent: Dim, body: Body, kind: str = "serial") -> For:
            var = serial_var(name, extent)
            return For(var, extent, body(var), kind)

        def token(bt: SymVar) -> Stmt:
            b, t = sym.floordiv(bt, sq), sym.floormod(bt, sq)
            return _angles(out, b, t, _i64(_ld(kv_len, b)), hd, theta, loop)

        body = loop("rotary_bt", sym.mul(nb, sq), token, "parallel")
        buffers = [tokens, kv_len, out]
        func = hand_kernel([*buffers, *free_syms(body, buffers)], body, "opaque")
        return func.replace(attrs=func.attrs.with_(scheduled=True, schedule_rule="paged_attention")), None

    gv, func, _ = ctx.kernel_for(key, "paged_rotary", build)
    return call_tensor(gv, list(call.args), call.info, tuple(func.sym_params))


register(Op("paged_rotary", _rotary_infer, OpPattern.OPAQUE, attrs={"head_dim": 0, "rope_theta": None}, num_args=2, legalize=_rotary_legalize))


def paged_rotary(tokens: Expr, kv_len: Expr, head_dim: int, rope_theta: float) -> Call:
    """The cosines and sines of the rotary angles of a step's new tokens ``[b, s]`` (their
    values are not read; token ``t`` of sequence ``b`` is at position ``kv_len[b] + t``),
    ``[b, s, 2, head_dim / 2]`` float64: what ``paged_attention`` computes in each call, once
    for all the layers of a step. See the module docstring."""
    return make_call("paged_rotary", [tokens, kv_len], head_dim=head_dim, rope_theta=float(rope_theta))


# -- the kernels -----------------------------------------------------------------------------

Body = Callable[[SymVar], Stmt]
F32 = "float32"


def _i64(x: Scalar) -> Scalar:
    return Cast("int64", x)


def _ld(buf: Buffer, *idx: Scalar) -> Load:
    return Load(buf, tuple(idx))


def _f32(x: Load) -> Scalar:
    """A cached key or value as float32 (widened in registers from a 16-bit pool)."""
    return x if x.dtype == F32 else Cast(F32, x)


def _c(v: float) -> Scalar:
    return const(v, F32)


def _angles(trig: Buffer, b: Dim, t: Dim, cached: Scalar, hd: Dim, theta: float, loop: Callable[[str, Dim, Body], For]) -> Stmt:
    """The cosine and sine of token ``t``'s rotary angles (one per pair of channels, at position
    ``cached + t``) into ``trig[b, t]``, in float64: a token's heads share them. One home for
    both kernels that compute them (the attention's scratch and ``paged_rotary``'s table)."""
    f64 = "float64"
    step = -2.0 * math.log(theta)
    scale = const(step / hd, f64) if isinstance(hd, int) else binary("/", const(step, f64), Cast(f64, hd))

    def one(j: SymVar) -> Stmt:
        angle = binary("*", Cast(f64, binary("+", cached, t)), Intrin("exp", (binary("*", Cast(f64, j), scale),), f64))
        return block("pa_angle", seq([Store(trig, (b, t, 0, j), Intrin("cos", (angle,), f64)), Store(trig, (b, t, 1, j), Intrin("sin", (angle,), f64))]))

    return loop("angle_j", sym.floordiv(hd, 2), one)


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
        base, n = name, 0
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        var = serial_var(name, extent)
        return For(var, extent, body(var), kind)

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
                    return block("paged_append", Store(self.kc, (self.layer, page, kh, d, off), value))

                def value(d: SymVar) -> Stmt:
                    return block("paged_append_v", Store(self.vc, (self.layer, page, off, kh, d), self.v_at(b, t, kh, d)))

                return seq([self.rotated_dims("append_d", b, t, sym.add(self.nh, kh), key), self.loop("append_v", self.hd, value, "vectorized")])

            steps = [self.loop("append_h", self.nkv, put)] + ([] if queries is None else [queries(b, t)])
            if self.theta is None or self.given:
                return seq(steps)
            return seq([_angles(self.trig, b, t, self.cached(b), self.hd, self.theta, self.loop), *steps])

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
        self.qr = Buffer("pa_qr", (self.nb, self.nh, self.hd), F32)  # queries turned and scaled, once a sequence
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
        return PARTIALS if hd % PARTIALS == 0 and PARTIALS * tile <= ACC_REGISTERS else 1

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
        stores = [Store(hint, (0,), Intrin("prefetch", (_ld(c, self.layer, page, 0, 0, sym.mul(line, per_line)),), F32)) for c in (self.kc, self.vc)]
        return Allocate(hint, block(name, seq(stores)))

    def task(self, tv: SymVar) -> Stmt:
        b = sym.floordiv(tv, self.splits)
        sp = sym.floormod(tv, self.splits)
        total = binary("+", self.cached(b), 1)
        NH, NKV, G, HD, P, CH = self.nh, self.nkv, self.group, self.hd, self.page, CHUNK_PAGES
        EC = self.acc_columns()
        tile = "unrolled" if isinstance(G, int) and G <= MAX_TILE_HEADS else "serial"
        sc = Buffer("pa_sc", (NH, CH * P), F32)  # the chunk's scores, then its probabilities
        C = self.partials()
        s = Buffer("pa_s", (C, G, P), F32)  # one page's partial scores of a kv head's group: a register tile
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
        vsteps = sym.mul(sym.mul(sym.floordiv(HD, EC), NKV), P)  # a page's value steps
        per_vstep = -(-lines // vsteps) if NEXT_TASK_HINTS and lines is not None and isinstance(vsteps, int) else 0

        def next_task_page(ci: Dim, pc: Dim, page: Scalar) -> Scalar:
            """The pool page of the next task's page ``pc`` of chunk ``ci`` (``page`` where
            that task has none there, or there is no next task)."""
            npidx = sym.add(sym.add(nsplit0, sym.mul(ci, CH)), pc)
            nvalid = binary("and", binary("<", sym.add(tv, 1), tasks), binary("and", binary("<", npidx, self.width), binary("<", sym.mul(npidx, P), ntotal)))
            return Select(nvalid, _i64(_ld(self.pt, nb_, sym.min_(npidx, sym.sub(self.width, 1)))), page, "int64")
        steps = sym.mul(NKV, sym.floordiv(HD, C))  # a page's scoring steps: static where lines is
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
                        """Dims ``dd * C .. dd * C + C - 1`` of the group's keys into the ``C``
                        partial scores, and lines of the next page hinted: the page's
                        ``NKV * HD / C`` steps spread its lines (the page itself again when it is
                        the last)."""
                        step = sym.add(sym.mul(kh, sym.floordiv(HD, C)), dd)
                        hinted = [self.hint(ahead, sym.min_(sym.add(sym.mul(step, per_step), r), (lines or 1) - 1), "pa_hint") for r in range(per_step)]

                        def part(c: int) -> Stmt:
                            d = sym.add(sym.mul(dd, C), c)

                            def one(g: SymVar) -> Stmt:
                                q = _ld(self.qr, b, sym.add(sym.mul(kh, G), g), d)
                                return self.loop("s_j", P, lambda j: block("pa_score", Store(s, (c, g, j), binary("+", _ld(s, c, g, j), binary("*", q, _f32(_ld(self.kc, self.layer, page, kh, d, j)))))), "vectorized")

                            return self.loop("s_g", G, one, tile)

                        return seq([*hinted, *(part(c) for c in range(C))])

                    def put(g: SymVar) -> Stmt:
                        def one(j: SymVar) -> Stmt:
                            seen_j = binary("<", sym.add(first, j), total)
                            score: Scalar = _ld(s, 0, g, j)
                            for c in range(1, C):
                                score = binary("+", score, _ld(s, c, g, j))
                            return block("pa_mask", Store(sc, (sym.add(sym.mul(kh, G), g), sym.add(sym.mul(pc, P), j)), Select(seen_j, score, _c(-math.inf), F32)))

                        return self.loop("put_j", P, one, "vectorized")

                    zero = self.loop("s0_g", sym.mul(C, G), lambda cg: self.loop("s0_j", P, lambda j: block("pa_s0", Store(s, (sym.floordiv(cg, G), sym.floormod(cg, G), j), _c(0.0))), "vectorized"), tile)
                    return seq([zero, self.loop("s_dd", sym.floordiv(HD, C), dims), self.loop("put_g", G, put, tile)])

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
                    pages("exp", lambda i: Store(sc, (h, i), Intrin("exp", (binary("-", _ld(sc, h, i), _ld(mx, 0)),), F32))),
                    lanes("sum0", 0.0),
                    pages("sum", lambda i: Store(lane, (sym.floormod(i, P),), binary("+", _ld(lane, sym.floormod(i, P)), _ld(sc, h, i)))),
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
                        def one(g: SymVar) -> Stmt:
                            p = _ld(sc, head(g), sym.add(sym.mul(pc, P), j))
                            return self.loop("pv_e", EC, lambda e: block("pa_pv", Store(a, (g, e), binary("+", _ld(a, g, e), binary("*", p, _f32(_ld(self.vc, self.layer, page, j, kh, sym.add(col, e))))))), "vectorized")

                        vstep = sym.add(sym.mul(kc, P), j)
                        hinted = [self.hint(_ld(tnext, 0), sym.min_(sym.add(sym.mul(vstep, per_vstep), r), (lines or 1) - 1), "pa_thint") for r in range(per_vstep)]
                        return seq([*hinted, self.loop("pv_g", G, one, tile)])

                    body: Stmt = self.loop("pv_j", P, key)
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
        for buf in (tnext, nxt, a, acc, alpha, l, m, mx, lane, s, sc):
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
        return self.with_trig(seq([self.append(), self.loop("task", tasks, self.task, "parallel")]))

    def task(self, tv: SymVar) -> Stmt:
        per_seq = sym.mul(self.nkv, self.blocks)
        b = sym.floordiv(tv, per_seq)
        kh = sym.floormod(sym.floordiv(tv, self.blocks), self.nkv)
        row0 = sym.mul(sym.floormod(tv, self.blocks), LANES)
        G, HD, P, R = self.group, self.hd, self.page, LANES
        cached = self.cached(b)
        qt = Buffer("pp_qt", (HD, R), F32)
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
                return Store(qt, (d, r), binary("*", self.q_at(b, t, h, d), self.scale))

            return rows("q", one)

        last_t, _ = lane(R - 1)
        horizon = binary("+", cached, sym.add(last_t, 1))  # keys any row of the block sees

        def page_step(pi: SymVar) -> Stmt:
            first = sym.mul(pi, P)
            page = _i64(_ld(self.pt, b, pi))

            def scores(jt: SymVar) -> Stmt:
                """Keys ``jt * JT ..`` of the page against every row: a register tile of JT keys x
                the rows, summed over the head dim (independent chains), then stored."""

                def dim(d: SymVar) -> Stmt:
                    def key(j: SymVar) -> Stmt:
                        kv = _f32(_ld(self.kc, self.layer, page, kh, d, sym.add(sym.mul(jt, JT), j)))
                        return rows("score", lambda r: Store(t, (j, r), binary("+", _ld(t, j, r), binary("*", kv, _ld(qt, d, r)))))

                    return self.loop("qk_j", JT, key, "unrolled")

                return seq([
                    self.loop("t0_j", JT, lambda j: rows("t0", lambda r: Store(t, (j, r), _c(0.0))), "unrolled"),
                    self.loop("qk_d", HD, dim),
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
                        vv = _f32(_ld(self.vc, self.layer, page, j, kh, col(e)))
                        return rows("pv", lambda r: Store(a, (e, r), binary("+", _ld(a, e, r), binary("*", _ld(st, j, r), vv))))

                    return self.loop("pv_e", ET, dim, "unrolled")

                return seq([
                    self.loop("a0_e", ET, lambda e: rows("a0", lambda r: Store(a, (e, r), binary("*", _ld(acc, col(e), r), _ld(alpha, r)))), "unrolled"),
                    self.loop("pv_j", P, key),
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
            return IfThenElse(binary("<", first, horizon), seq(steps))

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
        for buf in (a, t, acc, alpha, mx, l, m, st, qt):
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


__all__ = ["paged_attention", "KV_DTYPES", "LANES", "MAX_SPLITS", "MIN_SPLIT_PAGES"]

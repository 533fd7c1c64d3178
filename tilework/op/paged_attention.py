"""``paged_attention``: attention over a paged KV cache, one op per layer, as hand-built
TensorFuncs that read the pages.

    out = paged_attention(qkv, k_cache, v_cache, kv_len, page_table[, rotary], layer=i, kv_heads=n, rope_theta=t[, rope_dim=r][, window=w][, softcap=c])
    rotary = paged_rotary(tokens, kv_len, head_dim=hd, rope_theta=t[, rope_dim=r][, rope_scaling=("linear", f) | ("yarn", ...) | ...])

- ``qkv [b, s, heads + 2 * kv_heads, hd]``: this step's queries, keys and values side by side
  (the output of one fused projection, reshaped: heads ``[0, heads)`` are the queries, the next
  ``kv_heads`` the keys, the last ``kv_heads`` the values), for ``s`` new tokens of each of ``b``
  sequences. With ``rope_theta`` the op applies the rotary embedding to the queries and keys
  itself (as ``tilework.op.rotary_embedding`` does, "rotate half", at position ``kv_len[b] + t``);
  with None they are taken as they are. ``rope_dim`` ``r`` (None: the head dim) turns the first
  ``r`` dims of each query and key head only (partial rotary embeddings, Phi-4-mini's: dim ``i <
  r / 2`` paired with ``i + r / 2``, the frequencies ``theta ** (-2 i / r)``), the others passed
  as they are, as transformers' ``partial_rotary_factor`` and llama.cpp's ``rope.dimension_count``
  below the head dim do; ``r`` is even and at most the head dim.
- ``k_cache [layers, pages, kv_heads, hd / w, page, w]`` and ``v_cache [layers, pages, page / w,
  kv_heads, hd, w]``: the page pool (``tilework.llm.kv_cache`` owns it), ``page`` tokens per page,
  in pairs of width ``w`` (``pair_width(dtype)``: 2 for bfloat16, else 1). Key ``j`` of a page,
  dim ``d``, is at ``k_cache[.., d // w, j, d % w]``: with ``w`` 1 a page's keys are contiguous
  for each dim; with 2 each key's pairs of dims ``2 i, 2 i + 1`` are side by side. Its value,
  dim ``e``, is at ``v_cache[.., j // w, kh, e, j % w]``: with 2 the values of keys ``2 u, 2 u + 1``
  are side by side. The pairs are what one ``vdpbf16ps`` lane takes (``dot_bf16x2``), so a
  bfloat16 pool is read with no shuffle. The pool is float32, bfloat16 or float16
  (``KV_DTYPES``, both caches the same): a 16-bit pool halves the bytes the attention reads;
  each new key and value is rounded once as it is written. From a bfloat16 pool the products
  are bfloat16 (the queries and probabilities rounded too, float32 sums: see
  ``paged_attention_kernel``); from the others they are float32 (gcc 12 leaves ``_Float16``
  conversions scalar without AVX-512-FP16, so a float16 pool is slower than float32 there).
- **An int8 pool** (``w`` 4, half a bfloat16 pool's bytes) keeps each key and each value
  quantized: its ``hd`` dims to int8 by one scale (the largest magnitude to 127, the scale
  rounded to bfloat16 and the bytes computed with it), written as the op appends the token.
  ``k_cache`` has one more row a kv head, ``[layers, pages, kv_heads, hd / 4 + 1, page, 4]``:
  key ``j``'s bytes are at ``[.., d // 4, j, d % 4]``, offset binary (the byte's bits as uint8
  are the int8 plus 128), and ``[.., hd / 4, j, :]`` holds the low and high bytes of its scale's
  bfloat16 and then of its value's; ``v_cache`` is the layout above with ``w`` 4 (plain int8).
  Decode multiplies bytes (``dot_u8i8x4``: one ``vpdpbusd`` a vector where the CPU has AVX-512
  VNNI): the queries quantized to int8 a head (their scale and the keys' offset applied to the
  sums), a page's probabilities times the values' scales quantized to uint8 a head (the
  largest to 255); prefill makes the sequences' pages bfloat16 pairs once and multiplies as
  from a bfloat16 pool.
- ``kv_len int32 [b]``: how many tokens each sequence has cached before this step;
  ``page_table int32 [b, p]``: the pool pages of each sequence in order (``p`` columns are enough
  for the longest sequence after the step; unused entries are never read).
- ``rotary float64 [b, s, 2, r / 2]`` (optional, with ``rope_theta``; ``r`` the rotated dims,
  ``rope_dim`` or the head dim): the cosines (``[:, :, 0]``) and sines of each new token's rotary
  angles, as ``paged_rotary`` with the same ``rope_dim`` computes them (the same loop, the same
  bits). The angles depend on the position only, so a step's layers can share one table:
  without it each layer's op computes them again (at batch 8, SmolLM2's 30 layers spent 3-6% of
  a quantized decode step on them). ``paged_rotary``'s ``rope_scaling``
  scales the frequencies (``("linear", factor)``, ``("llama3", factor, original_context,
  low_freq_factor, high_freq_factor)``, ``("yarn", factor, low, high, attention_factor)`` or
  ``("longrope", original_context, attention_factor, short_factors, long_factors)``, as
  transformers does; ``("freq_factors", factors)``, a divisor per frequency, as llama.cpp's
  ``rope_freqs``: ``paged_attention_base.angles``); the op's own angles, without a table,
  are unscaled.

The result is ``[b, s, heads, hd]``. Taking the three together (rather than three tensors)
lets one projection feed the op with no copy in between: a slice of the projection's output
would be a kernel of its own.

The op first writes the new keys and values into the pages (positions ``kv_len[b] ..
kv_len[b] + s - 1``), then computes causal attention of each new token over the sequence's
cached and new tokens (query ``t`` at position ``p = kv_len[b] + t`` sees positions ``<= p``; with
a ``window`` ``w``, a sliding window, those in ``(p - w, p]`` only: transformers' and llama.cpp's
sliding-window mask; every page stays in the pool, the pages wholly before a window are not
read) with an online softmax,
each score (scaled) soft-capped to ``c * tanh(score / c)`` where a ``softcap`` ``c`` is given
(Gemma 2's ``attn_logit_softcapping``),
grouped-query heads sharing a kv head. Without ``rotary``, the cosines and sines of the rotary
angles are computed once per new token (``r / 2`` of each, in float64, as its key is
appended) into a table that the rotation of its queries and keys reads. Writing into the pool
is the op's effect: it is kept though its result is what the graph uses, and each layer writes
its own slice of the pool.

The kernels are built by ``tilework.op.paged_attention_kernel`` (decode and prefill, and the
``paged_rotary`` table; see its docstring).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo
from tilework.op.base import InferCtx, Op, OpPattern, make_call, register, require_equal, tensor_arg
from tilework.op.calls import call_tensor
from tilework.op.kernel import known_tensor, out_tensor
from tilework.op.paged_attention_kernel import paged_attention_kernel, rotary_kernel

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

KV_DTYPES = ("float32", "bfloat16", "float16", "int8")  # what the pages may hold
KV_PAIRS = {"bfloat16": 2, "int8": 4}  # the pool's pair width by dtype (1 where not named): see pair_width
SCALE_ROWS = {"int8": 1}  # rows of scales after each kv head's keys (none where not named)


def pair_width(dtype: str) -> int:
    """The width ``w`` of the pairs a pool of ``dtype`` is stored in (the last dim of both
    caches; see the module docstring)."""
    return KV_PAIRS.get(dtype, 1)


def a_pool(dtype: str) -> str:
    """``dtype`` with its article, as the messages of a pool's groups name it ("an int8", "a
    bfloat16")."""
    return f"{'an' if dtype[:1] in tuple('aeiou') else 'a'} {dtype}"



def _infer(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.args) not in (5, 6):
        raise ctx.error(f"takes 5 arguments and an optional rotary table, got {len(call.args)}")
    qkv, kc, vc, kv_len, pt = (tensor_arg(call, i, ctx) for i in range(5))
    rot = tensor_arg(call, 5, ctx) if len(call.args) == 6 else None
    for t, name, rank in ((qkv, "qkv", 4), (kc, "k_cache", 6), (vc, "v_cache", 6), (kv_len, "kv_len", 1), (pt, "page_table", 2)):
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
    layer, nkv, theta, window = call.attrs["layer"], call.attrs["kv_heads"], call.attrs["rope_theta"], call.attrs["window"]
    cap = call.attrs["softcap"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0 or cap == float("inf")):
        raise ctx.error(f"softcap must be a positive finite number or None, got {cap!r}")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ctx.error(f"window must be a positive int or None, got {window!r}")
    if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
        raise ctx.error(f"layer must be a non-negative int, got {layer!r}")
    if not isinstance(nkv, int) or isinstance(nkv, bool) or nkv < 1:
        raise ctx.error(f"kv_heads must be a positive int, got {nkv!r}")
    if theta is not None and (isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0):
        raise ctx.error(f"rope_theta must be a positive number or None, got {theta!r}")
    rope_dim = call.attrs["rope_dim"]
    if rope_dim is not None:
        if not _even_dim(rope_dim):
            raise ctx.error(f"rope_dim must be a positive even int or None, got {rope_dim!r}")
        if theta is None:
            raise ctx.error("a rope_dim is given but rope_theta is None: nothing would be rotated")
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
    if theta is not None and rope_dim is None and isinstance(hd, int) and hd % 2:
        raise ctx.shape_error(f"head dim {hd} must be even to be rotated")
    if rope_dim is not None and isinstance(hd, int) and rope_dim > hd:
        raise ctx.shape_error(f"rope_dim {rope_dim} exceeds the head dim {hd}")
    page, pool = kc.shape[4], kc.dtype or vc.dtype
    w = kc.shape[5] if pool is None else pair_width(pool)  # unknown dtype: the pairs as given
    require_equal(kc.shape[5], w, ctx, f"k_cache's pair width (its last dim) for a {pool} pool")
    require_equal(vc.shape[5], w, ctx, f"v_cache's pair width (its last dim) for a {pool} pool")
    for dim, what in ((hd, "head dim"), (page, "page size")):
        if isinstance(w, int) and isinstance(dim, int) and dim % w:
            raise ctx.shape_error(f"{a_pool(str(pool))} pool stores groups of {w}: its {what} {dim} must be a multiple of {w}")
    rows = SCALE_ROWS.get(pool or "", 0)
    scales = f" + {rows} (the scales)" if rows else ""
    require_equal(kc.shape[1], vc.shape[1], ctx, "pages of k_cache and v_cache")
    require_equal(kc.shape[2], nkv, ctx, "k_cache's kv heads")
    require_equal(kc.shape[3], sym.add(sym.floordiv(hd, w), rows), ctx, f"k_cache's head dim / pair width{scales}")
    require_equal(vc.shape[2], sym.floordiv(page, w), ctx, "v_cache's page size / pair width and k_cache's page size")
    require_equal(vc.shape[3], nkv, ctx, "v_cache's kv heads")
    require_equal(vc.shape[4], hd, ctx, "v_cache's head dim")
    require_equal(kv_len.shape[0], b, ctx, "kv_len's length and the batch")
    require_equal(pt.shape[0], b, ctx, "page_table's rows and the batch")
    if isinstance(kc.shape[0], int) and layer >= kc.shape[0]:
        raise ctx.error(f"layer {layer} is out of range for a cache of {kc.shape[0]} layers")
    if rot is not None and rot.shape is not None:
        half, what = (sym.floordiv(hd, 2), "half the head dim") if rope_dim is None else (rope_dim // 2, f"half the rotated dims (rope_dim {rope_dim})")
        for i, (dim, want, what) in enumerate(zip(rot.shape, (b, s, 2, half), ("the batch", "the new tokens", "cos and sin", what))):
            require_equal(dim, want, ctx, f"rotary's dim {i} and {what}")
    return TensorInfo((b, s, nh, hd), "float32")


def _legalize(call: Call, ctx: "LegalizeCtx") -> Expr:
    shapes = [known_tensor(a.info, call, f"argument {i}") for i, a in enumerate(call.args)]
    shape, dtype = out_tensor(call)
    scale, theta, window, cap = call.attrs["scale"], call.attrs["rope_theta"], call.attrs["window"], call.attrs["softcap"]
    rope_dim = call.attrs["rope_dim"]
    if isinstance(rope_dim, int) and rope_dim == shapes[0][0][3]:  # every dim: the full rotation's kernel
        rope_dim = None
    # every layer calls the same kernel (the layer is its sym param): built once per operand
    # shapes (and window: a model's sliding-window layers share one kernel, its others another)
    vector_bytes = ctx.vector_bytes
    key = ("paged_attention", tuple(shapes), (shape, dtype), call.attrs["kv_heads"], scale, theta, vector_bytes, window, cap, rope_dim)
    gv, func, layer = ctx.kernel_for(key, "paged_attention", lambda: paged_attention_kernel(shapes, (shape, dtype), int(call.attrs["kv_heads"]), scale, theta, vector_bytes, window, cap, rope_dim))
    sym_args = tuple(int(call.attrs["layer"]) if p is layer else p for p in func.sym_params)
    return call_tensor(gv, list(call.args), call.info, sym_args)


register(Op("paged_attention", _infer, OpPattern.OPAQUE, attrs={"layer": 0, "kv_heads": 1, "rope_theta": None, "scale": None, "window": None, "softcap": None, "rope_dim": None}, num_args=None, legalize=_legalize, effect=True))


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
    window: int | None = None,
    softcap: float | None = None,
    rope_dim: int | None = None,
) -> Call:
    """See the module docstring; ``scale`` defaults to ``1 / sqrt(head_dim)``; ``rotary``: the
    step's ``paged_rotary`` table (else each call computes the angles itself); ``window``: the
    sliding window (None: every earlier key); ``softcap``: the scores' soft cap (None: none);
    ``rope_dim``: the dims of each query and key head that are turned, the first ones (None:
    all of them)."""
    theta = None if rope_theta is None else float(rope_theta)
    cap = softcap if softcap is None or isinstance(softcap, bool) else float(softcap)
    args = [qkv, k_cache, v_cache, kv_len, page_table] + ([] if rotary is None else [rotary])
    return make_call("paged_attention", args, layer=layer, kv_heads=kv_heads, rope_theta=theta, scale=scale, window=window, softcap=cap, rope_dim=rope_dim)


def _rotary_infer(call: Call, ctx: InferCtx) -> StructInfo:
    tokens, kv_len = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    for t, name, rank in ((tokens, "tokens", 2), (kv_len, "kv_len", 1)):
        if t.ndim not in (-1, rank):
            raise ctx.shape_error(f"{name} must have rank {rank}, got {t.ndim}")
    if kv_len.dtype is not None and kv_len.dtype != "int32":
        raise ctx.error(f"kv_len must be int32, got {kv_len.dtype}")
    hd, theta, rope_dim = call.attrs["head_dim"], call.attrs["rope_theta"], call.attrs["rope_dim"]
    if rope_dim is None and not _even_dim(hd):
        raise ctx.error(f"head_dim must be a positive even int, got {hd!r}")
    if rope_dim is not None:
        if not isinstance(hd, int) or isinstance(hd, bool) or hd < 1:
            raise ctx.error(f"head_dim must be a positive int, got {hd!r}")
        if not _even_dim(rope_dim) or rope_dim > hd:
            raise ctx.error(f"rope_dim must be a positive even int of at most head_dim ({hd}) or None, got {rope_dim!r}")
    dims = hd if rope_dim is None else rope_dim  # the rotated dims
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ctx.error(f"rope_theta must be a positive number, got {theta!r}")
    scaling = call.attrs["rope_scaling"]
    if scaling is not None and not _valid_scaling(scaling, dims):
        raise ctx.error(
            "rope_scaling must be None, ('linear', factor), ('llama3', factor, original_context, low_freq_factor, high_freq_factor) with high_freq_factor > low_freq_factor, "
            "('yarn', factor, low, high, attention_factor) with high != low, ('longrope', original_context, attention_factor, short_factors, long_factors) with rotated dims / 2 of each "
            "or ('freq_factors', factors) with rotated dims / 2 factors (the rotated dims: rope_dim, else head_dim), "
            f"with positive numbers (yarn's low and high: any), got {scaling!r}"
        )
    if tokens.shape is None or kv_len.shape is None:
        return TensorInfo(None, "float64", 4)
    b, s = tokens.shape
    require_equal(kv_len.shape[0], b, ctx, "kv_len's length and the batch")
    return TensorInfo((b, s, 2, dims // 2), "float64")


def _rotary_legalize(call: Call, ctx: "LegalizeCtx") -> Expr:
    (ts, td), (ks, kd) = (known_tensor(call.args[i].info, call, f"argument {i}") for i in range(2))
    shape, dtype = out_tensor(call)
    hd, theta, scaling = int(call.attrs["rope_dim"] or call.attrs["head_dim"]), float(call.attrs["rope_theta"]), call.attrs["rope_scaling"]
    key = ("paged_rotary", (ts, td), (ks, kd), (shape, dtype), hd, theta, scaling)  # hd: the rotated dims, all the table depends on

    gv, func, _ = ctx.kernel_for(key, "paged_rotary", lambda: (rotary_kernel((ts, td), (ks, kd), (shape, dtype), hd, theta, scaling), None))
    return call_tensor(gv, list(call.args), call.info, tuple(func.sym_params))


register(Op("paged_rotary", _rotary_infer, OpPattern.OPAQUE, attrs={"head_dim": 0, "rope_theta": None, "rope_scaling": None, "rope_dim": None}, num_args=2, legalize=_rotary_legalize))


def _even_dim(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 2 and x % 2 == 0


def _valid_scaling(s: object, hd: int) -> bool:
    def number(x: object) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    def positive(x: object) -> bool:
        return number(x) and x > 0  # type: ignore[operator]

    if not isinstance(s, tuple) or not s:
        return False
    if s[0] == "linear":
        return len(s) == 2 and positive(s[1])
    if s[0] == "yarn":
        return len(s) == 5 and positive(s[1]) and positive(s[4]) and number(s[2]) and number(s[3]) and s[2] != s[3]
    if s[0] == "freq_factors":
        return len(s) == 2 and isinstance(s[1], tuple) and len(s[1]) == hd // 2 and all(positive(x) for x in s[1])
    if s[0] == "longrope":
        return len(s) == 5 and positive(s[1]) and positive(s[2]) and all(isinstance(f, tuple) and len(f) == hd // 2 and all(positive(x) for x in f) for f in s[3:])
    return s[0] == "llama3" and len(s) == 5 and all(positive(x) for x in s[1:]) and s[4] > s[3]


def paged_rotary(tokens: Expr, kv_len: Expr, head_dim: int, rope_theta: float, rope_scaling: tuple[Any, ...] | None = None, rope_dim: int | None = None) -> Call:
    """The cosines and sines of the rotary angles of a step's new tokens ``[b, s]`` (their
    values are not read; token ``t`` of sequence ``b`` is at position ``kv_len[b] + t``),
    ``[b, s, 2, r / 2]`` float64 for ``r`` rotated dims (``rope_dim``, at most ``head_dim``;
    None: ``head_dim``), the frequencies ``theta ** (-2 i / r)``: what ``paged_attention`` with
    the same ``rope_dim`` computes in each call, once for all the layers of a step;
    ``rope_scaling`` scales the frequencies (and the cosines and sines: yarn's and longrope's
    attention factor; longrope's factors are chosen per sequence by the end of its step,
    ``kv_len[b] + s``; longrope's and freq_factors' factors: ``r / 2`` of each). See the module docstring and
    ``paged_attention_base.angles``."""
    scaling = None if rope_scaling is None else tuple(x if isinstance(x, str) else tuple(float(v) for v in x) if isinstance(x, (tuple, list)) else float(x) for x in rope_scaling)
    return make_call("paged_rotary", [tokens, kv_len], head_dim=head_dim, rope_theta=float(rope_theta), rope_scaling=scaling, rope_dim=rope_dim)


__all__ = ["paged_attention", "paged_rotary", "pair_width", "KV_DTYPES", "KV_PAIRS", "SCALE_ROWS"]

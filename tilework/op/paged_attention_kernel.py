"""The kernels of ``tilework.op.paged_attention`` (see its docstring for the op): hand-built
TensorFuncs that read the pages.

- **decode** (``s`` is 1; ``tilework.op.paged_attention_decode``): tasks over (sequence,
  split) that read whole pages, a chunk of pages' scores at a time with one online-softmax
  update each, the splits of a long sequence merged at the end; the next pages' cache lines
  hinted ahead of their reads.
- **prefill** (``tilework.op.paged_attention_prefill``): tasks over (sequence, kv head, block
  of query rows), the rows as vector lanes, keys a page at a time, causal.
- **the rotary table** (``paged_rotary``): the cosines and sines of a step's positions, computed
  by the same loop (``tilework.op.paged_attention_base.angles``) as a kernel that is given no
  table.

Both kernels share ``tilework.op.paged_attention_base.PagedKernel``; from a bfloat16 pool
(stored in pairs) both multiply in bfloat16 (``dot_bf16x2``).
"""

from __future__ import annotations

from typing import Any

from tilework.ir import sym
from tilework.ir.loop import Buffer, For, TensorFunc, binary
from tilework.ir.sym import Dim, SymVar
from tilework.op.attention_kernel import VECTOR_BYTES
from tilework.op.kernel import serial_var
from tilework.op.paged_attention_base import angles, i64, ld, scheduled
from tilework.op.paged_attention_decode import CHUNK_PAGES, MAX_SPLITS, MIN_SPLIT_PAGES, Decode
from tilework.op.paged_attention_prefill import LANES, Prefill


def paged_attention_kernel(
    shapes: list[tuple[tuple[Dim, ...], str]], out_shape: tuple[tuple[Dim, ...], str], kv_heads: int, scale: float | None, theta: float | None, vector_bytes: int = VECTOR_BYTES, window: int | None = None,
    softcap: float | None = None, rope_dim: int | None = None,
) -> tuple[TensorFunc, SymVar]:
    """The kernel of a ``paged_attention`` call (operand shapes and dtypes, with the rotary table
    last where it is given) and its ``layer`` sym param: every layer calls the same kernel;
    ``window``: the sliding window (None: causal over every earlier key); ``softcap``: the
    scores' soft cap (None: none); ``rope_dim``: the rotated dims, the first of each head (None:
    all)."""
    params = [Buffer(name, shape, dtype) for name, (shape, dtype) in zip(("qkv", "k_cache", "v_cache", "kv_len", "page_table", "rotary"), shapes)]
    out = Buffer("out", *out_shape)
    layer = SymVar("layer", 0, None)  # a sym param: every layer calls the same kernel
    kernel = Decode if out_shape[0][1] == 1 else Prefill
    qkv, kc, vc, kv_len, pt = params[:5]
    given = params[5] if len(params) == 6 else None
    body = kernel(qkv, kv_heads, kc, vc, kv_len, pt, out, layer, None if scale is None else float(scale), None if theta is None else float(theta), vector_bytes, given, window, softcap, rope_dim).body()
    return scheduled([*params, out], body), layer


def rotary_kernel(tokens_info: tuple[tuple[Dim, ...], str], kv_len_info: tuple[tuple[Dim, ...], str], out_info: tuple[tuple[Dim, ...], str], hd: int, theta: float, scaling: tuple[Any, ...] | None = None) -> TensorFunc:
    """The kernel of a ``paged_rotary`` call: ``angles`` of every new token, in parallel."""
    tokens, kv_len, out = Buffer("tokens", *tokens_info), Buffer("kv_len", *kv_len_info), Buffer("out", *out_info)
    nb, sq = tokens_info[0]
    bt = serial_var("rotary_bt", sym.mul(nb, sq))
    b, t = sym.floordiv(bt, sq), sym.floormod(bt, sq)
    # one past the step's last position (longrope picks its factors by it, per sequence)
    step_end = binary("+", i64(ld(kv_len, b)), sq)
    body = For(bt, sym.mul(nb, sq), angles(out, b, t, i64(ld(kv_len, b)), hd, theta, scaling, step_end), "parallel")
    return scheduled([tokens, kv_len, out], body)



__all__ = ["paged_attention_kernel", "rotary_kernel", "LANES", "MAX_SPLITS", "MIN_SPLIT_PAGES", "CHUNK_PAGES"]

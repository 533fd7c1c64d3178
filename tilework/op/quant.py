"""Quantized weights: ``quant_linear`` and the block formats it reads.

``quant_linear(x, w, fmt, in_features)`` is ``x @ W.T`` (``quant_take(table, ids, fmt, cols)`` an
embedding lookup: rows of such a table, decoded) where ``W`` (``[out_features,
in_features]``) is stored in a block format and never expanded: ``w`` is ``uint8[out_features,
row_bytes]``, each row the blocks of one output feature, exactly as a GGUF file stores them.
The formats (``QUANT_FORMATS``; 32 weights per block for the simple ones, little-endian):

| format | bytes/block | layout | weight |
|---|---|---|---|
| ``q4_0`` | 18 | fp16 ``d``, 16 bytes of nibbles | ``d * (q - 8)`` |
| ``q4_1`` | 20 | fp16 ``d``, fp16 ``m``, 16 bytes of nibbles | ``d * q + m`` |
| ``q5_0`` | 22 | fp16 ``d``, uint32 ``qh``, 16 bytes of nibbles | ``d * (q - 16)`` |
| ``q5_1`` | 24 | fp16 ``d``, fp16 ``m``, uint32 ``qh``, 16 bytes of nibbles | ``d * q + m`` |
| ``q8_0`` | 34 | fp16 ``d``, 32 int8 | ``d * q`` |
| ``iq4_nl`` | 18 | fp16 ``d``, 16 bytes of nibbles | ``d * IQ4_VALUES[q]`` |
| ``bf16`` | 2 | one bfloat16 per weight | |
| ``f16`` | 2 | one IEEE half per weight | |

In a nibble block, byte ``j`` holds weight ``j`` in its low nibble and weight ``j + 16`` in its
high nibble; in ``q5_0`` and ``q5_1`` bit ``j`` of ``qh`` is weight ``j``'s fifth bit (``q =
nibble | bit << 4``, 0..31). ``iq4_xs`` (GGML type 23) is ``iq4_nl`` in 256-weight super-blocks
of 136 bytes: fp16 ``d``, uint16 ``scales_h``, 4 bytes ``scales_l``, 128 bytes of nibbles (sub-block
``s`` of 32: bytes ``16 s .. 16 s + 15``, laid out as a nibble block's), each sub-block's weights
``d * (ls - 32) * IQ4_VALUES[q]`` with the 6-bit ``ls`` = nibble ``s % 2`` of ``scales_l[s // 2]``
and bits ``2 s, 2 s + 1`` of ``scales_h`` above it.

``q4_0x16``, ``q4_1x16``, ``q5_0x16``, ``q5_1x16``, ``q8_0x16``, the k-quants' ``q4_kx16``, ``q5_kx16``,
``q6_kx16``, ``q3_kx16``, ``q2_kx16``, ``iq4_nlx16``, ``iq4_xsx16`` and ``bf16x16`` (``INTERLEAVED_FORMATS``) are the same
blocks with the rows interleaved in groups of 16, the layout the ``quant`` backend's GEMV reads
without transposing (``interleave_rows`` makes it from the plain rows): ``w`` is still
``uint8[out_features, row_bytes]``, ``out_features`` a multiple of 16, and rows ``16g .. 16g +
15`` together hold, for each block ``j`` in turn, ``16 * bytes/block`` bytes: the 16 rows' ``d``,
then (``q4_1``, ``q5_1``) their 16 ``m`` (``q4_k``, ``q5_k``, ``q2_k``: its super-blocks' 16 ``dmin``;
``iq4_xs``: their 16 ``scales_h``), then the
payloads (16 nibble bytes, ``qh`` and 16 nibble bytes, 32 int8, or ``q4_k``'s 12 bytes of scales
and 128 of nibbles, ``q5_k``'s scales, 32 bytes of ``qh`` and nibbles, ``iq4_xs``'s 4 bytes of
``scales_l`` and 128 of nibbles) in runs of 4 bytes: bytes ``4t .. 4t + 3`` of row 0, of row 1, ... of
row 15, for ``t = 0, 1, ...`` (so a q5 block's first run is the 16 rows' ``qh``). A ``q6_k``
super-block's ``d`` is its last 2 bytes: ``q6_kx16`` puts the 16 ``d`` first all the same and
the payload is bytes 0 .. 207 (128 of low nibbles, 64 of high bit pairs, 16 scales: runs 0-31,
32-47, 48-51); so does ``q3_kx16`` with ``q3_k``'s ``d`` (its bytes 108-109; the payload: 32
bytes of hmask, 64 of 2-bit fields, 12 of scales, runs 0-7, 8-23, 24-26) and ``q2_kx16`` with
``q2_k``'s ``d`` and ``dmin`` (bytes 80-83; the payload: 16 scale bytes, 64 of 2-bit fields, runs
0-3, 4-19). The k-quants' x16 layouts, like the k-quants, run on the ``quant`` backend only.
``bf16x16`` has no header and its blocks are pairs of weights (``in_features`` even): the 64
bytes of pair ``t`` are weights ``2t, 2t + 1`` of row 0, of row 1, ... of row 15, one vector
whose lanes are the group's rows. ``q4_k``, ``q6_k``, ``q5_k``, ``q3_k`` and ``q2_k`` (256-weight
super-blocks, laid out in ``tilework.llm.quant``; ``K_QUANTS``) are listed for the loaders; their
products run in the ``quant`` backend's library only, but ``quant_take`` decodes them in its
loop kernel too (``TAKE_FORMATS``: a GGUF's token table is often a k-quant). ``iq4_nl`` and
``iq4_xs`` (and their x16 layouts) have loop-level kernels for both ops (``LEGALIZED_FORMATS``:
the value of a nibble picked by a tree of selects).

Legalization gives the reference kernel: each weight is decoded where it is used (the half
scales decoded with integer arithmetic), in float32, serially per output. It is correct on
every target and slow; the ``quant`` backend (``tilework.backend.quant``) runs the op with
vectorized C that reads the same blocks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from tilework import te
from tilework.errors import UnsupportedError
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo
from tilework.ir.loop import Scalar
from tilework.op.base import InferCtx, Op, OpPattern, make_call, register, require_equal, tensor_arg
from tilework.op.kernel import arg, out_tensor

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx


@dataclass(frozen=True)
class QuantFormat:
    name: str
    block: int  # weights per block
    nbytes: int  # bytes per block
    ggml_type: int  # the GGML type code of a GGUF tensor

    def row_bytes(self, cols: int) -> int:
        return cols // self.block * self.nbytes


QUANT_FORMATS: dict[str, QuantFormat] = {
    f.name: f
    for f in (
        QuantFormat("f32", 1, 4, 0),
        QuantFormat("f16", 1, 2, 1),
        QuantFormat("q4_0", 32, 18, 2),
        QuantFormat("q4_1", 32, 20, 3),
        QuantFormat("q5_0", 32, 22, 6),
        QuantFormat("q5_1", 32, 24, 7),
        QuantFormat("q8_0", 32, 34, 8),
        QuantFormat("q4_k", 256, 144, 12),
        QuantFormat("q6_k", 256, 210, 14),
        QuantFormat("q5_k", 256, 176, 13),
        QuantFormat("q3_k", 256, 110, 11),
        QuantFormat("q2_k", 256, 84, 10),
        QuantFormat("bf16", 1, 2, 30),
        QuantFormat("iq4_nl", 32, 18, 20),
        QuantFormat("iq4_xs", 256, 136, 23),
    )
}
GROUP = 16  # rows per group of an interleaved format
INTERLEAVED_FORMATS: dict[str, QuantFormat] = {
    **{f"{f.name}x{GROUP}": QuantFormat(f"{f.name}x{GROUP}", f.block, f.nbytes, -1) for f in (QUANT_FORMATS[n] for n in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0"))},
    f"bf16x{GROUP}": QuantFormat(f"bf16x{GROUP}", 2, 4, -1),  # blocks of a pair of weights
    **{f"{n}x{GROUP}": QuantFormat(f"{n}x{GROUP}", 256, QUANT_FORMATS[n].nbytes, -1) for n in ("q4_k", "q5_k", "q6_k", "q3_k", "q2_k")},  # super-blocks
    **{f"{f.name}x{GROUP}": QuantFormat(f"{f.name}x{GROUP}", f.block, f.nbytes, -1) for f in (QUANT_FORMATS[n] for n in ("iq4_nl", "iq4_xs"))},
}
ALL_FORMATS: dict[str, QuantFormat] = {**QUANT_FORMATS, **INTERLEAVED_FORMATS}
K_QUANTS = ("q4_k", "q6_k", "q5_k", "q3_k", "q2_k")  # 256-weight super-blocks
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # what an iq4_nl / iq4_xs nibble indexes
LEGALIZED_FORMATS = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "f16", *(f for f in INTERLEAVED_FORMATS if f[: -len(f"x{GROUP}")] not in K_QUANTS), "iq4_nl", "iq4_xs")
TAKE_FORMATS = (*LEGALIZED_FORMATS, *K_QUANTS, *(f for f in INTERLEAVED_FORMATS if f not in LEGALIZED_FORMATS))  # quant_take's loop kernel decodes the k-quants too (a tied token table is the head's layout)


def quant_format(name: str) -> QuantFormat:
    fmt = ALL_FORMATS.get(name)
    if fmt is None:
        raise KeyError(f"unknown quantization format {name!r}; known: {', '.join(ALL_FORMATS)}")
    return fmt


def interleaved(name: str) -> str | None:
    """The interleaved layout of format ``name`` (``q4_1`` -> ``q4_1x16``), None if it has none."""
    x = f"{name}x{GROUP}"
    return x if x in INTERLEAVED_FORMATS else None


def interleavable(name: str, rows: int, cols: int) -> bool:
    """Whether ``rows`` x ``cols`` weights in format ``name`` can take the layout
    ``interleaved(name)``: one exists, the rows are whole groups of 16 and a row is whole blocks
    of it (``bf16x16``: an even row)."""
    x = interleaved(name)
    return x is not None and rows % GROUP == 0 and cols % INTERLEAVED_FORMATS[x].block == 0


def _head_bytes(base: str) -> int:
    return 4 if base in ("q4_1", "q5_1", "q4_k", "q5_k", "q2_k", "iq4_xs") else 0 if base == "bf16" else 2  # q4_k, q5_k, q2_k: the super-block's d, dmin; iq4_xs: d, scales_h


def _head_at(base: str) -> int:
    return {"q6_k": 208, "q3_k": 108, "q2_k": 80}.get(base, 0)  # where a block's head sits: q6_k's and q3_k's d, q2_k's d and dmin are its last bytes


def interleave_rows(data: np.ndarray, name: str, out: np.ndarray | None = None) -> np.ndarray:
    """Plain ``name`` rows (``uint8[n, row_bytes]``, ``n`` a multiple of 16) in the layout of
    ``interleaved(name)`` (see the module docstring): a new array of the same shape (``out``,
    C-contiguous ``uint8`` of that shape, where it is given). Each group of rows is gathered by
    one permutation of its bytes (``_group_order``): a model's weights in one pass (an LLM start
    repacks every matrix)."""
    f = INTERLEAVED_FORMATS[f"{name}x{GROUP}"]
    n, rb = data.shape
    if n % GROUP or rb % f.nbytes:
        raise ValueError(f"{name} rows to interleave: need a multiple of {GROUP} rows of whole blocks, got shape {data.shape}")
    groups = np.ascontiguousarray(data).reshape(n // GROUP, GROUP * rb)
    target = None if out is None else out.reshape(n // GROUP, GROUP * rb)
    return np.take(groups, _group_order(name, rb), axis=1, out=target).reshape(n, rb)


@functools.lru_cache(maxsize=64)
def _group_order(name: str, rb: int) -> np.ndarray:
    """Where each byte of an interleaved group of ``GROUP`` rows of ``rb`` bytes comes from, as
    an index into the plain group's bytes: the layout of the module docstring applied to the
    indices."""
    f = INTERLEAVED_FORMATS[f"{name}x{GROUP}"]
    head, ha = _head_bytes(name), _head_at(name)
    blocks = np.arange(GROUP * rb, dtype=np.intp).reshape(GROUP, rb // f.nbytes, f.nbytes).transpose(1, 0, 2)  # [j, row, byte]
    nb = blocks.shape[0]
    parts = [blocks[..., at : at + 2].reshape(nb, 2 * GROUP) for at in range(ha, ha + head, 2)]
    rest = np.concatenate([blocks[..., :ha], blocks[..., ha + head :]], axis=-1)  # the payload: the block less its head
    payload = rest.reshape(nb, GROUP, -1, 4).transpose(0, 2, 1, 3).reshape(nb, -1)
    return np.concatenate([*parts, payload], axis=1).reshape(-1)


def _block_attrs(call: Call, ctx: InferCtx, length: str, blocks: TensorInfo, what: str) -> tuple[QuantFormat, int]:
    """The checked ``fmt`` attribute and row length attribute ``length`` of a call whose
    argument ``blocks`` (the ``what``) holds rows of that format."""
    name, n = call.attrs["fmt"], call.attrs[length]
    fmt = ALL_FORMATS.get(name)
    if fmt is None or fmt.name == "f32":
        raise ctx.error(f"fmt must be one of {', '.join(f for f in ALL_FORMATS if f != 'f32')}, got {name!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0 or n % fmt.block:
        raise ctx.error(f"{length} must be a positive multiple of {fmt.block} ({name} blocks), got {n!r}")
    if blocks.dtype is not None and blocks.dtype != "uint8":
        raise ctx.error(f"the {what} blocks must be uint8, got {blocks.dtype}")
    return fmt, n


def _check_groups(fmt: QuantFormat, rows: object, ctx: InferCtx) -> None:
    if fmt.name in INTERLEAVED_FORMATS and isinstance(rows, int) and rows % GROUP:
        raise ctx.shape_error(f"{fmt.name} blocks interleave rows in groups of {GROUP}: {rows} rows are not whole groups")


def _infer_quant_linear(call: Call, ctx: InferCtx) -> StructInfo:
    x, w = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    fmt, k = _block_attrs(call, ctx, "in_features", w, "weight")
    if x.dtype is not None and x.dtype != "float32":
        raise ctx.error(f"x must be float32, got {x.dtype}")
    if w.shape is None or x.shape is None:
        return TensorInfo(None, "float32", x.ndim)
    if len(w.shape) != 2:
        raise ctx.shape_error(f"the weight blocks must be [out_features, row_bytes], got rank {len(w.shape)}")
    if len(x.shape) < 1:
        raise ctx.shape_error("x needs a last dim of in_features")
    require_equal(x.shape[-1], k, ctx, "x's last dim and in_features")
    require_equal(w.shape[1], fmt.row_bytes(k), ctx, f"row bytes of {fmt.name} weights for in_features {k}")
    _check_groups(fmt, w.shape[0], ctx)
    return TensorInfo((*x.shape[:-1], w.shape[0]), "float32")


def _half(lo: Scalar, hi: Scalar) -> Scalar:
    """The float32 value of the IEEE half whose little-endian bytes are ``lo``, ``hi`` (uint8
    loads); finite values only (weights and scales are): a normal half's exponent and mantissa
    moved into a float32's bits, a subnormal one scaled."""
    h = te.cast(lo, "int32") + te.cast(hi, "int32") * 256
    sign = te.if_then_else(te.ge(h, 32768), -1.0, 1.0)
    e = (h // 1024) % 32
    mant = h % 1024
    normal = te.bitcast((e + 112) * 8388608 + mant * 8192, "float32")  # (e - 15 + 127) << 23 | mant << 13
    sub = te.cast(mant, "float32") * (1.0 / 16777216.0)
    return sign * te.if_then_else(te.eq(e, 0), sub, normal)


def _bf16(lo: Scalar, hi: Scalar) -> Scalar:
    """The float32 value of the bfloat16 with little-endian bytes ``lo``, ``hi``: the upper half
    of a float32's bits (the sign applied apart, so that the bits fit an int32)."""
    h = te.cast(lo, "int32") + te.cast(hi, "int32") * 256
    sign = te.if_then_else(te.ge(h, 32768), -1.0, 1.0)
    return sign * te.bitcast((h % 32768) * 65536, "float32")


def _shr(v: Scalar, shift: Scalar, top: int) -> Scalar:
    """``v >> shift`` for an int32 ``v >= 0`` and ``shift`` in ``0 .. top``: ``v // 2**shift``,
    the power picked by a chain of selects (the loop IR has no shifts)."""
    div: Scalar = te.cast(1 << top, "int32")
    for sh in range(top - 1, -1, -1):
        div = te.if_then_else(te.eq(shift, sh), te.cast(1 << sh, "int32"), div)
    return v // div


def _k_weight(w: te.Tensor, name: str, n: Scalar, kk: Scalar) -> Scalar:
    """Weight ``(n, kk)`` of k-quant rows (the layouts of ``tilework.llm.quant``; ``q4_kx16`` &
    co.: read through the 16-row layout of the module docstring): ``d * scale * q - dmin * min``
    (q4_k, q5_k, q2_k) or ``d * scale * q`` (q6_k, q3_k; iq4_xs: ``d * (ls - 32) * value``), the
    factors rounded in that order, as ``dequantize`` rounds them."""
    x16 = name in INTERLEAVED_FORMATS
    name = name[: -len(f"x{GROUP}")] if x16 else name
    fmt = ALL_FORMATS[name]
    at0 = kk // 256 * fmt.nbytes
    i = kk % 256
    s, l, g = i // 32, i % 32, i // 16  # the piece of 32 (sub-block), the weight in it, the group of 16
    if x16:  # byte at of row n's super-block: its head's 2-byte parts, then its payload in runs of 4
        rb, lane, head, head_at = w.shape[1], n % GROUP, _head_bytes(name), _head_at(name)
        start = kk // 256 * (GROUP * fmt.nbytes)

        def raw(at: int | Scalar) -> Scalar:
            if isinstance(at, int) and head_at <= at < head_at + head:
                off = start + (at - head_at) // 2 * 2 * GROUP + lane * 2 + (at - head_at) % 2
            else:
                q = at - (0 if head_at else head)
                off = start + GROUP * head + q // 4 * 4 * GROUP + lane * 4 + q % 4
            return w[n - lane + off // rb, off % rb]
    else:

        def raw(at: int | Scalar) -> Scalar:
            return w[n, at0 + at]

    def byte(at: int | Scalar) -> Scalar:
        return te.cast(raw(at), "int32")

    def half(at: int) -> Scalar:
        return _half(raw(at), raw(at + 1))

    def f32(v: Scalar) -> Scalar:
        return te.cast(v, "float32")

    if name in ("q4_k", "q5_k"):  # 6-bit scale and min of piece s (twq_k4_scale)
        first = te.lt(s, 4)
        sc: Scalar = te.if_then_else(first, byte(4 + s) % 64, byte(8 + s) % 16 + byte(s) // 64 * 16)
        mn = te.if_then_else(first, byte(8 + s) % 64, byte(8 + s) // 16 + byte(4 + s) // 64 * 16)
        q: Scalar = _shr(byte((16 if name == "q4_k" else 48) + 32 * (s // 2) + l), 4 * (s % 2), 4) % 16
        if name == "q5_k":
            q = q + _shr(byte(16 + l), s, 7) % 2 * 16
        return half(0) * f32(sc) * f32(q) - half(2) * f32(mn)
    if name == "iq4_xs":  # 6-bit ls: nibble s % 2 of scales_l[s // 2], bits 2s of scales_h above it; the nibbles as a q4_0 block's
        ls = _shr(byte(4 + s // 2), 4 * (s % 2), 4) % 16 + _shr(byte(2) + byte(3) * 256, 2 * s, 14) % 4 * 16
        nib = byte(8 + 16 * s + l % 16)
        return half(0) * f32(ls - 32) * _iq4_value(te.if_then_else(te.lt(l, 16), nib % 16, nib // 16))
    t = s % 4  # quarter t of half s // 4
    if name == "q6_k":
        ql = byte(64 * (s // 4) + 32 * (t % 2) + l)
        q = te.if_then_else(te.ge(t, 2), ql // 16, ql % 16) + _shr(byte(128 + 32 * (s // 4) + l), 2 * t, 6) % 4 * 16 - 32
        sc = byte(192 + g)
        return half(208) * f32(te.if_then_else(te.ge(sc, 128), sc - 256, sc)) * f32(q)
    q = _shr(byte((32 if name == "q3_k" else 16) + 32 * (s // 4) + l), 2 * t, 6) % 4
    if name == "q3_k":
        sc = _shr(byte(96 + g % 8), 4 * (g // 8), 4) % 16 + _shr(byte(104 + g % 4), 2 * (g // 4), 6) % 4 * 16 - 32
        return half(108) * f32(sc) * f32(q - 4 + _shr(byte(l), s, 7) % 2 * 4)
    return half(80) * f32(byte(g) % 16) * f32(q) - half(82) * f32(byte(g) // 16)  # q2_k


def _iq4_value(i: Scalar) -> Scalar:
    """``IQ4_VALUES[i]`` as a float32 for an int32 ``i`` in 0..15: a binary tree of selects (the
    loop IR has no constant tables)."""

    def pick(lo: int, hi: int) -> Scalar:
        if hi - lo == 1:
            return te.constant(float(IQ4_VALUES[lo]), "float32")
        mid = (lo + hi) // 2
        return te.if_then_else(te.lt(i, mid), pick(lo, mid), pick(mid, hi))

    return pick(0, 16)


def _weight(w: te.Tensor, name: str, n: Scalar, kk: Scalar) -> Scalar:
    """Weight ``(n, kk)`` decoded from the blocks of row ``n`` (of its group, interleaved)."""
    if name.removesuffix(f"x{GROUP}") in (*K_QUANTS, "iq4_xs"):
        return _k_weight(w, name, n, kk)
    fmt = ALL_FORMATS[name]
    if name == f"bf16x{GROUP}":  # pair kk // 2 of the group: 64 bytes, 4 per row
        lane = n % GROUP
        off = kk // 2 * 64 + lane * 4 + kk % 2 * 2
        rb = w.shape[1]
        return _bf16(w[n - lane + off // rb, off % rb], w[n - lane + off // rb, off % rb + 1])  # off even, rb even: one row
    if fmt.block == 1:
        decode = _bf16 if name == "bf16" else _half
        return decode(w[n, kk * 2], w[n, kk * 2 + 1])
    b, j = kk // 32, kk % 32
    base_name = name[: -len(f"x{GROUP}")] if name in INTERLEAVED_FORMATS else name
    head = _head_bytes(base_name)
    if name in INTERLEAVED_FORMATS:
        rb = w.shape[1]
        lane = n % GROUP

        def byte(at: int | Scalar, payload: bool = False) -> Scalar:
            """Byte ``at`` of row ``n``'s block ``b`` (of its header; of its payload)."""
            off = b * (GROUP * fmt.nbytes) + (GROUP * head + at // 4 * 64 + lane * 4 + at % 4 if payload else at // 2 * 32 + lane * 2 + at % 2)
            return w[n - lane + off // rb, off % rb]
    else:

        def byte(at: int | Scalar, payload: bool = False) -> Scalar:
            return w[n, b * fmt.nbytes + (head + at if payload else at)]

    d = _half(byte(0), byte(1))
    if base_name == "q8_0":
        q = te.cast(byte(j, True), "int32")
        return d * te.cast(te.if_then_else(te.ge(q, 128), q - 256, q), "float32")
    if base_name in ("q5_0", "q5_1"):
        return _weight5(base_name, byte, d, j)
    if base_name == "iq4_nl":  # q4_0's nibble, looked up
        nib4 = te.cast(byte(j % 16, True), "int32")
        return d * _iq4_value(te.if_then_else(te.lt(j, 16), nib4 % 16, nib4 // 16))
    nib = te.cast(byte(j % 16, True), "int32")
    q = te.cast(te.if_then_else(te.lt(j, 16), nib % 16, nib // 16), "float32")
    if base_name == "q4_0":
        return d * (q - 8.0)
    return d * q + _half(byte(2), byte(3))


def _weight5(base_name: str, byte: Callable[..., Scalar], d: Scalar, j: Scalar) -> Scalar:
    """Weight ``j`` of a ``q5_0`` / ``q5_1`` block whose bytes ``byte`` reads: its payload is
    ``qh`` (4 bytes), then the 16 nibble bytes. The fifth bit is bit ``j % 8`` of ``qh``'s byte
    ``j // 8`` (``_shr``)."""
    hb = _shr(te.cast(byte(j // 8, True), "int32"), j % 8, 7)
    nib = te.cast(byte(4 + j % 16, True), "int32")
    q = te.cast(te.if_then_else(te.lt(j, 16), nib % 16, nib // 16) + hb % 2 * 16, "float32")
    if base_name == "q5_0":
        return d * (q - 16.0)
    return d * q + _half(byte(2), byte(3))


def _legalize_quant_linear(call: Call, ctx: "LegalizeCtx") -> Expr:
    x, w = arg(call, 0, "x"), arg(call, 1, "w")
    name = call.attrs["fmt"]
    if name not in LEGALIZED_FORMATS:
        raise UnsupportedError(f"quant_linear: cannot legalize: {name} blocks have no loop-level kernel; run the op on the 'quant' backend (backends=['quant', 'codegen'])")
    shape, dtype = out_tensor(call)

    def f(*i: Scalar) -> Scalar:
        k = te.reduce_axis(call.attrs["in_features"], "k")
        return te.sum(te.cast(x[i[:-1] + (k,)], "float32") * _weight(w, name, i[-1], k), axis=k)

    out = te.compute(shape, f, "quant_linear", dtype)
    return ctx.call_te("quant_linear", call.args, [x, w], [out], call.info)


def _infer_quant_take(call: Call, ctx: InferCtx) -> StructInfo:
    table, ids = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    fmt, cols = _block_attrs(call, ctx, "cols", table, "table")
    if ids.dtype is not None and ids.dtype not in ("int32", "int64"):
        raise ctx.error(f"ids must be int32 or int64, got {ids.dtype}")
    if table.shape is None or ids.shape is None:
        return TensorInfo(None, "float32", -1 if ids.ndim == -1 else ids.ndim + 1)
    if len(table.shape) != 2:
        raise ctx.shape_error(f"the table blocks must be [rows, row_bytes], got rank {len(table.shape)}")
    require_equal(table.shape[1], fmt.row_bytes(cols), ctx, f"row bytes of {fmt.name} rows of {cols} values")
    _check_groups(fmt, table.shape[0], ctx)
    return TensorInfo((*ids.shape, cols), "float32")


def _legalize_quant_take(call: Call, ctx: "LegalizeCtx") -> Expr:
    table, ids = arg(call, 0, "table"), arg(call, 1, "ids")
    name = call.attrs["fmt"]
    if name not in TAKE_FORMATS:
        raise UnsupportedError(f"quant_take: cannot legalize: {name} blocks have no loop-level kernel")
    shape, dtype = out_tensor(call)
    rows = table.shape[0]

    def f(*i: Scalar) -> Scalar:
        row = te.cast(ids[i[:-1]], "int64")
        row = te.if_then_else(te.lt(row, 0), row + rows, row)  # a negative id counts from the end, as in take,
        row = te.minimum(te.maximum(row, 0), sym.sub(rows, 1))  # and one outside is clamped (docs/semantics.md)
        return _weight(table, name, row, i[-1])

    out = te.compute(shape, f, "quant_take", dtype)
    return ctx.call_te("quant_take", call.args, [table, ids], [out], call.info)


def _infer_expert_linear(call: Call, ctx: InferCtx) -> StructInfo:
    x, w, ids = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx), tensor_arg(call, 2, ctx)
    name, k, experts = call.attrs["fmt"], call.attrs["in_features"], call.attrs["experts"]
    if name == "f32":
        if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
            raise ctx.error(f"in_features must be a positive int, got {k!r}")
        if w.dtype is not None and w.dtype != "float32":
            raise ctx.error(f"f32 expert weights must be float32, got {w.dtype}")
        fmt = QUANT_FORMATS["f32"]
    else:
        fmt, k = _block_attrs(call, ctx, "in_features", w, "weight")
    if not isinstance(experts, int) or isinstance(experts, bool) or experts <= 0:
        raise ctx.error(f"experts must be a positive int, got {experts!r}")
    if x.dtype is not None and x.dtype != "float32":
        raise ctx.error(f"x must be float32, got {x.dtype}")
    if ids.dtype is not None and ids.dtype not in ("int32", "int64"):
        raise ctx.error(f"ids must be int32 or int64, got {ids.dtype}")
    if w.shape is None or x.shape is None or ids.shape is None:
        return TensorInfo(None, "float32", 3)
    if len(w.shape) != 2:
        raise ctx.shape_error(f"the expert weights must be [experts * out_features, row_bytes], got rank {len(w.shape)}")
    if len(x.shape) != 3 or len(ids.shape) != 2:
        raise ctx.shape_error(f"x must be [tokens, 1 or slots, in_features] and ids [tokens, slots], got ranks {len(x.shape)} and {len(ids.shape)}")
    require_equal(x.shape[-1], k, ctx, "x's last dim and in_features")
    require_equal(x.shape[0], ids.shape[0], ctx, "the tokens of x and of ids")
    if not (sym.prove_eq(x.shape[1], 1) or sym.prove_eq(x.shape[1], ids.shape[1])):
        raise ctx.shape_error(f"x's dim 1 must be 1 (one input for every slot) or the slots of ids ({sym.to_str(ids.shape[1])}), got {sym.to_str(x.shape[1])}")
    if name == "f32":
        require_equal(w.shape[1], k, ctx, "the f32 weights' row length and in_features")
    else:
        require_equal(w.shape[1], fmt.row_bytes(k), ctx, f"row bytes of {name} weights for in_features {k}")
    rows = w.shape[0]
    if not isinstance(rows, int):
        raise ctx.shape_error(f"the expert weights' rows must be a constant, got {sym.to_str(rows)}")
    if rows % experts:
        raise ctx.shape_error(f"{rows} weight rows are not {experts} experts of equal size")
    _check_groups(fmt, rows // experts, ctx)
    return TensorInfo((x.shape[0], ids.shape[1], rows // experts), "float32")


def _legalize_expert_linear(call: Call, ctx: "LegalizeCtx") -> Expr:
    x, w, ids = arg(call, 0, "x"), arg(call, 1, "w"), arg(call, 2, "ids")
    name, experts = call.attrs["fmt"], call.attrs["experts"]
    if name != "f32" and name not in LEGALIZED_FORMATS:
        raise UnsupportedError(f"expert_linear: cannot legalize: {name} blocks have no loop-level kernel; run the op on the 'quant' backend (backends=['quant', 'codegen'])")
    shape, dtype = out_tensor(call)
    n_out = shape[2]
    shared = sym.prove_eq(x.shape[1], 1)

    def f(t: Scalar, s: Scalar, n: Scalar) -> Scalar:
        e = te.cast(ids[t, s], "int64")
        e = te.if_then_else(te.lt(e, 0), e + experts, e)  # as take: a negative id counts from the end,
        e = te.minimum(te.maximum(e, 0), experts - 1)  # one outside is clamped
        row = e * n_out + n
        k = te.reduce_axis(call.attrs["in_features"], "k")
        wk = w[row, k] if name == "f32" else _weight(w, name, row, k)
        return te.sum(x[t, 0 if shared else s, k] * wk, axis=k)

    out = te.compute(shape, f, "expert_linear", dtype)
    return ctx.call_te("expert_linear", call.args, [x, w, ids], [out], call.info)


register(Op("quant_linear", _infer_quant_linear, OpPattern.OPAQUE, attrs={"fmt": "q4_1", "in_features": 0}, num_args=2, legalize=_legalize_quant_linear))


register(Op("quant_take", _infer_quant_take, OpPattern.INJECTIVE, attrs={"fmt": "q8_0", "cols": 0}, num_args=2, legalize=_legalize_quant_take))


register(Op("expert_linear", _infer_expert_linear, OpPattern.OPAQUE, attrs={"fmt": "q4_1", "in_features": 0, "experts": 1}, num_args=3, legalize=_legalize_expert_linear))


def quant_take(table: Expr, ids: Expr, fmt: str, cols: int) -> Call:
    """Rows ``ids`` of a table stored as ``fmt`` blocks (``uint8[rows, row_bytes]``), decoded:
    an embedding lookup that never expands the table."""
    return make_call("quant_take", [table, ids], fmt=fmt, cols=cols)


def quant_linear(x: Expr, w: Expr, fmt: str, in_features: int) -> Call:
    """``x @ W.T`` with ``W`` stored as ``fmt`` blocks in ``w`` (``uint8[out, row_bytes]``)."""
    return make_call("quant_linear", [x, w], fmt=fmt, in_features=in_features)


def expert_linear(x: Expr, w: Expr, ids: Expr, fmt: str, in_features: int, experts: int) -> Call:
    """A mixture of experts' products: ``out[t, s] = x[t, s] @ W_e.T`` with ``e = ids[t, s]``, for
    ``x`` float32 ``[tokens, slots or 1, in_features]`` (dim 1 of one: the same input for every
    slot), ``ids`` int32/int64 ``[tokens, slots]`` and the ``experts`` matrices ``W_e``
    (``[out, in_features]`` each) stacked in ``w``: rows ``e * out .. e * out + out - 1`` are
    ``W_e``'s, as ``fmt`` blocks (``uint8[experts * out, row_bytes]``; an interleaved format's
    groups of 16 never straddle two experts) or float32 (``fmt="f32"``: ``[experts * out,
    in_features]``). An id outside ``[0, experts)`` is read as ``take`` reads it (negative
    from the end, then clamped). Result: float32 ``[tokens, slots, out]``."""
    return make_call("expert_linear", [x, w, ids], fmt=fmt, in_features=in_features, experts=experts)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bfloat16 bits (``uint16``, same shape) of float32 ``x``: rounded to nearest, ties to
    even (finite values stay finite unless beyond bfloat16's range), a NaN a quiet NaN of the
    same sign (the C kernels' ``tw_f2bf``)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16).astype(np.uint16) | np.uint16(0x40), rounded)


def bf16_rows(w: np.ndarray) -> np.ndarray:
    """A float32 ``[out, in]`` matrix as ``bf16`` rows (``uint8[out, 2 * in]``): each value
    rounded as ``bf16_bits`` rounds it."""
    return bf16_bits(w).view(np.uint8).reshape(w.shape[0], w.shape[1] * 2)


def bf16_values(rows: np.ndarray) -> np.ndarray:
    """The float32 values of ``bf16`` rows (``uint8[out, 2 * in]`` -> ``float32[out, in]``)."""
    h = np.ascontiguousarray(rows).view(np.uint16).astype(np.uint32) << 16
    return h.view(np.float32).reshape(rows.shape[0], rows.shape[1] // 2)


__all__ = ["QuantFormat", "QUANT_FORMATS", "INTERLEAVED_FORMATS", "ALL_FORMATS", "LEGALIZED_FORMATS", "K_QUANTS", "IQ4_VALUES", "TAKE_FORMATS", "bf16_rows", "bf16_values", "expert_linear", "interleavable", "interleave_rows", "interleaved", "quant_format", "quant_linear", "quant_take"]

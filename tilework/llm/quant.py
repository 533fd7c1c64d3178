"""Block formats of quantized weights, and tensors stored in them.

A :class:`QuantTensor` is a logical row-major tensor (``shape``, e.g. ``(rows, cols)``) whose
bytes are kept exactly as a GGUF or safetensors file stores them: ``data`` is ``uint8`` of shape
``shape[:-1] + (row_bytes,)``, each row the blocks of ``cols`` consecutive weights. Nothing is
expanded until :meth:`QuantTensor.dequantize` is called.

The formats (little-endian; ``d``, ``m``, ``dmin`` are IEEE halves):

| name | weights/block | bytes/block | layout | weight |
|---|---|---|---|---|
| ``f32``, ``f16``, ``bf16`` | 1 | 4, 2, 2 | one float | |
| ``q8_0`` | 32 | 34 | ``d``, 32 int8 ``q`` | ``d * q`` |
| ``q4_0`` | 32 | 18 | ``d``, 16 nibble bytes | ``d * (q - 8)`` |
| ``q4_1`` | 32 | 20 | ``d``, ``m``, 16 nibble bytes | ``d * q + m`` |
| ``q5_0`` | 32 | 22 | ``d``, uint32 ``qh``, 16 nibble bytes | ``d * (q - 16)`` |
| ``q5_1`` | 32 | 24 | ``d``, ``m``, uint32 ``qh``, 16 nibble bytes | ``d * q + m`` |
| ``q4_k`` | 256 | 144 | ``d``, ``dmin``, 12 bytes of 6-bit scales/mins, 128 nibble bytes | ``d * sc * q - dmin * mn`` |
| ``q6_k`` | 256 | 210 | 128 bytes low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, ``d`` | ``d * sc * (q - 32)`` |
| ``q5_k`` | 256 | 176 | ``d``, ``dmin``, 12 bytes of 6-bit scales/mins (as ``q4_k``), 32 bytes of high bits, 128 nibble bytes | ``d * sc * q - dmin * mn`` |
| ``q3_k`` | 256 | 110 | 32 bytes of high bits, 64 bytes of 2-bit lows, 12 bytes of 6-bit scales, ``d`` | ``d * (sc - 32) * q`` |
| ``q2_k`` | 256 | 84 | 16 bytes of 4-bit scale/min pairs, 64 bytes of 2-bit ``q``, ``d``, ``dmin`` | ``d * sc * q - dmin * mn`` |
| ``iq4_nl`` | 32 | 18 | ``d``, 16 nibble bytes | ``d * IQ4_VALUES[q]`` |
| ``iq4_xs`` | 256 | 136 | ``d``, uint16 ``scales_h``, 4 bytes ``scales_l``, 128 nibble bytes | ``d * (ls - 32) * IQ4_VALUES[q]`` |

In a 32-weight nibble block byte ``j`` holds weight ``j`` (low nibble) and ``j + 16`` (high
nibble); q5's ``q`` is that nibble with bit ``j`` of ``qh`` (little-endian) as its fifth bit. In the k-quants (256 weights) the 2-bit and 4-bit fields of weight ``32 i + l`` (``l <
32``) are bits ``2 (i % 4)`` (``q3_k``, ``q2_k``: byte ``l`` of the 32-byte chunk ``i // 4``) or
``4 (i % 2)`` (``q4_k``, ``q5_k``: chunk ``i // 2``) on; a high bit (``q5_k``: ``q += 16``;
``q3_k``: ``q -= 4`` where it is clear) is bit ``i`` of byte ``l``. ``q5_k``'s 8 scales and mins
(one per 32 weights) are packed as ``q4_k``'s; ``q3_k``'s 16 (one per 16 weights) keep their low
4 bits in the nibbles of bytes 0-7 (scale ``i`` in byte ``i % 8``, high nibble from 8 on) and
their top 2 in bits ``2 (i // 4)`` of byte ``8 + i % 4``; ``q2_k``'s byte ``i`` holds scale ``i``
(low nibble) and min ``i`` (high nibble). ``iq4_nl``'s nibbles index ``IQ4_VALUES`` (-127 .. 113,
``tilework.op.quant``), laid out as ``q4_0``'s; ``iq4_xs`` is 8 such sub-blocks of 32 (bytes
``8 + 16 i ..``) under one ``d``, sub-block ``i`` scaled by ``ls - 32``: ``ls`` is 6 bits, nibble
``i % 2`` of ``scales_l[i // 2]`` and bits ``2 i, 2 i + 1`` of ``scales_h`` above it. The names are those of ``tilework.op.quant.QUANT_FORMATS`` (the ``quant_linear`` op), so
a tensor's ``fmt`` can be handed to the op unchanged; ``ggml_type`` is the GGUF type code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tilework.backend import quant as quant_backend
from tilework.errors import ShapeError, UnsupportedError
from tilework.op.quant import IQ4_VALUES, QUANT_FORMATS, QuantFormat, bf16_bits


_BY_GGML_TYPE = {f.ggml_type: f for f in QUANT_FORMATS.values()}
QUANTIZABLE = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


def block_format(name: str) -> QuantFormat:
    """The format called ``name`` (case-insensitive: ``Q4_1`` and ``q4_1`` are the same)."""
    fmt = QUANT_FORMATS.get(name.lower())
    if fmt is None:
        raise UnsupportedError(f"unknown block format {name!r}; known: {', '.join(QUANT_FORMATS)}")
    return fmt


def format_of_ggml_type(code: int) -> QuantFormat | None:
    """The format of GGML type ``code``, or None when tilework does not read that type."""
    return _BY_GGML_TYPE.get(int(code))


@dataclass(frozen=True, eq=False)
class QuantTensor:
    """A tensor of logical ``shape`` whose rows are stored as ``fmt`` blocks in ``data``
    (``uint8[*shape[:-1], row_bytes]``; usually a read-only view of a memory-mapped file)."""

    name: str
    shape: tuple[int, ...]
    fmt: str
    data: np.ndarray

    def __post_init__(self) -> None:
        fmt = block_format(self.fmt)
        object.__setattr__(self, "fmt", fmt.name)
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        if not self.shape or self.shape[-1] % fmt.block:
            raise ShapeError(f"tensor {self.name}: shape {self.shape} has no last dim that is a multiple of {fmt.block} ({fmt.name} blocks)")
        want = self.shape[:-1] + (fmt.row_bytes(self.shape[-1]),)
        if self.data.dtype != np.uint8 or self.data.shape != want:
            raise ShapeError(f"tensor {self.name}: {fmt.name} data of shape {self.shape} must be uint8{list(want)}, got {self.data.dtype}{list(self.data.shape)}")

    @property
    def format(self) -> QuantFormat:
        return QUANT_FORMATS[self.fmt]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def dequantize(self, bf16: bool = False, out: np.ndarray | None = None) -> np.ndarray:
        """The float32 values, of shape ``shape``; ``bf16``: their bfloat16 bits (``uint16``, as
        ``tilework.op.quant.bf16_bits`` rounds them); written into ``out`` (C-contiguous, that dtype, as many
        elements) where it is given. A tensor of ``LIBRARY_WEIGHTS`` or more decodes in the quant
        library (C, every thread: the same bits as ``dequantize_rows``, in a tenth of its time)
        where that library is built (``library_if_built``: a first start does not wait for the
        compiler, which builds it meanwhile); the others, and every tensor until then, here."""
        lib = _library() if int(np.prod(self.shape)) >= LIBRARY_WEIGHTS and self.fmt != "f32" else None
        if lib is not None:
            return lib.dequantize(self.data.reshape(-1, self.data.shape[-1]), self.fmt, bf16, out).reshape(self.shape)
        values = dequantize_rows(self.data, self.fmt)
        if bf16:
            values = bf16_bits(values)
        if out is None:
            return values.reshape(self.shape)
        out = out.reshape(self.shape)
        out[...] = values
        return out

    def take_rows(self, rows: np.ndarray | list[int]) -> np.ndarray:
        """The float32 values of the given rows of a 2-D tensor (an embedding lookup), without
        expanding the others: ``(len(rows), cols)``."""
        if len(self.shape) != 2:
            raise ShapeError(f"tensor {self.name}: take_rows needs a 2-D tensor, got shape {self.shape}")
        return dequantize_rows(self.data[np.asarray(rows, dtype=np.int64)], self.fmt)

    def gather_rows(self, order: np.ndarray) -> "QuantTensor":
        """The tensor whose row ``r`` is row ``order[r]`` of this one (rows of the first dim; a
        1-D tensor of a one-weight format permutes its elements). Copies the stored bytes."""
        order = np.asarray(order, dtype=np.int64)
        if order.shape != (self.shape[0],):
            raise ShapeError(f"tensor {self.name}: a row order must have {self.shape[0]} entries, got shape {order.shape}")
        if len(self.shape) == 1:
            if self.format.block != 1:
                raise ShapeError(f"tensor {self.name}: cannot reorder the weights of a 1-D {self.fmt} tensor")
            data = self.data.reshape(self.shape[0], self.format.nbytes)[order].reshape(-1)
        else:
            data = self.data[order]
        data.flags.writeable = False
        return QuantTensor(self.name, self.shape, self.fmt, data)


LIBRARY_WEIGHTS = 1 << 16


_library = quant_backend.library_if_built  # None until it is built (or where it cannot be): NumPy decodes


def dequantize_rows(data: np.ndarray, fmt: str) -> np.ndarray:
    """Decode ``uint8[..., row_bytes]`` of ``fmt`` blocks to float32 ``[..., cols]``."""
    f = block_format(fmt)
    if data.shape[-1] % f.nbytes:
        raise ShapeError(f"{f.name}: a row of {data.shape[-1]} bytes is not a whole number of {f.nbytes}-byte blocks")
    blocks = np.ascontiguousarray(data).reshape(-1, f.nbytes)
    out = _DECODERS[f.name](blocks)
    return out.reshape(data.shape[:-1] + (data.shape[-1] // f.nbytes * f.block,))


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at byte ``at`` of each block, as float32 ``[n, 1]``."""
    return blocks[:, at : at + 2].view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, axis: int = -1) -> np.ndarray:
    """The low nibbles of ``qs``, then the high ones, concatenated along ``axis``."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=axis)


def _decode_f32(b: np.ndarray) -> np.ndarray:
    return b.view(np.float32).copy()


def _decode_f16(b: np.ndarray) -> np.ndarray:
    return b.view(np.float16).astype(np.float32)


def _decode_bf16(b: np.ndarray) -> np.ndarray:
    return (b.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _decode_q8_0(b: np.ndarray) -> np.ndarray:
    return b[:, 2:].view(np.int8).astype(np.float32) * _half(b, 0)


def _decode_q4_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
    return _half(b, 0) * q.astype(np.float32)


def _decode_q4_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 4:]).astype(np.float32)
    return _half(b, 0) * q + _half(b, 2)


def _fifth_bits(b: np.ndarray, at: int) -> np.ndarray:
    """Bit ``j`` of the little-endian uint32 at byte ``at`` of each block, shifted to 16: ``[n, 32]``."""
    return np.unpackbits(b[:, at : at + 4], axis=1, bitorder="little") << np.uint8(4)


def _decode_q5_0(b: np.ndarray) -> np.ndarray:
    q = (_nibbles(b[:, 6:]) | _fifth_bits(b, 2)).astype(np.int8) - np.int8(16)
    return _half(b, 0) * q.astype(np.float32)


def _decode_q5_1(b: np.ndarray) -> np.ndarray:
    q = (_nibbles(b[:, 8:]) | _fifth_bits(b, 4)).astype(np.float32)
    return _half(b, 0) * q + _half(b, 2)


def _k4_factors(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``d * scale`` and ``dmin * min`` (float32 ``[n, 8, 1]``) of the 8 sub-blocks of 32 of
    ``q4_k`` / ``q5_k`` blocks (``d``, ``dmin``, then 12 bytes of packed 6-bit scales/mins)."""
    s = b[:, 4:16]
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    # 8 sub-blocks of 32: sub-blocks 0-3 keep scale and min in 6 bits of bytes 0-3 and 4-7;
    # 4-7 take their low 4 bits from bytes 8-11 and their top 2 from the spare bits of 0-7.
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 6) << 4)], axis=1).astype(np.float32)
    mn = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 6) << 4)], axis=1).astype(np.float32)
    return (_half(b, 0) * sc)[:, :, None], (_half(b, 2) * mn)[:, :, None]


def _decode_q4_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    scale, offset = _k4_factors(b)
    # each 32-byte chunk of qs holds sub-block 2c (low nibbles) and 2c + 1 (high nibbles)
    q = _nibbles(b[:, 16:].reshape(n, 4, 32)).reshape(n, 8, 32).astype(np.float32)
    return (scale * q - offset).reshape(n, 256)


def _decode_q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    # per 128-weight half: quarters 0, 1 take the low nibbles of ql[0:32], ql[32:64]; quarters
    # 2, 3 their high nibbles; quarter k's top two bits are bits 2k, 2k + 1 of qh[0:32].
    ql = _nibbles(b[:, 0:128].reshape(n, 2, 2, 32), axis=2)
    qh = (b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = ((ql | (qh << 4)).astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(np.float32)
    scale = (_half(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32))[:, :, None]
    return (scale * q).reshape(n, 256)


_SHIFT2 = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)  # the 2-bit fields of a byte
_BIT = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)  # the bits of a high-bit byte


def _decode_q5_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    scale, offset = _k4_factors(b)
    # q4_k's nibbles (bytes 48-175), and sub-block i's fifth bit: bit i of qh[0:32] (bytes 16-47)
    q = _nibbles(b[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32) | (((b[:, 16:48].reshape(n, 1, 32) >> _BIT) & 1) << 4)
    return (scale * q.astype(np.float32) - offset).reshape(n, 256)


def _decode_q3_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    s = b[:, 96:108]
    # 16 scales of 6 bits: low 4 in the nibbles of bytes 0-7, top 2 in bits 2 (i // 4) of bytes 8-11
    lo = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)
    hi = ((s[:, 8:12].reshape(n, 1, 4) >> _SHIFT2.reshape(1, 4, 1)) & 3).reshape(n, 16)
    scale = (_half(b, 108) * ((lo | (hi << 4)).astype(np.int8) - np.int8(32)).astype(np.float32))[:, :, None]
    # 2-bit lows: quarter t of half h is bits 2t of qs[32h : 32h + 32] (bytes 32-95); 4 is taken
    # off where the high bit (bit 4h + t of hmask, bytes 0-31) is clear
    ql = ((b[:, 32:96].reshape(n, 2, 1, 32) >> _SHIFT2) & 3).reshape(n, 8, 32)
    hbit = (b[:, 0:32].reshape(n, 1, 32) >> _BIT) & 1
    q = (ql.astype(np.int8) - ((hbit ^ 1) << 2).astype(np.int8)).reshape(n, 16, 16).astype(np.float32)
    return (scale * q).reshape(n, 256)


def _decode_q2_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    s = b[:, 0:16]  # per 16 weights: scale (low nibble) and min (high nibble)
    scale = (_half(b, 80) * (s & 0x0F).astype(np.float32))[:, :, None]
    offset = (_half(b, 82) * (s >> 4).astype(np.float32))[:, :, None]
    q = ((b[:, 16:80].reshape(n, 2, 1, 32) >> _SHIFT2) & 3).reshape(n, 16, 16).astype(np.float32)
    return (scale * q - offset).reshape(n, 256)


_IQ4 = np.array(IQ4_VALUES, np.float32)


def _decode_iq4_nl(b: np.ndarray) -> np.ndarray:
    return _half(b, 0) * _IQ4[_nibbles(b[:, 2:])]


def _decode_iq4_xs(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    scales_h = b[:, 2:4].copy().view(np.uint16).astype(np.int32)  # [n, 1]
    lo = np.stack([b[:, 4:8] & 0x0F, b[:, 4:8] >> 4], axis=2).reshape(n, 8).astype(np.int32)  # sub-block i: nibble i % 2 of byte i // 2
    hi = (scales_h >> (2 * np.arange(8, dtype=np.int32))) & 3
    scale = (_half(b, 0) * ((lo | (hi << 4)) - 32).astype(np.float32))[:, :, None]  # d * (ls - 32), exact
    q = _IQ4[_nibbles(b[:, 8:].reshape(n, 8, 16))]  # [n, 8, 32]
    return (scale * q).reshape(n, 256)


_DECODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "f32": _decode_f32,
    "f16": _decode_f16,
    "bf16": _decode_bf16,
    "q8_0": _decode_q8_0,
    "q4_0": _decode_q4_0,
    "q4_1": _decode_q4_1,
    "q5_0": _decode_q5_0,
    "q5_1": _decode_q5_1,
    "q4_k": _decode_q4_k,
    "q6_k": _decode_q6_k,
    "q5_k": _decode_q5_k,
    "q3_k": _decode_q3_k,
    "q2_k": _decode_q2_k,
    "iq4_nl": _decode_iq4_nl,
    "iq4_xs": _decode_iq4_xs,
}


def quantize(x: np.ndarray, fmt: str, name: str = "") -> QuantTensor:
    """``x`` (float, last dim a multiple of the block) stored as ``fmt`` blocks, rounded like
    llama.cpp's reference quantizers (``quantize_row_*_ref``: float32 arithmetic, the scale
    rounded to fp16 after the weights are rounded with the unrounded one)."""
    f = block_format(fmt)
    if f.name not in QUANTIZABLE:
        raise UnsupportedError(f"quantize: cannot write {f.name} blocks; can write {', '.join(QUANTIZABLE)}")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % f.block:
        raise ShapeError(f"quantize: {f.name} needs a last dim that is a multiple of {f.block}, got shape {x.shape}")
    blocks = _ENCODERS[f.name](np.ascontiguousarray(x).reshape(-1, f.block))
    data = blocks.reshape(x.shape[:-1] + (f.row_bytes(x.shape[-1]),))
    data.flags.writeable = False
    return QuantTensor(name, x.shape, f.name, data)


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """``[n, 32]`` values 0..15 -> ``[n, 16]`` bytes: weight j low, weight j + 16 high."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C ``roundf`` (ties away from zero); exact, unlike ``floor(|v| + 0.5)`` near 0.5."""
    t = np.trunc(v)
    return t + np.sign(v) * (np.abs(v - t) >= np.float32(0.5))


def _encode_q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_half_away(x * _inverse(d)).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1)


def _encode_offset(x: np.ndarray, half: int, pack: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """q4_0 (``half`` 8) and q5_0 (16): ``d * (q - half)``, the value of largest magnitude (the
    first one on a tie) mapped to ``-half``; ``pack`` stores the ``q``."""
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)
    d = peak / np.float32(-half)
    q = np.minimum(np.trunc(x * _inverse(d) + np.float32(half + 0.5)), 2 * half - 1)
    return np.concatenate([_f16_bytes(d), pack(q)], axis=1)


def _encode_min(x: np.ndarray, top: int, pack: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """q4_1 (``top`` 15) and q5_1 (31): ``d * q + m``, ``m`` the block's minimum and ``d`` its
    range over ``top``; ``pack`` stores the ``q``."""
    lo = x.min(axis=1, keepdims=True)
    d = (x.max(axis=1, keepdims=True) - lo) / np.float32(top)
    q = np.minimum(np.trunc((x - lo) * _inverse(d) + np.float32(0.5)), top)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), pack(q)], axis=1)


def _pack_q5(q: np.ndarray) -> np.ndarray:
    """``[n, 32]`` values 0..31 -> ``[n, 20]`` bytes: ``qh`` (bit j: weight j's fifth bit,
    little-endian), then the low nibbles packed as ``_pack_nibbles`` packs them."""
    q = q.astype(np.uint8)
    return np.concatenate([np.packbits(q >> 4, axis=1, bitorder="little"), _pack_nibbles(q & 0x0F)], axis=1)


def _encode_bf16(x: np.ndarray) -> np.ndarray:
    import ml_dtypes  # a dependency of tilework; rounds to nearest even

    return x.astype(ml_dtypes.bfloat16).view(np.uint8)


_ENCODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "f32": lambda x: x.view(np.uint8).copy(),
    "f16": lambda x: x.astype(np.float16).view(np.uint8),
    "bf16": _encode_bf16,
    "q8_0": _encode_q8_0,
    "q4_0": lambda x: _encode_offset(x, 8, _pack_nibbles),
    "q4_1": lambda x: _encode_min(x, 15, _pack_nibbles),
    "q5_0": lambda x: _encode_offset(x, 16, _pack_q5),
    "q5_1": lambda x: _encode_min(x, 31, _pack_q5),
}

"""The one dtype table: every fact tilework knows about an element type lives here.

Op inference, the loop level, the C codegen ABI, the runtime, the file formats and the
frontends all read their dtype facts from ``DTYPE_TABLE`` (names, kinds, sizes, C types, NumPy
dtypes, ONNX element codes, torch names); no other module keeps a list of dtypes.

Storage: ``float16`` is IEEE half, ``bfloat16`` the upper 16 bits of a float32 (ml_dtypes'
NumPy dtype), ``bool`` one byte holding 0 or 1. ``c_value`` is the C type a value computes in
(half and bfloat16 compute in float).

The low-precision dtypes (``LOWP_DTYPES``: the float8 formats, ``float4_e2m1fn``, ``int4``,
``uint4``, ``int2``, ``uint2``) take one byte per element, as ml_dtypes' NumPy dtypes of the
same names do (ONNX packs the sub-byte ones two or four to a byte; the ONNX frontend unpacks
them). In a byte, a sub-byte value sits in the low bits (two's complement for the signed ones, the
high bits zero), as in ml_dtypes. ``bits`` is the width of the format. Floats compute in float32, the sub-byte integers in
int32 (a result wraps to the narrow type when stored); conversions are those of
``tilework.ir.lowp`` (docs/semantics.md).

ml_dtypes is imported only when one of its NumPy dtypes is asked for: some releases take half a
second to import, which a process that never touches bfloat16 should not pay.
"""

from __future__ import annotations

from dataclasses import dataclass

import functools
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from tilework.errors import UnsupportedError


@dataclass(frozen=True, slots=True)
class DType:
    name: str
    kind: str  # "bool" | "int" | "uint" | "float"
    itemsize: int
    c_storage: str
    c_value: str
    onnx: int  # onnx.TensorProto element type code
    compute: str  # the dtype arithmetic on values of this dtype runs in
    bits: int  # the width of one element's format (8 * itemsize but for the sub-byte ints and float4)

    @property
    def numpy(self) -> np.dtype:
        return _numpy_dtype(self.name)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")


_ML_DTYPES = frozenset({
    "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn", "int4", "uint4", "int2", "uint2",
})  # fmt: skip


@functools.cache
def _numpy_dtype(name: str) -> np.dtype:
    if name in _ML_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def _d(name: str, kind: str, size: int, c_storage: str, c_value: str, onnx: int, bits: int = 0) -> DType:
    bits = bits or 8 * size
    if kind == "float" and size < 4:
        compute = "float32"  # half and narrower floats compute in float32
    elif kind in ("int", "uint") and bits < 8:
        compute = "int32"
    else:
        compute = name
    return DType(name, kind, size, c_storage, c_value, onnx, compute, bits)


DTYPE_TABLE: dict[str, DType] = {
    d.name: d
    for d in (
        _d("bool", "bool", 1, "bool", "bool", 9),
        _d("int8", "int", 1, "int8_t", "int8_t", 3),
        _d("int16", "int", 2, "int16_t", "int16_t", 5),
        _d("int32", "int", 4, "int32_t", "int32_t", 6),
        _d("int64", "int", 8, "int64_t", "int64_t", 7),
        _d("uint8", "uint", 1, "uint8_t", "uint8_t", 2),
        _d("uint16", "uint", 2, "uint16_t", "uint16_t", 4),
        _d("uint32", "uint", 4, "uint32_t", "uint32_t", 12),
        _d("uint64", "uint", 8, "uint64_t", "uint64_t", 13),
        _d("float16", "float", 2, "tw_half", "float", 10),
        _d("bfloat16", "float", 2, "uint16_t", "float", 16),
        _d("float32", "float", 4, "float", "float", 1),
        _d("float64", "float", 8, "double", "double", 11),
        _d("float8_e4m3fn", "float", 1, "uint8_t", "float", 17),
        _d("float8_e4m3fnuz", "float", 1, "uint8_t", "float", 18),
        _d("float8_e5m2", "float", 1, "uint8_t", "float", 19),
        _d("float8_e5m2fnuz", "float", 1, "uint8_t", "float", 20),
        _d("float8_e8m0fnu", "float", 1, "uint8_t", "float", 24),
        _d("float4_e2m1fn", "float", 1, "uint8_t", "float", 23, 4),
        _d("int4", "int", 1, "uint8_t", "int8_t", 22, 4),
        _d("uint4", "uint", 1, "uint8_t", "uint8_t", 21, 4),
        _d("int2", "int", 1, "uint8_t", "int8_t", 26, 2),
        _d("uint2", "uint", 1, "uint8_t", "uint8_t", 25, 2),
    )
}

DTYPES: tuple[str, ...] = tuple(DTYPE_TABLE)
FLOAT_DTYPES: tuple[str, ...] = tuple(n for n, d in DTYPE_TABLE.items() if d.is_float)
INT_DTYPES: tuple[str, ...] = tuple(n for n, d in DTYPE_TABLE.items() if d.is_int)
LOWP_FLOAT_DTYPES: tuple[str, ...] = tuple(n for n, d in DTYPE_TABLE.items() if d.is_float and d.bits <= 8)
SUBBYTE_INT_DTYPES: tuple[str, ...] = tuple(n for n, d in DTYPE_TABLE.items() if d.is_int and d.bits < 8)
LOWP_DTYPES: tuple[str, ...] = LOWP_FLOAT_DTYPES + SUBBYTE_INT_DTYPES

_BY_ONNX = {d.onnx: d.name for d in DTYPE_TABLE.values()}


def dtype_info(name: str) -> DType:
    """The table entry of ``name``; ``UnsupportedError`` naming the known dtypes otherwise."""
    try:
        return DTYPE_TABLE[name]
    except (KeyError, TypeError):
        raise UnsupportedError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}") from None


def is_float_dtype(name: str) -> bool:
    d = DTYPE_TABLE.get(name)
    return d is not None and d.is_float


def is_int_dtype(name: str) -> bool:
    """Integer dtypes (signed and unsigned), not bool."""
    d = DTYPE_TABLE.get(name)
    return d is not None and d.is_int


def is_lowp_dtype(name: str) -> bool:
    """A float of 8 bits or fewer, or an integer narrower than a byte (``LOWP_DTYPES``)."""
    return name in LOWP_DTYPES


def int_range(name: str) -> tuple[int, int]:
    """The smallest and largest value of integer dtype ``name``."""
    d = dtype_info(name)
    if not d.is_int:
        raise UnsupportedError(f"int_range: {name} is not an integer dtype")
    if d.kind == "uint":
        return 0, (1 << d.bits) - 1
    return -(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1


def max_finite(name: str) -> float:
    """The largest finite value of float dtype ``name``."""
    import ml_dtypes

    if not is_float_dtype(name):
        raise UnsupportedError(f"max_finite: {name} is not a float dtype")
    return float(ml_dtypes.finfo(np_dtype(name)).max)


def compute_dtype(name: str) -> str:
    """The dtype arithmetic runs in: float16 and bfloat16 compute in float32."""
    return dtype_info(name).compute


def itemsize(name: str) -> int:
    return dtype_info(name).itemsize


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a tilework dtype name."""
    return dtype_info(name).numpy


def dtype_name(dt: DTypeLike) -> str:
    """tilework's name for a NumPy dtype (or anything ``np.dtype`` accepts)."""
    npdt = np.dtype(dt)
    name = npdt.name if npdt.name in DTYPE_TABLE and _numpy_dtype(npdt.name) == npdt else None
    if name is None:
        raise UnsupportedError(f"NumPy dtype {npdt} has no tilework dtype (supported: {', '.join(DTYPES)})")
    return name


def from_onnx(code: int) -> str | None:
    """The tilework dtype of an ONNX element type code, or None when there is none."""
    return _BY_ONNX.get(code)


def to_onnx(name: str) -> int:
    return dtype_info(name).onnx


def from_torch(dt: object) -> str | None:
    """The tilework dtype of a torch dtype (``torch.float32`` -> ``"float32"``), or None."""
    text = str(dt)
    if not text.startswith("torch."):
        return None
    name = text[len("torch.") :]
    return name if name in DTYPE_TABLE else None


def encode_array(a: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    """``(dtype name, shape, raw bytes)`` of ``a``: row-major, little-endian. The one array
    serializer: the text format's constants and every file format use it."""
    name = dtype_name(a.dtype)
    data = np.ascontiguousarray(a)
    if data.dtype.byteorder == ">" or (data.dtype.byteorder == "=" and np.little_endian is False):
        data = data.byteswap()
    return name, tuple(int(d) for d in a.shape), data.tobytes()


def decode_array(dtype: object, shape: object, data: bytes | memoryview, *, copy: bool = True) -> np.ndarray:
    """The array that ``encode_array`` gave ``(dtype, shape, data)`` for; every part is checked
    (a known dtype, a shape of non-negative ints, exactly as many bytes as it needs).
    ``copy=False`` gives a read-only view of ``data``."""
    if not isinstance(dtype, str) or dtype not in DTYPE_TABLE:
        raise UnsupportedError(f"array of unknown dtype {dtype!r}")
    if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= 0 for d in shape):
        raise UnsupportedError(f"array of malformed shape {shape!r}")
    info = DTYPE_TABLE[dtype]
    count = 1
    for d in shape:
        count *= d
    if len(data) != count * info.itemsize:
        raise UnsupportedError(f"array {dtype}{list(shape)} needs {count * info.itemsize} bytes, got {len(data)}")
    arr = np.frombuffer(data, info.numpy.newbyteorder("<"), count).reshape(tuple(shape))
    if not np.little_endian:
        arr = arr.byteswap().view(info.numpy)
    return arr.copy() if copy else arr


def to_torch(name: str) -> Any:
    """The torch dtype of a tilework dtype (imports torch)."""
    import torch

    return getattr(torch, dtype_info(name).name)


__all__ = [
    "DType", "DTYPE_TABLE", "DTYPES", "FLOAT_DTYPES", "INT_DTYPES", "dtype_info", "is_float_dtype",
    "is_int_dtype", "compute_dtype", "LOWP_DTYPES", "LOWP_FLOAT_DTYPES", "SUBBYTE_INT_DTYPES", "is_lowp_dtype", "int_range", "max_finite", "itemsize", "np_dtype", "dtype_name", "encode_array", "decode_array", "from_onnx", "to_onnx", "from_torch", "to_torch",
]  # fmt: skip

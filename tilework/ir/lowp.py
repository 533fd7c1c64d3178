"""Conversions to and from the low-precision dtypes, on NumPy arrays: the semantics the C
kernels (``tilework.codegen.c.lowp``) implement and the interpreter runs. docs/semantics.md
states them; in short:

- float8 (``e4m3fn``, ``e4m3fnuz``, ``e5m2``, ``e5m2fnuz``) and ``float4_e2m1fn``: round to
  nearest, ties to even, at the value's binade (subnormals included). A value beyond the
  largest finite one after rounding overflows: to inf in ``e5m2``, to NaN in the others
  (``fn``: ``S.1111.111``; ``fnuz``: ``0x80``, the one NaN); ``float4_e2m1fn`` has neither and
  saturates to +-6, and NaN becomes 0. ``fnuz`` has no -0 (a negative zero result is +0).
  This is ml_dtypes' ``astype`` (ONNX ``Cast`` with ``saturate=0``); saturation is the caller's
  clamp before converting.
- ``float8_e8m0fnu`` (a biased power of two, ``0xff`` NaN): ONNX's conversion of the float32
  value, the sign ignored, ``round_mode`` ``up`` (default), ``down`` or ``nearest``, saturating
  (default) or overflowing to NaN; inf and NaN become NaN, zero the smallest value ``2^-127``.
- ``int4``, ``uint4``, ``int2``, ``uint2``: from a float, toward zero, and NaN, inf or a
  truncated value out of range give 0 (ml_dtypes, ONNX's reference); from an integer, two's
  complement wrap-around.
"""

from __future__ import annotations

import math

import numpy as np

from tilework.errors import UnsupportedError
from tilework.ir.dtype import dtype_info, int_range, np_dtype

# name -> (mantissa bits, smallest normal exponent, largest finite code, total bits, flavour)
GRID_FORMATS: dict[str, tuple[int, int, int, int, str]] = {
    "float8_e4m3fn": (3, -6, 0x7E, 8, "fn"),
    "float8_e4m3fnuz": (3, -7, 0x7F, 8, "fnuz"),
    "float8_e5m2": (2, -14, 0x7B, 8, "ieee"),
    "float8_e5m2fnuz": (2, -15, 0x7F, 8, "fnuz"),
    "float4_e2m1fn": (1, 0, 0x7, 4, "sat"),
}
E8M0 = "float8_e8m0fnu"
ROUND_MODES = ("up", "down", "nearest")


def _grid_codes(x: np.ndarray, name: str) -> np.ndarray:
    m, emin, maxcode, bits, flavour = GRID_FORMATS[name]
    x = np.asarray(x, np.float64)
    nan = np.isnan(x)
    fin = np.isfinite(x)
    a = np.where(fin, np.abs(x), 0.0)
    _, e = np.frexp(a)
    e = np.where(a == 0, emin, np.maximum(e.astype(np.int64) - 1, emin))  # a in [2^e, 2^(e+1)), or subnormal
    r = np.rint(np.ldexp(a, (m - e).astype(np.int32))).astype(np.int64)  # ties to even
    code = ((e - emin) << m) + r  # a carry into the next binade is the next code
    sign = np.signbit(x).astype(np.int64) << (bits - 1)
    over = (~fin & ~nan) | (code > maxcode)
    code = np.minimum(code, maxcode)
    out = code | sign
    if flavour == "fn":
        out = np.where(over | nan, 0x7F | sign, out)
    elif flavour == "ieee":
        out = np.where(over, 0x7C | sign, np.where(nan, 0x7E | sign, out))
    elif flavour == "fnuz":
        out = np.where(code == 0, 0, out)
        out = np.where(over | nan, 0x80, out)
    else:  # sat: no inf, no NaN
        out = np.where(over, maxcode | sign, np.where(nan, 0, out))
    return out.astype(np.uint8)


def _grid_values(codes: np.ndarray, name: str) -> np.ndarray:
    m, emin, _, bits, flavour = GRID_FORMATS[name]
    b = np.asarray(codes, np.int64)
    c = b & ((1 << (bits - 1)) - 1)
    neg = ((b >> (bits - 1)) & 1).astype(bool)
    sub = c < (1 << m)
    mant = np.where(sub, c, (c & ((1 << m) - 1)) + (1 << m)).astype(np.float64)
    exp = np.where(sub, emin - m, (c >> m) + emin - 1 - m).astype(np.int32)
    v = np.ldexp(mant, exp)
    v = np.where(neg, -v, v)
    nan = np.where(neg, -np.nan, np.nan)  # NaN keeps its sign bit, as in ml_dtypes
    if flavour == "fn":
        v = np.where(c == 0x7F, nan, v)
    elif flavour == "ieee":
        v = np.where(c == 0x7C, np.where(neg, -np.inf, np.inf), np.where(c > 0x7C, nan, v))
    elif flavour == "fnuz":
        v = np.where(b == 0x80, nan, v)
    return v.astype(np.float32)


def e8m0_codes(x: np.ndarray, round_mode: str = "up", saturate: bool = True) -> np.ndarray:
    """The ``float8_e8m0fnu`` codes of ``x`` (converted to float32 first, as ONNX does)."""
    if round_mode not in ROUND_MODES:
        raise UnsupportedError(f"float8_e8m0fnu: unknown round_mode {round_mode!r}; expected one of {', '.join(ROUND_MODES)}")
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.int64)
    e = (u >> 23) & 0xFF
    if round_mode == "up":
        inc = (u & 0x7FFFFF) != 0
    elif round_mode == "down":
        inc = np.zeros(e.shape, bool)
    else:  # the bit below the exponent set, and more below it or a normal value
        inc = (((u >> 22) & 1) == 1) & (((u & 0x3FFFFF) != 0) | (e > 0))
    inc &= e != 0xFF
    if saturate:
        inc &= e != 0xFE
    return (e + inc).astype(np.uint8)


def _e8m0_values(codes: np.ndarray) -> np.ndarray:
    b = np.asarray(codes, np.int64)
    v = np.ldexp(np.ones(b.shape), (b - 127).astype(np.int32))
    return np.where(b == 0xFF, np.nan, v).astype(np.float32)


def _int_values(x: np.ndarray, name: str) -> np.ndarray:
    lo, hi = int_range(name)
    x = np.asarray(x)
    if x.dtype.kind in "biu":
        span = hi - lo + 1
        return ((x.astype(np.int64) - lo) % span + lo).astype(np.int64)
    with np.errstate(invalid="ignore"):
        t = np.trunc(x.astype(np.float64))
        ok = (t >= lo) & (t <= hi)
    return np.where(ok, t, 0).astype(np.int64)


def convert(x: np.ndarray, dtype: str, round_mode: str = "up", saturate: bool = True) -> np.ndarray:
    """``x`` (a NumPy array of a standard dtype) converted to low-precision ``dtype``, as an array
    of ``dtype``'s NumPy dtype. ``round_mode`` and ``saturate`` concern ``float8_e8m0fnu`` only."""
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        x = x.astype(np.float32)  # another ml_dtypes float: exact in float32
    if dtype in GRID_FORMATS:
        return _grid_codes(x, dtype).view(np_dtype(dtype))
    if dtype == E8M0:
        return e8m0_codes(x, round_mode, saturate).view(np_dtype(dtype))
    if dtype_info(dtype).is_int and dtype_info(dtype).bits < 8:
        return _int_values(x, dtype).astype(np.int8 if dtype.startswith("int") else np.uint8).astype(np_dtype(dtype))
    raise UnsupportedError(f"{dtype} is not a low-precision dtype")


def values(a: np.ndarray, dtype: str) -> np.ndarray:
    """The values of the codes of ``a`` (an array of low-precision ``dtype``): float32 for the
    floats, int64 for the integers. Independent of ml_dtypes' own conversions."""
    raw = np.ascontiguousarray(a).view(np.uint8)
    if dtype in GRID_FORMATS:
        return _grid_values(raw, dtype)
    if dtype == E8M0:
        return _e8m0_values(raw)
    lo, _ = int_range(dtype)
    bits = dtype_info(dtype).bits
    v = raw.astype(np.int64) & ((1 << bits) - 1)
    return v - (1 << bits) * (v >= (1 << (bits - 1))) if lo < 0 else v


def round_scalar(v: float, dtype: str) -> float:
    """``v`` rounded to low-precision float ``dtype`` (its conversion, then back), in plain
    Python: the interpreter and constant folding convert one value at a time. A NaN keeps the
    sign of its code, as ``values(convert(...))`` gives it."""
    if dtype == E8M0:
        with np.errstate(over="ignore"):
            u = int(np.float32(v).view(np.uint32))  # float32 first, as ONNX; beyond its range: inf
        e = (u >> 23) & 0xFF
        e += int(e not in (0xFF, 0xFE) and (u & 0x7FFFFF) != 0)
        return math.nan if e == 0xFF else math.ldexp(1.0, e - 127)
    m, emin, maxcode, _, flavour = GRID_FORMATS[dtype]
    neg = math.copysign(1.0, v) < 0
    nan = math.copysign(math.nan, -1.0 if flavour == "fnuz" else v)  # fnuz's one NaN, 0x80, reads as -NaN
    if v != v:
        return 0.0 if flavour == "sat" else nan
    a = abs(v)
    code = maxcode + 1
    if a != math.inf:
        e = emin if a == 0 else max(math.frexp(a)[1] - 1, emin)
        code = ((e - emin) << m) + round(math.ldexp(a, m - e))  # round: ties to even
    if code > maxcode:
        if flavour == "ieee":
            return -math.inf if neg else math.inf
        if flavour != "sat":
            return nan
        code = maxcode
    if code < (1 << m):
        r = math.ldexp(code, emin - m)
    else:
        r = math.ldexp((code & ((1 << m) - 1)) + (1 << m), (code >> m) + emin - 1 - m)
    if code == 0 and flavour == "fnuz":
        return 0.0
    return -r if neg else r


def int_scalar(v: object, dtype: str) -> int:
    """``v`` (a Python or NumPy number) converted to sub-byte integer ``dtype``, in plain Python."""
    lo, hi = int_range(dtype)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if f != f or f in (math.inf, -math.inf):
            return 0
        t = math.trunc(f)
        return t if lo <= t <= hi else 0
    return (int(v) - lo) % (hi - lo + 1) + lo  # type: ignore[call-overload]


__all__ = ["GRID_FORMATS", "E8M0", "ROUND_MODES", "convert", "values", "e8m0_codes", "round_scalar", "int_scalar"]

"""C for the low-precision dtypes: conversions between their one-byte storage and the values
kernels compute with (float for the float8/float4 formats, int8_t/uint8_t for the sub-byte
integers), with the semantics of ``tilework.ir.lowp`` (docs/semantics.md).

- ``tw_to_<dtype>(double)``: a value to its code, rounding to nearest even (``float8_e8m0fnu``:
  ONNX's ``round_mode="up"``, saturating); ``tw_from_<dtype>(uint8_t)``: a code to its value.
  The float grids share ``tw_lowp_enc``/``tw_lowp_dec``, parameterized by mantissa bits, smallest
  normal exponent, largest finite code and the format's NaN/inf flavour.
- ``tw_to_<int>(double)``: a float to a sub-byte integer (toward zero; NaN, inf, out of range
  give 0); ``tw_wrap_<int>(int64_t)``: an integer wrapped to it; ``tw_from_<int>``/
  ``tw_store_<int>``: the byte (the value in the low bits) to the value and back.

Everything is ``static inline`` in the kernel prelude: the emitter (``tilework.codegen.c.emit``)
calls ``load``, ``store`` and ``cast`` below.
"""

from __future__ import annotations

from tilework.ir.dtype import DTYPE_TABLE, LOWP_FLOAT_DTYPES, SUBBYTE_INT_DTYPES, is_float_dtype
from tilework.ir.lowp import GRID_FORMATS

_FLAVOUR = {"fn": 0, "fnuz": 1, "ieee": 2, "sat": 3}


def _grid_functions() -> str:
    out = []
    for name, (m, emin, maxcode, bits, flavour) in GRID_FORMATS.items():
        args = f"{m}, {emin}, {maxcode}, {bits}, {_FLAVOUR[flavour]}"
        out.append(f"static inline uint8_t tw_to_{name}(double x) {{ return tw_lowp_enc(x, {args}); }}")
        out.append(f"static inline float tw_from_{name}(uint8_t b) {{ return tw_lowp_dec(b, {args}); }}")
    return "\n".join(out) + "\n"


def _int_functions() -> str:
    out = []
    for name in SUBBYTE_INT_DTYPES:
        d = DTYPE_TABLE[name]
        signed = d.kind == "int"
        t, mask = d.c_value, (1 << d.bits) - 1
        lo, hi = (-(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1) if signed else (0, mask)
        half = 1 << (d.bits - 1)
        value = f"(int8_t)((int)((b & {mask}u) ^ {half}u) - {half})" if signed else f"(uint8_t)(b & {mask}u)"
        out.append(f"static inline {t} tw_from_{name}(uint8_t b) {{ return {value}; }}")
        out.append(f"static inline uint8_t tw_store_{name}({t} v) {{ return (uint8_t)((uint8_t)v & {mask}u); }}")
        out.append(
            f"static inline {t} tw_to_{name}(double x) {{ double t = trunc(x); "
            f"return (t >= {lo}.0 && t <= {hi}.0) ? ({t})t : 0; }}"
        )
        out.append(f"static inline {t} tw_wrap_{name}(int64_t v) {{ return tw_from_{name}((uint8_t)((uint64_t)v & {mask}u)); }}")
    return "\n".join(out) + "\n"


LOWP_PRELUDE = (
    r"""
/* low-precision dtypes (tilework.codegen.c.lowp, docs/semantics.md). Float grids: m mantissa
   bits, smallest normal exponent emin, largest finite code maxc, bits in all; flavour 0 fn (no
   inf, S.1..1 NaN), 1 fnuz (no inf, no -0, 0x80 NaN), 2 ieee (inf, NaN), 3 sat (neither:
   overflow saturates, NaN gives 0). The code of |x| is (binade - emin) * 2^m + the significand
   rounded to m bits (ties to even), which also covers subnormals and the carry into the next
   binade. */
static inline uint8_t tw_lowp_enc(double x, int m, int emin, int maxc, int bits, int flavour) {
    int64_t sign = signbit(x) ? (int64_t)1 << (bits - 1) : 0;
    if (x != x) return (uint8_t)(flavour == 0 ? (0x7f | sign) : flavour == 1 ? 0x80 : flavour == 2 ? (0x7e | sign) : 0);
    double a = fabs(x);
    int64_t code = (int64_t)maxc + 1;
    if (a <= 0x1p64) {
        int e = emin;
        if (a > 0) {
            (void)frexp(a, &e);
            e = e - 1 < emin ? emin : e - 1;
        }
        code = ((int64_t)(e - emin) << m) + (int64_t)nearbyint(ldexp(a, m - e));
    }
    if (code > maxc) {
        if (flavour == 3) return (uint8_t)(maxc | sign);
        if (flavour == 2) return (uint8_t)(0x7c | sign);
        return (uint8_t)(flavour == 0 ? (0x7f | sign) : 0x80);
    }
    if (code == 0 && flavour == 1) return 0;
    return (uint8_t)(code | sign);
}
static inline float tw_lowp_dec(uint8_t b, int m, int emin, int maxc, int bits, int flavour) {
    int c = b & ((1 << (bits - 1)) - 1), neg = (b >> (bits - 1)) & 1;
    (void)maxc;
    if (flavour == 0 && c == 0x7f) return neg ? -NAN : NAN;
    if (flavour == 1 && b == 0x80) return -NAN;
    if (flavour == 2 && c >= 0x7c) return c == 0x7c ? (neg ? -INFINITY : INFINITY) : (neg ? -NAN : NAN);
    float v = c < (1 << m) ? ldexpf((float)c, emin - m) : ldexpf((float)((c & ((1 << m) - 1)) + (1 << m)), (c >> m) + emin - 1 - m);
    return neg ? -v : v;
}
/* float8_e8m0fnu: ONNX's conversion of the float32 value, sign ignored, round_mode "up",
   saturating; inf and NaN give NaN (0xff), zero 2^-127 (0x00). */
static inline uint8_t tw_to_float8_e8m0fnu(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t e = (u >> 23) & 0xffu;
    if (e == 0xffu) return 0xff;
    return (uint8_t)(e + ((u & 0x7fffffu) != 0 && e != 0xfeu));
}
static inline float tw_from_float8_e8m0fnu(uint8_t b) { return b == 0xff ? NAN : ldexpf(1.0f, (int)b - 127); }
/* the code of a float8_e8m0fnu value (a power of two or NaN) exactly: the conversion above would
   round the smallest value, 2^-127 (a float32 subnormal), up */
static inline uint8_t tw_store_float8_e8m0fnu(float v) {
    int e = 0;
    if (v != v) return 0xff;
    (void)frexpf(v, &e);
    return (uint8_t)(e + 126);
}
"""
    + _grid_functions()
    + _int_functions()
)


def load(dtype: str, text: str) -> str | None:
    """The value of the stored element ``text`` of a low-precision buffer (None: not one)."""
    if dtype in LOWP_FLOAT_DTYPES or dtype in SUBBYTE_INT_DTYPES:
        return f"tw_from_{dtype}({text})"
    return None


def store(dtype: str, value: str) -> str | None:
    """The byte that stores ``value`` (of ``dtype``, already representable) (None: not lowp)."""
    if dtype == "float8_e8m0fnu":
        return f"tw_store_float8_e8m0fnu({value})"
    if dtype in LOWP_FLOAT_DTYPES:
        return f"tw_to_{dtype}((double)({value}))"
    if dtype in SUBBYTE_INT_DTYPES:
        return f"tw_store_{dtype}({value})"
    return None


def cast(src: str, dst: str, a: str) -> str | None:
    """``a`` (a value of ``src``) converted to low-precision ``dst`` (None: ``dst`` is not)."""
    if dst in LOWP_FLOAT_DTYPES:
        return f"tw_from_{dst}(tw_to_{dst}((double)({a})))"
    if dst in SUBBYTE_INT_DTYPES:
        if is_float_dtype(src):
            return f"tw_to_{dst}((double)({a}))"
        return f"tw_wrap_{dst}((int64_t)({a}))"
    return None


__all__ = ["LOWP_PRELUDE", "load", "store", "cast"]

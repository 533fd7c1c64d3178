"""The low-precision dtypes (float8, float4, float8_e8m0fnu, int4/uint4/int2/uint2) through the
compiled path (graph -> legalize -> C kernels -> VM) and the interpreter: every conversion to and
from them, checked against ml_dtypes (and ONNX's float8_e8m0fnu conversion) at edge values — the
largest and smallest finite values, subnormals, ties between neighbours, out of range, NaN,
inf, zeros — at sizes 0, 1 and odd; data movement and upcast arithmetic on them.

A float source of a conversion to a low-precision float is widened to double before the
format's encoder: from float16 and bfloat16 sources only ``float8_e4m3fn`` converts in the
default run (the other formats from float32 and float64), and to bfloat16 only
``float8_e4m3fn``'s values (the others to float16, float32 and float64); the other formats'
half-precision conversions run in the long tier, left out of the module's build otherwise."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterator

import ml_dtypes
import numpy as np
import pytest
from onnx.numpy_helper import to_float8e8m0

import tilework as tw
from tests.long import LONG, long_param
from tilework.codegen import interp
from tilework.errors import RuntimeCheckError
from tilework.ir import lowp
from tilework.ir.builder import BlockBuilder
from tilework.ir.dtype import DTYPE_TABLE, LOWP_FLOAT_DTYPES, SUBBYTE_INT_DTYPES, dtype_info, dtype_name, from_onnx, int_range, np_dtype, to_onnx
from tilework.ir.graph import Expr, Var
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.ir.loop import TensorFunc
from tilework.op import elementwise as ew
from tilework.op import bitwise, linalg, manipulate, reduce
from tilework import te

FLOAT_SOURCES = ("float32", "float16", "bfloat16", "float64")
HALF_FORMAT = "float8_e4m3fn"  # the one format converted from float16/bfloat16 and to bfloat16 in the default run


def _half_long(dtype: str, other: str, halves: tuple[str, ...]) -> bool:
    """The conversion of ``dtype`` from or to ``other`` is in the long tier only."""
    return other in halves and dtype != HALF_FORMAT


def _grid(halves: tuple[str, ...]) -> list[Any]:
    """``(other, dtype)`` params of the float conversions, the long tier's marked."""
    return [
        long_param(o, d, id=f"{o}-{d}", why=f"{HALF_FORMAT} converts half precision: the encoder takes a double") if _half_long(d, o, halves) else pytest.param(o, d, id=f"{o}-{d}")
        for o in FLOAT_SOURCES for d in LOWP_FLOAT_DTYPES
    ]  # fmt: skip
SIZES = (0, 1, 37)


def _edges(dtype: str) -> np.ndarray:
    """Every finite value of a float format, the midpoints (ties) between neighbours and values
    just off them, beyond the largest, specials and zeros (float64)."""
    codes = np.arange(16 if dtype == "float4_e2m1fn" else 256, dtype=np.uint8)
    v = lowp.values(codes.view(np_dtype(dtype)), dtype).astype(np.float64)
    v = np.unique(v[np.isfinite(v)])
    mid = (v[:-1] + v[1:]) / 2
    top = float(v.max())
    extra = [top * 1.01, top * 1.5, top * 2, 1e30, 3e38, np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30]
    x = np.concatenate([v, mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), extra])
    return np.concatenate([x, -x])


def _expected(x: np.ndarray, dtype: str) -> np.ndarray:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if dtype == "float8_e8m0fnu":
            return to_float8e8m0(x.astype(np.float32), True, "up")
        return x.astype(np_dtype(dtype))


def _assert_same(got: np.ndarray, want: np.ndarray, dtype: str, x: np.ndarray | None = None, signed_zeros: bool = True) -> None:
    """Equal codes; NaN results need only be NaN, and float4 gives 0 for NaN (ml_dtypes: +-0);
    ``signed_zeros=False``: -0 and +0 count as equal (a sum starting from +0)."""
    if not signed_zeros and dtype in LOWP_FLOAT_DTYPES:
        got, want = got.copy(), want.copy()
        got[got.astype(np.float32) == 0] = 0
        want[want.astype(np.float32) == 0] = 0
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype in SUBBYTE_INT_DTYPES:
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64))
        return
    g, w = got.astype(np.float32), want.astype(np.float32)
    nan = np.isnan(w)
    np.testing.assert_array_equal(np.isnan(g), nan)
    skip = nan if x is None or dtype != "float4_e2m1fn" else nan | np.isnan(x)
    bad = np.nonzero(got.view(np.uint8)[~skip] != want.view(np.uint8)[~skip])[0]
    if dtype == "float4_e2m1fn" and x is not None:
        assert np.all(g[np.isnan(x)] == 0)
    assert bad.size == 0, f"{dtype}: {bad.size} mismatches: inputs {(x[~skip][bad[:6]] if x is not None else '')}, got {g[~skip][bad[:6]]}, want {w[~skip][bad[:6]]}"


# -- one module: every conversion as a function of a symbolic-length vector ---------------------

_FUNCS: dict[str, tuple[tuple[str, ...], Callable[..., Expr]]] = {}
for _d in LOWP_FLOAT_DTYPES:
    for _s in FLOAT_SOURCES:
        if LONG or not _half_long(_d, _s, ("float16", "bfloat16")):
            _FUNCS[f"to_{_d}_from_{_s}"] = ((_s,), lambda x, d=_d: ew.astype(x, d))
        if LONG or not _half_long(_d, _s, ("bfloat16",)):
            _FUNCS[f"from_{_d}_to_{_s}"] = ((_d,), lambda x, s=_s: ew.astype(x, s))
    _FUNCS[f"to_{_d}_from_int32"] = (("int32",), lambda x, d=_d: ew.astype(x, d))
    _FUNCS[f"add_{_d}"] = ((_d, _d), lambda a, b: ew.add(a, b))
for _d in SUBBYTE_INT_DTYPES:
    for _s in ("float32", "float16", "float64", "int32", "int8"):
        _FUNCS[f"to_{_d}_from_{_s}"] = ((_s,), lambda x, d=_d: ew.astype(x, d))
    for _s in ("float32", "int8", "int64"):
        _FUNCS[f"from_{_d}_to_{_s}"] = ((_d,), lambda x, s=_s: ew.astype(x, s))
    _FUNCS[f"add_{_d}"] = ((_d, _d), lambda a, b: ew.add(a, b))
for _d in ("float8_e4m3fn", "float4_e2m1fn", "int4", "uint2"):
    _FUNCS[f"move_{_d}"] = ((_d,), lambda x: _move(x))


for _d in ("float8_e4m3fn", "float8_e5m2fnuz", "float4_e2m1fn", "int4", "uint4"):
    _FUNCS[f"sum_{_d}"] = ((_d,), lambda x: reduce.sum(x, axis=[0]))
    _FUNCS[f"max_{_d}"] = ((_d,), lambda x: reduce.max(x, axis=[0]))
    _FUNCS[f"outer_{_d}"] = ((_d,), lambda x: linalg.matmul(manipulate.reshape(x, (x.info.shape[0], 1)), manipulate.reshape(x, (1, x.info.shape[0]))))
for _d in LOWP_FLOAT_DTYPES + SUBBYTE_INT_DTYPES:
    _FUNCS[f"bits_to_{_d}"] = (("uint8",), lambda x, d=_d: bitwise.bitcast(x, d))
    _FUNCS[f"bits_of_{_d}"] = ((_d,), lambda x: bitwise.bitcast(x, "uint8"))


def _move(x: Var) -> Expr:
    """``concat([reshape(x, (n, 1)).T, reshape(x, (1, n))], 0)``: data movement only."""
    n = x.info.shape[0]  # type: ignore[attr-defined]
    col = manipulate.permute_dims(manipulate.reshape(x, (n, 1)), (1, 0))
    return manipulate.concat([col, manipulate.reshape(x, (1, n))], 0)


def _module() -> IRModule:
    n = tw.dim("n", min=0)
    bb = BlockBuilder()
    for name, (srcs, make) in _FUNCS.items():
        params = [Var(f"x{i}", TensorInfo((n,), s)) for i, s in enumerate(srcs)]
        with bb.function(name, params):
            bb.emit_func_output(bb.emit(make(*params)))
    return bb.get()


@pytest.fixture(scope="module")
def vm() -> Iterator[tw.VM]:
    yield tw.VM(tw.build(_module()))


def _run(vm: tw.VM, name: str, *args: np.ndarray) -> np.ndarray:
    return np.asarray(vm[name](*args))


def _sized(x: np.ndarray) -> Iterator[np.ndarray]:
    """``x`` (odd length), and its first 0 and 1 elements."""
    n = len(x) if len(x) % 2 else len(x) - 1
    yield x[:n]
    for k in SIZES[:2]:
        yield x[:k]


@pytest.mark.parametrize(("src", "dtype"), _grid(("float16", "bfloat16")))
def test_float_to_lowp(vm: tw.VM, dtype: str, src: str) -> None:
    with np.errstate(all="ignore"):
        x = _edges(dtype).astype(np_dtype(src))
    for xs in _sized(x):
        _assert_same(_run(vm, f"to_{dtype}_from_{src}", xs), _expected(xs, dtype), dtype, xs.astype(np.float64))


@pytest.mark.parametrize("dtype", LOWP_FLOAT_DTYPES)
def test_int_to_lowp_float(vm: tw.VM, dtype: str) -> None:
    x = np.array([0, 1, -1, 3, 7, 9, 17, 100, 239, 241, 247, 248, 449, 464, 465, 57343, 61440, 100000, -100000, 2**31 - 1], np.int32)
    _assert_same(_run(vm, f"to_{dtype}_from_int32", x), _expected(x.astype(np.float64), dtype), dtype)


@pytest.mark.parametrize(("dst", "dtype"), _grid(("bfloat16",)))
def test_lowp_float_to_float(vm: tw.VM, dtype: str, dst: str) -> None:
    codes = np.arange(16 if dtype == "float4_e2m1fn" else 256, dtype=np.uint8).view(np_dtype(dtype))
    for c in _sized(codes):
        got = _run(vm, f"from_{dtype}_to_{dst}", c)
        want = c.astype(np.float32).astype(np_dtype(dst))
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


@pytest.mark.parametrize("dtype", SUBBYTE_INT_DTYPES)
def test_sub_byte_int_conversions(vm: tw.VM, dtype: str) -> None:
    f = np.concatenate([np.arange(-20, 20, 0.25), [np.nan, np.inf, -np.inf, 1e30, -0.0, 7.999, 8.0, -8.0, -8.5, 3.5, -2.5, 2.5]])
    i = np.arange(-300, 301)
    for src, x in (("float32", f), ("float16", f), ("float64", f), ("int32", i), ("int8", np.arange(-128, 127))):
        xs = x.astype(np_dtype(src))
        for part in _sized(xs):
            _assert_same(_run(vm, f"to_{dtype}_from_{src}", part), _expected(part, dtype), dtype)
    lo, hi = int_range(dtype)
    q = np.arange(lo, hi + 1).astype(np_dtype(dtype))
    q = np.concatenate([q, q, q[:1]])  # odd length
    for dst in ("float32", "int8", "int64"):
        for part in _sized(q):
            got = _run(vm, f"from_{dtype}_to_{dst}", part)
            np.testing.assert_array_equal(got, part.astype(np.int64).astype(np_dtype(dst)))


@pytest.mark.parametrize("dtype", LOWP_FLOAT_DTYPES + SUBBYTE_INT_DTYPES)
def test_arithmetic_upcasts(vm: tw.VM, dtype: str) -> None:
    """``add`` computes in float32 (int32 for the sub-byte ints) and converts once, like
    ml_dtypes' own arithmetic."""
    rng = np.random.default_rng(1)
    if dtype in SUBBYTE_INT_DTYPES:
        a, b = (rng.integers(-8, 16, 41).astype(np_dtype(dtype)) for _ in range(2))
        want = (a.astype(np.int64) + b.astype(np.int64)).astype(np_dtype(dtype))
    else:
        codes = np.arange(16 if dtype == "float4_e2m1fn" else 256, dtype=np.uint8)
        a, b = (rng.permutation(codes)[:41].view(np_dtype(dtype)) for _ in range(2))
        want = _expected(a.astype(np.float32) + b.astype(np.float32), dtype)
    _assert_same(_run(vm, f"add_{dtype}", a, b), want, dtype)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2fnuz", "float4_e2m1fn", "int4", "uint4"])
def test_reductions_and_matmul_upcast(vm: tw.VM, dtype: str) -> None:
    """``sum``, ``max`` and ``matmul`` accumulate in float32 (int32) and convert the result once."""
    rng = np.random.default_rng(2)
    if dtype in SUBBYTE_INT_DTYPES:
        lo, hi = int_range(dtype)
        x = rng.integers(lo, hi + 1, 23).astype(np_dtype(dtype))
        wide = x.astype(np.int64)

        def narrow(v: np.ndarray) -> np.ndarray:
            return np.asarray(v).astype(np.int64).astype(np_dtype(dtype))
    else:
        x = (rng.standard_normal(23) * 2).astype(np_dtype(dtype))
        wide = x.astype(np.float32)

        def narrow(v: np.ndarray) -> np.ndarray:
            return _expected(np.asarray(v, np.float32), dtype)
    for part, w in ((x, wide), (x[:1], wide[:1])):
        _assert_same(_run(vm, f"sum_{dtype}", part), narrow(w.sum(0)), dtype)
        _assert_same(_run(vm, f"max_{dtype}", part), narrow(w.max(0)), dtype)
        _assert_same(_run(vm, f"outer_{dtype}", part), narrow(np.outer(w, w)), dtype, signed_zeros=False)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float4_e2m1fn", "int4", "uint2"])
def test_data_movement(vm: tw.VM, dtype: str) -> None:
    if dtype in SUBBYTE_INT_DTYPES:
        lo, hi = int_range(dtype)
        x = np.resize(np.arange(lo, hi + 1), 39).astype(np_dtype(dtype))
    else:
        x = np.resize(np.arange(16 if dtype == "float4_e2m1fn" else 256, dtype=np.uint8), 255).view(np_dtype(dtype))
    for part in _sized(x):
        got = _run(vm, f"move_{dtype}", part)
        want = np.concatenate([part.reshape(-1, 1).T, part.reshape(1, -1)], 0)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", LOWP_FLOAT_DTYPES + SUBBYTE_INT_DTYPES)
def test_bitcast(vm: tw.VM, dtype: str) -> None:
    """``bitcast`` between uint8 and a low-precision dtype reads and writes its one-byte code
    (ml_dtypes' ``view``; a sub-byte integer's high bits are ignored, and written as zero)."""
    width = 16 if dtype in SUBBYTE_INT_DTYPES or dtype == "float4_e2m1fn" else 256
    b = np.arange(width, dtype=np.uint8)
    b = np.concatenate([b, [width - 1]]).astype(np.uint8)
    for part in _sized(b):
        got = _run(vm, f"bits_to_{dtype}", part)
        _assert_same(got, part.view(np_dtype(dtype)), dtype)
        back = _run(vm, f"bits_of_{dtype}", got)
        if dtype in SUBBYTE_INT_DTYPES:
            np.testing.assert_array_equal(back, part & ((1 << dtype_info(dtype).bits) - 1))
        else:  # values compute as floats: a NaN comes back as the format's NaN, not its payload
            nan = np.isnan(got.astype(np.float32))
            np.testing.assert_array_equal(back[~nan], part[~nan])
            assert np.all(np.isnan(back[nan].view(np_dtype(dtype)).astype(np.float32)))


# -- the interpreter: the same conversions, as the oracle the C code is checked against ---------


def _conversions(dtype: str) -> TensorFunc:
    n = tw.dim("n", min=0)
    x = te.placeholder((n,), "float64", "x")
    y = te.placeholder((n,), dtype, "y")
    return te.create_func(
        [x, y],
        [te.compute((n,), lambda i: x[i].astype(dtype), "to"), te.compute((n,), lambda i: y[i].astype("float32"), "back")],
    )


@pytest.mark.parametrize("dtype", LOWP_FLOAT_DTYPES + SUBBYTE_INT_DTYPES)
def test_interp_conversions(dtype: str) -> None:
    x = _edges(dtype) if dtype in LOWP_FLOAT_DTYPES else np.concatenate([np.arange(-20, 20, 0.5), [np.nan, np.inf]])
    y = _expected(x, dtype)
    to, back = np.zeros(len(x), np_dtype(dtype)), np.zeros(len(x), np.float32)
    interp.run(_conversions(dtype), [x, y, to, back])
    _assert_same(to, y, dtype, x)
    np.testing.assert_array_equal(back, y.astype(np.float32))


def test_lowp_reference_values_match_ml_dtypes() -> None:
    """``tilework.ir.lowp.values`` decodes every code as ml_dtypes does (NaN as NaN)."""
    for dtype in LOWP_FLOAT_DTYPES:
        codes = np.arange(16 if dtype == "float4_e2m1fn" else 256, dtype=np.uint8).view(np_dtype(dtype))
        np.testing.assert_array_equal(lowp.values(codes, dtype), codes.astype(np.float32))
    for dtype in SUBBYTE_INT_DTYPES:
        q = np.arange(-8, 16).astype(np_dtype(dtype))
        np.testing.assert_array_equal(lowp.values(q, dtype), q.astype(np.int64))


def test_e8m0_round_modes_match_onnx() -> None:
    bits = np.concatenate([np.arange(0, 1 << 12, dtype=np.uint32) << 20, np.arange(0, 1 << 12, dtype=np.uint32) * 0x80001 + 7])
    x = bits.view(np.float32)
    for mode in lowp.ROUND_MODES:
        for sat in (True, False):
            np.testing.assert_array_equal(lowp.e8m0_codes(x, mode, sat), to_float8e8m0(x, sat, mode).view(np.uint8))


def test_numpy_dtypes_are_ml_dtypes() -> None:
    for dtype in LOWP_FLOAT_DTYPES + SUBBYTE_INT_DTYPES:
        assert np_dtype(dtype) == np.dtype(getattr(ml_dtypes, dtype))
        assert dtype_name(np.dtype(getattr(ml_dtypes, dtype))) == dtype
        assert from_onnx(to_onnx(dtype)) == dtype


def test_torch_float8_tensors_are_exchanged_by_bytes() -> None:
    torch = pytest.importorskip("torch")
    from tilework.runtime.tensor import from_torch, to_torch

    for dtype in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"):
        t = torch.arange(0, 255, dtype=torch.uint8).view(getattr(torch, dtype))
        a = from_torch(t)
        assert a.dtype == np_dtype(dtype)
        np.testing.assert_array_equal(a.view(np.uint8), t.view(torch.uint8).numpy())
        assert to_torch(a).dtype == getattr(torch, dtype)
    with pytest.raises(RuntimeCheckError, match="int4"):
        to_torch(np.zeros(3, np_dtype("int4")))


def test_export_type_codes_are_distinct() -> None:
    """The C export tells dtypes apart by (code, bits): every dtype has its own."""
    from tilework.export.graph_c import dl_type

    codes = [dl_type(n) for n in DTYPE_TABLE]
    assert len(set(codes)) == len(codes)


def test_text_round_trip() -> None:
    """Params, constants and casts of the low-precision dtypes print and parse back (a sub-byte
    integer constant prints as integers)."""
    from tilework.ir.graph import Constant
    from tilework.ir.structural import assert_structural_equal

    n = tw.dim("n")
    bb = BlockBuilder()
    x = Var("x", TensorInfo((n,), "float8_e4m3fn"))
    with bb.function("main", [x]):
        y = bb.emit(ew.astype(x, "float8_e8m0fnu"))
        c = bb.emit(ew.astype(Constant.of(np.array([1, -3, 7], ml_dtypes.int4)), "float4_e2m1fn"))
        e = bb.emit(ew.astype(Constant.of(np.array([0.5, 448.0], ml_dtypes.float8_e5m2)), "uint2"))
        bb.emit_func_output(bb.emit(manipulate.concat([bb.emit(ew.astype(y, "float32")), bb.emit(ew.astype(c, "float32")), bb.emit(ew.astype(e, "float32"))], 0)))
    mod = bb.get()
    text = str(mod)
    assert 'const([1, -3, 7], "int4")' in text
    assert_structural_equal(tw.parse(text), mod)
    got = np.asarray(tw.VM(tw.build(tw.parse(text)))["main"](np.array([0.3, -2.0, 448.0], ml_dtypes.float8_e4m3fn)))
    want = np.concatenate([_expected(np.array([0.3, -2.0, 448.0], ml_dtypes.float8_e4m3fn).astype(np.float32), "float8_e8m0fnu").astype(np.float32), [1, -3, 6], [0, 0]])
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("dtype", LOWP_FLOAT_DTYPES + SUBBYTE_INT_DTYPES)
def test_scalar_conversions_match_array_ones(dtype: str) -> None:
    """``lowp.round_scalar``/``int_scalar`` (the interpreter's and constant folding's, one value
    at a time) give the bits of ``lowp.convert`` (NaN signs included)."""
    if dtype in SUBBYTE_INT_DTYPES:
        f = np.concatenate([np.arange(-20, 20, 0.25), [np.nan, np.inf, -np.inf, 1e30]])
        np.testing.assert_array_equal([lowp.int_scalar(np.float32(v), dtype) for v in f], lowp.convert(f, dtype).astype(np.int64))
        i = np.arange(-300, 300)
        np.testing.assert_array_equal([lowp.int_scalar(np.int64(v), dtype) for v in i], lowp.convert(i, dtype).astype(np.int64))
        return
    x = _edges(dtype) if dtype != "float8_e8m0fnu" else np.ldexp(1.25, np.arange(-150, 129)).astype(np.float32).astype(np.float64)
    want = lowp.values(lowp.convert(x, dtype), dtype)
    got = np.array([lowp.round_scalar(float(v), dtype) for v in x], np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

"""``power`` with a one-element constant exponent, built by hand as text IR and compiled to C:
small integer exponents are multiplications (no libm ``pow`` in the kernel), bitwise equal to
torch's own formulas for -2..3 (``x * x * x``, ``1 / (x * x)``) and correctly rounded (within
1 ulp) for the others in float32, exact with integers; other exponents keep ``pow``. NaN, inf,
signed zeros, overflow and subnormals included, at sizes 0, 1 and odd ones."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tests.transform.util import ir
from tilework.codegen.c.emit import emit_module
from tilework.op.elementwise import POW_MUL_MAX

SIZES = (0, 1, 7, 33)
INT_EXPS = tuple(range(-3, 6)) + (-POW_MUL_MAX, POW_MUL_MAX)
FRACTIONAL = (0.5, 1.5, -2.5, float(POW_MUL_MAX + 1))  # pow, as before
SPECIAL = [np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 0.5, -2.5, 1e-20, -3e-20, 1e-40, -1e15, 3e38, -3e38, 1e-300]


def _module(dtype: str, exps: tuple[float, ...]) -> str:
    lit = (lambda e: repr(float(e))) if dtype.startswith("float") else (lambda e: str(int(e)))
    lines = [f'                y{i} = power(x, const({lit(e)}, "{dtype}"))' for i, e in enumerate(exps)]
    outs = ", ".join(f"y{i}" for i in range(len(exps)))
    body = "\n".join(lines)
    return f"""
        @graph
        def main(x: Tensor((n,), "{dtype}")):
            n = sym(lo=0)
            with dataflow():
{body}
                gv = ({outs},)
                output(gv)
            return gv
        """


def _inputs(dtype: str, k: int, rng: np.random.Generator) -> np.ndarray:
    if dtype.startswith("int"):
        return rng.integers(-20, 21, size=k).astype(dtype)
    x = np.concatenate([np.array(SPECIAL), rng.standard_normal(max(k - len(SPECIAL), 0)) * 4])[:k]
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def _same_dtype_formula(x: np.ndarray, n: int) -> np.ndarray:
    """torch's CPU ``pow`` for the exponents it computes by multiplication."""
    one = x.dtype.type(1)
    return {-2: lambda: one / (x * x), -1: lambda: one / x, 0: lambda: np.ones_like(x), 1: lambda: x, 2: lambda: x * x, 3: lambda: x * x * x}[n]()


def _assert_same_specials(got: np.ndarray, want: np.ndarray, where: str) -> None:
    assert np.array_equal(np.isnan(got), np.isnan(want)), where
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite & np.isinf(want)], want[finite & np.isinf(want)]), where
    assert np.array_equal(np.signbit(got[finite]), np.signbit(want[finite])), where


def _check_float(got: np.ndarray, x: np.ndarray, e: float, where: str) -> None:
    with np.errstate(all="ignore"):
        if e.is_integer() and -2 <= e <= 3:
            want = _same_dtype_formula(x, int(e))
            assert np.array_equal(got[~np.isnan(want)].view(f"u{x.itemsize}"), want[~np.isnan(want)].view(f"u{x.itemsize}")), where
            assert np.array_equal(np.isnan(got), np.isnan(want)), where
            return
        wide = np.float64 if x.dtype == np.float32 else np.longdouble
        xw = x.astype(wide)
        exact = np.power(xw, np.full_like(xw, e))  # an array exponent: C's pow, not NumPy's sqrt for 0.5
        want = exact.astype(x.dtype)
    _assert_same_specials(got, want, where)
    ok = np.isfinite(want) & (want != 0)
    if not e.is_integer() or abs(e) > POW_MUL_MAX:  # libm pow
        ulps = 1.0
    elif x.dtype == np.float32:
        ulps = 1.0  # rounded once from float64
    else:
        ulps = abs(e)  # float64 products
    err = np.abs(got[ok].astype(wide) - exact[ok]) / np.spacing(np.abs(want[ok])).astype(wide)
    assert err.size == 0 or float(err.max()) <= ulps, f"{where}: {float(err.max())} ulp"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_powers_match_their_formulas(dtype: str) -> None:
    exps = tuple(float(e) for e in INT_EXPS) + FRACTIONAL
    f = tw.VM(tw.build(ir(_module(dtype, exps))))["main"]
    rng = np.random.default_rng(1)
    for k in SIZES + (len(SPECIAL) + 40,):
        x = _inputs(dtype, k, rng)
        outs = f(x)
        for e, y in zip(exps, outs):
            _check_float(np.asarray(y), x, e, f"{dtype} n={k} x**{e}")


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_powers_are_exact(dtype: str) -> None:
    exps = tuple(range(0, POW_MUL_MAX + 1))
    f = tw.VM(tw.build(ir(_module(dtype, exps))))["main"]
    rng = np.random.default_rng(2)
    for k in SIZES:
        x = _inputs(dtype, k, rng)
        if dtype == "int32":
            x = np.clip(x, -14, 14)  # 14**8 fits in int32: no overflow (undefined in C)
        for e, y in zip(exps, f(x)):
            np.testing.assert_array_equal(np.asarray(y), np.power(x, e), err_msg=f"{dtype} n={k} x**{e}")
            assert np.asarray(y).dtype == x.dtype


def _c_text(dtype: str, e: float) -> str:
    return emit_module(tw.build(ir(_module(dtype, (e,)))).kernel_funcs).text


@pytest.mark.parametrize("e", [3.0, -3.0, 4.0, 2.0, 0.0])
def test_small_integer_exponent_is_no_pow_call(e: float) -> None:
    text = _c_text("float32", e)
    assert "powf(" not in text and "pow(" not in text.replace("tw_", "")


@pytest.mark.parametrize(("dtype", "e"), [("float32", 0.5), ("float32", 1.5), ("float32", 9.0), ("float64", 2.5), ("int64", -1.0)])
def test_other_exponents_keep_pow(dtype: str, e: float) -> None:
    text = _c_text(dtype, e)
    assert ("powf(" if dtype == "float32" else "pow(") in text

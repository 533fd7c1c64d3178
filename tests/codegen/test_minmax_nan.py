"""The prelude's ``tw_max*``/``tw_min*`` propagate NaN from either operand, as ``np.maximum`` and
``np.minimum`` do, in scalar code and in vector code, alone and in a chain (a max pool's taps,
a hardswish clamp ``x * min(max(x / 6 + 0.5, 0), 1)``)."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tilework import te
from tilework.codegen import CKernelModule, build_library
from tilework.schedule import default_schedule

n = tw.dim("n")


@pytest.fixture(scope="module", params=["float32", "float64"])
def library(request: pytest.FixtureRequest) -> tuple[str, CKernelModule]:
    dtype = request.param
    a, b, c = (te.placeholder((n,), dtype, s) for s in "abc")
    bodies = {
        "max": lambda i: te.maximum(a[i], b[i]),
        "min": lambda i: te.minimum(a[i], b[i]),
        "chain": lambda i: te.maximum(te.maximum(a[i], b[i]), te.minimum(c[i], a[i])),
        "hardswish": lambda i: a[i] * te.minimum(te.maximum(a[i] / te.constant(6.0, dtype) + te.constant(0.5, dtype), te.constant(0.0, dtype)), te.constant(1.0, dtype)),
    }
    funcs = {}
    for name, body in bodies.items():
        f = te.create_func([a, b, c, te.compute((n,), body, "y", dtype)])
        funcs[name] = f  # serial: scalar code
        funcs[f"{name}_vec"] = default_schedule(f, strict=True)
    return dtype, build_library(funcs)


REFS = {
    "max": lambda a, b, c: np.maximum(a, b),
    "min": lambda a, b, c: np.minimum(a, b),
    "chain": lambda a, b, c: np.maximum(np.maximum(a, b), np.minimum(c, a)),
    "hardswish": lambda a, b, c: a * np.minimum(np.maximum(a / 6 + 0.5, 0), 1),
}


@pytest.mark.parametrize("vector", [False, True])
@pytest.mark.parametrize("name", list(REFS))
@pytest.mark.parametrize("size", [1, 7, 37])
def test_nan_from_either_side(library: tuple[str, CKernelModule], name: str, vector: bool, size: int) -> None:
    dtype, lib = library
    rng = np.random.default_rng(size)
    a, b, c = (rng.standard_normal(size).astype(dtype) * 4 for _ in range(3))
    a[::3] = np.nan
    b[1::4] = np.nan
    c[::2] = np.nan
    b[::5] = np.inf
    y = np.empty_like(a)
    lib[f"{name}_vec" if vector else name].run([a, b, c, y])
    np.testing.assert_array_equal(y, REFS[name](a, b, c))

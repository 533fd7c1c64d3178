"""te-built kernels through the interpreter and compiled C, against NumPy, at several values
of their symbolic dims. All kernels are compiled in one library (one compiler invocation)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.codegen.cases import Case, build_cases, outputs_for
from tilework.codegen import CKernelModule, build_library, interp

SIZES = (1, 7, 33, 130)
CASES = {c.name: c for c in build_cases()}


@pytest.fixture(scope="module")
def library() -> CKernelModule:
    return build_library({name: c.func for name, c in CASES.items()})


def _compare(case: Case, got: list[np.ndarray], want: list[np.ndarray], who: str) -> None:
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        name = case.func.outputs[k].name
        w = np.asarray(w)
        assert g.shape == w.shape, f"{who} {name}: shape {g.shape} != {w.shape}"
        if g.dtype.kind == "f" or g.dtype.name == "bfloat16":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(g.dtype).astype(np.float64),
                                       rtol=case.tol, atol=case.tol, err_msg=f"{who} {name}")
        else:
            np.testing.assert_array_equal(g, w.astype(g.dtype), err_msg=f"{who} {name}")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", list(CASES))
def test_kernel(library: CKernelModule, name: str, size: int) -> None:
    case = CASES[name]
    rng = np.random.default_rng(size)
    inputs = case.inputs(size, rng)
    params = case.sym_params(size)
    want = case.reference(*inputs)

    by_interp = outputs_for(case.func, inputs, params)
    interp.run(case.func, [*inputs, *by_interp], params or None)
    _compare(case, by_interp, want, "interp")

    by_c = outputs_for(case.func, inputs, params)
    library[name].run([*inputs, *by_c], params or None)
    _compare(case, by_c, want, "C")

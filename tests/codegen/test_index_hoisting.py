"""Index arithmetic of fused loops is computed once per iteration of the loop it depends on:
every floor division and modulo of the batched matmul's fused parallel loop is declared at the
top of that loop's body (the C compiler cannot move a division out of the conditions it sits
in), and the kernel stays correct at extents 0, 1 and odd sizes, where a hoisted divisor may be
zero."""

from __future__ import annotations

import re

import numpy as np

import tilework as tw
from tests.transform.util import ir
from tilework.codegen.c import emit_module

BMM = """
@graph
def main(q: Tensor((b, 4, s, 16), "float32"), k: Tensor((b, 4, 16, s), "float32"), m: Tensor((b, 1, s, s), "float32")):
    b = sym(lo=0, hi=64)
    s = sym(lo=0, hi=512)
    with dataflow():
        a = matmul(q, k)
        c = multiply(a, const(0.25, "float32"))
        y = add(c, m)
        output(y)
    return y
"""


def test_divisions_of_fused_loops_are_declared_once_per_iteration() -> None:
    exe = tw.build(ir(BMM))
    text = emit_module(exe.kernel_funcs).text
    lines = text[text.index("/* kernel "):].splitlines()  # the kernels, past the prelude
    divs = [ln for ln in lines if re.search(r"tw_floor(div|mod)\(|\S / \(|\S % \(", ln)]
    assert divs, "the fused loop's index arithmetic was expected to divide by a symbolic extent"
    for ln in divs:  # only in declarations of hoisted indices, loop extents or the parallel clause
        s = ln.strip()
        assert s.startswith(("const int64_t ix", "for (", "#pragma omp")), s


def test_hoisted_indices_are_correct_at_every_extent() -> None:
    exe = tw.build(ir(BMM))
    f = tw.VM(exe)["main"]
    rng = np.random.default_rng(0)
    for b, s in ((0, 5), (2, 0), (1, 1), (3, 7), (2, 9), (1, 33), (2, 130)):
        q = rng.standard_normal((b, 4, s, 16)).astype(np.float32)
        k = rng.standard_normal((b, 4, 16, s)).astype(np.float32)
        m = rng.standard_normal((b, 1, s, s)).astype(np.float32)
        got = f(q, k, m)
        assert got.shape == (b, 4, s, s)
        np.testing.assert_allclose(got, (q @ k) * 0.25 + m, rtol=1e-4, atol=1e-4)

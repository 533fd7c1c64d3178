"""Loop-invariant float expressions of a vectorized loop are computed once before it
(``tilework.codegen.c.hoist``): a layer norm's ``1 / sqrt(var + eps)`` and ``mean`` are read
from variables declared before the normalizing loop, the kernel matches a float64 NumPy
reference at symbolic sizes 0, 1 and odd ones, and nothing is hoisted out of a loop that may run zero times."""

from __future__ import annotations

import numpy as np

import tilework as tw
from tests.transform.util import ir
from tilework.codegen.c import emit_module


def _ln(n_lo: int) -> str:
    return f"""
@graph
def main(x: Tensor((b, s, n), "float32"), g: Tensor((n,), "float32"), c: Tensor((n,), "float32")):
    b = sym(lo=0, hi=8)
    s = sym(lo=0, hi=64)
    n = sym(lo={n_lo}, hi=1024)
    with dataflow():
        y = layer_norm(x, g, c, axes=[-1], eps=1e-5)
        output(y)
    return y
"""


def _reference(x: np.ndarray, g: np.ndarray, c: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
    return ((x64 - mean) / np.sqrt(var + 1e-5) * g + c).astype(np.float32)


def test_the_normalizing_loop_reads_hoisted_invariants() -> None:
    text = emit_module(tw.build(ir(_ln(1))).kernel_funcs).text
    body = text[text.index("/* kernel "):]
    lines = [ln.strip() for ln in body.splitlines()]
    decls = [i for i, ln in enumerate(lines) if ln.startswith("const float inv")]
    assert any("sqrt" in lines[i] for i in decls), "1 / sqrt(var + eps) was expected before the loop"
    simd = [i for i, ln in enumerate(lines) if ln == "#pragma omp simd"]
    for i in decls:  # each declaration sits right before a simd loop (or another declaration)
        j = i
        while lines[j].startswith("const float inv"):
            j += 1
        assert j in simd, lines[i : j + 2]
    loops = [lines[i + 1 : i + 8] for i in simd]
    assert not any("sqrt" in ln for loop in loops for ln in loop), "the simd loops still call sqrt"


def test_nothing_is_hoisted_out_of_a_loop_that_may_not_run() -> None:
    """With ``n`` possibly 0 the normalizing loop (extent ``n``) keeps its ``sqrt`` inside
    (the reductions' fixed-size inner loops, reached only when they run, may still hoist)."""
    text = emit_module(tw.build(ir(_ln(0))).kernel_funcs).text
    lines = [ln.strip() for ln in text[text.index("/* kernel "):].splitlines()]
    assert not any(ln.startswith("const float inv") and "sqrt" in ln for ln in lines)
    assert any("sqrt" in ln for ln in lines), "the normalizing loop was expected to compute sqrt itself"


def test_hoisted_layer_norm_numerics_at_symbolic_sizes() -> None:
    rng = np.random.default_rng(0)
    for n_lo in (0, 1):
        f = tw.VM(tw.build(ir(_ln(n_lo))))["main"]
        for b, s, n in ((1, 1, 1), (1, 8, 384), (3, 7, 33), (2, 5, 1), (1, 13, 129), (0, 3, 7), (2, 0, 5)):
            x = (rng.standard_normal((b, s, n)) * 3 + 1).astype(np.float32)
            g = rng.standard_normal(n).astype(np.float32)
            c = rng.standard_normal(n).astype(np.float32)
            got = f(x, g, c)
            assert got.shape == (b, s, n)
            np.testing.assert_allclose(got, _reference(x, g, c), rtol=1e-4, atol=1e-4)

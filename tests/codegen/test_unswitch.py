"""A vectorized loop whose stores select between inputs on a loop-invariant condition chain (a
concat along an outer axis fused with what follows) is emitted once per input, each copy
reading one input (``tilework.codegen.c.hoist.unswitch_plan``): the C holds one simd loop a
concat input with no select left in it, and the kernel matches NumPy bit for bit at batch 0,
1 and odd sizes, at symbolic and fixed channel counts."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilework as tw
from tests.transform.util import ir
from tilework.codegen.c import emit_module


def _concat_relu(c0: str) -> str:
    n = "c + 5" if c0 == "c" else str(int(c0) + 5)
    return f"""
@graph
def main(a: Tensor((b, {c0}, h, w), "float32"), x: Tensor((b, 3, h, w), "float32"), y: Tensor((b, 2, h, w), "float32"), s: Tensor(({n}, 1, 1), "float32")):
    b = sym(lo=0, hi=8)
    h = sym(lo=1, hi=64)
    w = sym(lo=1, hi=64)
    {"c = sym(lo=1, hi=64)" if c0 == "c" else ""}
    with dataflow():
        t = concat((a, x, y), axis=1)
        u = multiply(t, s)
        r = relu(u)
        output(r)
    return r
"""


@pytest.mark.parametrize("c0", ["4", "c"])
def test_a_concat_loop_is_one_simd_loop_per_input(c0: str) -> None:
    text = emit_module(tw.build(ir(_concat_relu(c0))).kernel_funcs).text
    body = text[text.index("/* kernel "):]
    loops = [m.start() for m in re.finditer(r"#pragma omp simd\n", body)]
    assert len(loops) == 3, body
    for start in loops:  # each copy's store reads one input and selects nothing
        loop = body[start : body.index("}", start)]
        assert " ? " not in loop, loop


@pytest.mark.parametrize("c0", ["4", "c"])
def test_unswitched_concat_numerics(c0: str) -> None:
    f = tw.VM(tw.build(ir(_concat_relu(c0))))["main"]
    rng = np.random.default_rng(0)
    for b, c, h, w in ((1, 4, 1, 1), (2, 4, 3, 7), (0, 4, 2, 2), (1, 4, 5, 33)) if c0 == "4" else ((1, 1, 1, 1), (2, 3, 3, 7), (0, 5, 2, 2), (1, 7, 5, 33)):
        a, x, y = (rng.standard_normal((b, k, h, w)).astype(np.float32) for k in (c, 3, 2))
        s = rng.standard_normal((c + 5, 1, 1)).astype(np.float32)
        want = np.maximum(np.concatenate([a, x, y], 1) * s, np.float32(0))
        got = np.asarray(f(a, x, y, s))
        assert got.shape == want.shape and np.array_equal(got, want), (b, c, h, w)

"""fuse_ops: post-dominator grouping of kernel calls under the pattern rules, within one
dataflow block, emitted at the group's last binding so sym vars stay defined before use."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import tilework as tw
from tests.transform.util import check_pass
from tilework.errors import WellFormedError
from tilework.ir.graph import GraphFunc
from tilework.ir.module import IRModule
from tilework.ir.verify import verify
from tilework.text import parse
from tilework.transform.fuse_ops import PRIMITIVE_ATTR, FuseOps

P = FuseOps()

# Small hand-written kernels (shared with test_fuse_tensor), symbolic in every dim.
KERNELS = '''
@tensor
def exp(x: Buffer((n, m), "float32"), y: Buffer((n, m), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            with block("exp"):
                vi = spatial(n, i)
                vj = spatial(m, j)
                reads(x)
                writes(y)
                y[vi, vj] = exp(x[vi, vj])

@tensor
def add(a: Buffer((n, m), "float32"), b: Buffer((n, m), "float32"), c: Buffer((n, m), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            with block("add"):
                vi = spatial(n, i)
                vj = spatial(m, j)
                reads(a, b)
                writes(c)
                c[vi, vj] = a[vi, vj] + b[vi, vj]

@tensor
def bias(a: Buffer((n, m), "float32"), b: Buffer((m,), "float32"), c: Buffer((n, m), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            with block("bias"):
                vi = spatial(n, i)
                vj = spatial(m, j)
                reads(a, b)
                writes(c)
                c[vi, vj] = a[vi, vj] + b[vj]

@tensor
def transpose(a: Buffer((m, n), "float32"), c: Buffer((n, m), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            with block("transpose"):
                vi = spatial(n, i)
                vj = spatial(m, j)
                reads(a)
                writes(c)
                c[vi, vj] = a[vj, vi]

@tensor
def rowsum(a: Buffer((n, m), "float32"), c: Buffer((n,), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for k in range(m):
            with block("rowsum"):
                vi = spatial(n, i)
                vk = reduce(m, k)
                reads(c, a)
                writes(c)
                with init():
                    c[vi] = float32(0.0)
                c[vi] = c[vi] + a[vi, vk]

@tensor
def matmul(a: Buffer((n, k), "float32"), w: Buffer((k, m), "float32"), c: Buffer((n, m), "float32")):
    n = sym()
    k = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            for r in range(k):
                with block("matmul"):
                    vi = spatial(n, i)
                    vj = spatial(m, j)
                    vr = reduce(k, r)
                    reads(c, a, w)
                    writes(c)
                    with init():
                        c[vi, vj] = float32(0.0)
                    c[vi, vj] = c[vi, vj] + a[vi, vr] * w[vr, vj]

@tensor
def vexp(x: Buffer((n,), "float32"), y: Buffer((n,), "float32")):
    n = sym()
    for i in range(n):
        with block("vexp"):
            vi = spatial(n, i)
            reads(x)
            writes(y)
            y[vi] = exp(x[vi])

@tensor
def outer(a: Buffer((n,), "float32"), b: Buffer((m,), "float32"), c: Buffer((m, n), "float32")):
    n = sym()
    m = sym()
    for i in range(m):
        for j in range(n):
            with block("outer"):
                vi = spatial(m, i)
                vj = spatial(n, j)
                reads(a, b)
                writes(c)
                c[vi, vj] = a[vj] * b[vi]

@tensor
def tile(a: Buffer((n,), "float32"), m: int64, c: Buffer((m, n), "float32")):
    n = sym()
    m = sym()
    for i in range(m):
        for j in range(n):
            with block("tile"):
                vi = spatial(m, i)
                vj = spatial(n, j)
                reads(a)
                writes(c)
                c[vi, vj] = a[vj]

@tensor
def maxdot(a: Buffer((n, k), "float32"), c: Buffer((n,), "float32")):
    n = sym()
    k = sym()
    with allocate((n, n), "float32") as t:
        for i in range(n):
            for j in range(n):
                for r in range(k):
                    with block("dot"):
                        vi = spatial(n, i)
                        vj = spatial(n, j)
                        vr = reduce(k, r)
                        reads(t, a)
                        writes(t)
                        with init():
                            t[vi, vj] = float32(0.0)
                        t[vi, vj] = t[vi, vj] + a[vi, vr] * a[vj, vr]
        for i2 in range(n):
            for j2 in range(n):
                with block("max"):
                    vi2 = spatial(n, i2)
                    vj2 = reduce(n, j2)
                    reads(c, t)
                    writes(c)
                    with init():
                        c[vi2] = float32(-inf)
                    c[vi2] = max(c[vi2], t[vi2, vj2])
'''


def with_kernels(*texts: str, kernels: str = KERNELS) -> str:
    """The kernels followed by ``texts``, each dedented."""
    return "\n".join(textwrap.dedent(t) for t in (kernels, *texts))


def module(*texts: str, kernels: str = KERNELS) -> IRModule:
    """The verified module made of the kernels and ``texts``."""
    mod = parse(with_kernels(*texts, kernels=kernels))
    verify(mod)
    return mod


def check(before: str, expected: str, pass_: FuseOps = P) -> IRModule:
    return check_pass(pass_, with_kernels(before), with_kernels(expected))


def test_matmul_with_its_epilogue_becomes_one_primitive_group() -> None:
    before = """
    @graph
    def main(x: Tensor((n, k), "float32"), w: Tensor((k, m), "float32"), b: Tensor((m,), "float32"), r: Tensor((n, m), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        k = sym()
        m = sym()
        with dataflow():
            mm: Tensor((n, m), "float32") = call_tensor(@matmul, (x, w), out=Tensor((n, m), "float32"))
            bi: Tensor((n, m), "float32") = call_tensor(@bias, (mm, b), out=Tensor((n, m), "float32"))
            e: Tensor((n, m), "float32") = call_tensor(@exp, (bi,), out=Tensor((n, m), "float32"))
            gv: Tensor((n, m), "float32") = call_tensor(@add, (e, r), out=Tensor((n, m), "float32"))
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n, k), "float32"), w: Tensor((k, m), "float32"), b: Tensor((m,), "float32"), r: Tensor((n, m), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        k = sym()
        m = sym()
        with dataflow():
            gv: Tensor((n, m), "float32") = @fused_matmul_bias_exp_add(x, w, b, r)
            output(gv)
        return gv

    @graph(attrs={"primitive": True})
    def fused_matmul_bias_exp_add(x: Tensor((n, k), "float32"), w: Tensor((k, m), "float32"), b: Tensor((m,), "float32"), r: Tensor((n, m), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        k = sym()
        m = sym()
        with dataflow():
            mm: Tensor((n, m), "float32") = call_tensor(@matmul, (x, w), out=Tensor((n, m), "float32"))
            bi: Tensor((n, m), "float32") = call_tensor(@bias, (mm, b), out=Tensor((n, m), "float32"))
            e: Tensor((n, m), "float32") = call_tensor(@exp, (bi,), out=Tensor((n, m), "float32"))
            gv: Tensor((n, m), "float32") = call_tensor(@add, (e, r), out=Tensor((n, m), "float32"))
            output(gv)
        return gv
    """
    check(before, expected)


def test_injective_chain_prologue_but_no_prologue_into_a_matmul_and_one_anchor_a_group() -> None:
    # transpose -> transpose -> exp fuse; exp does not go into the matmul; two matmuls stay
    # apart; mm2 feeds a dead rowsum too, so its post-dominator is the exit and bias stays alone.
    before = """
    @graph
    def main(x: Tensor((n, m), "float32"), w: Tensor((m, m), "float32"), b: Tensor((m,), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        m = sym()
        with dataflow():
            t: Tensor((m, n), "float32") = call_tensor(@transpose, (x,), out=Tensor((m, n), "float32"))
            t2: Tensor((n, m), "float32") = call_tensor(@transpose, (t,), out=Tensor((n, m), "float32"))
            e: Tensor((n, m), "float32") = call_tensor(@exp, (t2,), out=Tensor((n, m), "float32"))
            mm: Tensor((n, m), "float32") = call_tensor(@matmul, (e, w), out=Tensor((n, m), "float32"))
            mm2: Tensor((n, m), "float32") = call_tensor(@matmul, (mm, w), out=Tensor((n, m), "float32"))
            s: Tensor((n,), "float32") = call_tensor(@rowsum, (mm2,), out=Tensor((n,), "float32"))
            gv: Tensor((n, m), "float32") = call_tensor(@bias, (mm2, b), out=Tensor((n, m), "float32"))
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n, m), "float32"), w: Tensor((m, m), "float32"), b: Tensor((m,), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        m = sym()
        with dataflow():
            e: Tensor((n, m), "float32") = @fused_transpose_exp(x)
            mm: Tensor((n, m), "float32") = call_tensor(@matmul, (e, w), out=Tensor((n, m), "float32"))
            mm2: Tensor((n, m), "float32") = call_tensor(@matmul, (mm, w), out=Tensor((n, m), "float32"))
            s: Tensor((n,), "float32") = call_tensor(@rowsum, (mm2,), out=Tensor((n,), "float32"))
            gv: Tensor((n, m), "float32") = call_tensor(@bias, (mm2, b), out=Tensor((n, m), "float32"))
            output(gv)
        return gv

    @graph(attrs={"primitive": True})
    def fused_transpose_exp(x: Tensor((n, m), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        m = sym()
        with dataflow():
            t: Tensor((m, n), "float32") = call_tensor(@transpose, (x,), out=Tensor((m, n), "float32"))
            t2: Tensor((n, m), "float32") = call_tensor(@transpose, (t,), out=Tensor((n, m), "float32"))
            e: Tensor((n, m), "float32") = call_tensor(@exp, (t2,), out=Tensor((n, m), "float32"))
            output(e)
        return e
    """
    check(before, expected)


def test_reduction_takes_a_prologue_and_an_elementwise_epilogue() -> None:
    before = """
    @graph
    def main(x: Tensor((m, n), "float32"), y: Tensor((n, m), "float32"), r: Tensor((n, m), "float32")) -> Tuple(Tensor((n,), "float32"), Tensor((n,), "float32")):
        n = sym()
        m = sym()
        with dataflow():
            t: Tensor((n, m), "float32") = call_tensor(@transpose, (x,), out=Tensor((n, m), "float32"))
            s: Tensor((n,), "float32") = call_tensor(@rowsum, (t,), out=Tensor((n,), "float32"))
            e: Tensor((n,), "float32") = call_tensor(@vexp, (s,), out=Tensor((n,), "float32"))
            a: Tensor((n, m), "float32") = call_tensor(@add, (y, r), out=Tensor((n, m), "float32"))
            s2: Tensor((n,), "float32") = call_tensor(@rowsum, (a,), out=Tensor((n,), "float32"))
            s3: Tensor((n,), "float32") = call_tensor(@vexp, (s2,), out=Tensor((n,), "float32"))
            gv: Tuple(Tensor((n,), "float32"), Tensor((n,), "float32")) = (e, s3)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((m, n), "float32"), y: Tensor((n, m), "float32"), r: Tensor((n, m), "float32")) -> Tuple(Tensor((n,), "float32"), Tensor((n,), "float32")):
        n = sym()
        m = sym()
        with dataflow():
            e: Tensor((n,), "float32") = @fused_transpose_rowsum_vexp(x)
            s3: Tensor((n,), "float32") = @fused_add_rowsum_vexp(y, r)
            gv: Tuple(Tensor((n,), "float32"), Tensor((n,), "float32")) = (e, s3)
            output(gv)
        return gv

    @graph(attrs={"primitive": True})
    def fused_transpose_rowsum_vexp(x: Tensor((m, n), "float32")) -> Tensor((n,), "float32"):
        n = sym()
        m = sym()
        with dataflow():
            t: Tensor((n, m), "float32") = call_tensor(@transpose, (x,), out=Tensor((n, m), "float32"))
            s: Tensor((n,), "float32") = call_tensor(@rowsum, (t,), out=Tensor((n,), "float32"))
            e: Tensor((n,), "float32") = call_tensor(@vexp, (s,), out=Tensor((n,), "float32"))
            output(e)
        return e

    @graph(attrs={"primitive": True})
    def fused_add_rowsum_vexp(y: Tensor((n, m), "float32"), r: Tensor((n, m), "float32")) -> Tensor((n,), "float32"):
        n = sym()
        m = sym()
        with dataflow():
            a: Tensor((n, m), "float32") = call_tensor(@add, (y, r), out=Tensor((n, m), "float32"))
            s2: Tensor((n,), "float32") = call_tensor(@rowsum, (a,), out=Tensor((n,), "float32"))
            s3: Tensor((n,), "float32") = call_tensor(@vexp, (s2,), out=Tensor((n,), "float32"))
            output(s3)
        return s3
    """
    check(before, expected)


# The Relax bug #20195 lesson: @outer's output info uses m, which the match_cast after the
# group's first binding defines; the group call must not be hoisted above that match_cast.
SYM_AFTER_FIRST_BEFORE = """
@graph
def main(x: Tensor((n,), "float32"), y: Tensor(ndim=1, dtype="float32")) -> Tensor(ndim=2, dtype="float32"):
    n = sym()
    m = sym()
    with dataflow():
        e: Tensor((n,), "float32") = call_tensor(@vexp, (x,), out=Tensor((n,), "float32"))
        y1: Tensor((m,), "float32") = match_cast(y, Tensor((m,), "float32"))
        gv: Tensor((m, n), "float32") = call_tensor(@outer, (e, y1), out=Tensor((m, n), "float32"))
        output(gv)
    return gv
"""

SYM_AFTER_FIRST_EXPECTED = """
@graph
def main(x: Tensor((n,), "float32"), y: Tensor(ndim=1, dtype="float32")) -> Tensor(ndim=2, dtype="float32"):
    n = sym()
    m = sym()
    with dataflow():
        y1: Tensor((m,), "float32") = match_cast(y, Tensor((m,), "float32"))
        gv: Tensor((m, n), "float32") = @fused_vexp_outer(x, y1)
        output(gv)
    return gv

@graph(attrs={"primitive": True})
def fused_vexp_outer(x: Tensor((n,), "float32"), y1: Tensor((m,), "float32")) -> Tensor((m, n), "float32"):
    n = sym()
    m = sym()
    with dataflow():
        e: Tensor((n,), "float32") = call_tensor(@vexp, (x,), out=Tensor((n,), "float32"))
        gv: Tensor((m, n), "float32") = call_tensor(@outer, (e, y1), out=Tensor((m, n), "float32"))
        output(gv)
    return gv
"""


def test_group_is_not_hoisted_above_the_match_cast_defining_its_sym_var() -> None:
    check(SYM_AFTER_FIRST_BEFORE, SYM_AFTER_FIRST_EXPECTED)


SYM_ARG_BEFORE = """
@graph
def main(x: Tensor((n,), "float32"), y: Tensor(ndim=1, dtype="float32")) -> Tensor(ndim=2, dtype="float32"):
    n = sym()
    m = sym()
    with dataflow():
        e: Tensor((n,), "float32") = call_tensor(@vexp, (x,), out=Tensor((n,), "float32"))
        y1: Tensor((m,), "float32") = match_cast(y, Tensor((m,), "float32"))
        gv: Tensor((m, n), "float32") = call_tensor(@tile, (e,), shape(m), out=Tensor((m, n), "float32"))
        output(gv)
    return gv
"""

SYM_ARG_EXPECTED = """
@graph
def main(x: Tensor((n,), "float32"), y: Tensor(ndim=1, dtype="float32")) -> Tensor(ndim=2, dtype="float32"):
    n = sym()
    m = sym()
    with dataflow():
        y1: Tensor((m,), "float32") = match_cast(y, Tensor((m,), "float32"))
        gv: Tensor((m, n), "float32") = @fused_vexp_tile(x, shape(m))
        output(gv)
    return gv

@graph(attrs={"primitive": True})
def fused_vexp_tile(x: Tensor((n,), "float32"), syms: Shape((m,))) -> Tensor((m, n), "float32"):
    n = sym()
    m = sym()
    with dataflow():
        e: Tensor((n,), "float32") = call_tensor(@vexp, (x,), out=Tensor((n,), "float32"))
        gv: Tensor((m, n), "float32") = call_tensor(@tile, (e,), shape(m), out=Tensor((m, n), "float32"))
        output(gv)
    return gv
"""


def test_a_sym_var_only_the_output_uses_is_passed_as_a_shape_after_its_match_cast() -> None:
    check(SYM_ARG_BEFORE, SYM_ARG_EXPECTED)


def test_hoisting_the_group_above_the_match_cast_would_be_ill_formed() -> None:
    # The placement the tests above forbid really breaks the sym var's definition-before-use:
    # the group's output info (and its shape argument) use m before the match_cast defines it.
    hoisted = SYM_ARG_EXPECTED.replace(
        """        y1: Tensor((m,), "float32") = match_cast(y, Tensor((m,), "float32"))
        gv: Tensor((m, n), "float32") = @fused_vexp_tile(x, shape(m))
""",
        """        gv: Tensor((m, n), "float32") = @fused_vexp_tile(x, shape(m))
        y1: Tensor((m,), "float32") = match_cast(y, Tensor((m,), "float32"))
""",
    )
    assert hoisted != SYM_ARG_EXPECTED
    with pytest.raises(WellFormedError, match="sym var m is used .* before the match_cast"):
        verify(parse(with_kernels(hoisted)))


def test_values_used_after_the_block_become_extra_outputs() -> None:
    before = """
    @graph
    def main(x: Tensor((n, m), "float32"), r: Tensor((n, m), "float32")) -> Tuple(Tensor((n, m), "float32"), Tensor((n, m), "float32")):
        n = sym()
        m = sym()
        with dataflow():
            gv1: Tensor((n, m), "float32") = call_tensor(@exp, (x,), out=Tensor((n, m), "float32"))
            a: Tensor((n, m), "float32") = call_tensor(@add, (gv1, r), out=Tensor((n, m), "float32"))
            gv2: Tensor((n, m), "float32") = call_tensor(@exp, (a,), out=Tensor((n, m), "float32"))
            output(gv1, gv2)
        return (gv1, gv2)
    """
    expected = """
    @graph
    def main(x: Tensor((n, m), "float32"), r: Tensor((n, m), "float32")) -> Tuple(Tensor((n, m), "float32"), Tensor((n, m), "float32")):
        n = sym()
        m = sym()
        with dataflow():
            res: Tuple(Tensor((n, m), "float32"), Tensor((n, m), "float32")) = @fused_exp_add(x, r)
            gv1: Tensor((n, m), "float32") = res[0]
            gv2: Tensor((n, m), "float32") = res[1]
            output(gv1, gv2)
        return (gv1, gv2)

    @graph(attrs={"primitive": True})
    def fused_exp_add(x: Tensor((n, m), "float32"), r: Tensor((n, m), "float32")) -> Tuple(Tensor((n, m), "float32"), Tensor((n, m), "float32")):
        n = sym()
        m = sym()
        with dataflow():
            gv1: Tensor((n, m), "float32") = call_tensor(@exp, (x,), out=Tensor((n, m), "float32"))
            a: Tensor((n, m), "float32") = call_tensor(@add, (gv1, r), out=Tensor((n, m), "float32"))
            gv2: Tensor((n, m), "float32") = call_tensor(@exp, (a,), out=Tensor((n, m), "float32"))
            output(gv1, gv2)
        return (gv1, gv2)
    """
    check(before, expected)


CHAIN = """
@graph
def main(x: Tensor((n, m), "float32"), r: Tensor((n, m), "float32")) -> Tensor((n, m), "float32"):
    n = sym()
    m = sym()
    with dataflow():
        a: Tensor((n, m), "float32") = call_tensor(@exp, (x,), out=Tensor((n, m), "float32"))
        b: Tensor((n, m), "float32") = call_tensor(@add, (a, r), out=Tensor((n, m), "float32"))
        c: Tensor((n, m), "float32") = call_tensor(@exp, (b,), out=Tensor((n, m), "float32"))
        gv: Tensor((n, m), "float32") = call_tensor(@add, (c, r), out=Tensor((n, m), "float32"))
        output(gv)
    return gv
"""


def test_group_size_is_capped() -> None:
    expected = """
    @graph
    def main(x: Tensor((n, m), "float32"), r: Tensor((n, m), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        m = sym()
        with dataflow():
            b: Tensor((n, m), "float32") = @fused_exp_add(x, r)
            gv: Tensor((n, m), "float32") = @fused_exp_add(b, r)
            output(gv)
        return gv

    @graph(attrs={"primitive": True})
    def fused_exp_add(x: Tensor((n, m), "float32"), r: Tensor((n, m), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        m = sym()
        with dataflow():
            a: Tensor((n, m), "float32") = call_tensor(@exp, (x,), out=Tensor((n, m), "float32"))
            b: Tensor((n, m), "float32") = call_tensor(@add, (a, r), out=Tensor((n, m), "float32"))
            output(b)
        return b
    """
    # two groups of two: structurally equal, so they share one function
    check(CHAIN, expected, FuseOps(max_group_size=2))
    out = FuseOps(max_group_size=4)(parse(with_kernels(CHAIN)))
    assert [n for n, _ in out.graph_funcs()] == ["main", "fused_exp_add"]
    group = out["fused_exp_add"]
    assert isinstance(group, GraphFunc) and len(group.body.blocks[0].bindings) == 4


def test_opaque_bindings_and_plain_blocks_are_barriers() -> None:
    # a tuple between two kernels is not a kernel call; a binding block outside dataflow is
    # never touched; neither changes.
    before = """
    @graph
    def main(x: Tensor((n, m), "float32"), r: Tensor((n, m), "float32")) -> Tensor((n, m), "float32"):
        n = sym()
        m = sym()
        with dataflow():
            a: Tensor((n, m), "float32") = call_tensor(@exp, (x,), out=Tensor((n, m), "float32"))
            t: Tuple(Tensor((n, m), "float32")) = (a,)
            a2: Tensor((n, m), "float32") = t[0]
            gv: Tensor((n, m), "float32") = call_tensor(@add, (a2, r), out=Tensor((n, m), "float32"))
            output(gv)
        c: Tensor((n, m), "float32") = call_tensor(@exp, (gv,), out=Tensor((n, m), "float32"))
        d: Tensor((n, m), "float32") = call_tensor(@add, (c, r), out=Tensor((n, m), "float32"))
        return d
    """
    check(before, before)


def test_fused_module_computes_the_same_values() -> None:
    mod = parse(with_kernels(SYM_AFTER_FIRST_BEFORE))
    x = np.linspace(-1, 1, 5).astype("float32")
    y = np.linspace(0, 2, 3).astype("float32")
    want = np.outer(y, np.exp(x))
    for m in (mod, P(mod)):
        got = tw.VM(tw.build(m))["main"](x, y)
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert any(f.attrs.get(PRIMITIVE_ATTR) for _, f in P(mod).graph_funcs())


def test_a_kernel_already_scheduled_is_left_alone() -> None:
    # CHAIN fuses whole with plain kernels (test_group_size_is_capped); with exp scheduled
    # already, exp is a barrier and no add has a fusable neighbour.
    scheduled = KERNELS.replace("@tensor\ndef exp(", '@tensor(attrs={"scheduled": True})\ndef exp(')
    assert scheduled != KERNELS
    text = with_kernels(CHAIN, kernels=scheduled)
    check_pass(P, text, text)


def test_only_data_movement_goes_into_a_reduction_with_a_matmul_inside() -> None:
    # maxdot reads each element of its input n times: the transpose (a copy) is inlined, the
    # exp (arithmetic) would be recomputed n times, so it stays a kernel of its own.
    before = """
    @graph
    def main(x: Tensor((k, n), "float32"), y: Tensor((n, k), "float32")) -> Tuple(Tensor((n,), "float32"), Tensor((n,), "float32")):
        n = sym()
        k = sym()
        with dataflow():
            t: Tensor((n, k), "float32") = call_tensor(@transpose, (x,), out=Tensor((n, k), "float32"))
            a: Tensor((n,), "float32") = call_tensor(@maxdot, (t,), out=Tensor((n,), "float32"))
            e: Tensor((n, k), "float32") = call_tensor(@exp, (y,), out=Tensor((n, k), "float32"))
            b: Tensor((n,), "float32") = call_tensor(@maxdot, (e,), out=Tensor((n,), "float32"))
            gv: Tuple(Tensor((n,), "float32"), Tensor((n,), "float32")) = (a, b)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((k, n), "float32"), y: Tensor((n, k), "float32")) -> Tuple(Tensor((n,), "float32"), Tensor((n,), "float32")):
        n = sym()
        k = sym()
        with dataflow():
            a: Tensor((n,), "float32") = @fused_transpose_maxdot(x)
            e: Tensor((n, k), "float32") = call_tensor(@exp, (y,), out=Tensor((n, k), "float32"))
            b: Tensor((n,), "float32") = call_tensor(@maxdot, (e,), out=Tensor((n,), "float32"))
            gv: Tuple(Tensor((n,), "float32"), Tensor((n,), "float32")) = (a, b)
            output(gv)
        return gv

    @graph(attrs={"primitive": True})
    def fused_transpose_maxdot(x: Tensor((k, n), "float32")) -> Tensor((n,), "float32"):
        n = sym()
        k = sym()
        with dataflow():
            t: Tensor((n, k), "float32") = call_tensor(@transpose, (x,), out=Tensor((n, k), "float32"))
            a: Tensor((n,), "float32") = call_tensor(@maxdot, (t,), out=Tensor((n,), "float32"))
            output(a)
        return a
    """
    check(before, expected)

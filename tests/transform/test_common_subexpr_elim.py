"""common_subexpr_elim: identical pure calls in one dataflow block are computed once."""

from __future__ import annotations

import numpy as np

from tests.transform.util import check_pass, check_unchanged, ir, same_numerics
from tilework.transform.common_subexpr_elim import CommonSubexprElim

P = CommonSubexprElim()


def test_identical_calls_with_symbolic_shapes_merge_and_chains_collapse() -> None:
    before = """
    @graph
    def main(x: Tensor((n, m), "float32"), y: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym(lo=1)
        with dataflow():
            a = add(x, y)
            b = add(x, y)
            c = exp(a)
            d = exp(b)
            e = reshape(c, shape(n * m))
            f = reshape(d, shape(n * m))
            g = reshape(d, shape(m * n))
            h = add(y, x)
            gv = (e, f, g, h)
            output(gv)
        return gv
    """
    # add(y, x) is not add(x, y) structurally: CSE does not know add commutes
    expected = """
    @graph
    def main(x: Tensor((n, m), "float32"), y: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym(lo=1)
        with dataflow():
            a = add(x, y)
            c = exp(a)
            e = reshape(c, shape(n * m))
            h = add(y, x)
            gv = (e, e, e, h)
            output(gv)
        return gv
    """
    check_pass(P, before, expected)


def test_attrs_constants_and_stated_infos_must_agree() -> None:
    before = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        with dataflow():
            a = sum(x, axis=(1,), keepdims=False)
            b = sum(x, axis=(1,), keepdims=True)
            c = sum(x, axis=(1,), keepdims=False)
            d = add(x, const([1.0, 2.0, 3.0, 4.0], "float32"))
            e = add(x, const([1.0, 2.0, 3.0, 4.0], "float32"))
            f = add(x, const([1.0, 2.0, 3.0, 5.0], "float32"))
            gv = (a, b, c, d, e, f)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        with dataflow():
            a = sum(x, axis=(1,), keepdims=False)
            b = sum(x, axis=(1,), keepdims=True)
            d = add(x, const([1.0, 2.0, 3.0, 4.0], "float32"))
            f = add(x, const([1.0, 2.0, 3.0, 5.0], "float32"))
            gv = (a, b, a, d, d, f)
            output(gv)
        return gv
    """
    check_pass(P, before, expected)


def test_call_tensor_and_escaping_vars() -> None:
    before = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        with dataflow():
            lv = call_tensor(@double, (x,), out=Tensor((n, 4), "float32"))
            gv = call_tensor(@double, (x,), out=Tensor((n, 4), "float32"))
            gw = call_tensor(@double, (gv,), out=Tensor((n, 4), "float32"))
            lw = call_tensor(@double, (lv,), out=Tensor((n, 4), "float32"))
            gz = add(lv, lw)
            output(gv, gw, gz)
        r = (gv, gw, gz)
        return r

    @tensor
    def double(A: Buffer((n, 4), "float32"), B: Buffer((n, 4), "float32")):
        n = sym(lo=1)
        for i in range(n):
            for j in range(4):
                B[i, j] = A[i, j] * float32(2.0)
    """
    # gv must stay visible after the block: it keeps its binding to the dataflow var lv, and
    # double(gv) and double(lv) are the same call
    expected = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        with dataflow():
            lv = call_tensor(@double, (x,), out=Tensor((n, 4), "float32"))
            gv = lv
            gw = call_tensor(@double, (gv,), out=Tensor((n, 4), "float32"))
            gz = add(lv, gw)
            output(gv, gw, gz)
        r = (gv, gw, gz)
        return r

    @tensor
    def double(A: Buffer((n, 4), "float32"), B: Buffer((n, 4), "float32")):
        n = sym(lo=1)
        for i in range(n):
            for j in range(4):
                B[i, j] = A[i, j] * float32(2.0)
    """
    check_pass(P, before, expected)


def test_nothing_is_shared_across_blocks_or_outside_dataflow() -> None:
    # Two dataflow blocks separated by an impure call, and plain bindings around an impure
    # call: every call stays.
    check_unchanged(
        P,
        """
        @graph(pure=False)
        def main(x: Tensor((n,), "float32")):
            n = sym()
            with dataflow():
                ga = exp(x)
                output(ga)
            p = call_packed(extern("tw.print"), ("x", x), pure=False, out=Any)
            with dataflow():
                gb = exp(x)
                output(gb)
            c = log(x)
            q = call_packed(extern("tw.print"), ("x", x), pure=False, out=Any)
            d = log(x)
            r = (ga, gb, c, d)
            return r
        """,
    )


def test_effects_and_allocations_are_not_merged() -> None:
    check_unchanged(
        P,
        """
        @graph(pure=False)
        def main(x: Tensor((n,), "float32"), y: Tensor((m,), "float32")):
            n = sym()
            m = sym()
            a = assert_dims(shape(n, m), checks=(("eq", 0, 1, "n must equal m"),))
            b = assert_dims(shape(n, m), checks=(("eq", 0, 1, "n must equal m"),))
            c = vm_alloc_tensor(shape(n), dtype="float32")
            d = vm_alloc_tensor(shape(n), dtype="float32")
            r = (c, d)
            return r
        """,
    )


def test_numerics_unchanged() -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n, m), "float32")):
            n = sym(lo=1)
            m = sym(lo=1)
            with dataflow():
                a = exp(x)
                b = exp(x)
                c = multiply(a, b)
                d = multiply(b, a)
                e = multiply(a, b)
                gv = add(c, e)
                gw = subtract(gv, d)
                output(gw)
            return gw
        """
    )
    x = np.random.default_rng(2).standard_normal((2, 5)).astype("float32")
    got = same_numerics(mod, [P], [x])
    np.testing.assert_allclose(got, np.exp(x) ** 2, rtol=1e-5)

"""canonicalize_bindings: aliases, no-op match_casts and items of tuple literals disappear;
dataflow outputs stay correct."""

from __future__ import annotations

import numpy as np
import pytest

from tests.transform.util import check_pass, check_unchanged, ir, same_numerics
from tilework.transform.canonicalize_bindings import CanonicalizeBindings

P = CanonicalizeBindings()


def test_var_to_var_aliases_are_inlined_with_symbolic_shapes() -> None:
    before = """
    @graph
    def main(x: Tensor((n, m), "float32"), y: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym(lo=1)
        with dataflow():
            a = add(x, y)
            b = a
            c = b
            d = multiply(c, b)
            gv = reshape(d, shape(n * m))
            output(gv)
        z = gv
        return z
    """
    expected = """
    @graph
    def main(x: Tensor((n, m), "float32"), y: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym(lo=1)
        with dataflow():
            a = add(x, y)
            d = multiply(a, a)
            gv = reshape(d, shape(n * m))
            output(gv)
        return gv
    """
    check_pass(P, before, expected)


def test_noop_match_cast_is_unwrapped() -> None:
    before = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        with dataflow():
            a = exp(x)
            b = match_cast(a, Tensor((n, 4), "float32"))
            c = match_cast(b, Tensor(ndim=2, dtype="float32"))
            gv = add(c, b)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n, 4), "float32")) -> Tensor(ndim=2, dtype="float32"):  # the signature is kept
        n = sym(lo=1)
        with dataflow():
            a = exp(x)
            gv = add(a, a)
            output(gv)
        return gv
    """
    check_pass(P, before, expected)


def test_match_casts_that_check_or_define_stay() -> None:
    # k is new: the cast defines it (and checks nothing provable); (n, 4) from ndim=2 needs a
    # run-time check; float32 -> float16 can never hold and is rejected by the builder anyway.
    check_unchanged(
        P,
        """
        @graph
        def main(x: Tensor(ndim=2, dtype="float32"), y: Tensor((n, 4), "float32")):
            n = sym(lo=1)
            k = sym()
            with dataflow():
                a = match_cast(x, Tensor((n, 4), "float32"))
                b = reshape(y, shape(4 * n))
                c = match_cast(b, Tensor((k,), "float32"))
                d = exp(c)
                gv = (a, d)
                output(gv)
            return gv
        """,
    )


def test_item_of_tuple_literal_becomes_the_field() -> None:
    before = """
    @graph
    def main(x: Tensor((n,), "float32"), y: Tensor((m,), "float32")):
        n = sym()
        m = sym()
        with dataflow():
            t = (x, y)
            a = t[1]
            u = (t, a)
            b = u[0]
            c = b[0]
            gv = (c, a)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n,), "float32"), y: Tensor((m,), "float32")):
        n = sym()
        m = sym()
        with dataflow():
            t = (x, y)
            u = (t, y)
            gv = (x, y)
            output(gv)
        return gv
    """
    check_pass(P, before, expected)


def test_item_is_not_replaced_by_a_dataflow_var_out_of_its_block() -> None:
    # gv escapes, but its fields are dataflow vars of the first block: after the block, gv[0]
    # must stay an item of gv.
    check_unchanged(
        P,
        """
        @graph
        def main(x: Tensor((n,), "float32")):
            n = sym()
            with dataflow():
                a = exp(x)
                b = log(x)
                gv = (a, b)
                output(gv)
            c = gv[0]
            d = add(c, x)
            return d
        """,
    )


def test_escaping_var_takes_over_the_dataflow_value() -> None:
    before = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        with dataflow():
            lv = exp(x)
            lw = add(lv, lv)
            gv = lv
            gw = lv
            gz = lw
            output(gv, gw, gz)
        r = (gv, gw, gz)
        return r
    """
    expected = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        with dataflow():
            gv = exp(x)
            gz = add(gv, gv)
            output(gv, gz)
        r = (gv, gv, gz)
        return r
    """
    check_pass(P, before, expected)


def test_escaping_var_bound_to_a_param_or_another_escaping_var_is_inlined() -> None:
    before = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        with dataflow():
            gv = x
            gw = exp(gv)
            lw = gw
            gu = lw
            output(gv, gw, gu)
        r = add(gu, gv)
        return r
    """
    expected = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        with dataflow():
            gw = exp(x)
            output(gw)
        r = add(gw, x)
        return r
    """
    check_pass(P, before, expected)


def test_aliases_inside_if_branches() -> None:
    before = """
    @graph
    def main(c: Prim("bool"), x: Tensor((n,), "float32")):
        n = sym()
        y = x
        r = if c:
            a = y
            b = exp(a)
            b
        else:
            d = y
            d
        s = r
        return s
    """
    expected = """
    @graph
    def main(c: Prim("bool"), x: Tensor((n,), "float32")):
        n = sym()
        r = if c:
            b = exp(x)
            b
        else:
            x
        return r
    """
    check_pass(P, before, expected)


def test_escaping_match_cast_stays_escaping() -> None:
    # a match_cast that is kept, bound to an escaping var inside a dataflow block
    check_unchanged(
        P,
        """
        @graph
        def main(x: Tensor(ndim=1, dtype="float32")):
            k = sym()
            with dataflow():
                a = exp(x)
                gv = match_cast(a, Tensor((k,), "float32"))
                output(gv)
            b = add(gv, gv)
            return b
        """,
    )


@pytest.mark.parametrize("n", [1, 5])
def test_numerics_unchanged(n: int) -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n, m), "float32"), y: Tensor((n, m), "float32")):
            n = sym(lo=1)
            m = sym(lo=1)
            with dataflow():
                a = add(x, y)
                b = a
                c = match_cast(b, Tensor((n, m), "float32"))
                t = (c, x)
                d = t[0]
                e = multiply(d, x)
                gv = e
                output(gv)
            return gv
        """
    )
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((n, 3)).astype("float32") for _ in range(2))
    got = same_numerics(mod, [P], [x, y])
    np.testing.assert_allclose(got, (x + y) * x, rtol=1e-6)

"""to_non_dataflow: dataflow blocks become one plain binding block per sequence (If branches
too), dataflow vars become ordinary vars wherever they are read; nothing else changes."""

from __future__ import annotations

from tests.transform.util import check_pass, check_unchanged
from tilework.transform.to_non_dataflow import ToNonDataflow

P = ToNonDataflow()


def test_dataflow_blocks_and_plain_bindings_merge_into_one_block() -> None:
    before = """
    @graph
    def main(x: Tensor((n, m), "float32"), y: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym()
        with dataflow():
            a = add(x, y)
            gv = exp(a)
            output(gv)
        b = multiply(gv, x)
        with dataflow():
            c = reshape(b, shape(n * m))
            gw = log(c)
            output(gw)
        return gw
    """
    expected = """
    @graph
    def main(x: Tensor((n, m), "float32"), y: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym()
        a = add(x, y)
        gv = exp(a)
        b = multiply(gv, x)
        c = reshape(b, shape(n * m))
        gw = log(c)
        return gw
    """
    check_pass(P, before, expected)


def test_dataflow_vars_become_vars_in_every_expression_kind() -> None:
    # a dataflow var read through a match_cast, a tuple, a tuple item and a call_tensor's
    # argument tuple: every read now refers to the ordinary var
    before = """
    @graph
    def main(x: Tensor(ndim=1, dtype="float32")):
        k = sym()
        with dataflow():
            a = match_cast(x, Tensor((k,), "float32"))
            t = (a, x)
            b = t[0]
            c = call_tensor(@double, (b,), out=Tensor((k,), "float32"))
            gv = (c, t)
            output(gv)
        return gv

    @tensor
    def double(A: Buffer((n,), "float32"), B: Buffer((n,), "float32")):
        n = sym()
        for i in range(n):
            B[i] = A[i] * float32(2.0)
    """
    expected = """
    @graph
    def main(x: Tensor(ndim=1, dtype="float32")):
        k = sym()
        a = match_cast(x, Tensor((k,), "float32"))
        t = (a, x)
        b = t[0]
        c = call_tensor(@double, (b,), out=Tensor((k,), "float32"))
        gv = (c, t)
        return gv

    @tensor
    def double(A: Buffer((n,), "float32"), B: Buffer((n,), "float32")):
        n = sym()
        for i in range(n):
            B[i] = A[i] * float32(2.0)
    """
    check_pass(P, before, expected)


def test_if_branches_lose_their_dataflow_blocks_too() -> None:
    before = """
    @graph
    def main(c: Prim("bool"), x: Tensor((n,), "float32")):
        n = sym()
        with dataflow():
            a = exp(x)
            gv = add(a, x)
            output(gv)
        r = if c:
            with dataflow():
                b = exp(gv)
                gb = log(b)
                output(gb)
            gb
        else:
            with dataflow():
                gd = neg(gv)
                output(gd)
            e = add(gd, gd)
            e
        with dataflow():
            d = add(r, gv)
            gz = exp(d)
            output(gz)
        return gz
    """
    expected = """
    @graph
    def main(c: Prim("bool"), x: Tensor((n,), "float32")):
        n = sym()
        a = exp(x)
        gv = add(a, x)
        r = if c:
            b = exp(gv)
            gb = log(b)
            gb
        else:
            gd = neg(gv)
            e = add(gd, gd)
            e
        d = add(r, gv)
        gz = exp(d)
        return gz
    """
    check_pass(P, before, expected)


def test_every_graph_function_is_converted_and_calls_between_them_stay() -> None:
    before = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        with dataflow():
            a = @helper(x)
            gv = exp(a)
            output(gv)
        return gv

    @graph
    def helper(y: Tensor((p, 4), "float32")) -> Tensor((p, 4), "float32"):
        p = sym(lo=1)
        with dataflow():
            s = add(y, y)
            gs = multiply(s, y)
            output(gs)
        return gs
    """
    expected = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        a = @helper(x)
        gv = exp(a)
        return gv

    @graph
    def helper(y: Tensor((p, 4), "float32")) -> Tensor((p, 4), "float32"):
        p = sym(lo=1)
        s = add(y, y)
        gs = multiply(s, y)
        return gs
    """
    check_pass(P, before, expected)


def test_an_empty_dataflow_block_among_others_disappears() -> None:
    before = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        with dataflow():
            pass
        a = exp(x)
        return a
    """
    expected = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        a = exp(x)
        return a
    """
    check_pass(P, before, expected)


def test_a_module_without_dataflow_is_unchanged() -> None:
    check_unchanged(
        P,
        """
        @graph(pure=False)
        def main(c: Prim("bool"), x: Tensor((n,), "float32")):
            n = sym()
            p = call_packed(extern("tw.print"), ("x", x), pure=False, out=Any)
            r = if c:
                a = exp(x)
                a
            else:
                x
            return r
        """,
    )

"""dead_code_elimination: unused pure bindings and unreachable functions go; effects, checks
and match_casts that define sym vars used later stay."""

from __future__ import annotations

import numpy as np

from tests.transform.util import check_pass, check_unchanged, ir, same_numerics
from tilework.transform.dead_code_elimination import DeadCodeElimination, entry_functions

P = DeadCodeElimination()


def test_unused_pure_bindings_go_with_symbolic_shapes() -> None:
    before = """
    @graph
    def main(x: Tensor((n, m), "float32"), y: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym(lo=1)
        with dataflow():
            a = add(x, y)
            b = exp(a)
            gc = reshape(b, shape(n * m))
            d = multiply(x, y)
            gv = sum(d, axis=(1,), keepdims=False)
            gu = log(gv)
            output(gc, gv, gu)
        t = (gv, gc)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n, m), "float32"), y: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym(lo=1)
        with dataflow():
            d = multiply(x, y)
            gv = sum(d, axis=(1,), keepdims=False)
            output(gv)
        return gv
    """
    check_pass(P, before, expected)


def test_impure_calls_and_effects_stay() -> None:
    check_unchanged(
        P,
        """
        @graph(pure=False)
        def main(x: Tensor((n,), "float32"), y: Tensor((m,), "float32")):
            n = sym()
            m = sym()
            a = call_packed(extern("tw.print"), ("x", x), pure=False, out=Any)
            b = assert_dims(shape(n, m), checks=(("broadcast", 0, 1, "add: dims n and m must be equal or 1"),))
            return x
        """,
    )


def test_unused_pure_packed_call_goes() -> None:
    before = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        a = call_packed(extern("tw.norm"), (x,), pure=True, out=Tensor((), "float32"))
        return x
    """
    expected = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        return x
    """
    check_pass(P, before, expected)


def test_match_cast_defining_a_sym_var_used_later_stays() -> None:
    # The cast's var is unused, but it binds k, which the kept `zeros` needs: dropping it would
    # leave k undefined at run time (Relax issue #15290).
    check_unchanged(
        P,
        """
        @graph
        def main(x: Tensor(ndim=1, dtype="float32")):
            k = sym()
            with dataflow():
                a = match_cast(x, Tensor((k,), "float32"))
                gv = zeros(shape(k, 2), dtype="float32")
                output(gv)
            return gv
        """,
    )


def test_match_cast_needed_only_by_a_later_cast_stays() -> None:
    check_unchanged(
        P,
        """
        @graph
        def main(x: Tensor(ndim=1, dtype="float32"), y: Tensor(ndim=1, dtype="float32")):
            k = sym()
            with dataflow():
                a = match_cast(x, Tensor((k,), "float32"))
                gv = match_cast(y, Tensor((k,), "float32"))
                output(gv)
            return gv
        """,
    )


def test_unused_match_casts_go_when_their_sym_vars_are_unused_or_already_defined() -> None:
    before = """
    @graph
    def main(x: Tensor(ndim=1, dtype="float32"), y: Tensor((n,), "float32")):
        n = sym()
        k = sym()
        with dataflow():
            a = match_cast(x, Tensor((k,), "float32"))
            b = match_cast(x, Tensor((n,), "float32"))
            gv = exp(y)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor(ndim=1, dtype="float32"), y: Tensor((n,), "float32")):
        n = sym()
        with dataflow():
            gv = exp(y)
            output(gv)
        return gv
    """
    check_pass(P, before, expected)


def test_if_without_effects_goes_and_if_with_effects_stays() -> None:
    before = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n,), "float32")):
        n = sym()
        r = if c:
            a = exp(x)
            a
        else:
            x
        s = if c:
            p = call_packed(extern("tw.print"), ("then", x), pure=False, out=Any)
            q = exp(x)
            x
        else:
            x
        return x
    """
    expected = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n,), "float32")):
        n = sym()
        s = if c:
            p = call_packed(extern("tw.print"), ("then", x), pure=False, out=Any)
            x
        else:
            x
        return x
    """
    check_pass(P, before, expected)


MODULE_WITH_HELPERS = """
@graph
def main(x: Tensor((n, 4), "float32")):
    n = sym(lo=1)
    with dataflow():
        a = @_used(x)
        gv = call_tensor(@double, (a,), out=Tensor((n, 4), "float32"))
        output(gv)
    return gv

@graph
def _used(y: Tensor((p, 4), "float32")) -> Tensor((p, 4), "float32"):
    p = sym(lo=1)
    s = add(y, y)
    return s

@graph
def _unused(y: Tensor((p, 4), "float32")) -> Tensor((p, 4), "float32"):
    p = sym(lo=1)
    s = call_tensor(@triple, (y,), out=Tensor((p, 4), "float32"))
    return s

@graph
def public(y: Tensor((q,), "float32")) -> Tensor((q,), "float32"):
    q = sym()
    return y

@graph(attrs={"export": True})
def _exported(y: Tensor((q,), "float32")) -> Tensor((q,), "float32"):
    q = sym()
    return y

@tensor
def double(A: Buffer((n, 4), "float32"), B: Buffer((n, 4), "float32")):
    n = sym(lo=1)
    for i in range(n):
        for j in range(4):
            B[i, j] = A[i, j] * float32(2.0)

@tensor
def triple(A: Buffer((n, 4), "float32"), B: Buffer((n, 4), "float32")):
    n = sym(lo=1)
    for i in range(n):
        for j in range(4):
            B[i, j] = A[i, j] * float32(3.0)
"""


def test_unreachable_functions_go() -> None:
    mod = ir(MODULE_WITH_HELPERS)
    out = check_pass(P, mod, mod.without("_unused").without("triple"))
    assert list(out) == ["main", "_used", "public", "_exported", "double"]


def test_entries_from_the_module_attr_or_the_option() -> None:
    mod = ir(MODULE_WITH_HELPERS).with_attrs(entry_funcs=("main",))
    assert entry_functions(mod) == {"main", "_exported"}
    check_pass(P, mod, mod.without("_unused").without("triple").without("public"))
    only_unused = DeadCodeElimination(entries=("_unused",))
    out = check_pass(only_unused, mod, mod.without("public"))
    assert sorted(out) == ["_exported", "_unused", "_used", "double", "main", "triple"]  # main is always an entry


def test_functions_kept_when_asked() -> None:
    mod = ir(MODULE_WITH_HELPERS)
    check_pass(DeadCodeElimination(remove_functions=False), mod, mod)


def test_numerics_unchanged() -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n, 4), "float32")):
            n = sym(lo=1)
            with dataflow():
                a = exp(x)
                b = add(x, x)
                c = reshape(b, shape(4 * n))
                gv = multiply(b, x)
                output(gv)
            return gv
        """
    )
    x = np.random.default_rng(1).standard_normal((3, 4)).astype("float32")
    got = same_numerics(mod, [P], [x])
    np.testing.assert_allclose(got, 2 * x * x, rtol=1e-6)

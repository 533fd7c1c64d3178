"""kill_after_last_use: ``vm_kill(v)`` right after the binding that last reads a tensor (or tuple)
value, counting reads through aliases and inside If branches; parameters, returned values and
aliases themselves are never killed, and nothing reads a value after its kill."""

from __future__ import annotations

from textwrap import dedent

from tests.transform.util import check_pass, check_unchanged
from tilework.ir.module import IRModule
from tilework.transform.kill_after_last_use import KillAfterLastUse

P = KillAfterLastUse()

KERNELS = """
@tensor
def exp(A: Buffer((n,), "float32"), B: Buffer((n,), "float32")):
    n = sym()
    for i in range(n):
        B[i] = exp(A[i])

@tensor
def add(A: Buffer((n,), "float32"), B: Buffer((n,), "float32"), C: Buffer((n,), "float32")):
    n = sym()
    for i in range(n):
        C[i] = A[i] + B[i]
"""


def check(before: str, expected: str) -> IRModule:
    return check_pass(P, dedent(before) + KERNELS, dedent(expected) + KERNELS)


def test_each_intermediate_dies_after_its_last_reader() -> None:
    # a is last read by the add, b by the second exp; x (a parameter) and c (returned) stay
    before = """
    @graph(pure=False)
    def main(x: Tensor((n,), "float32")):
        n = sym(lo=1)
        a = vm_alloc_tensor(shape(n), dtype="float32")
        _1: Tuple() = @exp(x, a, shape(n))
        b = vm_alloc_tensor(shape(n), dtype="float32")
        _2: Tuple() = @add(a, x, b, shape(n))
        c = vm_alloc_tensor(shape(n), dtype="float32")
        _3: Tuple() = @exp(b, c, shape(n))
        return c
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n,), "float32")):
        n = sym(lo=1)
        a = vm_alloc_tensor(shape(n), dtype="float32")
        _1: Tuple() = @exp(x, a, shape(n))
        b = vm_alloc_tensor(shape(n), dtype="float32")
        _2: Tuple() = @add(a, x, b, shape(n))
        _k1 = vm_kill(a)
        c = vm_alloc_tensor(shape(n), dtype="float32")
        _3: Tuple() = @exp(b, c, shape(n))
        _k2 = vm_kill(b)
        return c
    """
    check(before, expected)


def test_reads_through_aliases_keep_the_value_alive_and_only_the_original_is_killed() -> None:
    # a1 (alias) and a2 (checked match_cast) are the same value as a: its last read is the
    # add through a2; the aliases get no kill of their own. xa aliases the parameter: no kill.
    before = """
    @graph(pure=False)
    def main(x: Tensor((n,), "float32")):
        n = sym(lo=1)
        xa = x
        a = vm_alloc_tensor(shape(n), dtype="float32")
        _1: Tuple() = @exp(xa, a, shape(n))
        a1 = a
        b = vm_alloc_tensor(shape(n), dtype="float32")
        _2: Tuple() = @exp(a1, b, shape(n))
        a2 = match_cast(a1, Tensor((n,), "float32"))
        c = vm_alloc_tensor(shape(n), dtype="float32")
        _3: Tuple() = @add(a2, b, c, shape(n))
        return c
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n,), "float32")):
        n = sym(lo=1)
        xa = x
        a = vm_alloc_tensor(shape(n), dtype="float32")
        _1: Tuple() = @exp(xa, a, shape(n))
        a1 = a
        b = vm_alloc_tensor(shape(n), dtype="float32")
        _2: Tuple() = @exp(a1, b, shape(n))
        a2 = match_cast(a1, Tensor((n,), "float32"))
        c = vm_alloc_tensor(shape(n), dtype="float32")
        _3: Tuple() = @add(a2, b, c, shape(n))
        _k1 = vm_kill(a)
        _k2 = vm_kill(b)
        return c
    """
    check(before, expected)


def test_a_value_returned_through_an_alias_is_not_killed() -> None:
    # what lower_calls produces: the call's var aliases the allocation; returning the alias
    # keeps the allocation
    check_unchanged(
        P,
        dedent(
            """
            @graph(pure=False)
            def main(x: Tensor((n,), "float32")):
                n = sym(lo=1)
                gv = vm_alloc_tensor(shape(n), dtype="float32")
                _1: Tuple() = @exp(x, gv, shape(n))
                gv1 = gv
                return gv1
            """
        )
        + KERNELS,
    )


def test_tuples_die_after_their_last_item_read_and_their_fields_after_the_tuple() -> None:
    # a kill drops one register: t keeps t_0 and t_1 alive after their own registers go, and
    # e (an item, a value of its own) dies after its last read
    before = """
    @graph(pure=False)
    def main(x: Tensor((n,), "float32")):
        n = sym(lo=1)
        t_0 = vm_alloc_tensor(shape(n), dtype="float32")
        t_1 = vm_alloc_tensor(shape(n), dtype="float32")
        t = (t_0, t_1)
        e = t[0]
        f = t[1]
        c = vm_alloc_tensor(shape(n), dtype="float32")
        _1: Tuple() = @add(e, f, c, shape(n))
        return c
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n,), "float32")):
        n = sym(lo=1)
        t_0 = vm_alloc_tensor(shape(n), dtype="float32")
        t_1 = vm_alloc_tensor(shape(n), dtype="float32")
        t = (t_0, t_1)
        _k1 = vm_kill(t_0)
        _k2 = vm_kill(t_1)
        e = t[0]
        f = t[1]
        _k3 = vm_kill(t)
        c = vm_alloc_tensor(shape(n), dtype="float32")
        _1: Tuple() = @add(e, f, c, shape(n))
        _k4 = vm_kill(e)
        _k5 = vm_kill(f)
        return c
    """
    check(before, expected)


def test_across_if_branch_locals_die_in_their_branch_outer_values_after_the_if() -> None:
    # a is read only inside the then branch: it dies after the whole If (the else path never
    # reads it); u dies inside its branch; v and w are what their branches return; r is read
    # after the If and dies after that read; b, read after the If, dies there too
    before = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n,), "float32")):
        n = sym(lo=1)
        a = vm_alloc_tensor(shape(n), dtype="float32")
        _1: Tuple() = @exp(x, a, shape(n))
        b = vm_alloc_tensor(shape(n), dtype="float32")
        _2: Tuple() = @exp(x, b, shape(n))
        r = if c:
            u = vm_alloc_tensor(shape(n), dtype="float32")
            _3: Tuple() = @exp(a, u, shape(n))
            v = vm_alloc_tensor(shape(n), dtype="float32")
            _4: Tuple() = @exp(u, v, shape(n))
            v
        else:
            w = vm_alloc_tensor(shape(n), dtype="float32")
            _5: Tuple() = @exp(x, w, shape(n))
            w
        z = vm_alloc_tensor(shape(n), dtype="float32")
        _6: Tuple() = @add(r, b, z, shape(n))
        return z
    """
    expected = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n,), "float32")):
        n = sym(lo=1)
        a = vm_alloc_tensor(shape(n), dtype="float32")
        _1: Tuple() = @exp(x, a, shape(n))
        b = vm_alloc_tensor(shape(n), dtype="float32")
        _2: Tuple() = @exp(x, b, shape(n))
        r = if c:
            u = vm_alloc_tensor(shape(n), dtype="float32")
            _3: Tuple() = @exp(a, u, shape(n))
            v = vm_alloc_tensor(shape(n), dtype="float32")
            _4: Tuple() = @exp(u, v, shape(n))
            _k1 = vm_kill(u)
            v
        else:
            w = vm_alloc_tensor(shape(n), dtype="float32")
            _5: Tuple() = @exp(x, w, shape(n))
            w
        _k2 = vm_kill(a)
        z = vm_alloc_tensor(shape(n), dtype="float32")
        _6: Tuple() = @add(r, b, z, shape(n))
        _k3 = vm_kill(b)
        _k4 = vm_kill(r)
        return z
    """
    check(before, expected)


def test_an_outer_value_an_if_may_return_dies_after_the_if_whose_result_holds_it() -> None:
    # r may be a itself, but r is a register of its own (the branch copies its result into
    # it): a's register goes after the If, r's value lives on and is returned
    before = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n,), "float32")):
        n = sym(lo=1)
        a = vm_alloc_tensor(shape(n), dtype="float32")
        _1: Tuple() = @exp(x, a, shape(n))
        r = if c:
            a
        else:
            x
        return r
    """
    expected = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n,), "float32")):
        n = sym(lo=1)
        a = vm_alloc_tensor(shape(n), dtype="float32")
        _1: Tuple() = @exp(x, a, shape(n))
        r = if c:
            a
        else:
            x
        _k1 = vm_kill(a)
        return r
    """
    check(before, expected)


def test_shapes_prims_and_unread_values_are_not_killed() -> None:
    check_unchanged(
        P,
        dedent(
            """
            @graph(pure=False)
            def main(x: Tensor((n,), "float32")):
                n = sym(lo=1)
                s = shape(n)
                d = prim(n)
                unread = vm_alloc_tensor(shape(n), dtype="float32")
                a = vm_alloc_tensor(s, dtype="float32")
                _1: Tuple() = @exp(x, a, s)
                p = call_packed(extern("tw.print"), (d,), pure=False, out=Any)
                return a
            """
        )
        + KERNELS,
    )

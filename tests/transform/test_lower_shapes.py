"""lower_shapes: a shape heap per graph function (one slot per sym var, with its name and
declared bounds); parameters and match_casts are checked at run time, each sym var stored the
first time it is seen bare and asserted after; symbolic shape values are built from the heap;
``assert_dims`` becomes ``vm_check_dims`` over heap slots.

Codes of ``vm_match_shape``, per dim: STORE=0, ASSERT_IMM=1, ASSERT_SLOT=2, SKIP=3, each
followed by its operand (slot or constant). Codes of ``vm_make_shape``: 0 = constant, 1 = slot.

Derived dims (``2 * n``, computed by ``vm_shape_func``) appear in one test only,
``test_derived_dim_*``: their encoding is about to change.
"""

from __future__ import annotations

from textwrap import dedent

import numpy as np

import tilework as tw
from tests.transform.util import check_pass, ir
from tilework.op.vm import ASSERT_IMM, ASSERT_SLOT, SKIP, STORE
from tilework.transform.lower_shapes import LowerShapes

P = LowerShapes()


def test_the_codes_written_in_these_texts() -> None:
    assert (STORE, ASSERT_IMM, ASSERT_SLOT, SKIP) == (0, 1, 2, 3)


def test_a_sym_var_is_stored_at_its_first_bare_dim_and_asserted_after() -> None:
    # n: STORE from x.shape[0], then ASSERT_SLOT in y; 4: ASSERT_IMM; m: stored by y and
    # asserted by the shape value s, which stores k. The heap keeps n's declared bounds.
    before = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32"), y: Tensor((n, m), "float32"), s: Shape((m, k))):
        n = sym(lo=1, hi=64)
        m = sym()
        k = sym()
        return x
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32"), y: Tensor((n, m), "float32"), s: Shape((m, k))):
        n = sym(lo=1, hi=64)
        m = sym()
        k = sym()
        shape_heap = vm_alloc_shape_heap(bounds=[[1, 64], [0, None], [0, None]], names=["n", "m", "k"], size=3)
        _1 = vm_check_tensor_info(x, dtype="float32", ndim=2, where="main: argument x")
        _2 = vm_match_shape(x, shape_heap, codes=[0, 0, 1, 4], label="x.shape", where="main: argument x")
        _3 = vm_check_tensor_info(y, dtype="float32", ndim=2, where="main: argument y")
        _4 = vm_match_shape(y, shape_heap, codes=[2, 0, 0, 1], label="y.shape", where="main: argument y")
        _5 = vm_check_shape_info(s, ndim=2, where="main: argument s")
        _6 = vm_match_shape(s, shape_heap, codes=[2, 1, 0, 2], label="s", where="main: argument s")
        return x
    """
    check_pass(P, before, expected)


def test_static_dims_tuples_and_prims_are_checked_without_slots() -> None:
    # static dims are asserted by value; a tuple is checked field by field (an Any field not
    # at all); a static shape value stays a literal; the heap is empty
    before = """
    @graph(pure=False)
    def main(x: Tensor((2, 3), "float32"), t: Tuple(Tensor((3,), "int32"), Any), c: Prim("bool"), u: Tensor(ndim=2, dtype="float16")):
        a = vm_alloc_tensor(shape(2, 3), dtype="float32")
        return a
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((2, 3), "float32"), t: Tuple(Tensor((3,), "int32"), Any), c: Prim("bool"), u: Tensor(ndim=2, dtype="float16")):
        shape_heap = vm_alloc_shape_heap(bounds=[], names=[], size=0)
        _1 = vm_check_tensor_info(x, dtype="float32", ndim=2, where="main: argument x")
        _2 = vm_match_shape(x, shape_heap, codes=[1, 2, 1, 3], label="x.shape", where="main: argument x")
        _3 = vm_check_tuple_info(t, size=2, where="main: argument t")
        t_0: Tensor((3,), "int32") = t[0]
        _4 = vm_check_tensor_info(t_0, dtype="int32", ndim=1, where="main: argument t")
        _5 = vm_match_shape(t_0, shape_heap, codes=[1, 3], label="t[0].shape", where="main: argument t")
        _6 = vm_check_prim_info(c, dtype="bool", where="main: argument c")
        _7 = vm_check_tensor_info(u, dtype="float16", ndim=2, where="main: argument u")
        a = vm_alloc_tensor(shape(2, 3), dtype="float32")
        return a
    """
    check_pass(P, before, expected)


KERNEL = """
@tensor
def add(A: Buffer((n, m), "float32"), B: Buffer((n, m), "float32"), C: Buffer((n, m), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            C[i, j] = A[i, j] + B[i, j]
"""


def test_symbolic_shape_values_are_made_from_the_heap_in_each_function_and_branch() -> None:
    # every symbolic shape(...) (allocation sizes, kernel sym values) becomes vm_make_shape and
    # a symbolic prim a vm_load_dim; static dims stay constants; each function has its own heap
    before = dedent("""
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym()
        a = vm_alloc_tensor(shape(n, m), dtype="float32")
        _1: Tuple() = @add(x, x, a, shape(n, m))
        d = prim(m)
        r = if c:
            b = vm_alloc_tensor(shape(m, 4), dtype="float32")
            b
        else:
            e = @helper(a, d)
            e
        return r

    @graph(pure=False)
    def helper(y: Tensor((p, q), "float32"), k: Prim("int64", value=q)) -> Tensor((q, 4), "float32"):
        p = sym()
        q = sym()
        z = vm_alloc_tensor(shape(q, 4), dtype="float32")
        return z
    """) + KERNEL
    expected = dedent("""
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym()
        shape_heap = vm_alloc_shape_heap(bounds=[[1, None], [0, None]], names=["n", "m"], size=2)
        _1 = vm_check_prim_info(c, dtype="bool", where="main: argument c")
        _2 = vm_check_tensor_info(x, dtype="float32", ndim=2, where="main: argument x")
        _3 = vm_match_shape(x, shape_heap, codes=[0, 0, 0, 1], label="x.shape", where="main: argument x")
        s1: Shape((n, m)) = vm_make_shape(shape_heap, codes=[1, 0, 1, 1])
        a = vm_alloc_tensor(s1, dtype="float32")
        _4: Tuple() = @add(x, x, a, s1)
        dim: Prim("int64", value=m) = vm_load_dim(shape_heap, slot=1)
        d: Prim("int64", value=m) = dim
        r = if c:
            s3: Shape((m, 4)) = vm_make_shape(shape_heap, codes=[1, 1, 0, 4])
            b = vm_alloc_tensor(s3, dtype="float32")
            b
        else:
            e = @helper(a, d)
            e
        return r

    @graph(pure=False)
    def helper(y: Tensor((p, q), "float32"), k: Prim("int64", value=q)) -> Tensor((q, 4), "float32"):
        p = sym()
        q = sym()
        shape_heap = vm_alloc_shape_heap(bounds=[[0, None], [0, None]], names=["p", "q"], size=2)
        _1 = vm_check_tensor_info(y, dtype="float32", ndim=2, where="helper: argument y")
        _2 = vm_match_shape(y, shape_heap, codes=[0, 0, 0, 1], label="y.shape", where="helper: argument y")
        _3 = vm_check_prim_info(k, dtype="int64", where="helper: argument k")
        _4 = vm_match_shape(k, shape_heap, codes=[2, 1], label="k", where="helper: argument k")
        s1: Shape((q, 4)) = vm_make_shape(shape_heap, codes=[1, 1, 0, 4])
        z = vm_alloc_tensor(s1, dtype="float32")
        return z
    """) + KERNEL
    check_pass(P, before, expected)


def test_match_cast_is_checked_first_and_stays_to_define_its_sym_vars() -> None:
    # the cast binds k: its checks store k, later shapes read it; a sym var known from a
    # parameter (n) is asserted
    before = """
    @graph(pure=False)
    def main(x: Tensor(ndim=2, dtype="float32"), y: Tensor((n,), "float32")):
        n = sym(lo=1)
        k = sym()
        a = match_cast(x, Tensor((k, n), "float32"))
        b = vm_alloc_tensor(shape(k, n), dtype="float32")
        return b
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor(ndim=2, dtype="float32"), y: Tensor((n,), "float32")):
        n = sym(lo=1)
        k = sym()
        shape_heap = vm_alloc_shape_heap(bounds=[[1, None], [0, None]], names=["n", "k"], size=2)
        _1 = vm_check_tensor_info(x, dtype="float32", ndim=2, where="main: argument x")
        _2 = vm_check_tensor_info(y, dtype="float32", ndim=1, where="main: argument y")
        _3 = vm_match_shape(y, shape_heap, codes=[0, 0], label="y.shape", where="main: argument y")
        _4 = vm_check_tensor_info(x, dtype="float32", ndim=2, where="main: match_cast of x to (k, n)")
        _5 = vm_match_shape(x, shape_heap, codes=[0, 1, 2, 0], label="x.shape", where="main: match_cast of x to (k, n)")
        a = match_cast(x, Tensor((k, n), "float32"))
        s1: Shape((k, n)) = vm_make_shape(shape_heap, codes=[1, 1, 1, 0])
        b = vm_alloc_tensor(s1, dtype="float32")
        return b
    """
    check_pass(P, before, expected)


def test_assert_dims_becomes_a_check_over_heap_slots() -> None:
    # a DimCheck that op inference could not prove (n and m broadcast) is checked at run time
    # on the slots of n and m
    before = """
    @graph(pure=False)
    def main(x: Tensor((n,), "float32"), y: Tensor((m,), "float32")):
        n = sym()
        m = sym()
        ck = assert_dims(shape(n, m), checks=(("broadcast", 0, 1, "add: dims n and m must be equal or 1"), ("ge", 1, 0, "m >= n")))
        return x
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n,), "float32"), y: Tensor((m,), "float32")):
        n = sym()
        m = sym()
        shape_heap = vm_alloc_shape_heap(bounds=[[0, None], [0, None]], names=["n", "m"], size=2)
        _1 = vm_check_tensor_info(x, dtype="float32", ndim=1, where="main: argument x")
        _2 = vm_match_shape(x, shape_heap, codes=[0, 0], label="x.shape", where="main: argument x")
        _3 = vm_check_tensor_info(y, dtype="float32", ndim=1, where="main: argument y")
        _4 = vm_match_shape(y, shape_heap, codes=[0, 1], label="y.shape", where="main: argument y")
        _5 = vm_check_dims(shape_heap, checks=[["broadcast", 0, 1, "add: dims n and m must be equal or 1"], ["ge", 1, 0, "m >= n"]], where="main")
        return x
    """
    check_pass(P, before, expected)


def test_a_return_value_not_provably_of_the_declared_shape_is_checked() -> None:
    # the packed function promises only a 1-D tensor; the signature says (n,)
    before = """
    @graph(pure=False)
    def main(y: Tensor((n,), "float32")) -> Tensor((n,), "float32"):
        n = sym()
        p = call_packed(extern("tw.echo"), (y,), pure=False, out=Tensor(ndim=1, dtype="float32"))
        return p
    """
    expected = """
    @graph(pure=False)
    def main(y: Tensor((n,), "float32")) -> Tensor((n,), "float32"):
        n = sym()
        shape_heap = vm_alloc_shape_heap(bounds=[[0, None]], names=["n"], size=1)
        _1 = vm_check_tensor_info(y, dtype="float32", ndim=1, where="main: argument y")
        _2 = vm_match_shape(y, shape_heap, codes=[0, 0], label="y.shape", where="main: argument y")
        p = call_packed(extern("tw.echo"), (y,), pure=False, out=Tensor(ndim=1, dtype="float32"))
        _3 = vm_check_tensor_info(p, dtype="float32", ndim=1, where="main: return value")
        _4 = vm_match_shape(p, shape_heap, codes=[2, 0], label="return.shape", where="main: return value")
        return p
    """
    check_pass(P, before, expected)


def test_a_sym_var_bound_by_match_casts_in_both_branches_is_stored_in_each() -> None:
    # Each run takes one branch: the else branch's match_cast must STORE k too (what a branch
    # stores is known only inside it), or the else path would fail at run time with
    # "x.shape[0] = 3 but k = 0".
    before = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor(ndim=1, dtype="float32")):
        k = sym()
        r = if c:
            a = match_cast(x, Tensor((k,), "float32"))
            x
        else:
            b = match_cast(x, Tensor((k,), "float32"))
            x
        return r
    """
    expected = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor(ndim=1, dtype="float32")):
        k = sym()
        shape_heap = vm_alloc_shape_heap(bounds=[[0, None]], names=["k"], size=1)
        _1 = vm_check_prim_info(c, dtype="bool", where="main: argument c")
        _2 = vm_check_tensor_info(x, dtype="float32", ndim=1, where="main: argument x")
        r = if c:
            _3 = vm_check_tensor_info(x, dtype="float32", ndim=1, where="main: match_cast of x to (k,)")
            _4 = vm_match_shape(x, shape_heap, codes=[0, 0], label="x.shape", where="main: match_cast of x to (k,)")
            a = match_cast(x, Tensor((k,), "float32"))
            x
        else:
            _5 = vm_check_tensor_info(x, dtype="float32", ndim=1, where="main: match_cast of x to (k,)")
            _6 = vm_match_shape(x, shape_heap, codes=[0, 0], label="x.shape", where="main: match_cast of x to (k,)")
            b = match_cast(x, Tensor((k,), "float32"))
            x
        return r
    """
    check_pass(P, before, expected)


def test_derived_dim_is_skipped_while_matching_then_computed_once_and_asserted() -> None:
    # y's dim 2 * n is skipped (SKIP) while n is unknown, computed into its own slot by
    # vm_shape_func once every parameter is matched, and asserted; n + 1 is computed just
    # before its first use and reused by the second shape
    before = """
    @graph(pure=False)
    def main(y: Tensor((2 * n,), "float32"), x: Tensor((n,), "float32")):
        n = sym(lo=1)
        a = vm_alloc_tensor(shape(n + 1, 2 * n), dtype="float32")
        b = vm_alloc_tensor(shape(n + 1), dtype="float32")
        return a
    """
    expected = """
    @graph(pure=False)
    def main(y: Tensor((2 * n,), "float32"), x: Tensor((n,), "float32")):
        n = sym(lo=1)
        shape_heap = vm_alloc_shape_heap(bounds=[[1, None], [-4611686018427387904, None], [-4611686018427387904, None]], names=["n", "2 * n", "n + 1"], size=3)
        _1 = vm_check_tensor_info(y, dtype="float32", ndim=1, where="main: argument y")
        _2 = vm_match_shape(y, shape_heap, codes=[3, 0], label="y.shape", where="main: argument y")
        _3 = vm_check_tensor_info(x, dtype="float32", ndim=1, where="main: argument x")
        _4 = vm_match_shape(x, shape_heap, codes=[0, 0], label="x.shape", where="main: argument x")
        _5 = vm_shape_func(shape_heap, programs=[["mul", ["const", 2], ["slot", 0]]], slots=[1])
        _6 = vm_match_shape(y, shape_heap, codes=[2, 1], label="y.shape", where="main: arguments")
        _7 = vm_shape_func(shape_heap, programs=[["add", ["slot", 0], ["const", 1]]], slots=[2])
        s1: Shape((n + 1, 2 * n)) = vm_make_shape(shape_heap, codes=[1, 2, 1, 1])
        a = vm_alloc_tensor(s1, dtype="float32")
        s2: Shape((n + 1,)) = vm_make_shape(shape_heap, codes=[1, 2])
        b = vm_alloc_tensor(s2, dtype="float32")
        return a
    """
    check_pass(P, before, expected)


def test_a_derived_dim_used_in_both_branches_is_computed_in_each() -> None:
    # Each run takes one branch, so a derived dim (n + n) computed in the then branch is not
    # there for the else branch: each computes it (an empty result once came from a slot still 0).
    mod = ir(
        """
        @graph
        def main(c: Prim("bool"), x: Tensor((n,), "float32")) -> Tensor((n + n,), "float32"):
            n = sym(lo=1)
            r = if c:
                a = concat((x, x), axis=0)
                a
            else:
                e = exp(x)
                b = concat((x, e), axis=0)
                b
            return r
        """
    )
    vm = tw.VM(tw.build(mod))
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(vm["main"](np.array(True), x), np.concatenate([x, x]))
    np.testing.assert_allclose(vm["main"](np.array(False), x), np.concatenate([x, np.exp(x)]), rtol=1e-6)


def test_the_var_bound_to_assert_dims_stays_defined() -> None:
    before = """
    @graph(pure=False)
    def main(x: Tensor((n,), "float32"), y: Tensor((m,), "float32")):
        n = sym()
        m = sym()
        ck = assert_dims(shape(n, m), checks=[["eq", 0, 1, "n must equal m"]])
        t = (ck, x)
        return t
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n,), "float32"), y: Tensor((m,), "float32")):
        n = sym()
        m = sym()
        shape_heap = vm_alloc_shape_heap(bounds=[[0, None], [0, None]], names=["n", "m"], size=2)
        _1 = vm_check_tensor_info(x, dtype="float32", ndim=1, where="main: argument x")
        _2 = vm_match_shape(x, shape_heap, codes=[0, 0], label="x.shape", where="main: argument x")
        _3 = vm_check_tensor_info(y, dtype="float32", ndim=1, where="main: argument y")
        _4 = vm_match_shape(y, shape_heap, codes=[0, 1], label="y.shape", where="main: argument y")
        ck = vm_check_dims(shape_heap, checks=[["eq", 0, 1, "n must equal m"]], where="main")
        t = (ck, x)
        return t
    """
    check_pass(LowerShapes(), before, expected)


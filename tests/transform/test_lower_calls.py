"""lower_calls: every ``call_tensor`` / ``call_lib`` becomes an explicit ``vm_alloc_tensor`` per
output and a destination-passing call that takes the outputs after the inputs (and, for a
kernel, the values of its sym vars in ABI order); the call's var then names the allocation (or
the tuple of them). Other calls stay; every graph function becomes impure."""

from __future__ import annotations

import textwrap

from tests.transform.util import check_pass
from tilework.ir.module import IRModule
from tilework.transform.lower_calls import LowerCalls

P = LowerCalls()

# Kernels are written without blocks: lower_calls reads only their buffer shapes and sym params.
KERNELS = """
@tensor
def add(A: Buffer((n, m), "float32"), B: Buffer((n, m), "float32"), C: Buffer((n, m), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            C[i, j] = A[i, j] + B[i, j]

@tensor
def matmul(A: Buffer((n, k), "float32"), B: Buffer((k, m), "float32"), C: Buffer((n, m), "float32")):
    n = sym()
    k = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            C[i, j] = A[i, 0] * B[0, j]

@tensor(num_outputs=2)
def split(A: Buffer((n, m), "float32"), B: Buffer((n, m), "float32"), C: Buffer((n, m), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for j in range(m):
            B[i, j] = A[i, j]
            C[i, j] = A[i, j]

@tensor
def concat(A: Buffer((n,), "float32"), B: Buffer((m,), "float32"), C: Buffer((n + m,), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        C[i] = A[i]
    for j in range(m):
        C[n + j] = B[j]

@tensor
def roll(A: Buffer((n, 4), "float32"), s: int64, B: Buffer((n, 4), "float32")):
    n = sym()
    s = sym()
    for i in range(n):
        for j in range(4):
            B[i, j] = A[(i + s) % n, j]
"""


def with_kernels(text: str) -> str:
    return textwrap.dedent(text) + KERNELS


def check(before: str, expected: str) -> IRModule:
    return check_pass(P, with_kernels(before), with_kernels(expected))


def test_call_tensor_becomes_an_allocation_and_a_destination_passing_call() -> None:
    # the call's var becomes an alias of the allocation, so every later use still reads it
    before = """
    @graph
    def main(x: Tensor((n, m), "float32"), y: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym()
        a = call_tensor(@add, (x, y), out=Tensor((n, m), "float32"))
        gv = call_tensor(@add, (a, x), out=Tensor((n, m), "float32"))
        return gv
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n, m), "float32"), y: Tensor((n, m), "float32")):
        n = sym(lo=1)
        m = sym()
        a_out = vm_alloc_tensor(shape(n, m), dtype="float32")
        _1: Tuple() = @add(x, y, a_out, shape(n, m))
        a = a_out
        gv_out = vm_alloc_tensor(shape(n, m), dtype="float32")
        _2: Tuple() = @add(a, x, gv_out, shape(n, m))
        gv = gv_out
        return gv
    """
    check(before, expected)


def test_sym_values_are_the_callers_dims_in_kernel_abi_order() -> None:
    # @matmul's sym vars are (n, k, m) in the order its buffers mention them; the caller's
    # dims for them are (b, s, h)
    before = """
    @graph
    def main(x: Tensor((b, s), "float32"), w: Tensor((s, h), "float32")):
        b = sym(lo=1)
        s = sym()
        h = sym()
        y = call_tensor(@matmul, (x, w), out=Tensor((b, h), "float32"))
        return y
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((b, s), "float32"), w: Tensor((s, h), "float32")):
        b = sym(lo=1)
        s = sym()
        h = sym()
        y_out = vm_alloc_tensor(shape(b, h), dtype="float32")
        _1: Tuple() = @matmul(x, w, y_out, shape(b, s, h))
        y = y_out
        return y
    """
    check(before, expected)


def test_symbolic_output_shapes_and_sym_values_derived_or_passed() -> None:
    # concat: the output is allocated at the caller's derived size p + q, the kernel gets
    # (n, m) = (p, q) from its inputs; roll: s is a sym param no buffer shape holds, passed
    # by shape(t) and appended after the buffers' sym vars
    before = """
    @graph
    def main(x: Tensor((p,), "float32"), y: Tensor((q,), "float32"), z: Tensor((p, 4), "float32"), r: Shape((t,))):
        p = sym(lo=1)
        q = sym()
        t = sym()
        c = call_tensor(@concat, (x, y), out=Tensor((p + q,), "float32"))
        e = call_tensor(@roll, (z,), shape(t), out=Tensor((p, 4), "float32"))
        u = (c, e)
        return u
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((p,), "float32"), y: Tensor((q,), "float32"), z: Tensor((p, 4), "float32"), r: Shape((t,))):
        p = sym(lo=1)
        q = sym()
        t = sym()
        c_out = vm_alloc_tensor(shape(p + q), dtype="float32")
        _1: Tuple() = @concat(x, y, c_out, shape(p, q))
        c = c_out
        e_out = vm_alloc_tensor(shape(p, 4), dtype="float32")
        _2: Tuple() = @roll(z, e_out, shape(p, t))
        e = e_out
        u = (c, e)
        return u
    """
    check(before, expected)


def test_tuple_outputs_get_one_allocation_each() -> None:
    before = """
    @graph
    def main(x: Tensor((n, m), "float32")):
        n = sym()
        m = sym()
        t = call_tensor(@split, (x,), out=Tuple(Tensor((n, m), "float32"), Tensor((n, m), "float32")))
        a = t[0]
        b = t[1]
        gv = call_tensor(@add, (a, b), out=Tensor((n, m), "float32"))
        return gv
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n, m), "float32")):
        n = sym()
        m = sym()
        t_0 = vm_alloc_tensor(shape(n, m), dtype="float32")
        t_1 = vm_alloc_tensor(shape(n, m), dtype="float32")
        _1: Tuple() = @split(x, t_0, t_1, shape(n, m))
        t = (t_0, t_1)
        a = t[0]
        b = t[1]
        gv_out = vm_alloc_tensor(shape(n, m), dtype="float32")
        _2: Tuple() = @add(a, b, gv_out, shape(n, m))
        gv = gv_out
        return gv
    """
    check(before, expected)


def test_call_lib_allocates_its_outputs_and_appends_them_to_the_arguments() -> None:
    # no sym values for a library function: it reads the shapes from its arrays
    before = """
    @graph
    def main(x: Tensor((n,), "float32")):
        n = sym()
        d = call_lib(extern("cblas_sdot"), (x, x), out=Tensor((), "float32"))
        t = call_lib(extern("tw.minmax"), (x,), out=Tuple(Tensor((n,), "float32"), Tensor((n,), "int64")))
        r = (d, t)
        return r
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n,), "float32")):
        n = sym()
        d_out = vm_alloc_tensor(shape(), dtype="float32")
        _1: Tuple() = extern("cblas_sdot")(x, x, d_out)
        d = d_out
        t_0 = vm_alloc_tensor(shape(n), dtype="float32")
        t_1 = vm_alloc_tensor(shape(n), dtype="int64")
        _2: Tuple() = extern("tw.minmax")(x, t_0, t_1)
        t = (t_0, t_1)
        r = (d, t)
        return r
    """
    check(before, expected)


def test_graph_calls_packed_calls_and_views_stay_and_callees_are_lowered_too() -> None:
    before = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        h = @helper(x)
        v = vm_view(h, shape(4 * n))
        p = call_packed(extern("tw.print"), ("v", v), pure=False, out=Any)
        return h

    @graph
    def helper(y: Tensor((k, 4), "float32")) -> Tensor((k, 4), "float32"):
        k = sym(lo=1)
        s = call_tensor(@add, (y, y), out=Tensor((k, 4), "float32"))
        return s
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        h = @helper(x)
        v = vm_view(h, shape(4 * n))
        p = call_packed(extern("tw.print"), ("v", v), pure=False, out=Any)
        return h

    @graph(pure=False)
    def helper(y: Tensor((k, 4), "float32")) -> Tensor((k, 4), "float32"):
        k = sym(lo=1)
        s_out = vm_alloc_tensor(shape(k, 4), dtype="float32")
        _1: Tuple() = @add(y, y, s_out, shape(k, 4))
        s = s_out
        return s
    """
    check(before, expected)


def test_calls_inside_if_branches_are_lowered_in_their_branch() -> None:
    before = """
    @graph
    def main(c: Prim("bool"), x: Tensor((n, k), "float32"), w: Tensor((k, m), "float32")):
        n = sym()
        k = sym()
        m = sym()
        r = if c:
            a = call_tensor(@matmul, (x, w), out=Tensor((n, m), "float32"))
            a
        else:
            b = call_tensor(@matmul, (x, w), out=Tensor((n, m), "float32"))
            e = call_tensor(@add, (b, b), out=Tensor((n, m), "float32"))
            e
        return r
    """
    expected = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n, k), "float32"), w: Tensor((k, m), "float32")):
        n = sym()
        k = sym()
        m = sym()
        r = if c:
            a_out = vm_alloc_tensor(shape(n, m), dtype="float32")
            _1: Tuple() = @matmul(x, w, a_out, shape(n, k, m))
            a = a_out
            a
        else:
            b_out = vm_alloc_tensor(shape(n, m), dtype="float32")
            _2: Tuple() = @matmul(x, w, b_out, shape(n, k, m))
            b = b_out
            e_out = vm_alloc_tensor(shape(n, m), dtype="float32")
            _3: Tuple() = @add(b, b, e_out, shape(n, m))
            e = e_out
            e
        return r
    """
    check(before, expected)

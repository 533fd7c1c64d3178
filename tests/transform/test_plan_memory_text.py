"""plan_memory, as text: planned allocations become ``vm_alloc_tensor_from_storage(arena, shape,
offset)`` of a static arena (bounded sizes: ``vm_alloc_storage(<capacity>, static=True)``) or a
pooled one (``vm_alloc_storage(<size dim>)`` at entry, ``vm_free_storage`` at the end); offsets
and sizes are dims in 64-byte units. Returned values and sizes bound after entry stay
``vm_alloc_tensor``. (tests/transform/test_plan_memory.py checks big plans by brute force.)

For a float32 (n, 4) tensor the slot is ``64 * ((16 * n + 63) // 64)`` bytes: 16 * n rounded up
to 64. Kernels written without blocks are opaque to the in-place rule; ``@exp`` has one
elementwise block, so its output may take its input's place.
"""

from __future__ import annotations

from textwrap import dedent

from tests.transform.util import check_pass, check_unchanged
from tilework.ir.module import IRModule
from tilework.transform.plan_memory import PlanMemory

P = PlanMemory()

KERNELS = """
@tensor
def copy(A: Buffer((n, 4), "float32"), B: Buffer((n, 4), "float32")):
    n = sym()
    for i in range(n):
        for j in range(4):
            B[i, j] = A[i, j]

@tensor
def half(A: Buffer((n,), "float32"), B: Buffer((n,), "float16")):
    n = sym()
    for i in range(n):
        B[i] = cast(A[i], "float16")

@tensor
def mix(A: Buffer((n, 4), "float32"), B: Buffer((m,), "float16"), C: Buffer((n, 4), "float32")):
    n = sym()
    m = sym()
    for i in range(n):
        for j in range(4):
            C[i, j] = A[i, j] + cast(B[0], "float32")

@tensor
def exp(x: Buffer((n, 4), "float32"), y: Buffer((n, 4), "float32")):
    n = sym()
    for i0 in range(n):
        for i1 in range(4):
            with block("exp"):
                vi0 = spatial(n, i0)
                vi1 = spatial(4, i1)
                reads(x)
                writes(y)
                y[vi0, vi1] = exp(x[vi0, vi1])

@tensor
def add(a: Buffer((n, 4), "float32"), b: Buffer((n, 4), "float32"), c: Buffer((n, 4), "float32")):
    n = sym()
    for i0 in range(n):
        for i1 in range(4):
            with block("add"):
                vi0 = spatial(n, i0)
                vi1 = spatial(4, i1)
                reads(a, b)
                writes(c)
                c[vi0, vi1] = a[vi0, vi1] + b[vi0, vi1]
"""


def check(before: str, expected: str, pass_: PlanMemory = P) -> IRModule:
    return check_pass(pass_, dedent(before) + KERNELS, dedent(expected) + KERNELS)


def test_tensors_with_disjoint_lifetimes_share_one_slot() -> None:
    # a lives over bindings 1-4 (allocation .. read by the second copy), b over 3-6, c over
    # 5-8: a and c never live together and share offset 0, b sits above them; d is returned.
    # The aliases lower_calls leaves (a1 = a) are the same value.
    before = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        a = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _1: Tuple() = @copy(x, a, shape(n))
        a1 = a
        b = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _2: Tuple() = @copy(a1, b, shape(n))
        c = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _3: Tuple() = @copy(b, c, shape(n))
        d = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _4: Tuple() = @copy(c, d, shape(n))
        return d
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        pooled_arena = vm_alloc_storage(prim(2 * 64 * ((16 * n + 63) // 64)), label="main.pooled", static=False)
        a = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(0), dtype="float32")
        _1: Tuple() = @copy(x, a, shape(n))
        a1 = a
        b = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(64 * ((16 * n + 63) // 64)), dtype="float32")
        _2: Tuple() = @copy(a1, b, shape(n))
        c = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(0), dtype="float32")
        _3: Tuple() = @copy(b, c, shape(n))
        d = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _4: Tuple() = @copy(c, d, shape(n))
        _free = vm_free_storage(pooled_arena)
        return d
    """
    check(before, expected)


MIXED = """
@graph(pure=False)
def main(x: Tensor((n, 4), "float32"), y: Tensor((m,), "float32")):
    n = sym(lo=1, hi=16)
    m = sym()
    a = vm_alloc_tensor(shape(n, 4), dtype="float32")
    _1: Tuple() = @copy(x, a, shape(n))
    b = vm_alloc_tensor(shape(m), dtype="float16")
    _2: Tuple() = @half(y, b, shape(m))
    c = vm_alloc_tensor(shape(n, 4), dtype="float32")
    _3: Tuple() = @mix(a, b, c, shape(n, m))
    return c
"""


def test_a_bounded_dim_goes_to_the_static_arena_an_unbounded_one_to_the_pool() -> None:
    # a is at most 16 * 16 = 256 bytes: the static arena holds 256 bytes for good (no free);
    # b (float16, m unbounded) is sized per call from the pool and freed at the end
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32"), y: Tensor((m,), "float32")):
        n = sym(lo=1, hi=16)
        m = sym()
        static_arena = vm_alloc_storage(prim(256), label="main.static", static=True)
        pooled_arena = vm_alloc_storage(prim(64 * ((2 * m + 63) // 64)), label="main.pooled", static=False)
        a = vm_alloc_tensor_from_storage(static_arena, shape(n, 4), prim(0), dtype="float32")
        _1: Tuple() = @copy(x, a, shape(n))
        b = vm_alloc_tensor_from_storage(pooled_arena, shape(m), prim(0), dtype="float16")
        _2: Tuple() = @half(y, b, shape(m))
        c = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _3: Tuple() = @mix(a, b, c, shape(n, m))
        _free = vm_free_storage(pooled_arena)
        return c
    """
    check(MIXED, expected)


def test_a_static_arena_above_the_limit_is_pooled_instead() -> None:
    # 256 bytes > static_limit: both tensors (live together) share the pool, largest first
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32"), y: Tensor((m,), "float32")):
        n = sym(lo=1, hi=16)
        m = sym()
        pooled_arena = vm_alloc_storage(prim(64 * ((16 * n + 63) // 64) + 64 * ((2 * m + 63) // 64)), label="main.pooled", static=False)
        a = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(0), dtype="float32")
        _1: Tuple() = @copy(x, a, shape(n))
        b = vm_alloc_tensor_from_storage(pooled_arena, shape(m), prim(64 * ((16 * n + 63) // 64)), dtype="float16")
        _2: Tuple() = @half(y, b, shape(m))
        c = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _3: Tuple() = @mix(a, b, c, shape(n, m))
        _free = vm_free_storage(pooled_arena)
        return c
    """
    check(MIXED, expected, PlanMemory(static_limit=255))


def test_values_that_may_be_returned_are_never_planned() -> None:
    # a is returned in a tuple, b through an If, e through a graph function (which may return
    # its argument), v through a view; only p, read by a copy and dead after it, is planned
    before = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n, 4), "float32")):
        n = sym(lo=1, hi=8)
        p = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _1: Tuple() = @copy(x, p, shape(n))
        a = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _2: Tuple() = @copy(p, a, shape(n))
        b = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _3: Tuple() = @copy(x, b, shape(n))
        r = if c:
            b
        else:
            x
        e = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _4: Tuple() = @copy(x, e, shape(n))
        h = @helper(e)
        v = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _5: Tuple() = @copy(x, v, shape(n))
        w = vm_view(v, shape(4 * n))
        out = (a, r, h, w)
        return out

    @graph(pure=False)
    def helper(y: Tensor((k, 4), "float32")) -> Tensor((k, 4), "float32"):
        k = sym(lo=1, hi=8)
        return y
    """
    expected = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n, 4), "float32")):
        n = sym(lo=1, hi=8)
        static_arena = vm_alloc_storage(prim(128), label="main.static", static=True)
        p = vm_alloc_tensor_from_storage(static_arena, shape(n, 4), prim(0), dtype="float32")
        _1: Tuple() = @copy(x, p, shape(n))
        a = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _2: Tuple() = @copy(p, a, shape(n))
        b = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _3: Tuple() = @copy(x, b, shape(n))
        r = if c:
            b
        else:
            x
        e = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _4: Tuple() = @copy(x, e, shape(n))
        h = @helper(e)
        v = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _5: Tuple() = @copy(x, v, shape(n))
        w = vm_view(v, shape(4 * n))
        out = (a, r, h, w)
        return out

    @graph(pure=False)
    def helper(y: Tensor((k, 4), "float32")) -> Tensor((k, 4), "float32"):
        k = sym(lo=1, hi=8)
        return y
    """
    check(before, expected)


def test_a_size_bound_after_entry_is_not_planned() -> None:
    # k is bound by a match_cast, not by a parameter: f stays a plain allocation, g is planned
    before = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32"), z: Tensor(ndim=2, dtype="float32")):
        n = sym(lo=1)
        k = sym()
        y = match_cast(z, Tensor((k, 4), "float32"))
        f = vm_alloc_tensor(shape(k, 4), dtype="float32")
        _1: Tuple() = @copy(y, f, shape(k))
        g = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _2: Tuple() = @copy(x, g, shape(n))
        t = (f, g)
        o = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _3: Tuple() = @copy(g, o, shape(n))
        return o
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32"), z: Tensor(ndim=2, dtype="float32")):
        n = sym(lo=1)
        k = sym()
        pooled_arena = vm_alloc_storage(prim(64 * ((16 * n + 63) // 64)), label="main.pooled", static=False)
        y = match_cast(z, Tensor((k, 4), "float32"))
        f = vm_alloc_tensor(shape(k, 4), dtype="float32")
        _1: Tuple() = @copy(y, f, shape(k))
        g = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(0), dtype="float32")
        _2: Tuple() = @copy(x, g, shape(n))
        t = (f, g)
        o = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _3: Tuple() = @copy(g, o, shape(n))
        _free = vm_free_storage(pooled_arena)
        return o
    """
    check(before, expected)


def test_an_elementwise_kernel_writes_over_its_dying_input() -> None:
    # exp is one elementwise block and the last reader of a (and of b): b and then c take a's
    # bytes, so the chain needs one slot; the copies above needed two
    before = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        a = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _1: Tuple() = @exp(x, a, shape(n))
        b = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _2: Tuple() = @exp(a, b, shape(n))
        c = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _3: Tuple() = @exp(b, c, shape(n))
        d = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _4: Tuple() = @copy(c, d, shape(n))
        return d
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        pooled_arena = vm_alloc_storage(prim(64 * ((16 * n + 63) // 64)), label="main.pooled", static=False)
        a = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(0), dtype="float32")
        _1: Tuple() = @exp(x, a, shape(n))
        b = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(0), dtype="float32")
        _2: Tuple() = @exp(a, b, shape(n))
        c = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(0), dtype="float32")
        _3: Tuple() = @exp(b, c, shape(n))
        d = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _4: Tuple() = @copy(c, d, shape(n))
        _free = vm_free_storage(pooled_arena)
        return d
    """
    check(before, expected)


def test_no_writing_over_an_input_that_is_read_again() -> None:
    # a is read by the add after the exp that makes b: b needs its own slot; the add is the
    # last reader of a and b, so its output c takes a's place
    before = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        a = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _1: Tuple() = @exp(x, a, shape(n))
        b = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _2: Tuple() = @exp(a, b, shape(n))
        c = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _3: Tuple() = @add(a, b, c, shape(n))
        d = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _4: Tuple() = @copy(c, d, shape(n))
        return d
    """
    expected = """
    @graph(pure=False)
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        pooled_arena = vm_alloc_storage(prim(2 * 64 * ((16 * n + 63) // 64)), label="main.pooled", static=False)
        a = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(0), dtype="float32")
        _1: Tuple() = @exp(x, a, shape(n))
        b = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(64 * ((16 * n + 63) // 64)), dtype="float32")
        _2: Tuple() = @exp(a, b, shape(n))
        c = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(0), dtype="float32")
        _3: Tuple() = @add(a, b, c, shape(n))
        d = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _4: Tuple() = @copy(c, d, shape(n))
        _free = vm_free_storage(pooled_arena)
        return d
    """
    check(before, expected)


def test_temporaries_of_the_two_branches_of_an_if_share_a_slot() -> None:
    # a run takes one branch: u and w are never live together; the If's result r refers to
    # v or w and lives to the copy after the If
    before = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n, 4), "float32")):
        n = sym(lo=1, hi=4)
        r = if c:
            u = vm_alloc_tensor(shape(n, 4), dtype="float32")
            _1: Tuple() = @copy(x, u, shape(n))
            v = vm_alloc_tensor(shape(n, 4), dtype="float32")
            _2: Tuple() = @copy(u, v, shape(n))
            v
        else:
            w = vm_alloc_tensor(shape(n, 4), dtype="float32")
            _3: Tuple() = @copy(x, w, shape(n))
            w
        o = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _4: Tuple() = @copy(r, o, shape(n))
        return o
    """
    expected = """
    @graph(pure=False)
    def main(c: Prim("bool"), x: Tensor((n, 4), "float32")):
        n = sym(lo=1, hi=4)
        static_arena = vm_alloc_storage(prim(128), label="main.static", static=True)
        r = if c:
            u = vm_alloc_tensor_from_storage(static_arena, shape(n, 4), prim(0), dtype="float32")
            _1: Tuple() = @copy(x, u, shape(n))
            v = vm_alloc_tensor_from_storage(static_arena, shape(n, 4), prim(64), dtype="float32")
            _2: Tuple() = @copy(u, v, shape(n))
            v
        else:
            w = vm_alloc_tensor_from_storage(static_arena, shape(n, 4), prim(0), dtype="float32")
            _3: Tuple() = @copy(x, w, shape(n))
            w
        o = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _4: Tuple() = @copy(r, o, shape(n))
        return o
    """
    check(before, expected)


def test_a_recursive_function_gets_only_a_pooled_arena() -> None:
    # n is bounded, but activations of f may be live at once: no static arena they would share;
    # b may be returned (through the call and the If) and stays a plain allocation
    before = """
    @graph(pure=False)
    def f(c: Prim("bool"), x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
        n = sym(lo=1, hi=4)
        a = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _1: Tuple() = @copy(x, a, shape(n))
        b = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _2: Tuple() = @copy(a, b, shape(n))
        r = if c:
            s = @f(c, b)
            s
        else:
            b
        return r
    """
    expected = """
    @graph(pure=False)
    def f(c: Prim("bool"), x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
        n = sym(lo=1, hi=4)
        pooled_arena = vm_alloc_storage(prim(64 * ((16 * n + 63) // 64)), label="f.pooled", static=False)
        a = vm_alloc_tensor_from_storage(pooled_arena, shape(n, 4), prim(0), dtype="float32")
        _1: Tuple() = @copy(x, a, shape(n))
        b = vm_alloc_tensor(shape(n, 4), dtype="float32")
        _2: Tuple() = @copy(a, b, shape(n))
        r = if c:
            s = @f(c, b)
            s
        else:
            b
        _free = vm_free_storage(pooled_arena)
        return r
    """
    check(before, expected)


def test_nothing_to_plan_leaves_the_function_as_it_is() -> None:
    check_unchanged(
        P,
        dedent(
            """
            @graph(pure=False)
            def main(x: Tensor((n, 4), "float32")):
                n = sym(lo=1)
                d = vm_alloc_tensor(shape(n, 4), dtype="float32")
                _1: Tuple() = @copy(x, d, shape(n))
                return d
            """
        )
        + KERNELS,
    )

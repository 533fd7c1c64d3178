"""fold_constant: op calls and kernel calls on constants become constants, before and after
legalize; nothing symbolic, big, impure or effectful is folded."""

from __future__ import annotations

from textwrap import dedent

import numpy as np

from tests.transform.util import check_pass, check_unchanged, ir, same_numerics
from tilework.ir.graph import Constant, GraphFunc
from tilework.transform.dead_code_elimination import DeadCodeElimination
from tilework.transform.fold_constant import FoldConstant
from tilework.transform.legalize import Legalize
from tilework.transform.pipeline import Pipeline

P = FoldConstant()


def test_graph_level_ops_on_constants_fold_symbolic_ones_stay() -> None:
    before = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        with dataflow():
            a = add(const([1.0, 2.0, 3.0, 4.0], "float32"), const([1.0, 1.0, 1.0, 1.0], "float32"))
            b = multiply(a, a)
            c = reshape(b, shape(2, 2))
            d = sum(c, axis=(1,), keepdims=False)
            e = add(x, b)
            z = zeros(shape(n, 4), dtype="float32")
            gv = add(e, z)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        with dataflow():
            a = const([2.0, 3.0, 4.0, 5.0], "float32")
            b = const([4.0, 9.0, 16.0, 25.0], "float32")
            c = const([[4.0, 9.0], [16.0, 25.0]], "float32")
            d = const([13.0, 41.0], "float32")
            e = add(x, b)
            z = zeros(shape(n, 4), dtype="float32")
            gv = add(e, z)
            output(gv)
        return gv
    """
    check_pass(P, before, expected)


def test_tuples_items_and_creation_ops_fold() -> None:
    before = """
    @graph
    def main(x: Tensor((n, 2), "int32")):
        n = sym(lo=1)
        with dataflow():
            r = arange(start=0, end=4, step=1, dtype="int32")
            s = split(r, indices_or_sections=2, axis=0)
            s0 = s[0]
            s1 = s[1]
            c = concat((s1, s0), axis=0)
            t = take(c, const([3, 0], "int64"), axis=0)
            gv = add(x, t)
            output(gv)
        return gv
    """
    expected = """
    @graph
    def main(x: Tensor((n, 2), "int32")):
        n = sym(lo=1)
        with dataflow():
            r = const([0, 1, 2, 3], "int32")
            s = (const([0, 1], "int32"), const([2, 3], "int32"))
            s0 = const([0, 1], "int32")
            s1 = const([2, 3], "int32")
            c = const([2, 3, 0, 1], "int32")
            t = const([1, 2], "int32")
            gv = add(x, t)
            output(gv)
        return gv
    """
    check_pass(P, before, expected)


KERNEL = """
@tensor
def scale(A: Buffer((n,), "float32"), B: Buffer((n,), "float32"), k: int64):
    n = sym()
    k = sym()
    for i in range(n):
        B[i] = A[i] * cast(k, "float32")
"""


def test_call_tensor_on_constants_folds_with_static_sym_args() -> None:
    before = (
        dedent(
            """
    @graph
    def main(x: Tensor((m,), "float32")):
        m = sym()
        with dataflow():
            a = call_tensor(@scale, (const([1.0, 2.0, 3.0], "float32"),), shape(2), out=Tensor((3,), "float32"))
            b = call_tensor(@scale, (x,), shape(2), out=Tensor((m,), "float32"))
            c = call_tensor(@scale, (a,), shape(m), out=Tensor((3,), "float32"))
            gv = (a, b, c)
            output(gv)
        return gv
    """
        )
        + KERNEL
    )
    expected = (
        dedent(
            """
    @graph
    def main(x: Tensor((m,), "float32")):
        m = sym()
        with dataflow():
            a = const([2.0, 4.0, 6.0], "float32")
            b = call_tensor(@scale, (x,), shape(2), out=Tensor((m,), "float32"))
            c = call_tensor(@scale, (a,), shape(m), out=Tensor((3,), "float32"))
            gv = (a, b, c)
            output(gv)
        return gv
    """
        )
        + KERNEL
    )
    check_pass(P, before, expected)


def test_after_legalize_the_kernel_calls_fold_and_dce_removes_the_kernels() -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n, 4), "float32")):
            n = sym(lo=1)
            with dataflow():
                a = exp(const([0.0, 0.0, 0.0, 0.0], "float32"))
                b = add(a, const([1.0, 2.0, 3.0, 4.0], "float32"))
                gv = multiply(x, b)
                output(gv)
            return gv
        """
    )
    legalized = Legalize()(mod)
    assert len(list(legalized.tensor_funcs())) == 3
    expected = """
    @graph
    def main(x: Tensor((n, 4), "float32")):
        n = sym(lo=1)
        with dataflow():
            b = const([2.0, 3.0, 4.0, 5.0], "float32")
            gv = call_tensor(@multiply, (x, b), out=Tensor((n, 4), "float32"))
            output(gv)
        return gv

    @tensor
    def multiply(a: Buffer((n, 4), "float32"), b: Buffer((4,), "float32"), multiply: Buffer((n, 4), "float32")):
        n = sym(lo=1)
        i1 = sym(hi=3)
        vi1 = sym(hi=3)
        for i0 in range(n):
            for i1 in range(4):
                with block("multiply"):
                    vi0 = spatial(n, i0)
                    vi1 = spatial(4, i1)
                    reads(a, b)
                    writes(multiply)
                    multiply[vi0, vi1] = a[vi0, vi1] * b[vi1]
    """
    check_pass(Pipeline([P, DeadCodeElimination()]), legalized, expected)


def test_size_limits() -> None:
    big_output = """
    @graph
    def main():
        with dataflow():
            gv = square(const([1.0, 2.0, 3.0, 4.0], "float32"))
            output(gv)
        return gv
    """
    check_unchanged(FoldConstant(max_elements=3), big_output)
    check_pass(FoldConstant(max_elements=4), big_output, big_output.replace("square(const([1.0, 2.0, 3.0, 4.0]", "const([1.0, 4.0, 9.0, 16.0]").replace('"float32"))', '"float32")'))
    # the sum has one output element but its kernel's block runs 4 times: the work bound counts
    # its store and its init store each time (an upper bound: 8)
    much_work = """
    @graph
    def main():
        with dataflow():
            gv = sum(const([1.0, 2.0, 3.0, 4.0], "float32"), axis=None, keepdims=False)
            output(gv)
        return gv
    """
    check_unchanged(FoldConstant(max_work=7), much_work)
    out = FoldConstant(max_work=8)(ir(much_work))
    f = out["main"]
    assert isinstance(f, GraphFunc)
    value = f.body.blocks[0].bindings[0].value
    assert isinstance(value, Constant) and value.data.shape == () and float(value.data) == 10.0


def test_impure_calls_effects_and_unlegalizable_ops_stay() -> None:
    check_unchanged(
        P,
        """
        @graph(pure=False)
        def main():
            a = assert_dims(shape(2, 2), checks=(("eq", 0, 1, "2 must equal 2"),))
            b = call_packed(extern("tw.make"), (const([1.0], "float32"),), pure=False, out=Tensor((1,), "float32"))
            c = call_lib(extern("tw.twice"), (const([1.0], "float32"),), out=Tensor((1,), "float32"))
            return c
        """,
    )


def test_numerics_unchanged() -> None:
    mod = ir(
        """
        @graph
        def main(x: Tensor((n, 3), "float16")):
            n = sym(lo=1)
            with dataflow():
                w = divide(const([1.0, 2.0, 3.0], "float16"), const([3.0, 3.0, 7.0], "float16"))
                e = exp(w)
                s = sqrt(e)
                gv = multiply(x, s)
                output(gv)
            return gv
        """
    )
    folded = P(mod)
    main = folded["main"]
    assert isinstance(main, GraphFunc) and isinstance(main.body.blocks[0].bindings[2].value, Constant)
    x = np.random.default_rng(3).standard_normal((4, 3)).astype("float16")
    same_numerics(mod, [P], [x], rtol=2e-3)


def test_a_kernel_the_interpreter_refuses_is_left_to_run_time() -> None:
    # reads past the end of its input: folding must keep the call, not fail the compile
    check_unchanged(
        P,
        """
        @graph
        def main():
            with dataflow():
                gv = call_tensor(@shifted, (const([1.0, 2.0], "float32"),), out=Tensor((2,), "float32"))
                output(gv)
            return gv

        @tensor
        def shifted(A: Buffer((2,), "float32"), B: Buffer((2,), "float32")):
            for i in range(2):
                B[i] = A[i + 5]
        """,
    )

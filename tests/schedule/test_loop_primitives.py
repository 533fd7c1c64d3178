"""Loop primitives: each transforms correctly (numerics unchanged against NumPy at sizes
including 1 and odd ones; the result verifies and round-trips as text) and refuses what it
cannot do with a message that names the loop and the reason."""

from __future__ import annotations

import numpy as np
import pytest

from tests.schedule import kernels
from tests.schedule.helpers import check_kernel, well_formed
from tilework import te
from tilework.codegen.interp import run
from tilework.errors import ScheduleError
from tilework.ir import sym
from tilework.ir.loop import For, IfThenElse, TensorFunc
from tilework.schedule.primitives import (
    fuse,
    hoist_guards,
    loop_dependence,
    loop_names,
    merge_loops,
    parallel,
    partition,
    peel,
    reorder,
    serial,
    split,
    tile,
    unroll,
    vectorize,
)
from tilework.schedule.rules.common import top_nests
from tilework.schedule.tree import find_loop, walk


def _guards(func: TensorFunc) -> int:
    return sum(isinstance(s, IfThenElse) for _, s in walk(func.body))


# -- split ------------------------------------------------------------------------------------


def test_split_symbolic_extent_adds_guard() -> None:
    f = split(kernels.matmul(), "i", [None, 8])
    assert loop_names(f, "c") == ("i_0", "i_1", "j", "r")
    _, outer = find_loop(f, "i_0")
    assert sym.to_str(outer.extent) == "(M + 7) // 8"
    assert _guards(f) == 1
    check_kernel(f, "matmul")
    well_formed(f)


def test_split_divisible_extent_needs_no_guard() -> None:
    f = split(kernels.matmul(m=12), "i", [None, 4])
    assert _guards(f) == 0
    check_kernel(f, "matmul", [dict(n=12, m=5, k=3), dict(n=12, m=1, k=1)])


def test_split_three_ways_and_symbolic_factor() -> None:
    f = kernels.row_sum()
    g = split(f, "k", [2, None, 3])
    assert loop_names(g, "c") == ("i", "k_0", "k_1", "k_2")
    check_kernel(g, "row_sum")
    m = f.buffers[0].shape[1]
    h = split(f, "k", [None, m])  # a symbolic factor equal to the extent: one outer step
    assert _guards(h) == 0 and find_loop(h, "k_0")[1].extent == 1
    check_kernel(h, "row_sum")


@pytest.mark.parametrize(
    ("factors", "message"),
    [
        ([None, 0], "split: factor 0 of loop 'i' is not positive"),
        ([None, -2], "split: factor -2 of loop 'i' is not positive"),
        ([None, None], "at most one factor of loop 'i' may be None"),
        ([2, 3], "cover 6 iterations, fewer than its extent M"),
        ([8], "needs at least two factors"),
    ],
)
def test_split_refuses_bad_factors(factors: list, message: str) -> None:
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        split(kernels.matmul(), "i", factors)


def test_split_refuses_unknown_loop() -> None:
    with pytest.raises(ScheduleError, match=r"split: no loop 'q' in the function \(loops: i, j, r\)"):
        split(kernels.matmul(), "q", [None, 4])


# -- reorder, fuse, tile -------------------------------------------------------------------------


def test_reorder_moves_the_reduction_loop_out() -> None:
    f = reorder(kernels.matmul(), "r", "i")
    assert loop_names(f, "c") == ("r", "j", "i")
    check_kernel(f, "matmul")
    well_formed(f)


def test_reorder_refuses_loops_in_different_nests() -> None:
    f = kernels.softmax()
    with pytest.raises(ScheduleError, match="reorder: loops 'k1' and 'j' are not nested in one another"):
        reorder(f, "mx/k1", "e/j")


def test_reorder_refuses_a_carried_dependence() -> None:
    f = kernels.cumsum()
    with pytest.raises(ScheduleError, match=r"reorder: loop 'j' cannot move: block 'scan' reads 'out' at \[i, j - 1\]"):
        reorder(f, "j", "i")


def test_reorder_refuses_imperfect_nest() -> None:
    g = merge_loops(kernels.softmax(), "mx/i", "e/i")
    with pytest.raises(ScheduleError, match="not perfectly nested: the body of loop 'i' is not a single loop"):
        reorder(g, "e/j", "mx/i")


def _top_loop_names(f: TensorFunc) -> list[str]:
    return [t.var.name for t in top_nests(f)]


def test_fuse_then_numerics() -> None:
    f = fuse(kernels.add(), "i", "j")
    assert loop_names(f, "c") == ("i_j_fused",)
    check_kernel(f, "add")
    well_formed(f)


def test_fuse_refuses_non_adjacent_loops() -> None:
    with pytest.raises(ScheduleError, match="fuse: loops 'i' and 'r' are not adjacent"):
        fuse(kernels.matmul(), "i", "r")


def test_fuse_refuses_annotated_loops() -> None:
    f = parallel(kernels.add(), "i")
    with pytest.raises(ScheduleError, match="fuse: loop 'i' is parallel; fuse before annotating"):
        fuse(f, "i", "j")


def test_tile_splits_and_reorders() -> None:
    f = tile(kernels.matmul(), ["i", "j"], [4, 8])
    assert loop_names(f, "c") == ("i_0", "j_0", "i_1", "j_1", "r")
    check_kernel(f, "matmul")
    well_formed(f)


def test_tile_refuses_loops_not_nested() -> None:
    with pytest.raises(ScheduleError, match="tile: loops 'k1' and 'j' are not nested"):
        tile(kernels.softmax(), ["mx/k1", "e/j"], [4, 4])


# -- merge_loops ------------------------------------------------------------------------------------


def test_merge_loops_keeps_rows_together() -> None:
    f = kernels.softmax()
    g = merge_loops(f, "mx/i", "e/i", "s/i", "y/i")
    assert len(_top_loop_names(g)) == 1
    assert loop_names(g, "y") == ("i", "j")
    check_kernel(g, "softmax")
    well_formed(g)


def test_merge_loops_refuses_a_dependence_across_rows() -> None:
    n = sym.SymVar("n", 1)
    a = te.placeholder((n,), "float32", "a")
    t = te.compute((n,), lambda i: a[i] * 2.0, "t")
    c = te.compute((n,), lambda i: t[n - 1 - i], "c")  # reads the row written last
    f = te.create_func([a, c])
    with pytest.raises(ScheduleError, match=r"merge_loops: the merged loop 'i' would not be independent: block 'c' reads 't' at \[-i \+ n - 1\] while block 't' writes \[i\]"):
        merge_loops(f, "t/i", "c/i")


def test_merge_loops_refuses_reduction_loops() -> None:
    f = merge_loops(kernels.softmax(), "mx/i", "e/i")
    # merging the max's k1 loop with the exp's j loop would read the max while it is computed
    with pytest.raises(
        ScheduleError,
        match="merge_loops: the merged loop 'k1' would not be independent: block 'e' accesses 'mx' while the reduction",
    ):
        merge_loops(f, "mx/k1", "e/j")


def test_merge_loops_refuses_non_consecutive_loops() -> None:
    with pytest.raises(ScheduleError, match="merge_loops: loops .* are not consecutive"):
        merge_loops(kernels.softmax(), "mx/i", "s/i")


# -- parallel, vectorize, unroll ------------------------------------------------------------------


def test_parallel_vectorize_unroll_keep_numerics() -> None:
    f = split(kernels.matmul(), "j", [None, 4])
    f = reorder(f, "j_0", "r", "j_1")
    f = parallel(f, "i")
    f = vectorize(f, "j_1")
    _, loop = find_loop(f, "j_1")
    assert loop.kind == "vectorized"
    check_kernel(f, "matmul")
    well_formed(f)


def test_unroll_constant_extent() -> None:
    f = unroll(split(kernels.row_sum(), "k", [None, 4]), "k_1")
    assert find_loop(f, "k_1")[1].kind == "unrolled"
    check_kernel(f, "row_sum")


def test_parallel_refuses_reduction_loop() -> None:
    with pytest.raises(ScheduleError, match="parallel: loop 'r' is a reduction loop .*block 'c'.*rfactor it first"):
        parallel(kernels.matmul(), "r")


def test_vectorize_refuses_reduction_loop() -> None:
    with pytest.raises(ScheduleError, match="vectorize: loop 'k' is a reduction loop"):
        vectorize(kernels.row_sum(), "k")


def test_parallel_refuses_carried_dependence() -> None:
    with pytest.raises(ScheduleError, match="parallel: loop 'j' carries a dependence: block 'scan' reads 'out' at \\[i, j - 1\\]"):
        parallel(kernels.cumsum(), "j")


def test_parallel_allows_independent_rows_of_a_scan() -> None:
    f = parallel(kernels.cumsum(), "i")
    check_kernel(f, "cumsum")


def test_parallel_refuses_nested_parallel() -> None:
    f = parallel(kernels.add(), "i")
    with pytest.raises(ScheduleError, match="parallel: loop 'j' is inside parallel loop 'i'"):
        parallel(f, "j")


def test_vectorize_refuses_outer_loop() -> None:
    with pytest.raises(ScheduleError, match="vectorize: loop 'i' is not innermost"):
        vectorize(kernels.add(), "i")


def test_vectorize_takes_an_unrolled_constant_loop_inside() -> None:
    """Unroll-and-jam: the unrolled copies of an inner loop run in each lane."""
    f = reorder(split(kernels.add(), "i", [None, 3]), "i_0", "j", "i_1")
    with pytest.raises(ScheduleError, match="vectorize: loop 'j' is not innermost .*'i_1'"):
        vectorize(f, "j")
    g = vectorize(unroll(f, "i_1"), "j")
    assert find_loop(g, "j")[1].kind == "vectorized" and find_loop(g, "i_1")[1].kind == "unrolled"
    check_kernel(g, "add")


def test_unroll_refuses_symbolic_extent() -> None:
    with pytest.raises(ScheduleError, match="unroll: loop 'i' has symbolic extent n"):
        unroll(kernels.add(), "i")


def test_kind_change_needs_serial_first() -> None:
    f = vectorize(split(kernels.add(), "j", [None, 4]), "j_1")
    with pytest.raises(ScheduleError, match="unroll: loop 'j_1' is already vectorized"):
        unroll(f, "j_1")
    assert find_loop(unroll(serial(f, "j_1"), "j_1"), "j_1")[1].kind == "unrolled"


def test_loop_dependence_kinds() -> None:
    f = kernels.matmul()
    assert loop_dependence(f, "i").kind == "independent"
    assert loop_dependence(f, "r").kind == "reduction"
    assert loop_dependence(kernels.cumsum(), "j").kind == "carried"


# -- hoist_guards ---------------------------------------------------------------------------------


def test_hoist_guards_moves_invariant_conditions_out() -> None:
    f = reorder(split(kernels.add(), "i", [None, 4]), "i_0", "i_1", "j")
    g = hoist_guards(f)
    _, i1 = find_loop(g, "i_1")
    assert isinstance(i1.body, IfThenElse) and isinstance(i1.body.then_body, For)
    check_kernel(g, "add")
    well_formed(g)


def test_hoist_guards_turns_a_guard_on_the_loop_var_into_its_extent() -> None:
    """``for j in 32: if j < n: S`` runs ``for j in min(32, n): S`` (a vector loop whose lanes
    past ``n`` were masked); with ``n`` a constant below 32, ``for j in n``. The same values at
    ``n`` of 0, 1, odd, and past the extent."""
    import numpy as np

    from tilework.codegen import build_library
    from tilework.codegen.interp import run
    from tilework.ir.loop import Buffer, Load, Store, binary
    from tilework.ir.sym import SymVar
    from tilework.op.kernel import hand_kernel, serial_var

    n = SymVar("n", 0)
    for bound in (n, 16):
        src, dst = Buffer("src", (40,), "float32"), Buffer("dst", (40,), "float32")
        j = serial_var("j", 32)
        body = IfThenElse(binary("<", j, bound), Store(dst, (j,), binary("*", Load(src, (j,)), Load(src, (j,)))))
        params = [src, dst, n] if bound is n else [src, dst]
        f = hand_kernel(params, For(j, 32, body, "vectorized"), "elementwise")
        g = hoist_guards(f)
        assert isinstance(g.body, For) and _guards(g) == 0
        assert sym.to_str(g.body.extent) == ("min(32, n)" if bound is n else "16")
        lib = build_library({"f": f, "g": g})
        x = np.arange(40, dtype=np.float32) - 7
        for size in (0, 1, 5, 31, 40) if bound is n else (0,):
            outs = []
            for kern in ("f", "g"):
                out = np.full(40, -1.0, np.float32)
                lib[kern].run([x, out], {n: size} if bound is n else None)
                outs.append(out)
            ref = np.full(40, -1.0, np.float32)
            run(g, [x, ref], {n: size} if bound is n else None)
            np.testing.assert_array_equal(outs[0], outs[1])
            np.testing.assert_array_equal(outs[1], ref)
            k = min(32, size) if bound is n else 16
            np.testing.assert_array_equal(outs[1][:k], x[:k] * x[:k])
            assert (outs[1][k:] == -1).all()


# -- partition ----------------------------------------------------------------------------------


def test_partition_takes_the_bounds_test_out_of_full_tiles() -> None:
    f = reorder(split(kernels.matmul(), "i", [None, 4]), "i_0", "j", "r", "i_1")
    g = partition(f, "i_0")
    steady, rest = find_loop(g, "i_0")[1], find_loop(g, "i_0_rest")[1]
    assert sym.to_str(steady.extent) == "M // 4"
    assert _guards_in(steady) == 0 and _guards_in(rest) == 1
    check_kernel(g, "matmul")
    well_formed(g)  # the copy for the last tile has its own vars and block names


def _guards_in(loop: For) -> int:
    return sum(isinstance(s, IfThenElse) for _, s in walk(loop))


def test_partition_refuses_a_loop_without_bounds_tests() -> None:
    with pytest.raises(ScheduleError, match=r"partition: no guard of the form c \* i \+ e < n \(0 <= e < c\) under loop 'i'"):
        partition(kernels.matmul(), "i")


# -- peel -----------------------------------------------------------------------------------


def _static_add(rows: int, cols: int) -> TensorFunc:
    a, b = te.placeholder((rows, cols), "float32", "a"), te.placeholder((rows, cols), "float32", "b")
    return te.create_func([a, b, te.compute((rows, cols), lambda i, j: a[i, j] + b[i, j], "c")])


@pytest.mark.parametrize("cuts", [(2, 8), (1,), (9,), (3, 4, 5)])
def test_peel_runs_the_ranges_as_consecutive_loops(cuts: tuple[int, ...]) -> None:
    f = _static_add(5, 10)
    g, loops = peel(f, "j", cuts)
    points = [0, *cuts, 10]
    assert [find_loop(g, v)[1].extent for v in loops] == [b - a for a, b in zip(points, points[1:])]
    assert loops[0].name == "j" and len({v.name for v in loops}) == len(loops)
    well_formed(g)  # each copy has its own vars and block names
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 10)).astype(np.float32), rng.standard_normal((5, 10)).astype(np.float32)
    out = np.full((5, 10), np.nan, np.float32)
    run(g, [a, b, out])
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize(
    ("cuts", "message"),
    [((0, 4), r"peel: cuts \[0, 4\] of loop 'j' must increase strictly inside \(0, 10\)"),
     ((6, 4), r"peel: cuts \[6, 4\]"), ((10,), r"peel: cuts \[10\]")],
)
def test_peel_refuses_cuts_out_of_order_or_range(cuts: tuple[int, ...], message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        peel(_static_add(5, 10), "j", cuts)


def test_peel_refuses_a_symbolic_extent() -> None:
    with pytest.raises(ScheduleError, match="peel: loop 'j' has symbolic extent m"):
        peel(kernels.add(), "j", (2,))

"""Block primitives (compute_inline, reverse_compute_inline, cache_write, decompose_reduction,
rfactor): numerics unchanged at sizes including 1 and odd ones, well-formed results, and
refusals with messages naming the block and the reason."""

from __future__ import annotations

import pytest

from tests.schedule import kernels
from tests.schedule.helpers import check_kernel, well_formed
from tilework.errors import ScheduleError
from tilework.ir.loop import Allocate, Binary, Block, Buffer, Cast, Const, For, IterVar, Load, SeqStmt, Store, TensorFunc
from tilework.ir.sym import SymVar
from tilework.schedule.primitives import (
    branch,
    cache_read,
    cache_write,
    compute_inline,
    decompose_reduction,
    loop_names,
    parallel,
    reorder,
    reverse_compute_inline,
    rfactor,
    select,
    split,
    unroll,
    vectorize,
)
from tilework.schedule.tree import blocks_of, find_loop


def _names(f: TensorFunc) -> list[str]:
    return [b.name for b in blocks_of(f)]


# -- compute_inline ---------------------------------------------------------------------------------


def test_compute_inline_removes_the_producer_and_its_buffer() -> None:
    f = compute_inline(kernels.add_relu(), "t")
    assert _names(f) == ["c"]
    assert [b.name for b in blocks_of(f)[0].reads] == ["a", "b"]
    check_kernel(f, "add_relu")
    well_formed(f)


def test_compute_inline_into_several_consumers() -> None:
    f = compute_inline(kernels.softmax(), "e")  # exp feeds both the sum and the division
    assert _names(f) == ["mx", "s", "y"]
    check_kernel(f, "softmax")
    well_formed(f)


def test_compute_inline_refuses_a_reduction() -> None:
    with pytest.raises(ScheduleError, match="compute_inline: block 'mx' is a reduction"):
        compute_inline(kernels.softmax(), "mx")


def test_compute_inline_refuses_an_output_block() -> None:
    with pytest.raises(ScheduleError, match="compute_inline: block 'c' writes 'c', an output of the function"):
        compute_inline(kernels.add(), "c")


def test_compute_inline_refuses_several_stores() -> None:
    n = SymVar("n", 1)
    a, t, c = Buffer("a", (n,), "float32"), Buffer("t", (n,), "float32"), Buffer("c", (n,), "float32")
    i, vi, j, vj = SymVar("i"), SymVar("vi"), SymVar("j"), SymVar("vj")
    two = SeqStmt((Store(t, (vi,), Load(a, (vi,))), Store(t, (vi,), Const(1.0, "float32"))))
    p = Block("p", (IterVar(vi, n, "spatial", i),), (a,), (t,), two)
    q = Block("q", (IterVar(vj, n, "spatial", j),), (t,), (c,), Store(c, (vj,), Load(t, (vj,))))
    f = TensorFunc((a, c), Allocate(t, SeqStmt((For(i, n, p), For(j, n, q)))))
    with pytest.raises(ScheduleError, match="compute_inline: block 'p' must be exactly one store"):
        compute_inline(f, "p")


# -- reverse_compute_inline ---------------------------------------------------------------------


def test_reverse_compute_inline_into_the_producer() -> None:
    f = reverse_compute_inline(kernels.add_relu(), "c")
    assert _names(f) == ["t"]
    assert blocks_of(f)[0].writes[0].name == "c"
    check_kernel(f, "add_relu")
    well_formed(f)


def test_reverse_compute_inline_refuses_a_reduction_producer() -> None:
    # e = exp(x - mx): its producers are x (an input) and mx, a reduction
    with pytest.raises(ScheduleError, match="reverse_compute_inline: producer 'mx' of block 'e' is a reduction"):
        reverse_compute_inline(kernels.softmax(), "e")


def test_reverse_compute_inline_refuses_two_producers() -> None:
    with pytest.raises(ScheduleError, match="reverse_compute_inline: block 'y' has 2 producer blocks"):
        reverse_compute_inline(kernels.softmax(), "y")


# -- cache_write + decompose_reduction ------------------------------------------------------------


def _tiled_matmul() -> TensorFunc:
    f = split(kernels.matmul(), "i", [None, 4])
    f = split(f, "j", [None, 8])
    return reorder(f, "j_0", "i_0", "r", "i_1", "j_1")


def test_cache_write_accumulates_a_tile_locally() -> None:
    f = cache_write(_tiled_matmul(), "c", "i_0")
    assert _names(f) == ["c", "c_store"]
    assert blocks_of(f)[0].writes[0].shape == (4, 8)
    check_kernel(f, "matmul")
    well_formed(f)


def test_cache_write_decompose_and_annotate_the_micro_kernel() -> None:
    f = cache_write(_tiled_matmul(), "c", "i_0")
    f = decompose_reduction(f, "c", "r")
    assert _names(f) == ["c_init", "c", "c_store"]
    assert blocks_of(f)[1].init is None
    f = parallel(f, "j_0")
    f = vectorize(unroll(f, "i_1"), "j_1")
    check_kernel(f, "matmul")
    well_formed(f)


def test_cache_write_refuses_a_loop_inside_the_reduction() -> None:
    with pytest.raises(ScheduleError, match="cache_write: reduction loop 'r' of block 'c' is not inside loop 'r'"):
        cache_write(kernels.matmul(), "c", "r")


def test_cache_write_refuses_a_loop_around_another_block() -> None:
    with pytest.raises(ScheduleError, match="cache_write: loop 'j' does not enclose block 'mx'"):
        cache_write(kernels.softmax(), "mx", "e/j")


def test_decompose_reduction_alone() -> None:
    f = decompose_reduction(kernels.row_sum(), "c", "k")
    assert _names(f) == ["c_init", "c"]
    check_kernel(f, "row_sum")
    well_formed(f)


def test_decompose_reduction_refuses_a_reduction_loop_outside() -> None:
    f = reorder(kernels.matmul(), "r", "i")  # loops r, j, i
    with pytest.raises(ScheduleError, match="decompose_reduction: loop 'r' outside 'j' binds a reduction iter var of block 'c'"):
        decompose_reduction(f, "c", "j")


def test_decompose_reduction_refuses_an_elementwise_block() -> None:
    with pytest.raises(ScheduleError, match="decompose_reduction: block 'c' is not a reduction with an init"):
        decompose_reduction(kernels.add(), "c", "i")


# -- rfactor -------------------------------------------------------------------------------------------


def test_rfactor_vectorizes_partial_sums() -> None:
    f = split(kernels.row_sum(), "k", [None, 8])
    f = rfactor(f, "c", "k_1")
    assert _names(f) == ["c_rf_init", "c_rf", "c"]
    assert blocks_of(f)[0].writes[0].shape == (8,)
    f = vectorize(f, "k_1")
    f = parallel(f, "i")
    check_kernel(f, "row_sum")
    well_formed(f)


def test_rfactor_max_reduction_starts_from_minus_infinity() -> None:
    f = split(kernels.softmax(), "mx/k1", [None, 4])
    f = rfactor(f, "mx", "k1_1")
    init = blocks_of(f)[0]
    assert init.name == "mx_rf_init" and isinstance(init.body, Store)
    assert init.body.value.value == float("-inf")  # type: ignore[union-attr]
    check_kernel(f, "softmax")


def test_rfactor_on_the_whole_reduction_loop() -> None:
    f = rfactor(kernels.gemv_dot(), "y", "r")  # one partial per k: the write-back sums them
    assert loop_names(f, "y") == ("j", "r_wb")
    check_kernel(f, "gemv_dot")


def test_rfactor_refuses_a_spatial_loop() -> None:
    with pytest.raises(ScheduleError, match="rfactor: loop 'i' binds no reduction iter var of block 'c'"):
        rfactor(kernels.row_sum(), "c", "i")


def test_rfactor_refuses_a_non_reduction_block() -> None:
    with pytest.raises(ScheduleError, match="rfactor: block 'c' is not a reduction update"):
        rfactor(kernels.add(), "c", "j")


def test_rfactor_refuses_a_spatial_loop_inside_the_reduction() -> None:
    f = reorder(kernels.matmul(), "r", "j")  # loops i, r, j
    with pytest.raises(ScheduleError, match="rfactor: spatial loop 'j' is inside reduction loop 'r'"):
        rfactor(f, "c", "r")


def test_loop_found_after_rfactor() -> None:
    f = rfactor(split(kernels.row_sum(), "k", [None, 8]), "c", "k_1")
    assert find_loop(f, "k_1")[1].extent == 8


# -- cache_read ------------------------------------------------------------------------------------


def test_cache_read_transposes_an_input() -> None:
    f = kernels.linear()  # y_sum reads w[j, k]; after the copy it reads w_cache[k, j]
    g = cache_read(f, "y_sum", "w", (1, 0))
    assert _names(g) == ["w_cache", "y_sum", "y"]
    copy = blocks_of(g)[0].writes[0]
    assert [str(d) for d in copy.shape] == ["k", "m"]
    update = blocks_of(g)[1]
    assert copy in update.reads and not any(r.name == "w" for r in update.reads)
    check_kernel(g, "linear")
    well_formed(g)


def test_cache_read_refuses_bad_order() -> None:
    with pytest.raises(ScheduleError, match=r"cache_read: order \[0, 0\] is not a permutation of the 2 dims of 'w'"):
        cache_read(kernels.linear(), "y_sum", "w", (0, 0))


def test_cache_read_refuses_a_written_buffer() -> None:
    with pytest.raises(ScheduleError, match="cache_read: block 'c' writes 'c'; only a buffer nothing writes"):
        cache_read(kernels.matmul(), "c", "c")


def test_cache_read_refuses_a_buffer_not_read() -> None:
    with pytest.raises(ScheduleError, match="cache_read: block 'c' reads no buffer named 'x'"):
        cache_read(kernels.matmul(), "c", "x")


# -- branch ------------------------------------------------------------------------------------------


def test_branch_picks_a_schedule_at_run_time() -> None:
    f = kernels.matmul()
    m = f.buffers[0].shape[0]
    few = parallel(f, "j")
    many = vectorize(reorder(split(f, "i", [None, 4]), "i_0", "r", "j", "i_1"), "i_1")
    g = branch(Binary("<", m, 4, "bool"), few, many)
    check_kernel(g, "matmul", [dict(n=1, m=3, k=2), dict(n=3, m=5, k=4), dict(n=9, m=2, k=7)])
    well_formed(g)  # the else branch got fresh loop vars and buffers


def test_branch_refuses_different_functions() -> None:
    with pytest.raises(ScheduleError, match="branch: the two functions do not have the same params"):
        branch(Binary("<", 1, 2, "bool"), kernels.matmul(), kernels.matmul())


def test_branch_refuses_an_unknown_sym_var() -> None:
    f = kernels.matmul()
    with pytest.raises(ScheduleError, match=r"branch: the condition uses \['q'\], which no param supplies"):
        branch(Binary("<", SymVar("q"), 4, "bool"), f, f)


def test_compute_inline_refuses_a_value_that_uses_a_loop_var() -> None:
    n = SymVar("n", 1)
    a, t, c = Buffer("a", (n,), "float32"), Buffer("t", (n,), "float32"), Buffer("c", (n,), "float32")
    i, vi, j, vj = SymVar("i"), SymVar("vi"), SymVar("vj_"), SymVar("vj")
    value = Binary("+", Load(a, (vi,)), Cast("float32", i), "float32")  # i: the loop, not vi
    p = Block("p", (IterVar(vi, n, "spatial", i),), (a,), (t,), Store(t, (vi,), value))
    q = Block("q", (IterVar(vj, n, "spatial", j),), (t,), (c,), Store(c, (vj,), Load(t, (vj,))))
    f = TensorFunc((a, c), Allocate(t, SeqStmt((For(i, n, p), For(j, n, q)))))
    with pytest.raises(ScheduleError, match="compute_inline: block 'p' uses loop var 'i' directly"):
        compute_inline(f, "p")


def test_select_picks_one_of_several_schedules_at_run_time() -> None:
    f = kernels.matmul()
    m = f.buffers[0].shape[0]
    few = parallel(f, "j")
    four = vectorize(reorder(split(f, "i", [None, 4]), "i_0", "r", "j", "i_1"), "i_1")
    many = vectorize(reorder(split(f, "i", [None, 8]), "i_0", "r", "j", "i_1"), "i_1")
    g = select([(Binary("<", m, 4, "bool"), few), (Binary("<", m, 8, "bool"), four)], many)
    check_kernel(g, "matmul", [dict(n=1, m=3, k=2), dict(n=3, m=5, k=4), dict(n=9, m=2, k=7), dict(n=2, m=11, k=3)])
    well_formed(g)  # every body after the first got fresh loop vars and buffers
    with pytest.raises(ScheduleError, match="select: the functions do not have the same params"):
        select([(Binary("<", m, 4, "bool"), few), (Binary("<", m, 8, "bool"), kernels.matmul())], many)

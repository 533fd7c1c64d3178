"""The te DSL: the TensorFuncs it builds (blocks, loops, params) and the errors it gives."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tilework import te
from tilework.codegen import interp
from tilework.ir import sym
from tilework.ir.sym import SymVar
from tilework.ir.loop import (
    Allocate,
    Binary,
    Block,
    Buffer,
    Cast,
    Const,
    For,
    Load,
    Select,
    Store,
    TensorFunc,
    walk_stmts,
)


def _blocks(f: TensorFunc) -> list[Block]:
    return [s for s in walk_stmts(f.body) if isinstance(s, Block)]


def test_elementwise_is_one_block_in_a_loop_nest() -> None:
    n, m = tw.dim("n"), tw.dim("m")
    A = te.placeholder((n, m), "float32", "A")
    B = te.compute((n, m), lambda i, j: A[i, j] * 2, "B")
    f = te.create_func([A, B])
    assert [p.name for p in f.params] == ["A", "B"] and f.num_outputs == 1
    outer = f.body
    assert isinstance(outer, For) and outer.extent is n and outer.var.name == "i"
    inner = outer.body
    assert isinstance(inner, For) and inner.extent is m and inner.var.name == "j"
    (blk,) = _blocks(f)
    assert blk.name == "B" and blk.init is None and inner.body is blk
    assert [(iv.var.name, iv.kind, iv.binding) for iv in blk.iter_vars] == [("vi", "spatial", outer.var), ("vj", "spatial", inner.var)]
    assert blk.reads == (f.params[0],) and blk.writes == (f.params[1],)
    store = blk.body
    assert isinstance(store, Store) and store.indices == tuple(iv.var for iv in blk.iter_vars)
    assert isinstance(store.value, Binary) and isinstance(store.value.b, Const) and store.value.b.value == 2.0


def test_reduction_block_has_init_and_reduce_iter_var() -> None:
    n, K = tw.dim("n"), tw.dim("K")
    A = te.placeholder((n, K), "float32", "A")
    k = te.reduce_axis(K, "k")
    f = te.create_func([A, te.compute((n,), lambda i: te.max(A[i, k], axis=k), "M")])
    (blk,) = _blocks(f)
    assert [iv.kind for iv in blk.iter_vars] == ["spatial", "reduce"]
    assert isinstance(blk.init, Store) and blk.init.value.value == float("-inf")  # type: ignore[union-attr]
    out = f.params[1]
    assert isinstance(out, Buffer) and blk.reads == (out, f.params[0])
    assert isinstance(blk.body, Store) and isinstance(blk.body.value, Binary) and blk.body.value.op == "max"


def test_intermediate_stages_are_allocated_and_kept_separate() -> None:
    n = tw.dim("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] + 1, "B")
    C = te.compute((n,), lambda i: B[i] * B[i], "C")
    f = te.create_func([A, C])
    assert isinstance(f.body, Allocate) and f.body.buffer.name == "B"
    assert [b.name for b in _blocks(f)] == ["B", "C"]


def test_nested_reduction_is_lifted_into_its_own_stage() -> None:
    n, m = tw.dim("n"), tw.dim("m")
    A = te.placeholder((n, m), "float32", "A")
    k = te.reduce_axis(m, "k")
    f = te.create_func([A, te.compute((n,), lambda i: te.sum(A[i, k], axis=k) / m + 1, "mean")])
    blocks = _blocks(f)
    assert [b.name for b in blocks] == ["mean_sum", "mean"]
    assert blocks[0].init is not None and blocks[1].init is None
    assert isinstance(f.body, Allocate) and f.body.buffer.shape == (n,)


def test_each_block_gets_fresh_vars_even_for_a_shared_reduce_axis() -> None:
    n = tw.dim("n")
    A = te.placeholder((n, 4), "float32", "A")
    k = te.reduce_axis(4, "k")
    f = te.create_func([A, te.compute((n,), lambda i: te.sum(A[i, k], axis=k) + te.max(A[i, k], axis=k), "T")])
    vars_ = [iv.var for b in _blocks(f) for iv in b.iter_vars]
    assert len(set(vars_)) == len(vars_) and k not in vars_


def test_sym_params_are_vars_no_buffer_supplies_as_a_bare_dim() -> None:
    n, m, s = tw.dim("n"), tw.dim("m"), tw.dim("s")
    A = te.placeholder((n * 2,), "float32", "A")
    B = te.compute((n * 2,), lambda i: A[i] * te.cast(s, "float32") + m, "B")
    f = te.create_func([A, B])
    assert f.sym_params == (n, s, m)
    f2 = te.create_func([A, B], sym_params=[m, s, n])
    assert f2.sym_params == (m, s, n)
    with pytest.raises(ValueError, match="n are needed but not in sym_params"):
        te.create_func([A, B], sym_params=[m, s])


def test_outputs_argument_and_inputs_that_are_computed() -> None:
    n = tw.dim("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] + 1, "B")
    C = te.compute((n,), lambda i: B[i] * 2, "C")
    f = te.create_func([B], outputs=[C])  # B given: its stage is not part of f
    assert [b.name for b in _blocks(f)] == ["C"] and [p.name for p in f.params] == ["B", "C"]
    out = np.zeros(3, np.float32)
    interp.run(f, [np.arange(3, dtype=np.float32), out])
    np.testing.assert_array_equal(out, [0, 2, 4])


def test_data_dependent_index_is_a_load_index() -> None:
    n, v = tw.dim("n"), tw.dim("v")
    W = te.placeholder((v,), "float32", "W")
    idx = te.placeholder((n,), "int64", "idx")
    f = te.create_func([W, idx, te.compute((n,), lambda i: W[idx[i]], "T")])
    (blk,) = _blocks(f)
    assert isinstance(blk.body, Store) and isinstance(blk.body.value, Load)
    assert isinstance(blk.body.value.indices[0], Load)


def test_promotion_rules() -> None:
    n = tw.dim("n")
    F16 = te.placeholder((n,), "float16", "F16")
    F32 = te.placeholder((n,), "float32", "F32")
    I32 = te.placeholder((n,), "int32", "I32")
    U8 = te.placeholder((n,), "uint8", "U8")
    I8 = te.placeholder((n,), "int8", "I8")
    i = SymVar("i", 0)
    assert (F16[i] + F32[i]).dtype == "float32"
    assert (I32[i] * 0.5).dtype == "float32"
    assert (I32[i] * 2).dtype == "int32"
    assert (U8[i] + I8[i]).dtype == "int16"
    x = i + F32[i]  # an index value with an expression: cast to the expression's dtype
    assert isinstance(x, Binary) and isinstance(x.a, Cast) and x.a.dtype == "float32"
    assert (F32[i] > 0).dtype == "bool" and F32[i].eq(1).dtype == "bool"
    assert isinstance(te.if_then_else(F32[i] > 0, I32[i], 1.5), Select)
    assert te.if_then_else(F32[i] > 0, I32[i], 1.5).dtype == "float32"
    assert te.exp(i).dtype == "float32"
    assert sym.floordiv(i, 2) is i // 2  # pure index arithmetic stays symbolic


def test_errors_are_clear() -> None:
    n = tw.dim("n")
    A = te.placeholder((n, 3), "float32", "A")
    F = te.placeholder((n,), "float32", "F")
    I = te.placeholder((n,), "int32", "I")
    k = te.reduce_axis(3, "k")
    with pytest.raises(IndexError, match="rank 2, indexed with 1"):
        te.compute((n,), lambda i: A[i], "B")
    with pytest.raises(TypeError, match="must be an integer expression, got dtype float32"):
        te.compute((n,), lambda i: F[F[i]], "B")
    with pytest.raises(TypeError, match="needs a floating-point argument, got int32"):
        te.exp(I[0])
    with pytest.raises(TypeError, match="no truth value"):
        te.compute((n,), lambda i: F[i] if F[i] > 0 else 0.0, "B")
    with pytest.raises(TypeError, match="te.maximum"):
        te.max(F[0], F[1])
    with pytest.raises(TypeError, match="arithmetic"):
        te.compute((n,), lambda i: (F[i] > 0) + (F[i] < 1), "B")
    with pytest.raises(ValueError, match="placeholder F .*used by B.* is not among the inputs"):
        te.create_func([A, te.compute((n,), lambda i: F[i] + A[i, 0], "B")])
    with pytest.raises(ValueError, match="reduce axis k is used outside a reducer"):
        te.create_func([A, te.compute((n,), lambda i: A[i, k], "B")])
    with pytest.raises(ValueError, match="output A is a placeholder"):
        te.create_func([F], outputs=[A])
    with pytest.raises(TypeError, match="sum of bool"):
        te.sum(F[0] > 0, axis=k)


def test_rank0_and_multi_axis_reductions_run() -> None:
    n = tw.dim("n")
    A = te.placeholder((n, 3), "float32", "A")
    r, k = te.reduce_axis(n, "r"), te.reduce_axis(3, "k")
    total = te.compute((), lambda: te.sum(A[r, k], axis=[r, k]), "total")
    where = te.compute((), lambda: te.argmax(A[r, k], axis=(r, k)), "where")
    f = te.create_func([A], [total, where])
    a = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    out_t, out_w = np.zeros((), np.float32), np.zeros((), np.int64)
    interp.run(f, [a, out_t, out_w])
    assert out_t == pytest.approx(a.sum(), rel=1e-5) and out_w == a.argmax()

"""Struct info lattice: base checks, lca, erasure, substitution."""

from __future__ import annotations

from tilework.ir import info as I
from tilework.ir.info import AnyInfo, Check, FuncInfo, PrimInfo, ShapeInfo, TensorInfo, TupleInfo
from tilework.ir.sym import SymVar

n = SymVar("n", 1)
m = SymVar("m", 1)


def test_tensor_base_check_static_symbolic_unknown() -> None:
    assert I.base_check(TensorInfo((2, 3), "float32"), TensorInfo((2, 3), "float32")) is Check.PASS
    assert I.base_check(TensorInfo((2, 3), "float32"), TensorInfo((2, 4), "float32")) is Check.FAIL
    assert I.base_check(TensorInfo((2, 3), "float32"), TensorInfo((2, 3), "int32")) is Check.FAIL
    assert I.base_check(TensorInfo((n, 3), "float32"), TensorInfo((m, 3), "float32")) is Check.RUNTIME
    assert I.base_check(TensorInfo((n, 3), "float32"), TensorInfo((n, 3), "float32")) is Check.PASS
    assert I.base_check(TensorInfo((n + 1, 3), "float32"), TensorInfo((n, 3), "float32")) is Check.FAIL
    # erased facts are weaker
    assert I.base_check(TensorInfo(None, "float32", 2), TensorInfo((n, 3), "float32")) is Check.PASS
    assert I.base_check(TensorInfo((n, 3), "float32"), TensorInfo(None, "float32", 2)) is Check.RUNTIME
    assert I.base_check(TensorInfo((n, 3), "float32"), TensorInfo(None, None, -1)) is Check.RUNTIME
    assert I.base_check(TensorInfo((n, 3), "float32"), TensorInfo(None, "float32", 3)) is Check.FAIL
    assert I.base_check(TensorInfo(None, None, -1), TensorInfo((n, 3), "float32")) is Check.PASS
    assert I.base_check(AnyInfo(), TupleInfo(())) is Check.PASS
    assert I.base_check(TensorInfo((1,), "float32"), AnyInfo()) is Check.RUNTIME
    assert I.base_check(TensorInfo((1,), "float32"), ShapeInfo((1,))) is Check.FAIL
    assert I.is_base_of(TensorInfo(None, None), TensorInfo((n,), "int8"))
    assert not I.is_base_of(TensorInfo((n,), "int8"), TensorInfo(None, None))


def test_other_base_checks() -> None:
    assert I.base_check(ShapeInfo((n, 4)), ShapeInfo((n, 4))) is Check.PASS
    assert I.base_check(ShapeInfo(None, 2), ShapeInfo((n, 4))) is Check.PASS
    assert I.base_check(ShapeInfo((n, 4)), ShapeInfo((n, 5))) is Check.FAIL
    assert I.base_check(PrimInfo("int64", n), PrimInfo("int64", m)) is Check.RUNTIME
    assert I.base_check(PrimInfo("int64"), PrimInfo("int64", m)) is Check.PASS
    assert I.base_check(TupleInfo((AnyInfo(),)), TupleInfo((TensorInfo(),))) is Check.PASS
    assert I.base_check(TupleInfo((AnyInfo(),)), TupleInfo(())) is Check.FAIL
    f = FuncInfo((TensorInfo(None, "float32"),), TensorInfo(None, "float32"))
    g = FuncInfo((TensorInfo(None, None),), TensorInfo((n,), "float32"))
    assert I.base_check(f, g) is Check.PASS  # g accepts more and returns more precisely
    assert I.base_check(g, f) is Check.RUNTIME
    assert I.base_check(f, FuncInfo(f.params, f.ret, pure=False)) is Check.FAIL


def test_lca() -> None:
    a = TensorInfo((n, 4), "float32")
    assert I.lca(a, a) == a
    assert I.lca(a, TensorInfo((m, 4), "float32")) == TensorInfo(None, "float32", 2)
    assert I.lca(a, TensorInfo((n, 4), "float16")) == TensorInfo((n, 4), None)
    assert I.lca(a, TensorInfo((n,), "float32")) == TensorInfo(None, "float32", -1)
    assert I.lca(a, ShapeInfo((n,))) == AnyInfo()
    assert I.lca(TupleInfo((a,)), TupleInfo((a, a))) == AnyInfo()
    assert I.lca(PrimInfo("int64", n), PrimInfo("int64", n)) == PrimInfo("int64", n)
    assert I.lca(PrimInfo("int64", n), PrimInfo("int64", m)) == PrimInfo("int64", None)


def test_erase_substitute_free_vars() -> None:
    t = TupleInfo((TensorInfo((n, m * 2), "float32"), PrimInfo("int64", n + 1)))
    assert I.free_vars(t) == (n, m)
    assert I.defined_vars(t) == (n,)
    erased = I.erase(t, lambda v: v is n)
    assert erased == TupleInfo((TensorInfo(None, "float32", 2), PrimInfo("int64", n + 1)))
    k = SymVar("k")
    assert I.substitute(t, {n: k * 3}) == TupleInfo((TensorInfo((k * 3, m * 2), "float32"), PrimInfo("int64", k * 3 + 1)))
    assert I.substitute(TensorInfo((n, 4), "float32"), {n: 5}) == TensorInfo((5, 4), "float32")


def test_ndim_follows_shape() -> None:
    assert TensorInfo((1, 2, 3)).ndim == 3
    assert ShapeInfo((n,)).ndim == 1
    assert I.shape_str((n,)) == "(n,)"
    assert I.shape_str((n, m + 1)) == "(n, m + 1)"

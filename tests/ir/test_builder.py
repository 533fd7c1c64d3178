"""The normalizing BlockBuilder: ANF, inference at every emit, scopes, calls between functions."""

from __future__ import annotations

import numpy as np
import pytest

from tilework import op
from tilework.errors import InferenceError, ShapeError, WellFormedError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import (
    Call,
    Constant,
    DataflowBlock,
    DataflowVar,
    GlobalVar,
    MatchCast,
    PrimValue,
    Tuple,
    TupleGetItem,
    Var,
)
from tilework.ir.info import PrimInfo, TensorInfo, TupleInfo
from tilework.ir.sym import SymVar


def f32(*shape: object) -> TensorInfo:
    return TensorInfo(tuple(shape), "float32")  # type: ignore[arg-type]


def test_nested_calls_become_bindings() -> None:
    n = SymVar("n")
    x = Var("x", f32(n, 4))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.exp(op.add(x, op.multiply(x, x))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    f = bb.get()["main"]
    (block,) = f.body.blocks
    assert isinstance(block, DataflowBlock)
    kinds = [b.value.callee.name for b in block.bindings if isinstance(b.value, Call)]
    assert kinds == ["multiply", "add", "exp"]
    for b in block.bindings:
        assert b.var.info == f32(n, 4)
    assert isinstance(block.bindings[0].var, DataflowVar)
    assert not isinstance(block.bindings[-1].var, DataflowVar)
    assert f.ret_info == f32(n, 4)


def test_call_of_function_unifies_and_substitutes() -> None:
    n, m = SymVar("n"), SymVar("m")
    bb = BlockBuilder()
    x = Var("x", f32(n, 4))
    with bb.function("double_rows", [x]):
        y = bb.emit(op.add(x, x))
        bb.emit_func_output(y)
    gv = bb.global_var("double_rows")
    z = Var("z", f32(m + 1, 4))
    with bb.function("main", [z]):
        r = bb.emit(Call(gv, (z,)))
        bb.emit_func_output(r)
    assert bb.get()["main"].ret_info == f32(m + 1, 4)


def test_call_return_dims_are_substituted() -> None:
    n, m = SymVar("n"), SymVar("m")
    bb = BlockBuilder()
    x = Var("x", f32(n, 4))
    # a declared return info that is derived from the param dims
    with bb.function("f", [x]):
        bb.emit_func_output(x)
    f = bb.get()["f"]
    from tilework.ir.graph import GraphFunc
    from tilework.ir.info import FuncInfo

    assert isinstance(f, GraphFunc)
    finfo = FuncInfo((f32(n, 4),), f32(n * 2, 4))
    z = Var("z", f32(m + 1, 4))
    bb2 = BlockBuilder()
    with bb2.function("main", [z]):
        r = bb2.emit(Call(GlobalVar("f", finfo), (z,)))
        bb2.emit_func_output(r)
    assert r.info == f32((m + 1) * 2, 4)
    assert r.info == f32(m * 2 + 2, 4)


def test_call_with_provably_wrong_argument_is_an_error() -> None:
    n = SymVar("n")
    bb = BlockBuilder()
    x = Var("x", f32(n, 4))
    with bb.function("f", [x]):
        bb.emit_func_output(x)
    gv = bb.global_var("f")
    z = Var("z", f32(3, 5))
    with pytest.raises(ShapeError, match=r"@f: argument 0 has .*\(3, 5\).* expects .*\(3, 4\)"):
        with bb.function("main", [z]):
            bb.emit(Call(gv, (z,)))
    w = Var("w", f32(3))
    with pytest.raises(InferenceError, match="@f takes 1 argument"):
        with bb.function("main2", [w]):
            bb.emit(Call(gv, (w, w)))


def test_unbound_callee_vars_are_erased() -> None:
    n, k = SymVar("n"), SymVar("k")
    from tilework.ir.info import FuncInfo

    # the return mentions k, which no parameter binds: the caller cannot know it
    finfo = FuncInfo((f32(n),), f32(n, k))
    m = SymVar("m")
    z = Var("z", f32(m))
    bb = BlockBuilder()
    with bb.function("main", [z]):
        r = bb.emit(Call(GlobalVar("g", finfo), (z,)))
        bb.emit_func_output(r)
    assert r.info == TensorInfo(None, "float32", 2)


def test_match_cast_defines_sym_vars_and_return_is_erased() -> None:
    x = Var("x", TensorInfo(None, "float32", 2))
    n = SymVar("n")
    bb = BlockBuilder()
    with bb.function("main", [x]):
        y = bb.match_cast(x, f32(n, 8))
        z = bb.emit(op.add(y, y))
        assert n in bb.defined_sym_vars()
        bb.emit_func_output(z)
    f = bb.get()["main"]
    assert isinstance(f.body.blocks[0].bindings[0], MatchCast)
    assert z.info == f32(n, 8)
    # n is defined inside the body: the signature cannot mention it
    assert f.ret_info == TensorInfo(None, "float32", 2)


def test_match_cast_that_can_never_hold() -> None:
    x = Var("x", f32(2, 3))
    bb = BlockBuilder()
    with pytest.raises(ShapeError, match="can never succeed"):
        with bb.function("main", [x]):
            bb.match_cast(x, f32(4, 3))


def test_tuples_and_constants() -> None:
    x = Var("x", f32(2))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        c = Constant.of(np.ones((2,), np.float32))
        t = bb.emit(Tuple((op.add(x, c), x)))
        first = bb.emit(TupleGetItem(t, 0))
        bb.emit_func_output([first, t])
    assert t.info == TupleInfo((f32(2), f32(2)))
    assert first.info == f32(2)
    f = bb.get()["main"]
    assert f.ret_info == TupleInfo((f32(2), TupleInfo((f32(2), f32(2)))))
    with pytest.raises(InferenceError, match="out of range"):
        with bb.function("bad", [x]):
            t2 = bb.emit(Tuple((x,)))
            bb.emit(TupleGetItem(t2, 3))


def test_if_joins_branch_infos() -> None:
    n = SymVar("n")
    cond = Var("c", TensorInfo((), "bool"))
    x = Var("x", f32(n, 4))
    bb = BlockBuilder()
    with bb.function("main", [cond, x], pure=True):
        r = bb.emit_if(cond, lambda: op.exp(x), lambda: op.neg(x))
        bb.emit_func_output(r)
    assert r.info == f32(n, 4)

    y = Var("y", f32(n, 5))
    bb2 = BlockBuilder()
    with bb2.function("main", [cond, x, y]):
        r2 = bb2.emit_if(cond, lambda: op.exp(x), lambda: op.exp(y))
        bb2.emit_func_output(r2)
    assert r2.info == TensorInfo(None, "float32", 2)


def test_dataflow_rules() -> None:
    x = Var("x", f32(2))
    bb = BlockBuilder()
    with pytest.raises(WellFormedError, match="emit_output is only valid inside a dataflow block"):
        with bb.function("main", [x]):
            bb.emit_output(x)
    with pytest.raises(WellFormedError, match="inside a dataflow block"):
        with bb.function("main", [x]):
            with bb.dataflow():
                bb.emit_func_output(x)
    with pytest.raises(WellFormedError, match="impure call"):
        with bb.function("main", [x]):
            with bb.dataflow():
                bb.emit(op.call_packed("my_print", [x], TupleInfo(())))
    with pytest.raises(WellFormedError, match="cannot appear inside a dataflow block"):
        with bb.function("main", [x]):
            with bb.dataflow():
                bb.emit_if(x, lambda: x, lambda: x)
    with pytest.raises(WellFormedError, match="has no output"):
        with bb.function("main", [x]):
            pass


def test_impure_call_marks_function_impure() -> None:
    x = Var("x", f32(2))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        r = bb.emit(op.call_packed("my_log", [x], TensorInfo((2,), "float32")))
        bb.emit_func_output(r)
    assert bb.get()["main"].pure is False


def test_names_are_unique_and_user_names_kept() -> None:
    x = Var("x", f32(2))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        a = bb.emit(op.exp(x), name="h")
        b = bb.emit(op.exp(a), name="h")
        c = bb.emit(op.exp(b), name="x")
        bb.emit_func_output(c)
    assert (a.name, b.name, c.name) == ("h", "h1", "x1")


def test_prim_values_and_unknown_args() -> None:
    x = Var("x")  # no struct info known
    bb = BlockBuilder()
    with bb.function("main", [x]):
        y = bb.emit(op.exp(x))
        bb.emit_func_output(y)
    assert y.info == TensorInfo(None, None, -1)
    p = bb.normalize(PrimValue(3))
    assert p.info == PrimInfo("int64", 3)

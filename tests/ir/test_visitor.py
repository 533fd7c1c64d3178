"""The expression visitor and mutator: what they reach, in which order, and what a mutator
rebuilds (only the path to a change) and keeps (everything else, as the same objects)."""

from __future__ import annotations

import numpy as np
import pytest

from tilework import op
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import (
    Binding,
    Call,
    Constant,
    DataflowBlock,
    DataflowVar,
    GraphFunc,
    If,
    OpRef,
    SeqExpr,
    Tuple,
    TupleGetItem,
    Var,
    seq_used_vars,
)
from tilework.ir.info import AnyInfo, PrimInfo, TensorInfo
from tilework.ir.module import IRModule
from tilework.ir.structural import assert_structural_equal
from tilework.ir.sym import SymVar
from tilework.ir.verify import verify
from tilework.ir.visitor import ExprMutator, ExprVisitor, substitute


def _module() -> IRModule:
    """main(x, c):
        dataflow: lv = add(x, const); gv = exp(lv)
        w = match_cast(gv, (n, 4)); r = if c: (a = add(w, w); a) else w
        t = (r, x); i = t[0]; return i"""
    n = SymVar("n")
    x, c = Var("x", TensorInfo((n, 4), "float32")), Var("c", PrimInfo("bool"))
    bb = BlockBuilder()
    with bb.function("main", [x, c]):
        with bb.dataflow():
            lv = bb.emit(op.add(x, Constant.of(np.ones(4, "float32"))), name="lv")
            gv = bb.emit_output(op.exp(lv), name="gv")
        w = bb.match_cast(gv, TensorInfo((n, 4), "float32"), name="w")
        r = bb.emit_if(c, lambda: bb.emit(op.add(w, w), name="a"), lambda: w, name="r")
        t = bb.emit(Tuple((r, x)), name="t")
        bb.emit_func_output(bb.emit(TupleGetItem(t, 0), name="i"))
    return bb.get()


def _main(mod: IRModule) -> GraphFunc:
    f = mod["main"]
    assert isinstance(f, GraphFunc)
    return f


class _Recorder(ExprVisitor):
    def __init__(self) -> None:
        self.events: list[str] = []

    def visit_var(self, e: Var) -> None:
        self.events.append(e.name)

    def visit_var_def(self, v: Var) -> None:
        self.events.append("=" + v.name)

    def visit_constant(self, e: Constant) -> None:
        self.events.append("const")

    def visit_op_ref(self, e: OpRef) -> None:
        self.events.append(e.name)

    def visit_if(self, e: If) -> None:
        self.events.append("if")
        super().visit_if(e)


def test_visit_order_is_program_order_through_if_and_bindings() -> None:
    rec = _Recorder()
    rec.visit(_main(_module()).body)
    assert rec.events == [
        *("add", "x", "const", "=lv"),  # the dataflow block (lv is a DataflowVar: visit_var too)
        *("exp", "lv", "=gv"),
        *("gv", "=w"),  # the match_cast: its value, then its var
        *("if", "c", "add", "w", "w", "=a", "a", "w", "=r"),  # cond, then branch, else branch
        *("r", "x", "=t"),
        *("t", "=i"),
        "i",  # the SeqExpr's result last
    ]


def test_a_visitor_of_var_reads_alone_sees_every_read() -> None:
    class Reads(ExprVisitor):
        def __init__(self) -> None:
            self.names: list[str] = []

        def visit_var(self, e: Var) -> None:
            self.names.append(e.name)

    body = _main(_module()).body
    reads = Reads()
    reads.visit(body)
    assert reads.names == [v.name for v in seq_used_vars(body)]


def test_an_override_can_prune_and_anything_else_is_a_type_error() -> None:
    class NoBranches(_Recorder):
        def visit_if(self, e: If) -> None:
            self.events.append("if")  # no super(): the branches are not walked

    rec = NoBranches()
    rec.visit(_main(_module()).body)
    assert "a" not in rec.events and "if" in rec.events
    with pytest.raises(TypeError, match="not a graph expression"):
        ExprVisitor().visit(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a graph expression"):
        ExprMutator().mutate("x")  # type: ignore[arg-type]


class _Rename(ExprMutator):
    """Binds a new var in place of each var named in ``names``."""

    def __init__(self, *names: str) -> None:
        super().__init__()
        self.names = names

    def mutate_var_def(self, v: Var) -> Var:
        if v.name not in self.names:
            return v
        new = type(v)(v.name + "_new", v.info)
        self.var_map[v] = new
        return new


def test_mutator_that_changes_nothing_returns_the_same_object() -> None:
    body = _main(_module()).body
    assert ExprMutator().mutate(body) is body
    assert ExprMutator().mutate_seq_expr(body) is body


def test_renaming_rebuilds_only_what_reads_the_renamed_var() -> None:
    mod = _module()
    body = _main(mod).body
    new = _Rename("lv").mutate_seq_expr(body)
    df, rest = new.blocks[0], new.blocks[1:]
    assert isinstance(df, DataflowBlock)  # a block keeps its kind
    assert all(a is b for a, b in zip(rest, body.blocks[1:]))  # nothing there reads lv
    assert new.body is body.body
    (b_lv, b_gv), (old_lv, old_gv) = df.bindings, body.blocks[0].bindings
    assert isinstance(b_lv, Binding) and isinstance(b_gv, Binding) and isinstance(old_gv, Binding)
    assert isinstance(b_lv.var, DataflowVar) and b_lv.var.name == "lv_new"
    assert b_lv.value is old_lv.value  # the value of the renamed binding did not change
    assert b_gv.var is old_gv.var  # gv keeps its var; its value reads the new one
    assert isinstance(b_gv.value, Call) and isinstance(old_gv.value, Call) and b_gv.value.args == (b_lv.var,)
    assert b_gv.value.info is old_gv.value.info and b_gv.value.callee is old_gv.value.callee
    out = mod.with_func("main", _main(mod).replace(body=new))
    verify(out)
    assert_structural_equal(out, mod)


def test_renaming_a_var_read_in_a_branch_rebuilds_the_if_and_keeps_its_info() -> None:
    mod = _module()
    body = _main(mod).body
    new = _Rename("w").mutate_seq_expr(body)
    assert new.blocks[0] is body.blocks[0]
    old_if = next(b.value for b in body.blocks[1].bindings if isinstance(b.value, If))
    new_if = next(b.value for b in new.blocks[1].bindings if isinstance(b.value, If))
    assert new_if is not old_if and new_if.info is old_if.info and new_if.cond is old_if.cond
    assert isinstance(new_if.else_branch, SeqExpr) and isinstance(new_if.else_branch.body, Var)
    assert new_if.else_branch.body.name == "w_new"
    # the tuple and the item read r, t and x only: the same binding objects
    assert new.blocks[1].bindings[-2:] == body.blocks[1].bindings[-2:]
    assert all(a is b for a, b in zip(new.blocks[1].bindings[-2:], body.blocks[1].bindings[-2:]))
    out = mod.with_func("main", _main(mod).replace(body=new))
    verify(out)
    assert_structural_equal(out, mod)


def test_substitute_rebuilds_with_any_info_for_the_builder() -> None:
    x, y = Var("x", TensorInfo((4,), "float32")), Var("y", TensorInfo((4,), "float32"))
    call = Call(OpRef("exp"), (x,), info=TensorInfo((4,), "float32"))
    tup = Tuple((call, x))
    out = substitute(tup, {x: y})
    assert isinstance(out, Tuple) and isinstance(out.fields[0], Call)
    assert out.fields[0].args == (y,) and out.fields[1] is y
    assert isinstance(out.info, AnyInfo) and isinstance(out.fields[0].info, AnyInfo)
    assert substitute(tup, {}) is tup

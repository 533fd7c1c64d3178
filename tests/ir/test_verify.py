"""The well-formedness checker: modules built with the BlockBuilder verify cleanly; each rule
has a hand-built counterexample whose diagnostic names the rule, the function, the var and the
fix, and shows the offending binding."""

from __future__ import annotations

import numpy as np
import pytest

from tilework import op
from tilework.errors import WellFormedError
from tilework.ir import loop as L
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import (
    BindingBlock,
    Binding,
    Call,
    Constant,
    DataflowBlock,
    DataflowVar,
    Expr,
    ExternFunc,
    GlobalVar,
    GraphFunc,
    If,
    MatchCast,
    OpRef,
    PrimValue,
    SeqExpr,
    ShapeExpr,
    Tuple,
    TupleGetItem,
    Var,
)
from tilework.ir.info import AnyInfo, PrimInfo, ShapeInfo, StructInfo, TensorInfo, TupleInfo
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar
from tilework.ir.verify import RULES, Diagnostic, check, verify


def f32(*shape: object) -> TensorInfo:
    return TensorInfo(tuple(shape), "float32")  # type: ignore[arg-type]


def typed(c: Call) -> Call:
    """An op call (in A-normal form) with the struct info the builder would infer."""
    out = BlockBuilder().normalize(c)
    assert isinstance(out, Call)
    return out


def fn(params: list[Var], blocks: list[BindingBlock], result: Expr, ret: StructInfo | None = None, pure: bool = True) -> GraphFunc:
    info = result.info if ret is None else ret
    return GraphFunc(tuple(params), SeqExpr(tuple(blocks), result, info), info, pure=pure)


def plain(*bindings: Binding | MatchCast) -> BindingBlock:
    return BindingBlock(tuple(bindings))


def dataflow(*bindings: Binding | MatchCast) -> DataflowBlock:
    return DataflowBlock(tuple(bindings))


def only(mod: IRModule, rule: str) -> Diagnostic:
    """The single diagnostic of ``mod``; also checks that ``verify`` raises it."""
    diags = check(mod)
    assert [d.rule for d in diags] == [rule], "\n\n".join(str(d) for d in diags)
    with pytest.raises(WellFormedError, match="1 problem"):
        verify(mod)
    return diags[0]


def shows(d: Diagnostic, marked: str) -> None:
    """The context marks (with carets, the rule's title beside them) the line showing ``marked``."""
    lines = d.context.splitlines()
    carets = [i for i, line in enumerate(lines) if line.strip().startswith("^")]
    assert carets, d.context
    assert marked in lines[carets[0] - 1], d.context
    assert RULES[d.rule] in d.context, d.context


# -- well-formed modules built with the BlockBuilder --------------------------------------


def test_dataflow_module_verifies() -> None:
    n = SymVar("n", 1)
    x = Var("x", f32(n, 4))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.exp(op.add(x, op.multiply(x, x))))
            c = bb.emit(op.add(y, Constant.of(np.ones((4,), np.float32))))
            out = bb.emit_output(c)
        t = bb.emit(Tuple((out, ShapeExpr.of((n, 4)), PrimValue.of(n))))
        first = bb.emit(TupleGetItem(t, 0))
        bb.emit_func_output(first)
    mod = bb.get()
    assert check(mod) == []
    verify(mod)


def test_match_cast_defining_a_sym_var_verifies() -> None:
    x = Var("x", TensorInfo(None, "float32", 2))
    m, k = SymVar("m"), SymVar("k")
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.match_cast(x, f32(m, k))
            z = bb.emit(op.exp(y))
            w = bb.emit(op.add(z, z))
            out = bb.emit_output(w)
        s = bb.emit(ShapeExpr.of((m, k * 2)))
        bb.emit_func_output([out, s])
    mod = bb.get()
    assert check(mod) == []


def test_if_verifies() -> None:
    n = SymVar("n")
    c = Var("c", TensorInfo((), "bool"))
    x = Var("x", f32(n, 4))
    bb = BlockBuilder()

    def then() -> Expr:
        k = SymVar("k")
        y = bb.match_cast(x, f32(k, 4))  # k is local to the branch; the info is erased outside
        return op.exp(y)

    with bb.function("main", [c, x]):
        r = bb.emit_if(c, then, lambda: op.neg(x))
        bb.emit_func_output(r)
    assert check(bb.get()) == []


def test_calls_between_functions_verify() -> None:
    n, m = SymVar("n"), SymVar("m")
    bb = BlockBuilder()
    x = Var("x", f32(n, 4))
    with bb.function("double", [x]):
        bb.emit_func_output(bb.emit(op.add(x, x)))
    gv = bb.global_var("double")
    w, z = Var("w", f32(m)), Var("z", f32(m + 1, 4))  # w's bare dim defines m
    with bb.function("main", [w, z]):
        with bb.dataflow():
            r = bb.emit(Call(gv, (z,)))
            out = bb.emit_output(op.exp(r))
        bb.emit_func_output(out)
    assert check(bb.get()) == []


def add_kernel() -> L.TensorFunc:
    n = SymVar("n")
    a, b, c = (L.Buffer(name, (n, 4), "float32") for name in "ABC")
    i, j, vi, vj = SymVar("i"), SymVar("j"), SymVar("vi"), SymVar("vj")
    store = L.Store(c, (vi, vj), L.Binary("+", L.Load(a, (vi, vj)), L.Load(b, (vi, vj)), "float32"))
    blk = L.Block("C", (L.IterVar(vi, n, "spatial", i), L.IterVar(vj, 4, "spatial", j)), (a, b), (c,), store)
    return L.TensorFunc((a, b, c), L.For(i, n, L.For(j, 4, blk, "vectorized"), "parallel"))


def scaled_row_sum() -> L.TensorFunc:
    """S[i] = sum_k exp(A[i, k]) * s, through a scratch buffer T; s is a sym param."""
    n, s = SymVar("n"), SymVar("s")
    a, t, out = L.Buffer("A", (n, 4), "float32"), L.Buffer("T", (n, 4), "float32"), L.Buffer("S", (n,), "float32")
    i, k, i2, k2 = SymVar("i"), SymVar("k"), SymVar("i2"), SymVar("k2")
    vi, vk, wi, wk = SymVar("vi"), SymVar("vk"), SymVar("wi"), SymVar("wk")
    exp_blk = L.Block(
        "T", (L.IterVar(vi, n, "spatial", i), L.IterVar(vk, 4, "spatial", k)), (a,), (t,),
        L.Store(t, (vi, vk), L.Intrin("exp", (L.Load(a, (vi, vk)),), "float32")),
    )  # fmt: skip
    scale = L.Cast("float32", s)
    sum_blk = L.Block(
        "S", (L.IterVar(wi, n, "spatial", i2), L.IterVar(wk, 4, "reduce", k2)), (t,), (out,),
        L.Store(out, (wi,), L.Binary("+", L.Load(out, (wi,)), L.Binary("*", L.Load(t, (wi, wk)), scale, "float32"), "float32")),
        init=L.Store(out, (wi,), L.Const(0.0, "float32")),
    )  # fmt: skip
    body = L.Allocate(
        t, L.SeqStmt((L.For(i, n, L.For(k, 4, exp_blk)), L.For(i2, n, L.For(k2, 4, sum_blk, "unrolled"))))
    )
    return L.TensorFunc((a, out, s), body)


def test_call_tensor_to_hand_written_kernels_verifies() -> None:
    n = SymVar("n")
    x = Var("x", f32(n, 4))
    bb = BlockBuilder()
    add = bb.add_func("add", add_kernel())
    rsum = bb.add_func("rsum", scaled_row_sum())
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.call_tensor(add, [x, x], f32(n, 4)))
            z = bb.emit(op.call_tensor(rsum, [y], f32(n), sym_args=[n * 2]))
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    assert check(bb.get()) == []


def test_library_calls_verify() -> None:
    x = Var("x", f32(2, 3))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.call_lib("blas.gemm", [x, x], f32(2, 3)))
            z = bb.emit(op.call_packed("pure_fn", [y], f32(2, 3), pure=True))
            out = bb.emit_output(z)
        log = bb.emit(op.call_packed("log", [out], TupleInfo(())))
        bb.emit_func_output([out, log])
    mod = bb.get()
    assert mod["main"].pure is False  # type: ignore[union-attr]
    assert check(mod) == []


# -- rule 1: vars --------------------------------------------------------------------------


def test_var_used_before_its_definition() -> None:
    x = Var("x", f32(4))
    a, b = Var("a", f32(4)), Var("b", f32(4))
    f = fn([x], [plain(Binding(a, typed(op.exp(b))), Binding(b, typed(op.exp(x))))], a)
    d = only(IRModule({"main": f}), "var-def")
    assert d.func == "main"
    assert "%b is used in the value of %a before its definition: move the binding of %b before this use" in d.message
    shows(d, "a: Tensor")
    assert "rule 1" in d.context


def test_var_never_defined() -> None:
    x, ghost, a = Var("x", f32(4)), Var("ghost", f32(4)), Var("a", f32(4))
    f = fn([x], [plain(Binding(a, typed(op.add(x, ghost))))], a)
    d = only(IRModule({"main": f}), "var-def")
    assert "%ghost is used in the value of %a" in d.message
    assert "never defined: make it a param or bind it before this use" in d.message


def test_var_defined_twice() -> None:
    x = Var("x", f32(4))
    f = fn([x], [plain(Binding(x, typed(op.exp(x))))], x)
    d = only(IRModule({"main": f}), "var-def")
    assert "%x is defined twice (first as a param of @main)" in d.message
    assert "bind a new Var here" in d.message
    shows(d, "x: Tensor")


def test_var_of_another_function() -> None:
    x, y = Var("x", f32(4)), Var("y", f32(4))
    a, b = Var("a", f32(4)), Var("b", f32(4))
    f = fn([x], [plain(Binding(a, typed(op.exp(x))))], a)
    g = fn([y], [plain(Binding(b, typed(op.add(y, a))))], b)
    d = only(IRModule({"f": f, "g": g}), "var-def")
    assert d.func == "g"
    assert "%a is used in the value of %b but it belongs to @f" in d.message
    assert "pass the value as an argument" in d.message


def test_param_shared_by_two_functions() -> None:
    x = Var("x", f32(4))
    d = only(IRModule({"f": fn([x], [], x), "g": fn([x], [], x)}), "var-def")
    assert d.func == "g"
    assert "%x is defined twice (first as a param of @f)" in d.message


def test_var_of_an_if_branch_used_after_the_if() -> None:
    c, x = Var("c", TensorInfo((), "bool")), Var("x", f32(4))
    inner, r, after = Var("inner", f32(4)), Var("r", f32(4)), Var("after", f32(4))
    then = SeqExpr((plain(Binding(inner, typed(op.exp(x)))),), inner, f32(4))
    other = SeqExpr((), x, f32(4))
    f = fn([c, x], [plain(Binding(r, If(c, then, other, f32(4))), Binding(after, typed(op.add(r, inner))))], after)
    d = only(IRModule({"main": f}), "var-def")
    assert "%inner is used in the value of %after but it is defined inside an If branch" in d.message


# -- rule 2: sym vars ------------------------------------------------------------------------


def test_sym_var_never_defined() -> None:
    n, m = SymVar("n"), SymVar("m")
    x = Var("x", f32(m, 4))
    lv1 = Var("lv1", f32(n, 4))
    mc = MatchCast(Var("y", f32(m, 4)), x, f32(m, 4))
    f = fn([x], [plain(mc, Binding(lv1, Call(OpRef("exp"), (mc.var,), info=f32(n, 4))))], lv1, ret=f32(m, 4))
    diags = check(IRModule({"main": f}))
    sym_diags = [d for d in diags if d.rule == "sym-def"]
    assert len(sym_diags) == 1, "\n".join(map(str, diags))
    d = sym_diags[0]
    assert "sym var n is used in the value of %lv1 but never defined" in d.message
    assert "add a param whose shape has n as a dim, or a match_cast that binds it" in d.message
    shows(d, "lv1: Tensor")


def test_sym_var_in_var_info_never_defined() -> None:
    n, m = SymVar("n"), SymVar("m")
    x = Var("x", f32(m, 4))
    lv1 = Var("lv1", TensorInfo((n, 4), None))
    f = fn([x], [plain(Binding(lv1, typed(op.exp(x))))], x)
    d = [d for d in check(IRModule({"main": f})) if d.rule == "sym-def"][0]
    assert d.message.startswith("sym var n is used in %lv1's struct info but never defined: add a param")


def test_sym_var_used_before_its_match_cast() -> None:
    x = Var("x", TensorInfo(None, "float32", 1))
    k = SymVar("k")
    s, y = Var("s", ShapeInfo((k,))), Var("y", f32(k))
    f = fn([x], [plain(Binding(s, ShapeExpr.of((k,))), MatchCast(y, x, f32(k)))], y, ret=TensorInfo(None, "float32", 1))
    d = only(IRModule({"main": f}), "sym-def")
    assert "sym var k is used in the value of %s before the match_cast of %y defines it" in d.message
    assert "move that match_cast before this use" in d.message


def test_param_needs_a_bare_dim() -> None:
    n = SymVar("n")
    x = Var("x", f32(n * 2))
    f = fn([x], [], x)
    diags = check(IRModule({"main": f}))
    assert diags and diags[0].rule == "sym-def"
    assert "sym var n is used in param %x's struct info but never defined" in diags[0].message


def test_return_info_mentions_a_body_sym_var() -> None:
    x = Var("x", TensorInfo(None, "float32", 1))
    k = SymVar("k")
    y = Var("y", f32(k))
    f = fn([x], [plain(MatchCast(y, x, f32(k)))], y)  # ret = (k,) but k is defined in the body
    diags = check(IRModule({"main": f}))
    rules = {d.rule for d in diags}
    assert rules == {"sym-def"}, "\n".join(map(str, diags))
    text = "\n".join(d.message for d in diags)
    assert "sym var k is used in the return info, but no param defines it: the return info may mention only sym vars" in text
    assert "the struct info of the function body mentions sym var k, which is defined only inside it" in text


def test_if_branch_info_mentions_a_branch_sym_var() -> None:
    c, x = Var("c", TensorInfo((), "bool")), Var("x", TensorInfo(None, "float32", 1))
    k = SymVar("k")
    y, r = Var("y", f32(k)), Var("r", TensorInfo(None, "float32", 1))
    then = SeqExpr((plain(MatchCast(y, x, f32(k))),), y, f32(k))  # should be erased to ndim=1
    other = SeqExpr((), x, x.info)
    f = fn([c, x], [plain(Binding(r, If(c, then, other, r.info)))], r)
    d = only(IRModule({"main": f}), "sym-def")
    assert "the struct info of the If's then branch mentions sym var k, which is defined only inside it" in d.message
    assert "erase it" in d.message
    shows(d, "r: Tensor")


def test_call_tensor_sym_arg_undefined() -> None:
    n, q = SymVar("n"), SymVar("q")
    x = Var("x", f32(n, 4))
    kernel = scaled_row_sum()
    bb = BlockBuilder()
    gv = bb.add_func("rsum", kernel)
    y = Var("y", f32(n))
    call = op.call_tensor(gv, [x], f32(n), sym_args=[q])
    norm = Call(call.callee, (gv, Tuple((x,), TupleInfo((x.info,))), ShapeExpr.of((q,))), call.attrs, call.sinfo_args, f32(n))
    f = fn([x], [plain(Binding(y, norm))], y)
    d = only(IRModule({"rsum": kernel, "main": f}), "sym-def")
    assert "sym var q is used in the value of %y but never defined" in d.message


# -- rule 3: dataflow vars -----------------------------------------------------------------


def test_dataflow_var_escapes_its_block() -> None:
    x = Var("x", f32(4))
    lv0, gv = DataflowVar("lv0", f32(4)), Var("gv", f32(4))
    f = fn([x], [dataflow(Binding(lv0, typed(op.exp(x)))), plain(Binding(gv, typed(op.add(lv0, x))))], gv)
    d = only(IRModule({"main": f}), "dataflow")
    assert "%lv0 is used in the value of %gv but it is a DataflowVar of an earlier dataflow block" in d.message
    assert "emit_output" in d.message
    shows(d, "gv: Tensor")


def test_dataflow_var_as_function_result() -> None:
    x = Var("x", f32(4))
    lv0 = DataflowVar("lv0", f32(4))
    f = fn([x], [dataflow(Binding(lv0, typed(op.exp(x))))], lv0)
    d = only(IRModule({"main": f}), "dataflow")
    assert "%lv0 is used in the function's result" in d.message


def test_dataflow_var_outside_dataflow_block_and_as_param() -> None:
    x = DataflowVar("x", f32(4))
    lv0 = DataflowVar("lv0", f32(4))
    f = fn([x], [plain(Binding(lv0, typed(op.exp(x))))], x)
    diags = check(IRModule({"main": f}))
    assert [d.rule for d in diags] == ["dataflow", "dataflow"]
    assert "param %x is a DataflowVar: params must be plain Vars" in diags[0].message
    assert "%lv0 is a DataflowVar bound outside a dataflow block: bind a plain Var" in diags[1].message


# -- rule 4: A-normal form ------------------------------------------------------------------


def test_nested_call_is_not_anf() -> None:
    x, a = Var("x", f32(4)), Var("a", f32(4))
    inner = typed(op.exp(x))
    f = fn([x], [plain(Binding(a, Call(OpRef("add"), (inner, x), info=f32(4))))], a)
    d = only(IRModule({"main": f}), "anf")
    assert "argument 0 of add in the value of %a is a Call, not a leaf: bind it to a var first" in d.message
    shows(d, "a: Tensor")


def test_if_inside_dataflow_block() -> None:
    c, x, r = Var("c", TensorInfo((), "bool")), Var("x", f32(4)), Var("r", f32(4))
    branch = SeqExpr((), x, f32(4))
    f = fn([c, x], [dataflow(Binding(r, If(c, branch, SeqExpr((), x, f32(4)), f32(4))))], r)
    d = only(IRModule({"main": f}), "anf")
    assert "an If inside a dataflow block: control flow belongs in a plain binding block" in d.message


def test_if_condition_and_branches() -> None:
    c, x, r = Var("c", f32(4)), Var("x", f32(4)), Var("r", f32(4))
    cond = typed(op.less(c, x))
    bad = If(cond, SeqExpr((), x, f32(4)), x, f32(4))  # type: ignore[arg-type]
    f = fn([c, x], [plain(Binding(r, bad))], r)
    msgs = [d.message for d in check(IRModule({"main": f})) if d.rule == "anf"]
    assert any("the If's condition in the value of %r is a Call, not a leaf" in m for m in msgs), msgs
    assert any("the If's else branch is a Var, not a SeqExpr" in m for m in msgs), msgs


def test_tuple_fields_getitem_and_result_must_be_leaves() -> None:
    x, t, g = Var("x", f32(4)), Var("t", TupleInfo((f32(4),))), Var("g", f32(4))
    tup = Tuple((typed(op.exp(x)),), TupleInfo((f32(4),)))
    get = TupleGetItem(Tuple((x,), TupleInfo((f32(4),))), 0, f32(4))  # a tuple of leaves is a leaf
    result = typed(op.exp(g))
    f = fn([x], [plain(Binding(t, tup), Binding(g, get))], result)
    msgs = [d.message for d in check(IRModule({"main": f})) if d.rule == "anf"]
    assert len(msgs) == 2, msgs
    assert "tuple field 0 in the value of %t is a Call, not a leaf" in msgs[0]
    assert "the result of the function body is a Call, not a leaf" in msgs[1]


def test_seq_expr_as_binding_value() -> None:
    x, a = Var("x", f32(4)), Var("a", f32(4))
    f = fn([x], [plain(Binding(a, SeqExpr((), x, f32(4))))], a)
    d = only(IRModule({"main": f}), "anf")
    assert "%a is bound to a SeqExpr: only function bodies and If branches are SeqExprs" in d.message


# -- rule 5: purity -------------------------------------------------------------------------


def test_impure_call_in_dataflow_block() -> None:
    x, lv = Var("x", f32(4)), DataflowVar("lv", TupleInfo(()))
    log = typed(op.call_packed("log", [x], TupleInfo(())))
    f = fn([x], [dataflow(Binding(lv, log))], x, pure=False)
    d = only(IRModule({"main": f}), "purity")
    assert "impure call call_packed(extern('log')) inside a dataflow block: move it to a plain binding block" in d.message
    shows(d, "lv: Tuple")


def test_pure_function_with_impure_call() -> None:
    x, v = Var("x", f32(4)), Var("v", f32(4))
    f = fn([x], [plain(Binding(v, typed(op.call_packed("log", [x], f32(4)))))], v, pure=True)
    d = only(IRModule({"main": f}), "purity")
    assert "@main is marked pure but calls impure call_packed(extern('log')): build it with pure=False" in d.message


# -- rule 6: struct info -------------------------------------------------------------------


def test_call_without_struct_info() -> None:
    n = SymVar("n")
    x, a = Var("x", f32(n, 4)), Var("a", f32(n, 4))
    f = fn([x], [plain(Binding(a, op.add(x, x)))], a)  # op.add builds an un-normalized call
    d = only(IRModule({"main": f}), "struct-info")
    assert "the call of add in the value of %a has no struct info (the builder gives Tensor((n, 4), \"float32\"))" in d.message


def test_call_with_inconsistent_struct_info() -> None:
    x, a = Var("x", f32(2, 4)), Var("a", f32(2, 5))
    f = fn([x], [plain(Binding(a, Call(OpRef("add"), (x, x), info=f32(2, 5))))], a)
    d = only(IRModule({"main": f}), "struct-info")
    assert "has struct info Tensor((2, 5), \"float32\"), but its parts give Tensor((2, 4), \"float32\")" in d.message


def test_call_that_does_not_type_check() -> None:
    x, y, a = Var("x", f32(2, 4)), Var("y", f32(3, 4)), Var("a", f32(2, 4))
    f = fn([x, y], [plain(Binding(a, Call(OpRef("add"), (x, y), info=f32(2, 4))))], a)
    d = only(IRModule({"main": f}), "struct-info")
    assert "the call of add in the value of %a does not type-check" in d.message
    assert "do not broadcast" in d.message


def test_constant_shape_and_prim_infos() -> None:
    x = Var("x", f32(2))
    c = Constant(np.zeros((3,), np.float32), f32(2))
    a, s, p = Var("a", f32(2)), Var("s", ShapeInfo((2,))), Var("p", PrimInfo("int64", 3))
    f = fn(
        [x],
        [plain(Binding(a, typed(op.add(x, c))), Binding(s, ShapeExpr((2,))), Binding(p, PrimValue(4, PrimInfo("int64", 3))))],
        x,
    )
    diags = check(IRModule({"main": f}))
    assert [d.rule for d in diags] == ["struct-info"] * 3, "\n".join(map(str, diags))
    assert "a constant in the value of %a has struct info Tensor((2,), \"float32\") but its data is Tensor((3,), \"float32\")" in diags[0].message
    assert "shape(2) in the value of %s has struct info Any: a ShapeExpr's info is ShapeInfo of its values" in diags[1].message
    assert "the prim value 4 in the value of %p has struct info Prim(\"int64\", value=3)" in diags[2].message


def test_tuple_and_getitem_infos() -> None:
    x = Var("x", f32(2))
    t, g = Var("t", TupleInfo((f32(2), f32(2)))), Var("g", f32(2))
    tup = Tuple((x, x), TupleInfo((f32(2), f32(3))))
    f = fn([x], [plain(Binding(t, tup), Binding(g, TupleGetItem(t, 5, f32(2))))], g)
    diags = check(IRModule({"main": f}))
    msgs = [d.message for d in diags if d.rule == "struct-info"]
    want = 'a tuple of 2 in the value of %t has struct info Tuple(Tensor((2,), "float32"), Tensor((3,), "float32")), but its parts'
    assert any(want in m for m in msgs), msgs
    assert any("the value of %g takes item 5 of a tuple of 2" in m for m in msgs), msgs


def test_binding_var_info_must_be_a_base_of_the_value() -> None:
    n = SymVar("n")
    x = Var("x", f32(n, 4))
    a = Var("a", f32(3, 4))  # narrower than the value: needs a match_cast
    f = fn([x], [plain(Binding(a, typed(op.exp(x))))], a)
    d = only(IRModule({"main": f}), "struct-info")
    assert "%a is declared Tensor((3, 4), \"float32\") but its value has Tensor((n, 4), \"float32\")" in d.message
    assert "use match_cast to assert a narrower info" in d.message


def test_match_cast_that_can_never_succeed() -> None:
    x, y = Var("x", f32(2, 3)), Var("y", f32(4, 3))
    f = fn([x], [plain(MatchCast(y, x, f32(4, 3)))], y)
    d = only(IRModule({"main": f}), "struct-info")
    assert "the match_cast of %y can never succeed: the value has Tensor((2, 3), \"float32\")" in d.message
    shows(d, "match_cast")


def test_var_without_struct_info() -> None:
    x, a = Var("x", f32(4)), Var("a")
    f = fn([x], [plain(Binding(a, typed(op.exp(x))))], a, ret=AnyInfo())
    d = only(IRModule({"main": f}), "struct-info")
    assert "%a has no struct info but its value has Tensor((4,), \"float32\")" in d.message


def test_if_and_branch_without_struct_info() -> None:
    c, x, r = Var("c", TensorInfo((), "bool")), Var("x", f32(4)), Var("r", AnyInfo())
    typed_branch = SeqExpr((), x, f32(4))
    f = fn([c, x], [plain(Binding(r, If(c, SeqExpr((), x), typed_branch, AnyInfo())))], r)
    d = only(IRModule({"main": f}), "struct-info")
    assert "the If's then branch has no struct info but its result has Tensor((4,), \"float32\")" in d.message
    shows(d, "r: ")
    r2 = Var("r2", f32(4))
    f2 = fn([c, x], [plain(Binding(r2, If(c, typed_branch, SeqExpr((), x, f32(4)))))], r2)
    d2 = only(IRModule({"main": f2}), "struct-info")
    assert "the If in the value of %r2 has no struct info (the builder gives Tensor((4,), \"float32\"))" in d2.message


# -- rule 7: globals -----------------------------------------------------------------------


def test_unknown_global_and_op() -> None:
    x, a, b = Var("x", f32(4)), Var("a", AnyInfo()), Var("b", AnyInfo())
    f = fn([x], [plain(Binding(a, Call(GlobalVar("missing"), (x,))), Binding(b, Call(OpRef("frobnicate"), (x,))))], x)
    diags = check(IRModule({"main": f}))
    msgs = [d.message for d in diags]
    assert [d.rule for d in diags] == ["global", "global"], msgs
    assert "@missing is not a function of the module (it has: @main): add it or fix the name" in msgs[0]
    assert "op 'frobnicate' is not registered" in msgs[1]


def test_tensor_func_called_directly() -> None:
    # the lowered destination-passing form is fine outside dataflow blocks ...
    x, a = Var("x", f32(4)), Var("a", AnyInfo())
    f = fn([x], [plain(Binding(a, Call(GlobalVar("add"), (x, x))))], x)
    assert [d for d in check(IRModule({"add": add_kernel(), "main": f})) if d.rule == "global"] == []
    # ... but a kernel writes its outputs: not inside a dataflow block
    y, b = Var("y", f32(4)), DataflowVar("b", AnyInfo())
    g = fn([y], [DataflowBlock((Binding(b, Call(GlobalVar("add"), (y, y))),))], y)
    d = only(IRModule({"add": add_kernel(), "main": g}), "global")
    assert "@add is a TensorFunc called directly inside a dataflow block: use call_tensor(@add, args, out)" in d.message


def test_call_tensor_of_a_graph_func_and_wrong_arity() -> None:
    x, a, b, c = Var("x", f32(3, 4)), Var("a", f32(3, 4)), Var("b", f32(3, 4)), Var("c", f32(3))
    p = Var("p", f32(3, 4))
    norm = BlockBuilder().normalize
    bad_callee = norm(op.call_tensor(GlobalVar("g"), [x], f32(3, 4)))
    bad_inputs = norm(op.call_tensor(GlobalVar("add"), [x], f32(3, 4)))
    bad_sym_args = norm(op.call_tensor(GlobalVar("rsum"), [x], f32(3)))  # rsum takes sym param s
    f = fn([x], [plain(Binding(a, bad_callee), Binding(b, bad_inputs), Binding(c, bad_sym_args))], b)
    mod = IRModule({"g": fn([p], [], p), "add": add_kernel(), "rsum": scaled_row_sum(), "main": f})
    diags = check(mod)
    msgs = [d.message for d in diags]
    assert [d.rule for d in diags] == ["global"] * 3, msgs
    assert "call_tensor's callee @g is a GraphFunc, not a TensorFunc: call it directly" in msgs[0]
    assert "call_tensor passes 1 input(s) but @add takes 2 (A, B)" in msgs[1]
    assert "call_tensor passes 0 sym arg(s) but @rsum takes 1 (s)" in msgs[2]


def test_call_lib_needs_an_extern_func() -> None:
    x, a = Var("x", f32(4)), Var("a", f32(4))
    c = op.call_lib("blas.gemm", [x], f32(4))
    call = Call(c.callee, (GlobalVar("main"), Tuple((x,), TupleInfo((x.info,)))), c.attrs, c.sinfo_args, f32(4))
    f = fn([x], [plain(Binding(a, call))], a)
    d = only(IRModule({"main": f}), "global")
    assert "call_lib calls @main, not an ExternFunc: pass ExternFunc(symbol)" in d.message
    ok = Call(c.callee, (ExternFunc("gemm"), Tuple((x,), TupleInfo((x.info,)))), c.attrs, c.sinfo_args, f32(4))
    assert check(IRModule({"main": fn([x], [plain(Binding(a, ok))], a)})) == []


# -- rule 8: return info ---------------------------------------------------------------------


def test_ret_info_must_cover_the_body() -> None:
    x = Var("x", f32(2, 4))
    f = fn([x], [], x, ret=f32(2, 4))
    f = f.replace(ret_info=f32(2, 5))
    d = only(IRModule({"main": f}), "ret-info")
    assert "ret_info Tensor((2, 5), \"float32\") is not a base of the body's info Tensor((2, 4), \"float32\")" in d.message
    assert "widen ret_info, or match_cast the result" in d.message


# -- rule 9: loop level ----------------------------------------------------------------------


def kernel_with(body_of: object) -> IRModule:
    return IRModule({"k": body_of})  # type: ignore[dict-item]


def loop_only(tf: L.TensorFunc) -> list[Diagnostic]:
    diags = check(IRModule({"k": tf}))
    assert all(d.rule == "loop" for d in diags), "\n".join(map(str, diags))
    return diags


def test_unknown_buffer_and_allocate_scope() -> None:
    n = SymVar("n")
    a, out, tmp, stray = L.Buffer("A", (n,), "float32"), L.Buffer("B", (n,), "float32"), L.Buffer("T", (n,), "float32"), L.Buffer("X", (n,), "float32")
    i, j, k = SymVar("i"), SymVar("j"), SymVar("k")
    body = L.SeqStmt((
        L.Allocate(tmp, L.For(i, n, L.Store(tmp, (i,), L.Load(a, (i,))))),
        L.For(j, n, L.Store(out, (j,), L.Load(tmp, (j,)))),  # T is out of scope here
        L.For(k, n, L.Store(stray, (k,), L.Const(0.0, "float32"))),
    ))  # fmt: skip
    diags = loop_only(L.TensorFunc((a, out), body))
    assert len(diags) == 2
    assert "load from buffer T, which is neither a param of @k nor allocated around this use" in diags[0].message
    assert "store to buffer X" in diags[1].message
    shows(diags[0], "B[j]")


def test_undefined_loop_sym_var() -> None:
    n, q = SymVar("n"), SymVar("q")
    a = L.Buffer("A", (n,), "float32")
    i = SymVar("i")
    d = loop_only(L.TensorFunc((a,), L.For(i, q, L.Store(a, (i,), L.Const(1.0, "float32")))))[0]
    assert "the extent of loop i uses sym var q, which is not defined here" in d.message
    assert "sym params, bare dims of buffer params, and enclosing loops" in d.message


def test_loop_var_bound_twice_and_index_count() -> None:
    n = SymVar("n")
    a = L.Buffer("A", (n, 4), "float32")
    i = SymVar("i")
    store = L.Store(a, (i,), L.Const(1.0, "float32"))
    body = L.SeqStmt((L.For(i, n, store), L.For(i, 4, L.Store(a, (i, i), L.Const(2.0, "float32")))))
    diags = loop_only(L.TensorFunc((a,), body))
    msgs = [d.message for d in diags]
    assert "store to A with 1 index(es) but A has rank 2: give one index per dim" in msgs[0]
    assert "loop i binds i, already bound by loop i: give it a fresh SymVar" in msgs[1]
    shows(diags[1], "for i in")


def test_loop_kinds_ops_and_num_outputs() -> None:
    n = SymVar("n")
    a = L.Buffer("A", (n,), "float32")
    i, vi = SymVar("i"), SymVar("vi")
    value = L.Unary("sqrt", L.Intrin("expp", (L.Binary("**", L.Load(a, (vi,)), L.Const(2.0, "float32"), "float32"),), "float32"), "float32")
    blk = L.Block("A", (L.IterVar(vi, n, "parallel", i),), (a,), (a,), L.Store(a, (vi,), value))
    diags = loop_only(L.TensorFunc((a,), L.For(i, n, blk, "threaded"), num_outputs=2))
    msgs = [d.message for d in diags]
    assert "num_outputs is 2 but @k has 1 buffer param(s)" in msgs[0]
    assert "loop i has kind 'threaded'; loop kinds are serial, parallel, vectorized, unrolled" in msgs[1]
    assert "iter var vi of block A has kind 'parallel'; kinds are 'spatial' and 'reduce'" in msgs[2]
    assert any("unary op 'sqrt' is unknown" in m for m in msgs), msgs
    assert any("intrinsic 'expp' is unknown" in m for m in msgs), msgs
    assert any("binary op '**' is unknown" in m for m in msgs), msgs


# -- collecting --------------------------------------------------------------------------------


def test_verify_lists_every_problem_with_context() -> None:
    n = SymVar("n")
    x = Var("x", f32(4))
    a, b = Var("a", f32(4)), Var("b", f32(n))
    f = fn([x], [plain(Binding(a, typed(op.exp(b))), Binding(b, Call(OpRef("exp"), (x,), info=f32(n))))], a)
    with pytest.raises(WellFormedError) as err:
        verify(IRModule({"main": f, "k": add_kernel().replace(num_outputs=5)}))
    text = str(err.value)
    assert text.startswith("the module is not well-formed: 5 problems")  # b's call also claims (n,) for exp's (4,)
    for piece in ("error[var-def] in @main", "error[sym-def] in @main", "error[struct-info] in @main", "the call of exp in the value of %b has struct info", "error[loop] in @k"):
        assert piece in text, text
    assert text.count("^") >= 3


def test_context_falls_back_when_the_printer_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    import tilework.text.printer as printer

    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("a printer bug")

    monkeypatch.setattr(printer, "print_func", broken)
    x = Var("x", f32(4))
    a, b = Var("a", f32(4)), Var("b", f32(4))
    f = fn([x], [plain(Binding(a, typed(op.exp(b))), Binding(b, typed(op.exp(x))))], a)
    d = only(IRModule({"main": f}), "var-def")
    assert 'def @main(%x: Tensor((4,), "float32"))' in d.context
    shows(d, '%a: Tensor((4,), "float32") = exp(%b)')


def test_what_was_found_well_formed_is_not_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module verified clean and verified again with the same ``Checked`` (a pipeline's run
    verifies after every pass) is not walked again: its kernels (the same objects) and its
    graph functions (the same objects, calling kernels of the same arity). A kernel replaced
    by one of another arity has the graph checked again and the call reported; a malformed
    module is reported every time; without a ``Checked`` everything is walked."""
    from tilework.ir import verify as V

    walked: list[str] = []
    for cls in (V._GraphCheck, V.LoopCheck):
        monkeypatch.setattr(cls, "run", lambda self, run=cls.run: (walked.append(self.name), run(self))[1])
    n = SymVar("n")
    x = Var("x", f32(n, 4))
    bb = BlockBuilder()
    add = bb.add_func("add", add_kernel())
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op.call_tensor(add, [x, x], f32(n, 4))))
        bb.emit_func_output(out)
    mod = bb.get()
    checked = V.Checked()
    assert check(mod, checked) == [] and sorted(walked) == ["add", "main"]
    walked.clear()
    assert check(mod, checked) == [] and walked == []
    assert check(IRModule(dict(mod.items())), checked) == [] and walked == []  # a new module of the same functions
    assert check(mod) == [] and sorted(walked) == ["add", "main"]  # no Checked: walked
    walked.clear()
    rescheduled = add_kernel()  # another object, the same arity: only it is walked
    assert check(IRModule({**dict(mod.items()), "add": rescheduled}), checked) == [] and walked == ["add"]
    a, c = L.Buffer("A", (n, 4), "float32"), L.Buffer("C", (n, 4), "float32")
    one_input = L.TensorFunc((a, c), rescheduled.body, 1)  # reads B, which it no longer takes
    for _ in range(2):
        walked.clear()
        diags = check(IRModule({**dict(mod.items()), "add": one_input}), checked)
        assert sorted(walked) == ["add", "main"]
        assert any("call_tensor passes 2 input(s) but @add takes 1 (A)" in d.message for d in diags), [d.message for d in diags]


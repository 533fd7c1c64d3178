"""Modules that between them hold every node kind of the IR, for the text and structural tests."""

from __future__ import annotations

import numpy as np

from tilework import op
from tilework.ir import sym
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import (
    Attrs,
    Call,
    Constant,
    ExternFunc,
    GlobalVar,
    PrimValue,
    ShapeExpr,
    StringImm,
    Tuple,
    TupleGetItem,
    Var,
)
from tilework.ir.info import AnyInfo, FuncInfo, PrimInfo, ShapeInfo, TensorInfo, TupleInfo
from tilework.ir.loop import (
    Allocate,
    Binary,
    Block,
    Buffer,
    Cast,
    Const,
    For,
    IfThenElse,
    Intrin,
    IterVar,
    Load,
    Select,
    SeqStmt,
    Store,
    TensorFunc,
    Unary,
)
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar


def f32(*shape: object) -> TensorInfo:
    return TensorInfo(tuple(shape), "float32")  # type: ignore[arg-type]


def kernel() -> TensorFunc:
    """A hand-written TensorFunc with every statement and scalar expression kind."""
    n, m = SymVar("n", 1, 4096), SymVar("m")
    A, B = Buffer("A", (n, 4), "float32"), Buffer("B", (n,), "float32")
    T = Buffer("T", (4,), "float16")
    i, k, vi = SymVar("i"), SymVar("k"), SymVar("vi")
    vk = SymVar("vk", 0, 3)  # non-default bounds: declared up front
    reduce_block = Block(
        "B",
        (IterVar(vi, n, "spatial", i), IterVar(vk, 4, "reduce", k)),
        (A, B),
        (B,),
        Store(B, (vi,), Binary("+", Load(B, (vi,)), Intrin("exp", (Load(A, (vi, vk)),), "float32"), "float32")),
        Store(B, (vi,), Const(0.0, "float32")),
    )
    nan_test = Unary("not", Intrin("isnan", (Load(A, (0, 0)),), "bool"), "bool")
    body = SeqStmt(
        (
            For(i, n, For(k, 4, reduce_block, "unrolled"), "parallel"),
            Allocate(
                T,
                SeqStmt(
                    (
                        Store(T, (0,), Cast("float16", Binary("*", m, 2, "int64"))),  # an unfolded index op
                        Store(T, (sym.floordiv(m, 4) % 4,), Cast("float16", Load(A, (0, 1)))),
                    )
                ),
            ),
            IfThenElse(
                Binary("and", Binary("<", m, n, "bool"), nan_test, "bool"),
                Store(B, (m * 2 + 1,), Select(Binary(">=", Load(A, (0, 0)), Const(0.5, "float32"), "bool"), Const(1.5, "float32"), Unary("neg", Load(A, (0, 1)), "float32"), "float32")),
                SeqStmt((Store(B, (sym.min_(n, m),), Const(float("-inf"), "float32")),)),
            ),
            Store(B, (sym.max_(n - 1, 0),), Binary("pow", Load(A, (0, 0)), Const(-2.0, "float32"), "float32")),
            Store(B, (0,), Binary("/", Binary("+", 1, Load(A, (0, 0)), "float32"), Const(3, "int32"), "float16")),
            Store(B, (1,), Intrin("fma", (Load(A, (0, 0)), Load(A, (0, 1)), Load(A, (0, 2))), "float32")),
        )
    )
    return TensorFunc((A, m, B), body, 1, Attrs({"op_pattern": 1, "tag": "demo"}))


def graph_module() -> IRModule:
    """Graph functions with every expression and binding kind, calling a TensorFunc, a library
    function, a packed function and each other."""
    n, m = SymVar("n", 1, 4096), SymVar("m")
    bb = BlockBuilder()
    k = bb.add_func("kernel", kernel())
    bb.add_func("gemm", ExternFunc("cblas_sgemm", FuncInfo(None, AnyInfo(), pure=False)))

    y = Var("y", f32(n, 4))
    with bb.function("helper", [y]):
        bb.emit_func_output(bb.emit(op.multiply(y, y)))
    helper = bb.global_var("helper")

    x = Var("x", f32(n, 4))
    c = Var("c", PrimInfo("bool"))
    s = Var("s", ShapeInfo(ndim=2))
    t = Var("t", TupleInfo((f32(n, 4), AnyInfo())))
    attrs = {"num_inputs": 2, "dims": (n, 3), "eps": 1e-5, "nested": {"a": [1, 2], "b": None}, "name": "main"}
    with bb.function("main", [x, c, s, t], attrs=attrs):
        with bb.dataflow():
            e = bb.emit(op.exp(op.add(x, Constant.of(np.array([1.0, -0.0, float("nan"), 2.5], "float32")))))
            h = bb.emit(Call(helper, (e,)))
            gv = bb.emit_output(op.astype(h, "float16"), name="gv")
        with bb.dataflow():
            pass
        w = bb.match_cast(gv, TensorInfo((m, 4), "float16"))
        r = bb.emit_if(c, lambda: op.add(w, w), lambda: w)
        big = Constant.of(np.arange(96, dtype="float16").reshape(24, 4), name="weights")
        wb = bb.emit(op.multiply(r, big))
        kt = bb.emit(op.call_tensor(k, [x], f32(n), sym_args=[m]))
        lib = bb.emit(op.call_lib("cblas_sdot", [x, x], TensorInfo((), "float32")))
        packed = bb.emit(op.call_packed(ExternFunc("tw.print"), [StringImm("hello \"world\"\n"), x], AnyInfo(), pure=False))
        tup = bb.emit(Tuple((wb, kt, PrimValue.of(n + 1), PrimValue.of(0.5), PrimValue.of(True), PrimValue.of(3, "int32"), ShapeExpr.of((n, 4)), StringImm("s"))))
        first = bb.emit(TupleGetItem(tup, 0))
        bb.emit(TupleGetItem(t, 1))
        bb.emit(Call(GlobalVar("gemm"), (x, lib)), name="ext")
        bb.emit_func_output(Tuple((first, lib, packed, s)))
    return bb.get().with_attrs(target="cpu", version=1)

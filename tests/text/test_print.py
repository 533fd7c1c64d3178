"""What the printer shows: the format of functions, highlighted errors in context, and the
small printers for expressions, struct info and bindings."""

from __future__ import annotations

import numpy as np

from tests.text.modules import f32, graph_module, kernel
from tilework import op
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Constant, GraphFunc, PrimValue, ShapeExpr, Tuple, Var
from tilework.ir.info import AnyInfo, FuncInfo, PrimInfo, ShapeInfo, TensorInfo, TupleInfo
from tilework.ir.loop import For, TensorFunc
from tilework.ir.sym import SymVar
from tilework.text import print_binding, print_expr, print_func, print_info, print_module


def test_graph_function_text() -> None:
    n = SymVar("n", 1, 4096)
    x = Var("x", f32(n, 4))
    bb = BlockBuilder()
    with bb.function("main", [x], attrs={"num_inputs": 1}):
        with bb.dataflow():
            y = bb.emit(op.exp(x), name="y")
            z = bb.emit_output(op.astype(y, "float16"), name="z")
        bb.emit_func_output(z)
    expected = '''\
@graph(attrs={"num_inputs": 1})
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float16"):
    n = sym(lo=1, hi=4096)
    with dataflow():
        y: Tensor((n, 4), "float32") = exp(x)
        z: Tensor((n, 4), "float16") = astype(y, dtype="float16")
        output(z)
    return z
'''
    assert print_module(bb.get()) == expected
    assert repr(bb.get()) == expected


def test_highlight_a_binding_with_a_note() -> None:
    mod = graph_module()
    main = mod["main"]
    assert isinstance(main, GraphFunc)
    target = main.body.blocks[1].bindings[2]
    text = print_func("main", main, highlight=target, note="error: shapes do not match")
    lines = text.split("\n")
    i = next(k for k, line in enumerate(lines) if line.lstrip().startswith("v3:"))
    assert lines[i + 1] == "    " + "^" * (len(lines[i]) - 4) + " error: shapes do not match"
    assert sum("^" in line for line in lines) == 1
    assert "meta[0]" in text and "# meta[0]: float16 (24, 4)" in text and "data=" not in text


def test_highlight_a_statement() -> None:
    k = kernel()
    loop = k.body.stmts[0]  # type: ignore[attr-defined]
    assert isinstance(loop, For)
    lines = print_func("kernel", k, highlight=loop, note="here").split("\n")
    i = lines.index("    for i in parallel(n):")
    assert lines[i + 1] == "    " + "^" * len("for i in parallel(n):") + " here"


def test_small_printers() -> None:
    n = SymVar("n")
    assert print_info(TensorInfo((n, 4), "float32")) == 'Tensor((n, 4), "float32")'
    assert print_info(TensorInfo((n,), None)) == "Tensor((n,))"
    assert print_info(TensorInfo(None, "int8", 3)) == 'Tensor(ndim=3, dtype="int8")'
    assert print_info(TensorInfo(None, None)) == "Tensor()"
    assert print_info(ShapeInfo((n * 2 + 1,))) == "Shape((2 * n + 1,))"
    assert print_info(PrimInfo("int64", n // 2)) == 'Prim("int64", value=n // 2)'
    assert print_info(TupleInfo((AnyInfo(), ShapeInfo(ndim=2)))) == "Tuple(Any, Shape(ndim=2))"
    assert print_info(FuncInfo(None, AnyInfo(), pure=False)) == "Func(None, Any, pure=False)"
    assert print_info(FuncInfo((PrimInfo(None),), TupleInfo(()))) == "Func([Prim(None)], Tuple())"
    x = Var("x", f32(n))
    assert print_expr(Tuple((x, PrimValue.of(n - 1), ShapeExpr.of((n,))))) == "(x, prim(n - 1), shape(n))"
    assert print_expr(op.astype(x, "bfloat16")) == 'astype(x, dtype="bfloat16")'
    assert print_expr(Constant.of(np.array([[1, 2]], "int32"))) == 'const([[1, 2]], "int32")'
    assert print_expr(op.sum(x)) == "sum(x, axis=None, keepdims=False)"  # type: ignore[attr-defined]


def test_print_binding_of_an_if() -> None:
    c = Var("c", PrimInfo("bool"))
    x = Var("x", f32(2))
    bb = BlockBuilder()
    with bb.function("f", [c, x]):
        bb.emit_func_output(bb.emit_if(c, lambda: op.exp(x), lambda: x, name="r"))
    f = bb.get()["f"]
    assert isinstance(f, GraphFunc)
    binding = f.body.blocks[0].bindings[-1]
    assert print_binding(binding) == '''\
r: Tensor((2,), "float32") = if c:
    v0: Tensor((2,), "float32") = exp(x)
    v0
else:
    x'''


def test_tensor_func_text() -> None:
    text = print_func("kernel", kernel())
    assert text.startswith('@tensor(attrs={"op_pattern": 1, "tag": "demo"})\ndef kernel(A: Buffer((n, 4), "float32"), m: int64, B: Buffer((n,), "float32")):\n')
    assert "    vk = sym(hi=3)\n" in text  # bounds on an iter var need a declaration
    assert "    i = sym()" not in text  # loop vars with default bounds are introduced by their loop
    assert 'T[0] = cast(binary("*", m, 2, dtype="int64"), "float16")' in text
    assert "B[2 * m + 1] = select(A[0, 0] >= float32(0.5), float32(1.5), -A[0, 1])" in text
    assert isinstance(kernel(), TensorFunc)

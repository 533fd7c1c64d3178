"""Cross-level calls: ``call_tensor`` (a TensorFunc), ``call_lib`` (a library entry point,
destination-passing) and ``call_packed`` (a library function that returns its result).

Their output struct info cannot be inferred from the callee, so the caller states it in
``sinfo_args``; the run time checks it at the boundary.
"""

from __future__ import annotations

from typing import Sequence

from tilework.ir.graph import Call, Expr, ExternFunc, GlobalVar, ShapeExpr, Tuple
from tilework.ir.info import StructInfo, TupleInfo
from tilework.ir.sym import Dim
from tilework.op.base import InferCtx, Op, OpPattern, make_call, register


def _infer_stated(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.sinfo_args) != 1:
        raise ctx.error("needs exactly one output struct info (out=...)")
    if len(call.args) < 2 or not isinstance(call.args[1].info, TupleInfo):
        raise ctx.error("expects (callee, (args...)[, shape(sym_args)])")
    return call.sinfo_args[0]


register(Op("call_tensor", _infer_stated, OpPattern.OPAQUE))
register(Op("call_lib", _infer_stated, OpPattern.OPAQUE))
register(Op("call_packed", _infer_stated, OpPattern.OPAQUE, attrs={"pure": False}, pure=False))


def call_tensor(func: GlobalVar, args: Sequence[Expr], out: StructInfo, sym_args: Sequence[Dim] = ()) -> Call:
    """Call a TensorFunc in destination-passing style; ``sym_args`` pass sym var values that
    no buffer shape supplies."""
    call_args: list[Expr] = [func, Tuple(tuple(args))]
    if sym_args:
        call_args.append(ShapeExpr(tuple(sym_args)))
    c = make_call("call_tensor", call_args)
    return Call(c.callee, c.args, c.attrs, (out,))


def call_lib(func: ExternFunc | str, args: Sequence[Expr], out: StructInfo) -> Call:
    f = ExternFunc(func) if isinstance(func, str) else func
    c = make_call("call_lib", [f, Tuple(tuple(args))])
    return Call(c.callee, c.args, c.attrs, (out,))


def call_packed(func: ExternFunc | str, args: Sequence[Expr], out: StructInfo, pure: bool = False) -> Call:
    f = ExternFunc(func) if isinstance(func, str) else func
    c = make_call("call_packed", [f, Tuple(tuple(args))], pure=pure)
    return Call(c.callee, c.args, c.attrs, (out,))

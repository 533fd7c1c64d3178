"""fold_constant: evaluate at compile time what depends only on constants.

Rules (run by the rewrite driver):

- ``call_tensor(@k, (c0, c1, ...), out=...)`` whose inputs are constants (written in place or
  bound to vars), whose sym args are static and whose outputs have static shapes runs ``@k``
  with the reference interpreter (``tilework.codegen.interp``, the oracle the C kernels are
  tested against, so folded values are what the compiled kernel computes) and becomes the
  constant (or a tuple of constants); the interpreter registers itself as the evaluator
  (``register_kernel_evaluator``) when ``tilework.codegen`` is imported, which ``import
  tilework`` does; with no evaluator nothing is folded;
- a graph-level op call whose arguments are constants, static shapes, static prim values or
  strings (``add(c0, c1)``, ``reshape(c, shape(2, 8))``, ``zeros(shape(4,))``) is legalized
  alone, in a scratch module, and its kernel(s) folded as above; ops without a legalization,
  impure ops and effects (``assert_dims``) are kept;
- ``t[i]`` of a tuple literal becomes the field (so the items of a folded ``split`` fold too).

Nothing big is folded: a call whose outputs hold more than ``max_elements`` elements, or whose
kernel would execute more than ``max_work`` stores, is kept (folding would bloat the constant
pool or the compile time). Anything the interpreter refuses is kept, never an error.

Requires a well-formed module (graph level, legalized, or both). Guarantees a well-formed module
computing the same values; folded bindings bind constants (``lv = const(...)``), which
dead_code_elimination removes once nothing reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from tilework.errors import TileworkError
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.builder import BlockBuilder
from tilework.ir.dtype import np_dtype
from tilework.ir.kernel_abi import bind_syms
from tilework.ir.graph import (
    Call,
    Constant,
    Expr,
    GlobalVar,
    GraphFunc,
    MatchCast,
    OpRef,
    PrimValue,
    ShapeExpr,
    StringImm,
    Tuple,
    TupleGetItem,
    Var,
)
from tilework.ir.info import StructInfo, TensorInfo, TupleInfo
from tilework.ir.loop import Allocate, Block, For, IfThenElse, SeqStmt, Stmt, Store, TensorFunc, kernel_syms
from tilework.ir.module import Function, IRModule
from tilework.ir.sym import SymExpr
from tilework.op import base as opbase
from tilework.transform.canonicalize_bindings import TUPLE_ITEM_OF_TUPLE
from tilework.transform.base import Pass
from tilework.pattern.core import Match, op_call
from tilework.transform.rewrite_driver import RewriteCtx, Rule, apply_rules

_NOT_FOLDED = frozenset({"call_tensor", "call_lib", "call_packed", "assert_dims"})


def const_value(e: Expr, ctx: RewriteCtx) -> Expr | None:
    """``e`` as a compile-time value (vars followed to what they are bound to), or None."""
    r = ctx.resolve(e)
    if isinstance(r, (Constant, StringImm)):
        return r
    if isinstance(r, ShapeExpr):
        return r if all(isinstance(d, int) for d in r.values) else None
    if isinstance(r, PrimValue):
        return None if isinstance(r.value, SymExpr) else r
    if isinstance(r, Tuple):
        fields = [const_value(f, ctx) for f in r.fields]
        if any(f is None for f in fields):
            return None
        return Tuple(tuple(f for f in fields if f is not None))
    return None


def _static_tensors(info: StructInfo) -> list[tuple[tuple[int, ...], str]] | None:
    """Shapes and dtypes of the tensors ``info`` describes when all are static, else None."""
    fields = list(info.fields) if isinstance(info, TupleInfo) else [info]
    out = []
    for f in fields:
        if not isinstance(f, TensorInfo) or f.shape is None or f.dtype is None:
            return None
        dims = [d for d in f.shape if isinstance(d, int)]
        if len(dims) != len(f.shape):
            return None
        out.append((tuple(dims), f.dtype))
    return out


def _work(s: Stmt, env: Mapping[sym.SymVar, int], times: int) -> int:
    """Stores executed by ``s`` when it runs ``times`` times (If: both sides counted)."""
    if isinstance(s, Store):
        return times
    if isinstance(s, For):
        return _work(s.body, env, times * max(sym_walk.evaluate(s.extent, env), 0))
    if isinstance(s, SeqStmt):
        return sum(_work(x, env, times) for x in s.stmts)
    if isinstance(s, Block):
        return _work(s.body, env, times) + (0 if s.init is None else _work(s.init, env, times))
    if isinstance(s, Allocate):
        return _work(s.body, env, times)
    if isinstance(s, IfThenElse):
        other = 0 if s.else_body is None else _work(s.else_body, env, times)
        return _work(s.then_body, env, times) + other
    return times


@dataclass(frozen=True)
class _Limits:
    max_elements: int
    max_work: int


KernelEvaluator = Callable[[TensorFunc, Sequence[np.ndarray], Sequence[int]], None]
_EVALUATOR: list[KernelEvaluator] = []


def register_kernel_evaluator(fn: KernelEvaluator) -> None:
    """``fn(func, arrays, sym_params)`` runs a kernel on arrays (outputs written in place); the
    reference interpreter (``tilework.codegen.interp``) registers itself."""
    _EVALUATOR[:] = [fn]


def run_kernel(func: TensorFunc, call: Call, args: Sequence[Expr], limits: _Limits) -> Expr | None:
    """The constant(s) ``call`` (a call_tensor of ``func`` on constant ``args``) produces, or
    None when it is too big or cannot be run here."""
    if not _EVALUATOR or len(call.sinfo_args) != 1:
        return None
    outs_info = _static_tensors(call.sinfo_args[0])
    if outs_info is None or not all(isinstance(a, Constant) for a in args):
        return None
    if sum(int(np.prod(shape, dtype=np.int64)) for shape, _ in outs_info) > limits.max_elements:
        return None
    sym_args: list[int] = []
    if len(call.args) > 2:
        given = call.args[2]
        if not isinstance(given, ShapeExpr):
            return None
        sym_args = [d for d in given.values if isinstance(d, int)]
        if len(sym_args) != len(given.values):
            return None
    ins = [np.ascontiguousarray(a.data) for a in args if isinstance(a, Constant)]
    outs = [np.zeros(shape, np_dtype(dtype)) for shape, dtype in outs_info]
    try:
        values = bind_syms(func, [*ins, *outs], sym_args, "fold_constant")
        env = dict(zip(kernel_syms(func), values))
        if _work(func.body, env, 1) > limits.max_work:
            return None
        _EVALUATOR[0](func, [*ins, *outs], sym_args)
    except (TileworkError, ArithmeticError, IndexError, ValueError):
        return None  # e.g. an integer division by zero or an index out of range: left to run time
    consts = [Constant.of(o) for o in outs]
    return Tuple(tuple(consts)) if isinstance(call.sinfo_args[0], TupleInfo) else consts[0]


def _evaluate(f: GraphFunc, funcs: Mapping[str, Function], limits: _Limits) -> Expr | None:
    """The value of a parameterless function whose bindings are kernel calls on constants,
    tuples and items; None when any binding is something else."""
    env: dict[Var, Expr] = {}

    def value(e: Expr) -> Expr | None:
        if isinstance(e, Var):
            return env.get(e)
        if isinstance(e, Tuple):
            fields = [value(x) for x in e.fields]
            return None if any(x is None for x in fields) else Tuple(tuple(x for x in fields if x is not None))
        return e if isinstance(e, (Constant, ShapeExpr, PrimValue, StringImm)) else None

    for block in f.body.blocks:
        for b in block.bindings:
            if isinstance(b, MatchCast):
                return None
            v = b.value
            result: Expr | None
            if isinstance(v, Call):
                result = _evaluate_call(v, value, funcs, limits)
            elif isinstance(v, TupleGetItem):
                t = value(v.tuple_value)
                result = t.fields[v.index] if isinstance(t, Tuple) else None
            else:
                result = value(v)
            if result is None:
                return None
            env[b.var] = result
    return value(f.body.body)


def _evaluate_call(call: Call, value: Callable[[Expr], Expr | None], funcs: Mapping[str, Function], limits: _Limits) -> Expr | None:
    if not (isinstance(call.callee, OpRef) and call.callee.name == "call_tensor"):
        return None
    gv, args = call.args[0], call.args[1]
    func = funcs.get(gv.name) if isinstance(gv, GlobalVar) else None
    if not isinstance(func, TensorFunc) or not isinstance(args, Tuple):
        return None
    vals = [value(a) for a in args.fields]
    known = [v for v in vals if v is not None]
    if len(known) != len(vals):
        return None
    return run_kernel(func, call, known, limits)


def fold_op(call: Call, args: Sequence[Expr], limits: _Limits) -> Expr | None:
    """Legalize ``op(args)`` alone (args are compile-time values) and evaluate it."""
    from tilework.transform.legalize import Legalize

    try:
        bb = BlockBuilder()
        with bb.function("_fold", []):
            out = bb.emit(Call(call.callee, tuple(args), call.attrs, call.sinfo_args))
            bb.emit_func_output(out)
        scratch = Legalize()(bb.get())
    except TileworkError:
        return None
    f = scratch["_fold"]
    assert isinstance(f, GraphFunc)
    return _evaluate(f, scratch, limits)


def _foldable_op(call: Expr, m: Match) -> bool:
    assert isinstance(call, Call) and isinstance(call.callee, OpRef)
    name = call.callee.name
    if name in _NOT_FOLDED or name.startswith("vm_"):
        return False
    op = opbase.lookup(name)
    return op is not None and op.pure and not op.effect and op.legalize is not None


class _Folder:
    def __init__(self, limits: _Limits) -> None:
        self.limits = limits

    def call_tensor(self, value: Expr, m: Match) -> Expr | None:
        assert isinstance(value, Call)
        gv, args = value.args[0], m.ctx.resolve(value.args[1])
        func = m.ctx.func(gv.name) if isinstance(gv, GlobalVar) else None
        if not isinstance(func, TensorFunc) or not isinstance(args, Tuple):
            return None
        vals = [const_value(a, m.ctx) for a in args.fields]
        if any(v is None for v in vals):
            return None
        return run_kernel(func, value, [v for v in vals if v is not None], self.limits)

    def op_call(self, value: Expr, m: Match) -> Expr | None:
        assert isinstance(value, Call)
        vals = [const_value(a, m.ctx) for a in value.args]
        if any(v is None for v in vals):
            return None
        return fold_op(value, [v for v in vals if v is not None], self.limits)


def fold_rules(max_elements: int = 1 << 16, max_work: int = 1 << 20) -> tuple[Rule, ...]:
    folder = _Folder(_Limits(max_elements, max_work))
    return (
        Rule("fold_call_tensor", op_call("call_tensor"), folder.call_tensor),
        Rule("fold_op", op_call(None).where(_foldable_op), folder.op_call),
        TUPLE_ITEM_OF_TUPLE,
    )


@dataclass(frozen=True)
class FoldConstant(Pass):
    max_elements: int = 1 << 16  # outputs of one call, all together
    max_work: int = 1 << 20  # stores one kernel may execute at compile time
    name: str = "fold_constant"

    def run(self, mod: IRModule) -> IRModule:
        return apply_rules(mod, fold_rules(self.max_elements, self.max_work), inline_aliases=False)


__all__ = ["FoldConstant", "fold_rules", "fold_op", "run_kernel", "const_value"]

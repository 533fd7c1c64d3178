"""The normalizing BlockBuilder.

It builds graph functions in A-normal form: every call's arguments are leaves (vars, constants,
shapes, prim values, strings, global/extern references, or tuples of leaves); a nested call is
emitted as its own binding first. Struct info is inferred at every emit:

- an op call through the op's inference rule (``tilework.op``);
- a call of a function through its signature: the callee's param dims are unified with the
  argument dims and the mapping substituted into the return info, so ``f(x: [n, 4]) -> [n * 2]``
  called with ``[m + 1, 4]`` gives ``[(m + 1) * 2]``. Facts that cannot be proved are checked at
  run time at the function boundary; provably wrong arguments are an error here.

Sym vars are scoped: a function's params and ``match_cast`` define them; a return info that
mentions a var defined inside the body is erased to what the caller can see.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from tilework.errors import InferenceError, ShapeError, WellFormedError
from tilework.ir import info as I
from tilework.ir.graph import (
    EMPTY_ATTRS,
    AnyBinding,
    Attrs,
    Binding,
    BindingBlock,
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
    StringImm,
    Tuple,
    TupleGetItem,
    Var,
)
from tilework.ir.info import AnyInfo, FuncInfo, PrimInfo, ShapeInfo, StructInfo, TensorInfo, TupleInfo
from tilework.ir import opdef
from tilework.ir.module import Function, IRModule, func_info
from tilework.ir.sym import Dim, SymVar

LEAVES = (Var, Constant, ShapeExpr, PrimValue, StringImm, GlobalVar, ExternFunc, OpRef)


def is_leaf(e: Expr) -> bool:
    """A-normal-form atoms; a tuple of leaves counts as a leaf."""
    if isinstance(e, LEAVES):
        return True
    return isinstance(e, Tuple) and all(is_leaf(f) for f in e.fields)


@dataclass
class _Frame:
    """One binding scope: a function body or an If branch."""

    blocks: list[BindingBlock] = field(default_factory=list)
    current: list[AnyBinding] = field(default_factory=list)
    dataflow: bool = False
    sym_defined: set[SymVar] = field(default_factory=set)

    def flush(self) -> None:
        if self.current:
            kind = DataflowBlock if self.dataflow else BindingBlock
            self.blocks.append(kind(tuple(self.current)))
            self.current = []


@dataclass
class _FuncScope:
    name: str
    params: tuple[Var, ...]
    attrs: Attrs
    pure: bool
    names: set[str] = field(default_factory=set)
    result: GraphFunc | None = None


class BlockBuilder:
    """Builds an IRModule; see the module docstring for the normalization rules."""

    def __init__(self, mod: IRModule | None = None) -> None:
        self._funcs: dict[str, Function] = dict(mod or {})
        self._mod_attrs = mod.attrs if mod is not None else EMPTY_ATTRS
        self._func: _FuncScope | None = None
        self._frames: list[_Frame] = []
        self.emitted = 0  # bindings emitted so far (a caller compares it before and after a call)

    # -- module level ---------------------------------------------------------------------

    def add_func(self, name: str, func: Function) -> GlobalVar:
        """Add (or replace) a global function and return a reference to it."""
        self._funcs[name] = func
        return GlobalVar(name, func_info(func))

    def global_var(self, name: str) -> GlobalVar:
        if name not in self._funcs:
            raise WellFormedError(f"no function @{name} in the module")
        return GlobalVar(name, func_info(self._funcs[name]))

    def fresh_global_name(self, hint: str) -> str:
        """A global name not yet used, derived from ``hint`` (``add``, ``add1``, ...)."""
        if hint not in self._funcs:
            return hint
        i = 1
        while f"{hint}{i}" in self._funcs:
            i += 1
        return f"{hint}{i}"

    def get(self) -> IRModule:
        if self._func is not None:
            raise WellFormedError(f"function @{self._func.name} is still being built")
        return IRModule(self._funcs, self._mod_attrs)

    # -- function scope -------------------------------------------------------------------

    @contextmanager
    def function(
        self,
        name: str,
        params: Sequence[Var],
        attrs: Mapping[str, Any] | None = None,
        pure: bool = True,
    ) -> Iterator[None]:
        """Build a function body; end it with ``emit_func_output`` inside the ``with``."""
        if self._func is not None:
            raise WellFormedError("functions cannot be nested; finish the current one first")
        for p in params:
            if isinstance(p, DataflowVar) or not isinstance(p, Var):
                raise WellFormedError(f"parameter {p!r} must be a Var")
        self._func = _FuncScope(name, tuple(params), Attrs(attrs or {}), pure)
        self._func.names.update(p.name for p in params)
        frame = _Frame()
        for p in params:
            frame.sym_defined.update(I.defined_vars(p.info))
        self._frames = [frame]
        try:
            yield
            if self._func.result is None:
                raise WellFormedError(f"function @{name} has no output: call emit_func_output")
            self._funcs[name] = self._func.result
        finally:
            self._func = None
            self._frames = []

    def emit_func_output(self, output: Expr | Sequence[Expr], ret_info: StructInfo | None = None) -> GlobalVar:
        scope = self._scope()
        frame = self._frames[-1]
        if frame.dataflow:
            raise WellFormedError("emit_func_output inside a dataflow block; leave the block first")
        out = self._leaf(self._tuple_of(output))
        leaked = [f for f in (out.fields if isinstance(out, Tuple) else (out,)) if isinstance(f, DataflowVar)]
        if leaked:
            raise WellFormedError(f"%{leaked[0].name} is local to a dataflow block; bind it with emit_output to return it")
        frame.flush()
        param_vars: set[SymVar] = set()
        for p in scope.params:
            param_vars.update(I.free_vars(p.info))
        inferred = I.erase(out.info, lambda v: v in param_vars)
        if ret_info is not None:
            if I.base_check(ret_info, out.info) is I.Check.FAIL:
                raise ShapeError(f"@{scope.name}: declared return {ret_info} does not hold for {out.info}")
            inferred = ret_info
        body = SeqExpr(tuple(frame.blocks), out, inferred)
        scope.result = GraphFunc(scope.params, body, inferred, scope.attrs, scope.pure)
        return GlobalVar(scope.name, scope.result.info)

    @contextmanager
    def dataflow(self) -> Iterator[None]:
        """A dataflow block: pure bindings; values escape only through ``emit_output``."""
        frame = self._frames[-1] if self._frames else None
        if frame is None:
            raise WellFormedError("dataflow() outside a function")
        if frame.dataflow:
            raise WellFormedError("dataflow blocks cannot be nested")
        frame.flush()
        frame.dataflow = True
        try:
            yield
        finally:
            frame.flush()
            frame.dataflow = False

    # -- emitting bindings ----------------------------------------------------------------

    def emit(self, expr: Expr, name: str | None = None) -> Var:
        """Bind ``expr`` (normalized) to a new var: a DataflowVar inside a dataflow block."""
        value = self.normalize(expr)
        frame = self._frames[-1]
        self._check_purity(value)
        cls = DataflowVar if frame.dataflow else Var
        var = cls(self._name(name, "lv" if frame.dataflow else "v"), value.info)
        frame.current.append(Binding(var, value))
        self.emitted += 1
        return var

    def emit_output(self, expr: Expr, name: str | None = None) -> Var:
        """Inside a dataflow block, bind ``expr`` to a var that is visible after the block."""
        frame = self._frames[-1]
        if not frame.dataflow:
            raise WellFormedError("emit_output is only valid inside a dataflow block")
        value = self.normalize(expr)
        var = Var(self._name(name, "gv"), value.info)
        frame.current.append(Binding(var, value))
        self.emitted += 1
        return var

    def match_cast(self, expr: Expr, info: StructInfo, name: str | None = None, output: bool = False) -> Var:
        """Bind ``expr`` asserting ``info`` at run time; bare sym vars of ``info`` seen here first
        are defined by the match (their values come from the run-time shape). Inside a dataflow
        block, ``output=True`` binds a var visible after the block (as ``emit_output`` does)."""
        value = self._leaf(self.normalize(expr))
        if I.base_check(info, value.info) is I.Check.FAIL:
            raise ShapeError(f"match_cast of {value.info} to {info} can never succeed")
        frame = self._frames[-1]
        if output and not frame.dataflow:
            raise WellFormedError("match_cast(output=True) is only valid inside a dataflow block")
        local = frame.dataflow and not output
        var = (DataflowVar if local else Var)(self._name(name, "lv" if local else "gv" if output else "v"), info)
        frame.current.append(MatchCast(var, value, info))
        self.emitted += 1
        frame.sym_defined.update(I.defined_vars(info))
        return var

    def emit_if(
        self,
        cond: Expr,
        then_fn: Callable[[], Expr],
        else_fn: Callable[[], Expr],
        name: str | None = None,
    ) -> Var:
        """``name = then_fn() if cond else else_fn()``; each callable emits its branch's bindings
        through this builder and returns the branch value."""
        frame = self._frames[-1]
        if frame.dataflow:
            raise WellFormedError("If is control flow and cannot appear inside a dataflow block")
        c = self._leaf(self.normalize(cond))
        then_branch = self._branch(then_fn)
        else_branch = self._branch(else_fn)
        return self.emit(If(c, then_branch, else_branch), name)

    def _branch(self, fn: Callable[[], Expr]) -> SeqExpr:
        outer = self._frames[-1]
        frame = _Frame(sym_defined=set(outer.sym_defined))
        self._frames.append(frame)
        try:
            out = self._leaf(self.normalize(fn()))
            frame.flush()
        finally:
            self._frames.pop()
        visible = outer.sym_defined
        return SeqExpr(tuple(frame.blocks), out, I.erase(out.info, lambda v: v in visible))

    # -- normalization --------------------------------------------------------------------

    def normalize(self, expr: Expr) -> Expr:
        """``expr`` with struct info filled in and non-leaf arguments emitted as bindings."""
        if isinstance(expr, Var):
            return expr
        if isinstance(expr, Call):
            callee = self._leaf(self.normalize(expr.callee))
            args = tuple(self._leaf(self.normalize(a)) for a in expr.args)
            call = Call(callee, args, expr.attrs, expr.sinfo_args)
            return Call(callee, args, expr.attrs, expr.sinfo_args, self.infer_call(call))
        if isinstance(expr, Tuple):
            fields = tuple(self._leaf(self.normalize(f)) for f in expr.fields)
            return Tuple(fields, TupleInfo(tuple(f.info for f in fields)))
        if isinstance(expr, TupleGetItem):
            tup = self._leaf(self.normalize(expr.tuple_value))
            return TupleGetItem(tup, expr.index, _field_info(tup.info, expr.index))
        if isinstance(expr, If):
            return If(expr.cond, expr.then_branch, expr.else_branch, I.lca(expr.then_branch.info, expr.else_branch.info))
        if isinstance(expr, GlobalVar):
            if isinstance(expr.info, AnyInfo) and expr.name in self._funcs:
                return GlobalVar(expr.name, func_info(self._funcs[expr.name]))
            return expr
        if isinstance(expr, Constant) and isinstance(expr.info, AnyInfo):
            return Constant.of(expr.data, name=expr.name)
        if isinstance(expr, ShapeExpr) and isinstance(expr.info, AnyInfo):
            return ShapeExpr.of(expr.values)
        if isinstance(expr, PrimValue) and isinstance(expr.info, AnyInfo):
            return PrimValue.of(expr.value)
        if isinstance(expr, StringImm) and isinstance(expr.info, AnyInfo):
            return StringImm(expr.value, AnyInfo())
        return expr

    def _leaf(self, e: Expr) -> Expr:
        if is_leaf(e):
            return e
        return self.emit(e)

    def _tuple_of(self, output: Expr | Sequence[Expr]) -> Expr:
        if isinstance(output, Expr):
            return self.normalize(output)
        return self.normalize(Tuple(tuple(output)))

    def infer_call(self, call: Call) -> StructInfo:
        """The struct info of a call whose arguments are normalized."""
        callee = call.callee
        if isinstance(callee, OpRef):
            info, _ = opdef.infer_with_checks(call)
            return info
        finfo = callee.info
        if isinstance(callee, GlobalVar) and callee.name in self._funcs:
            finfo = func_info(self._funcs[callee.name])
        if not isinstance(finfo, FuncInfo):
            raise InferenceError(f"calling {callee!r}, which is not a function ({finfo})")
        return infer_func_call(finfo, call.args, _callee_name(callee))

    def _check_purity(self, value: Expr) -> None:
        frame = self._frames[-1]
        if not isinstance(value, Call):
            return
        if is_pure_call(value, self._funcs):
            return
        if frame.dataflow:
            raise WellFormedError(f"impure call {_callee_name(value.callee)} inside a dataflow block")
        if self._func is not None and self._func.pure:
            self._func.pure = False

    # -- helpers --------------------------------------------------------------------------

    def _scope(self) -> _FuncScope:
        if self._func is None:
            raise WellFormedError("not inside a function")
        return self._func

    def _name(self, name: str | None, prefix: str) -> str:
        scope = self._scope()
        base = name or prefix
        if base not in scope.names and name is not None:
            scope.names.add(base)
            return base
        i = 0 if name is None else 1
        while f"{base}{i}" in scope.names:
            i += 1
        scope.names.add(f"{base}{i}")
        return f"{base}{i}"

    def defined_sym_vars(self) -> set[SymVar]:
        return set(self._frames[-1].sym_defined) if self._frames else set()


def _callee_name(callee: Expr) -> str:
    if isinstance(callee, (GlobalVar, OpRef)):
        return f"@{callee.name}" if isinstance(callee, GlobalVar) else callee.name
    if isinstance(callee, ExternFunc):
        return callee.symbol
    if isinstance(callee, Var):
        return f"%{callee.name}"
    return type(callee).__name__


def is_pure_call(call: Call, funcs: Mapping[str, Function] | None = None) -> bool:
    callee = call.callee
    if isinstance(callee, OpRef):
        op = opdef.get(callee.name)
        if callee.name == "call_packed":
            return bool(call.attrs.get("pure", False))
        return op.pure
    info = callee.info
    if isinstance(callee, GlobalVar) and funcs is not None and callee.name in funcs:
        info = func_info(funcs[callee.name])
    return isinstance(info, FuncInfo) and info.pure


def _field_info(info: StructInfo, index: int) -> StructInfo:
    if isinstance(info, TupleInfo):
        if not 0 <= index < len(info.fields):
            raise InferenceError(f"tuple index {index} out of range for a tuple of {len(info.fields)}")
        return info.fields[index]
    if isinstance(info, AnyInfo):
        return AnyInfo()
    raise InferenceError(f"indexing a value that is not a tuple ({info})")


# -- calls of functions: unify param dims with argument dims ------------------------------


def _unify_dims(p: Dim, a: Dim, mapping: dict[SymVar, Dim]) -> None:
    if isinstance(p, SymVar) and p not in mapping:
        mapping[p] = a


def _unify(param: StructInfo, arg: StructInfo, mapping: dict[SymVar, Dim]) -> None:
    """Bind the bare sym vars of ``param`` to the corresponding dims of ``arg``."""
    if isinstance(param, TensorInfo) and isinstance(arg, TensorInfo):
        if param.shape is not None and arg.shape is not None and len(param.shape) == len(arg.shape):
            for p, a in zip(param.shape, arg.shape):
                _unify_dims(p, a, mapping)
    elif isinstance(param, ShapeInfo) and isinstance(arg, ShapeInfo):
        if param.values is not None and arg.values is not None and len(param.values) == len(arg.values):
            for p, a in zip(param.values, arg.values):
                _unify_dims(p, a, mapping)
    elif isinstance(param, PrimInfo) and isinstance(arg, PrimInfo):
        if param.value is not None and arg.value is not None:
            _unify_dims(param.value, arg.value, mapping)
    elif isinstance(param, TupleInfo) and isinstance(arg, TupleInfo):
        for pf, af in zip(param.fields, arg.fields):
            _unify(pf, af, mapping)


def infer_func_call(finfo: FuncInfo, args: Sequence[Expr], name: str) -> StructInfo:
    if finfo.params is None:
        return I.erase(finfo.ret, lambda v: False)
    if len(finfo.params) != len(args):
        raise InferenceError(f"{name} takes {len(finfo.params)} argument(s), got {len(args)}")
    mapping: dict[SymVar, Dim] = {}
    for p, a in zip(finfo.params, args):
        _unify(p, a.info, mapping)
    for i, (p, a) in enumerate(zip(finfo.params, args)):
        expected = I.substitute(p, mapping)
        if I.base_check(expected, a.info) is I.Check.FAIL:
            raise ShapeError(f"{name}: argument {i} has {a.info} but the parameter expects {expected}")
    ret = I.substitute(finfo.ret, mapping)
    own: set[SymVar] = set()
    for p in finfo.params:
        own.update(I.free_vars(p))
    own.update(I.free_vars(finfo.ret))
    unbound = own - set(mapping)
    return I.erase(ret, lambda v: v not in unbound) if unbound else ret


__all__ = ["BlockBuilder", "is_leaf", "is_pure_call", "infer_func_call"]

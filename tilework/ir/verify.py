"""The well-formedness checker.

``check(mod)`` returns every broken rule as a ``Diagnostic``; ``verify(mod)`` raises one
``WellFormedError`` that lists them all, each shown in its function with the offending binding
(or loop statement) marked. The checker only reads: it fixes nothing and assumes nothing.
This module walks the graph functions; the rules and ``Diagnostic`` are in
``tilework.ir.verify_base``, the walk of a TensorFunc (rule 9) in ``tilework.ir.verify_loop``.

The rules (``Diagnostic.rule`` names them):

1. ``var-def``: a Var is defined once in the module, before use, and used only in its own
   function (and If branch).
2. ``sym-def``: a sym var is defined before use, by a bare dim of a param's struct info or an
   earlier match_cast; a return or SeqExpr info mentions only sym vars visible outside it.
3. ``dataflow``: DataflowVars are bound only in dataflow blocks, never escape them, and are not params.
4. ``anf``: callees, arguments, tuple fields, TupleGetItem's tuple, If's cond, match_cast's value
   and SeqExpr results are leaves; If branches are SeqExprs; no If in a dataflow block.
5. ``purity``: no impure call inside a dataflow block or in a function marked pure.
6. ``struct-info``: compound expressions, constants, shapes and prim values carry the info the
   builder computes (or a base of it: an annotation may widen, a claim needs a match_cast); a
   binding's var info is a base of its value's.
7. ``global``: GlobalVars name functions of the module; callees have the right kind and arity;
   op names are registered.
8. ``ret-info``: a function's ret_info is a base of its body's info.
9. ``loop``: in a TensorFunc, buffers and sym vars are in scope, loop vars bound once, index
   counts match ranks, and kinds and op names are valid.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from tilework.errors import TileworkError, WellFormedError
from tilework.ir import info as I
from tilework.ir import loop as L
from tilework.ir import sym
from tilework.ir.builder import infer_func_call, is_leaf, is_pure_call
from tilework.ir.graph import (
    AnyBinding,
    Binding,
    BindingBlock,
    Call,
    Constant,
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
from tilework.ir.dtype import is_float_dtype
from tilework.ir.info import AnyInfo, Check, FuncInfo, PrimInfo, ShapeInfo, StructInfo, TensorInfo, TupleInfo
from tilework.ir.module import Function, IRModule, func_info
from tilework.ir.sym import Dim, SymExpr, SymVar
from tilework.ir.opdef import infer_with_checks
from tilework.ir.opdef import lookup as lookup_op
from tilework.ir.visitor import ExprVisitor
from tilework.ir.verify_base import RULES, Checker, Diagnostic, dims_syms
from tilework.ir.verify_loop import LoopCheck
from tilework.ir.verify_render import _callee_str, _expr_str, _info_str, _shape_str


class Checked:
    """What a run of checks found well-formed, so that checking it again costs nothing: a
    pipeline verifies its module after every pass (``tilework.transform.base.Pipeline``, one
    ``Checked`` a run), and most passes leave most of it as it was (the kernels of a batch of
    torch ops, each checked after every later pass, took a third of the verifier's time; their
    graph, unchanged by the kernel passes, most of the rest).

    - TensorFuncs by identity (each kept alive here, so that its id is not reused): a
      TensorFunc is immutable and its check reads nothing outside it.
    - A module's graph functions by its interface (``_interface``): every GraphFunc and
      ExternFunc by identity, each TensorFunc by what a call of it is checked against. Their
      checks read nothing else of the module.

    It keeps what it holds alive (at most ``KEPT`` of each): it lives as long as the run."""

    KEPT = 4096

    def __init__(self) -> None:
        self.loops: dict[int, L.TensorFunc] = {}
        self.graphs: dict[tuple[Any, ...], list[Function]] = {}

    @staticmethod
    def remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
        if len(memo) >= Checked.KEPT:
            memo.clear()
        memo[key] = value


def _interface(mod: IRModule) -> tuple[tuple[Any, ...], list[Function]]:
    """What the checks of ``mod``'s graph functions read of it: each function's name and
    kind, a GraphFunc or ExternFunc itself (by identity: the functions are returned to be
    kept alive), a TensorFunc's input, sym param and output counts."""
    key: list[Any] = []
    kept: list[Function] = []
    for name, f in mod.items():
        if isinstance(f, L.TensorFunc):
            key.append((name, "tensor", len(f.inputs), len(f.sym_params), f.num_outputs))
        else:
            key.append((name, type(f).__name__, id(f)))
            kept.append(f)
    return tuple(key), kept


def check(mod: IRModule, checked: Checked | None = None) -> list[Diagnostic]:
    """Every well-formedness problem of ``mod``, in module order, then program order. With
    ``checked``, what it found well-formed before is not walked again, and what is found
    well-formed now is added to it."""
    out: list[Diagnostic] = []
    interface, kept = _interface(mod) if checked is not None else ((), [])
    graphs_clean = checked is not None and interface in checked.graphs
    owners: dict[Var, str] = {}
    if not graphs_clean:
        for name, f in mod.items():
            if isinstance(f, GraphFunc):
                for v in _defined_vars(f):
                    owners.setdefault(v, name)
    seen: dict[Var, str] = {}
    graph_problems = 0
    for name, f in mod.items():
        if isinstance(f, GraphFunc):
            if not graphs_clean:
                found = len(out)
                _GraphCheck(mod, name, f, owners, seen, out).run()
                graph_problems += len(out) - found
        elif isinstance(f, L.TensorFunc):
            if checked is None or checked.loops.get(id(f)) is not f:
                found = len(out)
                LoopCheck(name, f, out).run()
                if checked is not None and len(out) == found:
                    checked.remember(checked.loops, id(f), f)
        elif not isinstance(f, ExternFunc):
            msg = f"@{name} is a {type(f).__name__}, not a GraphFunc, TensorFunc or ExternFunc"
            out.append(Diagnostic("global", name, msg, f"  @{name} = {type(f).__name__}"))
    if checked is not None and not graphs_clean and not graph_problems:
        checked.remember(checked.graphs, interface, kept)
    return out


def verify(mod: IRModule, checked: Checked | None = None) -> None:
    """Raise ``WellFormedError`` listing every problem of ``mod``; return quietly if none
    (``checked``: see ``check``)."""
    if not isinstance(mod, IRModule):
        raise WellFormedError(f"verify expects an IRModule, got {type(mod).__name__}")
    diags = check(mod, checked)
    if not diags:
        return
    head = f"the module is not well-formed: {len(diags)} problem{'s' if len(diags) > 1 else ''}"
    raise WellFormedError(head + "\n\n" + "\n\n".join(str(d) for d in diags))


def _defined_vars(f: GraphFunc) -> Iterable[Var]:
    yield from f.params
    yield from (b.var for b in _bindings(f.body))


def _bindings(seq: object) -> Iterable[AnyBinding]:
    """Every binding of ``seq`` and its If branches, tolerating malformed nesting."""
    if not isinstance(seq, SeqExpr):
        return
    for block in seq.blocks:
        for b in getattr(block, "bindings", ()):
            if not isinstance(b, (Binding, MatchCast)):
                continue
            yield b
            if isinstance(b.value, If):
                yield from _bindings(b.value.then_branch)
                yield from _bindings(b.value.else_branch)


def _info_syms(info: StructInfo) -> tuple[SymVar, ...]:
    """Sym vars an info uses; a function signature binds its own dims, so FuncInfo has none."""
    if isinstance(info, FuncInfo):
        return ()
    if isinstance(info, TupleInfo):
        out: dict[SymVar, None] = {}
        for f in info.fields:
            out.update(dict.fromkeys(_info_syms(f)))
        return tuple(out)
    return I.free_vars(info)


# -- the graph level ----------------------------------------------------------------------


class _GraphCheck(Checker, ExprVisitor):
    """Walks one GraphFunc in program order, tracking the vars and sym vars in scope."""

    def __init__(
        self, mod: IRModule, name: str, func: GraphFunc, owners: dict[Var, str], seen: dict[Var, str], out: list[Diagnostic]
    ) -> None:
        super().__init__(name, func, out)
        self.mod, self.gfunc = mod, func
        self.owners = owners  # var -> the first function that defines it
        self.seen = seen  # var -> its first definition, module-wide
        self.vars: set[Var] = set()
        self.syms: set[SymVar] = set()
        self.gone: dict[Var, tuple[str, str]] = {}  # out of scope here: (rule, why)
        self.gone_syms: dict[SymVar, str] = {}
        self.mine = set(_defined_vars(func))
        self.cast_syms: dict[SymVar, Var] = {}  # sym var -> the first match_cast defining it
        for b in _bindings(func.body):
            if isinstance(b, MatchCast):
                for v in I.defined_vars(b.cast_info):
                    self.cast_syms.setdefault(v, b.var)
        self.dataflow = False
        self.where: AnyBinding | None = None  # the binding being checked; None: the signature
        self.info_flagged: set[int] = set()  # bindings with a struct-info problem reported

    def bad(self, rule: str, message: str, once: object = None) -> None:
        if rule == "struct-info":
            self.info_flagged.add(id(self.where))
        self.emit(rule, message, self.where, once)

    def here(self) -> str:
        return "the function's result" if self.where is None else f"the value of %{self.where.var.name}"

    def run(self) -> None:
        f = self.gfunc
        for p in f.params:
            if isinstance(p, DataflowVar):
                self.bad("dataflow", f"param %{p.name} is a DataflowVar: params must be plain Vars")
            self.define(p, "a param")
        params = [p for p in f.params if isinstance(p, Var)]
        for p in params:
            self.syms.update(I.defined_vars(p.info))
        for p in params:
            self.use_syms(_info_syms(p.info), f"param %{p.name}'s struct info")
        hint = "no param defines it: the return info may mention only sym vars that the params define; erase the others"
        self.use_syms(_info_syms(f.ret_info), "the return info", hint)
        if not isinstance(f.body, SeqExpr):
            self.bad("anf", f"the body is a {type(f.body).__name__}, not a SeqExpr")
            return
        self.seq(f.body, "the function body")
        if I.base_check(f.ret_info, f.body.info) is not Check.PASS:
            msg = f"ret_info {_info_str(f.ret_info)} is not a base of the body's info {_info_str(f.body.info)}"
            self.bad("ret-info", msg + ": widen ret_info, or match_cast the result to it before returning")

    # -- scopes ---------------------------------------------------------------------------

    def define(self, var: object, how: str) -> None:
        if not isinstance(var, Var):
            self.bad("var-def", f"{how} binds a {type(var).__name__}, not a Var")
            return
        first = self.seen.get(var)
        if first is not None:
            msg = f"%{var.name} is defined twice (first as {first}): every var is bound exactly once in the module"
            self.bad("var-def", msg + "; bind a new Var here")
        else:
            self.seen[var] = f"{how} of @{self.name}"
        self.vars.add(var)
        self.gone.pop(var, None)

    def use(self, var: Var) -> None:
        if var in self.vars:
            return
        at, once = self.here(), ("var", var)
        if var in self.gone:
            rule, why = self.gone[var]
            self.bad(rule, f"%{var.name} is used in {at} but {why}", once)
            return
        owner = self.owners.get(var)
        if var in self.mine:
            why = f"before its definition: move the binding of %{var.name} before this use"
        elif owner is not None:
            why = f"but it belongs to @{owner}: a var is visible only in its own function; pass the value as an argument"
        else:
            why = "but it is never defined: make it a param or bind it before this use"
        self.bad("var-def", f"%{var.name} is used in {at} {why}", once)

    def use_syms(self, used: Iterable[SymVar], what: str, hint: str | None = None) -> None:
        """Report each of ``used`` not in scope; ``hint`` replaces the usual explanation."""
        for v in used:
            if v in self.syms:
                continue
            if hint is not None:
                msg = f"sym var {v.name} is used in {what}, but {hint}"
            elif v in self.gone_syms:
                msg = f"sym var {v.name} is used in {what} but {self.gone_syms[v]}"
            elif v in self.cast_syms:
                cast = f"the match_cast of %{self.cast_syms[v].name}"
                msg = f"sym var {v.name} is used in {what} before {cast} defines it: move that match_cast before this use"
            else:
                fix = f"add a param whose shape has {v.name} as a dim, or a match_cast that binds it"
                msg = f"sym var {v.name} is used in {what} but never defined: {fix}"
            self.bad("sym-def", msg, ("sym", v))

    # -- blocks and bindings --------------------------------------------------------------

    def seq(self, s: SeqExpr, kind: str) -> None:
        owner = self.where
        outer_vars, outer_syms = set(self.vars), set(self.syms)
        for block in s.blocks:
            self.block(block)
        self.where = owner
        if not is_leaf(s.body):
            self.bad("anf", f"the result of {kind} is a {type(s.body).__name__}, not a leaf: bind it to a var first")
        self.visit(s.body)
        self.seq_info(s, kind, outer_syms)
        for v in self.vars - outer_vars:
            self.gone[v] = ("var-def", "it is defined inside an If branch, which is not visible after the If")
        for sv in self.syms - outer_syms:
            self.gone_syms[sv] = "it is bound by a match_cast inside an If branch, which is not visible after the If"
        self.vars, self.syms = outer_vars, outer_syms

    def seq_info(self, s: SeqExpr, kind: str, outer_syms: set[SymVar]) -> None:
        info, result = s.info, s.body.info
        declared_any = kind == "the function body" and isinstance(self.gfunc.ret_info, AnyInfo)
        if isinstance(info, AnyInfo) and not isinstance(result, AnyInfo) and not declared_any:
            self.bad("struct-info", f"{kind} has no struct info but its result has {_info_str(result)}")
        elif I.base_check(info, result) is Check.FAIL:
            self.bad("struct-info", f"{kind} has struct info {_info_str(info)} but its result has {_info_str(result)}")
        for v in _info_syms(info):
            if v in self.syms and v not in outer_syms:
                msg = f"the struct info of {kind} mentions sym var {v.name}, which is defined only inside it"
                self.bad("sym-def", msg + ": erase it (tilework.ir.info.erase) so the info holds outside", ("in", v, id(s)))
        self.use_syms([v for v in _info_syms(info) if v not in self.syms], f"the struct info of {kind}")

    def block(self, block: BindingBlock) -> None:
        if not isinstance(block, BindingBlock):
            self.bad("anf", f"a SeqExpr holds a {type(block).__name__} where a binding block belongs")
            return
        self.dataflow = block.is_dataflow
        for b in block.bindings:
            self.binding(b)
        if block.is_dataflow:
            why = (
                "it is a DataflowVar of an earlier dataflow block, and only non-dataflow vars escape "
                "a block: bind the value to a Var (emit_output) inside the block"
            )
            for b in block.bindings:
                if isinstance(b, (Binding, MatchCast)) and isinstance(b.var, DataflowVar) and b.var in self.vars:
                    self.vars.discard(b.var)
                    self.gone[b.var] = ("dataflow", why)
        self.dataflow = False

    def binding(self, b: AnyBinding) -> None:
        if not isinstance(b, (Binding, MatchCast)) or not isinstance(b.var, Var):
            self.bad("anf", f"a binding block holds {b!r}, not a Binding or MatchCast of a Var")
            return
        self.where = b
        name = f"%{b.var.name}"
        if isinstance(b.value, SeqExpr):
            self.bad("anf", f"{name} is bound to a SeqExpr: only function bodies and If branches are SeqExprs")
        self.visit(b.value)
        if isinstance(b, MatchCast):
            if not is_leaf(b.value):
                self.bad("anf", f"the match_cast of {name} casts a {type(b.value).__name__}, not a leaf: bind it first")
            for v in I.defined_vars(b.cast_info):
                self.syms.add(v)
                self.gone_syms.pop(v, None)
            self.use_syms(_info_syms(b.cast_info), f"the match_cast of {name}")
        self.use_syms(_info_syms(b.var.info), f"{name}'s struct info")
        self.binding_info(b, name)
        if isinstance(b.var, DataflowVar) and not self.dataflow:
            self.bad("dataflow", f"{name} is a DataflowVar bound outside a dataflow block: bind a plain Var")
        self.define(b.var, "a binding")

    def binding_info(self, b: AnyBinding, name: str) -> None:
        # the infos are rendered only for a message: rendering each binding's would cost more than the checks
        if isinstance(b, MatchCast):
            if I.base_check(b.cast_info, b.value.info) is Check.FAIL:
                msg = f"the match_cast of {name} can never succeed: the value has {_info_str(b.value.info)}, the cast asks for {_info_str(b.cast_info)}"
                self.bad("struct-info", msg)
            if I.base_check(b.var.info, b.cast_info) is not Check.PASS:
                msg = f"{name} has struct info {_info_str(b.var.info)} but its match_cast gives {_info_str(b.cast_info)}: the var takes the cast info"
                self.bad("struct-info", msg)
            return
        if isinstance(b.value.info, AnyInfo) and id(b) in self.info_flagged:
            return  # the value's missing info is already reported
        if isinstance(b.var.info, AnyInfo) and not isinstance(b.value.info, AnyInfo):
            self.bad("struct-info", f"{name} has no struct info but its value has {_info_str(b.value.info)}: give the var its value's info")
        elif I.base_check(b.var.info, b.value.info) is not Check.PASS:
            msg = f"{name} is declared {_info_str(b.var.info)} but its value has {_info_str(b.value.info)}: a binding's var info must be a base of its value's"
            self.bad("struct-info", msg + "; use match_cast to assert a narrower info")

    # -- expressions ----------------------------------------------------------------------

    # ExprVisitor.visit sends each node of a value to its check below.

    def visit_var(self, e: Var) -> None:
        self.use(e)

    def visit_global_var(self, e: GlobalVar) -> None:
        if e.name not in self.mod:
            known = ", ".join(f"@{n}" for n in self.mod) or "none"
            msg = f"@{e.name} is not a function of the module (it has: {known}): add it or fix the name"
            self.bad("global", msg, ("global", e.name))

    def visit_op_ref(self, e: OpRef) -> None:
        if lookup_op(e.name) is None:
            msg = f"op {e.name!r} is not registered: fix the name, or import the op family that defines it"
            self.bad("global", msg, ("op", e.name))

    def visit_seq_expr(self, e: SeqExpr) -> None:
        self.seq(e, "a nested SeqExpr")

    def visit_other(self, e: Any) -> None:
        self.bad("anf", f"{self.here()} holds a {type(e).__name__}, which is not a graph expression")

    def leaf(self, e: Expr, what: str) -> None:
        if not is_leaf(e):
            self.bad("anf", f"{what} in {self.here()} is a {type(e).__name__}, not a leaf: bind it to a var first")

    def consistent(self, what: str, recorded: StructInfo, expected: StructInfo) -> None:
        if isinstance(recorded, AnyInfo) and not isinstance(expected, AnyInfo):
            msg = f"{what} in {self.here()} has no struct info (the builder gives {_info_str(expected)})"
            self.bad("struct-info", msg + ": build it with BlockBuilder.normalize")
            return
        check = I.base_check(recorded, expected)
        if check is Check.FAIL:
            self.bad("struct-info", f"{what} in {self.here()} has struct info {_info_str(recorded)}, but its parts give {_info_str(expected)}")
        elif check is Check.RUNTIME and _claims_dims(recorded, expected):
            msg = f"{what} in {self.here()} has struct info {_info_str(recorded)}, but its parts give {_info_str(expected)}, which it is not provably a base of"
            self.bad("struct-info", msg + f" (an annotation may widen a value's info, not narrow it): to claim {_info_str(recorded)}, bind the value as it is and match_cast it")

    def leaf_info(self, e: Constant | ShapeExpr | PrimValue) -> None:
        """A constant's info is its data's shape and dtype, a shape's its values, a prim value's
        a PrimInfo whose dtype fits the value (and whose symbolic value, if any, equals it)."""
        info, at = e.info, self.here()
        if isinstance(e, Constant):
            data = np.asarray(e.data)
            expected = TensorInfo(tuple(int(d) for d in data.shape), str(data.dtype))
            if info != expected:
                msg = f"a constant in {at} has struct info {_info_str(info)} but its data is {_info_str(expected)}"
                self.bad("struct-info", msg + ": build it with Constant.of(data)")
            return
        if isinstance(e, ShapeExpr):
            self.use_syms(dims_syms(e.values), at)
            if not (isinstance(info, ShapeInfo) and info.values is not None and sym.prove_dims_eq(info.values, e.values)):
                msg = f"{_shape_str(e.values)} in {at} has struct info {_info_str(info)}"
                self.bad("struct-info", msg + ": a ShapeExpr's info is ShapeInfo of its values (ShapeExpr.of)")
            return
        self.use_syms(dims_syms([e.value]), at)
        if not (isinstance(info, PrimInfo) and _prim_fits(info, e.value)):
            self.bad("struct-info", f"the prim value {e.value} in {at} has struct info {_info_str(info)}: use PrimValue.of(value)")

    visit_constant = visit_shape_expr = visit_prim_value = leaf_info

    def visit_tuple(self, e: Tuple) -> None:
        for i, f in enumerate(e.fields):
            self.leaf(f, f"tuple field {i}")
            self.visit(f)
        self.consistent(f"a tuple of {len(e.fields)}", e.info, TupleInfo(tuple(f.info for f in e.fields)))

    def visit_tuple_get_item(self, e: TupleGetItem) -> None:
        self.leaf(e.tuple_value, "the tuple of a TupleGetItem")
        self.visit(e.tuple_value)
        t = e.tuple_value.info
        if isinstance(t, AnyInfo):
            return
        if not isinstance(t, TupleInfo):
            self.bad("struct-info", f"{self.here()} indexes a value of struct info {_info_str(t)}, not a tuple")
        elif not 0 <= e.index < len(t.fields):
            self.bad("struct-info", f"{self.here()} takes item {e.index} of a tuple of {len(t.fields)}")
        else:
            self.consistent(f"item {e.index}", e.info, t.fields[e.index])

    def visit_if(self, e: If) -> None:
        if self.dataflow:
            self.bad("anf", "an If inside a dataflow block: control flow belongs in a plain binding block")
        self.leaf(e.cond, "the If's condition")
        self.visit(e.cond)
        outer_df, infos = self.dataflow, []
        for kind, br in (("then", e.then_branch), ("else", e.else_branch)):
            if not isinstance(br, SeqExpr):
                self.bad("anf", f"the If's {kind} branch is a {type(br).__name__}, not a SeqExpr")
                continue
            self.dataflow = False
            self.seq(br, f"the If's {kind} branch")
            infos.append(br.info)
        self.dataflow = outer_df
        if len(infos) == 2:
            self.consistent("the If", e.info, I.lca(infos[0], infos[1]))
        self.use_syms(_info_syms(e.info), self.here())

    def visit_call(self, e: Call) -> None:
        callee = _callee_str(e)
        self.leaf(e.callee, "the callee")
        for i, a in enumerate(e.args):
            self.leaf(a, f"argument {i} of {callee}")
        for x in (e.callee, *e.args):
            self.visit(x)
        for s in e.sinfo_args:
            self.use_syms(_info_syms(s), self.here())
        self.callee_kind(e)
        self.purity(e, callee)
        inferred = self.infer(e, callee)
        if inferred is not None:
            self.consistent(f"the call of {callee}", e.info, inferred)
        self.use_syms(_info_syms(e.info), self.here())

    def callee_kind(self, e: Call) -> None:
        c = e.callee
        if isinstance(c, GlobalVar):
            # A direct kernel call (inputs, outputs, sym values) is the lowered, destination-passing
            # form that lower_calls produces; it writes its outputs, so not in a dataflow block.
            if isinstance(self.mod.get(c.name), L.TensorFunc) and self.dataflow:
                msg = f"@{c.name} is a TensorFunc called directly inside a dataflow block: use call_tensor(@{c.name}, args, out)"
                self.bad("global", msg)
            return
        if not isinstance(c, OpRef) or lookup_op(c.name) is None:
            return
        if c.name == "call_tensor":
            self.call_tensor(e)
            return
        if c.name not in ("call_lib", "call_packed"):
            return
        target = e.args[0] if e.args else None
        if isinstance(target, ExternFunc):
            return
        if isinstance(target, GlobalVar) and isinstance(self.mod.get(target.name), ExternFunc):
            return
        what = "nothing" if target is None else _expr_str(target)
        self.bad("global", f"{c.name} calls {what}, not an ExternFunc: pass ExternFunc(symbol)")

    def call_tensor(self, e: Call) -> None:
        """The callee is a TensorFunc, and the call passes one arg per input buffer, states one
        output info per output buffer and passes one sym arg per sym param."""
        if len(e.args) not in (2, 3):
            self.bad("global", f"call_tensor takes (callee, (args...)[, shape(sym_args)]), got {len(e.args)} arguments")
            return
        target = e.args[0]
        if not isinstance(target, GlobalVar):
            self.bad("global", f"call_tensor's callee is {_expr_str(target)}, not a GlobalVar naming a TensorFunc")
            return
        f, g = self.mod.get(target.name), f"@{target.name}"
        if f is None:
            return
        if not isinstance(f, L.TensorFunc):
            self.bad("global", f"call_tensor's callee {g} is a {type(f).__name__}, not a TensorFunc: call it directly")
            return
        n_sym = _count(e.args[2]) if len(e.args) == 3 else 0
        for what, n, params in (("input(s)", _count(e.args[1]), f.inputs), ("sym arg(s)", n_sym, f.sym_params)):
            if n is not None and n != len(params):
                names = ", ".join(p.name for p in params) or "none"
                self.bad("global", f"call_tensor passes {n} {what} but {g} takes {len(params)} ({names})")
        if len(e.sinfo_args) == 1:
            out = e.sinfo_args[0]
            n_out = len(out.fields) if isinstance(out, TupleInfo) else 1
            if n_out != f.num_outputs:
                self.bad("global", f"call_tensor states {n_out} output(s) but {g} writes {f.num_outputs}")

    def purity(self, e: Call, callee: str) -> None:
        c = e.callee
        if (isinstance(c, OpRef) and lookup_op(c.name) is None) or (isinstance(c, GlobalVar) and c.name not in self.mod):
            return  # reported as an unknown name
        if is_pure_call(e, self.mod):
            return
        if self.dataflow:
            self.bad("purity", f"impure call {callee} inside a dataflow block: move it to a plain binding block")
        if self.gfunc.pure:
            msg = f"@{self.name} is marked pure but calls impure {callee}: build it with pure=False"
            self.bad("purity", msg + " (the BlockBuilder clears the flag when it emits an impure call)")

    def infer(self, e: Call, callee: str) -> StructInfo | None:
        """What the builder would infer for ``e``, or None where it cannot say."""
        c = e.callee
        try:
            if isinstance(c, OpRef):
                if lookup_op(c.name) is None:
                    return None
                return infer_with_checks(e)[0]
            if isinstance(c, GlobalVar):
                f = self.mod.get(c.name)
                if f is None or isinstance(f, L.TensorFunc):
                    return None
                finfo = func_info(f)
                return infer_func_call(finfo, e.args, callee) if isinstance(finfo, FuncInfo) else None
            if isinstance(c.info, FuncInfo):
                return infer_func_call(c.info, e.args, callee)
        except TileworkError as err:
            self.bad("struct-info", f"the call of {callee} in {self.here()} does not type-check: {err}")
        return None


def _count(e: Expr) -> int | None:
    """How many values a tuple or shape argument holds, when that is known."""
    if isinstance(e, (Tuple, ShapeExpr)):
        return len(e.fields) if isinstance(e, Tuple) else len(e.values)
    if isinstance(e.info, TupleInfo):
        return len(e.info.fields)
    return e.info.ndim if isinstance(e.info, ShapeInfo) and e.info.ndim >= 0 else None


def _claims_dims(recorded: StructInfo, expected: StructInfo) -> bool:
    """Whether ``recorded`` states a dim that ``expected`` states otherwise, not provably the
    same (``(n, 5)`` for ``(n, m)``): a claim about the value, which only a match_cast checks.
    Filling in what ``expected`` leaves open (a shape for its ``ndim=2``, as lowering does) is
    no claim against it."""
    if isinstance(recorded, TupleInfo) and isinstance(expected, TupleInfo):
        return any(_claims_dims(r, e) for r, e in zip(recorded.fields, expected.fields))
    pairs: tuple[tuple[Dim, ...] | None, tuple[Dim, ...] | None] = (None, None)
    if isinstance(recorded, TensorInfo) and isinstance(expected, TensorInfo):
        pairs = (recorded.shape, expected.shape)
    elif isinstance(recorded, ShapeInfo) and isinstance(expected, ShapeInfo):
        pairs = (recorded.values, expected.values)
    elif isinstance(recorded, PrimInfo) and isinstance(expected, PrimInfo) and recorded.value is not None and expected.value is not None:
        pairs = ((recorded.value,), (expected.value,))
    r, e = pairs
    return r is not None and e is not None and len(r) == len(e) and not sym.prove_dims_eq(r, e)


def _prim_fits(info: PrimInfo, v: object) -> bool:
    if info.dtype is None:
        return False
    if isinstance(v, bool):
        return info.dtype == "bool"
    if isinstance(v, float):
        return is_float_dtype(info.dtype)
    if info.value is not None and isinstance(v, (int, SymExpr)):
        return sym.prove_eq(info.value, v)
    return True


__all__ = ["Diagnostic", "RULES", "check", "verify"]

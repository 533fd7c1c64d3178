"""lower_shapes: make every symbolic shape computation explicit over a shape heap.

Requires a module after ``to_non_dataflow`` and ``lower_calls``. For each graph function it
adds a shape heap (one int slot per sym var and per derived dim the function needs) and:

- at entry, checks each parameter's struct info and matches its dims: a sym var seen bare for
  the first time is stored (with its declared bounds checked), constants and known vars are
  asserted, derived dims (``n * 2``) are computed and asserted after every var is bound;
- precedes each ``match_cast`` with the same checks (the match_cast then only names the
  checked value and defines its sym vars; the VM runs it as an alias);
- replaces every symbolic ``ShapeExpr`` argument by ``vm_make_shape`` over the heap, computing
  derived dims with ``vm_shape_func`` just before their first use;
- turns ``assert_dims`` (facts that op inference could not prove) into ``vm_check_dims``;
- checks the return value when its struct info is not provable from the body.

Guarantees: no symbolic dim remains in a run-time value position; every failure names the
function, the argument, the dim and the sym var.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from tilework.errors import WellFormedError
from tilework.ir import info as I
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.graph import (
    EMPTY_ATTRS,
    AnyBinding,
    Attrs,
    Binding,
    BindingBlock,
    Call,
    Expr,
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
from tilework.ir.sym import Dim, SymVar
from tilework.op import base as opbase
from tilework.op.vm import ASSERT_IMM, ASSERT_SLOT, SKIP, STORE, dim_program
from tilework.transform.base import Pass

VOID = TupleInfo(())


def _vm_call(name: str, args: Sequence[Expr], info: StructInfo = VOID, **attrs: object) -> Call:
    op = opbase.get(name)
    full = {k: attrs.get(k, d) for k, d in op.attrs.items()}
    return Call(op.ref(), tuple(args), Attrs(full) if full else EMPTY_ATTRS, (), info)


@dataclass
class _Lowerer:
    fname: str
    slots: dict[object, int] = field(default_factory=dict)  # SymVar or derived Dim -> slot
    names: list[str] = field(default_factory=list)
    bounds: list[tuple[int, int | None]] = field(default_factory=list)
    stored: set[SymVar] = field(default_factory=set)
    computed: set[int] = field(default_factory=set)
    made: dict[tuple[Dim, ...], Var] = field(default_factory=dict)  # shape values made in scope
    loaded: dict[int, Var] = field(default_factory=dict)  # dims loaded in scope, by slot
    out: list[AnyBinding] = field(default_factory=list)
    counter: int = 0
    heap: Var = field(default_factory=lambda: Var("shape_heap", AnyInfo()))

    # -- slots ----------------------------------------------------------------------------

    def slot(self, key: Dim) -> int:
        s = self.slots.get(key)
        if s is None:
            s = len(self.names)
            self.slots[key] = s
            if isinstance(key, SymVar):
                self.names.append(key.name)
                self.bounds.append((key.lo, key.hi))
            else:
                self.names.append(sym.to_str(key))
                self.bounds.append((-(2**62), None))
        return s

    def emit(self, value: Call, info: StructInfo = VOID, name: str = "_") -> Var:
        self.counter += 1
        v = Var(f"{name}{self.counter}" if name == "_" else name, info)
        self.out.append(Binding(v, value))
        return v

    def ensure_dim(self, d: Dim) -> None:
        """Make the value of ``d`` available in the heap (computing derived dims)."""
        if isinstance(d, int):
            return
        for v in sym_walk.free_vars(d):
            if v not in self.stored:
                raise WellFormedError(
                    f"{self.fname}: sym var {v.name} is used before any parameter or match_cast binds it"
                )
        if isinstance(d, SymVar):
            return
        s = self.slot(d)
        if s in self.computed:
            return
        program = dim_program(d, self.slot)
        self.emit(_vm_call("vm_shape_func", [self.heap], slots=(s,), programs=(program,)))
        self.computed.add(s)

    def make_shape(self, values: Sequence[Dim]) -> Expr:
        if sym.is_static(values):
            return ShapeExpr(tuple(values), ShapeInfo(tuple(values)))
        known = self.made.get(tuple(values))
        if known is not None:
            return known  # one shape value per distinct shape in a scope
        codes: list[int] = []
        for d in values:
            self.ensure_dim(d)
            if isinstance(d, int):
                codes += [0, d]
            else:
                codes += [1, self.slot(d)]
        made = self.emit(_vm_call("vm_make_shape", [self.heap], ShapeInfo(tuple(values)), codes=tuple(codes)), ShapeInfo(tuple(values)), "shape")
        self.made[tuple(values)] = made
        return made

    # -- matching values against struct info ----------------------------------------------

    def match(self, value: Expr, info: StructInfo, where: str, label: str) -> list[tuple[Expr, Sequence[Dim], str]]:
        """Emit the checks of ``value`` against ``info``; return the dims to check after all
        vars are bound (derived ones)."""
        deferred: list[tuple[Expr, Sequence[Dim], str]] = []
        if isinstance(info, TensorInfo):
            self.emit(_vm_call("vm_check_tensor_info", [value], ndim=info.ndim, dtype=info.dtype, where=where))
            if info.shape is not None:
                deferred += self._match_dims(value, info.shape, where, f"{label}.shape")
        elif isinstance(info, ShapeInfo):
            self.emit(_vm_call("vm_check_shape_info", [value], ndim=info.ndim, where=where))
            if info.values is not None:
                deferred += self._match_dims(value, info.values, where, label)
        elif isinstance(info, PrimInfo):
            self.emit(_vm_call("vm_check_prim_info", [value], dtype=info.dtype, where=where))
            if info.value is not None and not isinstance(info.value, (float, bool)):
                deferred += self._match_dims(value, (info.value,), where, label)
        elif isinstance(info, TupleInfo):
            self.emit(_vm_call("vm_check_tuple_info", [value], size=len(info.fields), where=where))
            for i, f in enumerate(info.fields):
                if isinstance(f, AnyInfo):
                    continue
                item = Var(f"{label}_{i}", f)
                self.out.append(Binding(item, TupleGetItem(value, i, f)))
                deferred += self.match(item, f, where, f"{label}[{i}]")
        return deferred

    def _match_dims(self, value: Expr, dims: Sequence[Dim], where: str, label: str) -> list[tuple[Expr, Sequence[Dim], str]]:
        codes: list[int] = []
        derived = False
        for d in dims:
            if isinstance(d, int):
                codes += [ASSERT_IMM, d]
            elif isinstance(d, SymVar):
                codes += [ASSERT_SLOT if d in self.stored else STORE, self.slot(d)]
                self.stored.add(d)
            else:
                codes += [SKIP, 0]
                derived = True
        self.emit(_vm_call("vm_match_shape", [value, self.heap], codes=tuple(codes), where=where, label=label))
        return [(value, dims, label)] if derived else []

    def check_derived(self, deferred: list[tuple[Expr, Sequence[Dim], str]], where: str) -> None:
        for value, dims, label in deferred:
            codes: list[int] = []
            for d in dims:
                if isinstance(d, (int, SymVar)):
                    codes += [SKIP, 0]
                else:
                    self.ensure_dim(d)
                    codes += [ASSERT_SLOT, self.slot(d)]
            self.emit(_vm_call("vm_match_shape", [value, self.heap], codes=tuple(codes), where=where, label=label))

    # -- bindings -------------------------------------------------------------------------

    def lower_expr(self, e: Expr) -> Expr:
        if isinstance(e, ShapeExpr):
            return self.make_shape(e.values)
        if isinstance(e, PrimValue) and isinstance(e.value, sym.SymExpr):
            self.ensure_dim(e.value)
            slot = self.slot(e.value)
            if slot not in self.loaded:
                self.loaded[slot] = self.emit(_vm_call("vm_load_dim", [self.heap], e.info, slot=slot), e.info, "dim")
            return self.loaded[slot]
        if isinstance(e, Tuple):
            return Tuple(tuple(self.lower_expr(f) for f in e.fields), e.info)
        return e

    def lower_binding(self, b: AnyBinding) -> None:
        if isinstance(b, MatchCast):
            where = f"{self.fname}: match_cast of {_label(b.value)} to {I.shape_str(b.cast_info.shape) if isinstance(b.cast_info, TensorInfo) else b.cast_info}"
            deferred = self.match(b.value, b.cast_info, where, _label(b.value))
            self.check_derived(deferred, where)
            # the checks above are the cast; the match_cast stays as the (now checked) binding
            # that defines its sym vars, and runs as an alias
            self.out.append(MatchCast(b.var, b.value, b.cast_info))
            return
        value = b.value
        if isinstance(value, If):
            value = If(value.cond, self.lower_branch(value.then_branch), self.lower_branch(value.else_branch), value.info)
            self.out.append(Binding(b.var, value))
            return
        if isinstance(value, Call) and isinstance(value.callee, OpRef) and value.callee.name == "assert_dims":
            self.out.append(Binding(b.var, self.lower_assert(value)))
            return
        if isinstance(value, Call):
            value = Call(value.callee, tuple(self.lower_expr(a) for a in value.args), value.attrs, value.sinfo_args, value.info)
        elif isinstance(value, (ShapeExpr, PrimValue, Tuple)):
            value = self.lower_expr(value)
        self.out.append(Binding(b.var, value))

    def lower_assert(self, call: Call) -> Call:
        dims_expr = call.args[0]
        assert isinstance(dims_expr, ShapeExpr)
        checks = []
        for kind, i, j, message in call.attrs["checks"]:
            a, b = dims_expr.values[i], dims_expr.values[j]
            for d in (a, b):
                self.ensure_dim(d)
            sa = self._const_slot(a)
            sb = self._const_slot(b)
            checks.append((kind, sa, sb, message))
        return _vm_call("vm_check_dims", [self.heap], checks=tuple(checks), where=self.fname)

    def _const_slot(self, d: Dim) -> int:
        if isinstance(d, int):
            key = ("const", d)
            s = self.slots.get(key)
            if s is None:
                s = len(self.names)
                self.slots[key] = s
                self.names.append(str(d))
                self.bounds.append((d, d))
                self.emit(_vm_call("vm_shape_func", [self.heap], slots=(s,), programs=(("const", d),)))
            return s
        return self.slot(d)

    def lower_branch(self, seq: SeqExpr) -> SeqExpr:
        """A branch of an If: the vars it binds, the dims it computes and the values it makes are
        known only in it."""
        stored, computed, made, loaded = set(self.stored), set(self.computed), dict(self.made), dict(self.loaded)
        out = self.lower_seq(seq)
        self.stored, self.computed, self.made, self.loaded = stored, computed, made, loaded
        return out

    def lower_seq(self, seq: SeqExpr) -> SeqExpr:
        saved = self.out
        self.out = []
        for block in seq.blocks:
            for b in block.bindings:
                self.lower_binding(b)
        body = self.lower_expr(seq.body)
        blocks = (BindingBlock(tuple(self.out)),) if self.out else ()
        self.out = saved
        return SeqExpr(blocks, body, seq.info)


def _static_tensor(info: StructInfo) -> bool:
    return isinstance(info, TensorInfo) and info.dtype is not None and info.shape is not None and sym.is_static(info.shape)


def _label(e: Expr) -> str:
    return e.name if isinstance(e, Var) else type(e).__name__


def lower_function(name: str, f: GraphFunc) -> GraphFunc:
    lw = _Lowerer(name)
    deferred = []
    static = [p for p in f.params if _static_tensor(p.info)]
    if len(static) > 1:  # one check for every param of a fixed shape and dtype (an LLM's weights)
        infos = [p.info for p in static if isinstance(p.info, TensorInfo)]
        lw.emit(
            _vm_call(
                "vm_check_static_tensors",
                static,
                shapes=tuple(tuple(i.shape or ()) for i in infos),
                dtypes=tuple(i.dtype for i in infos),
                labels=tuple(p.name for p in static),
                where=f"{name}: argument",
            )
        )
    for p in f.params:
        if len(static) > 1 and p in static:
            continue
        deferred += lw.match(p, p.info, f"{name}: argument {p.name}", p.name)
    lw.check_derived(deferred, f"{name}: arguments")
    prologue = lw.out
    lw.out = []
    body = lw.lower_seq(f.body)
    out_bindings = list(body.blocks[0].bindings) if body.blocks else []
    ret = body.body
    lw.out = []
    if I.base_check(f.ret_info, ret.info) is not I.Check.PASS:
        d = lw.match(ret, f.ret_info, f"{name}: return value", "return")
        lw.check_derived(d, f"{name}: return value")
    epilogue = lw.out
    heap_binding = Binding(
        lw.heap,
        _vm_call("vm_alloc_shape_heap", [], AnyInfo(), size=len(lw.names), names=tuple(lw.names), bounds=tuple(lw.bounds)),
    )
    bindings = (heap_binding, *prologue, *out_bindings, *epilogue)
    return f.replace(body=SeqExpr((BindingBlock(bindings),), ret, body.info), pure=False)


@dataclass(frozen=True)
class LowerShapes(Pass):
    name: str = "lower_shapes"

    def run(self, mod: IRModule) -> IRModule:
        out = mod
        for name, f in mod.graph_funcs():
            out = out.with_func(name, lower_function(name, f))
        return out

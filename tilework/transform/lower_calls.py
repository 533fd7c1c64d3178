"""lower_calls: explicit allocation and destination-passing calls.

Requires a legalized module after ``to_non_dataflow``: every op call is a ``call_tensor``,
``call_lib`` or ``call_packed`` (or an op the VM runs directly). Each

    y = call_tensor(@f, (a, b), out=Tensor((n, 4), "float32"))

becomes

    y = vm_alloc_tensor(shape(n, 4), dtype="float32")
    _ = @f(a, b, y, shape(<values of @f's sym vars>))

where the sym values are the caller's dims for the kernel's sym vars, found by unifying the
kernel's buffer shapes with the arguments' struct info (the kernel ABI takes them in
``tilework.ir.loop.kernel_syms`` order). ``call_lib`` becomes an allocation and a call of the extern function
with the outputs appended. ``reshape`` views (``vm_view``) are kept as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tilework.errors import WellFormedError
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.graph import (
    AnyBinding,
    Binding,
    BindingBlock,
    Call,
    ExternFunc,
    GlobalVar,
    If,
    OpRef,
    SeqExpr,
    ShapeExpr,
    Tuple,
    Var,
)
from tilework.ir.info import ShapeInfo, StructInfo, TensorInfo, TupleInfo
from tilework.ir.loop import TensorFunc
from tilework.ir.module import IRModule
from tilework.ir.loop import kernel_syms
from tilework.ir.sym import Dim, SymVar
from tilework.op import vm as _vm_ops  # noqa: F401  (registers the vm_* ops)
from tilework.transform.lower_shapes import VOID, _vm_call
from tilework.transform.base import Pass


def _out_tensors(info: StructInfo) -> list[TensorInfo]:
    if isinstance(info, TensorInfo):
        return [info]
    if isinstance(info, TupleInfo) and all(isinstance(f, TensorInfo) for f in info.fields):
        return [f for f in info.fields if isinstance(f, TensorInfo)]
    raise WellFormedError(f"a destination-passing call must produce tensors, not {info}")


def _unify(pattern: Sequence[Dim], actual: Sequence[Dim] | None, mapping: dict[SymVar, Dim]) -> None:
    if actual is None or len(pattern) != len(actual):
        return
    for p, a in zip(pattern, actual):
        if isinstance(p, SymVar) and p not in mapping:
            mapping[p] = a


def _solve(mapping: dict[SymVar, Dim], pattern: Sequence[Dim], actual: Sequence[Dim] | None) -> None:
    """Solve ``c * v + k == a`` style dims for a still-unknown var (``n + 1`` against ``m``)."""
    if actual is None or len(pattern) != len(actual):
        return
    for p, a in zip(pattern, actual):
        unknown = [v for v in sym_walk.free_vars(p) if v not in mapping]
        if len(unknown) != 1:
            continue
        v = unknown[0]
        rest = sym_walk.substitute(p, {**mapping, v: 0})
        coeff = sym.sub(sym_walk.substitute(p, {**mapping, v: 1}), rest)
        if isinstance(coeff, int) and coeff != 0 and sym.prove_eq(sym_walk.substitute(p, {**mapping, v: 2}), sym.add(rest, 2 * coeff)):
            mapping[v] = sym.floordiv(sym.sub(a, rest), coeff)


class _Lower:
    def __init__(self, mod: IRModule) -> None:
        self.mod = mod
        self.counter = 0

    def fresh(self, hint: str, info: StructInfo) -> Var:
        self.counter += 1
        return Var(f"{hint}{self.counter}", info)

    def alloc(self, info: TensorInfo, out: list[AnyBinding], name: str) -> Var:
        if info.shape is None or info.dtype is None:
            raise WellFormedError(f"cannot allocate {name}: its shape or dtype is unknown ({info})")
        shape = ShapeExpr(info.shape, ShapeInfo(info.shape))
        v = Var(name, info)
        out.append(Binding(v, _vm_call("vm_alloc_tensor", [shape], info, dtype=info.dtype)))
        return v

    def outputs(self, var: Var, sinfo: StructInfo, out: list[AnyBinding]) -> list[Var]:
        tensors = _out_tensors(sinfo)
        if len(tensors) == 1 and isinstance(sinfo, TensorInfo):
            return [self.alloc(tensors[0], out, var.name)]
        return [self.alloc(t, out, f"{var.name}_{i}") for i, t in enumerate(tensors)]

    def lower_call_tensor(self, b: Binding, call: Call, out: list[AnyBinding]) -> None:
        gv, args = call.args[0], call.args[1]
        assert isinstance(gv, GlobalVar) and isinstance(args, Tuple)
        func = self.mod[gv.name]
        if not isinstance(func, TensorFunc):
            raise WellFormedError(f"call_tensor of @{gv.name}, which is not a TensorFunc")
        outs = self.outputs(b.var, call.sinfo_args[0], out)
        actuals = list(args.fields) + list(outs)
        buffers = func.buffers
        if len(buffers) != len(actuals):
            raise WellFormedError(f"@{gv.name} takes {len(buffers)} buffers, the call passes {len(actuals)}")
        mapping: dict[SymVar, Dim] = {}
        sym_args = call.args[2].values if len(call.args) > 2 and isinstance(call.args[2], ShapeExpr) else ()
        for v, d in zip(func.sym_params, sym_args):
            mapping[v] = d
        shapes = [(buf.shape, a.info.shape if isinstance(a.info, TensorInfo) else None) for buf, a in zip(buffers, actuals)]
        for pattern, actual in shapes:
            _unify(pattern, actual, mapping)
        for pattern, actual in shapes:
            _solve(mapping, pattern, actual)
        order = kernel_syms(func)
        missing = [v.name for v in order if v not in mapping]
        if missing:
            raise WellFormedError(f"call of @{gv.name}: cannot tell the value of sym var(s) {', '.join(missing)} from the arguments")
        values = tuple(mapping[v] for v in order)
        kernel_args = (*actuals, ShapeExpr(values, ShapeInfo(values)))
        out.append(Binding(self.fresh("_", VOID), Call(gv, kernel_args, info=VOID)))
        self.bind_result(b.var, outs, out)

    def lower_call_lib(self, b: Binding, call: Call, out: list[AnyBinding]) -> None:
        ext, args = call.args[0], call.args[1]
        assert isinstance(ext, ExternFunc) and isinstance(args, Tuple)
        outs = self.outputs(b.var, call.sinfo_args[0], out)
        out.append(Binding(self.fresh("_", VOID), Call(ext, (*args.fields, *outs), info=VOID)))
        self.bind_result(b.var, outs, out)

    def bind_result(self, var: Var, outs: list[Var], out: list[AnyBinding]) -> None:
        if len(outs) == 1 and isinstance(var.info, TensorInfo):
            # the allocation var plays the result's role: alias it
            out.append(Binding(var, outs[0]))
        else:
            out.append(Binding(var, Tuple(tuple(outs), TupleInfo(tuple(o.info for o in outs)))))

    def lower_seq(self, seq: SeqExpr) -> SeqExpr:
        out: list[AnyBinding] = []
        for block in seq.blocks:
            for b in block.bindings:
                self.lower_binding(b, out)
        return SeqExpr((BindingBlock(tuple(out)),) if out else (), seq.body, seq.info)

    def lower_binding(self, b: AnyBinding, out: list[AnyBinding]) -> None:
        value = b.value
        if isinstance(b, Binding) and isinstance(value, Call) and isinstance(value.callee, OpRef):
            name = value.callee.name
            if name == "call_tensor":
                self.lower_call_tensor(b, value, out)
                return
            if name == "call_lib":
                self.lower_call_lib(b, value, out)
                return
        if isinstance(b, Binding) and isinstance(value, If):
            value = If(value.cond, self.lower_seq(value.then_branch), self.lower_seq(value.else_branch), value.info)
            out.append(Binding(b.var, value))
            return
        out.append(b)


@dataclass(frozen=True)
class LowerCalls(Pass):
    name: str = "lower_calls"

    def run(self, mod: IRModule) -> IRModule:
        out = mod
        lw = _Lower(mod)
        for name, f in mod.graph_funcs():
            out = out.with_func(name, f.replace(body=lw.lower_seq(f.body), pure=False))
        return out


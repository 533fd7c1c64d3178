"""legalize: lower every graph-level op call to a loop-level kernel call.

Each op's ``legalize(call, ctx)`` (defined beside the op, in its family file) builds the
computation with ``te`` over placeholders shaped like the call's arguments — the caller's own
symbolic dims — and returns ``ctx.call_te(...)``: the TensorFunc is added to the module (kernels
that are structurally equal are shared) and the graph calls it with ``call_tensor``. A call
equal to one legalized before (same op, attributes, argument struct info and aliasing; one per
layer of a model) whose legalization was that one ``call_tensor`` of its own arguments, nothing
emitted and no dim of its own, calls the same kernel without building it again: it would come
out the same, and building and comparing it was most of the pass (1350 calls in SmolLM2's
30-layer fp32 decoder, whose passes took a third less time without that). Facts that
inference could not prove (``DimCheck``s) are kept as ``assert_dims`` bindings just before the
call, so lower_shapes can check them at run time.

Requires a normalized, well-formed module. Guarantees: no op call is left but ``call_tensor``,
``call_lib``, ``call_packed``, ``assert_dims`` and the ``vm_*`` ops (and ``shape_of`` of a tensor whose shape
is unknown, which the VM answers), unless ``strict=False``, in which case ops without a
legalization stay as they are (for backends that take them whole).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

from tilework.errors import UnsupportedError
from tilework.ir import info as I
from tilework.ir import sym_walk
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, Call, Constant, Expr, GlobalVar, OpRef, PrimValue, ShapeExpr, Tuple, Var
from tilework.ir.info import StructInfo
from tilework.ir.loop import TensorFunc
from tilework.ir.module import IRModule
from tilework.ir.rewrite import FuncRewriter
from tilework.ir.sym import Dim
from tilework.op import base as opbase
from tilework.op import vm as _vm_ops  # noqa: F401  (registers assert_dims)
from tilework.op.calls import call_tensor
from tilework.schedule.rules.common import host_registers
from tilework.te.tensor import Tensor
from tilework.transform.base import Pass

KEEP = {"call_tensor", "call_lib", "call_packed", "assert_dims"}


class LegalizeCtx:
    """What an op's legalize function uses: kernel registration and the te bridge."""

    def __init__(self, bb: BlockBuilder, kernels: "_KernelTable") -> None:
        self.bb = bb
        self.kernels = kernels

    @property
    def vector_bytes(self) -> int:
        """The width of the target's vector registers, for a hand-built kernel that sizes its
        register tiles (the schedule rules' ``host_registers``; only speed depends on it)."""
        return host_registers().width

    def add_kernel(self, hint: str, func: TensorFunc) -> GlobalVar:
        return self.kernels.add(self.bb, hint, func)

    def kernel_for(self, key: Hashable, hint: str, make: Callable[[], tuple[TensorFunc, Any]]) -> tuple[GlobalVar, TensorFunc, Any]:
        """The kernel ``make()`` builds (with what the caller needs to call it), built and added
        once per ``key`` (everything the kernel depends on, hashable): calls that repeat with
        equal operands, one per layer of a model, build it once."""
        got = self.kernels.made.get(key)
        if got is None:
            func, extra = make()
            got = self.kernels.made[key] = (self.add_kernel(hint, func), func, extra)
        return got

    def call_te(self, hint: str, args: Sequence[Expr], inputs: Sequence[Tensor], outputs: Sequence[Tensor], out_info: StructInfo) -> Call:
        """``call_tensor`` of the kernel computing te ``outputs`` from placeholders ``inputs``
        (one per graph argument in ``args``, in order)."""
        from tilework import te

        func = te.create_func(list(inputs), list(outputs))
        gv = self.add_kernel(hint, func)
        sym_args: tuple[Dim, ...] = tuple(func.sym_params)
        return call_tensor(gv, list(args), out_info, sym_args)


@dataclass
class _KernelTable:
    """Kernels added so far, keyed by structural hash, so equal kernels are emitted once."""

    by_hash: dict[int, list[tuple[TensorFunc, str]]] = field(default_factory=dict)
    made: dict[Hashable, tuple[GlobalVar, TensorFunc, Any]] = field(default_factory=dict)  # LegalizeCtx.kernel_for

    def add(self, bb: BlockBuilder, hint: str, func: TensorFunc) -> GlobalVar:
        from tilework.ir.structural import structural_equal, structural_hash

        h = structural_hash(func)
        for other, name in self.by_hash.get(h, []):
            if structural_equal(other, func, map_free_vars=True):
                return bb.global_var(name)
        name = bb.fresh_global_name(hint)
        self.by_hash.setdefault(h, []).append((func, name))
        return bb.add_func(name, func)


class _Legalizer(FuncRewriter):
    def __init__(self, mod: IRModule, strict: bool) -> None:
        super().__init__(mod)
        self.strict = strict
        self.kernels = _KernelTable()
        self.ctx = LegalizeCtx(self.bb, self.kernels)
        self.reused: dict[Hashable, _Reuse] = {}  # see the module doc

    def rewrite_value(self, binding: Binding, value: Expr) -> Expr:
        if not isinstance(value, Call) or not isinstance(value.callee, OpRef):
            return value
        name = value.callee.name
        if name in KEEP or name.startswith("vm_"):
            return value
        op = opbase.get(name)
        if op.legalize is None:
            if self.strict:
                raise UnsupportedError(f"op {name} (bound to %{binding.var.name} in @{self.func_name}) has no loop-level lowering")
            return value
        call = self.bb.normalize(value)
        assert isinstance(call, Call)
        _, checks = opbase.infer_with_checks(call)
        if checks:
            self.bb.emit(assert_dims_call(checks), name="check")
        key = _reuse_key(call)
        hit = self.reused.get(key) if key is not None else None
        if hit is not None:
            return call_tensor(hit.kernel, [call.args[i] for i in hit.args], hit.out, hit.sym_args)
        emitted = self.bb.emitted
        out = op.legalize(call, self.ctx)
        if key is not None and self.bb.emitted == emitted:
            reuse = _reusable(out, call)
            if reuse is not None:
                self.reused[key] = reuse
        return out


@dataclass(frozen=True)
class _Reuse:
    """A legalization to repeat: ``call_tensor(kernel, [call.args[i] for i in args], out, sym_args)``."""

    kernel: GlobalVar
    args: tuple[int, ...]
    out: StructInfo
    sym_args: tuple[Dim, ...]


def _reuse_key(call: Call) -> Hashable | None:
    """What ``call``'s legalization can depend on: its op, attributes, the struct info of each
    argument (a var), which arguments are the same var, shape and scalar values, constants
    (themselves); None when an argument is something else."""
    first: dict[int, int] = {}
    args: list[Hashable] = []
    for i, a in enumerate(call.args):
        same = first.setdefault(id(a), i)
        if isinstance(a, Var):
            args.append(("var", same, a.info))
        elif isinstance(a, ShapeExpr):
            args.append(("shape", a.values))
        elif isinstance(a, PrimValue):
            args.append(("prim", type(a.value).__name__, a.value, a.info))
        elif isinstance(a, Constant):
            args.append(("const", same, a))
        else:
            return None
    key = (call.callee.name if isinstance(call.callee, OpRef) else None, call.attrs, tuple(args), call.sinfo_args)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _reusable(out: Expr, call: Call) -> _Reuse | None:
    """``out`` as a legalization to repeat for calls equal to ``call`` (see the module doc), or
    None: not one ``call_tensor`` of ``call``'s arguments, or it names a dim that ``call``'s
    arguments do not (a dim made up for this call)."""
    if not (isinstance(out, Call) and isinstance(out.callee, OpRef) and out.callee.name == "call_tensor"):
        return None
    if len(out.args) not in (2, 3) or not isinstance(out.args[0], GlobalVar) or not isinstance(out.args[1], Tuple) or len(out.sinfo_args) != 1:
        return None
    sym_args: tuple[Dim, ...] = ()
    if len(out.args) == 3:
        if not isinstance(out.args[2], ShapeExpr):
            return None
        sym_args = out.args[2].values
    where = {id(a): i for i, a in reversed(list(enumerate(call.args)))}
    args = tuple(where.get(id(a), -1) for a in out.args[1].fields)
    if -1 in args:
        return None
    known = {v for a in call.args for v in I.free_vars(a.info)}  # a shape's or scalar's values are in its info
    used = set(I.free_vars(out.sinfo_args[0])) | {v for d in sym_args for v in sym_walk.free_vars(d)}
    if not used <= known:
        return None
    return _Reuse(out.args[0], args, out.sinfo_args[0], tuple(sym_args))


def assert_dims_call(checks: Sequence[opbase.DimCheck]) -> Call:
    """``assert_dims(shape(dims...), checks=((kind, i, j, message), ...))``."""
    dims: list[Dim] = []
    index: dict[object, int] = {}

    def slot(d: Dim) -> int:
        key = d if not isinstance(d, int) else ("int", d)
        if key not in index:
            index[key] = len(dims)
            dims.append(d)
        return index[key]

    entries = []
    for c in checks:
        a, b = c.dims[0], c.dims[1]
        entries.append((c.kind, slot(a), slot(b), c.message))
    return opbase.make_call("assert_dims", [ShapeExpr(tuple(dims))], checks=tuple(entries))


@dataclass(frozen=True)
class Legalize(Pass):
    strict: bool = True
    name: str = "legalize"

    def run(self, mod: IRModule) -> IRModule:
        return _Legalizer(mod, self.strict).run()


__all__ = ["Legalize", "LegalizeCtx", "assert_dims_call"]

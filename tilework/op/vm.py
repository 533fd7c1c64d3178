"""Ops of lowered programs: allocation, the shape heap, run-time checks, views, conditions.

The lowering passes (``lower_calls``, ``lower_shapes``) produce calls of these ops; the VM maps
each to a builtin of the same name (``tilework.runtime.builtins``) with the call's arguments
followed by its attributes in declared order. They print and parse like any op, so lowered IR
can be read, dumped after each pass and verified.
"""

from __future__ import annotations

from typing import Any, Callable

from tilework.ir import sym
from tilework.ir.graph import Call
from tilework.ir.info import AnyInfo, PrimInfo, ShapeInfo, StructInfo, TensorInfo, TupleInfo
from tilework.ir.opdef import InferFn
from tilework.ir.sym import Dim, SymVar
from tilework.op.base import InferCtx, Op, OpPattern, register

VOID = TupleInfo(())


def _void(call: Call, ctx: InferCtx) -> StructInfo:
    return VOID


def _heap(call: Call, ctx: InferCtx) -> StructInfo:
    return AnyInfo()


def _alloc_tensor(call: Call, ctx: InferCtx) -> StructInfo:
    shape = call.args[0].info
    dtype = call.attrs["dtype"]
    if isinstance(shape, ShapeInfo):
        return TensorInfo(shape.values, dtype, shape.ndim)
    return TensorInfo(None, dtype, -1)


def _make_shape(call: Call, ctx: InferCtx) -> StructInfo:
    return ShapeInfo(None, len(call.attrs["codes"]) // 2)


def _view(call: Call, ctx: InferCtx) -> StructInfo:
    x, shape = call.args[0].info, call.args[1].info
    dtype = x.dtype if isinstance(x, TensorInfo) else None
    if isinstance(shape, ShapeInfo):
        return TensorInfo(shape.values, dtype, shape.ndim)
    return TensorInfo(None, dtype, -1)


def _tensor_to_shape(call: Call, ctx: InferCtx) -> StructInfo:
    x = call.args[0].info
    if isinstance(x, TensorInfo) and x.shape is not None and len(x.shape) <= 1:
        length = x.shape[0] if x.shape else 1
        if isinstance(length, int):
            return ShapeInfo(None, length)
    return ShapeInfo(None, -1)


def _bool(call: Call, ctx: InferCtx) -> StructInfo:
    return AnyInfo()


def _storage(call: Call, ctx: InferCtx) -> StructInfo:
    return AnyInfo()


def _alloc_from_storage(call: Call, ctx: InferCtx) -> StructInfo:
    shape = call.args[1].info
    dtype = call.attrs["dtype"]
    if isinstance(shape, ShapeInfo):
        return TensorInfo(shape.values, dtype, shape.ndim)
    return TensorInfo(None, dtype, -1)


def _vm(name: str, infer: InferFn, attrs: dict[str, object], num_args: int | None, pure: bool = False) -> None:
    register(Op(name, infer, OpPattern.OPAQUE, attrs=attrs, num_args=num_args, pure=pure))


# names, bounds: per heap slot, for messages ("n", (1, 4096))
_vm("vm_alloc_shape_heap", _heap, {"size": 0, "names": (), "bounds": ()}, 0)
# codes: (code, operand) per dim; where: "main: argument x"; label: "x.shape"
_vm("vm_match_shape", _void, {"codes": (), "where": "", "label": ""}, 2)
_vm("vm_check_tensor_info", _void, {"ndim": -1, "dtype": None, "where": ""}, 1)
# every arg a tensor of exactly shapes[i] and dtypes[i] (params of fixed shape, checked at once)
_vm("vm_check_static_tensors", _void, {"shapes": (), "dtypes": (), "labels": (), "where": ""}, None)
_vm("vm_check_tuple_info", _void, {"size": 0, "where": ""}, 1)
_vm("vm_check_shape_info", _void, {"ndim": -1, "where": ""}, 1)
_vm("vm_check_prim_info", _void, {"dtype": None, "where": ""}, 1)
# checks: (kind, slot_a, slot_b, message) entries
_vm("vm_check_dims", _void, {"checks": (), "where": ""}, 1)
# slots[i] = the value of programs[i] over the heap (``dim_program``)
_vm("vm_shape_func", _void, {"slots": (), "programs": ()}, 1)
_vm("vm_make_shape", _make_shape, {"codes": ()}, 1, pure=True)
_vm("vm_load_dim", lambda call, ctx: PrimInfo("int64"), {"slot": 0}, 1, pure=True)
_vm("vm_alloc_tensor", _alloc_tensor, {"dtype": "float32"}, 1)
_vm("vm_view", _view, {}, 2, pure=True)
# the values of a small integer tensor (0-d or 1-D) read into a shape value (``tensor_to_shape``)
_vm("vm_tensor_to_shape", _tensor_to_shape, {}, 1, pure=True)
_vm("vm_read_if_cond", _bool, {}, 1, pure=True)
_vm("vm_kill", _void, {}, 1)
# Planned memory (``plan_memory``): ``vm_alloc_storage(nbytes)`` is a block of a function's
# arena: static (sized for the dims' upper bounds, obtained once per VM, ``nbytes`` is that
# constant capacity) or pooled (``nbytes`` evaluated per call, from the size-class pool and
# given back by ``vm_free_storage``); ``vm_alloc_tensor_from_storage(storage, shape, offset)``
# is a tensor view of it at a byte offset.
_vm("vm_alloc_storage", _storage, {"static": False, "label": ""}, 1)
_vm("vm_alloc_tensor_from_storage", _alloc_from_storage, {"dtype": "float32"}, 3)
_vm("vm_free_storage", _void, {}, 1)


def _assert_dims(call: Call, ctx: InferCtx) -> StructInfo:
    dims = call.args[0].info
    if not isinstance(dims, ShapeInfo) or dims.values is None:
        raise ctx.error("expects a shape of the dims it relates")
    for kind, i, j, _ in call.attrs["checks"]:
        if kind not in ("eq", "broadcast", "ge", "divides", "expands") or not (0 <= i < dims.ndim and 0 <= j < dims.ndim):
            raise ctx.error(f"bad check ({kind!r}, {i}, {j})")
    return VOID


# Facts that op inference assumed (``DimCheck``s), kept in the graph until lower_shapes makes
# them run-time checks: ``assert_dims(shape(n, 3), checks=(("broadcast", 0, 1, "add: ..."),))``.
register(Op("assert_dims", _assert_dims, OpPattern.OPAQUE, attrs={"checks": ()}, num_args=1, effect=True))


# -- operand encodings of the vm ops ---------------------------------------------------------

# ``vm_match_shape`` codes: a (code, operand) pair per dim of the matched value.
STORE, ASSERT_IMM, ASSERT_SLOT, SKIP = 0, 1, 2, 3

# ``vm_shape_func`` programs: a derived dim over the shape heap, kept as structure (nested
# tuples), never as text: ("slot", i) | ("const", k) | ("add", a, b, ...) | ("mul", a, b, ...)
# | ("floordiv", a, b) | ("floormod", a, b) | ("min", a, b) | ("max", a, b).
DIM_OPS = {"slot": 1, "const": 1, "add": -1, "mul": -1, "floordiv": 2, "floormod": 2, "min": 2, "max": 2}


def dim_program(d: Dim, slot_of: Callable[[SymVar], int]) -> tuple[Any, ...]:
    """The ``vm_shape_func`` program computing ``d``, reading each var from ``slot_of(var)``."""
    if isinstance(d, int):
        return ("const", d)
    if isinstance(d, SymVar):
        return ("slot", slot_of(d))
    if isinstance(d, (sym.FloorDiv, sym.FloorMod, sym.Min, sym.Max)):
        op = {sym.FloorDiv: "floordiv", sym.FloorMod: "floormod", sym.Min: "min", sym.Max: "max"}[type(d)]
        return (op, dim_program(d.a, slot_of), dim_program(d.b, slot_of))
    assert isinstance(d, sym.Poly)
    terms: list[tuple[Any, ...]] = []
    for mono, c in d.terms:
        factors = [dim_program(a, slot_of) for a in mono]
        if c != 1:
            factors.insert(0, ("const", c))
        terms.append(factors[0] if len(factors) == 1 else ("mul", *factors))
    if d.const:
        terms.append(("const", d.const))
    return terms[0] if len(terms) == 1 else ("add", *terms)

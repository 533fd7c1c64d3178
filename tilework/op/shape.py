"""Moving values between shapes and tensors: ``shape_to_tensor`` and ``tensor_to_shape``.

``shape_to_tensor(shape(b, s, 768))`` is the int64 tensor ``[b, s, 768]``: a symbolic shape
becoming data (an exporter's ``Shape`` output consumed by arithmetic). ``tensor_to_shape(t)``
is the reverse: a 1-D integer tensor's values lifted into a shape value whose dims are known
only at run time; the caller binds them to fresh sym vars with ``match_cast``. It has no
kernel: it legalizes to the VM op ``vm_tensor_to_shape`` (``tilework.op.vm``), which the VM
runs as the builtin of that name, reading the tensor into a shape value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from tilework import te
from tilework.errors import UnsupportedError
from tilework.ir import sym
from tilework.ir.graph import Call, Expr, ShapeExpr
from tilework.ir.info import ShapeInfo, StructInfo, TensorInfo
from tilework.ir.dtype import INT_DTYPES
from tilework.ir.loop import Scalar
from tilework.op import vm as _vm_ops  # noqa: F401  (registers vm_tensor_to_shape)
from tilework.op.base import InferCtx, Op, OpPattern, dtype_attr, make_call, register, shape_arg, tensor_arg
from tilework.op.kernel import out_tensor

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx


def _infer_shape_to_tensor(call: Call, ctx: InferCtx) -> StructInfo:
    s = shape_arg(call, 0, ctx)
    dtype = dtype_attr(call, "dtype", ctx)
    if dtype not in INT_DTYPES:
        raise ctx.error(f"dtype must be an integer dtype, got {dtype}")
    if s.ndim == -1:
        raise ctx.error("the shape's rank must be known")
    return TensorInfo((s.ndim,), dtype)


def _legalize_shape_to_tensor(call: Call, ctx: "LegalizeCtx") -> Expr:
    info = call.args[0].info
    assert isinstance(info, ShapeInfo)
    if info.values is None:
        raise UnsupportedError("shape_to_tensor: cannot legalize: the shape's dims must be known symbolically")
    dims = info.values
    shape, dtype = out_tensor(call)

    def f(i: Scalar) -> Scalar:
        value: Scalar = te.cast(dims[-1], "int64") if dims else 0
        for k in range(len(dims) - 2, -1, -1):
            value = te.if_then_else(te.eq(i, k), te.cast(dims[k], "int64"), value)
        return value

    out = te.compute(shape, f, "shape_to_tensor", dtype)
    return ctx.call_te("shape_to_tensor", [], [], [out], call.info)


def _infer_tensor_to_shape(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if x.dtype is not None and x.dtype not in INT_DTYPES:
        raise ctx.error(f"expects an integer tensor, got {x.dtype}")
    if x.shape is None or len(x.shape) > 1 or (x.shape and not isinstance(x.shape[0], int)):
        raise ctx.error(f"expects a 0-d or 1-D tensor of static length, got {x}")
    length = x.shape[0] if x.shape else 1
    assert isinstance(length, int)
    return ShapeInfo(None, length)


def read_shape(x: Expr) -> Call:
    """The lowered form of ``tensor_to_shape``: the VM reads the values of ``x`` (a small
    tensor of static length) into a shape value; no kernel."""
    return make_call("vm_tensor_to_shape", [x])


def _legalize_tensor_to_shape(call: Call, ctx: "LegalizeCtx") -> Expr:
    return read_shape(call.args[0])


register(Op("shape_to_tensor", _infer_shape_to_tensor, OpPattern.INJECTIVE, attrs={"dtype": "int64"}, num_args=1, legalize=_legalize_shape_to_tensor))
register(Op("tensor_to_shape", _infer_tensor_to_shape, OpPattern.OPAQUE, num_args=1, legalize=_legalize_tensor_to_shape))


def shape_to_tensor(shape: Expr | Sequence[sym.Dim], dtype: str = "int64") -> Call:
    """The dims of ``shape`` as a 1-D integer tensor."""
    s = shape if isinstance(shape, Expr) else ShapeExpr(tuple(shape))
    return make_call("shape_to_tensor", [s], dtype=dtype)


def tensor_to_shape(x: Expr) -> Call:
    """The values of a 0-d or 1-D integer tensor as a shape value (dims known at run time)."""
    return make_call("tensor_to_shape", [x])

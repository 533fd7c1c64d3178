"""Miscellaneous ops the ONNX frontend needs: moving values between shapes and tensors
(``shape_to_tensor``, ``tensor_to_shape``), unary math and activations the core set lacks
(``tan``, ``atan``, ``asinh``, ``softplus``, ``elu``, ``hard_swish``, ``sign``, ...), ``isnan`` /
``isinf``, ``fmod``, ``bitshift``, ``one_hot``, ``hardmax``, ``eye_like``, ``logsumexp``,
``cumprod`` and ``einsum``.

``shape_to_tensor(shape(b, s, 768))`` is the int64 tensor ``[b, s, 768]``: a symbolic shape
becoming data (an exporter's ``Shape`` output consumed by arithmetic). ``tensor_to_shape(t)``
is the reverse: a 1-D integer tensor's values lifted into a shape value whose dims are known
only at run time; the caller binds them to fresh sym vars with ``match_cast``. It is the one
op here without a kernel: the VM reads the tensor (``vm.tensor_to_shape``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr, ExternFunc, ShapeExpr
from tilework.ir.info import FuncInfo, ShapeInfo, StructInfo, TensorInfo
from tilework.ir.dtype import INT_DTYPES, is_float_dtype
from tilework.ir.loop import Scalar
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    axes_attr,
    bool_attr,
    dtype_attr,
    int_attr,
    make_call,
    normalize_axes,
    normalize_axis,
    register,
    require_float,
    require_equal,
    shape_arg,
    tensor_arg,
    unify_dtype,
    broadcast_shapes,
)
from tilework.op.kernel import arg, bcast_index, compute_dtype, out_tensor, upcast
from tilework.op.reduce import reduced_info
from tilework.runtime import builtins as _builtins
from tilework.runtime.extern import register_extern

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx

TENSOR_TO_SHAPE = "vm.tensor_to_shape"

register_extern(TENSOR_TO_SHAPE, _builtins.tensor_to_shape, override=True)

# -- shapes <-> tensors -----------------------------------------------------------------------


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
        raise ctx_error("shape_to_tensor", "the shape's dims must be known symbolically")
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


def read_shape(x: Expr, ndim: int) -> Call:
    """The lowered form of ``tensor_to_shape``: the VM reads the values of ``x`` (a small
    tensor) into a shape value of rank ``ndim``; no kernel."""
    fn = ExternFunc(TENSOR_TO_SHAPE, FuncInfo(None, ShapeInfo(None, ndim), pure=True))
    return Call(fn, (x,))


def _legalize_tensor_to_shape(call: Call, ctx: "LegalizeCtx") -> Expr:
    info = call.info
    assert isinstance(info, ShapeInfo)
    return read_shape(call.args[0], info.ndim)


def ctx_error(op: str, message: str) -> Exception:
    from tilework.errors import UnsupportedError

    return UnsupportedError(f"{op}: cannot legalize: {message}")


register(Op("shape_to_tensor", _infer_shape_to_tensor, OpPattern.INJECTIVE, attrs={"dtype": "int64"}, num_args=1, legalize=_legalize_shape_to_tensor))
register(Op("tensor_to_shape", _infer_tensor_to_shape, OpPattern.OPAQUE, num_args=1, legalize=_legalize_tensor_to_shape))


def shape_to_tensor(shape: Expr | Sequence[sym.Dim], dtype: str = "int64") -> Call:
    """The dims of ``shape`` as a 1-D integer tensor."""
    s = shape if isinstance(shape, Expr) else ShapeExpr(tuple(shape))
    return make_call("shape_to_tensor", [s], dtype=dtype)


def tensor_to_shape(x: Expr) -> Call:
    """The values of a 0-d or 1-D integer tensor as a shape value (dims known at run time)."""
    return make_call("tensor_to_shape", [x])


# -- unary math and activations ---------------------------------------------------------------

_PI = 3.141592653589793
_SQRT3 = 1.7320508075688772
_TAN_PI_12 = 0.2679491924311227


def _atan(x: Scalar) -> Scalar:
    """``atan`` by range reduction (``1/x`` past 1, then ``pi/6`` steps) and an odd series
    that is exact to float64 rounding on ``|u| <= tan(pi/12)``."""
    ax = te.abs(x)
    inv = te.gt(ax, 1.0)
    t = te.if_then_else(inv, 1.0 / ax, ax)  # type: ignore[operator]
    red = te.gt(t, _TAN_PI_12)
    u = te.if_then_else(red, (t * _SQRT3 - 1.0) / (t + _SQRT3), t)  # type: ignore[operator]
    u2 = u * u  # type: ignore[operator]
    series: Any = 1.0 / 27.0
    for k in range(25, 0, -2):
        series = 1.0 / k - u2 * series  # type: ignore[operator]
    r = u * series  # type: ignore[operator]
    r = te.if_then_else(red, r + _PI / 6, r)  # type: ignore[operator]
    r = te.if_then_else(inv, _PI / 2 - r, r)  # type: ignore[operator]
    return te.if_then_else(te.lt(x, 0.0), -r, r)  # type: ignore[operator]


def _asin(x: Scalar) -> Scalar:
    return _atan(x / te.sqrt((1.0 - x * x)))  # type: ignore[operator]


def _math(name: str, x: Any, a: dict[str, object]) -> Any:
    """Op ``name`` of ``x`` (in its compute dtype) with the call's attributes ``a``."""
    alpha = float(a.get("alpha", 0.0))  # type: ignore[arg-type]
    if name == "tan":
        return te.sin(x) / te.cos(x)  # type: ignore[no-any-return]
    if name == "atan":
        return _atan(x)
    if name == "asin":
        return _asin(x)
    if name == "acos":
        return _PI / 2 - _asin(x)  # type: ignore[operator, no-any-return]
    if name in ("sinh", "cosh"):
        e, m = te.exp(x), te.exp(-x)  # type: ignore[operator]
        return (e - m) * 0.5 if name == "sinh" else (e + m) * 0.5  # type: ignore[no-any-return]
    if name == "asinh":
        ax = te.abs(x)
        r = te.log(ax + te.sqrt(ax * ax + 1.0))  # type: ignore[operator]
        return te.if_then_else(te.lt(x, 0.0), -r, r)  # type: ignore[operator]
    if name == "acosh":
        return te.log(x + te.sqrt(x * x - 1.0))  # type: ignore[operator]
    if name == "atanh":
        return (te.log1p(x) - te.log1p(-x)) * 0.5  # type: ignore[operator, no-any-return]
    if name == "softplus":
        ax = te.abs(x)
        return te.maximum(x, 0.0) + te.log1p(te.exp(-ax))  # type: ignore[operator, no-any-return]
    if name == "softsign":
        return x / (te.abs(x) + 1.0)  # type: ignore[operator, no-any-return]
    if name == "reciprocal":
        return 1.0 / x  # type: ignore[operator, no-any-return]
    if name == "elu":
        return te.if_then_else(te.lt(x, 0.0), alpha * te.expm1(x), x)  # type: ignore[operator]
    if name == "celu":
        return te.maximum(x, 0.0) + te.minimum(0.0, alpha * te.expm1(x / alpha))  # type: ignore[operator, no-any-return]
    if name == "selu":
        gamma = float(a["gamma"])  # type: ignore[arg-type]
        return gamma * te.if_then_else(te.le(x, 0.0), alpha * te.expm1(x), x)  # type: ignore[operator, no-any-return]
    if name == "leaky_relu":
        return te.if_then_else(te.lt(x, 0.0), alpha * x, x)  # type: ignore[operator]
    if name == "thresholded_relu":
        return te.if_then_else(te.gt(x, alpha), x, 0.0)
    if name == "hard_sigmoid":
        beta = float(a["beta"])  # type: ignore[arg-type]
        return te.maximum(0.0, te.minimum(1.0, alpha * x + beta))  # type: ignore[operator]
    if name == "hard_swish":
        return x * te.maximum(0.0, te.minimum(1.0, x * (1.0 / 6.0) + 0.5))  # type: ignore[operator, no-any-return]
    if name == "mish":
        sp = te.maximum(x, 0.0) + te.log1p(te.exp(-te.abs(x)))  # type: ignore[operator]
        return x * te.tanh(sp)  # type: ignore[operator, no-any-return]
    if name == "shrink":
        bias, lambd = float(a["bias"]), float(a["lambd"])  # type: ignore[arg-type]
        return te.if_then_else(te.lt(x, -lambd), x + bias, te.if_then_else(te.gt(x, lambd), x - bias, 0.0))  # type: ignore[operator]
    raise ValueError(name)


_MATH = (
    "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "softplus",
    "softsign", "reciprocal", "elu", "celu", "selu", "leaky_relu", "thresholded_relu",
    "hard_sigmoid", "hard_swish", "mish", "shrink",
)  # fmt: skip
_MATH_ATTRS: dict[str, dict[str, object]] = {
    "elu": {"alpha": 1.0},
    "celu": {"alpha": 1.0},
    "selu": {"alpha": 1.6732632423543772, "gamma": 1.0507009873554805},
    "leaky_relu": {"alpha": 0.01},
    "thresholded_relu": {"alpha": 1.0},
    "hard_sigmoid": {"alpha": 0.2, "beta": 0.5},
    "shrink": {"bias": 0.0, "lambd": 0.5},
}
_ANY_DTYPE = ("reciprocal", "shrink", "sign", "leaky_relu", "thresholded_relu")


def _infer_math(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if ctx.op_name not in _ANY_DTYPE:
        require_float(x, ctx)
    if x.dtype == "bool":
        raise ctx.error("expects a numeric tensor, got bool")
    return x


def _legalize_math(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = call.callee.name  # type: ignore[attr-defined]
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype) if is_float_dtype(dtype) else "float64"
    attrs = dict(call.attrs)

    def f(*i: Scalar) -> Scalar:
        v = te.cast(x[i], acc)
        if name == "sign":
            return te.if_then_else(te.gt(v, 0.0), 1.0, te.if_then_else(te.lt(v, 0.0), -1.0, v))
        return _math(name, v, attrs)

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [x], [out], call.info)


for _name in (*_MATH, "sign"):
    register(Op(_name, _infer_math, OpPattern.ELEMWISE, attrs=_MATH_ATTRS.get(_name, {}), num_args=1, legalize=_legalize_math))


def math(name: str, x: Expr, **attrs: float) -> Call:
    """Elementwise ``name`` (one of ``tan asin acos atan sinh cosh asinh acosh atanh softplus
    softsign reciprocal elu celu selu leaky_relu thresholded_relu hard_sigmoid hard_swish mish
    shrink sign``) with ONNX's attribute names and defaults (``alpha``, ``beta``, ...)."""
    return make_call(name, [x], {k: float(v) for k, v in attrs.items()})


# -- isnan / isinf -----------------------------------------------------------------------------


def _infer_isnan(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    require_float(x, ctx)
    return TensorInfo(x.shape, "bool", x.ndim)


def _legalize_isnan(call: Call, ctx: "LegalizeCtx") -> Expr:
    name = call.callee.name  # type: ignore[attr-defined]
    x = arg(call, 0, "x")
    shape, _ = out_tensor(call)
    neg, pos = bool(call.attrs.get("detect_negative", True)), bool(call.attrs.get("detect_positive", True))

    def f(*i: Scalar) -> Scalar:
        v = upcast(x[i], x.dtype)
        if name == "isnan":
            return te.isnan(v)
        conds = [te.isinf(v)]
        if not neg:
            conds.append(te.gt(v, 0.0))
        if not pos:
            conds.append(te.lt(v, 0.0))
        return te.all(*conds)

    out = te.compute(shape, f, name, "bool")
    return ctx.call_te(name, call.args, [x], [out], call.info)


register(Op("isnan", _infer_isnan, OpPattern.ELEMWISE, num_args=1, legalize=_legalize_isnan))
register(Op("isinf", _infer_isnan, OpPattern.ELEMWISE, attrs={"detect_negative": True, "detect_positive": True}, num_args=1, legalize=_legalize_isnan))


def isnan(x: Expr) -> Call:
    """True where ``x`` is NaN."""
    return make_call("isnan", [x])


def isinf(x: Expr, detect_negative: bool = True, detect_positive: bool = True) -> Call:
    """True where ``x`` is an infinity of a detected sign."""
    return make_call("isinf", [x], detect_negative=detect_negative, detect_positive=detect_positive)


# -- fmod and bit shifts ---------------------------------------------------------------------


def _infer_int_binary(call: Call, ctx: InferCtx) -> StructInfo:
    a, b = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    dtype = unify_dtype([a.dtype, b.dtype], ctx)
    if dtype == "bool":
        raise ctx.error("expects numeric tensors, got bool")
    if ctx.op_name == "bitshift" and dtype is not None and dtype not in INT_DTYPES:
        raise ctx.error(f"expects integer tensors, got {dtype}")
    if a.shape is None or b.shape is None:
        return TensorInfo(None, dtype, -1 if -1 in (a.ndim, b.ndim) else max(a.ndim, b.ndim))
    return TensorInfo(broadcast_shapes(a.shape, b.shape, ctx), dtype)


def _legalize_int_binary(call: Call, ctx: "LegalizeCtx") -> Expr:
    """fmod: ``a - trunc(a / b) * b`` (the sign of ``a``; 0 for an integer ``b == 0``).
    bitshift: ``a * 2**b`` or ``a // 2**b`` (arithmetic) in int64, wrapped to the dtype; a
    shift outside ``[0, bits)`` leaves only the sign fill (-1 for a right shift of a negative
    ``a``, else 0)."""
    name = call.callee.name  # type: ignore[attr-defined]
    a, b = arg(call, 0, "a"), arg(call, 1, "b")
    shape, dtype = out_tensor(call)
    left = call.attrs.get("direction", "left") == "left"
    bits = {"int8": 8, "uint8": 8, "int16": 16, "int32": 32}.get(dtype, 64)

    def f(*i: Scalar) -> Scalar:
        va = upcast(a[bcast_index(i, a.shape, shape)], a.dtype)
        vb = upcast(b[bcast_index(i, b.shape, shape)], b.dtype)
        if name == "bitshift":
            wa, wb = te.cast(va, "int64"), te.cast(vb, "int64")
            inside = te.logical_and(te.ge(wb, 0), te.lt(wb, bits))
            p = te.cast(te.power(te.cast(2.0, "float64"), te.cast(te.if_then_else(inside, wb, 0), "float64")), "int64")
            r = wa * p if left else wa // p  # type: ignore[operator]
            spill = 0 if left else te.if_then_else(te.lt(wa, 0), -1, 0)
            return te.if_then_else(inside, r, spill)
        if is_float_dtype(dtype):
            q = va / vb  # type: ignore[operator]
            return va - te.if_then_else(te.lt(q, 0.0), te.ceil(q), te.floor(q)) * vb  # type: ignore[operator]
        q = te.truncdiv(va, te.if_then_else(te.eq(vb, 0), 1, vb))
        return te.if_then_else(te.eq(vb, 0), 0, va - q * vb)  # type: ignore[operator]

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [a, b], [out], call.info)


register(Op("fmod", _infer_int_binary, OpPattern.BROADCAST, num_args=2, legalize=_legalize_int_binary))
register(Op("bitshift", _infer_int_binary, OpPattern.BROADCAST, attrs={"direction": "left"}, num_args=2, legalize=_legalize_int_binary))


def fmod(a: Expr, b: Expr) -> Call:
    """C's ``fmod``: the remainder of truncating division, with the sign of ``a``."""
    return make_call("fmod", [a, b])


def bitshift(a: Expr, b: Expr, direction: str = "left") -> Call:
    """``a << b`` or ``a >> b`` (``direction`` ``"right"``) on integer tensors."""
    return make_call("bitshift", [a, b], direction=direction)


# -- one_hot, hardmax, eye_like --------------------------------------------------------------


def _infer_one_hot(call: Call, ctx: InferCtx) -> StructInfo:
    idx, values = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    depth = call.attrs["depth"]
    if isinstance(depth, bool) or not isinstance(depth, (int, sym.SymExpr)):
        raise ctx.error(f"attribute depth must be an int or a symbolic dim, got {depth!r}")
    if values.shape is not None and values.shape != (2,):
        raise ctx.shape_error(f"values must have shape (2,) (off, on), got {values.shape}")
    if idx.shape is None:
        return TensorInfo(None, values.dtype, -1 if idx.ndim == -1 else idx.ndim + 1)
    a = normalize_axis(int_attr(call, "axis", ctx), len(idx.shape) + 1, ctx)
    return TensorInfo(idx.shape[:a] + (depth,) + idx.shape[a:], values.dtype)


def _legalize_one_hot(call: Call, ctx: "LegalizeCtx") -> Expr:
    """Indices count from the end when negative; one outside ``[-depth, depth)`` gives a row
    of ``off`` values."""
    idx, values = arg(call, 0, "indices"), arg(call, 1, "values")
    shape, dtype = out_tensor(call)
    a = normalize_axis(int(call.attrs["axis"]), len(shape), InferCtx("one_hot"))
    depth = call.attrs["depth"]

    def f(*i: Scalar) -> Scalar:
        raw = idx[i[:a] + i[a + 1 :]]
        v = te.cast(te.floor(raw) if is_float_dtype(idx.dtype) else raw, "int64")
        v = te.if_then_else(te.lt(v, 0), v + depth, v)  # type: ignore[operator]
        return te.if_then_else(te.eq(v, i[a]), values[1], values[0])

    out = te.compute(shape, f, "one_hot", dtype)
    return ctx.call_te("one_hot", call.args, [idx, values], [out], call.info)


def _infer_hardmax(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if x.ndim != -1:
        normalize_axis(int_attr(call, "axis", ctx), x.ndim, ctx)
    return x


def _legalize_hardmax(call: Call, ctx: "LegalizeCtx") -> Expr:
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    a = normalize_axis(int(call.attrs["axis"]), len(shape), InferCtx("hardmax"))
    rows = shape[:a] + shape[a + 1 :]

    def first_max(*r: Scalar) -> Scalar:
        k = te.reduce_axis(shape[a], "k")
        return te.argmax(upcast(x[r[:a] + (k,) + r[a:]], x.dtype), axis=k)

    am = te.compute(rows, first_max, "argmax")
    out = te.compute(shape, lambda *i: te.if_then_else(te.eq(am[i[:a] + i[a + 1 :]], i[a]), 1, 0), "hardmax", dtype)
    return ctx.call_te("hardmax", call.args, [x], [out], call.info)


def _infer_eye_like(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if x.ndim not in (-1, 2):
        raise ctx.shape_error(f"expects a 2-D tensor, got rank {x.ndim}")
    dtype = dtype_attr(call, "dtype", ctx)
    return TensorInfo(x.shape, x.dtype if dtype is None else dtype, 2)


def _legalize_eye_like(call: Call, ctx: "LegalizeCtx") -> Expr:
    shape, dtype = out_tensor(call)
    k = int(call.attrs["k"])
    out = te.compute(shape, lambda i, j: te.if_then_else(te.eq(j - i, k), 1, 0), "eye_like", dtype)  # type: ignore[operator]
    return ctx.call_te("eye_like", [], [], [out], call.info)


register(Op("one_hot", _infer_one_hot, OpPattern.INJECTIVE, attrs={"depth": 1, "axis": -1}, num_args=2, legalize=_legalize_one_hot))
register(Op("hardmax", _infer_hardmax, OpPattern.REDUCTION, attrs={"axis": -1}, num_args=1, legalize=_legalize_hardmax))
register(Op("eye_like", _infer_eye_like, OpPattern.INJECTIVE, attrs={"k": 0, "dtype": None}, num_args=1, legalize=_legalize_eye_like))


def one_hot(indices: Expr, values: Expr, depth: sym.Dim, axis: int = -1) -> Call:
    """A new axis of length ``depth`` at ``axis``: ``values[1]`` where it equals the index,
    ``values[0]`` elsewhere (``values`` is ``[off, on]``)."""
    return make_call("one_hot", [indices, values], depth=depth, axis=axis)


def hardmax(x: Expr, axis: int = -1) -> Call:
    """1 at the first maximum of ``x`` along ``axis``, 0 elsewhere."""
    return make_call("hardmax", [x], axis=axis)


def eye_like(x: Expr, k: int = 0, dtype: str | None = None) -> Call:
    """Ones on diagonal ``k`` of a matrix shaped like ``x``, zeros elsewhere."""
    return make_call("eye_like", [x], k=k, dtype=dtype)


# -- logsumexp ---------------------------------------------------------------------------------


def _infer_logsumexp(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    require_float(x, ctx)
    return reduced_info(x, axes_attr(call, "axis", ctx), bool_attr(call, "keepdims", ctx), x.dtype, ctx)


def _legalize_logsumexp(call: Call, ctx: "LegalizeCtx") -> Expr:
    """``m + log(sum(exp(x - m)))`` with ``m`` the maximum (``-inf`` for an empty set, where
    the result is ``-inf`` too)."""
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    axis = axes_attr(call, "axis", InferCtx("logsumexp"))
    axes = tuple(range(x.ndim)) if axis is None else tuple(sorted(normalize_axes(axis, x.ndim, InferCtx("logsumexp"))))
    keep = bool(call.attrs["keepdims"])
    acc = compute_dtype(dtype)
    rows = tuple(d for k, d in enumerate(x.shape) if k not in axes)

    def src(r: Sequence[Scalar], ks: Sequence[Scalar]) -> Scalar:
        it_r, it_k = iter(r), iter(ks)
        return te.cast(x[tuple(next(it_k) if d in axes else next(it_r) for d in range(x.ndim))], acc)

    def row_max(*r: Scalar) -> Scalar:
        ks = [te.reduce_axis(x.shape[a], f"k{a}") for a in axes]
        return te.max(src(r, ks), axis=ks) if ks else src(r, ())

    mx = te.compute(rows, row_max, "row_max")

    def row_sum(*r: Scalar) -> Scalar:
        ks = [te.reduce_axis(x.shape[a], f"k{a}") for a in axes]
        m = mx[r]
        safe = te.if_then_else(te.isinf(m), 0.0, m)
        if not ks:
            return te.exp(src(r, ()) - safe)  # type: ignore[operator]
        return te.sum(te.exp(src(r, ks) - safe), axis=ks)  # type: ignore[operator]

    total = te.compute(rows, row_sum, "row_sum")

    def f(*i: Scalar) -> Scalar:
        r = tuple(v for k, v in enumerate(i) if k not in axes) if keep else i
        m = mx[r]
        safe = te.if_then_else(te.isinf(m), 0.0, m)
        return safe + te.log(total[r])  # type: ignore[operator, no-any-return]

    out = te.compute(shape, f, "logsumexp", dtype)
    return ctx.call_te("logsumexp", call.args, [x], [out], call.info)


register(Op("logsumexp", _infer_logsumexp, OpPattern.REDUCTION, attrs={"axis": None, "keepdims": False}, num_args=1, legalize=_legalize_logsumexp))


def logsumexp(x: Expr, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Call:
    """``log(sum(exp(x)))`` over ``axis`` (None: all axes), computed without overflow."""
    ax = None if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
    return make_call("logsumexp", [x], axis=ax, keepdims=keepdims)


# -- cumprod -----------------------------------------------------------------------------------


def _infer_cumprod(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    if x.dtype == "bool":
        raise ctx.error("expects a numeric tensor, got bool")
    if x.ndim != -1:
        normalize_axis(int_attr(call, "axis", ctx), x.ndim, ctx)
    bool_attr(call, "exclusive", ctx)
    bool_attr(call, "reverse", ctx)
    return x


def _legalize_cumprod(call: Call, ctx: "LegalizeCtx") -> Expr:
    """``out[i] = prod(x[q] for q up to i along axis)`` (``exclusive`` stops before ``i``,
    ``reverse`` runs from the end): a product over the axis per element (quadratic in its
    length)."""
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    a = normalize_axis(int(call.attrs["axis"]), len(shape), InferCtx("cumprod"))
    excl, rev = bool(call.attrs["exclusive"]), bool(call.attrs["reverse"])

    def f(*i: Scalar) -> Scalar:
        q = te.reduce_axis(shape[a], "q")
        if rev:
            cond = te.gt(q, i[a]) if excl else te.ge(q, i[a])
        else:
            cond = te.lt(q, i[a]) if excl else te.le(q, i[a])
        return te.prod(upcast(x[i[:a] + (q,) + i[a + 1 :]], x.dtype), axis=q, where=cond)

    out = te.compute(shape, f, "cumprod", dtype)
    return ctx.call_te("cumprod", call.args, [x], [out], call.info)


register(Op("cumprod", _infer_cumprod, OpPattern.OPAQUE, attrs={"axis": -1, "exclusive": False, "reverse": False}, num_args=1, legalize=_legalize_cumprod))


def cumprod(x: Expr, axis: int = -1, exclusive: bool = False, reverse: bool = False) -> Call:
    """Running products along ``axis`` (ONNX CumProd: ``exclusive`` leaves the element itself
    out, ``reverse`` multiplies from the end)."""
    return make_call("cumprod", [x], axis=axis, exclusive=exclusive, reverse=reverse)


# -- einsum ------------------------------------------------------------------------------------


def parse_einsum(equation: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """The operands' subscripts and the output's, with ``...`` replaced by capital letters (one
    per broadcast dim, right-aligned across operands) and an implicit output made explicit
    (the letters seen once, sorted, after the ellipsis)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"einsum {equation!r} has {len(terms)} operand(s), got {len(ranks)}")
    ell = max((r - (len(t) - 3) for t, r in zip(terms, ranks) if "..." in t), default=0)
    caps = "ZYXWVUTSRQPONMLKJIHGFEDCBA"[:ell][::-1]
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            t = t.replace("...", caps[ell - (r - (len(t) - 3)) :])
        if len(t) != r or (t and not t.isalpha()):
            raise ValueError(f"einsum {equation!r}: subscripts {t!r} do not match an operand of rank {r}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", caps)
    else:
        letters = "".join(out_terms)
        out = caps + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in caps))
    if not (out.isalpha() or out == "") or len(set(out)) != len(out):
        raise ValueError(f"einsum {equation!r}: bad output subscripts {out!r}")
    return out_terms, out


def _einsum_dims(call: Call, ctx: InferCtx) -> tuple[list[str], str, dict[str, sym.Dim], str | None] | None:
    xs = [tensor_arg(call, i, ctx) for i in range(len(call.args))]
    if any(x.shape is None for x in xs):
        return None
    try:
        terms, out = parse_einsum(str(call.attrs["equation"]), [len(x.shape) for x in xs])  # type: ignore[arg-type]
    except ValueError as e:
        raise ctx.error(str(e)) from None
    sizes: dict[str, sym.Dim] = {}
    for t, x in zip(terms, xs):
        assert x.shape is not None
        for c, d in zip(t, x.shape):
            if c not in sizes or (isinstance(sizes[c], int) and sizes[c] == 1):
                sizes[c] = d
            elif not (isinstance(d, int) and d == 1):
                require_equal(sizes[c], d, ctx, f"dims labelled {c!r}")
    for c in out:
        if c not in sizes:
            raise ctx.error(f"output subscript {c!r} names no operand dim")
    return terms, out, sizes, unify_dtype([x.dtype for x in xs], ctx)


def _infer_einsum(call: Call, ctx: InferCtx) -> StructInfo:
    if not call.args:
        raise ctx.error("needs at least one operand")
    parsed = _einsum_dims(call, ctx)
    if parsed is None:
        return TensorInfo(None, tensor_arg(call, 0, ctx).dtype, -1)
    _, out, sizes, dtype = parsed
    return TensorInfo(tuple(sizes[c] for c in out), dtype)


def _legalize_einsum(call: Call, ctx: "LegalizeCtx") -> Expr:
    """One kernel: the product of the operands summed over the letters not in the output (a
    dim of size 1 broadcasts against its letter's size)."""
    xs = [arg(call, i, f"x{i}") for i in range(len(call.args))]
    parsed = _einsum_dims(call, InferCtx("einsum"))
    assert parsed is not None
    terms, out, sizes, _ = parsed
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    summed = sorted({c for t in terms for c in t} - set(out))

    def f(*i: Scalar) -> Scalar:
        env: dict[str, Scalar] = dict(zip(out, i))
        ks = [te.reduce_axis(sizes[c], f"k_{c}") for c in summed]
        env.update(zip(summed, ks))
        value: Any = None
        for x, t in zip(xs, terms):
            idx = tuple(0 if isinstance(d, int) and d == 1 and not (isinstance(sizes[c], int) and sizes[c] == 1) else env[c] for c, d in zip(t, x.shape))
            v = te.cast(x[idx], acc)
            value = v if value is None else value * v
        return te.sum(value, axis=ks) if ks else value  # type: ignore[no-any-return]

    result = te.compute(shape, f, "einsum", dtype)
    return ctx.call_te("einsum", call.args, xs, [result], call.info)


register(Op("einsum", _infer_einsum, OpPattern.OPAQUE, attrs={"equation": ""}, legalize=_legalize_einsum))


def einsum(equation: str, *operands: Expr) -> Call:
    """NumPy's ``einsum`` (explicit or implicit output, ``...`` broadcasting)."""
    return make_call("einsum", list(operands), equation=equation)

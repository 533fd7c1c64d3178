"""Neural-network ops: ``softmax``, ``log_softmax``, ``layer_norm``, ``rms_norm`` and
``attention``. The activations (``relu``, ``gelu``, ``silu``, ``sigmoid``, ``tanh``) are
elementwise ops and live in ``tilework.op.elementwise``.

``attention`` takes ``q: [batch, seq_q, num_heads, head_dim]`` and
``k, v: [batch, seq_kv, num_kv_heads, head_dim(_v)]``; query head ``h`` reads kv head
``h // (num_heads // num_kv_heads)`` (grouped-query attention), so ``num_heads`` must be a
multiple of ``num_kv_heads``. An optional mask (bool: True keeps, or float: added to the
scores) broadcasts to ``[batch, num_heads, seq_q, seq_kv]``. With ``causal``, query ``i`` sees
keys ``j <= i + seq_kv - seq_q`` (aligned at the end, which is what decoding with a KV cache
needs). ``scale`` None means ``1 / sqrt(head_dim)``. ``bf16`` (float32 attention only, set by
``tilework.compile(..., precision="bf16")``): the products in bfloat16 with float32 sums, the
query, keys, values and probabilities rounded to bfloat16 (``dot_bf16x2``: AVX-512 BF16's
``vdpbf16ps`` where the CPU has it); each output is then off by at most about ``2**-8`` of the
scores' and the values' magnitudes more.

Legalization computes statistics in float32 for float16/bfloat16 and subtracts the row max
before ``exp``; attention is a hand-built kernel (``tilework.op.attention_kernel``) with
O(block) scratch per task, and a query that sees no key gets zeros.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.loop import Buffer, Scalar
from tilework.ir.sym import Dim
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    axes_attr,
    bool_attr,
    int_attr,
    may_be_float,
    make_call,
    normalize_axes,
    normalize_axis,
    register,
    require_equal,
    require_expands,
    require_float,
    tensor_arg,
    unify_dtype,
)
from tilework.op.attention_kernel import attention_kernel
from tilework.op.calls import call_tensor
from tilework.op.kernel import Index, arg, compute_dtype, known_tensor, op_name, out_tensor

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx


def _float_attr(call: Call, name: str, ctx: InferCtx, optional: bool = False) -> None:
    v = call.attrs[name]
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ctx.error(f"attribute {name} must be a number, got {v!r}")


def _infer_softmax(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    require_float(x, ctx)
    axis = int_attr(call, "axis", ctx)
    if x.ndim != -1:
        normalize_axis(axis, x.ndim, ctx)
    return x


def _check_param(x: TensorInfo, p: TensorInfo, axes: tuple[int, ...], ctx: InferCtx, what: str) -> None:
    """A norm's scale/shift has the shape of ``x`` over the normalized axes."""
    if p.ndim not in (-1, len(axes)):
        raise ctx.shape_error(f"{what} must have rank {len(axes)} (the normalized axes), got shape {shape_str(p.shape)}")
    if x.shape is None or p.shape is None:
        return
    for a, d in zip(axes, p.shape):
        require_equal(x.shape[a], d, ctx, f"{what} {shape_str(p.shape)} does not match axis {a} of input {shape_str(x.shape)}")


def _infer_norm(call: Call, ctx: InferCtx) -> StructInfo:
    x = tensor_arg(call, 0, ctx)
    params = [tensor_arg(call, i, ctx) for i in range(1, len(call.args))]
    require_float(x, ctx)
    _float_attr(call, "eps", ctx)
    dtype = unify_dtype([x.dtype] + [p.dtype for p in params], ctx)
    axes = axes_attr(call, "axes", ctx)
    if not axes:
        raise ctx.error("attribute axes must name at least one axis")
    if x.ndim != -1:
        norm = normalize_axes(axes, x.ndim, ctx)
        for name, p in zip(("gamma", "beta") if ctx.op_name == "layer_norm" else ("weight",), params):
            _check_param(x, p, norm, ctx, name)
    return TensorInfo(x.shape, dtype, x.ndim)


def _check_rank4(t: TensorInfo, name: str, ctx: InferCtx) -> None:
    if t.ndim not in (-1, 4):
        raise ctx.shape_error(f"{name} must be 4-D [batch, seq, heads, head_dim], got shape {shape_str(t.shape)}")


def _pairs_equal(pairs: Sequence[tuple[str, TensorInfo, str, TensorInfo, int, int, str]], ctx: InferCtx) -> None:
    for na, a, nb, b, ia, ib, what in pairs:
        if a.shape is None or b.shape is None:
            continue
        require_equal(a.shape[ia], b.shape[ib], ctx, f"{what} of {na} {shape_str(a.shape)} and {nb} {shape_str(b.shape)} differ")


def _check_groups(h: Dim, hkv: Dim, ctx: InferCtx) -> None:
    msg = f"num_heads {sym.to_str(h)} must be a multiple of num_kv_heads {sym.to_str(hkv)}"
    if isinstance(hkv, int) and hkv <= 0:
        raise ctx.shape_error(msg)
    rem = sym.floormod(h, hkv)
    if rem == 0:
        return
    if isinstance(rem, int):
        raise ctx.shape_error(msg)
    ctx.require("divides", (h, hkv), msg)


def _infer_attention(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.args) not in (3, 4):
        raise ctx.error(f"takes (q, k, v) or (q, k, v, mask), got {len(call.args)} argument(s)")
    q, k, v = (tensor_arg(call, i, ctx) for i in range(3))
    bool_attr(call, "causal", ctx)
    bool_attr(call, "bf16", ctx)
    _float_attr(call, "scale", ctx, optional=True)
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_rank4(t, name, ctx)
    dtype = unify_dtype([q.dtype, k.dtype, v.dtype], ctx)
    if not may_be_float(dtype):
        raise ctx.error(f"q, k and v must be floating-point tensors, got {dtype}")
    kv, kv_name = (k, "k") if k.shape is not None else (v, "v")
    _pairs_equal(
        [
            ("q", q, kv_name, kv, 0, 0, "batch"),
            ("k", k, "v", v, 0, 0, "batch"),
            ("k", k, "v", v, 1, 1, "seq_kv"),
            ("k", k, "v", v, 2, 2, "num_kv_heads"),
            ("q", q, "k", k, 3, 3, "head_dim"),
        ],
        ctx,
    )
    if q.shape is not None and kv.shape is not None:
        _check_groups(q.shape[2], kv.shape[2], ctx)
    if len(call.args) == 4:
        _check_mask(tensor_arg(call, 3, ctx), q, k, ctx)
    if q.shape is None or v.shape is None:
        return TensorInfo(None, dtype, 4)
    return TensorInfo(q.shape[:3] + (v.shape[3],), dtype)


def _check_mask(mask: TensorInfo, q: TensorInfo, k: TensorInfo, ctx: InferCtx) -> None:
    if mask.dtype != "bool" and not may_be_float(mask.dtype):
        raise ctx.error(f"mask must be bool or floating-point, got {mask.dtype}")
    if mask.ndim > 4:
        raise ctx.shape_error(f"mask must broadcast to [batch, num_heads, seq_q, seq_kv], got shape {shape_str(mask.shape)}")
    if mask.shape is None or q.shape is None or k.shape is None:
        return
    target = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
    require_expands(mask.shape, target, ctx, "mask")


# -- legalization ---------------------------------------------------------------------------


def _kept_dims(shape: Sequence[Dim], axes: Sequence[int]) -> tuple[Dim, ...]:
    """``shape`` without ``axes``: the shape of per-row statistics."""
    return tuple(d for k, d in enumerate(shape) if k not in axes)


def _split_index(i: Index, axes: Sequence[int]) -> tuple[Index, Index]:
    """``i`` split into the index of the kept dims and that of ``axes`` (in ``axes`` order)."""
    return tuple(v for k, v in enumerate(i) if k not in axes), tuple(i[a] for a in axes)


def _join_index(kept: Index, inner: Index, ndim: int, axes: Sequence[int]) -> Index:
    """The inverse of ``_split_index``."""
    rest = iter(kept)
    pos = {a: k for k, a in enumerate(axes)}
    return tuple(inner[pos[d]] if d in pos else next(rest) for d in range(ndim))


def _legalize_softmax(call: Call, ctx: "LegalizeCtx") -> Expr:
    """Numerically stable: ``exp(x - max)`` never overflows. softmax computes each ``exp``
    once, into a tensor of the output's shape that the row sum and the output read (the
    reduction rule stores it in the output itself when the dtypes agree, so the scratch
    costs nothing); with a narrower output dtype the output recomputes it instead."""
    name = op_name(call)
    x = arg(call, 0, "x")
    shape, dtype = out_tensor(call)
    axis = (normalize_axis(int(call.attrs["axis"]), x.ndim, InferCtx(name)),)
    acc = compute_dtype(dtype)
    rows = _kept_dims(x.shape, axis)

    def v(idx: Index) -> Scalar:
        return te.cast(x[idx], acc)

    def row_max(*r: Scalar) -> Scalar:
        k = te.reduce_axis(x.shape[axis[0]], "k")
        return te.max(v(_join_index(r, (k,), x.ndim, axis)), axis=k)

    mx = te.compute(rows, row_max, "row_max")

    def shifted(i: Index) -> Scalar:
        return v(i) - mx[_split_index(i, axis)[0]]

    stored = name == "softmax" and acc == dtype
    e = te.compute(shape, lambda *i: te.exp(shifted(i)), "exp") if stored else None

    def exp_at(i: Index) -> Scalar:
        return e[i] if e is not None else te.exp(shifted(i))

    def row_sum(*r: Scalar) -> Scalar:
        k = te.reduce_axis(x.shape[axis[0]], "k")
        return te.sum(exp_at(_join_index(r, (k,), x.ndim, axis)), axis=k)

    total = te.compute(rows, row_sum, "row_sum")

    def f(*i: Scalar) -> Scalar:
        r = _split_index(i, axis)[0]
        if name == "log_softmax":
            return shifted(i) - te.log(total[r])
        return exp_at(i) * (1.0 / total[r])

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [x], [out], call.info)


def _legalize_norm(call: Call, ctx: "LegalizeCtx") -> Expr:
    """layer_norm: ``(x - mean) * rsqrt(var + eps) * gamma + beta`` with the variance taken
    about the mean (two passes); rms_norm: ``x * rsqrt(mean(x * x) + eps) * weight``."""
    name = op_name(call)
    x = arg(call, 0, "x")
    params = [arg(call, k, f"p{k}") for k in range(1, len(call.args))]
    shape, dtype = out_tensor(call)
    axes = normalize_axes(axes_attr(call, "axes", InferCtx(name)) or (), x.ndim, InferCtx(name))
    acc = compute_dtype(dtype)
    eps = float(call.attrs["eps"])
    rows = _kept_dims(x.shape, axes)
    count = te.cast(sym.product(x.shape[a] for a in axes), acc)

    def v(idx: Index) -> Scalar:
        return te.cast(x[idx], acc)

    def row_mean(of: Callable[[Index, Index], Scalar]) -> Callable[..., Scalar]:
        def f(*r: Scalar) -> Scalar:
            ks = tuple(te.reduce_axis(x.shape[a], f"k{a}") for a in axes)
            return te.sum(of(r, _join_index(r, ks, x.ndim, axes)), axis=list(ks)) / count

        return f

    if name == "rms_norm":
        ms = te.compute(rows, row_mean(lambda r, i: v(i) * v(i)), "mean_square")

        def f(*i: Scalar) -> Scalar:
            r, inner = _split_index(i, axes)
            return v(i) * te.rsqrt(ms[r] + eps) * te.cast(params[0][inner], acc)

    else:
        mean = te.compute(rows, row_mean(lambda r, i: v(i)), "mean")

        def dev2(r: Index, i: Index) -> Scalar:
            d = v(i) - mean[r]
            return d * d

        var = te.compute(rows, row_mean(dev2), "var")

        def f(*i: Scalar) -> Scalar:
            r, inner = _split_index(i, axes)
            y = (v(i) - mean[r]) * te.rsqrt(var[r] + eps)
            return y * te.cast(params[0][inner], acc) + te.cast(params[1][inner], acc)

    out = te.compute(shape, f, name, dtype)
    return ctx.call_te(name, call.args, [x, *params], [out], call.info)


def _legalize_attention(call: Call, ctx: "LegalizeCtx") -> Expr:
    """The hand-built kernel of ``tilework.op.attention_kernel``: per (batch, kv head, block of
    query rows) an online softmax over blocks of keys, O(block) scratch. Masked-out keys
    (causal, or False in a bool mask) weigh 0; a query that sees no key at all gets zeros
    (torch would give NaN)."""
    names = ("q", "k", "v", "mask")
    bufs = []
    for i in range(len(call.args)):
        shape, dtype = known_tensor(call.args[i].info, call, f"argument {i}")
        bufs.append(Buffer(names[i], shape, dtype))
    shape, dtype = out_tensor(call)
    out = Buffer("out", shape, dtype)
    mask = bufs[3] if len(bufs) == 4 else None
    given = call.attrs["scale"]
    scale = None if given is None else float(given)
    func = attention_kernel(bufs[0], bufs[1], bufs[2], mask, out, bool(call.attrs["causal"]), scale, ctx.vector_bytes, bool(call.attrs["bf16"]))
    gv = ctx.add_kernel("attention", func)
    return call_tensor(gv, list(call.args), call.info, tuple(func.sym_params))


register(Op("softmax", _infer_softmax, OpPattern.REDUCTION, attrs={"axis": -1}, num_args=1, legalize=_legalize_softmax))
register(Op("log_softmax", _infer_softmax, OpPattern.REDUCTION, attrs={"axis": -1}, num_args=1, legalize=_legalize_softmax))
register(Op("layer_norm", _infer_norm, OpPattern.REDUCTION, attrs={"axes": (-1,), "eps": 1e-5}, num_args=3, legalize=_legalize_norm))
register(Op("rms_norm", _infer_norm, OpPattern.REDUCTION, attrs={"axes": (-1,), "eps": 1e-6}, num_args=2, legalize=_legalize_norm))
register(Op("attention", _infer_attention, OpPattern.OPAQUE, attrs={"causal": False, "scale": None, "bf16": False}, legalize=_legalize_attention))


def _axes(axes: int | Sequence[int]) -> tuple[int, ...]:
    return (axes,) if isinstance(axes, int) else tuple(axes)


def softmax(x: Expr, axis: int = -1) -> Call:
    """``exp(x) / sum(exp(x))`` along ``axis``."""
    return make_call("softmax", [x], axis=axis)


def log_softmax(x: Expr, axis: int = -1) -> Call:
    """``x - log(sum(exp(x)))`` along ``axis``."""
    return make_call("log_softmax", [x], axis=axis)


def layer_norm(x: Expr, gamma: Expr, beta: Expr, axes: int | Sequence[int] = (-1,), eps: float = 1e-5) -> Call:
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` with statistics over ``axes``; ``gamma``
    and ``beta`` have the shape of those axes."""
    return make_call("layer_norm", [x, gamma, beta], axes=_axes(axes), eps=float(eps))


def rms_norm(x: Expr, weight: Expr, axes: int | Sequence[int] = (-1,), eps: float = 1e-6) -> Call:
    """``x / sqrt(mean(x * x) + eps) * weight`` over ``axes``."""
    return make_call("rms_norm", [x, weight], axes=_axes(axes), eps=float(eps))


def attention(
    q: Expr,
    k: Expr,
    v: Expr,
    mask: Expr | None = None,
    causal: bool = False,
    scale: float | None = None,
    bf16: bool = False,
) -> Call:
    """Scaled dot-product attention over ``[batch, seq, heads, head_dim]`` tensors (see the
    module docstring for grouped KV heads, the mask, causal alignment and ``bf16``)."""
    args = [q, k, v] if mask is None else [q, k, v, mask]
    return make_call("attention", args, causal=causal, scale=None if scale is None else float(scale), bf16=bf16)

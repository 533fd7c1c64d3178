"""Linear algebra: ``matmul`` (NumPy ``matmul`` semantics, batched and broadcast), ``linear``
(``x @ weight.T + bias`` with torch's ``[out_features, in_features]`` weight layout),
``linear_io`` (the same with the weight packed in column panels ``[panels, in_features,
width]``, as ``layout_weights`` lays it out at compile time), ``batch_linear_io`` (a batch of
those: ``x[b]`` by the packed weight ``w[b]``, as a Winograd convolution multiplies) and
``einsum`` (NumPy's, with explicit or implicit output and ``...`` broadcasting).

The contracted dims must be equal: a provable mismatch is an error, an unprovable one a run-time
check. Batch dims broadcast symbolically like elementwise ops.

Legalization accumulates in the result's dtype (float32 for float16/bfloat16 results).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from tilework import te
from tilework.ir import sym
from tilework.ir.graph import Call, Expr
from tilework.ir.info import StructInfo, TensorInfo, shape_str
from tilework.ir.loop import PExpr, Scalar
from tilework.ir.sym import Dim
from tilework.op.base import (
    InferCtx,
    Op,
    OpPattern,
    broadcast_dims,
    dtype_attr,
    make_call,
    register,
    require_equal,
    tensor_arg,
    unify_dtype,
)
from tilework.op.kernel import arg, bcast_index, compute_dtype, out_tensor, own_rows

if TYPE_CHECKING:
    from tilework.transform.legalize import LegalizeCtx


def _matmul_ndim(na: int, nb: int) -> int:
    if na == -1 or nb == -1:
        return -1
    if na == 1 and nb == 1:
        return 0
    if na == 1:
        return nb - 1
    if nb == 1:
        return na - 1
    return na if na > nb else nb


def matmul_shape(sa: tuple[Dim, ...], sb: tuple[Dim, ...], ctx: InferCtx) -> tuple[Dim, ...]:
    """The shape of ``a @ b``: a 1-D ``a`` is a row, a 1-D ``b`` a column (both dropped after)."""
    a2 = (1,) + sa if len(sa) == 1 else sa
    b2 = sb + (1,) if len(sb) == 1 else sb
    require_equal(a2[-1], b2[-2], ctx, f"contracted dims of {shape_str(sa)} and {shape_str(sb)} differ")
    ba, bb = a2[:-2], b2[:-2]
    n = len(ba) if len(ba) > len(bb) else len(bb)
    pa = (1,) * (n - len(ba)) + ba
    pb = (1,) * (n - len(bb)) + bb
    batch = tuple(broadcast_dims(x, y, ctx, sa, sb) for x, y in zip(pa, pb))
    rows = (a2[-2],) if len(sa) > 1 else ()
    cols = (b2[-1],) if len(sb) > 1 else ()
    return batch + rows + cols


def _infer_matmul(call: Call, ctx: InferCtx) -> StructInfo:
    a, b = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    out_dtype = dtype_attr(call, "out_dtype", ctx)
    dtype = unify_dtype([a.dtype, b.dtype], ctx)
    if out_dtype is not None:
        dtype = out_dtype
    if a.ndim == 0 or b.ndim == 0:
        raise ctx.shape_error(f"operands must have at least one dim, got shapes {shape_str(a.shape)} and {shape_str(b.shape)}")
    if a.shape is None or b.shape is None:
        return TensorInfo(None, dtype, _matmul_ndim(a.ndim, b.ndim))
    return TensorInfo(matmul_shape(a.shape, b.shape, ctx), dtype)


def _infer_linear(call: Call, ctx: InferCtx) -> StructInfo:
    if len(call.args) not in (2, 3):
        raise ctx.error(f"takes (x, weight) or (x, weight, bias), got {len(call.args)} argument(s)")
    x, w = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    bias = tensor_arg(call, 2, ctx) if len(call.args) == 3 else None
    dtype = unify_dtype([x.dtype, w.dtype] + ([bias.dtype] if bias else []), ctx)
    if x.ndim == 0:
        raise ctx.shape_error("input must have at least one dim, got shape ()")
    if w.ndim not in (-1, 2):
        raise ctx.shape_error(f"weight must be 2-D [out_features, in_features], got shape {shape_str(w.shape)}")
    if bias is not None and bias.ndim not in (-1, 1):
        raise ctx.shape_error(f"bias must be 1-D [out_features], got shape {shape_str(bias.shape)}")
    out_features: Dim | None = None
    if w.shape is not None:
        out_features = w.shape[0]
        if x.shape is not None:
            require_equal(x.shape[-1], w.shape[1], ctx, f"in_features of input {shape_str(x.shape)} and weight {shape_str(w.shape)} differ")
    if bias is not None and bias.shape is not None:
        if out_features is None:
            out_features = bias.shape[0]
        else:
            require_equal(out_features, bias.shape[0], ctx, f"out_features of weight {shape_str(w.shape)} and bias {shape_str(bias.shape)} differ")
    if x.shape is None or out_features is None:
        return TensorInfo(None, dtype, x.ndim)
    return TensorInfo(x.shape[:-1] + (out_features,), dtype)


def _out_features(call: Call, ctx: InferCtx) -> int:
    """The ``out_features`` attr of a packed product: a positive int."""
    n = call.attrs.get("out_features")
    if not isinstance(n, int) or n < 1:
        raise ctx.error(f"out_features must be a positive int, got {n!r}")
    return n


def _check_panels(w: TensorInfo, n: int, ctx: InferCtx) -> None:
    """``w``'s last three dims ``[panels, in_features, width]`` (a weight packed in column
    panels): a static width, and at least ``n`` columns."""
    assert w.shape is not None
    panels, width = w.shape[-3], w.shape[-1]
    if not isinstance(width, int) or width < 1:
        raise ctx.shape_error(f"the panel width of weight {shape_str(w.shape)} must be a static positive int")
    if sym.prove_le(sym.mul(panels, width), n - 1):
        raise ctx.shape_error(f"weight {shape_str(w.shape)} holds fewer than out_features = {n} columns")


def _infer_linear_io(call: Call, ctx: InferCtx) -> StructInfo:
    """``linear_io(x, weight, bias?, out_features)``: ``linear`` with the weight packed in
    column panels, ``weight[p, k, c] = w[p * NR + c, k]`` (``NR = weight.shape[2]``, zero past
    ``out_features``): each panel's ``K x NR`` block is contiguous, the order a register tile
    of the matmul kernels reads it (``tilework.transform.layout_weights`` packs it)."""
    if len(call.args) not in (2, 3):
        raise ctx.error(f"takes (x, weight) or (x, weight, bias), got {len(call.args)} argument(s)")
    x, w = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    bias = tensor_arg(call, 2, ctx) if len(call.args) == 3 else None
    dtype = unify_dtype([x.dtype, w.dtype] + ([bias.dtype] if bias else []), ctx)
    n = _out_features(call, ctx)
    if x.ndim == 0:
        raise ctx.shape_error("input must have at least one dim, got shape ()")
    if w.ndim not in (-1, 3):
        raise ctx.shape_error(f"weight must be 3-D [panels, in_features, panel width], got shape {shape_str(w.shape)}")
    if bias is not None and bias.ndim not in (-1, 1):
        raise ctx.shape_error(f"bias must be 1-D [out_features], got shape {shape_str(bias.shape)}")
    if w.shape is not None:
        _check_panels(w, n, ctx)
        if x.shape is not None:
            require_equal(x.shape[-1], w.shape[1], ctx, f"in_features of input {shape_str(x.shape)} and weight {shape_str(w.shape)} differ")
    if bias is not None and bias.shape is not None:
        require_equal(n, bias.shape[0], ctx, f"out_features = {n} and bias {shape_str(bias.shape)} differ")
    if x.shape is None:
        return TensorInfo(None, dtype, x.ndim)
    return TensorInfo(x.shape[:-1] + (n,), dtype)


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
    shapes = [x.shape for x in xs if x.shape is not None]
    if len(shapes) != len(xs):
        return None
    try:
        terms, out = parse_einsum(str(call.attrs["equation"]), [len(s) for s in shapes])
    except ValueError as e:
        raise ctx.error(str(e)) from None
    sizes: dict[str, sym.Dim] = {}
    for t, shape in zip(terms, shapes):
        for c, d in zip(t, shape):
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


# -- legalization ---------------------------------------------------------------------------


def _legalize_matmul(call: Call, ctx: "LegalizeCtx") -> Expr:
    a, b = arg(call, 0, "a"), arg(call, 1, "b")
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    nbatch = len(shape) - (0 if a_vec else 1) - (0 if b_vec else 1)
    batch_shape = shape[:nbatch]

    def f(*i: Scalar) -> Scalar:
        batch = i[:nbatch]
        row = () if a_vec else (i[nbatch],)
        col = () if b_vec else (i[-1],)
        k = te.reduce_axis(a.shape[-1], "k")
        ai = bcast_index(batch, a.shape[:-2], batch_shape) + row + (k,)
        bi = bcast_index(batch, b.shape[:-2], batch_shape) + (k,) + col
        return te.sum(te.cast(a[ai], acc) * te.cast(b[bi], acc), axis=k)

    out = te.compute(shape, f, "matmul", dtype)
    return ctx.call_te("matmul", call.args, [a, b], [out], call.info)


def _legalize_linear(call: Call, ctx: "LegalizeCtx") -> Expr:
    x, w = arg(call, 0, "x"), arg(call, 1, "weight")
    bias = arg(call, 2, "bias") if len(call.args) == 3 else None
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)

    def f(*i: Scalar) -> Scalar:
        k = te.reduce_axis(x.shape[-1], "k")
        total = te.sum(te.cast(x[i[:-1] + (k,)], acc) * te.cast(w[i[-1], k], acc), axis=k)
        return total if bias is None else total + te.cast(bias[i[-1]], acc)

    out = te.compute(shape, f, "linear", dtype)
    inputs = [x, w] if bias is None else [x, w, bias]
    return ctx.call_te("linear", call.args, inputs, [out], call.info)


def _panel_dot(x: te.Tensor, w: te.Tensor, rows: tuple[Scalar, ...], lead: tuple[Scalar, ...], j: Scalar, acc: str) -> Scalar:
    """``sum_k x[*rows, k] * w[*lead, j // P, k, j % P]`` in ``acc``: output column ``j`` of a
    product by a weight packed in column panels ``P`` wide (``w``'s last dim)."""
    panel = w.shape[-1]
    assert isinstance(panel, int) and isinstance(j, sym.SymVar)
    k = te.reduce_axis(x.shape[-1], "k")
    return te.sum(te.cast(x[rows + (k,)], acc) * te.cast(w[lead + (sym.floordiv(j, panel), k, sym.floormod(j, panel))], acc), axis=k)


def _legalize_linear_io(call: Call, ctx: "LegalizeCtx") -> Expr:
    x, w = arg(call, 0, "x"), arg(call, 1, "weight")
    bias = arg(call, 2, "bias") if len(call.args) == 3 else None
    shape, dtype = out_tensor(call)
    if len(shape) == 2:  # rows of the kernel's own: a decode step's and a prefill's share it
        rows = own_rows(shape[0])
        x, shape = te.placeholder((rows, x.shape[1]), x.dtype, "x"), (rows, shape[1])
    acc = compute_dtype(dtype)

    def f(*i: Scalar) -> Scalar:
        total = _panel_dot(x, w, i[:-1], (), i[-1], acc)
        return total if bias is None else total + te.cast(bias[i[-1]], acc)

    out = te.compute(shape, f, "linear", dtype)
    inputs = [x, w] if bias is None else [x, w, bias]
    return ctx.call_te("linear_io", call.args, inputs, [out], call.info)


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
        value: PExpr | None = None
        for x, t in zip(xs, terms):
            idx = tuple(0 if isinstance(d, int) and d == 1 and not (isinstance(sizes[c], int) and sizes[c] == 1) else env[c] for c, d in zip(t, x.shape))
            v = te.cast(x[idx], acc)
            value = v if value is None else value * v
        assert value is not None  # einsum has an operand
        return te.sum(value, axis=ks) if ks else value

    result = te.compute(shape, f, "einsum", dtype)
    return ctx.call_te("einsum", call.args, xs, [result], call.info)


def _infer_batch_linear_io(call: Call, ctx: InferCtx) -> StructInfo:
    """``batch_linear_io(x, weight, out_features)``: ``x: [B, M, K]`` by ``weight: [B, panels,
    K, width]``, each ``weight[b]`` a ``linear_io`` weight: ``[B, M, out_features]``."""
    x, w = tensor_arg(call, 0, ctx), tensor_arg(call, 1, ctx)
    dtype = unify_dtype([x.dtype, w.dtype], ctx)
    n = _out_features(call, ctx)
    if x.ndim not in (-1, 3) or w.ndim not in (-1, 4):
        raise ctx.shape_error(f"takes x [batch, rows, in_features] and weight [batch, panels, in_features, panel width], got shapes {shape_str(x.shape)} and {shape_str(w.shape)}")
    if w.shape is not None:
        _check_panels(w, n, ctx)
        if x.shape is not None:
            require_equal(x.shape[0], w.shape[0], ctx, f"batch of input {shape_str(x.shape)} and weight {shape_str(w.shape)} differ")
            require_equal(x.shape[2], w.shape[2], ctx, f"in_features of input {shape_str(x.shape)} and weight {shape_str(w.shape)} differ")
    if x.shape is None:
        return TensorInfo(None, dtype, 3)
    return TensorInfo((x.shape[0], x.shape[1], n), dtype)


def _legalize_batch_linear_io(call: Call, ctx: "LegalizeCtx") -> Expr:
    x, w = arg(call, 0, "x"), arg(call, 1, "weight")
    shape, dtype = out_tensor(call)
    acc = compute_dtype(dtype)

    def f(b: Scalar, i: Scalar, j: Scalar) -> Scalar:
        return _panel_dot(x, w, (b, i), (b,), j, acc)

    out = te.compute(shape, f, "batch_linear", dtype)
    return ctx.call_te("batch_linear_io", call.args, [x, w], [out], call.info)


register(Op("matmul", _infer_matmul, OpPattern.OUT_EWISE_FUSABLE, attrs={"out_dtype": None}, num_args=2, legalize=_legalize_matmul))
register(Op("linear", _infer_linear, OpPattern.OUT_EWISE_FUSABLE, legalize=_legalize_linear))
register(Op("linear_io", _infer_linear_io, OpPattern.OUT_EWISE_FUSABLE, attrs={"out_features": 0}, legalize=_legalize_linear_io))
register(Op("batch_linear_io", _infer_batch_linear_io, OpPattern.OUT_EWISE_FUSABLE, attrs={"out_features": 0}, num_args=2, legalize=_legalize_batch_linear_io))
register(Op("einsum", _infer_einsum, OpPattern.OPAQUE, attrs={"equation": ""}, legalize=_legalize_einsum))


def matmul(a: Expr, b: Expr, out_dtype: str | None = None) -> Call:
    """``a @ b`` with NumPy semantics; ``out_dtype`` sets the result (accumulation) dtype."""
    return make_call("matmul", [a, b], out_dtype=out_dtype)


def linear(x: Expr, weight: Expr, bias: Expr | None = None) -> Call:
    """``x @ weight.T (+ bias)`` with ``weight`` laid out ``[out_features, in_features]``."""
    return make_call("linear", [x, weight] if bias is None else [x, weight, bias])


def linear_io(x: Expr, weight: Expr, bias: Expr | None, out_features: int) -> Call:
    """``linear`` with ``weight`` packed in column panels ``[panels, in_features, width]``
    (``weight[p, k, c]`` is column ``p * width + c``): the layout ``layout_weights`` gives."""
    return make_call("linear_io", [x, weight] if bias is None else [x, weight, bias], out_features=out_features)


def einsum(equation: str, *operands: Expr) -> Call:
    """NumPy's ``einsum`` (explicit or implicit output, ``...`` broadcasting)."""
    return make_call("einsum", list(operands), equation=equation)


def batch_linear_io(x: Expr, weight: Expr, out_features: int) -> Call:
    """``x: [B, M, K]`` by ``weight: [B, panels, K, width]``, each ``weight[b]`` packed as
    ``linear_io``'s: ``[B, M, out_features]``."""
    return make_call("batch_linear_io", [x, weight], out_features=out_features)

"""ATen converters of the torch frontend, op family by op family: small modules with dynamic
dims go through torch.export and ``from_exported_program``; all of them are compiled in one
executable (one function per case) and run at several sizes against torch eager."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest

pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")
import torch  # noqa: E402
F = torch.nn.functional
Dim = torch.export.Dim

import tilework  # noqa: E402
from tilework.errors import UnsupportedError  # noqa: E402
from tilework.frontend.torch import from_exported_program, translate  # noqa: E402
from tilework.ir.graph import Call, GraphFunc, OpRef, bindings_of  # noqa: E402
from tilework.ir.module import IRModule  # noqa: E402

N, M = Dim("n", min=4, max=64), Dim("m", min=4, max=64)  # >= 4: the cases slice a few rows off
N0, M0 = Dim("n0", min=0, max=64), Dim("m0", min=0, max=64)  # for cases that slice nothing
N3, M4 = Dim("n3", min=3, max=64), Dim("m4", min=4, max=64)  # kthvalue's k = 3; unfold: torch specializes one window
R1 = Dim("r1", min=1, max=64)
SPECIAL = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.5, -2.0])


def _index_put(x: Any, i: Any, j: Any) -> tuple[Any, ...]:
    """``x[idx] = v`` and ``+=`` (export's index_put_): duplicate and negative indices, several
    index tensors (adjacent or not), a None among them, bool masks with one value for all."""
    a = x.clone(); a.index_put_((j,), torch.tensor(2.0), accumulate=True)  # noqa: E702  (j repeats rows)
    b = x.clone(); b[torch.tensor([2, -1])] = x[0:1] * 0 + 3.0  # noqa: E702
    c = x.clone(); c[:, torch.tensor([1, 1, 0, -2])] += torch.ones(4)  # noqa: E702  (+= reads once: the last write stays)
    d = x.clone(); d.index_put_((i[:, 0] % x.shape[0], i[:, 1] % x.shape[1]), i[:, 0].float() * 10, accumulate=True)  # noqa: E702
    e = x.clone(); e[x > 0] = 0.0  # noqa: E702
    f = x.clone(); f.index_put_((x > 0,), torch.tensor(1.5), accumulate=True)  # noqa: E702
    g = x[:, None, :].expand(-1, 3, -1).clone(); g.index_put_((torch.tensor([0, 1, 0]), torch.arange(3)[:, None], torch.tensor([1, 2, 1])), torch.tensor([7.0, 8.0, 9.0]), accumulate=True)  # noqa: E702
    h = x[:, None, :].expand(-1, 3, -1).clone(); h[:, torch.tensor([2, 0])] = torch.tensor([[4.0], [5.0]])  # noqa: E702
    k = x.clone(); k[x[:, 0] > 0] = torch.arange(x.shape[1]).float()  # noqa: E702
    m = (x * 3).round().long(); m[j] = 7  # noqa: E702  (an int tensor, duplicate indices without accumulate: one value)
    # indexed dims apart: the index shape goes first in the values' shape (torch's rule)
    p = x[:, None, :].expand(-1, 3, -1).clone(); p[torch.tensor([0, 2, 0]), :, torch.tensor([1, 1, 3])] = torch.arange(9.0).reshape(3, 3)  # noqa: E702
    q = x[:, None, :].expand(-1, 3, -1).clone(); torch.ops.aten.index_put_(q, [torch.tensor([[0], [-1]]), None, torch.tensor([1, 1, 3])], torch.arange(3.0)[:, None], True)  # noqa: E702
    return a, b, c, d, e, f, g, h, k, m, p, q


def _search(s: Any, x: Any, i: Any) -> tuple[Any, ...]:
    """bucketize / searchsorted on both sides, out_int32, ties with the boundaries, NaN values,
    int values against float boundaries, N-d boundaries, a sorter, a scalar value."""
    xs = (x * 2).round() / 2  # values equal to boundaries
    xn = x.masked_fill(x > 1.5, float("nan"))
    rows = torch.sort(x, 1).values
    return (torch.bucketize(xs, s.buf_b), torch.bucketize(xs, s.buf_b, right=True, out_int32=True), torch.bucketize(i, s.buf_b), torch.bucketize(xn, s.buf_b),
            torch.searchsorted(s.buf_b, xs), torch.searchsorted(s.buf_b, xs, side="right"), torch.searchsorted(s.buf_b, xn, right=True, out_int32=True),
            torch.searchsorted(rows, xs), torch.searchsorted(rows, x * 0.5, side="right"), torch.searchsorted(x, x.flip(1), sorter=torch.argsort(x, 1)),
            torch.searchsorted(s.buf_b, 0.25), torch.bucketize(0.5, s.buf_b, right=True))


def _kth_median(x: Any, i: Any) -> tuple[Any, ...]:
    """Values and indices; where values tie (rounded, ints) torch documents no index, so the
    value at the index returned is compared; NaN: the largest for kthvalue, median NaN."""
    r = (x * 2).round()
    xn = x.masked_fill(x > 1.0, float("nan"))
    at = lambda v, res, d=1: torch.gather(v, d, res.indices.unsqueeze(d))  # noqa: E731
    return (*torch.kthvalue(x, 1, 1), *torch.kthvalue(x, 3, 0, keepdim=True), *torch.median(x, -1), *torch.median(x, 0, keepdim=True), torch.median(x), torch.median(i),
            torch.kthvalue(r, 2, 1).values, at(r, torch.kthvalue(r, 2, 1)), torch.median(r, 1).values, at(r, torch.median(r, 1)), torch.median(i, 1).values, at(i, torch.median(i, 1)),
            torch.kthvalue(xn, 1, 1).values, at(xn, torch.kthvalue(xn, 1, 1)), torch.median(xn, 1).values, at(xn, torch.median(xn, 1)), torch.median(xn))


class Fn(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any], params: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.fn = fn
        for k, v in (params or {}).items():
            self.register_buffer(k, v) if k.startswith("buf") else self.register_parameter(k, torch.nn.Parameter(v, requires_grad=False))

    def forward(self, *xs: Any) -> Any:
        return self.fn(self, *xs)


@dataclass
class Case:
    name: str
    module: torch.nn.Module
    make: Callable[[int, int], tuple[Any, ...]]  # inputs at n, m
    dyn: Callable[[], Any]  # dynamic_shapes
    sizes: tuple[tuple[int, int], ...] = ((4, 5), (8, 4), (17, 9))
    tol: float = 1e-5


def randn(*shape: int) -> Any:
    return torch.randn(*shape)


def ints(hi: int, *shape: int, lo: int = 0) -> Any:
    return torch.randint(lo, hi, shape)


def nm(*axes: dict[int, Any] | None) -> Callable[[], Any]:
    return lambda: (tuple(axes),)  # forward(*xs): one argument, a tuple


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)
    w = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return [
        # elementwise, scalars and type promotion
        Case("arith_scalars", Fn(lambda s, x, y: ((x + 2) * y - x / 3.0, (x - y) ** 2, 1 - x, x.abs().sqrt(), torch.rsqrt(x.abs() + 1), x.reciprocal(), torch.exp(-x) + torch.log(x.abs() + 1))), lambda n, m: (randn(n, m), randn(m)), nm({0: N, 1: M}, {0: M})),
        Case("int_promotion", Fn(lambda s, i, x: (i + 1.5, i * 2, i // 3, i % 4, torch.div(i, 3, rounding_mode="floor"), torch.div(x, 0.7, rounding_mode="trunc"), i / 2, torch.remainder(x, 0.75), torch.maximum(x, i.float()))), lambda n, m: (ints(9, n, m, lo=-9), randn(n, m)), nm({0: N, 1: M}, {0: N, 1: M})),
        Case("activations", Fn(lambda s, x: (F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x), F.relu(x), torch.sigmoid(x), torch.tanh(x), F.leaky_relu(x, 0.2), F.hardtanh(x, -0.5, 0.5), F.relu6(x * 4), F.hardswish(x), F.hardsigmoid(x), x.clamp(min=-0.3), x.clamp(-1, 0.2), torch.sin(x) * torch.cos(x), x.floor() + x.ceil() + torch.erf(x))), lambda n, m: (randn(n, m),), nm({0: N, 1: M})),
        # softplus, mish, lerp, prelu, ... have no converter: torch's decompositions of them do
        Case("activations_decomposed", Fn(lambda s, x: (F.softplus(x), F.softplus(x, 2.0, 5.0), F.mish(x), F.elu(x), F.elu(x, 0.5), F.selu(x), F.celu(x, 0.7), F.logsigmoid(x), F.softsign(x), F.tanhshrink(x), F.hardshrink(x), F.softshrink(x), F.prelu(x, s.a), F.threshold(x, 0.1, 2.0), torch.special.expit(x), torch.lerp(x, x * 2, 0.3), torch.addcmul(x, x, x, value=0.5), x.frac(), torch.nan_to_num(x / 0), torch.isfinite(x / 0), torch.logaddexp(x, x * 2), F.glu(x, -1)), {"a": w(1)}), lambda n, m: (randn(n, m, 6) * 3,), nm({0: N0, 1: M0}), sizes=((1, 1), (0, 3), (4, 0), (17, 9)), tol=1e-5),
        Case("math_core", Fn(lambda s, x, i: (torch.log1p(x.abs()), torch.expm1(x), torch.sign(x), torch.sign(i), torch.trunc(x * 3), torch.log2(x.abs() + 1), torch.exp2(x), torch.fmod(x, 0.3), torch.fmod(x, x + 7), torch.fmod(i, 3), torch.isnan(x / 0), torch.isinf(x / 0))), lambda n, m: (randn(n, m) * 3, ints(9, n, m, lo=-9)), nm({0: N0, 1: M0}, {0: N0, 1: M0}), sizes=((1, 1), (0, 3), (4, 0), (17, 9)), tol=1e-5),
        Case("compare_where", Fn(lambda s, x, y: (torch.where(x > y, x, 0.5), (x >= 0) & (y < 0.5), (x == x) | (y != 0), x.masked_fill(x < 0, -1.0), torch.where(x < 0, 1, 2), ~(x > 0), torch.logical_xor(x > 0, y > 0))), lambda n, m: (randn(n, m), randn(1, m)), nm({0: N, 1: M}, {1: M})),
        Case("casts", Fn(lambda s, x, i: (x.to(torch.int32), i.to(torch.float32) * x, (i > 2).long(), x.half().float(), x.to(torch.float64) * 2, i.bool().int())), lambda n, m: (randn(n, m) * 5, ints(5, n, m)), nm({0: N, 1: M}, {0: N, 1: M})),
        # shapes
        Case("views", Fn(lambda s, x: (x.view(x.shape[0], -1, 2).transpose(0, 1), x.reshape(-1), x.permute(2, 0, 1).contiguous(), x.unsqueeze(1).squeeze(1) * 1, x.flatten(1), x.t() if x.dim() == 2 else x.mT, x[:, 1:-1:2], x[..., 0], x.select(0, -1), x.narrow(1, 1, 2), x[None, :, None].expand(3, -1, 2, -1, -1))), lambda n, m: (randn(n, 2 * m, 2),), nm({0: N, 1: 2 * M})),
        Case("cat_split", Fn(lambda s, x, y: (torch.cat([x, y, x], 1), torch.stack([x, x], 0), *torch.split(y, [1, 3], 1), *torch.split(x, [2, x.shape[0] - 2], 0), *torch.chunk(y, 2, 1), *torch.unbind(y[:, :2], 1), x.repeat(2, 1, 3))), lambda n, m: (randn(2 * n, m), randn(2 * n, 4)), nm({0: 2 * N, 1: M}, {0: 2 * N})),
        Case("index", Fn(lambda s, x, i, j: (torch.gather(x, 1, i), x.index_select(0, j), x[j], x[j[:, None], i[0]], x[:, i[0]], F.embedding(j % 10, s.emb), x.scatter(1, i[:, :1], 7.0), torch.scatter_add(x, 0, i % x.shape[0], x), x[:, None, :][j[:3], :, i[0]]), {"emb": w(10, 4)}), lambda n, m: (randn(n, m), ints(m, n, 3), ints(n, 4)), nm({0: N, 1: M}, {0: N}, None), tol=1e-5),
        Case("running", Fn(lambda s, x, i: (torch.cumsum(x, 1), torch.cumsum(i > 1, 0), torch.tril(x), torch.triu(x, 1), torch.tril(x, -1), torch.diff(x, dim=1), torch.diff(i, dim=0, prepend=i[:1]))), lambda n, m: (randn(n, m), ints(4, n, m)), nm({0: N, 1: M}, {0: N, 1: M}), tol=1e-4),
        Case("cumprod", Fn(lambda s, x, i: (torch.cumprod(x, 1), torch.cumprod(x, 0), torch.cumprod(i, -1), torch.cumprod(i > 1, 0), x.cumprod(-1, dtype=torch.float64))), lambda n, m: (randn(n, m) + 1, ints(4, n, m, lo=-3)), nm({0: N0, 1: M0}, {0: N0, 1: M0}), sizes=((1, 1), (0, 3), (4, 0), (17, 9)), tol=1e-4),
        Case("reductions", Fn(lambda s, x: (x.sum(), x.sum(1), x.mean((0, 2), keepdim=True), x.amax(-1), x.amin(0), x.max(1).values, x.max(1).indices, x.min(-1)[1], x.argmax(), x.argmax(1, keepdim=True), (x > 1).any(1), (x > -3).all(), x.var(1), x.std(2, correction=0), x.prod(2), (x > 0).sum(1))), lambda n, m: (randn(n, m, 3),), nm({0: N, 1: M}), tol=1e-4),
        Case("vector_norm", Fn(lambda s, x: (F.normalize(x, dim=-1), x.norm(dim=1), torch.linalg.vector_norm(x), torch.linalg.vector_norm(x, 1, (0, 2), keepdim=True), torch.linalg.vector_norm(x, float("inf"), -1), torch.linalg.vector_norm(x, float("-inf"), 2), torch.linalg.vector_norm(x.round(), 0, 1), torch.linalg.vector_norm(x, 3.0, -1), torch.linalg.vector_norm(x, -1.5, 2))), lambda n, m: (randn(n, m, 3),), nm({0: N0, 1: M0}), sizes=((1, 1), (0, 3), (4, 0), (17, 9)), tol=1e-4),
        Case("logsumexp", Fn(lambda s, x: (torch.logsumexp(x, -1), torch.logsumexp(x, (0, 2), keepdim=True), torch.logsumexp(x.masked_fill(x > 0.5, float("-inf")), 2), torch.logsumexp(x.masked_fill(x > 2.0, float("inf")), 1), torch.logsumexp(x * 100, 2))), lambda n, m: (randn(n, m, 3),), nm({0: N, 1: M}), tol=1e-4),
        Case("logsumexp_empty", Fn(lambda s, x: (torch.logsumexp(x, 1), torch.logsumexp(x, (0, 1)), torch.logsumexp(x, 0, keepdim=True), torch.logsumexp(x.long(), -1))), lambda n, m: (randn(n, m),), nm({0: N0, 1: M0}), sizes=((1, 1), (0, 3), (4, 0), (17, 9)), tol=1e-5),
        Case("kthvalue_median", Fn(lambda s, x, i: _kth_median(x, i)), lambda n, m: (randn(n, m), ints(5, n, m)), nm({0: N3, 1: M}, {0: N3, 1: M}), sizes=((3, 4), (4, 5), (17, 9)), tol=1e-6),
        Case("flip_var_mean", Fn(lambda s, x: (torch.flip(x, [0, 2]), x.flip(-1), F.cosine_similarity(x, x.flip(0), dim=-1), *torch.var_mean(x, 1), *torch.var_mean(x, (0, 2), keepdim=True, correction=0), *torch.std_mean(x, 2), x.var(2, correction=0.5))), lambda n, m: (randn(n, m, 3),), nm({0: N, 1: M}), tol=1e-4),
        # 1 / atan2 is +-inf where atan2 is +-0 (the sign of a zero, which a tolerance cannot see)
        Case("atan2_hypot", Fn(lambda s, x, y, i: (torch.atan2(x, y), torch.atan2(x, y * 0), torch.atan2(y * 0, x), torch.atan2(i, i.flip(0)), torch.atan2(s.buf_sp[:, None], s.buf_sp), 1 / torch.atan2(s.buf_sp[:, None], s.buf_sp), torch.hypot(x, y), torch.hypot(x * 1e30, y * 1e30), torch.hypot(s.buf_sp[:, None], s.buf_sp), torch.hypot(x.double(), y.double() * 1e200)), {"buf_sp": SPECIAL}), lambda n, m: (randn(n, m) * 3, randn(m) * 3, ints(5, n, m, lo=-4)), nm({0: N0, 1: M0}, {0: M0}, {0: N0, 1: M0}), sizes=((1, 1), (0, 3), (4, 0), (17, 9)), tol=1e-6),
        Case("unfold_diagonal", Fn(lambda s, x, i, v: (x.unfold(1, 3, 1), x.unfold(-1, 3, 2), x.unfold(2, 7, 1), i.unfold(1, 2, 1), torch.diagonal(x), torch.diagonal(x, 1), torch.diagonal(x, -2, 1, 0), x.diagonal(0, -1, 0), i.diagonal(1, 1, 2), torch.diag(x[..., 0]), torch.diag(x[..., 0].T, -1), torch.diag(v), torch.diag(v, 2), torch.diag(v, -1))), lambda n, m: (randn(n, m, 7), ints(9, n, m, 7), randn(n)), nm({0: N0, 1: M4}, {0: N0, 1: M4}, {0: N0}), sizes=((0, 4), (1, 5), (17, 9)), tol=1e-6),
        Case("search", Fn(lambda s, x, i: _search(s, x, i), {"buf_b": torch.tensor([-1.0, 0.0, 0.0, 0.5, 2.0])}), lambda n, m: (randn(n, m), ints(4, n, m, lo=-3)), nm({0: N0, 1: M0}, {0: N0, 1: M0}), sizes=((1, 1), (0, 3), (4, 0), (17, 9))),
        Case("index_put", Fn(lambda s, x, i, j: _index_put(x, i, j)), lambda n, m: (randn(n, m), ints(40, 5, 2), ints(n, 6, lo=-n)), nm({0: N3, 1: M4}, None, None), sizes=((3, 4), (4, 5), (17, 9))),
        # a symbolic number of indices (0 too), repeated ones taking different values: the last stays, or all add
        Case("index_put_count", Fn(lambda s, x, i, v: (x.index_put((i,), v), x.index_put((i,), v, accumulate=True), x.index_put((i,), v[:, :1] * 0 + 2.0), x.index_put((i,), v.long().float(), accumulate=True), x.long().index_put((i,), v.long()))), lambda n, m: (randn(n + 1, 3), ints(n + 1, m, lo=-n - 1), randn(m, 3) * 4), nm({0: R1}, {0: M0}, {0: M0}), sizes=((1, 1), (0, 3), (4, 0), (17, 9), (2, 30))),
        Case("create", Fn(lambda s, x: (torch.zeros(x.shape[0], 3) + x[:, :1], torch.ones_like(x) * 2, torch.full((x.shape[1],), 0.5), torch.arange(x.shape[0]), torch.arange(1, x.shape[1], 2) * 1.0, x.new_ones(x.shape[0], 2), x.new_zeros(3), torch.full_like(x, 3, dtype=torch.int64), torch.arange(0.0, 1.0, 0.25), torch.empty(2, x.shape[1]).zero_())), lambda n, m: (randn(n, m),), nm({0: N, 1: M})),
        # nn
        Case("linear_matmul", Fn(lambda s, x, y: (F.linear(x, s.w, s.b), x @ s.w.T, torch.bmm(y, y.transpose(1, 2)), torch.addmm(s.b, x, s.w.T, beta=0.5, alpha=2.0), torch.matmul(y, x[:4].T), x @ s.b[:, None]), {"w": w(6, 6), "b": w(6)}), lambda n, m: (randn(n, 6), randn(m, 3, 6)), nm({0: N}, {0: M}), tol=1e-4),
        Case("einsum", Fn(lambda s, x, y: (torch.einsum("nd,md->nm", x, y), torch.einsum("nd,de->ne", x, s.w), torch.einsum("...d,...d->...", x, x), torch.einsum("ij->ji", y), torch.einsum("nd", x), torch.einsum("ij,ij", s.w, s.w), torch.einsum("bi,bj,jk->bik", x, x, s.w)), {"w": w(6, 6)}), lambda n, m: (randn(n, 6), randn(m, 6)), nm({0: N0}, {0: M0}), sizes=((1, 1), (0, 3), (4, 0), (17, 9)), tol=1e-4),
        Case("norms", Fn(lambda s, x, z: (F.layer_norm(x, (8,), s.g, s.b), F.layer_norm(x, (x.shape[-2], 8)), F.rms_norm(x, (8,), s.g, 1e-5), F.rms_norm(x, (8,)), F.group_norm(z, 2, s.g[:4], s.b[:4]), F.batch_norm(z, s.buf_mean, s.buf_var, s.g[:4], s.b[:4], False, 0.1, 1e-3), F.softmax(x, -1), F.log_softmax(x, 1)), {"g": w(8), "b": w(8), "buf_mean": w(4), "buf_var": torch.rand(4, generator=g) + 0.5}), lambda n, m: (randn(2, n, 8), randn(n, 4, m)), nm({1: N}, {0: N, 2: M}), tol=1e-4),
        Case("conv_pool", Fn(lambda s, x, y: (F.conv2d(x, s.k2, s.b2, padding=1), F.conv2d(x, s.k2, None, stride=2, dilation=(1, 2)), F.conv2d(x, s.kg, groups=2, padding="same"), F.conv1d(y, s.k1, s.b1, padding=2, stride=2), F.max_pool2d(x, 2), F.max_pool2d(x, 3, 2, 1, ceil_mode=True), F.avg_pool2d(x, 2, 1), F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), F.adaptive_avg_pool2d(x, (1, 1)), F.adaptive_avg_pool2d(x, 3)), {"k2": w(6, 4, 3, 3), "b2": w(6), "kg": w(4, 2, 3, 3), "k1": w(5, 3, 4), "b1": w(5)}), lambda n, m: (randn(2, 4, n + 4, m + 5), randn(2, 3, n + 6)), nm({2: N + 4, 3: M + 5}, {2: N + 6}), tol=1e-4),
        # antialias: downscales (the filter widened), upscales, align_corners, to one pixel; scale factors on a static image
        Case("antialias", Fn(lambda s, x, y: (F.interpolate(x, size=(5, 7), mode="bilinear", antialias=True), F.interpolate(x, size=(3, 20), mode="bicubic", antialias=True), F.interpolate(x, size=(4, 9), mode="bilinear", antialias=True, align_corners=True), F.interpolate(x, size=(1, 1), mode="bicubic", antialias=True, align_corners=True), F.interpolate(y, scale_factor=(0.3, 0.5), mode="bilinear", antialias=True), F.interpolate(y, scale_factor=2.5, mode="bicubic", antialias=True))), lambda n, m: (randn(2, 3, n, m + 1), randn(m, 2, 11, 6)), nm({2: N, 3: M + 1}, {0: M}), tol=1e-5),
        # torch.export specializes the length of max_pool1d and of ceil_mode: there it is static
        Case("pool1d", Fn(lambda s, x, y: (F.avg_pool1d(x, 3, 2, 1), F.avg_pool1d(x, 2), F.avg_pool1d(x[0], 3, 1, 1, count_include_pad=False), F.avg_pool1d(y, 3, 2, ceil_mode=True), F.max_pool1d(y, 2), F.max_pool1d(y, 3, 2, 1, dilation=1, ceil_mode=True), F.max_pool1d(y[0], 2, 1, dilation=2))), lambda n, m: (randn(m, 3, n + 1), randn(m, 3, 9)), nm({0: M, 2: N + 1}, {0: M}), sizes=((4, 4), (5, 7), (8, 4), (17, 9)), tol=1e-5),
        Case("sdpa", Fn(lambda s, q, k, v, mb, mf: (F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, attn_mask=mb), F.scaled_dot_product_attention(q, k, v, attn_mask=mf, scale=0.3), F.scaled_dot_product_attention(q, k[:, :, :1], v[:, :, :1], enable_gqa=True, is_causal=True), F.scaled_dot_product_attention(q[:, :, :2], k, v, is_causal=True), F.scaled_dot_product_attention(q, q, q, is_causal=True))), lambda n, m: (randn(2, 4, n, 8), randn(2, 4, m, 8), randn(2, 4, m, 8), torch.rand(2, 1, n, m) < 0.8, randn(n, m)), nm({2: N}, {2: M}, {2: M}, {2: N, 3: M}, {0: N, 1: M}), sizes=((4, 5), (8, 8), (17, 9)), tol=1e-4),
    ]


CASES = _cases()


def _export(case: Case, n: int = 4, m: int = 6) -> Any:
    torch.manual_seed(1)
    return torch.export.export(case.module, case.make(n, m), dynamic_shapes=case.dyn(), strict=False)


@pytest.fixture(scope="module")
def compiled() -> dict[str, Any]:
    """Every case translated, then compiled together: one function per case."""
    funcs, weights = {}, {}
    for case in CASES:
        tr = translate(_export(case))
        funcs[case.name] = tr.module["main"]
        weights[case.name] = [a for _, a in tr.weights]
    exe = tilework.build(IRModule(funcs))
    vm = tilework.VM(exe)
    return {c.name: (vm[c.name], weights[c.name]) for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_torch(compiled: dict[str, Any], case: Case) -> None:
    fn, weights = compiled[case.name]
    for k, (n, m) in enumerate(case.sizes):
        torch.manual_seed(10 + k)
        inputs = case.make(n, m)
        with torch.no_grad():
            want = case.module(*inputs)
        got = fn(*[x.numpy() for x in inputs], *weights)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(want)
        for i, (g, w_) in enumerate(zip(got, want)):
            w_ = w_.numpy()
            where = f"{case.name} output {i} at n={n}, m={m}"
            assert g.shape == w_.shape and g.dtype == w_.dtype, f"{where}: {g.shape} {g.dtype}, torch {w_.shape} {w_.dtype}"
            if w_.dtype.kind == "f":
                np.testing.assert_allclose(g, w_, rtol=case.tol, atol=case.tol, err_msg=where)
            else:
                np.testing.assert_array_equal(g, w_, err_msg=where)


def test_shapes_stay_symbolic() -> None:
    """The translated module states shapes over the named dims, no match_cast needed."""
    mod = from_exported_program(_export(CASES[0]), dim_names={"xs_0.0": "n", "xs_0.1": "m"})
    main = mod["main"]
    assert isinstance(main, GraphFunc)
    assert "match_cast" not in str(mod)
    assert [str(p.info) for p in main.params] == ["TensorInfo(shape=(n, m), dtype='float32', ndim=2)", "TensorInfo(shape=(m,), dtype='float32', ndim=1)"]


def test_sdpa_maps_to_attention_with_layout_permutes() -> None:
    case = next(c for c in CASES if c.name == "sdpa")
    mod = from_exported_program(_export(case))
    calls = [b.value for b in bindings_of(mod["main"]) if isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)]  # type: ignore[arg-type]
    att = [c for c in calls if c.callee.name == "attention"]  # type: ignore[attr-defined]
    assert len(att) == 6
    # equal query and key lengths keep torch's is_causal as tilework's causal flag
    assert sum(bool(c.attrs["causal"]) for c in att) == 1
    assert all(c.callee.name != "softmax" for c in calls)  # type: ignore[attr-defined]


def test_unsupported_op_names_op_and_node() -> None:
    m = Fn(lambda s, x: torch.histc(x, bins=4))
    ep = torch.export.export(m, (randn(3, 4),), strict=False)
    with pytest.raises(UnsupportedError, match=r"ATen op histc\.default \(node %histc\) is not supported"):
        from_exported_program(ep)


def test_an_op_whose_decomposition_has_side_effects_is_named() -> None:
    """``linalg.inv`` decomposes into ``linalg_inv_ex`` and ``_linalg_check_errors``, an op with
    side effects ordered by an effect token: refused naming the op that brought the token (it
    said "input token of kind TOKEN is not supported"); a program decomposed already names the
    effectful op itself."""
    m = Fn(lambda s, x: torch.linalg.inv(x) + 1)
    ep = torch.export.export(m, (randn(3, 3),), strict=False)
    with pytest.raises(UnsupportedError, match=r"^ATen op linalg_inv\.default \(node %linalg_inv\) is not supported by the torch frontend: its decomposition has side effects \(_linalg_check_errors\.default, ordered by an effect token\)$"):
        from_exported_program(ep)
    with pytest.raises(UnsupportedError, match=r"^ATen op _linalg_check_errors\.default is not supported by the torch frontend: side effects, ordered by an effect token \(input token of kind TOKEN\)$"):
        from_exported_program(ep.run_decompositions())


def test_indexing_by_a_bool_mask_is_refused_as_such() -> None:
    """x[mask] has a data-dependent length: refused as that (it said check_index wants ints)."""
    m = Fn(lambda s, x: x[x[:, 0] > 0])
    ep = torch.export.export(m, (randn(3, 4),), strict=False)
    with pytest.raises(UnsupportedError, match=r"indexing by a bool mask \(a data-dependent number of elements\)"):
        from_exported_program(ep)


def test_index_put_by_a_mask_with_a_value_per_element_is_refused() -> None:
    """``y[mask] = v`` with one value per selected element needs their count (data-dependent):
    refused naming index_put and why; one value for all of them converts (case index_put)."""

    def put(s: Any, x: Any) -> Any:
        y = x.clone()
        y[x > 0] = torch.tensor([1.0, 2.0])
        return y

    ep = torch.export.export(Fn(put), (torch.tensor([1.0, -1.0, 2.0]),), strict=False)
    with pytest.raises(UnsupportedError, match=r"index_put with a bool mask index: the values must be the same for every selected element .* \(in ATen op index_put"):
        from_exported_program(ep)


def test_antialiased_interpolate_of_integers_is_refused_by_name() -> None:
    m = Fn(lambda s, x: F.interpolate(x, size=(3, 3), mode="bilinear", antialias=True))
    ep = torch.export.export(m, (torch.randint(0, 255, (1, 2, 8, 8), dtype=torch.uint8),), strict=False)
    with pytest.raises(UnsupportedError, match=r"interpolate\(mode='bilinear', antialias=True\) of a uint8 tensor is not supported"):
        from_exported_program(ep)


def test_logsumexp_over_an_empty_dim_is_minus_inf() -> None:
    """torch's -inf for a sum of no terms, through tilework.compile: a static empty dim (no
    kernel can reduce it) and a symbolic one that is 0 at run time."""
    m = Fn(lambda s, x: (torch.logsumexp(x, 1), torch.logsumexp(x, (0, 1), keepdim=True), torch.logsumexp(x, 0)))
    static = tilework.compile(torch.export.export(m, (randn(3, 0),), strict=False))
    dynamic = tilework.compile(torch.export.export(m, (randn(3, 4),), dynamic_shapes=nm({0: N0, 1: M0})(), strict=False))
    for fn, shape in ((static, (3, 0)), (dynamic, (3, 0)), (dynamic, (0, 2)), (dynamic, (0, 0))):
        x = randn(*shape)
        for got, want in zip(fn(x.numpy()), m(x)):
            np.testing.assert_array_equal(got, want.numpy(), err_msg=f"at {shape}")


def test_median_of_an_empty_dim_raises_where_torch_does() -> None:
    """torch raises for median/kthvalue over an empty dim; a symbolic dim that is 0 at run time
    is a tilework error naming the op the user wrote (not topk, which they are lowered to),
    the dim and its size, instead of reading nothing (a ``k`` above 1 bounds the dim from below
    already: torch.export guards it, and so do the compiled inputs' checks). The median of all of an empty float tensor is NaN (torch's), of a symbolic size
    too; of an empty integer tensor (torch's value is not defined) an error naming median."""
    from tilework.errors import RuntimeCheckError

    def compiled(f: Callable[..., Any], dtype: Any = torch.float32) -> Any:
        ep = torch.export.export(Fn(f), (torch.ones(3, 4, dtype=dtype),), dynamic_shapes=nm({0: N0, 1: M0})(), strict=False)
        return tilework.compile(ep)

    cases = [
        (lambda s, x: torch.median(x, 1), (3, 0), np.float32, r"^main: median: dim 1 \((\w+)\) must not be empty: \1 = 0$"),
        (lambda s, x: torch.median(x, 0, keepdim=True), (0, 2), np.int64, r"^main: median: dim 0 \((\w+)\) must not be empty: \1 = 0$"),
        (lambda s, x: torch.kthvalue(x, 1, 1), (3, 0), np.float32, r"^main: kthvalue: k = 1 must not exceed the size of dim 1 \((\w+)\): \1 = 0$"),
        (lambda s, x: torch.median(x), (2, 0), np.int64, r"^main: median: the input \(\w+ \* \w+ elements\) must not be empty: \w+ \* \w+ = 0$"),
    ]
    for f, shape, dtype, message in cases:
        fn = compiled(f, torch.int64 if dtype == np.int64 else torch.float32)
        with pytest.raises(RuntimeCheckError, match=message):
            fn(np.zeros(shape, dtype))
        x = np.arange(15, dtype=dtype).reshape(3, 5)[:, ::-1].copy()  # a size where torch answers: so does tilework
        got, want = fn(x), f(None, torch.from_numpy(x))
        for g, w in zip(*(r if isinstance(r, tuple) else (r,) for r in (got, want)), strict=True):
            np.testing.assert_array_equal(g, w.numpy())
    whole = Fn(lambda s, x: (torch.median(x), torch.median(x[:, :0])))
    fn = tilework.compile(torch.export.export(whole, (randn(3, 4),), dynamic_shapes=nm({0: N0, 1: M0})(), strict=False))
    for shape in ((3, 0), (0, 2), (1, 1), (2, 3), (5, 4)):
        x = randn(*shape)
        for got, want in zip(fn(x.numpy()), whole(x)):
            np.testing.assert_array_equal(got, want.numpy(), err_msg=f"at {shape}")


def test_training_mode_dropout_is_refused() -> None:
    m = Fn(lambda s, x: F.dropout(x, 0.5, training=True))
    ep = torch.export.export(m, (randn(3, 4),), strict=False)
    with pytest.raises(UnsupportedError, match="dropout in training mode"):
        from_exported_program(ep)


def test_weights_and_lifted_constants() -> None:
    """Parameters, buffers and tensors created in forward (lifted constants) become trailing
    params, or constants with keep_params_as_inputs=False; both run the same."""

    class WithConstant(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.register_buffer("shift", torch.tensor([0.5, -0.5, 0.0]))

        def forward(self, x: Any) -> Any:
            return self.lin(x) + self.shift + torch.tensor([1.0, 2.0, 3.0])

    model = WithConstant().eval()
    ep = torch.export.export(model, (randn(5, 3),), dynamic_shapes=({0: N},), strict=False)
    assert "CONSTANT_TENSOR" in {s.kind.name for s in ep.graph_signature.input_specs}
    tr = translate(ep)
    main = tr.module["main"]
    assert isinstance(main, GraphFunc) and main.attrs["num_inputs"] == 1 and len(main.params) == 5
    assert [name for name, _ in tr.weights][:3] == ["lin.weight", "lin.bias", "shift"]
    baked = from_exported_program(ep, keep_params_as_inputs=False)
    assert len(baked["main"].params) == 1  # type: ignore[union-attr]
    x = randn(9, 3)
    want = model(x).detach().numpy()
    np.testing.assert_allclose(tilework.VM(tilework.build(tr.module))["main"](x.numpy(), *[w for _, w in tr.weights]), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tilework.VM(tilework.build(baked))["main"](x.numpy()), want, rtol=1e-5, atol=1e-6)

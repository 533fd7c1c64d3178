"""Convolution and pooling ops (conv1d, conv2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d):
symbolic inference, and legalized kernels compiled to C and run at several values of the
symbolic batch and spatial dims against float64 NumPy references (which are checked against
torch where torch is installed)."""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, holds, infer, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs
from tilework.errors import InferenceError, ShapeError
from tilework.ir import sym

n, h, w = tw.dim("n"), tw.dim("h"), tw.dim("w")

# -- inference ------------------------------------------------------------------------------


def test_conv2d_infers_symbolic_spatial_dims() -> None:
    out = info_of(lambda x, k: op.conv2d(x, k, strides=2, padding=1), T(n, 3, h, w), T(8, 3, 3, 3))
    assert out == T(n, 8, (h - 1) // 2 + 1, (w - 1) // 2 + 1)
    out = info_of(lambda x, k, b: op.conv2d(x, k, b, padding=(0, 1, 2, 3), dilation=2, groups=2), T(n, 4, 9, 9), T(6, 2, 3, 3), T(6))
    assert out == T(n, 6, 7, 9)
    assert info_of(op.conv2d, R(), T(8, 3, 3, 3)) == R(4)


def test_conv_checks_and_errors() -> None:
    info, checks = infer(op.conv1d, T(n, 4, w), T(5, 4, 3))
    assert [c.kind for c in checks] == ["ge"]  # the output length w - 2 must be positive
    assert holds(checks, {n: 1, w: 3}) and not holds(checks, {n: 1, w: 2})
    with pytest.raises(ShapeError, match=r"conv2d: input channels of \(n, 3, h, w\) must be 1 group\(s\) of weight \(8, 4, 3, 3\)"):
        infer(op.conv2d, T(n, 3, h, w), T(8, 4, 3, 3))
    with pytest.raises(ShapeError, match="out_channels 5 is not divisible by groups 2"):
        infer(lambda x, k: op.conv2d(x, k, groups=2), T(n, 4, h, w), T(5, 2, 3, 3))
    with pytest.raises(ShapeError, match=r"conv2d: input must be 4-D"):
        infer(op.conv2d, T(n, 3, h), T(8, 3, 3, 3))
    with pytest.raises(ShapeError, match=r"output spatial shape \(-1, 1\) must be positive"):
        infer(op.conv2d, T(1, 1, 2, 3), T(1, 1, 4, 3))
    with pytest.raises(InferenceError, match="conv2d: dtypes disagree"):
        infer(op.conv2d, T(n, 3, h, w), T(8, 3, 3, 3, dtype="float16"))
    with pytest.raises(ValueError, match="padding needs 1, 2 or 4 entries"):
        op.conv2d(op.zeros((1, 1, 1, 1)), op.zeros((1, 1, 1, 1)), padding=(1, 2, 3))


def test_pool_inference() -> None:
    assert info_of(lambda x: op.max_pool2d(x, 2), T(n, 3, 8, 8)) == T(n, 3, 4, 4)
    assert info_of(lambda x: op.max_pool2d(x, 3, 2, 1, ceil_mode=True), T(n, 3, 6, 6)) == T(n, 3, 4, 4)
    # ceil mode never starts a window in the trailing padding
    assert info_of(lambda x: op.max_pool2d(x, 2, 2, 1, ceil_mode=True), T(1, 1, 4, 4)) == T(1, 1, 3, 3)
    out, _ = infer(lambda x: op.avg_pool2d(x, 3, 2, 1, ceil_mode=True), T(n, 3, h, w))
    assert out == T(n, 3, sym.min_(sym.ceildiv(h - 1, 2) + 1, sym.ceildiv(h + 1, 2)), sym.min_(sym.ceildiv(w - 1, 2) + 1, sym.ceildiv(w + 1, 2)))
    assert info_of(lambda x: op.adaptive_avg_pool2d(x, (1, 2)), T(n, 3, 7, 7)) == T(n, 3, 1, 2)
    with pytest.raises(InferenceError, match="padding .* must be at most half"):
        infer(lambda x: op.max_pool2d(x, 2, padding=2), T(n, 3, 8, 8))
    with pytest.raises(InferenceError, match="avg_pool2d: input must be a floating-point tensor"):
        infer(lambda x: op.avg_pool2d(x, 2), T(n, 3, 8, 8, dtype="int32"))


# -- NumPy references ---------------------------------------------------------------------------


def conv_ref(x: np.ndarray, k: np.ndarray, b: np.ndarray | None, strides: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int) -> np.ndarray:
    x, k = x.astype(np.float64), k.astype(np.float64)
    nsp = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(padding[i], padding[nsp + i]) for i in range(nsp)])
    ksz = k.shape[2:]
    outs = [(xp.shape[2 + i] - dilation[i] * (ksz[i] - 1) - 1) // strides[i] + 1 for i in range(nsp)]
    cg, og = k.shape[1], k.shape[0] // groups
    out = np.zeros((x.shape[0], k.shape[0], *outs))
    for g in range(groups):
        xs, ws = xp[:, g * cg : (g + 1) * cg], k[g * og : (g + 1) * og]
        for tap in itertools.product(*(range(s) for s in ksz)):
            sl = tuple(slice(t * dilation[i], t * dilation[i] + strides[i] * (outs[i] - 1) + 1, strides[i]) for i, t in enumerate(tap))
            window: tuple[Any, ...] = (slice(None), slice(None), *sl)
            weight: tuple[Any, ...] = (slice(None), slice(None), *tap)
            out[:, g * og : (g + 1) * og] += np.einsum("nc...,oc->no...", xs[window], ws[weight])
    if b is not None:
        out += b.astype(np.float64).reshape((1, -1) + (1,) * nsp)
    return out


def _pool_len(d: int, k: int, s: int, pb: int, pe: int, dil: int, ceil_mode: bool) -> int:
    span = d + pb + pe - dil * (k - 1) - 1
    if not ceil_mode:
        return span // s + 1
    return min(-(-span // s) + 1, -(-(d + pb) // s))


def pool_ref(x: np.ndarray, kind: str, size: Sequence[int], strides: Sequence[int], padding: Sequence[int], dilation: Sequence[int] = (1, 1), ceil_mode: bool = False, count_include_pad: bool = True) -> np.ndarray:
    """torch's pooling (ONNX's where torch has no dilated average), window by window."""
    x = x.astype(np.float64)
    H, W = x.shape[2:]
    oh = _pool_len(H, size[0], strides[0], padding[0], padding[2], dilation[0], ceil_mode)
    ow = _pool_len(W, size[1], strides[1], padding[1], padding[3], dilation[1], ceil_mode)
    out = np.zeros(x.shape[:2] + (oh, ow))
    for i, j in itertools.product(range(oh), range(ow)):
        ys = [i * strides[0] - padding[0] + a * dilation[0] for a in range(size[0])]
        xs = [j * strides[1] - padding[1] + a * dilation[1] for a in range(size[1])]
        ys_in, xs_in = [y for y in ys if 0 <= y < H], [q for q in xs if 0 <= q < W]
        win = x[:, :, ys_in][:, :, :, xs_in]
        if kind == "max":
            out[:, :, i, j] = win.max(axis=(2, 3))
            continue
        if count_include_pad:  # the taps inside the padded input
            cnt = sum(y < H + padding[2] for y in ys) * sum(q < W + padding[3] for q in xs)
        else:
            cnt = len(ys_in) * len(xs_in)
        out[:, :, i, j] = win.sum(axis=(2, 3)) / cnt
    return out


def pool_indices_ref(x: np.ndarray, size: Sequence[int], strides: Sequence[int], padding: Sequence[int], dilation: Sequence[int] = (1, 1), ceil_mode: bool = False) -> np.ndarray:
    """Where in its plane (``h * W + w``) the first maximal tap of each window is."""
    H, W = x.shape[2:]
    oh = _pool_len(H, size[0], strides[0], padding[0], padding[2], dilation[0], ceil_mode)
    ow = _pool_len(W, size[1], strides[1], padding[1], padding[3], dilation[1], ceil_mode)
    out = np.zeros(x.shape[:2] + (oh, ow), np.int64)
    for b, c, i, j in itertools.product(range(x.shape[0]), range(x.shape[1]), range(oh), range(ow)):
        taps = [(i * strides[0] - padding[0] + a * dilation[0], j * strides[1] - padding[1] + e * dilation[1]) for a in range(size[0]) for e in range(size[1])]
        inside = [(y, q) for y, q in taps if 0 <= y < H and 0 <= q < W]
        y, q = max(inside, key=lambda t: (x[b, c, t[0], t[1]], -inside.index(t)))
        out[b, c, i, j] = y * W + q
    return out


def adaptive_ref(x: np.ndarray, size: Sequence[int]) -> np.ndarray:
    x = x.astype(np.float64)
    H, W = x.shape[2:]
    out = np.zeros(x.shape[:2] + tuple(size))
    for i, j in itertools.product(range(size[0]), range(size[1])):
        r0, r1 = i * H // size[0], -(-(i + 1) * H // size[0])
        c0, c1 = j * W // size[1], -(-(j + 1) * W // size[1])
        out[:, :, i, j] = x[:, :, r0:r1, c0:c1].mean(axis=(2, 3))
    return out


# -- legalized kernels ---------------------------------------------------------------------------

ENVS = envs({n: 1, h: 5, w: 6}, {n: 2, h: 9, w: 7}, {n: 1, h: 16, w: 11})
ENVS_POOL = envs({n: 1, h: 1, w: 1}, {n: 2, h: 9, w: 7}, {n: 1, h: 4, w: 11})
ENVS_DILATED = envs({n: 1, h: 3, w: 5}, {n: 2, h: 9, w: 7}, {n: 1, h: 4, w: 11})
ENVS_1D = envs({n: 1, w: 3}, {n: 2, w: 17}, {n: 3, w: 64})


def _conv_case(name: str, x: Any, k: Any, bias: bool, env_list: Any = ENVS, dtype: str = "float32", tol: float | None = 1e-4, **attrs: Any) -> Case:
    nsp = len(x) - 2
    fn = op.conv1d if nsp == 1 else op.conv2d
    infos = [T(*x, dtype=dtype), T(*k, dtype=dtype)] + ([T(k[0], dtype=dtype)] if bias else [])
    strides = attrs.get("strides", 1)
    padding = attrs.get("padding", 0)
    dilation = attrs.get("dilation", 1)
    groups = attrs.get("groups", 1)
    st = (strides,) * nsp if isinstance(strides, int) else strides
    pd = (padding,) * (2 * nsp) if isinstance(padding, int) else (tuple(padding) * 2 if len(padding) == nsp else tuple(padding))
    dl = (dilation,) * nsp if isinstance(dilation, int) else dilation

    def make(*args: Any) -> Any:
        return fn(args[0], args[1], args[2] if bias else None, **attrs)

    def ref(*arrays: np.ndarray) -> np.ndarray:
        return conv_ref(arrays[0], arrays[1], arrays[2] if bias else None, st, pd, dl, groups)

    return Case(f"conv_{name}", make, infos, ref, env_list, tol=tol)


def _cases() -> list[Case]:
    return [
        _conv_case("2d_plain", (n, 3, h, w), (4, 3, 3, 3), bias=True),
        _conv_case("2d_stride_pad", (n, 3, h, w), (4, 3, 3, 2), bias=False, strides=2, padding=1),
        _conv_case("2d_asym_pad_dilation", (n, 2, h, w), (3, 2, 2, 3), bias=True, padding=(0, 2, 1, 1), dilation=(2, 1)),
        _conv_case("2d_groups", (n, 4, h, w), (6, 2, 3, 3), bias=True, groups=2, padding=1),
        _conv_case("2d_depthwise", (n, 4, h, w), (4, 1, 3, 3), bias=False, groups=4, padding=1, strides=(1, 2)),
        _conv_case("2d_float16", (n, 3, h, w), (4, 3, 3, 3), bias=True, dtype="float16", tol=5e-3),
        _conv_case("1d_pad", (n, 4, w), (5, 4, 3), bias=True, env_list=ENVS_1D, padding=1),
        _conv_case("1d_stride_dilation_groups", (n, 4, w), (2, 2, 2), bias=False, env_list=ENVS_1D, strides=2, dilation=2, groups=2),
        Case("max_pool_2", lambda x: op.max_pool2d(x, 2), [T(n, 3, h, w)], lambda x: pool_ref(x, "max", (2, 2), (2, 2), (0,) * 4), ENVS),
        Case("max_pool_3_2_1", lambda x: op.max_pool2d(x, 3, 2, 1), [T(n, 2, h, w)], lambda x: pool_ref(x, "max", (3, 3), (2, 2), (1,) * 4), ENVS),
        Case("max_pool_ceil_dilation", lambda x: op.max_pool2d(x, 2, 2, 1, dilation=2, ceil_mode=True), [T(n, 2, h, w)], lambda x: pool_ref(x, "max", (2, 2), (2, 2), (1,) * 4, (2, 2), True), ENVS),
        Case("max_pool_int32", lambda x: op.max_pool2d(x, (2, 3), (1, 2)), [T(n, 2, h, w, dtype="int32")], lambda x: pool_ref(x, "max", (2, 3), (1, 2), (0,) * 4).astype(np.int32), ENVS),
        Case("avg_pool_2", lambda x: op.avg_pool2d(x, 2), [T(n, 3, h, w)], lambda x: pool_ref(x, "avg", (2, 2), (2, 2), (0,) * 4), ENVS),
        Case("avg_pool_pad_include", lambda x: op.avg_pool2d(x, 3, 2, 1, ceil_mode=True), [T(n, 2, h, w)], lambda x: pool_ref(x, "avg", (3, 3), (2, 2), (1,) * 4, ceil_mode=True), ENVS),
        Case("avg_pool_pad_exclude", lambda x: op.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), [T(n, 2, h, w)], lambda x: pool_ref(x, "avg", (3, 3), (2, 2), (1,) * 4, ceil_mode=True, count_include_pad=False), ENVS),
        Case("max_pool_indices", lambda x: op.max_pool2d_indices(x, 2, 1, 1), [T(n, 2, h, w)], lambda x: pool_indices_ref(x, (2, 2), (1, 1), (1,) * 4), ENVS_POOL),
        Case("max_pool_indices_dilated", lambda x: op.max_pool2d_indices(x, (2, 3), (2, 1), (1, 1, 0, 1), (2, 1), ceil_mode=True), [T(n, 3, h, w)], lambda x: pool_indices_ref(x, (2, 3), (2, 1), (1, 1, 0, 1), (2, 1), True), ENVS_DILATED),
        Case("max_pool_indices_int32", lambda x: op.max_pool2d_indices(x, 3, 2), [T(n, 2, h, w, dtype="int32")], lambda x: pool_indices_ref(x, (3, 3), (2, 2), (0,) * 4), ENVS_DILATED),
        Case("avg_pool_dilated_include", lambda x: op.avg_pool2d(x, (2, 3), (2, 1), (1, 2, 0, 1), ceil_mode=True, dilation=(2, 3)), [T(n, 2, h, w)], lambda x: pool_ref(x, "avg", (2, 3), (2, 1), (1, 2, 0, 1), (2, 3), True), ENVS_DILATED),
        Case("avg_pool_dilated_exclude", lambda x: op.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False, dilation=2), [T(n, 2, h, w)], lambda x: pool_ref(x, "avg", (3, 3), (2, 2), (1,) * 4, (2, 2), True, False), ENVS_DILATED),
        Case("avg_pool_wide_pad_exclude", lambda x: op.avg_pool2d(x, 3, 1, 2, count_include_pad=False), [T(n, 2, h, w)], lambda x: pool_ref(x, "avg", (3, 3), (1, 1), (2,) * 4, count_include_pad=False), ENVS_POOL),
        Case("avg_pool_wide_pad_include", lambda x: op.avg_pool2d(x, 2, 2, (2, 1, 1, 2), ceil_mode=True), [T(n, 2, h, w)], lambda x: pool_ref(x, "avg", (2, 2), (2, 2), (2, 1, 1, 2), ceil_mode=True), ENVS_POOL),
        Case("adaptive_avg_1", lambda x: op.adaptive_avg_pool2d(x, 1), [T(n, 3, h, w)], lambda x: adaptive_ref(x, (1, 1)), ENVS),
        Case("adaptive_avg_3_2", lambda x: op.adaptive_avg_pool2d(x, (3, 2)), [T(n, 2, h, w)], lambda x: adaptive_ref(x, (3, 2)), ENVS),
    ]


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> Built:
    """The direct loop nests (one kernel per case): im2col + matmul and the padded copy before
    an unrolled conv are tested whole in tests/op/test_conv_gemm.py."""
    from tilework.op import conv

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv, "GEMM_MIN_REDUCTION", 1 << 30)
        mp.setattr(conv, "PAD_UNROLLED", False)
        return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


def test_references_match_torch() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra; the NumPy references are checked against it when present")
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 9, 7))
    k = rng.standard_normal((6, 2, 3, 2))
    b = rng.standard_normal(6)
    t = torch.from_numpy
    got = conv_ref(x, k, b, (2, 1), (1, 0, 1, 0), (1, 2), 2)
    np.testing.assert_allclose(got, F.conv2d(t(x), t(k), t(b), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2).numpy(), atol=1e-10)
    x1, k1 = rng.standard_normal((2, 4, 11)), rng.standard_normal((2, 2, 2))
    np.testing.assert_allclose(conv_ref(x1, k1, None, (2,), (1, 1), (2,), 2), F.conv1d(t(x1), t(k1), stride=2, padding=1, dilation=2, groups=2).numpy(), atol=1e-10)
    np.testing.assert_allclose(pool_ref(x, "max", (2, 2), (2, 2), (1,) * 4, (2, 2), True), F.max_pool2d(t(x), 2, 2, 1, dilation=2, ceil_mode=True).numpy())
    _, where = F.max_pool2d(t(x), (2, 3), (2, 1), (1, 1), dilation=(2, 1), ceil_mode=True, return_indices=True)
    np.testing.assert_array_equal(pool_indices_ref(x, (2, 3), (2, 1), (1, 1, 1, 1), (2, 1), True), where.numpy())
    for include in (True, False):
        np.testing.assert_allclose(pool_ref(x, "avg", (3, 3), (2, 2), (1,) * 4, ceil_mode=True, count_include_pad=include), F.avg_pool2d(t(x), 3, 2, 1, ceil_mode=True, count_include_pad=include).numpy(), atol=1e-12)
    np.testing.assert_allclose(pool_ref(x, "avg", (3, 2), (2, 1), (2, 1, 0, 1)), F.avg_pool2d(F.pad(t(x), (1, 1, 2, 0)), (3, 2), (2, 1)).numpy(), atol=1e-12)
    np.testing.assert_allclose(adaptive_ref(x, (3, 2)), F.adaptive_avg_pool2d(t(x), (3, 2)).numpy(), atol=1e-12)
    assert math.isclose(float(adaptive_ref(x, (1, 1))[0, 0, 0, 0]), float(x[0, 0].mean()))


def test_dilated_avg_pool_reference_matches_onnx() -> None:
    """torch has no dilated average pool: the NumPy reference is checked against ONNX's."""
    pytest.importorskip("onnx", reason="onnx is an optional extra")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(1).standard_normal((1, 2, 9, 7)).astype(np.float32)
    for include in (0, 1):
        node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), dilations=(2, 2), ceil_mode=1, count_include_pad=include)
        vi = helper.make_tensor_value_info
        model = helper.make_model(helper.make_graph([node], "g", [vi("x", TensorProto.FLOAT, x.shape)], [vi("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 19)])
        (got,) = ReferenceEvaluator(model).run(None, {"x": x})
        np.testing.assert_allclose(pool_ref(x, "avg", (3, 3), (2, 2), (1,) * 4, (2, 2), True, bool(include)), np.asarray(got), atol=1e-5)

"""``im2col`` (channel-last column matrix of a 2-D convolution) built whole (the padded copy,
the gather, its view; C kernels) at several values of the symbolic batch and spatial dims,
against a NumPy reference, with ``max_pool2d_nhwc`` and ``depthwise_conv2d_nhwc`` likewise; and the column matrix times the conv weight as ``[O, KH * KW *
C]`` (``conv_gemm.conv_weight_matrix``) equals the convolution. The static depthwise convs at
batch 3 in float64 (batch 3 runs in float32, float64 at batch 1) run only in the long tier."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tests.long import long_param
import tilework.op as op
from tests.op.test_conv import conv_ref
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Tuple, Var
from tilework.ir.info import TensorInfo
from tilework.op.conv_nhwc import MAX_POOLED_RUN, depthwise_conv2d_nhwc, global_avg_pool_nhwc, im2col, max_pool2d_nhwc
from tilework.transform.legalize import Legalize
from tilework.transform.conv_gemm import conv_weight_matrix, depthwise_weight_matrix

n, h, w = tw.dim("n"), tw.dim("h"), tw.dim("w")

# name: (channels, kernel, strides, padding (top, left, bottom, right), dilation)
CASES: dict[str, tuple[int, tuple[int, int], tuple[int, int], tuple[int, int, int, int], tuple[int, int]]] = {
    "3x3_pad": (5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    "3x3_stride2": (4, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    "1x1_stride2": (6, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),
    "7x7_stem": (3, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),
    "asym_dilated": (2, (3, 2), (1, 3), (2, 0, 1, 1), (2, 1)),
    "no_pad_odd": (1, (2, 3), (3, 2), (0, 0, 0, 0), (1, 1)),
}
# max_pool2d_nhwc of the first case's input: (pool size, strides, padding)
# (the first two read clamped taps, the third a copy padded with -inf: a window all padding)
POOLS = [((3, 3), (2, 2), (1, 1, 1, 1)), ((2, 3), (1, 2), (0, 1, 1, 0)), ((2, 2), (2, 2), (0, 0, 2, 0))]
# depthwise_conv2d_nhwc of the first case's input with a 2 x 3 kernel: (strides, padding, dilation)
DEPTHWISE = [((1, 1), (1, 1, 0, 1), (1, 1)), ((2, 1), (0, 2, 1, 0), (2, 2))]
ENVS = [{"n": 1, "h": 7, "w": 9}, {"n": 3, "h": 12, "w": 11}, {"n": 2, "h": 5, "w": 16}]


def im2col_ref(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int], padding: tuple[int, int, int, int], dilation: tuple[int, int]) -> np.ndarray:
    nb, hh, ww, c = x.shape
    xp = np.pad(x, ((0, 0), (padding[0], padding[2]), (padding[1], padding[3]), (0, 0)))
    oh = (hh + padding[0] + padding[2] - dilation[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    ow = (ww + padding[1] + padding[3] - dilation[1] * (kernel[1] - 1) - 1) // strides[1] + 1
    out = np.zeros((nb, oh, ow, kernel[0], kernel[1], c), x.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            r, q = i * dilation[0], j * dilation[1]
            out[:, :, :, i, j, :] = xp[:, r : r + strides[0] * (oh - 1) + 1 : strides[0], q : q + strides[1] * (ow - 1) + 1 : strides[1], :]
    return out.reshape(nb, oh, ow, -1)


def max_pool_ref(x: np.ndarray, size: tuple[int, int], strides: tuple[int, int], padding: tuple[int, int, int, int]) -> np.ndarray:
    nb, hh, ww, c = x.shape
    xp = np.pad(x, ((0, 0), (padding[0], padding[2]), (padding[1], padding[3]), (0, 0)), constant_values=-np.inf)
    oh, ow = (hh + padding[0] + padding[2] - size[0]) // strides[0] + 1, (ww + padding[1] + padding[3] - size[1]) // strides[1] + 1
    taps = [xp[:, i : i + strides[0] * (oh - 1) + 1 : strides[0], j : j + strides[1] * (ow - 1) + 1 : strides[1], :] for i in range(size[0]) for j in range(size[1])]
    return np.max(taps, axis=0)


def _module() -> Any:
    """Every case in one function (one build): input ``i`` is case ``i``'s."""
    bb = BlockBuilder()
    xs = [Var(f"x{i}", TensorInfo((n, h, w, case[0]), "float32")) for i, case in enumerate(CASES.values())]
    taps, bias = Var("taps", TensorInfo((6, 5), "float32")), Var("bias", TensorInfo((5,), "float32"))
    with bb.function("main", [*xs, taps, bias]):
        with bb.dataflow():
            outs = []
            for x, (_, kernel, strides, padding, dilation) in zip(xs, CASES.values()):
                y = bb.emit(im2col(x, kernel, strides, padding, dilation))
                outs.append(bb.emit(op.relu(y)))  # an elementwise consumer fuses into the gather
            for size, strides, padding in POOLS:
                outs.append(bb.emit(max_pool2d_nhwc(xs[0], size, strides, padding)))
            for strides, padding, dilation in DEPTHWISE:
                outs.append(bb.emit(depthwise_conv2d_nhwc(xs[0], taps, bias, (2, 3), strides, padding, dilation)))
            out = bb.emit_output(Tuple(tuple(outs)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def vm() -> Any:
    return tw.VM(tw.build(_module()))


def test_struct_info_is_symbolic() -> None:
    f = _module()["main"]
    assert str(f.ret_info.fields[1]) == str(TensorInfo((n, (h - 1) // 2 + 1, (w - 1) // 2 + 1, 36), "float32"))


def test_matches_reference(vm: Any) -> None:
    rng = np.random.default_rng(0)
    for env in ENVS:
        xs = [rng.standard_normal((env["n"], env["h"], env["w"], case[0])).astype(np.float32) for case in CASES.values()]
        k, b = rng.standard_normal((5, 1, 2, 3)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
        got = vm["main"](*xs, depthwise_weight_matrix(k), b)
        for i, (name, (_, kernel, strides, padding, dilation)) in enumerate(CASES.items()):
            want = np.maximum(im2col_ref(xs[i], kernel, strides, padding, dilation), 0)
            assert np.asarray(got[i]).shape == want.shape, (name, env)
            np.testing.assert_array_equal(np.asarray(got[i]), want, err_msg=f"{name} at {env}")
        for i, (size, strides, padding) in enumerate(POOLS):
            want = max_pool_ref(xs[0], size, strides, padding)
            np.testing.assert_array_equal(np.asarray(got[len(CASES) + i]), want, err_msg=f"max pool {size} at {env}")
        x64 = xs[0].transpose(0, 3, 1, 2).astype(np.float64)
        for i, (strides, padding, dilation) in enumerate(DEPTHWISE):
            want = conv_ref(x64, k.astype(np.float64), b.astype(np.float64), strides, padding, dilation, 5).transpose(0, 2, 3, 1)
            np.testing.assert_allclose(np.asarray(got[len(CASES) + len(POOLS) + i]), want, rtol=1e-5, atol=1e-5, err_msg=f"depthwise {strides} at {env}")


@pytest.mark.parametrize("name", ["3x3_pad", "asym_dilated", "7x7_stem"])
def test_columns_times_weight_matrix_is_the_conv(name: str) -> None:
    c, kernel, strides, padding, dilation = CASES[name]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 9, 10, c))
    k = rng.standard_normal((5, c, *kernel))
    got = im2col_ref(x, kernel, strides, padding, dilation) @ conv_weight_matrix(k).T
    want = conv_ref(x.transpose(0, 3, 1, 2), k, None, strides, padding, dilation, 1).transpose(0, 2, 3, 1)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


# depthwise_conv2d_nhwc at static shapes: (height, width, channels, kernel, strides, padding, dilation)
STATIC_DEPTHWISE = [
    (7, 9, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (13, 11, 3, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),
    (8, 7, 4, (3, 3), (2, 2), (0, 1, 1, 0), (1, 1)),
    (9, 10, 2, (3, 2), (1, 3), (2, 0, 1, 1), (2, 1)),
    (9, 10, 2, (3, 3), (1, 1), (1, 1, 1, 1), (2, 2)),  # a clamped tap reads a position outside its window
    (1, 1, 3, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
]


@pytest.mark.parametrize(
    ("batch", "dtype"),
    [(1, "float32"), (1, "float64"), (3, "float32"), long_param(3, "float64", why="batch 3 runs in float32, float64 at batch 1")],
)
def test_depthwise_at_static_shapes_reads_no_padded_copy(dtype: str, batch: int) -> None:
    """Taps that can fall in the padding read a clamped position and count zero there: no
    padded copy is made, and an inf or NaN at the input's border reaches only the outputs
    whose windows hold it (a masked tap adds +0, not inf * 0)."""
    bb = BlockBuilder()
    xs = [Var(f"x{i}", TensorInfo((batch, hh, ww, c), dtype)) for i, (hh, ww, c, *_) in enumerate(STATIC_DEPTHWISE)]
    ks = [Var(f"k{i}", TensorInfo((kernel[0] * kernel[1], c), dtype)) for i, (_, _, c, kernel, *_) in enumerate(STATIC_DEPTHWISE)]
    with bb.function("main", [*xs, *ks]):
        with bb.dataflow():
            outs = [bb.emit(depthwise_conv2d_nhwc(x, k, None, kernel, strides, padding, dilation)) for x, k, (_, _, _, kernel, strides, padding, dilation) in zip(xs, ks, STATIC_DEPTHWISE)]
            out = bb.emit_output(Tuple(tuple(outs)))
        bb.emit_func_output(out)
    mod = bb.get()
    assert not [name for name, _ in Legalize()(mod).tensor_funcs() if "pad" in name]
    rng = np.random.default_rng(batch)
    inputs, weights = [], []
    for hh, ww, c, kernel, *_ in STATIC_DEPTHWISE:
        x = rng.standard_normal((batch, hh, ww, c)).astype(dtype)
        x[0, 0, 0, 0], x[-1, -1, -1, -1] = np.inf, np.nan
        inputs.append(x)
        weights.append(rng.standard_normal((c, 1, *kernel)).astype(dtype))
    got = tw.VM(tw.build(mod))["main"](*inputs, *(depthwise_weight_matrix(k) for k in weights))
    for i, (x, k, (_, _, c, _, strides, padding, dilation)) in enumerate(zip(inputs, weights, STATIC_DEPTHWISE)):
        want = conv_ref(x.transpose(0, 3, 1, 2), k, None, strides, padding, dilation, c).transpose(0, 2, 3, 1)
        assert np.asarray(got[i]).shape == want.shape
        np.testing.assert_allclose(np.asarray(got[i]), want, rtol=1e-5, atol=1e-5, err_msg=f"case {i}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_global_avg_pool_nhwc(dtype: str) -> None:
    """Static spatial dims (1 x 1, odd, one over ``MAX_POOLED_RUN``: the mean fallback) and
    symbolic ones (the fallback), at batch 1 and 3."""
    shapes: list[tuple[Any, Any, int]] = [(1, 1, 3), (7, 9, 5), (3, MAX_POOLED_RUN + 1, 4), (h, w, 6)]
    bb = BlockBuilder()
    xs = [Var(f"x{i}", TensorInfo((n, hh, ww, c), dtype)) for i, (hh, ww, c) in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(Tuple(tuple(bb.emit(global_avg_pool_nhwc(x)) for x in xs)))
        bb.emit_func_output(out)
    vm = tw.VM(tw.build(bb.get()))
    rng = np.random.default_rng(7)
    for batch, env_h, env_w in ((1, 5, 3), (3, 4, 11)):
        inputs = [rng.standard_normal((batch, env_h if hh is h else hh, env_w if ww is w else ww, c)).astype(dtype) for hh, ww, c in shapes]
        got = vm["main"](*inputs)
        for i, x in enumerate(inputs):
            np.testing.assert_allclose(np.asarray(got[i]), x.mean(axis=(1, 2), keepdims=True), rtol=1e-5, atol=1e-6, err_msg=f"{x.shape}")

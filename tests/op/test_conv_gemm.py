"""The fast convolution paths: im2col + the matmul kernels (``tilework.op.conv._conv_gemm``)
and the unrolled sum for short reductions such as depthwise (``_conv_unrolled``), built whole
(views, fusion, the default schedules, C) and run at several values of the symbolic batch and
spatial dims against the float64 NumPy reference of tests/op/test_conv.py and against the
plain reduction loop nest (both fast paths switched off)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.test_conv import conv_ref
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.op import conv

n, h, w = tw.dim("n"), tw.dim("h"), tw.dim("w")

# name: (x shape, weight shape, bias, attrs); symbolic n, h, w; odd sizes and 1s
CASES: dict[str, tuple[tuple[Any, ...], tuple[int, ...], bool, dict[str, Any]]] = {
    "odd_stride_pad": ((n, 5, h, w), (9, 5, 3, 3), True, {"strides": 3, "padding": 1}),
    "groups_dilation_asym_pad": ((n, 6, h, w), (8, 3, 3, 3), True, {"groups": 2, "padding": (1, 0, 2, 1), "strides": (2, 1), "dilation": (1, 2)}),
    "pointwise": ((n, 8, h, w), (5, 8, 1, 1), False, {}),
    "stem_7x7": ((n, 3, h, w), (16, 3, 7, 7), False, {"strides": 2, "padding": 3}),
    "conv1d": ((n, 5, w), (7, 5, 3), True, {"strides": 2, "padding": 2, "dilation": 2}),
    "wide_groups_relu": ((n, 32, h, w), (40, 8, 3, 3), True, {"groups": 4, "padding": 1}),
    "static_positions_relu": ((n, 8, 8, 8), (16, 8, 3, 3), True, {"padding": 1}),  # 64 positions: no crop
    "static_pointwise": ((n, 12, 4, 8), (8, 12, 1, 1), True, {}),  # 32 positions: the input is the column matrix
    # unrolled (at most MAX_UNROLLED_TAPS products per output)
    "depthwise_stride_relu": ((n, 6, h, w), (6, 1, 3, 3), True, {"groups": 6, "strides": 2, "padding": 1}),
    "depthwise_multiplier_5x5_dilation": ((n, 4, h, w), (8, 1, 5, 5), False, {"groups": 4, "padding": (2, 1, 3, 0), "dilation": (1, 2)}),
    "conv1d_short": ((n, 2, w), (3, 2, 3), True, {"padding": 1}),
}
ENVS = [{"n": 1, "h": 7, "w": 9}, {"n": 3, "h": 12, "w": 11}, {"n": 2, "h": 17, "w": 16}]


def _module(name: str) -> Any:
    x, k, bias, attrs = CASES[name]
    bb = BlockBuilder()
    params = [Var("x", TensorInfo(x, "float32")), Var("k", TensorInfo(k, "float32"))] + ([Var("b", TensorInfo((k[0],), "float32"))] if bias else [])
    fn = op.conv1d if len(x) == 3 else op.conv2d
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(fn(params[0], params[1], params[2] if bias else None, **attrs))
            if name.endswith("relu"):
                y = bb.emit(op.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _geometry(x: tuple[Any, ...], attrs: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    nsp = len(x) - 2
    st, dl, pd = attrs.get("strides", 1), attrs.get("dilation", 1), attrs.get("padding", 0)
    st = (st,) * nsp if isinstance(st, int) else st
    dl = (dl,) * nsp if isinstance(dl, int) else dl
    pd = (pd,) * (2 * nsp) if isinstance(pd, int) else tuple(pd)
    return st, pd, dl, attrs.get("groups", 1)


@pytest.fixture(scope="module")
def vms() -> dict[str, tuple[Any, Any]]:
    """Each case built twice: the fast path, and the plain reduction loop nest."""
    out = {}
    for name in CASES:
        gemm = tw.VM(tw.build(_module(name)))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv, "GEMM_MIN_REDUCTION", 1 << 30)
            mp.setattr(conv, "MAX_UNROLLED_TAPS", 0)
            direct = tw.VM(tw.build(_module(name)))
        out[name] = (gemm, direct)
    return out


def test_gemm_path_is_taken() -> None:
    from tilework.transform.legalize import Legalize

    mod = Legalize()(_module("odd_stride_pad"))
    names = {name for name, _ in mod.tensor_funcs()}
    assert any(n.startswith("im2col") for n in names) and any(n.startswith("conv_gemm") for n in names)
    assert any(n.startswith("conv_crop") for n in names)  # 3 x 3 = 9 positions at h = w = 7, padded
    names = {name for name, _ in Legalize()(_module("static_positions_relu")).tensor_funcs()}
    assert not any(n.startswith("conv_crop") for n in names)
    names = {name for name, _ in Legalize()(_module("static_pointwise")).tensor_funcs()}
    assert "im2col" not in names and not any(n.startswith("conv_crop") for n in names), names


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference_and_direct(vms: dict[str, tuple[Any, Any]], name: str) -> None:
    x, k, bias, attrs = CASES[name]
    st, pd, dl, groups = _geometry(x, attrs)
    gemm, direct = vms[name]
    rng = np.random.default_rng(0)
    kw = rng.standard_normal(k).astype(np.float32)
    b = rng.standard_normal(k[0]).astype(np.float32) if bias else None
    for env in ENVS:
        shape = tuple(env[d.name] if not isinstance(d, int) else d for d in x) if len(x) == 4 else (env["n"], x[1], env["w"])
        xv = rng.standard_normal(shape).astype(np.float32)
        args = [xv, kw] + ([b] if bias else [])
        want = conv_ref(xv.astype(np.float64), kw.astype(np.float64), None if b is None else b.astype(np.float64), st, pd, dl, groups)
        if name.endswith("relu"):
            want = np.maximum(want, 0)
        got = np.asarray(gemm["main"](*args))
        ref_direct = np.asarray(direct["main"](*args))
        assert got.shape == want.shape, (name, env)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} at {env}")
        np.testing.assert_allclose(got, ref_direct, rtol=1e-4, atol=1e-4, err_msg=f"{name} at {env} vs direct")

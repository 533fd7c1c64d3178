"""The shapes ONNX exporters write around convolutions reach conv_gemm's channel-last chain too:
a GlobalAveragePool / GlobalMaxPool (``mean`` / ``max`` over the spatial axes, dims kept or not)
sinks the transposes like ``adaptive_avg_pool2d``, and a Gemm with ``transB``
(``matmul(x, permute_dims(w, (1, 0)))``) becomes a packed linear instead of a transpose of its
weight on every call. Numerics against NumPy at a symbolic batch of 1 and 3 and odd sizes,
the weight param laid out by ``pack_weights``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tests.op.test_conv import conv_ref
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, Call, Constant, GraphFunc, OpRef, Var, bindings_of
from tilework.ir.info import TensorInfo
from tilework.op.linalg import matmul
from tilework.op.manipulate import permute_dims, reshape
from tilework.transform.layout_weights import LayoutWeights, pack_weights

RNG = np.random.default_rng(3)
K1 = RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)
K2, B2 = RNG.standard_normal((6, 6, 1, 1)).astype(np.float32), RNG.standard_normal(6).astype(np.float32)
W, BW = RNG.standard_normal((5, 6)).astype(np.float32), RNG.standard_normal(5).astype(np.float32)


def _ops(mod: tw.IRModule) -> list[str]:
    f = mod["main"]
    assert isinstance(f, GraphFunc)
    return [b.value.callee.name for b in bindings_of(f) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)]


def _module(keepdims: bool) -> Any:
    """conv -> relu -> GlobalAveragePool -> 1x1 conv -> sigmoid -> x * gate -> GlobalMaxPool
    (dims kept or not) -> Gemm(transB) of a weight param."""
    n = tw.dim("n")
    bb = BlockBuilder()
    x, w = Var("x", TensorInfo((n, 3, tw.dim("h"), tw.dim("w")), "float32")), Var("w", TensorInfo((5, 6), "float32"))
    with bb.function("main", [x, w], attrs={"num_inputs": 1}):
        with bb.dataflow():
            y = bb.emit(tw.op.relu(bb.emit(tw.op.conv2d(x, Constant.of(K1), None, strides=(2, 2), padding=(1, 1, 1, 1)))))
            s = bb.emit(tw.op.mean(y, axis=(2, 3), keepdims=True))
            g = bb.emit(tw.op.sigmoid(bb.emit(tw.op.conv2d(s, Constant.of(K2), Constant.of(B2)))))
            z = bb.emit(tw.op.max(bb.emit(tw.op.multiply(y, g)), axis=(-2, -1), keepdims=keepdims))
            z = bb.emit(reshape(z, (n, 6))) if keepdims else z
            out = bb.emit_output(tw.op.add(bb.emit(matmul(z, bb.emit(permute_dims(w, (1, 0))))), Constant.of(BW)))
        bb.emit_func_output(out)
    return bb.get()


def _reference(x: np.ndarray) -> np.ndarray:
    y = np.maximum(conv_ref(x, K1, None, (2, 2), (1, 1, 1, 1), (1, 1), 1), 0)
    g = 1 / (1 + np.exp(-conv_ref(y.mean(axis=(2, 3), keepdims=True), K2, B2, (1, 1), (0, 0, 0, 0), (1, 1), 1)))
    return np.asarray((y * g).max(axis=(2, 3)) @ W.T.astype(np.float64) + BW)


@pytest.mark.parametrize("keepdims", [True, False])
def test_global_pools_and_transposed_gemm_stay_channel_last(keepdims: bool) -> None:
    after = LayoutWeights(params=True)(_module(keepdims))
    ops = _ops(after)
    assert "conv2d" not in ops and "matmul" not in ops, ops
    assert ops.count("permute_dims") == (1 if keepdims else 0), ops  # a [n, 6, 1, 1] view when kept (the 3-channel input is read as it is)
    assert ops.count("direct_conv2d_nhwc") == 1 and ops.count("linear_io") == 2, ops
    vm = tw.VM(tw.build(after))
    weights = pack_weights(after, [W])
    for shape in ((1, 3, 9, 7), (3, 3, 11, 8)):
        x = RNG.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(np.asarray(vm["main"](x, *weights)), _reference(x.astype(np.float64)), rtol=1e-4, atol=1e-4)

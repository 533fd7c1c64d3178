"""conv_gemm: 2-D convolutions with compile-time weights become im2col + packed linears over
channel-last data, the transposes between them cancel, and the numerics equal torch's (and
the unconverted module's) at a symbolic batch of 1 and odd sizes, through weight params and
through constants.

The network's stem is a 3x3 conv by default; the same network with a 7x7 stem (ResNet's, whose
direct conv of 147 taps compiles to about 1 MB of C) runs only in the long tier
(TILEWORK_LONG_TESTS=1)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tests.long import long_param
from tests.op.test_conv import conv_ref
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, Call, Constant, GraphFunc, OpRef, Var, bindings_of
from tilework.ir.info import TensorInfo
from tilework.transform.conv_gemm import ATTR, DEPTHWISE, DIRECT, ConvGemm, conv_weight_matrix
from tilework.transform.layout_weights import LayoutWeights, pack_weights

torch = pytest.importorskip("torch")
nn = torch.nn


def _ops(mod: tw.IRModule) -> list[str]:
    f = mod["main"]
    assert isinstance(f, GraphFunc)
    return [b.value.callee.name for b in bindings_of(f) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)]


class Net(nn.Module):  # type: ignore[name-defined]
    """A stem, a max pool, a residual block, a strided block with a 1x1 shortcut, a
    squeeze-excite multiply, a channel-first pointwise conv, grouped and depthwise convs, a
    dilated conv and a global pool: what the pass converts, sinks through, and leaves."""

    def __init__(self, stem: int = 7) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, stem, 2, stem // 2, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.a1, self.a2 = nn.Conv2d(8, 8, 3, 1, 1), nn.Conv2d(8, 8, 3, 1, 1)
        self.b1, self.b2, self.down = nn.Conv2d(8, 12, 3, 2, 1), nn.Conv2d(12, 12, 3, 1, 1), nn.Conv2d(8, 12, 1, 2)
        self.se1, self.se2 = nn.Conv2d(12, 4, 1), nn.Conv2d(4, 12, 1)
        self.dil = nn.Conv2d(12, 10, 3, 1, 2, dilation=2)
        self.grouped, self.dw, self.pw = nn.Conv2d(10, 10, 3, 1, 1, groups=2), nn.Conv2d(10, 10, 3, 1, 1, groups=10), nn.Conv2d(10, 6, 1)
        self.fc = nn.Linear(6, 5)

    def forward(self, x: Any) -> Any:
        x = self.stem(x)
        x = torch.relu(self.a2(torch.relu(self.a1(x))) + x)
        x = torch.relu(self.b2(torch.relu(self.b1(x))) + self.down(x))
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        x = x * nn.functional.hardsigmoid(self.se2(torch.relu(self.se1(s))))
        x = nn.functional.hardswish(self.dil(x))
        x = self.pw(self.dw(self.grouped(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


@pytest.fixture(scope="module", params=[3, long_param(7, why="the 7x7 stem's direct conv is 1 MB of C (20 s of gcc); tests/schedule/test_stencil.py checks its jam")], ids=lambda k: f"stem{k}")
def compiled(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = Net(request.param).eval()
    with torch.no_grad():
        model.stem[1].running_mean.uniform_(-0.1, 0.1)
        model.stem[1].running_var.uniform_(0.5, 1.5)
    batch = torch.export.Dim("batch", min=1, max=8)
    return model, tw.compile(model, (torch.randn(2, 3, 29, 23),), ({0: batch},))


def test_convs_become_linears_between_channel_last_data(compiled: tuple[Any, Any]) -> None:
    _, cm = compiled
    ops = _ops(cm.module)
    assert ops.count("linear_io") == 6 + 2 + 1 + 1, ops  # a1, a2, b1, b2, down, dil; the squeeze-excite pair; pw; fc
    assert ops.count("conv2d") == 0 and ops.count("grouped_conv2d_nhwc") == 1  # the grouped conv reads channel-last data too
    assert ops.count("direct_conv2d_nhwc") == 1  # the stem: 3 channels in, 8 out, reading the channel-first input
    assert ops.count("depthwise_conv2d_nhwc") == 1 and ops.count("max_pool2d_nhwc") == 1
    assert ops.count("im2col") == 6  # the converted convs but the stem and the 1x1 ones of stride 1
    assert ops.count("permute_dims") == 1, ops  # the pooled [N, 6, 1, 1] (none of the input)
    main = cm.module["main"]
    assert len(main.attrs[ATTR]) == 6 + 2 + 1 and len(main.attrs[DEPTHWISE]) == 1 and len(main.attrs[DIRECT]) == 1 + 1  # the stem's, the grouped conv's


def compile_with_random_norms(model: Any, image: tuple[int, ...]) -> tuple[Any, Any]:
    """``model`` in eval mode with random batch-norm statistics and affine parameters, and its
    compilation at a symbolic batch (1..8) for inputs ``[batch, *image]``."""
    torch.manual_seed(0)
    model = model.eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    batch = torch.export.Dim("batch", min=1, max=8)
    return model, tw.compile(model, (torch.randn(2, *image),), ({0: batch},))


def matches_torch(model: Any, cm: Any, image: tuple[int, ...], batches: tuple[int, ...] = (1, 3)) -> None:
    """``cm`` computes what ``model`` does, within 1e-4, at each batch size for a random input
    of ``[batch, *image]``."""
    for b in batches:
        x = torch.randn(b, *image)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(np.asarray(cm(x)), want, rtol=1e-4, atol=1e-4)


def test_matches_torch_at_symbolic_batch(compiled: tuple[Any, Any]) -> None:
    matches_torch(*compiled, (3, 29, 23))


RNG = np.random.default_rng(0)
K1, B1, K2 = (RNG.standard_normal(s).astype(np.float32) for s in ((7, 5, 3, 3), (7,), (4, 7, 1, 1)))


def _const_module() -> tw.IRModule:
    """conv (strided, asymmetric padding) -> relu -> 1x1 conv with constant weights, symbolic
    batch and spatial dims."""
    n, h, w = tw.dim("n"), tw.dim("h"), tw.dim("w")
    bb = BlockBuilder()
    x = Var("x", TensorInfo((n, 5, h, w), "float32"))
    k1, b1, k2 = Constant.of(K1, name="k1"), Constant.of(B1, name="b1"), Constant.of(K2, name="k2")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(tw.op.relu(bb.emit(tw.op.conv2d(x, k1, b1, strides=(2, 1), padding=(1, 0, 2, 1)))))
            out = bb.emit_output(tw.op.conv2d(y, k2))
        bb.emit_func_output(out)
    return bb.get()


def test_constant_weights_are_converted_once_and_match() -> None:
    after = LayoutWeights()(_const_module())
    ops = _ops(after)
    assert "conv2d" not in ops and ops.count("linear_io") == 2 and ops.count("permute_dims") == 2, ops
    vm = tw.VM(tw.build(after))
    rng = np.random.default_rng(1)
    for shape in ((1, 5, 4, 7), (3, 5, 9, 6)):
        x = rng.standard_normal(shape).astype(np.float32)
        y = np.maximum(conv_ref(x.astype(np.float64), K1.astype(np.float64), B1.astype(np.float64), (2, 1), (1, 0, 2, 1), (1, 1), 1), 0)
        want = conv_ref(y, K2.astype(np.float64), None, (1, 1), (0, 0, 0, 0), (1, 1), 1)
        np.testing.assert_allclose(np.asarray(vm["main"](x)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels, attr, shape", [(5, ATTR, (4, 45)), (3, DIRECT, (27, 4))], ids=["im2col", "direct"])
def test_weight_params_are_retyped_and_converted_by_pack_weights(channels: int, attr: str, shape: tuple[int, int]) -> None:
    """A conv weight param is retyped to the matrix its kernel reads (``[O, KH * KW * C]`` for
    im2col's product, ``[KH * KW * C, O]`` for the direct conv of an image's 3 channels), and
    ``pack_weights`` converts the given weight to it."""
    n = tw.dim("n")
    bb = BlockBuilder()
    x, k = Var("x", TensorInfo((n, channels, 6, 6), "float32")), Var("k", TensorInfo((4, channels, 3, 3), "float32"))
    with bb.function("main", [x, k], attrs={"num_inputs": 1}):
        with bb.dataflow():
            out = bb.emit_output(tw.op.conv2d(x, k, padding=1))
        bb.emit_func_output(out)
    mod = bb.get()
    after = ConvGemm(params=True)(mod)
    main = after["main"]
    assert isinstance(main, GraphFunc) and main.attrs[attr] == (1,) and all(a not in main.attrs for a in (ATTR, DIRECT) if a != attr)
    assert isinstance(main.params[1].info, TensorInfo) and main.params[1].info.shape == shape
    kw = np.random.default_rng(2).standard_normal((4, channels, 3, 3)).astype(np.float32)
    laid = LayoutWeights(params=True)(mod)
    packed = pack_weights(laid, [kw])
    xv = np.random.default_rng(3).standard_normal((2, channels, 6, 6)).astype(np.float32)
    want = np.asarray(tw.VM(tw.build(mod))["main"](xv, kw))
    np.testing.assert_allclose(np.asarray(tw.VM(tw.build(laid))["main"](xv, *packed)), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(conv_weight_matrix(kw)[:, :channels], kw[:, :, 0, 0])  # tap-major, channel-minor

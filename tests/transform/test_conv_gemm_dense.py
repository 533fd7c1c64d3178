"""conv_gemm sinks the transposes through a pre-activation batch norm, a channel concat and
an average pool (a DenseNet's dense block and transition): the concat and the norms run channel-last, the 1x1 convs as
linears over rows, and the numerics equal torch's at a symbolic batch and odd sizes."""

from __future__ import annotations

from typing import Any

import pytest

import tilework as tw
from tests.transform.test_conv_gemm import _ops, compile_with_random_norms, matches_torch

torch = pytest.importorskip("torch")
nn = torch.nn


class Dense(nn.Module):  # type: ignore[name-defined]
    """A stem, three dense layers (BN, ReLU, 1x1 conv, BN, ReLU, 3x3 conv, concat with every
    earlier feature map), a transition (BN, ReLU, 1x1 conv, 2x2 average pool), one more layer,
    a BN and a global pool."""

    def __init__(self, c0: int = 6, growth: int = 5, layers: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c0, 3, 1, 1)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.BatchNorm2d(c0 + i * growth), nn.ReLU(), nn.Conv2d(c0 + i * growth, 7, 1, bias=False), nn.BatchNorm2d(7), nn.ReLU(), nn.Conv2d(7, growth, 3, 1, 1, bias=False))
            for i in range(layers)
        )
        c = c0 + layers * growth
        self.transition = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, 8, 1, bias=False), nn.AvgPool2d(2))
        self.last = nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, growth, 1, bias=False))
        self.norm = nn.BatchNorm2d(8 + growth)

    def forward(self, x: Any) -> Any:
        feats = [self.stem(x)]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        t = self.transition(torch.cat(feats, 1))  # 9 x 7 pooled to 4 x 3: the odd row and column dropped
        y = torch.cat([t, self.last(t)], 1)
        return nn.functional.adaptive_avg_pool2d(torch.relu(self.norm(y)), 1).flatten(1)


@pytest.fixture(scope="module")
def compiled() -> tuple[Any, Any]:
    torch.manual_seed(0)
    return compile_with_random_norms(Dense(), (3, 9, 7))


def test_the_dense_block_runs_channel_last(compiled: tuple[Any, Any]) -> None:
    _, cm = compiled
    ops = _ops(cm.module)
    assert ops.count("conv2d") == 0 and ops.count("linear_io") == 3 + 3 + 2, ops  # the 1x1 convs; the 3x3 ones (im2col); transition, last
    assert ops.count("avg_pool2d") == 0 and ops.count("strided_slice") == 4, ops  # the pool's taps, channel-last
    assert ops.count("permute_dims") <= 1, ops  # the image's, if any: none between the layers
    f = cm.module["main"]
    calls = [b.value for b in tw.ir.graph.bindings_of(f) if isinstance(b.value, tw.ir.graph.Call) and isinstance(b.value.callee, tw.ir.graph.OpRef)]
    assert {int(c.attrs["axis"]) for c in calls if c.callee.name in ("concat", "batch_norm")} == {3}
    (transition,) = [c for c in calls if c.callee.name == "linear_io" and int(c.attrs["out_features"]) == 8]
    assert transition.args[0].info.shape[1:] == (4 * 3, 6 + 3 * 5)  # the pool before the 1x1 conv: its pixels pooled


def test_matches_torch_at_symbolic_batch(compiled: tuple[Any, Any]) -> None:
    matches_torch(*compiled, (3, 9, 7))


class Branch(nn.Module):  # type: ignore[name-defined]
    """A 1x1 conv read by a 2x2 average pool and by something else: the pool does not move
    before it (the conv would run twice: once on the pooled pixels, once for the other reader)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(5, 4, 1)

    def forward(self, x: Any) -> Any:
        y = self.conv(x)
        return nn.functional.avg_pool2d(y, 2).sum((2, 3)) + y.mean((2, 3))


def test_a_conv_read_twice_is_not_pooled_first() -> None:
    torch.manual_seed(0)
    model = Branch().eval()
    cm = tw.compile(model, (torch.randn(2, 5, 7, 9),), ({0: torch.export.Dim("batch", min=1, max=4)},))
    ops = _ops(cm.module)
    assert ops.count("linear_io") + ops.count("conv2d") + ops.count("linear") == 1, ops
    matches_torch(model, cm, (5, 7, 9))

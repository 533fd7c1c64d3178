"""conv_gemm sinks the transposes through ``ceil_mode`` max pools (GoogLeNet's: the windows
``ceil_mode`` adds become bottom/right padding of the channel-last pool) and an inception
module's concat of four branches: the pools run channel-last between the convs, and the
numerics equal torch's at a symbolic batch, odd sizes and batch 1 and 3."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tests.transform.test_conv_gemm import _ops, compile_with_random_norms

torch = pytest.importorskip("torch")
nn = torch.nn


def basic(cin: int, cout: int, k: int, pad: int = 0) -> Any:
    """torchvision's BasicConv2d: conv without bias, batch norm (eps 0.001), ReLU."""
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=pad, bias=False), nn.BatchNorm2d(cout, eps=0.001), nn.ReLU())


class Inception(nn.Module):  # type: ignore[name-defined]
    """1x1; 1x1 -> 3x3; 1x1 -> 3x3; 3x3 max pool (stride 1, padding 1, ceil_mode) -> 1x1;
    concatenated along the channels."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.b1 = basic(cin, 4, 1)
        self.b2 = nn.Sequential(basic(cin, 3, 1), basic(3, 5, 3, 1))
        self.b3 = nn.Sequential(basic(cin, 2, 1), basic(2, 3, 3, 1))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), basic(cin, 3, 1))

    def forward(self, x: Any) -> Any:
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


class Tiny(nn.Module):  # type: ignore[name-defined]
    """A stem conv, a 3x3 stride-2 ``ceil_mode`` pool (15 x 13 -> 7 x 6: a window added on
    the right), an inception module, a 2x2 stride-2 ``ceil_mode`` pool (7 x 6 -> 4 x 3), a
    3x3 stride-3 one with padding 1 (4 x 3 -> 2 x 2: two rows of padding added below, which
    no window may take its maximum from), a global pool."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = basic(3, 6, 3, 1)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.inc = Inception(6)
        self.pool2 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.pool3 = nn.MaxPool2d(3, 3, 1, ceil_mode=True)
        self.head = basic(15, 4, 1)

    def forward(self, x: Any) -> Any:
        y = self.pool2(self.inc(self.pool1(self.stem(x))))
        return nn.functional.adaptive_avg_pool2d(self.pool3(self.head(y) - 1.0), 1).flatten(1)


@pytest.fixture(scope="module")
def compiled() -> tuple[Any, Any]:
    torch.manual_seed(0)
    return compile_with_random_norms(Tiny(), (3, 15, 13))


def test_the_ceil_mode_pools_run_channel_last(compiled: tuple[Any, Any]) -> None:
    _, cm = compiled
    ops = _ops(cm.module)
    assert ops.count("max_pool2d") == 0 and ops.count("max_pool2d_nhwc") == 4, ops
    assert ops.count("permute_dims") <= 1, ops  # the image's, if any: none between the layers


def test_matches_torch_at_symbolic_batch(compiled: tuple[Any, Any]) -> None:
    model, cm = compiled
    for b in (1, 3):
        x = torch.randn(b, 3, 15, 13)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(np.asarray(cm(x)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("hw", [(5, 5), (8, 7), (1, 1)])
def test_ceil_mode_pool_of_a_conv_matches_torch(hw: tuple[int, int]) -> None:
    torch.manual_seed(1)
    model = nn.Sequential(basic(16, 24, 3, 1), nn.MaxPool2d(2, 2, ceil_mode=True), basic(24, 16, 1), nn.MaxPool2d(3, 2, 1, ceil_mode=True)).eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    cm = tw.compile(model, (torch.randn(2, 16, *hw),), ({0: batch},))
    assert "max_pool2d" not in _ops(cm.module), _ops(cm.module)
    for b in (1, 3):
        x = torch.randn(b, 16, *hw)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(np.asarray(cm(x)), want, rtol=1e-5, atol=1e-5)

"""Depthwise convolutions from torch (``nn.Conv2d(c, c, k, groups=c)``, with a bias and the
ReLU6 or SiLU of MobileNetV2 and EfficientNet fused after them) through ``tilework.compile``,
against torch eager: kernels 3, 5 and 7, strides 1 and 2, dilation 1 and 2, same and
asymmetric padding, 1, 8, 13, 16, 96, 120 and 144 channels (fewer than a vector, not a
multiple of one, one, several), odd spatial sizes, an input of 1 x 1 and one smaller than
the kernel, at a symbolic batch of 0, 1 and 3. All cases are one module, compiled once.

Which schedule each conv's kernel takes is checked on the op (``depthwise_conv2d_nhwc``) for
the same geometries: the stencil rule (channel blocks, border and interior columns, the
interior jammed) wherever there are at least a vector of channels and columns that see every
tap, stride 2 and 5 x 5 / 7 x 7 kernels included; the elementwise rule below a vector of
channels or without a window along the columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")
import torch  # noqa: E402

import tilework  # noqa: E402
import tilework as tw  # noqa: E402
from tests.schedule.test_stencil import _jammed  # noqa: E402
from tilework.ir.builder import BlockBuilder  # noqa: E402
from tilework.ir.graph import Var  # noqa: E402
from tilework.ir.info import TensorInfo  # noqa: E402
from tilework.op.conv_nhwc import depthwise_conv2d_nhwc  # noqa: E402
from tilework.schedule import default_schedule  # noqa: E402
from tilework.schedule.rules.common import host_registers  # noqa: E402
from tilework.transform.legalize import Legalize  # noqa: E402

# (height, width, channels, kernel, stride, dilation, padding (left, right, top, bottom) or None: k // 2 * dilation all round, epilogue)
CASES: list[tuple[int, int, int, int, int, int, tuple[int, int, int, int] | None, str]] = [
    (13, 11, 1, 3, 1, 1, None, "relu6"),
    (9, 7, 8, 5, 2, 1, None, "silu"),
    (15, 9, 13, 3, 2, 2, None, "relu6"),
    (11, 13, 16, 7, 1, 1, None, "silu"),
    (17, 15, 96, 3, 2, 1, None, "relu6"),  # MobileNetV2's stride-2 conv, smaller
    (9, 11, 120, 5, 1, 1, None, "silu"),  # 120 channels: not a multiple of AVX-512's 16 lanes
    (13, 13, 144, 5, 2, 1, None, "silu"),  # EfficientNet's 5 x 5 stride-2 conv, smaller
    (1, 1, 144, 3, 1, 1, None, "relu6"),
    (12, 10, 16, 3, 1, 2, None, "relu6"),
    (10, 14, 96, 7, 2, 2, None, "silu"),
    (5, 3, 144, 7, 2, 1, None, "relu6"),  # smaller than the kernel
    (10, 9, 32, 3, 2, 1, (0, 1, 0, 1), "relu6"),  # TF-style asymmetric padding (an explicit F.pad)
]
ACTS = {"relu6": torch.nn.ReLU6, "silu": torch.nn.SiLU}


class Layers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.convs = torch.nn.ModuleList(
            torch.nn.Conv2d(c, c, k, s, 0 if pad is not None else k // 2 * d, d, groups=c, bias=True) for _, _, c, k, s, d, pad, _ in CASES
        )
        self.acts = torch.nn.ModuleList(ACTS[act]() for *_, act in CASES)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = []
        for x, conv, act, case in zip(xs, self.convs, self.acts, CASES):
            pad = case[6]
            outs.append(act(conv(torch.nn.functional.pad(x, pad) if pad is not None else x)))
        return tuple(outs)


def _inputs(batch: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, c, hh, ww, generator=g) for hh, ww, c, *_ in CASES]


@pytest.fixture(scope="module")
def compiled() -> tuple[torch.nn.Module, Any]:
    model = Layers().eval()
    b = torch.export.Dim("b", min=0, max=16)
    cm = tilework.compile(model, tuple(_inputs(2, 0)), (tuple({0: b} for _ in CASES),))  # forward(*xs): one entry, a tuple
    return model, cm


@pytest.mark.parametrize("batch", [0, 1, 3])
def test_numerics_against_torch(compiled: tuple[torch.nn.Module, Any], batch: int) -> None:
    model, cm = compiled
    xs = _inputs(batch, batch + 1)
    with torch.no_grad():
        want = model(*xs)
    got = cm(*xs)
    assert len(got) == len(CASES)
    for i, (g, w) in enumerate(zip(got, want)):
        assert tuple(g.shape) == tuple(w.shape), (i, CASES[i])
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"case {i} {CASES[i]} at batch {batch}")


def _rule(hh: int, ww: int, c: int, k: int, s: int, d: int, pad: tuple[int, int, int, int] | None) -> tuple[str, bool]:
    """The schedule rule of the depthwise kernel of one case (as the op, channel-last), and
    whether its interior columns are jammed."""
    n = tw.dim("n", min=0)
    p = k // 2 * d
    padding = (pad[2], pad[0], pad[3], pad[1]) if pad is not None else (p, p, p, p)  # (top, left, bottom, right)
    bb = BlockBuilder()
    x, w = Var("x", TensorInfo((n, hh, ww, c), "float32")), Var("w", TensorInfo((k * k, c), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(depthwise_conv2d_nhwc(x, w, None, (k, k), (s, s), padding, (d, d)))
        bb.emit_func_output(out)
    (f,) = [default_schedule(f, strict=True) for name, f in Legalize()(bb.get()).tensor_funcs() if "depthwise" in name]
    return f.attrs["schedule_rule"], _jammed(f)


def test_which_convs_take_the_stencil_rule() -> None:
    lanes = host_registers().lanes("float32")
    for hh, ww, c, k, s, d, pad, _ in CASES:
        rule, jammed = _rule(hh, ww, c, k, s, d, pad)
        left, right = (pad[0], pad[1]) if pad is not None else (k // 2 * d,) * 2
        out_w = (ww + left + right - d * (k - 1) - 1) // s + 1
        whole = [o for o in range(out_w) if o * s - left >= 0 and o * s - left + d * (k - 1) <= ww - 1]  # columns that see every tap
        window = len({min(max(o * s - left + j * d, 0), ww - 1) for o in range(out_w) for j in range(k)}) >= 3  # distinct columns read (a tap in the padding reads its clamped position)
        want = "stencil" if c >= lanes and window else "elementwise"
        assert rule == want, ((hh, ww, c, k, s, d, pad), rule)
        if rule == "stencil":
            assert jammed == (len(whole) >= 2), ((hh, ww, c, k, s, d, pad), whole)

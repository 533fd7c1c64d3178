"""``grouped_conv2d_nhwc`` (a conv of several groups of several channels each, computed
directly over channel-last data: no column matrix) built whole (the padded copy, the sum; C
kernels) at several values of the symbolic batch and spatial dims, batch 0 and 1 and odd
sizes included, against the float64 grouped conv; its struct info and argument errors; and
torch modules of grouped convs (+ batch norm + ReLU) compiled through ``conv_gemm`` against
torch; a float64 one with constant weights against the reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tests.op.test_conv import conv_ref
from tilework.errors import TileworkError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, Call, Constant, OpRef, Tuple, Var, bindings_of
from tilework.ir.info import TensorInfo
from tilework.op.grouped_conv import grouped_conv2d_nhwc
from tilework.transform.conv_gemm import GROUPED_MAX_TERMS, ConvGemm, direct_weight_matrix
from tilework.transform.layout_weights import LayoutWeights

n, h, w = tw.dim("n", 0), tw.dim("h"), tw.dim("w")

# name: (groups, in channels per group, out channels per group, kernel, strides, padding (top, left, bottom, right), dilation, bias)
CASES: dict[str, tuple[int, int, int, tuple[int, int], tuple[int, int], tuple[int, int, int, int], tuple[int, int], bool]] = {
    "g2": (2, 3, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True),
    "g4_stride2": (4, 2, 2, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
    "width8": (3, 8, 8, (3, 3), (1, 2), (0, 1, 2, 1), (1, 1), True),
    "asym_dilated": (2, 4, 3, (3, 2), (1, 3), (2, 0, 1, 1), (2, 1), False),
    "no_pad_1x1": (4, 2, 4, (1, 1), (2, 1), (0, 0, 0, 0), (1, 1), True),
}
ENVS = [{"n": 1, "h": 7, "w": 9}, {"n": 3, "h": 12, "w": 11}, {"n": 0, "h": 8, "w": 8}, {"n": 2, "h": 5, "w": 16}]


def _module() -> Any:
    """Every case in one function (one build), each result through a relu (an elementwise
    consumer fuses into the sum)."""
    bb = BlockBuilder()
    params, outs_args = [], []
    for i, (g, cg, og, kernel, *_, bias) in enumerate(CASES.values()):
        x, k = Var(f"x{i}", TensorInfo((n, h, w, g * cg), "float32")), Var(f"w{i}", TensorInfo((kernel[0] * kernel[1] * cg, g * og), "float32"))
        b = Var(f"b{i}", TensorInfo((g * og,), "float32")) if bias else None
        params += [x, k] + ([b] if b is not None else [])
        outs_args.append((x, k, b))
    with bb.function("main", params):
        with bb.dataflow():
            outs = []
            for (x, k, b), (g, _, _, kernel, strides, padding, dilation, _) in zip(outs_args, CASES.values()):
                y = bb.emit(grouped_conv2d_nhwc(x, k, b, g, kernel, strides, padding, dilation))
                outs.append(bb.emit(tw.op.relu(y)))
            out = bb.emit_output(Tuple(tuple(outs)))
        bb.emit_func_output(out)
    return bb.get()


def test_symbolic_struct_info_and_values_match_the_reference() -> None:
    mod = _module()
    first = mod["main"].ret_info.fields[0]
    assert str(first) == str(TensorInfo((n, h, w, 2, 5), "float32"))
    vm = tw.VM(tw.build(mod))
    rng = np.random.default_rng(0)
    for env in ENVS:
        args, wants = [], []
        for g, cg, og, kernel, strides, padding, dilation, bias in CASES.values():
            x = rng.standard_normal((env["n"], g * cg, env["h"], env["w"]))
            k = rng.standard_normal((g * og, cg, *kernel))
            b = rng.standard_normal(g * og)
            args += [x.transpose(0, 2, 3, 1).astype(np.float32), direct_weight_matrix(k).astype(np.float32)] + ([b.astype(np.float32)] if bias else [])
            y = np.maximum(conv_ref(x, k, b if bias else None, strides, padding, dilation, g), 0).transpose(0, 2, 3, 1)
            wants.append(y.reshape(*y.shape[:3], g, og))
        got = vm["main"](*args)
        for i, (name, want) in enumerate(zip(CASES, wants)):
            assert np.asarray(got[i]).shape == want.shape, (name, env)
            np.testing.assert_allclose(np.asarray(got[i]), want, rtol=1e-5, atol=1e-5, err_msg=f"{name} at {env}")


def _call(x_shape: tuple[Any, ...], w_shape: tuple[Any, ...], groups: int, bias: int | None = None) -> None:
    bb = BlockBuilder()
    x, k = Var("x", TensorInfo(x_shape, "float32")), Var("k", TensorInfo(w_shape, "float32"))
    b = None if bias is None else Var("b", TensorInfo((bias,), "float32"))
    with bb.function("main", [x, k] + ([b] if b is not None else [])):
        with bb.dataflow():
            out = bb.emit_output(grouped_conv2d_nhwc(x, k, b, groups, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)))
        bb.emit_func_output(out)


@pytest.mark.parametrize(
    "x_shape, w_shape, groups, bias, message",
    [
        ((1, 8, 8, 6), (36, 8), 2, None, "input channels"),
        ((1, 8, 8, 8), (35, 8), 2, None, "9 taps"),
        ((1, 8, 8, 8), (36, 7), 2, None, "2 group"),
        ((1, 8, 8, 8), (36, w), 2, None, "static"),
        ((1, 8, 8), (36, 8), 2, None, "[batch, height, width, channels]"),
        ((1, 8, 8, 8), (36, 8), 0, None, "groups must be >= 1"),
        ((1, 8, 8, 4), (18, 8), 2, 6, "bias must be [8]"),
    ],
)
def test_bad_arguments_name_what_is_wrong(x_shape: tuple[Any, ...], w_shape: tuple[Any, ...], groups: int, bias: int | None, message: str) -> None:
    with pytest.raises(TileworkError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _call(x_shape, w_shape, groups, bias)


torch = pytest.importorskip("torch")

# (channels in, out, groups, kernel, stride, padding, dilation, bias, height, width): group
# widths 2 (ShuffleNet-like halves), 8 (RegNet's), 4 of 32 groups (ResNeXt's 32x4d), more
# output than input channels per group
TORCH_CASES = [
    (4, 4, 2, 3, 1, 1, 1, False, 9, 7),
    (16, 16, 2, 3, 2, 1, 1, True, 11, 10),
    (24, 24, 3, 3, 1, 1, 1, False, 7, 7),
    (128, 128, 32, 3, 2, 1, 1, False, 9, 9),
    (8, 12, 4, 3, 1, 2, 2, True, 8, 13),
    (12, 6, 2, (3, 1), (2, 1), (1, 0), 1, True, 5, 6),
]


class _Grouped(torch.nn.Module):  # type: ignore[name-defined]
    """The grouped convs of ``TORCH_CASES``, each + batch norm + ReLU, on inputs of their own."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Conv2d(c, o, k, s, p, d, g, bias), torch.nn.BatchNorm2d(o), torch.nn.ReLU()) for c, o, g, k, s, p, d, bias, *_ in TORCH_CASES
        )
        with torch.no_grad():
            for m in self.convs:
                m[1].running_mean.uniform_(-0.1, 0.1)
                m[1].running_var.uniform_(0.5, 1.5)

    def forward(self, x0: Any, x1: Any, x2: Any, x3: Any, x4: Any, x5: Any) -> Any:
        return tuple(m(x) for m, x in zip(self.convs, (x0, x1, x2, x3, x4, x5)))


def test_torch_grouped_convs_run_directly_and_match_torch() -> None:
    """Grouped convs compiled from torch (dynamic batch): each becomes one
    ``grouped_conv2d_nhwc`` (no ``im2col``, no ``conv2d`` left), and the results equal
    torch's at batch 1 and 3."""
    torch.manual_seed(0)
    model = _Grouped().eval()
    inputs = [torch.randn(2, c, hh, ww) for c, *_, hh, ww in TORCH_CASES]
    batch = torch.export.Dim("batch", min=1, max=8)
    cm = tw.compile(model, tuple(inputs), tuple({0: batch} for _ in inputs))
    ops = [b.value.callee.name for b in cm.module["main"].body.blocks[0].bindings if hasattr(b.value, "callee") and hasattr(b.value.callee, "name")]
    assert ops.count("grouped_conv2d_nhwc") == len(TORCH_CASES) and "conv2d" not in ops and "im2col" not in ops, ops
    for b in (1, 3):
        xs = [torch.randn(b, c, hh, ww) for c, *_, hh, ww in TORCH_CASES]
        with torch.no_grad():
            wants = model(*xs)
        for i, (got, want) in enumerate(zip(cm(*xs), wants)):
            np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"case {TORCH_CASES[i]} at batch {b}")


def test_constant_float64_weights_are_converted_and_match() -> None:
    """A float64 grouped conv (3 groups of 4 channels, strided, asymmetric padding) with a
    constant weight and bias, through ``layout_weights`` (``conv_gemm``): one
    ``grouped_conv2d_nhwc`` reading the converted constant, equal to the reference at batch 0,
    1 and 3 and odd sizes."""
    rng = np.random.default_rng(2)
    k, b = rng.standard_normal((9, 4, 3, 2)), rng.standard_normal(9)
    bb = BlockBuilder()
    x = Var("x", TensorInfo((n, 12, h, w), "float64"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(tw.op.relu(bb.emit(tw.op.conv2d(x, Constant.of(k, name="k"), Constant.of(b, name="b"), strides=(2, 1), padding=(1, 0, 2, 1), groups=3))))
        bb.emit_func_output(out)
    after = LayoutWeights()(bb.get())
    ops = [bd.value.callee.name for bd in bindings_of(after["main"]) if isinstance(bd, Binding) and isinstance(bd.value, Call) and isinstance(bd.value.callee, OpRef)]
    assert ops.count("grouped_conv2d_nhwc") == 1 and "conv2d" not in ops, ops
    vm = tw.VM(tw.build(after))
    for shape in ((0, 12, 5, 5), (1, 12, 4, 7), (3, 12, 9, 6)):
        xv = rng.standard_normal(shape)
        want = np.maximum(conv_ref(xv, k, b, (2, 1), (1, 0, 2, 1), (1, 1), 3), 0)
        got = np.asarray(vm["main"](xv))
        assert got.shape == want.shape and got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_long_group_sums_stay_conv2d() -> None:
    """A grouped conv of more than ``GROUPED_MAX_TERMS`` products an output (2 groups of 16
    channels, 3x3: 144) is left a ``conv2d`` (im2col and the per-group matmul kernels); one
    of 8 channels a group (72) is converted."""
    assert 9 * 8 <= GROUPED_MAX_TERMS < 9 * 16
    for cg, want in ((16, "conv2d"), (8, "grouped_conv2d_nhwc")):
        bb = BlockBuilder()
        x = Var("x", TensorInfo((n, 2 * cg, 8, 8), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(tw.op.conv2d(x, Constant.of(np.ones((8, cg, 3, 3), np.float32)), padding=1, groups=2))
            bb.emit_func_output(out)
        ops = [bd.value.callee.name for bd in bindings_of(ConvGemm()(bb.get())["main"]) if isinstance(bd, Binding) and isinstance(bd.value, Call) and isinstance(bd.value.callee, OpRef)]
        assert want in ops and (want == "conv2d") == ("conv2d" in ops), (cg, ops)

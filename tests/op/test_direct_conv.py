"""``direct_conv2d_nhwc`` (a conv of few input channels as one sum of products per output,
no column matrix) built whole (the padded copy, the sum; C kernels) at several values of the
symbolic batch and spatial dims, batch 0 and 1 and odd sizes included, reading channel-last
and channel-first inputs, against a float64 reference; at static image sizes (no padded copy:
the stencil schedule, whose border columns and rows test the padding) the same; and its
struct info and argument errors. The static 24 x 9 image (interior rows and columns, as the
13 x 11 one) runs only in the long tier."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
from tests.long import long_param
from tests.op.test_conv import conv_ref
from tilework.errors import TileworkError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Tuple, Var
from tilework.ir.info import TensorInfo
from tilework.op.conv_nhwc import direct_conv2d_nhwc
from tilework.transform.conv_gemm import direct_weight_matrix
from tilework.schedule import default_schedule
from tilework.transform.legalize import Legalize

n, h, w = tw.dim("n", 0), tw.dim("h"), tw.dim("w")

# name: (in channels, out channels, kernel, strides, padding (top, left, bottom, right), dilation, layout, bias)
CASES: dict[str, tuple[int, int, tuple[int, int], tuple[int, int], tuple[int, int, int, int], tuple[int, int], str, bool]] = {
    "stem_nchw": (3, 16, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), "NCHW", True),
    "stem_nhwc": (3, 17, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), "NHWC", True),
    "asym_dilated": (2, 5, (3, 2), (1, 3), (2, 0, 1, 1), (2, 1), "NCHW", False),
    "no_pad_one_channel": (1, 8, (2, 3), (3, 2), (0, 0, 0, 0), (1, 1), "NHWC", True),
    "7x7": (4, 3, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), "NCHW", False),
}
ENVS = [{"n": 1, "h": 7, "w": 9}, {"n": 3, "h": 12, "w": 11}, {"n": 0, "h": 8, "w": 8}, {"n": 2, "h": 5, "w": 16}]


def _module(hh: Any = h, ww: Any = w) -> Any:
    """Every case in one function (one build): inputs x_i, w_i (and b_i) of case i, each result
    through a relu (an elementwise consumer fuses into the sum)."""
    bb = BlockBuilder()
    params, outs_args = [], []
    for i, (c, o, kernel, _, _, _, layout, bias) in enumerate(CASES.values()):
        shape = (n, c, hh, ww) if layout == "NCHW" else (n, hh, ww, c)
        x, k = Var(f"x{i}", TensorInfo(shape, "float32")), Var(f"w{i}", TensorInfo((kernel[0] * kernel[1] * c, o), "float32"))
        b = Var(f"b{i}", TensorInfo((o,), "float32")) if bias else None
        params += [x, k] + ([b] if b is not None else [])
        outs_args.append((x, k, b))
    with bb.function("main", params):
        with bb.dataflow():
            outs = []
            for (x, k, b), (_, _, kernel, strides, padding, dilation, layout, _) in zip(outs_args, CASES.values()):
                y = bb.emit(direct_conv2d_nhwc(x, k, b, kernel, strides, padding, dilation, layout))
                outs.append(bb.emit(tw.op.relu(y)))
            out = bb.emit_output(Tuple(tuple(outs)))
        bb.emit_func_output(out)
    return bb.get()


def test_symbolic_struct_info_and_values_match_the_reference() -> None:
    mod = _module()
    stem = mod["main"].ret_info.fields[0]
    assert str(stem) == str(TensorInfo((n, (h - 1) // 2 + 1, (w - 1) // 2 + 1, 16), "float32"))
    _check(tw.VM(tw.build(mod)), ENVS)


@pytest.mark.parametrize(("hh", "ww"), [(13, 11), long_param(24, 9, why="a second image with interior rows and columns"), (2, 3)])
def test_static_image_sizes_read_the_input_unpadded(hh: int, ww: int) -> None:
    """A static image size: no padded copy (the stencil schedule masks the border columns and
    rows only), at batch 0, 1 and 3; the 2 x 3 image has no interior row or column."""
    mod = _module(hh, ww)
    lib = tw.build(mod)
    funcs = list(Legalize()(mod).tensor_funcs())
    assert funcs and not any("pad" in name for name, _ in funcs), [name for name, _ in funcs]
    stems = [f for name, f in funcs if name.startswith("direct_conv") and f.outputs[0].shape[3] in (16, 17)]
    assert len(stems) == 2 and all(default_schedule(f, strict=True).attrs["schedule_rule"] == "stencil" for f in stems)
    _check(tw.VM(lib), [{"n": b, "h": hh, "w": ww} for b in (0, 1, 3)])


def _check(vm: Any, envs: list[dict[str, int]]) -> None:
    rng = np.random.default_rng(0)
    for env in envs:
        args, wants = [], []
        for c, o, kernel, strides, padding, dilation, layout, bias in CASES.values():
            x = rng.standard_normal((env["n"], c, env["h"], env["w"])).astype(np.float32)
            k = rng.standard_normal((o, c, *kernel)).astype(np.float32)
            b = rng.standard_normal(o).astype(np.float32)
            args += [x if layout == "NCHW" else x.transpose(0, 2, 3, 1).copy(), direct_weight_matrix(k)] + ([b] if bias else [])
            wants.append(np.maximum(conv_ref(x, k, b if bias else None, strides, padding, dilation, 1), 0).transpose(0, 2, 3, 1))
        got = vm["main"](*args)
        for i, (name, want) in enumerate(zip(CASES, wants)):
            assert np.asarray(got[i]).shape == want.shape, (name, env)
            np.testing.assert_allclose(np.asarray(got[i]), want, rtol=1e-5, atol=1e-5, err_msg=f"{name} at {env}")


def _call(x_shape: tuple[int, ...], w_shape: tuple[int, ...], layout: str) -> None:
    bb = BlockBuilder()
    x, k = Var("x", TensorInfo(x_shape, "float32")), Var("k", TensorInfo(w_shape, "float32"))
    with bb.function("main", [x, k]):
        with bb.dataflow():
            out = bb.emit_output(direct_conv2d_nhwc(x, k, None, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), layout))
        bb.emit_func_output(out)


@pytest.mark.parametrize(
    "x_shape, w_shape, layout, message",
    [
        ((1, 3, 8, 8), (27, 4), "NCWH", "data_layout"),
        ((1, 8, 8, 3), (18, 4), "NHWC", "9 taps of 3 channels"),
        ((1, 8, 8), (27, 4), "NHWC", "[batch, height, width, channels]"),
    ],
)
def test_bad_arguments_name_what_is_wrong(x_shape: tuple[int, ...], w_shape: tuple[int, ...], layout: str, message: str) -> None:
    with pytest.raises(TileworkError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _call(x_shape, w_shape, layout)

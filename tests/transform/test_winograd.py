"""Winograd F(2, 3) convolutions (``tilework.op.winograd``, built by ``conv_gemm``): which convs
take it, and their numerics against the float64 reference and against the im2col path they
replace, at a symbolic batch of 1 and odd sizes, with weight params and with constants, with
and without bias, with a residual add and an activation fused into the output transform."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
import tilework.transform.conv_gemm as conv_gemm
from tests.op.test_conv import conv_ref
from tilework.errors import TileworkError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, Call, Constant, GraphFunc, OpRef, Var, bindings_of
from tilework.ir.info import TensorInfo
from tilework.op.winograd import AT, BT, G, transformed_kernel, winograd_input_nhwc
from tilework.transform.conv_gemm import WINOGRAD, ConvGemm, winograd_weight
from tilework.transform.layout_weights import LayoutWeights, pack_weights
from tilework.transform.panels import PANEL

torch = pytest.importorskip("torch")
nn = torch.nn
C = 32  # conv_gemm.WINOGRAD_MIN_CHANNELS


def _ops(mod: tw.IRModule) -> list[str]:
    f = mod["main"]
    assert isinstance(f, GraphFunc)
    return [b.value.callee.name for b in bindings_of(f) if isinstance(b, Binding) and isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)]


def test_transform_matrices_compute_a_3x3_correlation() -> None:
    rng = np.random.default_rng(0)
    d, g = rng.standard_normal((4, 4)), rng.standard_normal((3, 3))
    y = AT @ ((G @ g @ G.T) * (BT @ d @ BT.T)) @ AT.T
    want = np.array([[(d[i : i + 3, j : j + 3] * g).sum() for j in range(2)] for i in range(2)])
    np.testing.assert_allclose(y, want, atol=1e-12)


def test_transforms_sum_only_the_nonzero_coefficients() -> None:
    """The input transform reads 4 values of each 4 x 4 patch (BT has two nonzeros a row), the
    output transform 9 of the 16 products (AT three); the results are checked against NumPy
    by the tests below."""
    from tilework.ir.loop import Block, Load, Store, walk_scalars, walk_stmts
    from tilework.op.winograd import winograd_output_nhwc
    from tilework.schedule.tree import walk

    x = Var("x", TensorInfo((1, 6, 6, C), "float32"))
    m = Var("m", TensorInfo((4, 4, 1, 3, 3, C), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, m]):
        with bb.dataflow():
            v = bb.emit_output(winograd_input_nhwc(x, (1, 1, 1, 1)))
            y = bb.emit_output(winograd_output_nhwc(m, None, 6, 6))
        bb.emit_func_output((v, y))
    reads: dict[str, list[str]] = {}
    for name, f in tw.build(bb.get()).kernel_funcs.items():
        for _, blk in walk(f.body):
            if isinstance(blk, Block) and blk.name == name:
                for st in walk_stmts(blk.body):
                    if isinstance(st, Store):
                        reads[name] = [ld.buffer.name for ld in walk_scalars(st.value) if isinstance(ld, Load) and ld.buffer.name != "coef"]
    assert reads["winograd_input"] == ["xp"] * 4
    assert reads["winograd_output"] == ["m"] * 9


def test_weight_is_transformed_and_packed_per_tap_pair() -> None:
    w = np.random.default_rng(1).standard_normal((40, 33, 3, 3)).astype(np.float32)
    u, packed = transformed_kernel(w), winograd_weight(w)
    assert packed.shape == (16, -(-40 // PANEL), 33, PANEL) and packed.flags.c_contiguous
    for a, b in ((0, 0), (1, 2), (3, 3)):
        e = 4 * a + b
        np.testing.assert_array_equal(packed[e, 0, :, :16], u[a, b, :16].T)  # panel 0: columns 0..15
        np.testing.assert_array_equal(packed[e, 2, :, :8], u[a, b, 32:40].T)
        assert not packed[e, 2, :, 8:].any()  # zero past out_features


class Block(nn.Module):  # type: ignore[name-defined]
    """Two 3x3 convs (bias, then none) with a residual add and relus, a 3x3 conv without
    padding, and what stays im2col: a strided 3x3 conv and one with too few channels."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(C, 48, 3, 1, 1), nn.Conv2d(48, 48, 3, 1, 1, bias=False)
        self.valid = nn.Conv2d(48, 40, 3, 1, 0)
        self.strided, self.narrow = nn.Conv2d(40, 40, 3, 2, 1), nn.Conv2d(40, 8, 3, 1, 1)

    def forward(self, x: Any) -> Any:
        y = torch.relu(self.a(x))
        y = torch.relu(self.b(y) + y)
        return self.narrow(self.strided(self.valid(y)))


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any, Any]:
    """The block, compiled with Winograd and without (the im2col path it replaces)."""
    torch.manual_seed(0)
    model = Block().eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    example = (torch.randn(2, C, 13, 11),)
    wino = tw.compile(model, example, ({0: batch},))
    saved = conv_gemm.WINOGRAD_MIN_CHANNELS
    conv_gemm.WINOGRAD_MIN_CHANNELS = 10**9
    try:
        plain = tw.compile(model, example, ({0: batch},))
    finally:
        conv_gemm.WINOGRAD_MIN_CHANNELS = saved
    return model, wino, plain


def test_eligible_convs_become_winograd(models: tuple[Any, Any, Any]) -> None:
    _, wino, plain = models
    ops = _ops(wino.module)
    assert ops.count("winograd_input_nhwc") == ops.count("batch_linear_io") == ops.count("winograd_output_nhwc") == 3, ops
    assert ops.count("im2col") == 2  # the strided conv, the narrow one
    assert len(wino.module["main"].attrs[WINOGRAD]) == 3 and "winograd_input_nhwc" not in _ops(plain.module)
    assert wino.executable.meta["weight_layout"]["winograd"] == list(wino.module["main"].attrs[WINOGRAD])
    fused = [n for n in wino.executable.kernel_funcs if "winograd_output" in n and "add" in n and "relu" in n]
    assert fused, list(wino.executable.kernel_funcs)  # the residual add and relu ride on the output transform


@pytest.mark.parametrize("batch", [1, 3])
def test_matches_reference_and_im2col_path(models: tuple[Any, Any, Any], batch: int) -> None:
    model, wino, plain = models
    x = torch.randn(batch, C, 13, 11)
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
        model.float()
    got, base = np.asarray(wino(x)), np.asarray(plain(x))
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-5 * scale
    assert np.abs(got - base).max() <= 1e-5 * scale


K = np.random.default_rng(4).standard_normal((C, C, 3, 3)).astype(np.float32)
BIAS = np.random.default_rng(5).standard_normal(C).astype(np.float32)


def _module(weight: Any, h: int, w: int, padding: tuple[int, int, int, int]) -> tw.IRModule:
    n = tw.dim("n")
    bb = BlockBuilder()
    x = Var("x", TensorInfo((n, C, h, w), "float32"))
    params = [x] + ([weight] if isinstance(weight, Var) else [])
    with bb.function("main", params, attrs={"num_inputs": 1}):
        with bb.dataflow():
            out = bb.emit_output(tw.op.conv2d(x, weight, Constant.of(BIAS), padding=padding))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("h, w, padding", [(7, 5, (1, 1, 1, 1)), (6, 9, (0, 2, 1, 0)), (3, 3, (0, 0, 0, 0))])
def test_constant_and_param_weights_at_odd_sizes(h: int, w: int, padding: tuple[int, int, int, int]) -> None:
    rng = np.random.default_rng(6)
    const = LayoutWeights()(_module(Constant.of(K), h, w, padding))
    kv = Var("k", TensorInfo(K.shape, "float32"))
    mod = _module(kv, h, w, padding)
    params = LayoutWeights(params=True)(mod)
    assert params["main"].attrs[WINOGRAD] == (1,) and "winograd_input_nhwc" in _ops(const)
    run_const, run_params = tw.VM(tw.build(const))["main"], tw.VM(tw.build(params))["main"]
    packed = pack_weights(params, [K])
    for n in (1, 3):
        x = rng.standard_normal((n, C, h, w)).astype(np.float32)
        want = conv_ref(x, K, BIAS, (1, 1), padding, (1, 1), 1)
        for got in (run_const(x), run_params(x, *packed)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_exported_c_equals_the_vm_bit_for_bit(models: tuple[Any, Any, Any], tmp_path: Any) -> None:
    """The transforms' constant tables and packed weights travel into the C export."""
    from tilework.export import build_export
    from tilework.export.runner import ExportedModel

    model, wino, _ = models
    wino.export_c(str(tmp_path / "c"))
    exported = ExportedModel(build_export(tmp_path / "c", "cmake"), tmp_path / "c" / "model.twb")
    try:
        for batch in (1, 3):
            x = torch.randn(batch, C, 13, 11)
            (got,) = exported.run("main", x.numpy())
            np.testing.assert_array_equal(got, np.asarray(wino(x)))
    finally:
        exported.close()


def test_symbolic_spatial_dims_stay_im2col() -> None:
    n, h = tw.dim("n"), tw.dim("h")
    bb = BlockBuilder()
    x = Var("x", TensorInfo((n, C, h, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(tw.op.conv2d(x, Constant.of(K), padding=1))
        bb.emit_func_output(out)
    ops = _ops(ConvGemm()(bb.get()))
    assert "im2col" in ops and "winograd_input_nhwc" not in ops


def test_input_transform_needs_static_spatial_dims() -> None:
    n, h = tw.dim("n"), tw.dim("h")
    bb = BlockBuilder()
    x = Var("x", TensorInfo((n, h, 8, C), "float32"))
    with pytest.raises(TileworkError, match="static spatial dims"):
        with bb.function("main", [x]):
            bb.emit(winograd_input_nhwc(x, (1, 1, 1, 1)))


def test_linear_on_a_symbolic_multiple_of_the_row_tile() -> None:
    """Rows ``16 * batch`` with many columns: the matmul's rows past the full tiles were a tile
    of 2 computed and stored past the end (found through the Winograd products)."""
    n = tw.dim("n")
    bb = BlockBuilder()
    x = Var("x", TensorInfo((n, 16, 40), "float32"))
    wv = np.random.default_rng(7).standard_normal((512, 40)).astype(np.float32)
    with bb.function("main", [x]):
        with bb.dataflow():
            rows = bb.emit(tw.op.reshape(x, (tw.ir.sym.mul(n, 16), 40)))
            out = bb.emit_output(tw.op.linear(rows, Constant.of(wv)))
        bb.emit_func_output(out)
    run = tw.VM(tw.build(LayoutWeights()(bb.get())))["main"]
    for b in (1, 2):
        xv = np.random.default_rng(b).standard_normal((b, 16, 40)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(run(xv)), xv.reshape(-1, 40) @ wv.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("h, w, padding, bias", [(7, 5, (1, 1, 1, 1), True), (6, 9, (0, 2, 1, 0), False), (3, 3, (0, 0, 0, 0), True)])
def test_one_image_at_a_time_at_odd_sizes(monkeypatch: Any, h: int, w: int, padding: tuple[int, int, int, int], bias: bool) -> None:
    """Convs over large images run as ``winograd_conv_nhwc`` (its three steps one image at a
    time, scheduled by the ``winograd_images`` rule); forced here at small sizes, with
    constant and param weights, at a symbolic batch of 1 and 3."""
    monkeypatch.setattr(conv_gemm, "_per_image", lambda *_: True)
    n = tw.dim("n")
    rng = np.random.default_rng(8)
    k = rng.standard_normal((40, C, 3, 3)).astype(np.float32)  # 40 outputs: a partial panel
    b = rng.standard_normal(40).astype(np.float32) if bias else None

    def module(weight: Any) -> tw.IRModule:
        bb = BlockBuilder()
        x = Var("x", TensorInfo((n, h, w, C), "float32"))
        params = [x] + ([weight] if isinstance(weight, Var) else [])
        with bb.function("main", params, attrs={"num_inputs": 1}):
            with bb.dataflow():
                xt = bb.emit(tw.op.permute_dims(x, (0, 3, 1, 2)))  # channel-last data, as between convs
                y = bb.emit(tw.op.conv2d(xt, weight, None if b is None else Constant.of(b), padding=padding))
                out = bb.emit_output(tw.op.permute_dims(y, (0, 2, 3, 1)))
            bb.emit_func_output(out)
        return bb.get()

    const = LayoutWeights()(module(Constant.of(k)))
    params = LayoutWeights(params=True)(module(Var("k", TensorInfo(k.shape, "float32"))))
    for mod in (const, params):
        assert "winograd_conv_nhwc" in _ops(mod) and "winograd_input_nhwc" not in _ops(mod), _ops(mod)
    ex = tw.build(const)
    assert any(f.attrs.get("schedule_rule") == "winograd_images" for f in ex.kernel_funcs.values())
    run_const, run_params = tw.VM(ex)["main"], tw.VM(tw.build(params))["main"]
    packed = pack_weights(params, [k])
    for batch in (1, 3):
        x = rng.standard_normal((batch, h, w, C)).astype(np.float32)
        want = conv_ref(x.transpose(0, 3, 1, 2), k, b, (1, 1), padding, (1, 1), 1).transpose(0, 2, 3, 1)
        for got in (run_const(x), run_params(x, *packed)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_large_images_run_one_image_at_a_time() -> None:
    """``_per_image``: DenseNet-121's 56 x 56 3x3 conv (128 -> 32, 6.4 MB of transformed input
    an image) becomes ``winograd_conv_nhwc``; at 7 x 7 it stays the three ops (the weight is
    larger than an image's transformed input)."""
    for hw, want in ((56, "winograd_conv_nhwc"), (7, "winograd_input_nhwc")):
        bb = BlockBuilder()
        x = Var("x", TensorInfo((tw.dim("n"), 128, hw, hw), "float32"))
        wv = np.zeros((32, 128, 3, 3), np.float32)
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(tw.op.conv2d(x, Constant.of(wv), padding=1))
            bb.emit_func_output(out)
        ops = _ops(ConvGemm()(bb.get()))
        assert want in ops and {"winograd_conv_nhwc", "winograd_input_nhwc"} - {want} - set(ops), ops

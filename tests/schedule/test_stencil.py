"""The stencil rule (``tilework.schedule.rules.stencil``): which kernels it takes (depthwise
convs, not pools), the loops it makes (rows in parallel, tested for the interior; the columns
peeled into border and interior loops, the interior's columns unrolled inside the channel
vector loop), and the numerics of the depthwise convs it schedules (and of the pools beside
them) against NumPy at symbolic batch 0, 1 and 3, odd spatial sizes, strides, dilation, and
channel counts that are and are not a multiple of the vector; the jammed columns made tap by
tap (the same bits as one expression per output; a direct conv's tree of sums as one chain).

The float32 module is built once for every batch and the tap-by-tap check; the float64 build
of the same convs (the same rule at half the lanes) runs only in the long tier."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.long import long_param
from tests.op.test_conv import conv_ref
from tests.op.test_im2col import max_pool_ref
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Tuple, Var
from tilework.ir.info import TensorInfo
from tilework.ir.loop import Allocate, Binary, Block, For, IfThenElse, Store, TensorFunc
from tilework.op.conv_nhwc import depthwise_conv2d_nhwc, direct_conv2d_nhwc, max_pool2d_nhwc
from tilework.schedule import default_schedule
from tilework.schedule.rules import stencil
from tilework.schedule.rules.common import host_registers
from tilework.schedule.tree import walk
from tilework.transform.conv_gemm import depthwise_weight_matrix
from tilework.transform.legalize import Legalize

n = tw.dim("n", min=0)

# (height, width, channels, kernel, strides, padding (top, left, bottom, right), dilation)
DEPTHWISE = [
    (7, 7, 32, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    (14, 9, 48, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (13, 11, 24, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),  # channels not a multiple of the vector
    (9, 10, 16, (3, 3), (1, 1), (1, 1, 1, 1), (2, 2)),  # dilated
    (5, 3, 16, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),  # no column sees every tap
    (1, 1, 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    (8, 14, 16, (2, 3), (1, 2), (2, 0, 1, 1), (2, 1)),  # asymmetric
    (21, 12, 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # few border rows (2 of 21): their copy one output at a time
]
POOLS = [(11, 13, 32, (3, 3), (2, 2), (1, 1, 1, 1)), (6, 9, 16, (3, 3), (1, 1), (1, 1, 1, 1))]


def _module(relu: bool = True, dtype: str = "float32") -> Any:
    bb = BlockBuilder()
    xs = [Var(f"x{i}", TensorInfo((n, hh, ww, c), dtype)) for i, (hh, ww, c, *_) in enumerate(DEPTHWISE)]
    ks = [Var(f"k{i}", TensorInfo((kernel[0] * kernel[1], c), dtype)) for i, (_, _, c, kernel, *_) in enumerate(DEPTHWISE)]
    bs = [Var(f"b{i}", TensorInfo((c,), dtype)) for i, (_, _, c, *_) in enumerate(DEPTHWISE)]
    ps = [Var(f"p{i}", TensorInfo((n, hh, ww, c), dtype)) for i, (hh, ww, c, *_) in enumerate(POOLS)]
    with bb.function("main", [*xs, *ks, *bs, *ps]):
        with bb.dataflow():
            outs = []
            for x, k, b, (_, _, _, kernel, strides, padding, dilation) in zip(xs, ks, bs, DEPTHWISE):
                y = bb.emit(depthwise_conv2d_nhwc(x, k, b, kernel, strides, padding, dilation))
                outs.append(bb.emit(op.relu(y)) if relu else y)  # the epilogue fuses into the window
            for p, (_, _, _, size, strides, padding) in zip(ps, POOLS):
                outs.append(bb.emit(max_pool2d_nhwc(p, size, strides, padding)))
            out = bb.emit_output(Tuple(tuple(outs)))
        bb.emit_func_output(out)
    return bb.get()


@functools.cache
def _vm(dtype: str) -> Any:
    """``_module(dtype=dtype)`` built once: its ``main``."""
    return tw.VM(tw.build(_module(dtype=dtype)))["main"]


def _scheduled() -> list[tuple[str, TensorFunc]]:
    return [(name, default_schedule(f, strict=True)) for name, f in Legalize()(_module(relu=False)).tensor_funcs() if "depthwise" in name or "pool" in name]


def _jammed(f: TensorFunc) -> bool:
    """Accumulators (an allocation) filled by unrolled loops over columns around vectorized
    ones over channels: interior columns jammed, made tap by tap."""
    return any(
        isinstance(s, Allocate) and any(isinstance(t, For) and t.kind == "unrolled" and isinstance(t.body, For) and t.body.kind == "vectorized" for _, t in walk(s.body))
        for _, s in walk(f.body)
    )


def test_windows_take_the_stencil_rule() -> None:
    funcs = _scheduled()
    assert len(funcs) == len(DEPTHWISE) + len(POOLS)
    rules = [f.attrs["schedule_rule"] for _, f in funcs]
    one_pixel = DEPTHWISE.index((1, 1, 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)))  # every tap reads column 0: no window
    pools = range(len(DEPTHWISE), len(funcs))  # no weights: bound by memory, the elementwise schedule
    assert rules == ["elementwise" if i == one_pixel or i in pools else "stencil" for i in range(len(funcs))]
    for (name, f), rule in zip(funcs, rules):
        if rule == "stencil":  # every case has border rows and interior ones: the interior rows in a branch
            assert any(isinstance(s, IfThenElse) and s.else_body is not None for _, s in walk(f.body)), name
    for (name, f), rule in zip(funcs, rules):
        if rule == "stencil":
            assert any(isinstance(s, For) and s.kind == "parallel" for _, s in walk(f.body)), name
    for i, (name, f) in enumerate(funcs[: len(DEPTHWISE)]):  # the border rows' copy jammed only where they are not few
        branch = next((s for _, s in walk(f.body) if isinstance(s, IfThenElse) and s.else_body is not None), None)
        if branch is not None and _jammed(f):
            assert any(isinstance(s, Allocate) for _, s in walk(branch.else_body)) == (i != len(DEPTHWISE) - 1), name  # type: ignore[arg-type]
    jammed = [i for i, (_, f) in enumerate(funcs) if _jammed(f)]
    # every depthwise conv with at least two columns that see all their taps: all but the 5 x 3 and 1 x 1 inputs
    assert jammed == [i for i in range(len(DEPTHWISE)) if i not in (one_pixel, one_pixel - 1)]


def test_channel_blocks(registers: str) -> None:
    """The jammed columns' accumulators hold a block of channels: all of them where they are
    at most two vectors of the register file or the vector does not divide them (16 channels
    on AVX2: one pass over the columns), else one vector; each column's row of them is whole
    vectors (24 channels in 16 lanes: 32)."""
    lanes = host_registers().lanes("float32")
    for i, (name, f) in enumerate(_scheduled()[: len(DEPTHWISE)]):
        channels = DEPTHWISE[i][2]
        widths = {s.buffer.shape[-1] for _, s in walk(f.body) if isinstance(s, Allocate) and len(s.buffer.shape) == 2}
        if not _jammed(f):
            continue
        block = channels if channels <= 2 * lanes or channels % lanes else lanes
        want = -(-block // lanes) * lanes
        assert widths == {want}, (name, channels, widths)


@pytest.mark.parametrize(("batch", "dtype"), [(0, "float32"), (1, "float32"), (3, "float32"), long_param(3, "float64", why="the float32 convs at half the lanes")])
def test_numerics(batch: int, dtype: str) -> None:
    rng = np.random.default_rng(batch)
    xs, ks, bs, ps = [], [], [], []
    for hh, ww, c, kernel, *_ in DEPTHWISE:
        x = rng.standard_normal((batch, hh, ww, c)).astype(dtype)
        if batch:  # an inf or NaN at the border reaches only the outputs whose windows hold it
            x[0, 0, 0, 0], x[-1, -1, -1, -1] = np.inf, np.nan
        xs.append(x)
        ks.append(rng.standard_normal((c, 1, *kernel)).astype(dtype))
        bs.append(rng.standard_normal(c).astype(dtype))
    for hh, ww, c, *_ in POOLS:
        ps.append(rng.standard_normal((batch, hh, ww, c)).astype(dtype))
    got = _vm(dtype)(*xs, *(depthwise_weight_matrix(k) for k in ks), *bs, *ps)
    for i, (x, k, b, (_, _, c, _, strides, padding, dilation)) in enumerate(zip(xs, ks, bs, DEPTHWISE)):
        want = np.maximum(conv_ref(x.transpose(0, 3, 1, 2), k, b, strides, padding, dilation, c).transpose(0, 2, 3, 1), 0)
        assert np.asarray(got[i]).shape == want.shape
        np.testing.assert_allclose(np.asarray(got[i]), want, rtol=1e-5, atol=1e-5, err_msg=f"depthwise case {i} at batch {batch}, {dtype}")
    for i, (p, (_, _, _, size, strides, padding)) in enumerate(zip(ps, POOLS)):
        np.testing.assert_array_equal(np.asarray(got[len(DEPTHWISE) + i]), max_pool_ref(p, size, strides, padding), err_msg=f"pool {i} at batch {batch}")


def test_declines_short_channels_and_symbolic_columns() -> None:
    """Fewer channels than a vector of the host, or a symbolic width: the elementwise schedule."""
    w = tw.dim("w")
    half = host_registers().lanes("float32") // 2
    bb = BlockBuilder()
    x8 = Var("x8", TensorInfo((n, 9, 9, half), "float32"))
    xw = Var("xw", TensorInfo((n, 9, w, 32), "float32"))
    k8, kw = Var("k8", TensorInfo((9, half), "float32")), Var("kw", TensorInfo((9, 32), "float32"))
    with bb.function("main", [x8, xw, k8, kw]):
        with bb.dataflow():
            a = bb.emit(depthwise_conv2d_nhwc(x8, k8, None, (3, 3), (1, 1), (1, 1, 1, 1)))
            c = bb.emit(depthwise_conv2d_nhwc(xw, kw, None, (3, 3), (1, 1), (1, 1, 1, 1)))
            out = bb.emit_output(Tuple((a, c)))
        bb.emit_func_output(out)
    rules = [default_schedule(f, strict=True).attrs["schedule_rule"] for name, f in Legalize()(bb.get()).tensor_funcs() if "depthwise" in name]
    assert rules == ["elementwise", "elementwise"]


def test_tap_by_tap_keeps_each_outputs_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The jammed columns made tap by tap add each output's taps in the order of the one
    expression per output of the elementwise schedule: the same bits, border columns and rows
    included (with the stencil rule off, the elementwise rule takes every window)."""
    rng = np.random.default_rng(7)
    args = [rng.standard_normal((3, hh, ww, c)).astype(np.float32) for hh, ww, c, *_ in DEPTHWISE]
    args += [rng.standard_normal((kernel[0] * kernel[1], c)).astype(np.float32) for _, _, c, kernel, *_ in DEPTHWISE]
    args += [rng.standard_normal(c).astype(np.float32) for _, _, c, *_ in DEPTHWISE]
    args += [rng.standard_normal((3, hh, ww, c)).astype(np.float32) for hh, ww, c, *_ in POOLS]
    tap_by_tap = _vm("float32")(*args)  # _module(): the build test_numerics runs
    monkeypatch.setattr(stencil, "apply", lambda func: None)
    per_output = tw.VM(tw.build(_module()))["main"](*args)
    for i in range(len(DEPTHWISE)):
        np.testing.assert_array_equal(np.asarray(tap_by_tap[i]), np.asarray(per_output[i]), err_msg=f"depthwise case {i}")


def test_a_sum_of_chains_is_made_as_one_chain() -> None:
    """A direct conv's sum (a chain per kernel row, added at the end, then the bias) is
    accumulated term by term: one accumulator step per product, in the order of the tree."""
    bb = BlockBuilder()
    x = Var("x", TensorInfo((n, 3, 12, 20), "float32"))
    k, b = Var("k", TensorInfo((27, 16), "float32")), Var("b", TensorInfo((16,), "float32"))
    with bb.function("main", [x, k, b]):
        with bb.dataflow():
            out = bb.emit_output(direct_conv2d_nhwc(x, k, b, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), "NCHW"))
        bb.emit_func_output(out)
    (_, func), = [(name, f) for name, f in Legalize()(bb.get()).tensor_funcs() if name.startswith("direct_conv")]
    scheduled = default_schedule(func, strict=True)
    assert scheduled.attrs["schedule_rule"] == "stencil"
    alloc = next(s for _, s in walk(scheduled.body) if isinstance(s, Allocate))
    steps = [s for _, s in walk(alloc.body) if isinstance(s, Block)]
    accumulate = [s for s in steps if isinstance(s.body, Store) and s.body.buffer is alloc.buffer]
    assert len(accumulate) == 27 + 1  # the bias, then each of the 27 products
    assert all(isinstance(s.body.value, Binary) and s.body.value.op == "+" for s in accumulate[1:])  # type: ignore[attr-defined]


def test_many_taps_jam_fewer_columns() -> None:
    """A 7 x 7 stem of 3 channels has 147 taps: its interior columns are jammed at most
    ``JAM_TERMS // 147`` at a time (4, not ``JAM``), a 3 x 3 one's (27 taps) up to ``JAM``.
    One vector of output channels (the rule takes no fewer)."""
    chans = host_registers().lanes("float32")

    def widest_jam(kernel: int, width: int) -> int:
        bb = BlockBuilder()
        x = Var("x", TensorInfo((n, 3, 21, width), "float32"))
        k, b = Var("k", TensorInfo((kernel * kernel * 3, chans), "float32")), Var("b", TensorInfo((chans,), "float32"))
        pad = kernel // 2
        with bb.function("main", [x, k, b]):
            with bb.dataflow():
                out = bb.emit_output(direct_conv2d_nhwc(x, k, b, (kernel, kernel), (1, 1), (pad,) * 4, (1, 1), "NCHW"))
            bb.emit_func_output(out)
        (func,) = [f for name, f in Legalize()(bb.get()).tensor_funcs() if name.startswith("direct_conv")]
        scheduled = default_schedule(func, strict=True)
        assert scheduled.attrs["schedule_rule"] == "stencil"
        unrolled = [s.extent for _, s in walk(scheduled.body) if isinstance(s, For) and s.kind == "unrolled" and isinstance(s.body, For) and s.body.kind == "vectorized"]
        assert unrolled and all(isinstance(e, int) for e in unrolled)
        return max(unrolled)  # type: ignore[type-var,return-value]

    assert widest_jam(7, 46) == stencil.JAM_TERMS // 147 == 4  # an interior of 40 columns
    assert widest_jam(3, 42) == min(stencil.JAM, stencil.JAM_TERMS // 27)

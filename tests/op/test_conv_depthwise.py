"""The cheap path of short-reduction (depthwise) convolutions, small max pools and im2col: a
padded one reads a zero- (-inf-) padded copy of its input (``conv.PAD_UNROLLED``), so that its
unrolled taps (or im2col's copies) load without bounds tests; and a per-channel load (a bias ``b[c]``) does not make the elementwise schedule
tile the kernel as a transpose. Numerics against the float64 reference of tests/op/test_conv.py
at symbolic batch 0, 1 and odd sizes and odd spatial sizes; the unpadded direct path (the
copy switched off) must agree too."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.test_conv import conv_ref, pool_ref
from tilework import te
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Tuple, Var
from tilework.ir.info import TensorInfo
from tilework.ir.loop import For, TensorFunc
from tilework.ir.sym import SymVar
from tilework.op import conv
from tilework.schedule import default_schedule
from tilework.schedule.tree import walk
from tilework.transform.legalize import Legalize

n, h, w = tw.dim("n", min=0), tw.dim("h"), tw.dim("w")

# (weight shape, bias, conv2d attrs) on an input [n, 6, h, w]
CASES: list[tuple[tuple[int, ...], bool, dict[str, Any]]] = [
    ((6, 1, 3, 3), True, {"groups": 6, "strides": 2, "padding": 1}),
    ((12, 1, 5, 5), False, {"groups": 6, "padding": (2, 1, 3, 0), "dilation": (1, 2)}),
    ((6, 1, 3, 3), False, {"groups": 6, "strides": (1, 2), "padding": (0, 1, 1, 0)}),
    ((6, 2, 3, 1), True, {"groups": 3, "padding": (1, 0, 1, 0)}),  # 6 taps per output: unrolled, not a depthwise
    ((6, 1, 3, 3), True, {"groups": 6}),  # no padding: no copy
    ((8, 6, 3, 3), True, {"strides": 2, "padding": (1, 0, 2, 1)}),  # im2col + matmul: im2col reads the padded copy
]

# max pools (size, strides, padding, dilation) with padding: a -inf-padded copy
POOLS = [((3, 3), (2, 2), (1, 1, 1, 1), (1, 1)), ((3, 2), (1, 2), (1, 0, 1, 1), (2, 1))]


def _module() -> Any:
    bb = BlockBuilder()
    x = Var("x", TensorInfo((n, 6, h, w), "float32"))
    ws = [Var(f"w{i}", TensorInfo(k, "float32")) for i, (k, _, _) in enumerate(CASES)]
    bs = [Var(f"b{i}", TensorInfo((k[0],), "float32")) for i, (k, _, _) in enumerate(CASES)]
    with bb.function("main", [x, *ws, *bs]):
        with bb.dataflow():
            outs = []
            for i, (_, bias, attrs) in enumerate(CASES):
                y = bb.emit(op.conv2d(x, ws[i], bs[i] if bias else None, **attrs))
                outs.append(bb.emit(op.relu(y)))
            for size, strides, padding, dilation in POOLS:
                outs.append(bb.emit(op.max_pool2d(bb.emit(op.relu(x)), size, strides, padding, dilation)))
            out = bb.emit_output(Tuple(tuple(outs)))
        bb.emit_func_output(out)
    return bb.get()


def _geometry(attrs: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    st, dl, pd = attrs.get("strides", 1), attrs.get("dilation", 1), attrs.get("padding", 0)
    st = (st, st) if isinstance(st, int) else st
    dl = (dl, dl) if isinstance(dl, int) else dl
    pd = (pd,) * 4 if isinstance(pd, int) else tuple(pd)
    return st, pd, dl, attrs.get("groups", 1)


@pytest.fixture(scope="module")
def built() -> tuple[Any, Any]:
    fast = tw.build(_module())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv, "PAD_UNROLLED", False)
        direct = tw.build(_module())
    return fast, direct


def test_padded_convs_read_a_padded_copy() -> None:
    names = [name for name, _ in Legalize()(_module()).tensor_funcs()]
    assert sum(name.startswith("conv_pad") for name in names) == 5  # one per padded conv
    assert sum(name.startswith("max_pool_pad") for name in names) == 2


@pytest.mark.parametrize("size", [(0, 7, 9), (1, 5, 9), (3, 11, 13)])
def test_numerics(built: tuple[Any, Any], size: tuple[int, int, int]) -> None:
    rng = np.random.default_rng(sum(size))
    x = rng.standard_normal((size[0], 6, size[1], size[2])).astype(np.float32)
    ws = [rng.standard_normal(k).astype(np.float32) for k, _, _ in CASES]
    bs = [rng.standard_normal(k[0]).astype(np.float32) for k, _, _ in CASES]
    fast, direct = (tw.VM(e)["main"](x, *ws, *bs) for e in built)
    for i, (_, bias, attrs) in enumerate(CASES):
        want = np.maximum(conv_ref(x, ws[i], bs[i] if bias else None, *_geometry(attrs)), 0)
        for got in (fast[i], direct[i]):
            assert np.asarray(got).shape == want.shape
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    for i, (size_, strides, padding, dilation) in enumerate(POOLS):
        want = pool_ref(np.maximum(x, 0), "max", size_, strides, padding, dilation)
        for out in (fast, direct):
            np.testing.assert_array_equal(np.asarray(out[len(CASES) + i]), want.astype(np.float32))


def _kinds(f: TensorFunc) -> list[str]:
    return [s.kind for _, s in walk(f.body) if isinstance(s, For)]


def test_a_per_channel_load_is_not_a_transpose() -> None:
    """``x[n, c, i, j] + b[c]``: ``b`` walks memory along ``c`` but stays put along the
    innermost loop; one parallel loop and a vectorized row, no 16 x 16 tiles. A true transpose
    still tiles."""
    d = [SymVar(s, 1) for s in "ncij"]
    x, b = te.placeholder(tuple(d), "float32", "x"), te.placeholder((d[1],), "float32", "b")
    y = te.compute(tuple(d), lambda i0, i1, i2, i3: x[i0, i1, i2, i3] + b[i1], "y")
    assert _kinds(default_schedule(te.create_func([x, b, y]), strict=True)) == ["parallel", "vectorized"]
    a = te.placeholder((d[0], d[1]), "float32", "a")
    t = te.compute((d[1], d[0]), lambda i, j: a[j, i], "t")
    assert _kinds(default_schedule(te.create_func([a, t]), strict=True)) == ["parallel", "serial", "vectorized"]

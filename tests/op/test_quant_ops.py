"""``quant_linear`` and ``quant_take`` legalized (the reference kernels that decode each weight
where it is used) against NumPy on the dequantized blocks, at symbolic row counts including 1
and odd sizes, on the C target and the interpreter; and their shape checks. Every format runs on
both targets but the interleaved block formats, which run on C and, through the interpreter,
only ``quant_linear``'s ``q8_0x16``: the others' interpreter runs are in the long tier only
(``bf16x16``, quick to interpret, runs on both); q5_0 and q5_1, whose weights decode alike, run
each layout once on C by default (``Q5_LONG``)."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tests.long import long_param
from tilework import op
from tilework.errors import TileworkError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.llm.quant import quantize
from tilework.op.quant import GROUP, INTERLEAVED_FORMATS, K_QUANTS, LEGALIZED_FORMATS, interleave_rows, quant_format
from tests.backend.helpers import k_quant_blocks

K, N = 64, 7
# (format, target) interpreted in the long tier only: quant_linear's q8_0x16 interprets an
# interleaved format; its lanes decode as on C
INTERP_LONG = {("q4_0x16", "interp"), ("q4_1x16", "interp"), ("q5_0x16", "interp"), ("q5_1x16", "interp"), ("q8_0x16", "interp")}
# q5 on C: quant_linear's q5_0 plain and q5_1 interleaved in the default run (each decoding path
# once; quant_take's q5_1 interpreted), the others in the long tier
Q5_LONG = {("q5_1", "cpu"), ("q5_0x16", "cpu")}


def _grid(formats: tuple[str, ...] | list[str], long: set[tuple[str, str]]) -> list[object]:
    """``(fmt, target)`` params, ``long`` ones in the long tier only."""
    return [
        long_param(fmt, target, id=f"{fmt}-{target}", why="an interleaved format interpreted: quant_linear's q8_0x16 interprets one" if target == "interp" else "q5_0 and q5_1x16 take the same decoding")
        if (fmt, target) in long else pytest.param(fmt, target, id=f"{fmt}-{target}")
        for fmt in formats for target in ("cpu", "interp")
    ]  # fmt: skip


def _blocks(fmt: str, rows: int, cols: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of ``fmt`` for random weights, and the weights they decode to (an interleaved
    format: its plain format's blocks, interleaved)."""
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    base = fmt[: -len(f"x{GROUP}")] if fmt in INTERLEAVED_FORMATS else fmt
    q = quantize(w, base)
    data = np.ascontiguousarray(q.data)
    return (interleave_rows(data, base) if base != fmt else data), q.dequantize().reshape(rows, cols)


def _linear_module(fmt: str, n: int = N) -> tw.IRModule:
    m = tw.dim("m", max=64)
    x = Var("x", TensorInfo((m, 1, K), "float32"))
    w = Var("w", TensorInfo((n, quant_format(fmt).row_bytes(K)), "uint8"))
    bb = BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(op.quant_linear(x, w, fmt, K))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(("fmt", "target"), _grid([f for f in LEGALIZED_FORMATS if not f.startswith("iq4")], (INTERP_LONG - {("q8_0x16", "interp")}) | Q5_LONG))  # iq4: test_iq4_linear_and_take
def test_quant_linear(target: str, fmt: str) -> None:
    n = 2 * GROUP if fmt in INTERLEAVED_FORMATS else N  # interleaved: whole groups of rows
    blocks, weights = _blocks(fmt, n, K)
    vm = tw.VM(tw.build(_linear_module(fmt, n), target=target))
    for m in (1, 3, 17) if target == "cpu" else (1, 3):
        x = np.random.default_rng(m).standard_normal((m, 1, K)).astype(np.float32)
        np.testing.assert_allclose(vm["main"](x, blocks), x @ weights.T, rtol=1e-5, atol=1e-5)


def _take_vm(fmt: str, rows: int, target: str, cols: int = K) -> tw.VM:
    n = tw.dim("n", max=max(64, rows))
    table = Var("table", TensorInfo((rows, quant_format(fmt).row_bytes(cols)), "uint8"))
    ids = Var("ids", TensorInfo((n,), "int32"))
    bb = BlockBuilder()
    with bb.function("main", [table, ids]):
        with bb.dataflow():
            out = bb.emit_output(op.quant_take(table, ids, fmt, cols))
        bb.emit_func_output(out)
    return tw.VM(tw.build(bb.get(), target=target))


@pytest.mark.parametrize(("fmt", "target"), _grid(["q8_0", "q4_1", "q5_1", "bf16", "q8_0x16", "q4_1x16", "q5_1x16", "bf16x16"], INTERP_LONG | {("q5_1", "cpu"), ("q5_1x16", "cpu")}))
def test_quant_take(target: str, fmt: str) -> None:
    """Rows of a table (an interleaved one: rows of any lane of two groups) decode exactly."""
    rows = 2 * GROUP if fmt in INTERLEAVED_FORMATS else 11
    blocks, weights = _blocks(fmt, rows, K, seed=1)
    vm = _take_vm(fmt, rows, target)
    for pick in ([0], [rows - 1, 3, 3, 0, -1, 17 % rows], list(range(rows))):
        got = vm["main"](blocks, np.array(pick, np.int32))
        np.testing.assert_array_equal(got, weights[pick])


@pytest.mark.parametrize("target", ["cpu", long_param("interp", why="five k-quant take kernels interpreted (10 s)")])
def test_quant_take_of_k_quant_tables(target: str) -> None:
    """Rows of tables in every k-quant (one module: one compile), random blocks (every field's
    bit patterns), decode as ``gguf.quants.dequantize`` decodes them, to one rounding of the
    products (where the compiler fuses one into an FMA)."""
    gq = pytest.importorskip("gguf.quants")
    rows, cols = 5, 512
    n = tw.dim("n", max=64)
    tables = [Var(f"t_{fmt}", TensorInfo((rows, quant_format(fmt).row_bytes(cols)), "uint8")) for fmt in K_QUANTS]
    ids = Var("ids", TensorInfo((n,), "int32"))
    bb = BlockBuilder()
    with bb.function("main", [*tables, ids]):
        with bb.dataflow():
            outs = [bb.emit_output(op.quant_take(t, ids, fmt, cols)) for t, fmt in zip(tables, K_QUANTS)]
        bb.emit_func_output(outs)
    vm = tw.VM(tw.build(bb.get(), target=target))
    data = [k_quant_blocks(np.random.default_rng(i), fmt, rows, cols) for i, fmt in enumerate(K_QUANTS)]
    for pick in ([0], [rows - 1, 3, 3, 0, -1], list(range(rows))):
        got = vm["main"](*data, np.array(pick, np.int32))
        for fmt, table, g in zip(K_QUANTS, data, got):
            want = gq.dequantize(table, gq.GGMLQuantizationType(quant_format(fmt).ggml_type)).reshape(rows, cols)[pick]
            np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()), err_msg=fmt)


@pytest.mark.parametrize("target", ["cpu", "interp"])
def test_half_and_bfloat16_decode_every_finite_value(target: str) -> None:
    """Every finite half as a q8_0 scale (times 1 and -1: subnormals, zeros of both signs, the
    largest) and every finite bfloat16 as a weight decode to the float32 NumPy gives them (the
    interpreter: the edges and every 61st)."""
    every = np.arange(65536, dtype=np.uint32)
    if target == "interp":
        edges = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x8400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x007F, 0x0080, 0x7F7F, 0xFF7F]
        every = np.unique(np.concatenate([every[::61], np.array(edges, np.uint32)]))
    halves = every.astype(np.uint16)
    halves = halves[np.isfinite(halves.view(np.float16))]
    rows = -(-len(halves) // 2)  # K / 32 = 2 blocks a row: one scale each
    blocks = np.zeros((rows, 2, 34), np.uint8)
    scales = np.resize(halves, rows * 2).reshape(rows, 2)
    blocks[:, :, 0:2] = scales.view(np.uint8).reshape(rows, 2, 2)
    blocks[:, :, 2:34] = np.tile(np.array([1, 255] * 16, np.uint8), (rows, 2, 1))  # q = 1, -1, ...
    got = _take_vm("q8_0", rows, target)["main"](blocks.reshape(rows, 68), np.arange(rows, dtype=np.int32))
    want = np.repeat(scales.view(np.float16).astype(np.float32), 32, axis=1) * np.tile(np.array([1.0, -1.0], np.float32), (rows, K // 2))
    np.testing.assert_array_equal(got, want)
    bf = every.astype(np.uint16)
    bf = bf[np.isfinite((bf.astype(np.uint32) << 16).view(np.float32))]
    rows = -(-len(bf) // K)
    table = np.resize(bf, rows * K).reshape(rows, K)
    got = _take_vm("bf16", rows, target)["main"](table.view(np.uint8), np.arange(rows, dtype=np.int32))
    np.testing.assert_array_equal(got, (table.astype(np.uint32) << 16).view(np.float32))


def test_shapes_and_formats_are_checked() -> None:
    x = Var("x", TensorInfo((2, K), "float32"))
    good = Var("w", TensorInfo((N, quant_format("q4_1").row_bytes(K)), "uint8"))
    bad = Var("w", TensorInfo((N, 5), "uint8"))
    for args, message in [
        ((x, good, "q4_7", K), "fmt must be one of"),
        ((x, good, "q4_1", 48), "positive multiple of 32"),
        ((x, bad, "q4_1", K), "row bytes of q4_1"),
    ]:
        bb = BlockBuilder()
        with pytest.raises(TileworkError, match=message):
            with bb.function("main", [x, args[1]]):
                bb.emit(op.quant_linear(*args))


def test_super_block_formats_need_the_quant_backend() -> None:
    x = Var("x", TensorInfo((2, 256), "float32"))
    w = Var("w", TensorInfo((3, quant_format("q4_k").row_bytes(256)), "uint8"))
    bb = BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(op.quant_linear(x, w, "q4_k", 256))
        bb.emit_func_output(out)
    with pytest.raises(TileworkError, match="run the op on the 'quant' backend"):
        tw.build(bb.get())



@pytest.mark.parametrize("target", ["cpu", long_param("interp", why="eight iq4 kernels interpreted")])
def test_iq4_linear_and_take(target: str) -> None:
    """``quant_linear`` and ``quant_take`` on ``iq4_nl`` and ``iq4_xs`` rows, plain and 16 rows
    interleaved (one module: one compile), random blocks (every nibble, every 6-bit scale):
    the rows decode to ``gguf.quants.dequantize``'s values exactly (the products of the values
    and scales are exact), the products are ``x @ W.T`` to float32 summation."""
    gq = pytest.importorskip("gguf.quants")
    rows, cols = 2 * GROUP, 512
    fmts = ("iq4_nl", "iq4_xs", "iq4_nlx16", "iq4_xsx16")
    m, n = tw.dim("m", max=64), tw.dim("n", max=64)
    tables = [Var(f"t_{fmt}", TensorInfo((rows, quant_format(fmt).row_bytes(cols)), "uint8")) for fmt in fmts]
    x, ids = Var("x", TensorInfo((m, cols), "float32")), Var("ids", TensorInfo((n,), "int32"))
    bb = BlockBuilder()
    with bb.function("main", [*tables, x, ids]):
        with bb.dataflow():
            outs = [bb.emit_output(op.quant_take(t, ids, fmt, cols)) for t, fmt in zip(tables, fmts)]
            outs += [bb.emit_output(op.quant_linear(x, t, fmt, cols)) for t, fmt in zip(tables, fmts)]
        bb.emit_func_output(outs)
    vm = tw.VM(tw.build(bb.get(), target=target))
    plain = [k_quant_blocks(np.random.default_rng(i), fmt, rows, cols) for i, fmt in enumerate(fmts[:2])]
    data = plain + [interleave_rows(b, fmt) for b, fmt in zip(plain, fmts[:2])]
    values = [gq.dequantize(b, gq.GGMLQuantizationType(quant_format(fmt).ggml_type)).reshape(rows, cols) for b, fmt in zip(plain, fmts[:2])] * 2
    for pick, mx in (([0], 1), ([rows - 1, 3, 17, 0, -1], 3), (list(range(rows)), 17) if target == "cpu" else ([5], 1)):
        xv = np.random.default_rng(mx).standard_normal((mx, cols)).astype(np.float32)
        got = vm["main"](*data, xv, np.array(pick, np.int32))
        for fmt, want, g in zip(fmts, values, got[:4]):
            np.testing.assert_array_equal(g, want[pick], err_msg=fmt)
        for fmt, want, g in zip(fmts, values, got[4:]):
            ref = xv.astype(np.float64) @ want.T.astype(np.float64)
            np.testing.assert_allclose(g, ref, rtol=0, atol=2e-6 * float((np.abs(xv) @ np.abs(want).T).max()), err_msg=fmt)

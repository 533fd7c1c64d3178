"""``quant_linear`` and ``quant_take`` legalized (the reference kernels that decode each weight
where it is used) against NumPy on the dequantized blocks, at symbolic row counts including 1
and odd sizes, on the C target and the interpreter; and their shape checks."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tilework import op
from tilework.errors import TileworkError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.llm.quant import quantize
from tilework.op.quant import GROUP, INTERLEAVED_FORMATS, LEGALIZED_FORMATS, interleave_rows, quant_format

K, N = 64, 7


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


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("fmt", LEGALIZED_FORMATS)
def test_quant_linear(target: str, fmt: str) -> None:
    n = 2 * GROUP if fmt in INTERLEAVED_FORMATS else N  # interleaved: whole groups of rows
    blocks, weights = _blocks(fmt, n, K)
    vm = tw.VM(tw.build(_linear_module(fmt, n), target=target))
    for m in (1, 3, 17) if target == "cpu" else (1, 3):
        x = np.random.default_rng(m).standard_normal((m, 1, K)).astype(np.float32)
        np.testing.assert_allclose(vm["main"](x, blocks), x @ weights.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["cpu", "interp"])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "bf16"])
def test_quant_take(target: str, fmt: str) -> None:
    rows = 11
    blocks, weights = _blocks(fmt, rows, K, seed=1)
    n = tw.dim("n", max=32)
    table = Var("table", TensorInfo((rows, quant_format(fmt).row_bytes(K)), "uint8"))
    ids = Var("ids", TensorInfo((n,), "int32"))
    bb = BlockBuilder()
    with bb.function("main", [table, ids]):
        with bb.dataflow():
            out = bb.emit_output(op.quant_take(table, ids, fmt, K))
        bb.emit_func_output(out)
    vm = tw.VM(tw.build(bb.get(), target=target))
    for pick in ([0], [10, 3, 3, 0, -1], list(range(rows))):
        got = vm["main"](blocks, np.array(pick, np.int32))
        np.testing.assert_array_equal(got, weights[pick])


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


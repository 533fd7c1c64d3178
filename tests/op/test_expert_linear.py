"""``expert_linear`` legalized (the reference kernel: each product decodes its expert's rows
where it reads them) against NumPy on the dequantized experts, at symbolic token counts
including 0, 1 and odd sizes, with one input for every slot and one per slot; and its shape
checks."""

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
from tilework.op.quant import GROUP, INTERLEAVED_FORMATS, interleave_rows, quant_format

K, E, SLOTS = 64, 5, 2


def experts(fmt: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``E`` experts' ``[n, K]`` weights stacked as ``fmt`` rows (``[E * n, row]``), and the
    float32 weights they decode to (``[E, n, K]``)."""
    w = np.random.default_rng(seed).standard_normal((E * n, K)).astype(np.float32)
    if fmt == "f32":
        return w, w.reshape(E, n, K)
    base = fmt.removesuffix(f"x{GROUP}")
    q = quantize(w, base)
    data = np.ascontiguousarray(q.data)
    return (interleave_rows(data, base) if base != fmt else data), q.dequantize().reshape(E, n, K)


def reference(x: np.ndarray, w: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``out[t, s] = x[t, s or 0] @ w[ids[t, s]].T`` (ids read as take reads them)."""
    e = np.clip(np.where(ids < 0, ids + E, ids), 0, E - 1)
    xs = np.broadcast_to(x, (x.shape[0], ids.shape[1], K))
    return np.einsum("tsk,tsnk->tsn", xs.astype(np.float64), w[e].astype(np.float64)).astype(np.float32)


def module(fmt: str, n: int, per_slot: bool, k: int = K, experts: int = E, slots: int = SLOTS) -> tw.IRModule:
    """``main(x, w, ids)``: one ``expert_linear`` of ``experts`` experts of ``n`` rows of ``k``
    (``fmt`` rows), ``slots`` slots a token, the token count symbolic (0 to 64)."""
    t = tw.dim("t", min=0, max=64)
    x = Var("x", TensorInfo((t, slots if per_slot else 1, k), "float32"))
    row = k if fmt == "f32" else quant_format(fmt).row_bytes(k)
    w = Var("w", TensorInfo((experts * n, row), "float32" if fmt == "f32" else "uint8"))
    ids = Var("ids", TensorInfo((t, slots), "int64"))
    bb = BlockBuilder()
    with bb.function("main", [x, w, ids]):
        with bb.dataflow():
            out = bb.emit_output(op.expert_linear(x, w, ids, fmt, k, experts))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(("fmt", "target"), [("f32", "cpu"), ("q8_0", "cpu"), ("q4_1", "cpu"), ("q4_0x16", "cpu"), ("bf16x16", "cpu"), ("q4_1", "interp")])
def test_expert_linear(fmt: str, target: str) -> None:
    n = GROUP if fmt in INTERLEAVED_FORMATS else 7
    blocks, weights = experts(fmt, n)
    rng = np.random.default_rng(1)
    for per_slot in (False, True):
        vm = tw.VM(tw.build(module(fmt, n, per_slot), target=target))
        for t in (0, 1, 3, 17) if target == "cpu" else (1, 3):
            x = rng.standard_normal((t, SLOTS if per_slot else 1, K)).astype(np.float32)
            ids = rng.integers(0, E, (t, SLOTS)).astype(np.int64)
            if t >= 3:
                ids[2] = (-1, E + 3)  # from the end; clamped
            got = vm["main"](x, blocks, ids)
            assert got.shape == (t, SLOTS, n)
            np.testing.assert_allclose(got, reference(x, weights, ids), rtol=1e-5, atol=1e-4)


def test_shapes_are_checked() -> None:
    x = Var("x", TensorInfo((3, 1, K), "float32"))
    x3 = Var("x", TensorInfo((3, 3, K), "float32"))
    ids = Var("ids", TensorInfo((3, SLOTS), "int64"))
    fids = Var("ids", TensorInfo((3, SLOTS), "float32"))
    rb = quant_format("q8_0").row_bytes(K)
    good = Var("w", TensorInfo((E * 7, rb), "uint8"))
    uneven = Var("w", TensorInfo((E * 7 + 1, rb), "uint8"))
    split = Var("w", TensorInfo((E * 8, rb), "uint8"))
    for args, message in [
        ((x, good, ids, "q8_0", K, E), None),
        ((x, uneven, ids, "q8_0", K, E), "not 5 experts of equal size"),
        ((x3, good, ids, "q8_0", K, E), "must be 1 .* or the slots"),
        ((x, good, fids, "q8_0", K, E), "ids must be int32 or int64"),
        ((x, good, ids, "q8_0", K, 0), "experts must be a positive int"),
        ((x, good, ids, "q8_0", 48, E), "positive multiple of 32"),
        ((x, split, ids, "q8_0x16", K, E), "groups of 16: 8 rows"),
    ]:
        bb = BlockBuilder()
        if message is None:
            with bb.function("main", [args[0], args[1], args[2]]):
                out = bb.emit(op.expert_linear(*args))
                assert out.info.shape == (3, SLOTS, 7)
                bb.emit_func_output(out)
            continue
        with pytest.raises(TileworkError, match=message):
            with bb.function("main", [args[0], args[1], args[2]]):
                bb.emit(op.expert_linear(*args))

"""A ``linear_io`` kernel's rows are its own sym var (``tilework.op.kernel.own_rows``): an LLM's
decode step (``batch`` rows) and its prefill (``batch * seq`` rows, flattened) call one kernel,
which computes what NumPy does at every row count, 0 and 1 included."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Var
from tilework.ir.info import TensorInfo
from tilework.ir.structural import assert_structural_equal
from tilework.ir.sym import SymVar, mul
from tilework.op.kernel import own_rows
from tilework.op.linalg import linear_io
from tilework.transform.layout_weights import lay_out, packed_shape
from tilework.transform.legalize import Legalize

K, N = 24, 40


def _decoder_like() -> tw.IRModule:
    """``step(x[batch, K])`` and ``prompt(x[batch, seq, K])`` through the same weight shape,
    the prompt's rows flattened as ``tilework.llm.model.PackedLinear`` flattens them (a
    batch may be 0 here)."""
    bb = BlockBuilder()
    batch, pbatch, seq = SymVar("batch", 0, 8), SymVar("batch", 0, 8), SymVar("seq", 1, 64)
    for name, shape in (("step", (batch, K)), ("prompt", (pbatch, seq, K))):
        x = Var("x", TensorInfo(shape, "float32"))
        w = Var("w", TensorInfo(packed_shape(N, K), "float32"))
        with bb.function(name, [x, w]):
            with bb.dataflow():
                rows = x if len(shape) == 2 else bb.emit(tw.op.reshape(x, (mul(pbatch, seq), K)))
                y = bb.emit(linear_io(rows, w, None, N))
                out = bb.emit_output(y if len(shape) == 2 else tw.op.reshape(y, (pbatch, seq, N)))
            bb.emit_func_output(out)
    return bb.get()


def test_a_decode_step_and_a_prefill_share_one_kernel() -> None:
    lowered = Legalize()(_decoder_like())
    first, *others = [func for name, func in lowered.tensor_funcs() if name.startswith("linear")]
    for other in others:  # equal kernels would be one: this names where they differ
        assert_structural_equal(first, other, map_free_vars=True)
    assert not others


def test_only_a_product_of_vars_becomes_the_kernels_own() -> None:
    batch, seq = SymVar("batch", 1, 8), SymVar("seq", 1, 64)
    for dim in (batch, mul(batch, seq)):
        rows = own_rows(dim)
        assert isinstance(rows, SymVar) and (rows.lo, rows.hi) == (1, None)
    for dim in (7, mul(batch, 3136), mul(mul(batch, seq), 2), mul(batch, batch)):
        assert own_rows(dim) is dim  # each says more than a var would (3136 * batch: a multiple of 8)


@pytest.mark.parametrize("batch, seq", [(0, 3), (1, 1), (3, 5), (2, 7), (8, 1)])
def test_the_shared_kernel_computes_each_callers_rows(batch: int, seq: int) -> None:
    rng = np.random.default_rng(batch * 16 + seq)
    w = rng.standard_normal((N, K)).astype(np.float32)
    vm = tw.VM(tw.build(_decoder_like()))
    x = rng.standard_normal((batch, seq, K)).astype(np.float32)
    np.testing.assert_allclose(vm["prompt"](x, lay_out(w)), x @ w.T, rtol=1e-5, atol=1e-5)
    step = x[:, 0]
    np.testing.assert_allclose(vm["step"](step, lay_out(w)), step @ w.T, rtol=1e-5, atol=1e-5)

"""Small modules for the placement tests."""

from __future__ import annotations

import numpy as np

from tilework import op
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Constant, Var
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.ir.sym import SymVar


def mlp(n: SymVar | None = None, hidden: int = 16, ffn: int = 32) -> IRModule:
    """``main(x[n, hidden], w1, b1, w2) = linear(relu(linear(x, w1, b1)), w2)``."""
    n = n or SymVar("n", 1, 256)
    x = Var("x", TensorInfo((n, hidden), "float32"))
    w1 = Var("w1", TensorInfo((ffn, hidden), "float32"))
    b1 = Var("b1", TensorInfo((ffn,), "float32"))
    w2 = Var("w2", TensorInfo((hidden, ffn), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, w1, b1, w2], attrs={"num_inputs": 1}):
        with bb.dataflow():
            up = bb.emit(op.linear(x, w1, b1), name="up")
            act = bb.emit(op.relu(up), name="act")
            out = bb.emit_output(op.linear(act, w2), name="out")
        bb.emit_func_output(out)
    return bb.get()


def mlp_constants(hidden: int = 16, ffn: int = 32, seed: int = 0) -> tuple[IRModule, list[np.ndarray]]:
    """``mlp`` with its weights as constants (what ``tilework.compile`` takes as an IRModule),
    and the weights."""
    rng = np.random.default_rng(seed)
    w = [rng.standard_normal(s).astype("float32") for s in ((ffn, hidden), (ffn,), (hidden, ffn))]
    x = Var("x", TensorInfo((SymVar("n", 1, 256), hidden), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            up = bb.emit(op.linear(x, Constant.of(w[0]), Constant.of(w[1])), name="up")
            act = bb.emit(op.relu(up), name="act")
            out = bb.emit_output(op.linear(act, Constant.of(w[2])), name="out")
        bb.emit_func_output(out)
    return bb.get(), w


def diamond() -> IRModule:
    """``a = relu(x); b = exp(a); c = add(a, b); d = tanh(c)``."""
    x = Var("x", TensorInfo((SymVar("n", 1, 64), 8), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.relu(x), name="a")
            b = bb.emit(op.exp(a), name="b")
            c = bb.emit(op.add(a, b), name="c")
            d = bb.emit_output(op.tanh(c), name="d")
        bb.emit_func_output(d)
    return bb.get()

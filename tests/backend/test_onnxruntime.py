"""The onnxruntime backend: every op it converts, numerically at symbolic shapes (including
1); regions merged, split where they must be, with several outputs; one session per region.
Skipped, with the reason, where onnx or onnxruntime is missing."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from tests.backend.helpers import attention_ref, close, gelu_ref, layer_norm_ref, module, offloaded, rand, rms_norm_ref, run, softmax_ref
from tilework import op
from tilework.ir.graph import Expr
from tilework.ir.sym import SymVar
from tilework.op import make_call

pytest.importorskip("onnx", reason="the onnxruntime backend exports regions with onnx (pip install onnx)")
pytest.importorskip("onnxruntime", reason="the onnxruntime backend needs onnxruntime (pip install onnxruntime)")

from tilework.backend import onnxruntime as ORT  # noqa: E402

NS = (1, 3, 6)
ORT_ONLY = ["onnxruntime"]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(5)


UNARY_REFS: dict[str, Callable[[np.ndarray], np.ndarray] | None] = {
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
    "exp": np.exp,
    "neg": np.negative,
    "abs": np.abs,
    "silu": lambda x: x / (1 + np.exp(-x)),
    "gelu": gelu_ref,
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3))),
    "square": np.square,
    "sqrt": lambda x: np.sqrt(np.abs(x) + 1),
    "rsqrt": lambda x: 1 / np.sqrt(np.abs(x) + 1),
    "log": lambda x: np.log(np.abs(x) + 1),
    "erf": None,
}


@pytest.mark.parametrize("name", sorted(UNARY_REFS))
def test_unary_ops(rng: np.random.Generator, name: str) -> None:
    n = SymVar("n", 1)
    positive = name in ("sqrt", "rsqrt", "log")
    mod = module([("x", (n, 5), "float32")], lambda x: make_call(name, [op.add(op.abs(x), op.ones_like(x)) if positive else x]))
    assert offloaded(mod, ORT_ONLY) == {"onnxruntime.run": 1}
    for rows in NS:
        x = rand(rng, (rows, 5))
        if name == "erf":
            from math import erf

            want = np.vectorize(erf)(x).astype(np.float32)
        else:
            ref = UNARY_REFS[name]
            assert ref is not None
            want = ref(x).astype(np.float32)
        close(run(mod, ORT_ONLY, [x]), want)


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide", "maximum", "minimum"])
def test_broadcasting_binary_ops(rng: np.random.Generator, name: str) -> None:
    n = SymVar("n", 1)
    mod = module([("a", (n, 1, 4), "float32"), ("b", (3, 4), "float32")], lambda a, b: make_call(name, [a, b]))
    assert offloaded(mod, ORT_ONLY) == {"onnxruntime.run": 1}
    fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide, "maximum": np.maximum, "minimum": np.minimum}[name]
    b = rand(rng, (3, 4))
    for rows in NS:
        a = rand(rng, (rows, 1, 4))
        close(run(mod, ORT_ONLY, [a, b]), fn(a, b))


def test_matmul_linear_softmax_norms(rng: np.random.Generator) -> None:
    n = SymVar("n", 1)
    lin3 = module([("x", (2, n, 16), "float32"), ("w", (8, 16), "float32"), ("b", (8,), "float32")], op.linear)
    lin2 = module([("x", (n, 16), "float32"), ("w", (8, 16), "float32")], op.linear)
    mm = module([("a", (n, 4, 16), "float32"), ("b", (16, 5), "float32")], op.matmul)
    sm = module([("x", (n, 5), "float32")], lambda x: op.log_softmax(op.softmax(x, axis=0), axis=1))
    ln = module([("x", (n, 2, 12), "float32"), ("g", (12,), "float32"), ("b", (12,), "float32")], lambda x, g, b: op.layer_norm(x, g, b, eps=1e-5))
    rms = module([("x", (n, 2, 12), "float32"), ("g", (2, 12), "float32")], lambda x, g: op.rms_norm(x, g, axes=(1, 2), eps=1e-6))
    for mod in (lin3, lin2, mm, sm, ln, rms):
        assert offloaded(mod, ORT_ONLY) == {"onnxruntime.run": 1}
    w, b, b2, g, gb, g2 = rand(rng, (8, 16)), rand(rng, (8,)), rand(rng, (16, 5)), rand(rng, (12,)), rand(rng, (12,)), rand(rng, (2, 12))
    for rows in NS:
        x3, x2, a, x5, xn = rand(rng, (2, rows, 16)), rand(rng, (rows, 16)), rand(rng, (rows, 4, 16)), rand(rng, (rows, 5)), rand(rng, (rows, 2, 12))
        close(run(lin3, ORT_ONLY, [x3, w, b]), x3 @ w.T + b)
        close(run(lin2, ORT_ONLY, [x2, w]), x2 @ w.T)
        close(run(mm, ORT_ONLY, [a, b2]), a @ b2)
        close(run(sm, ORT_ONLY, [x5]), np.log(softmax_ref(softmax_ref(x5, 0), 1)))
        close(run(ln, ORT_ONLY, [xn, g, gb]), layer_norm_ref(xn, g, gb, 1e-5))
        close(run(rms, ORT_ONLY, [xn, g2]), rms_norm_ref(xn.reshape(rows, 24), g2.reshape(24), 1e-6).reshape(rows, 2, 12))


def test_reshape_and_permute_take_the_dims_at_run_time(rng: np.random.Generator) -> None:
    b, s = SymVar("b", 1), SymVar("s", 1)
    mod = module(
        [("x", (b, s, 12), "float32")],
        lambda x: op.permute_dims(op.reshape(op.relu(x), (b, s * 3, 4)), axes=(2, 0, 1)),
    )
    assert offloaded(mod, ORT_ONLY) == {"onnxruntime.run": 1}
    for rows in NS:
        x = rand(rng, (2, rows, 12))
        close(run(mod, ORT_ONLY, [x]), np.maximum(x, 0).reshape(2, rows * 3, 4).transpose(2, 0, 1))


@pytest.mark.parametrize("case", ["causal", "causal_longer_kv", "gqa_causal", "float_mask", "bool_mask", "scaled"])
def test_attention(rng: np.random.Generator, case: str) -> None:
    s, t = SymVar("s", 1), SymVar("t", 1)
    heads, kv_heads = (4, 2) if case.startswith("gqa") else (2, 2)
    kv_seq = t if case == "causal_longer_kv" else s
    params: list[tuple[str, tuple[object, ...], str]] = [("q", (1, s, heads, 8), "float32"), ("k", (1, kv_seq, kv_heads, 8), "float32"), ("v", (1, kv_seq, kv_heads, 8), "float32")]
    if case.endswith("mask"):
        params.append(("m", (1, 1, s, s), "bool" if case == "bool_mask" else "float32"))
    causal = "causal" in case
    scale = 0.3 if case == "scaled" else None

    def body(*a: Expr) -> Expr:
        return op.attention(a[0], a[1], a[2], mask=a[3] if len(a) == 4 else None, causal=causal, scale=scale)

    mod = module(params, body)
    assert offloaded(mod, ORT_ONLY) == {"onnxruntime.run": 1}
    for rows in NS:
        kv_rows = rows + 2 if case == "causal_longer_kv" else rows
        q = rand(rng, (1, rows, heads, 8))
        k, v = rand(rng, (1, kv_rows, kv_heads, 8)), rand(rng, (1, kv_rows, kv_heads, 8))
        mask = None
        if case == "bool_mask":
            mask = rng.random((1, 1, rows, rows)) > 0.4
            mask[..., 0, :] = False
        elif case == "float_mask":
            mask = rand(rng, (1, 1, rows, rows))
        args = [q, k, v] + ([mask] if mask is not None else [])
        close(run(mod, ORT_ONLY, args), attention_ref(q, k, v, mask, causal, scale))


def test_adjacent_ops_merge_and_unsupported_ones_split(rng: np.random.Generator) -> None:
    n = SymVar("n", 1)

    def body(x: Expr, w: Expr) -> Expr:
        h = op.relu(op.matmul(x, w))  # one region ...
        c = op.cumsum(h, axis=1)  # ... codegen (no ONNX conversion) ...
        return op.add(op.exp(c), h)  # ... and a second region (not merged: it would not be convex)

    mod = module([("x", (n, 8), "float32"), ("w", (8, 8), "float32")], body)
    assert offloaded(mod, ["onnxruntime", "codegen"]) == {"onnxruntime.run": 2}
    w = rand(rng, (8, 8))
    for rows in NS:
        x = rand(rng, (rows, 8))
        h = np.maximum(x @ w, 0)
        close(run(mod, ["onnxruntime", "codegen"], [x, w]), np.exp(np.cumsum(h, axis=1)) + h)


def test_a_region_with_several_outputs(rng: np.random.Generator) -> None:
    from tests.transform.util import ir
    from tilework.backend import partition_by_rules

    # e and r form one region, and codegen's concat reads both
    mod = ir(
        """
        @graph
        def main(x: Tensor((n, 4), "float32")):
            n = sym(lo=1)
            with dataflow():
                e = exp(x)
                r = relu(e)
                c = concat((e, r), axis=1)
                gv = cumsum(c, axis=1)
                output(gv)
            return gv
        """
    )
    placement = partition_by_rules(mod, ["onnxruntime", "codegen"])
    assert [r.vars for r in placement.regions] and len(placement.regions) == 1 and len(placement.regions[0].vars) == 2
    for rows in NS:
        x = rand(rng, (rows, 4))
        close(run(mod, ["onnxruntime", "codegen"], [x]), np.cumsum(np.concatenate([np.exp(x), np.maximum(np.exp(x), 0)], 1), 1))


def test_one_session_per_region(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    import tilework

    made: list[object] = []
    real = ORT._Runner

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, model: str) -> None:
            made.append(model)
            super().__init__(model)

    monkeypatch.setattr(ORT, "_Runner", Counting)
    monkeypatch.setattr(ORT, "_RUNNERS", {})
    n = SymVar("n", 1)
    mod = module([("x", (n, 4), "float32")], lambda x: op.sigmoid(op.multiply(x, x)))
    vm = tilework.VM(tilework.build(mod, backends=ORT_ONLY))
    assert made == []  # not at build time
    for rows in (1, 2, 3, 2, 1):
        x = rand(rng, (rows, 4))
        close(vm["main"](x), 1 / (1 + np.exp(-x * x)))
    assert len(made) == 1

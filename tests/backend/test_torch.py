"""The torch backend: every capability numerically at symbolic shapes (including 1), against
NumPy references; skipped, with the reason, where torch is missing."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from tests.backend.helpers import attention_ref, close, gelu_ref, layer_norm_ref, module, offloaded, rand, rms_norm_ref, run, softmax_ref
from tilework import op
from tilework.ir.graph import Expr
from tilework.ir.sym import SymVar
from tilework.op import make_call

torch = pytest.importorskip("torch", reason="the torch backend needs torch (pip install torch)")

NS = (1, 3, 6)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)


def test_linear_and_matmul(rng: np.random.Generator) -> None:
    n = SymVar("n", 1)
    lin = module([("x", (n, 2, 16), "float32"), ("w", (8, 16), "float32"), ("b", (8,), "float32")], op.linear)
    lin_nb = module([("x", (n, 16), "float64"), ("w", (8, 16), "float64")], op.linear)
    mm = module([("a", (n, 4, 16), "float32"), ("b", (16, 5), "float32")], op.matmul)
    bmm = module([("a", (n, 4, 16), "float32"), ("b", (1, 16, 5), "float32")], op.matmul)
    assert offloaded(lin, ["torch"]) == {"torch.linear_bias": 1}
    assert offloaded(lin_nb, ["torch"]) == {"torch.linear": 1}
    assert offloaded(mm, ["torch"]) == offloaded(bmm, ["torch"]) == {"torch.matmul": 1}
    w, b, w64 = rand(rng, (8, 16)), rand(rng, (8,)), rand(rng, (8, 16), "float64")
    b2, b3 = rand(rng, (16, 5)), rand(rng, (1, 16, 5))
    for rows in NS:
        x, x64, a = rand(rng, (rows, 2, 16)), rand(rng, (rows, 16), "float64"), rand(rng, (rows, 4, 16))
        close(run(lin, ["torch"], [x, w, b]), x @ w.T + b)
        close(run(lin_nb, ["torch"], [x64, w64]), x64 @ w64.T, 1e-10)
        close(run(mm, ["torch"], [a, b2]), a @ b2)
        close(run(bmm, ["torch"], [a, b3]), a @ b3)


@pytest.mark.parametrize("case", ["causal", "causal_longer_kv", "gqa_causal", "float_mask", "bool_mask", "scaled"])
def test_sdpa_in_tilework_layout(rng: np.random.Generator, case: str) -> None:
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
    assert offloaded(mod, ["torch"]) == {"torch.sdpa": 1}
    for rows in NS:
        kv_rows = rows + 2 if case == "causal_longer_kv" else rows
        q = rand(rng, (1, rows, heads, 8))
        k, v = rand(rng, (1, kv_rows, kv_heads, 8)), rand(rng, (1, kv_rows, kv_heads, 8))
        args = [q, k, v]
        mask = None
        if case == "bool_mask":
            mask = rng.random((1, 1, rows, rows)) > 0.4
            mask[..., 0, :] = False  # a query that sees no key: zeros, as tilework's kernel gives
        elif case == "float_mask":
            mask = rand(rng, (1, 1, rows, rows))
        if mask is not None:
            args.append(mask)
        close(run(mod, ["torch"], args), attention_ref(q, k, v, mask, causal, scale))


def test_conv2d_norms_softmax(rng: np.random.Generator) -> None:
    h = SymVar("h", 1)
    conv = module([("x", (1, 3, h, 9), "float32"), ("w", (4, 3, 3, 3), "float32"), ("b", (4,), "float32")], lambda x, w, b: op.conv2d(x, w, b, padding=1))
    asym = module([("x", (1, 3, h, 9), "float32"), ("w", (4, 3, 3, 3), "float32")], lambda x, w: op.conv2d(x, w, padding=(1, 1, 0, 0)))
    n = SymVar("n", 1)
    ln = module([("x", (n, 2, 12), "float32"), ("g", (2, 12), "float32"), ("b", (2, 12), "float32")], lambda x, g, b: op.layer_norm(x, g, b, axes=(-2, -1), eps=1e-5))
    mid = module([("x", (n, 2, 12), "float32"), ("g", (2,), "float32"), ("b", (2,), "float32")], lambda x, g, b: op.layer_norm(x, g, b, axes=(1,)))
    rms = module([("x", (n, 12), "float32"), ("w", (12,), "float32")], lambda x, w: op.rms_norm(x, w, eps=1e-6))
    sm = module([("x", (n, 5), "float32")], lambda x: op.softmax(x, axis=0))
    lsm = module([("x", (n, 5), "float32")], lambda x: op.log_softmax(x, axis=-1))
    assert offloaded(conv, ["torch"]) == {"torch.conv2d": 1}
    assert offloaded(asym, ["torch", "codegen"]) == offloaded(mid, ["torch", "codegen"]) == {}
    assert offloaded(ln, ["torch"]) == {"torch.layer_norm": 1} and offloaded(rms, ["torch"]) == {"torch.rms_norm": 1}
    assert offloaded(sm, ["torch"]) == {"torch.softmax": 1} and offloaded(lsm, ["torch"]) == {"torch.log_softmax": 1}
    w, b = rand(rng, (4, 3, 3, 3)), rand(rng, (4,))
    for rows in (1, 3, 5):
        x = rand(rng, (1, 3, rows, 9))
        want = torch.nn.functional.conv2d(torch.from_numpy(x.astype(np.float64)), torch.from_numpy(w.astype(np.float64)), torch.from_numpy(b.astype(np.float64)), padding=1).numpy().astype(np.float32)
        close(run(conv, ["torch"], [x, w, b]), want)
    g, bb, rw = rand(rng, (2, 12)), rand(rng, (2, 12)), rand(rng, (12,))
    for rows in NS:
        x3, x2, x5 = rand(rng, (rows, 2, 12)), rand(rng, (rows, 12)), rand(rng, (rows, 5))
        close(run(ln, ["torch"], [x3, g, bb]), layer_norm_ref(x3.reshape(rows, 24), g.reshape(24), bb.reshape(24), 1e-5).reshape(rows, 2, 12))
        close(run(rms, ["torch"], [x2, rw]), rms_norm_ref(x2, rw, 1e-6))
        close(run(sm, ["torch"], [x5]), softmax_ref(x5, 0))
        close(run(lsm, ["torch"], [x5]), np.log(softmax_ref(x5, -1)))


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu", "relu", "sigmoid", "tanh", "exp"])
def test_activations(rng: np.random.Generator, name: str) -> None:
    n = SymVar("n", 1)
    mod = module([("x", (n, 7), "float32")], lambda x: make_call(name, [x]))
    assert offloaded(mod, ["torch"]) == {f"torch.{name}": 1}
    refs: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "gelu": gelu_ref,
        "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3))),
        "silu": lambda x: x / (1 + np.exp(-x)),
        "relu": lambda x: np.maximum(x, 0),
        "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "tanh": np.tanh,
        "exp": np.exp,
    }
    for rows in NS:
        x = rand(rng, (rows, 7))
        close(run(mod, ["torch"], [x]), refs[name](x).astype(np.float32))


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide"])
def test_broadcasting_binary_ops(rng: np.random.Generator, name: str) -> None:
    n = SymVar("n", 1)
    mod = module([("a", (n, 1, 4), "float32"), ("b", (3, 4), "float32")], lambda a, b: make_call(name, [a, b]))
    assert offloaded(mod, ["torch"]) == {f"torch.{name}": 1}
    fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide}[name]
    b = rand(rng, (3, 4))
    for rows in NS:
        a = rand(rng, (rows, 1, 4))
        close(run(mod, ["torch"], [a, b]), fn(a, b))


def test_read_only_inputs_give_no_warning() -> None:
    """A read-only weight (as a loaded model's are) reaches the torch externs without torch's
    "NumPy array is not writable" UserWarning in the user's output, and without a copy. In a
    fresh process: torch warns once per process."""
    import os
    import subprocess
    import sys

    script = (
        "import numpy as np, tilework as tw\n"
        "from tilework import op\n"
        "from tilework.ir.builder import BlockBuilder\n"
        "from tilework.ir.graph import Var\n"
        "from tilework.ir.info import TensorInfo\n"
        "n = tw.dim('n')\n"
        "x, w = Var('x', TensorInfo((n, 4), 'float32')), Var('w', TensorInfo((3, 4), 'float32'))\n"
        "bb = BlockBuilder()\n"
        "with bb.function('main', [x, w]):\n"
        "    with bb.dataflow():\n"
        "        out = bb.emit_output(op.matmul(x, op.permute_dims(w)))\n"
        "    bb.emit_func_output(out)\n"
        "exe = tw.build(bb.get(), backends='torch,codegen')\n"
        "assert any(i[2][0] == 'extern' for i in exe.functions['main'].code if i[0] == 'call')\n"
        "a, b = np.ones((5, 4), np.float32), np.ones((3, 4), np.float32)\n"
        "a.flags.writeable = b.flags.writeable = False\n"
        "assert (tw.VM(exe)['main'](a, b) == 4).all()\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-W", "default", "-c", script], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=root))
    assert r.returncode == 0, r.stderr
    assert "not writable" not in r.stderr

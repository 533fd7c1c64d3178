"""The bf16 mode (``tilework.compile(..., precision="bf16")``, ``tilework.transform.bf16_weights``):
float32 linear weights rounded to bfloat16, products and sums in float32 on the quant backend.

Numerics at symbolic shapes including 1 and odd sizes, against float32 within the bound the
pass states (per output ``|y - y32| <= BF16_BOUND * sum_k |x_k w_k|``, plus float32 rounding:
weights and, where the CPU has AVX-512 BF16, activations rounded), and against
the exactly rounded weights within float32 rounding (and the activations' rounding); MiniLM in bf16 against torch's
float32 within ``MINILM_TOL`` of the largest output; ``explain`` reports the measured error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tilework.errors import UnsupportedError
from tilework.op.quant import bf16_rows, bf16_values
from tilework.backend import quant as Q
from tilework.transform.bf16_weights import BF16_BOUND, BF16_UNIT, weight_error
from tests.long import long_only

torch = pytest.importorskip("torch", reason="these tests compile torch modules")
import tilework  # noqa: E402

Dim = torch.export.Dim
F32_SLACK = 1e-5  # float32 sums of at most a few hundred terms, relative to sum |x * w|
MINILM_TOL = 1e-2  # MiniLM's outputs in bf16 mode against torch float32, relative to the largest
minilm_only_long = long_only("compiles MiniLM (~20 s cold)")


def test_bf16_rows_round_to_nearest_even() -> None:
    w = np.array([[1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5e-3, 0.0, 3.0e38]], np.float32)
    got = bf16_values(bf16_rows(w))
    # 1 + 2**-8 is halfway between 1 and 1 + 2**-7: ties go to the even mantissa (1.0); 1 + 3 * 2**-8 to 1 + 2**-6
    assert got[0, :3].tolist() == [1.0, 1.0, 1.0 + 2**-6]
    assert got[0, 4] == 0.0
    rng = np.random.default_rng(0)
    r = rng.standard_normal((7, 33)).astype(np.float32)
    assert weight_error(r) < BF16_UNIT
    assert np.all(np.abs(bf16_values(bf16_rows(r)) - r) <= BF16_UNIT * np.abs(r))


class _Linear(torch.nn.Module):
    def __init__(self, k: int, n: int, bias: bool) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(k, n, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


@pytest.mark.parametrize("weights", ["inputs", "constants"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("k", "n"), [(37, 65), (38, 48)])
def test_linear_within_the_bf16_bound_at_symbolic_shapes(weights: str, bias: bool, k: int, n: int) -> None:
    """38 -> 48 (whole groups of 16 rows, an even row) is stored as bf16x16 where the quant
    library has AVX-512 BF16; 37 -> 65 as plain bf16 rows everywhere."""
    torch.manual_seed(0)
    m = _Linear(k, n, bias).eval()
    b, s = Dim("b", min=1, max=8), Dim("s", min=1, max=64)
    cm = tilework.compile(m, (torch.randn(2, 3, k),), ({0: b, 1: s},), weights=weights, precision="bf16")
    assert "quant_linear x1" in cm.explain() and "linear_io" not in str(cm.module)
    assert ('"bf16x16"' in str(cm.module)) == (n == 48 and Q.library().bf16dot)
    w = m.fc.weight.detach().numpy().astype(np.float64)
    wq = bf16_values(bf16_rows(m.fc.weight.detach().numpy())).astype(np.float64)
    bias_v = m.fc.bias.detach().numpy().astype(np.float64) if bias else 0.0
    for shape in ((1, 1, k), (1, 5, k), (3, 17, k), (8, 64, k)):
        x = torch.randn(*shape)
        got = cm(x).numpy().astype(np.float64)
        xd = x.numpy().astype(np.float64)
        absprod = np.abs(xd) @ np.abs(w).T
        exact32 = xd @ w.T + bias_v
        exact_bf = xd @ wq.T + bias_v
        rows = int(np.prod(shape[:-1]))
        x_rounding = Q.bf16_bound(xd.reshape(rows, k), wq).reshape(got.shape) if Q.library().bf16dot else 0.0
        assert np.all(np.abs(got - exact_bf) <= x_rounding + F32_SLACK * (absprod + np.abs(bias_v))), shape
        assert np.all(np.abs(got - exact32) <= BF16_BOUND * absprod + F32_SLACK * (absprod + np.abs(bias_v))), shape


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(19, 41), torch.nn.Linear(41, 19)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def test_explain_reports_the_measured_error_against_fp32() -> None:
    torch.manual_seed(1)
    m = _Mlp().eval()
    n = Dim("n", min=1, max=32)
    fp32 = tilework.compile(m, (torch.randn(3, 19),), ({0: n},))
    cm = tilework.compile(m, (torch.randn(3, 19),), ({0: n},), precision="bf16")
    assert "precision: fp32" in fp32.explain()
    text = cm.explain()
    assert "precision: bf16 weights for 2 linear(s)" in text and "measured against fp32" not in text
    x = torch.randn(7, 19)
    err = cm.check_precision(fp32, x)
    with torch.no_grad():
        diff = float((cm(x) - m(x)).abs().max())
    assert err["max_abs"] == pytest.approx(diff, rel=0.05, abs=1e-6) and 0 < err["max_rel"] < 1e-2
    text = cm.explain()
    assert "measured against fp32 on inputs (7, 19)" in text and f"{err['max_abs']:.3e}" in text


def _onnx_mlp(path: Path) -> tuple[Path, list[np.ndarray]]:
    """x [n, 20] -> MatMul 20x48 + b -> Relu -> MatMul 48x20 + b: ONNX's linears, [in, out]
    weights as initializers (the first of whole groups of 16 outputs, the second not)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w1, b1, w2, b2 = (rng.standard_normal(s).astype(np.float32) for s in ((20, 48), (48,), (48, 20), (20,)))
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["y"]),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 20])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 20])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path, [w1, b1, w2, b2]


@pytest.mark.parametrize("weights", ["inputs", "constants"])
def test_onnx_matmul_weights_within_the_bf16_bound(tmp_path: Path, weights: str) -> None:
    """An ONNX MatMul with an initializer ([in, out]) is a linear too: its weight transposed to
    bf16 rows (a weight param converted as the model's weights are passed), each output within
    the bound of its float32 value."""
    path, (w1, b1, w2, b2) = _onnx_mlp(tmp_path / "mlp.onnx")
    cm = tilework.compile(str(path), dim_bounds={"n": (1, 32)}, weights=weights, precision="bf16")
    assert "quant_linear x2" in cm.explain() and cm.report["precision"]["linears"] == 2
    assert str(cm.module).count('"bf16x16"') == (1 if Q.library().bf16dot else 0)  # the 20 -> 48 one

    def bound_check(x: np.ndarray, w: np.ndarray, b: np.ndarray, got: np.ndarray) -> None:
        xd, wd = x.astype(np.float64), w.astype(np.float64)
        absprod = np.abs(xd) @ np.abs(wd)
        assert np.all(np.abs(got - (xd @ wd + b)) <= BF16_BOUND * absprod + F32_SLACK * (absprod + np.abs(b)))

    for n in (1, 5, 17):
        x = np.random.default_rng(n).standard_normal((n, 20)).astype(np.float32)
        got = np.asarray(cm(x), np.float64)
        h = np.maximum(x.astype(np.float64) @ bf16_values(bf16_rows(w1.T)).T.astype(np.float64) + b1, 0)  # the hidden layer as bf16 computes it
        bound_check(h.astype(np.float32), w2, b2, got)


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(UnsupportedError, match="precision"):
        tilework.compile(_Linear(4, 4, True), (torch.randn(2, 4),), precision="fp16")


@minilm_only_long
def test_minilm_in_bf16_matches_fp32() -> None:
    pytest.importorskip("transformers")
    from tests.frontend.test_torch_models import minilm_dir
    import transformers

    cfg = transformers.BertConfig.from_pretrained(minilm_dir())
    cfg._attn_implementation = "sdpa"
    model = transformers.BertModel.from_pretrained(minilm_dir(), config=cfg).eval()
    b, s = Dim("batch", min=1, max=16), Dim("seq", min=1, max=512)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    spec = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}
    cm = tilework.compile(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, spec, precision="bf16")
    assert "quant_linear x37" in cm.explain()
    gen = torch.Generator().manual_seed(0)
    for batch, seq in ((1, 1), (1, 9), (3, 31)):
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen)
        with torch.no_grad():
            err = cm.check_precision(lambda **kw: model(**kw), input_ids=ids, attention_mask=torch.ones_like(ids))
        print(f"MiniLM bf16 vs fp32 at {(batch, seq)}: {err}")
        assert err["max_rel"] <= MINILM_TOL, (batch, seq, err)
    assert "measured against fp32" in cm.explain()


def test_cli_build_with_precision_bf16(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tilework.cli import main
    from tilework.compiled import CompiledModel

    torch.manual_seed(2)
    m = _Mlp().eval()
    ep = torch.export.export(m, (torch.randn(3, 19),), dynamic_shapes=({0: Dim("n", min=1, max=32)},), strict=False)
    torch.export.save(ep, str(tmp_path / "mlp.pt2"))
    out = tmp_path / "mlp.tw"
    assert main(["build", str(tmp_path / "mlp.pt2"), "-o", str(out), "--precision", "bf16"]) == 0
    cm = CompiledModel.load(str(out))
    assert "precision: bf16 weights for 2 linear(s)" in cm.explain()
    x = torch.randn(5, 19)
    with torch.no_grad():
        want = m(x).numpy()
    got = cm(x.numpy())
    assert 0 < np.abs(got - want).max() <= 1e-2 * np.abs(want).max()
    path, _ = _onnx_mlp(tmp_path / "mlp.onnx")
    assert main(["build", str(path), "-o", str(tmp_path / "onnx.tw"), "--dim", "n<=16", "--precision", "bf16"]) == 0
    assert "precision bf16 (2 linear(s))" in capsys.readouterr().out
    assert "precision: bf16 weights for 2 linear(s)" in CompiledModel.load(str(tmp_path / "onnx.tw")).explain()
    assert main(["export", str(tmp_path / "onnx.tw"), "-o", str(tmp_path / "out")]) == 0  # its quant_linear calls have C
    assert (tmp_path / "out" / "quant_kernels.c").exists()
    (tmp_path / "m.txt").write_text("")
    assert main(["build", str(tmp_path / "m.txt"), "-o", str(tmp_path / "x.tw"), "--precision", "bf16"]) == 2
    assert "--precision bf16 applies to .pt2 and .onnx models only" in capsys.readouterr().err


class _Attention(torch.nn.Module):
    """q, k, v projections (64 -> 4 heads of 16) and SDPA with a padding mask, then an output
    projection: the attention of an encoder layer."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)
        self.out = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.reshape(b, s, 4, 16).transpose(1, 2) for t in self.qkv(x).split(64, dim=-1))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        return self.out(o.transpose(1, 2).reshape(b, s, 64))


def test_attention_multiplies_in_bf16_where_the_cpu_has_it() -> None:
    """With AVX-512 BF16 the bf16 mode's attention rounds q, k, v and the probabilities to bf16
    for its products (``explain`` says so); elsewhere it stays float32. Against torch float32
    within bf16's rounding, at sequence lengths 1 (a task of 4 rows: the float32 narrow copy),
    17 and 40 (bf16 rows), with padded keys."""
    torch.manual_seed(3)
    m = _Attention().eval()
    b, s = Dim("b", min=1, max=8), Dim("s", min=1, max=64)
    x, keep = torch.randn(2, 9, 64), torch.ones(2, 9, dtype=torch.bool)
    cm = tilework.compile(m, (x, keep), ({0: b, 1: s}, {0: b, 1: s}), precision="bf16")
    text = cm.explain()
    assert ("attention: bf16 products" in text) == Q.library().bf16dot
    gen = torch.Generator().manual_seed(4)
    for batch, seq in ((1, 1), (2, 17), (3, 40)):
        x = torch.randn(batch, seq, 64, generator=gen)
        keep = torch.rand(batch, seq, generator=gen) < 0.7
        keep[:, 0] = True
        with torch.no_grad():
            want = m(x, keep).numpy()
        got = cm(x.numpy(), keep.numpy())
        assert 0 < np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), (batch, seq)

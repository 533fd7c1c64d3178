"""OLMo 2 (``Olmo2ForCausalLM``; GGUF ``olmo2``): a Llama whose layers normalize each sublayer's
output (``post_attention_layernorm``, ``post_feedforward_layernorm``) instead of its input, and
whose queries and keys are normalized over all their heads together (``q_norm`` of ``heads *
head_dim`` weights) before they are split into heads and rotated. Small random models: the config
read as transformers reads it, transformers' log-probabilities and greedy tokens from a
checkpoint and from a GGUF file written as llama.cpp's converter writes it, and, with
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
from tests.llm.test_checkpoint import assert_gguf_scores_as_transformers, assert_transformers_tokens, llama_cpp_and_tilework, log_probs, PROMPTS, save  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

OLMO = dict(num_hidden_layers=3, pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})


def test_a_checkpoint_and_its_gguf_give_transformers_log_probabilities(tmp_path: Path) -> None:
    """The config is transformers' (no input norms, two norms after the sublayers, q / k norms over
    all heads); a float32 checkpoint gives transformers' log-probabilities (1e-4) and greedy tokens
    after prompts of 1, 7 and 13 tokens, and its GGUF file the same config and log-probabilities.
    The q / k norms count: the model with them all ones is another."""
    hf = save(tmp_path / "ckpt", "olmo2", **OLMO)
    llm = LLM(str(tmp_path / "ckpt"), precision="fp32", max_batch=2, kv_tokens=256)
    c = llm.config
    assert (c.architecture, c.post_norm, c.qk_norm, c.rope_theta) == ("olmo2", True, True, 500000.0)
    ref = assert_transformers_tokens(llm, hf, steps=8)
    assert_gguf_scores_as_transformers(hf, tmp_path / "olmo2.gguf")
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_norm.weight.fill_(1.0)
            layer.self_attn.k_norm.weight.fill_(1.0)
    assert np.abs(log_probs(hf, PROMPTS[2]) - ref).max() > 0.1


@pytest.mark.slow
def test_llama_cpp_scores_an_olmo2_file_as_tilework_does(tmp_path: Path) -> None:
    """llama.cpp (llama-cpp-python) on the GGUF file of a random OLMo 2 of 4 layers: 40 tokens'
    log-probabilities as tilework's, within 0.0019 measured (what transformers' differ from
    llama.cpp's by), where the same model with its q / k norms all ones is 1.05 away."""
    hf = save(tmp_path / "ckpt", "olmo2", **{**OLMO, "num_hidden_layers": 4}, initializer_range=0.05)
    got, want, _, ids = llama_cpp_and_tilework(hf, tmp_path / "olmo2.gguf", seed=3)
    np.testing.assert_allclose(got, log_probs(hf, ids), rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, want, rtol=0, atol=6e-3)

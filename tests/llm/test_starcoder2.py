"""StarCoder2 (``Starcoder2ForCausalLM``; GGUF ``starcoder2``): a Llama whose two norms a layer
and final norm are LayerNorms with a bias, whose MLP has no gate, ``c_proj(gelu_tanh(c_fc(x)))``,
and whose projections all have biases (``use_bias``); the rotary embedding turns every dim,
rotate-half, in the files' row order; the head tied by default. Small random models (biases
random too): the config read as transformers reads it, transformers' log-probabilities and greedy
tokens from a checkpoint (with and without biases, in its sliding window) and from a GGUF file
written as llama.cpp's converter writes it, and, with llama-cpp-python, llama.cpp's on that file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tilework.errors import UnsupportedError  # noqa: E402
from tilework.llm import LLM  # noqa: E402
from tilework.llm.config import LlmConfig  # noqa: E402
from tests.llm.test_checkpoint import assert_gguf_scores_as_transformers, assert_transformers_tokens, llama_cpp_and_tilework, log_probs, PROMPTS, save, SMALL, VOCAB  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# odd sizes: heads of 20 dims, an MLP of 72
STARCODER2 = dict(hidden_size=80, intermediate_size=72, num_hidden_layers=3, norm_epsilon=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 100000.0})


def save_starcoder2(path: Path, **kw: Any) -> Any:
    """A random StarCoder2 saved to ``path`` with its biases and LayerNorms away from their starts
    (``save(biases=True)``); read back in float32."""
    return save(path, "starcoder2", biases=True, **{**STARCODER2, **kw})


def test_a_checkpoint_and_its_gguf_give_transformers_log_probabilities(tmp_path: Path) -> None:
    """The config is transformers' (LayerNorms, a Llama's two a layer, an MLP without a gate,
    biases, a tied head); a float32 checkpoint gives transformers' log-probabilities (1e-4) and
    greedy tokens after prompts of 1, 7 and 13 tokens, and its GGUF file the same config and
    log-probabilities. The norms' biases count: the model without them is another."""
    hf = save_starcoder2(tmp_path / "ckpt")
    llm = LLM(str(tmp_path / "ckpt"), precision="fp32", max_batch=2, kv_tokens=256)
    c = llm.config
    assert (c.architecture, c.layer_norm, c.parallel_residual, c.gated_mlp, c.head_bias, c.rope_dim, c.tie_word_embeddings) == ("starcoder2", True, False, False, False, None, True)
    assert (c.attention_bias, c.attention_out_bias, c.mlp_bias, c.rope_theta) == (True, True, True, 100000.0)
    ref = assert_transformers_tokens(llm, hf, steps=8)
    assert_gguf_scores_as_transformers(hf, tmp_path / "starcoder2.gguf")
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.input_layernorm.bias.zero_()
    assert np.abs(log_probs(hf, PROMPTS[2]) - ref).max() > 0.1


def test_a_checkpoint_without_biases_in_a_sliding_window(tmp_path: Path) -> None:
    """``use_bias`` false (no projection has a bias; the LayerNorms keep theirs), an untied head,
    and a 16-token ``sliding_window`` in a 64-token context, every layer attending in it as
    transformers' mask does: 40 tokens' log-probabilities."""
    hf = save_starcoder2(tmp_path / "ckpt", use_bias=False, tie_word_embeddings=False, sliding_window=16)
    llm = LLM(str(tmp_path / "ckpt"), precision="fp32", max_batch=2, kv_tokens=256)
    c = llm.config
    assert (c.attention_bias, c.mlp_bias, c.tie_word_embeddings, c.sliding_window, c.sliding_layers) == (False, False, False, 16, (0, 1, 2))
    ids = [int(t) for t in np.random.default_rng(3).integers(3, VOCAB, 40)]
    np.testing.assert_allclose(llm.score(ids), log_probs(hf, ids), rtol=0, atol=1e-4)


def test_another_activation_is_refused_by_name() -> None:
    d = transformers.Starcoder2Config(**{**SMALL, **STARCODER2}).to_dict()
    assert LlmConfig.from_hf_config(d).architecture == "starcoder2"
    with pytest.raises(UnsupportedError, match="hidden_act 'gelu'"):
        LlmConfig.from_hf_config({**d, "hidden_act": "gelu"})


@pytest.mark.slow
def test_llama_cpp_scores_a_starcoder2_file_as_tilework_does(tmp_path: Path) -> None:
    """llama.cpp (llama-cpp-python) on the GGUF file of a random StarCoder2 of 4 layers: 40
    tokens' log-probabilities as tilework's, within 2.2e-4 measured (transformers' differ from
    llama.cpp's by as much), where the same model without its norms' biases is 0.47 away."""
    hf = save_starcoder2(tmp_path / "ckpt", num_hidden_layers=4, initializer_range=0.05)
    got, want, _, ids = llama_cpp_and_tilework(hf, tmp_path / "starcoder2.gguf", seed=3)
    np.testing.assert_allclose(got, log_probs(hf, ids), rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)

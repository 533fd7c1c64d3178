"""Phi-2 and Phi-1.5 (``PhiForCausalLM``; GGUF ``phi2``): LayerNorms with a bias, one a layer
whose output both sublayers read, their outputs added to the layer's input together (a parallel
residual); every projection with a bias; a partial rotary embedding (``partial_rotary_factor``
0.4 of each head, rotate-half, in the files' row order); an MLP without a gate,
``fc2(gelu_tanh(fc1(x)))``; a final LayerNorm and an untied head with a bias. Small random models
(biases random too): the config read as transformers reads it, transformers' log-probabilities and
greedy tokens from a checkpoint and from GGUF files written as llama.cpp's converter writes them
(q, k, v three tensors or one ``attn_qkv``; float32 and q8_0), and, with llama-cpp-python,
llama.cpp's on that file."""

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
from tilework.llm.quant import quantize  # noqa: E402
from tests.llm.test_checkpoint import assert_gguf_scores_as_transformers, assert_transformers_tokens, llama_cpp_and_tilework, log_probs, PROMPTS, save, SMALL, write_gguf_of  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# 6 query heads of 16 dims, 6 of them turned (0.4), 3 key / value heads; whole q8_0 blocks (32) in
# the matrices' rows (hidden 96, MLP 160), so the q8_0 file's build shares the float32 one's kernels
PHI = dict(hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3, partial_rotary_factor=0.4, layer_norm_eps=1e-5)


def save_phi(path: Path, **kw: Any) -> Any:
    """A random Phi saved to ``path`` with its biases and LayerNorms away from their starts
    (``save(biases=True)``); read back in float32."""
    return save(path, "phi", biases=True, **{**PHI, **kw})


def test_a_checkpoint_and_its_gguf_files_give_transformers_log_probabilities(tmp_path: Path) -> None:
    """The config is transformers' (LayerNorms, one a layer, a parallel residual, an MLP without
    a gate, a head with a bias, 6 of 16 dims turned); a float32 checkpoint gives transformers'
    log-probabilities (1e-4) and greedy tokens after prompts of 1, 7 and 13 tokens, and its GGUF
    files, q, k and v as three tensors or as one ``attn_qkv``, the same config and
    log-probabilities. The head's bias counts: the model without it is another."""
    hf = save_phi(tmp_path / "ckpt")
    llm = LLM(str(tmp_path / "ckpt"), precision="fp32", max_batch=2, kv_tokens=256)
    c = llm.config
    assert (c.architecture, c.layer_norm, c.parallel_residual, c.gated_mlp, c.head_bias, c.rope_dim, c.head_dim) == ("phi2", True, True, False, True, 6, 16)
    assert (c.attention_bias, c.attention_out_bias, c.mlp_bias, c.tie_word_embeddings) == (True, True, True, False)
    ref = assert_transformers_tokens(llm, hf, steps=8)
    for fused in (False, True):
        assert_gguf_scores_as_transformers(hf, tmp_path / f"phi2-{fused}.gguf", fused_qkv=fused)
    with torch.no_grad():
        hf.lm_head.bias.zero_()
    assert np.abs(log_probs(hf, PROMPTS[2]) - ref).max() > 0.1


def test_a_q8_0_gguf_gives_the_log_probabilities_of_its_values(tmp_path: Path) -> None:
    """q8_0 matrices run as blocks (``q``): transformers' log-probabilities with the dequantized
    values, within what quantizing the activations to 8-bit blocks moves them (0.05; the qwen3
    test's bound)."""
    hf = save_phi(tmp_path / "ckpt", initializer_range=0.05)
    llm = LLM(str(write_gguf_of(hf, tmp_path / "phi2.gguf", "q8_0")), precision="q", max_batch=2, kv_tokens=256, kv_dtype="float32")
    assert llm.config.rope_dim == 6 and "model.layers.0.mlp.up_proj.weight" in llm.formats
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.from_numpy(quantize(p.numpy(), "q8_0", name).dequantize().reshape(p.shape)))
    for ids in PROMPTS:
        np.testing.assert_allclose(llm.score(ids), log_probs(hf, ids), rtol=0, atol=5e-2)


@pytest.mark.parametrize("key, value", [("qk_layernorm", True), ("hidden_act", "gelu"), ("tie_word_embeddings", True)])
def test_what_phi_could_vary_that_tilework_does_not_compute_is_refused_by_name(key: str, value: Any) -> None:
    d = {**transformers.PhiConfig(**{**SMALL, **PHI}).to_dict(), key: value}
    assert LlmConfig.from_hf_config({k: v for k, v in d.items() if k != key}).architecture == "phi2"
    with pytest.raises(UnsupportedError, match=key):
        LlmConfig.from_hf_config(d)


def test_phi_configs_partial_rotation_defaults_to_half_a_head() -> None:
    """PhiConfig's ``partial_rotary_factor`` where a config has none: 0.5 (Phi-1's), 8 of 16."""
    d = transformers.PhiConfig(**{**SMALL, **PHI}).to_dict()
    d.pop("partial_rotary_factor", None)
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    assert LlmConfig.from_hf_config(d).rope_dim == 8


@pytest.mark.slow
def test_llama_cpp_scores_a_phi2_file_as_tilework_does(tmp_path: Path) -> None:
    """llama.cpp (llama-cpp-python) on the GGUF file of a random Phi of 4 layers: 40 tokens'
    log-probabilities as tilework's, within 3.8e-4 measured (transformers' differ from
    llama.cpp's by as much), where the same model without its head's bias is 0.97 away."""
    hf = save_phi(tmp_path / "ckpt", num_hidden_layers=4, initializer_range=0.05)
    got, want, _, ids = llama_cpp_and_tilework(hf, tmp_path / "phi2.gguf", seed=3)
    np.testing.assert_allclose(got, log_probs(hf, ids), rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)

"""IBM Granite 3.x (``GraniteForCausalLM``; GGUF ``granite``): a Llama with four multipliers, the
token embedding times ``embedding_multiplier``, each sublayer's output times
``residual_multiplier`` before the residual add, the scores times ``attention_multiplier`` (in
place of ``head_dim ** -0.5``) and the logits divided by ``logits_scaling``. Small random models
whose multipliers are far from 1 (12, 0.22, 0.05, 8): the config read as transformers and
llama.cpp read it, transformers' log-probabilities and greedy tokens from a checkpoint and from a
GGUF file written as llama.cpp's converter writes it (q and k rows in its rotary order, the
multipliers under its ``*_scale`` keys), and, with llama-cpp-python, llama.cpp's on that file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tilework.errors import TileworkError  # noqa: E402
from tilework.llm import LLM  # noqa: E402
from tilework.llm.config import LlmConfig  # noqa: E402
from tests.llm.test_checkpoint import PROMPTS, assert_transformers_tokens, llama_cpp_and_tilework, log_probs, save, write_gguf_of  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MULTIPLIERS = dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.05, logits_scaling=8.0)
GRANITE = dict(**MULTIPLIERS, num_hidden_layers=3, tie_word_embeddings=True, pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
# ibm-granite/granite-3.1-2b-instruct's config.json, less keys tilework does not read
HUB = {"model_type": "granite", "architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_multiplier": 0.015625, "bos_token_id": 0,
       "embedding_multiplier": 12.0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192, "logits_scaling": 8.0,
       "max_position_embeddings": 131072, "mlp_bias": False, "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0,
       "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 5000000.0, "tie_word_embeddings": True, "vocab_size": 49155}  # fmt: skip


def test_configs_read_as_transformers_and_llama_cpp_read_them(tmp_path: Path) -> None:
    """A hub config's multipliers, and GraniteConfig's defaults where they are absent (1.0 each:
    an absent ``attention_multiplier`` scales the scores by 1); a GGUF file's llama.cpp keys, and
    llama.cpp's defaults where they are absent or 0 (no multiplier; the scores scaled by
    ``head_dim ** -0.5``), ``logit_scale`` required, ``rope.scaling.finetuned`` false: no layer
    rotated."""
    cfg = LlmConfig.from_hf_config(HUB)
    ref = transformers.GraniteConfig(**{k: v for k, v in HUB.items() if k != "model_type"})
    assert (cfg.architecture, cfg.head_dim, cfg.rope_theta, cfg.rms_eps, cfg.tie_word_embeddings, cfg.context_length) == ("granite", 64, 5e6, 1e-5, True, 131072)
    assert (cfg.embedding_multiplier, cfg.residual_multiplier, cfg.attention_multiplier, cfg.logit_scale) == (
        ref.embedding_multiplier, ref.residual_multiplier, ref.attention_multiplier, ref.logits_scaling) == (12.0, 0.22, 0.015625, 8.0)  # fmt: skip
    assert cfg.attention_scale == 0.015625 and LlmConfig.from_dict(cfg.to_dict()) == cfg
    bare = {k: v for k, v in HUB.items() if k not in MULTIPLIERS and k not in ("rope_theta", "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings")}
    d, ref = LlmConfig.from_hf_config(bare), transformers.GraniteConfig(**{k: v for k, v in bare.items() if k != "model_type"})
    assert (d.embedding_multiplier, d.residual_multiplier, d.attention_scale, d.logit_scale) == (ref.embedding_multiplier, ref.residual_multiplier, ref.attention_multiplier, ref.logits_scaling) == (1.0,) * 4
    assert (d.rope_theta, d.rms_eps, d.tie_word_embeddings, d.context_length) == (ref.rope_parameters["rope_theta"], ref.rms_norm_eps, ref.tie_word_embeddings, ref.max_position_embeddings)
    with pytest.raises(TileworkError, match="logit_scale must be a finite number above 0"):
        LlmConfig.from_hf_config({**HUB, "logits_scaling": 0})
    with pytest.raises(TileworkError, match="both scale the scores"):
        LlmConfig.from_dict({**cfg.to_dict(), "query_pre_attn_scalar": 64.0})

    hf = save(tmp_path / "ckpt", "granite", tokenizer=False, **GRANITE)
    from_file = LlmConfig.from_gguf(write_gguf_of(hf, tmp_path / "full.gguf"))
    assert (from_file.embedding_multiplier, from_file.residual_multiplier, from_file.attention_multiplier, from_file.logit_scale, from_file.nope_layers) == (12.0, 0.22, 0.05, 8.0, ())
    zeros = {"granite.embedding_scale": 0.0, "granite.residual_scale": 0.0, "granite.attention.scale": 0.0, "granite.rope.scaling.finetuned": False}
    plain = LlmConfig.from_gguf(write_gguf_of(hf, tmp_path / "zeros.gguf", meta=zeros))  # later keys win over the converter's
    assert (plain.embedding_multiplier, plain.residual_multiplier, plain.attention_scale, plain.logit_scale, plain.nope_layers) == (1.0, 1.0, None, 8.0, (0, 1, 2))
    without = save(tmp_path / "no-logit-scale", "granite", tokenizer=False, **{**GRANITE, "logits_scaling": 0})  # the converter writes no key for a 0
    with pytest.raises(TileworkError, match="no 'granite.logit_scale'"):
        LlmConfig.from_gguf(write_gguf_of(without, tmp_path / "no-logit-scale.gguf"))


def test_a_granite_checkpoint_and_gguf_give_transformers_log_probabilities(tmp_path: Path) -> None:
    """A float32 checkpoint: transformers' log-probabilities (1e-4) and greedy tokens after prompts
    of 1, 7 and 13 tokens; its GGUF file (llama.cpp's q / k row order and keys) the same config
    and log-probabilities. The same weights with any one multiplier 1 give others (each counts)."""
    hf = save(tmp_path / "ckpt", "granite", **GRANITE)
    llm = LLM(str(tmp_path / "ckpt"), precision="fp32", max_batch=2, kv_tokens=256)
    path = write_gguf_of(hf, tmp_path / "granite.gguf")
    from_file = LLM(str(path), precision="fp32", max_batch=2, kv_tokens=256)
    assert from_file.config == LlmConfig.from_dict({**llm.config.to_dict(), "bos_token_id": None, "eos_token_ids": [2]})
    ref = assert_transformers_tokens(llm, hf, steps=8)
    for ids in PROMPTS:
        np.testing.assert_allclose(from_file.score(ids), log_probs(hf, ids), rtol=0, atol=1e-4)
    for name in MULTIPLIERS:
        other = save(tmp_path / name, "granite", tokenizer=False, **{**GRANITE, name: 1.0})
        assert np.abs(log_probs(other, PROMPTS[2]) - ref).max() > 0.05, name


@pytest.mark.slow
def test_llama_cpp_scores_a_granite_file_as_tilework_does(tmp_path: Path) -> None:
    """llama.cpp (llama-cpp-python) on the GGUF file of a random Granite of 4 layers: 40 tokens'
    log-probabilities as tilework's, within 6e-5 measured, where the same weights without the
    multipliers are 8.2 from llama.cpp's; with ``rope.scaling.finetuned`` false (no layer
    rotated: llama.cpp's switch) within 6e-5 too, where the rotated model is 0.059 away."""
    hf = save(tmp_path / "ckpt", "granite", tokenizer=False, **{**GRANITE, "num_hidden_layers": 4})
    plain = save(tmp_path / "plain", "granite", tokenizer=False, **{**GRANITE, **{k: 1.0 for k in MULTIPLIERS}, "num_hidden_layers": 4})
    rotated = None
    for name, meta in (("granite.gguf", {}), ("unrotated.gguf", {"granite.rope.scaling.finetuned": False})):
        got, want, llm, ids = llama_cpp_and_tilework(hf, tmp_path / name, seed=2, meta=meta)
        assert (got.max(-1) - got.min(-1)).min() > 1.0  # the log-probabilities differ enough to compare
        np.testing.assert_allclose(got, want, rtol=0, atol=3e-4)
        if rotated is None:
            np.testing.assert_allclose(got, log_probs(hf, ids), rtol=0, atol=1e-4)
            assert np.abs(log_probs(plain, ids) - want).max() > 1.0
            rotated = want
        else:
            assert llm.config.nope_layers == (0, 1, 2, 3) and np.abs(want - rotated).max() > 0.02

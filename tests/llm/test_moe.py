"""Mixture-of-experts decoders (``tilework.llm.moe``): Qwen3-MoE (``Qwen3MoeForCausalLM``; GGUF
``qwen3moe``), Mixtral (``MixtralForCausalLM``; GGUF ``llama`` with experts), OLMoE
(``OlmoeForCausalLM``; GGUF ``olmoe``), Granite MoE (``GraniteMoeForCausalLM``, GGUF
``granitemoe``: Granite's multipliers too) and Qwen2-MoE (``Qwen2MoeForCausalLM``, GGUF
``qwen2moe``: a shared expert, gated). Small random models: the config read as transformers
reads it, transformers' log-probabilities and greedy tokens from a checkpoint and from a GGUF
file written as llama.cpp's converter writes it (the experts stacked), the quantized and bf16
paths against float32, and, with llama-cpp-python, llama.cpp's scores on the file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tests.long import long_param  # noqa: E402
from tilework.errors import TileworkError, UnsupportedError  # noqa: E402
from tilework.llm import LLM  # noqa: E402
from tilework.llm.config import LlmConfig  # noqa: E402
from tests.llm.test_checkpoint import assert_gguf_scores_as_transformers, assert_transformers_tokens, llama_cpp_and_tilework, log_probs, PROMPTS, save, write_gguf_of  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# 6 experts of 32, 2 a token; Qwen3-MoE's second layer a dense MLP (mlp_only_layers)
MOE: dict[str, dict[str, Any]] = {
    "qwen3_moe": dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True, head_dim=16, mlp_only_layers=[1]),
    "mixtral": dict(num_local_experts=6, num_experts_per_tok=2, intermediate_size=32, num_hidden_layers=1),
    "olmoe": dict(num_experts=6, num_experts_per_tok=2, intermediate_size=32, norm_topk_prob=False, num_hidden_layers=1, num_key_value_heads=4),
    "qwen2_moe": dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=False, num_hidden_layers=1),
    "granitemoe": dict(num_local_experts=6, num_experts_per_tok=2, intermediate_size=32, num_hidden_layers=1, embedding_multiplier=4.0, residual_multiplier=0.5,
                       attention_multiplier=0.1, logits_scaling=2.0),
}  # (Mixtral, OLMoE and Granite: one layer, the suite's time; OLMoE without grouped queries, as llama.cpp reads its k_norm)
FIELDS = {  # (architecture, experts, experts_used, expert_ffn, expert_norm, dense_layers) as read
    "qwen3_moe": ("qwen3moe", 6, 2, 32, True, (1,)),
    "mixtral": ("llama", 6, 2, 32, True, ()),
    "olmoe": ("olmoe", 6, 2, 32, False, ()),
    "qwen2_moe": ("qwen2moe", 6, 2, 32, False, ()),
    "granitemoe": ("granitemoe", 6, 2, 32, True, ()),
}


def moe_fields(c: LlmConfig) -> tuple[Any, ...]:
    return (c.architecture, c.experts, c.experts_used, c.expert_ffn, c.expert_norm, c.dense_layers)


@pytest.mark.parametrize("kind", list(MOE))
def test_a_checkpoint_and_its_gguf_give_transformers_log_probabilities(tmp_path: Path, kind: str) -> None:
    """The experts' config is transformers'; a float32 checkpoint gives transformers'
    log-probabilities (1e-4) and greedy tokens after prompts of 1, 7 and 13 tokens, and its GGUF
    file (the experts stacked, float32; a layer without a router dense) the same config and
    log-probabilities. The routing counts:
    the model with its routers' rows all alike (every token to experts 0 and 1, in equal shares)
    is another."""
    hf = save(tmp_path / "ckpt", kind, **MOE[kind])
    llm = LLM(str(tmp_path / "ckpt"), precision="fp32", max_batch=2, kv_tokens=256)
    assert moe_fields(llm.config) == FIELDS[kind]
    ref = assert_transformers_tokens(llm, hf, steps=8)
    assert_gguf_scores_as_transformers(hf, tmp_path / f"{kind}.gguf")
    with torch.no_grad():
        for layer in hf.model.layers:
            moe = layer.block_sparse_moe if kind == "granitemoe" else layer.mlp
            router = moe.router if kind == "granitemoe" else getattr(moe, "gate", None)
            if router is not None and router.weight.ndim == 2:  # (Qwen3-MoE's dense layer has none)
                router.weight.copy_(router.weight[:1].expand_as(router.weight))
    assert np.abs(log_probs(hf, PROMPTS[2]) - ref).max() > 0.05


@pytest.mark.parametrize("precision", ["q", long_param("bf16", why="a third build of the model; the experts' bf16x16 blocks run the q path's kernels")])
def test_quantized_experts_follow_float32(tmp_path: Path, precision: str) -> None:
    """A Qwen3-MoE GGUF file with q8_0 matrices, its experts among them, run ``q`` (the experts'
    blocks as they are in the file, 16 rows interleaved; int8 activations, a bfloat16 KV cache)
    and ``bf16``: each prompt's log-probabilities within 0.25 of the float32 run's on the same
    file, 0.04 on average (``q`` measured: 0.16 and 0.029 at most; the dense Qwen3 of the same
    sizes and file type: 0.13 and 0.027; the int8 activations and the bfloat16 cache, amplified by
    a random model)."""
    hf = save(tmp_path / "ckpt", "qwen3_moe", tokenizer=False, **{**MOE["qwen3_moe"], "mlp_only_layers": []})
    path = str(write_gguf_of(hf, tmp_path / "q8.gguf", fmt="q8_0"))
    ref, run = (LLM(path, precision=p, max_batch=2, kv_tokens=256) for p in ("fp32", precision))
    if precision == "q":
        assert run.formats["model.layers.0.mlp.experts.0.gate_proj.weight"] == "q8_0x16"
    for ids in PROMPTS:
        want, got = ref.score(ids), run.score(ids)
        assert np.abs(got - want).max() < 0.25
        assert np.abs(got - want).mean() < 0.04


def test_what_is_not_supported_is_refused(tmp_path: Path) -> None:
    """Shared experts (but Qwen2-MoE's), a sigmoid router, a checkpoint's clipped projections and
    a stack of experts in different formats are refused naming the key or tensor; so is a count
    of experts a token above the experts."""
    hf = save(tmp_path / "ckpt", "qwen3_moe", tokenizer=False, **{**MOE["qwen3_moe"], "num_hidden_layers": 1, "mlp_only_layers": []})
    for meta, message in [({"qwen3moe.expert_shared_count": 1}, "expert_shared_count = 1 is not supported"),
                          ({"qwen3moe.expert_gating_func": 2}, "expert_gating_func = 2 is not supported")]:  # fmt: skip
        with pytest.raises(UnsupportedError, match=message):
            LlmConfig.from_gguf(write_gguf_of(hf, tmp_path / "bad.gguf", meta=meta))
    with pytest.raises(UnsupportedError, match="clip_qkv = 8.0 is not supported"):
        LlmConfig.from_hf_config({**hf.config.to_dict(), "model_type": "olmoe", "clip_qkv": 8.0})
    with pytest.raises(TileworkError, match="experts_used must be an int in 1..6"):
        LlmConfig.from_hf_config({**hf.config.to_dict(), "num_experts_per_tok": 7})
    from tilework.llm.model import LlamaDecoder

    with pytest.raises(UnsupportedError, match=r"experts\.\*\.gate_proj\.weight: the experts' matrices are in different formats \(f32, q4_0, q8_0\)"):
        LlamaDecoder(LlmConfig.from_hf_config(hf.config.to_dict()), {"model.layers.0.mlp.experts.0.gate_proj.weight": "q8_0", "model.layers.0.mlp.experts.1.gate_proj.weight": "q4_0"})


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(MOE))
def test_llama_cpp_scores_a_moe_file_as_tilework_does(tmp_path: Path, kind: str) -> None:
    """llama.cpp (llama-cpp-python) on the GGUF file of a random mixture of 3 layers: 40 tokens'
    log-probabilities as tilework's (and transformers', 1e-4): measured 5.9e-4 (Qwen3-MoE), 2.8e-4
    (Mixtral), 4.7e-4 (OLMoE), 9.3e-5 (Granite MoE, its multipliers set), 5.3e-4 (Qwen2-MoE, its
    shared expert) from tilework, what transformers' differ from llama.cpp's by."""
    hf = save(tmp_path / "ckpt", kind, **{**MOE[kind], "num_hidden_layers": 3, "mlp_only_layers": []}, initializer_range=0.05)
    got, want, _, ids = llama_cpp_and_tilework(hf, tmp_path / f"{kind}.gguf", seed=5)
    np.testing.assert_allclose(got, log_probs(hf, ids), rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, want, rtol=0, atol=6e-3)


def test_gguf_names_of_experts() -> None:
    """A router and the stacked experts' tensors (``ffn_*_exps``), and an older Mixtral file's one
    tensor an expert (``ffn_gate.{e}``), under the decoder's names."""
    from tilework.llm.gguf import hf_tensor_name

    assert hf_tensor_name("blk.2.ffn_gate_inp.weight") == "model.layers.2.mlp.gate.weight"
    assert hf_tensor_name("blk.2.ffn_up_exps.weight", "qwen3moe") == "model.layers.2.mlp.experts.up_proj.weight"
    assert hf_tensor_name("blk.3.ffn_down.5.weight") == "model.layers.3.mlp.experts.5.down_proj.weight"
    assert hf_tensor_name("blk.3.ffn_gate.12.weight") == "model.layers.3.mlp.experts.12.gate_proj.weight"
    assert hf_tensor_name("blk.3.ffn_norm.5.weight") is None

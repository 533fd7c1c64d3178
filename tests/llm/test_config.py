"""``LlmConfig`` from transformers configs, checked against ``transformers.AutoConfig`` and the
rotary frequencies transformers computes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tilework.errors import TileworkError, UnsupportedError
from tilework.llm.config import LlmConfig, RopeScaling
from tilework.llm.weights import expected_shapes

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=512)

ROPE_CASES: dict[str, dict[str, Any]] = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50000.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 500000.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0},
    "yarn-mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "mscale": 0.7, "mscale_all_dim": 1.0, "beta_fast": 16, "rope_theta": 10000.0},
    "longrope": {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0,
                 "short_factor": [1.0 + 0.05 * i for i in range(8)], "long_factor": [1.5 + 0.5 * i for i in range(8)]},
}


def hf_inv_freq(hf_config: Any) -> np.ndarray:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(hf_config).inv_freq.numpy()


def hf_attention_scaling(hf_config: Any) -> float:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return float(LlamaRotaryEmbedding(hf_config).attention_scaling)


def test_yarn_and_longrope_as_transformers_computes_them() -> None:
    """yarn: ramp bounds truncated or not, the attention factor from ``factor``, from
    ``mscale`` / ``mscale_all_dim`` or given; longrope: the factor from the two contexts when not
    given, its long inverse frequencies those of a sequence past the original context (what
    transformers' ``rope_init_fn`` computes for it), a top-level
    ``original_max_position_embeddings`` (Phi3's) winning over the parameters' one; transformers
    4's ``rope_scaling`` key reads alike."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cases = [
        {"rope_scaling": {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256, "truncate": False, "beta_fast": 10.0, "beta_slow": 3.0}, "rope_theta": 5e4},
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "attention_factor": 0.9, "rope_theta": 1e4}},
        {"rope_parameters": {**ROPE_CASES["longrope"], "factor": None}},
        {"rope_parameters": {**ROPE_CASES["longrope"], "attention_factor": 1.7}, "original_max_position_embeddings": 64},
    ]
    for change in cases:
        d = {"model_type": "llama", **SMALL, **change}
        cfg, hf = LlmConfig.from_hf_config(d), transformers.LlamaConfig(**{k: v for k, v in d.items() if k != "model_type"})
        np.testing.assert_allclose(cfg.rope_inv_freq(), hf_inv_freq(hf), rtol=1e-6)
        assert cfg.rope_scaling.attention_factor == pytest.approx(hf_attention_scaling(hf), rel=1e-12)
        if cfg.rope_scaling.type == "longrope":
            original = hf.rope_parameters["original_max_position_embeddings"]
            assert cfg.rope_scaling.original_context == original
            long, _ = ROPE_INIT_FUNCTIONS["longrope"](hf, None, seq_len=original + 1)
            np.testing.assert_allclose(cfg.rope_inv_freq(step_end=original + 1), long.numpy(), rtol=1e-6)
            np.testing.assert_allclose(cfg.rope_inv_freq(step_end=original), hf_inv_freq(hf), rtol=1e-6)
            assert not np.allclose(cfg.rope_inv_freq(step_end=original + 1), cfg.rope_inv_freq(step_end=original))
    assert LlmConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(TileworkError, match="3 factors for head_dim 16"):
        LlmConfig.from_hf_config({"model_type": "llama", **SMALL, "rope_parameters": {**ROPE_CASES["longrope"], "short_factor": [1.0] * 3, "long_factor": [1.0] * 3}})


PARTIAL_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + 0.1 * i for i in range(6)], "long_factor": [1.5 + 0.5 * i for i in range(6)]}


@pytest.mark.parametrize("where", ["top", "rope_parameters"])
@pytest.mark.parametrize("rope", ["default", "longrope"])
def test_a_phi3_partial_rotary_factor_as_transformers_computes_it(tmp_path: Path, rope: str, where: str) -> None:
    """Phi-4-mini's ``partial_rotary_factor`` (0.75 of a head dim of 16: 12 rotated dims, as
    ``int(head_dim * factor)``), at the top level of its ``config.json`` or in the rope
    parameters: ``rope_dim``, the inverse frequencies over the 12 dims and longrope's 6 factors a
    list, as ``Phi3RotaryEmbedding`` computes them (short and long)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    params: dict[str, Any] = dict(PARTIAL_LONGROPE) if rope == "longrope" else {"rope_type": "default", "rope_theta": 10000.0}
    kw: dict[str, Any] = {"original_max_position_embeddings": 128} if rope == "longrope" else {}
    if where == "top":
        kw["partial_rotary_factor"] = 0.75
    else:
        params["partial_rotary_factor"] = 0.75
    transformers.Phi3Config(**SMALL, rope_parameters=params, pad_token_id=0, **kw).save_pretrained(tmp_path)
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    cfg = LlmConfig.from_hf_config(tmp_path)
    assert (cfg.head_dim, cfg.rope_dim, cfg.rotary_dims) == (16, 12, 12) and cfg.rope_scaling.type == rope
    np.testing.assert_allclose(cfg.rope_inv_freq(), Phi3RotaryEmbedding(hf).inv_freq.numpy(), rtol=1e-6)
    if rope == "longrope":
        long, _ = ROPE_INIT_FUNCTIONS["longrope"](hf, None, seq_len=129)
        assert long.shape == (6,)
        np.testing.assert_allclose(cfg.rope_inv_freq(step_end=129), long.numpy(), rtol=1e-6)
        assert cfg.rope_op_scaling()[3] == tuple(PARTIAL_LONGROPE["short_factor"])
    assert LlmConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_rope_dim_is_checked() -> None:
    """A whole head's worth is the full rotation (None); an odd or too large ``rope_dim`` is
    refused, as is a factor that turns an odd number of dims, longrope factors of the head dim's
    length for a partial rotation, and a partial rotation outside phi3 and phi (transformers' llama, qwen
    and the others turn every dim)."""
    base = dict(architecture="phi3", hidden=64, layers=1, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=10, rope_theta=1e4, rms_eps=1e-5, context_length=64)
    assert LlmConfig(**base, rope_dim=16).rope_dim is None and LlmConfig(**base).rotary_dims == 16
    for bad in (5, 18, 0):
        with pytest.raises(TileworkError, match="rope_dim must be None or a positive even int"):
            LlmConfig(**base, rope_dim=bad)
    phi3 = {"model_type": "phi3", **SMALL, "pad_token_id": 0}
    assert LlmConfig.from_hf_config({**phi3, "partial_rotary_factor": 1.0}).rope_dim is None
    with pytest.raises(UnsupportedError, match="turns 3 dims"):
        LlmConfig.from_hf_config({**phi3, "partial_rotary_factor": 0.2})
    with pytest.raises(TileworkError, match="8 factors for rope_dim 12 .the rotated dims. .it needs 6"):
        LlmConfig.from_hf_config({**phi3, "partial_rotary_factor": 0.75, "rope_parameters": {**ROPE_CASES["longrope"]}})
    with pytest.raises(UnsupportedError, match="partial rotary embeddings .partial_rotary_factor = 0.75. are supported for phi3 and phi checkpoints only"):
        LlmConfig.from_hf_config({"model_type": "qwen3", **SMALL, "partial_rotary_factor": 0.75})


@pytest.mark.parametrize("rope", list(ROPE_CASES))
def test_llama_config_matches_autoconfig(rope: str, tmp_path: Path) -> None:
    transformers.LlamaConfig(**SMALL, rope_parameters=ROPE_CASES[rope], tie_word_embeddings=True, bos_token_id=5, eos_token_id=[6, 7]).save_pretrained(tmp_path)
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    cfg = LlmConfig.from_hf_config(tmp_path)
    assert (cfg.architecture, cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab) == (
        hf.model_type, hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim, hf.intermediate_size, hf.vocab_size,
    )
    assert (cfg.rms_eps, cfg.context_length, cfg.tie_word_embeddings, cfg.bos_token_id, cfg.eos_token_ids) == (hf.rms_norm_eps, 512, True, 5, (6, 7))
    assert cfg.rope_theta == hf.rope_parameters["rope_theta"] and cfg.rope_scaling.type == rope.partition("-")[0]
    assert (cfg.attention_bias, cfg.attention_out_bias) == (False, False) and cfg.group == 2
    np.testing.assert_allclose(cfg.rope_inv_freq(), hf_inv_freq(hf), rtol=1e-6)
    assert cfg.rope_scaling.attention_factor == pytest.approx(hf_attention_scaling(hf), rel=1e-12)
    assert LlmConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_llama3_blend_covers_all_three_bands() -> None:
    """The llama3 case above has frequencies kept, divided and blended (so the test means something)."""
    cfg = LlmConfig.from_hf_config({"model_type": "llama", **SMALL, "rope_parameters": ROPE_CASES["llama3"]})
    plain = LlmConfig.from_hf_config({"model_type": "llama", **SMALL, "rope_theta": 500000.0})
    ratio = plain.rope_inv_freq() / cfg.rope_inv_freq()
    assert np.isclose(ratio, 1).any() and np.isclose(ratio, 8).any() and ((ratio > 1.01) & (ratio < 7.99)).any()


def test_older_rope_keys_and_defaults() -> None:
    """transformers 4 wrote ``rope_theta`` and ``rope_scaling`` (``type``); absent keys take the
    LlamaConfig defaults."""
    d = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
         "rope_theta": 20000.0, "rope_scaling": {"type": "linear", "factor": 2.0}, "eos_token_id": 3}
    cfg = LlmConfig.from_hf_config(d)
    hf = transformers.LlamaConfig()
    assert cfg.rope_scaling == RopeScaling("linear", 2.0) and cfg.rope_theta == 20000.0
    assert (cfg.kv_heads, cfg.head_dim, cfg.rms_eps, cfg.context_length) == (4, 16, hf.rms_norm_eps, hf.max_position_embeddings)
    assert cfg.eos_token_ids == (3,) and cfg.bos_token_id is None


def test_qwen2_config_has_qkv_bias(tmp_path: Path) -> None:
    transformers.Qwen2Config(**SMALL, tie_word_embeddings=True).save_pretrained(tmp_path)
    cfg = LlmConfig.from_hf_config(tmp_path / "config.json")
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert cfg.architecture == "qwen2" and cfg.attention_bias and not cfg.attention_out_bias
    assert (cfg.hidden, cfg.kv_heads, cfg.rms_eps, cfg.tie_word_embeddings) == (hf.hidden_size, hf.num_key_value_heads, hf.rms_norm_eps, True)
    np.testing.assert_allclose(cfg.rope_inv_freq(), hf_inv_freq(transformers.LlamaConfig(**SMALL, rope_parameters=hf.rope_parameters)), rtol=1e-6)


@pytest.mark.parametrize("bias", [False, True])
def test_qwen3_config_has_qk_norms_and_its_own_head_dim(tmp_path: Path, bias: bool) -> None:
    """Qwen3: ``head_dim`` 24 where hidden / heads is 16; ``attention_bias`` on q, k, v and o
    alike (off by default); a q_norm and a k_norm of ``head_dim`` per layer; a sliding window
    as Qwen2's."""
    transformers.Qwen3Config(**SMALL, head_dim=24, attention_bias=bias, tie_word_embeddings=True).save_pretrained(tmp_path)
    cfg = LlmConfig.from_hf_config(tmp_path)
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert cfg.architecture == "qwen3" and cfg.qk_norm and cfg.head_dim == hf.head_dim == 24 and (cfg.attention_bias, cfg.attention_out_bias) == (bias, bias)
    assert (cfg.rms_eps, cfg.rope_theta, cfg.tie_word_embeddings, cfg.context_length) == (hf.rms_norm_eps, hf.rope_parameters["rope_theta"], True, 512)
    shapes = expected_shapes(cfg)
    assert shapes["model.layers.1.self_attn.q_norm.weight"] == shapes["model.layers.1.self_attn.k_norm.weight"] == (24,)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (4 * 24, 64) and shapes["model.layers.0.self_attn.o_proj.weight"] == (64, 4 * 24)
    assert not LlmConfig.from_hf_config({**SMALL, "model_type": "qwen2"}).qk_norm
    # an absent head_dim is Qwen3Config's (128), not hidden / heads
    assert LlmConfig.from_hf_config({**SMALL, "model_type": "qwen3"}).head_dim == transformers.Qwen3Config(**SMALL).head_dim == 128
    windowed = json.loads((tmp_path / "config.json").read_text()) | {"use_sliding_window": True, "sliding_window": 16, "layer_types": None, "max_window_layers": 1}
    got = LlmConfig.from_hf_config(windowed)
    assert (got.context_length, got.sliding_window, got.sliding_layers) == (512, 16, (1,))
    assert LlmConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("window, sliding", [(16, 16), (None, None), (4096, None), ("absent", None)])
def test_mistral_is_llama_with_every_layer_in_its_sliding_window(tmp_path: Path, window: int | None | str, sliding: int | None) -> None:
    """Every layer attends in the window; MistralConfig's default window (4096, when the key is
    absent) is longer than this context (512): no window. ``None`` is no window."""
    transformers.MistralConfig(**SMALL, sliding_window=None if window == "absent" else window).save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    if window == "absent":
        del d["sliding_window"]
    cfg = LlmConfig.from_hf_config(d)
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert cfg.architecture == "llama" and not cfg.attention_bias and cfg.context_length == 512
    assert (cfg.sliding_window, cfg.sliding_layers) == ((sliding, (0, 1)) if sliding else (None, ()))
    assert (cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.rms_eps, cfg.rope_theta) == (hf.hidden_size, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim, hf.rms_norm_eps, hf.rope_parameters["rope_theta"])


@pytest.mark.parametrize("use, max_window_layers, layers", [(True, 1, (1,)), (True, 0, (0, 1)), (True, 2, ()), (False, 0, ())])
def test_qwen2_slides_in_the_layers_transformers_does(tmp_path: Path, use: bool, max_window_layers: int, layers: tuple[int, ...]) -> None:
    """transformers' Qwen2 slides in the layers from ``max_window_layers`` on, with
    ``use_sliding_window`` only; read from the saved ``layer_types`` and from a transformers-4
    config that has none. (``use_sliding_window`` was refused whatever the layers.)"""
    transformers.Qwen2Config(**SMALL, use_sliding_window=use, sliding_window=16, max_window_layers=max_window_layers).save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    older = {**{k: v for k, v in d.items() if k != "layer_types"}, "sliding_window": 16}
    for config in (d, older):
        cfg = LlmConfig.from_hf_config(config)
        assert (cfg.context_length, cfg.sliding_layers, cfg.sliding_window) == (512, layers, 16 if layers else None)
    with pytest.raises(UnsupportedError, match=r"layer types \['chunked_attention'\]"):
        LlmConfig.from_hf_config({**d, "layer_types": ["chunked_attention", "full_attention"]})


def test_llama_attention_bias_means_output_bias_too() -> None:
    cfg = LlmConfig.from_hf_config({"model_type": "llama", **SMALL, "attention_bias": True})
    assert cfg.attention_bias and cfg.attention_out_bias and not cfg.mlp_bias
    cfg = LlmConfig.from_hf_config({"model_type": "llama", **SMALL, "mlp_bias": True})
    assert cfg.mlp_bias and not cfg.attention_bias and LlmConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert "model.layers.1.mlp.down_proj.bias" in expected_shapes(cfg)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported; supported: llama, mistral, qwen2, qwen3"),
        ({"model_type": "gpt_neox"}, "model_type 'gpt_neox'"),
        ({"rope_parameters": {"rope_type": "proportional", "factor": 4.0, "rope_theta": 1e4}}, "rope scaling 'proportional' is not supported; supported: default, linear, llama3, yarn, longrope, dynamic"),
        ({"hidden_act": "gelu"}, "'gelu'"),
        ({"partial_rotary_factor": 0.5}, "partial rotary"),
    ],
)
def test_unsupported_configs_are_named(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedError, match=message):
        LlmConfig.from_hf_config({"model_type": "llama", **SMALL, **change})


def test_bad_config_files(tmp_path: Path) -> None:
    with pytest.raises(TileworkError, match="no such config"):
        LlmConfig.from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(TileworkError, match="config.json: not a readable JSON"):
        LlmConfig.from_hf_config(tmp_path)
    with pytest.raises(TileworkError, match="num_hidden_layers"):
        LlmConfig.from_hf_config({"model_type": "llama", **{k: v for k, v in SMALL.items() if k != "num_hidden_layers"}})
    with pytest.raises(TileworkError, match="multiple of kv_heads"):
        LlmConfig.from_hf_config({"model_type": "llama", **SMALL, "num_key_value_heads": 3})

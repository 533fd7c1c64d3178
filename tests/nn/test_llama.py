"""The tilework.nn Llama decoder against transformers' LlamaForCausalLM: the same parameter
names, a state dict loaded as it is, and logits that agree at several prompt lengths from one
compilation."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import tilework as tw
from tilework.errors import UnsupportedError
from tilework.ir.graph import GraphFunc
from tilework.models.llama import LlamaConfig, LlamaForCausalLM

torch = pytest.importorskip("torch", reason="the reference model is a transformers model")
transformers = pytest.importorskip("transformers", reason="the reference model is a transformers model")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SEQS = (1, 7, 33)


def hf_model(tie: bool = False, **kw: Any) -> Any:
    """A small random Llama; weights larger than the default init so that every layer matters."""
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        intermediate_size=128,
        tie_word_embeddings=tie,
        max_position_embeddings=64,
        **kw,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5 if name.endswith("norm.weight") else 0.1 * torch.randn_like(p))
    return model


def reference_logits(model: Any, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.numpy()  # type: ignore[no-any-return]


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> float:
    """Within 1e-4 of the largest logit; returns the max abs difference."""
    assert got.shape == want.shape, what
    diff = float(np.abs(got.astype(np.float64) - want).max())
    assert diff <= 1e-4 * float(np.abs(want).max()), f"{what}: max abs diff {diff}"
    return diff


@pytest.fixture(scope="module")
def untied() -> tuple[Any, LlamaForCausalLM, Any]:
    hf = hf_model()
    model = LlamaForCausalLM(LlamaConfig.from_hf(hf.config))
    model.load_state_dict(hf.state_dict())
    return hf, model, model.compile()


def test_parameter_names_are_hugging_faces(untied: tuple[Any, LlamaForCausalLM, Any]) -> None:
    hf, model, _ = untied
    assert [n for n, _ in model.named_parameters()] == list(hf.state_dict())
    cfg = model.config
    assert (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.vocab, cfg.rms_eps) == (64, 2, 4, 2, 128, 128, 1e-6)


def test_logits_match_transformers_at_every_length(untied: tuple[Any, LlamaForCausalLM, Any]) -> None:
    hf, _, cm = untied
    rng = np.random.default_rng(0)
    for seq in SEQS:
        ids = rng.integers(0, 128, size=(1, seq))
        assert_close(cm(ids), reference_logits(hf, ids), f"seq {seq}")
    ids_t = torch.from_numpy(rng.integers(0, 128, size=(1, 5)))
    out = cm(ids_t)
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (1, 5, 128)


def test_one_compilation_with_a_bounded_seq(untied: tuple[Any, LlamaForCausalLM, Any]) -> None:
    _, _, cm = untied
    main = cm.module["main"]
    assert isinstance(main, GraphFunc)
    seq = main.params[0].info.shape[1]  # type: ignore[attr-defined]
    assert (seq.name, seq.lo, seq.hi) == ("seq", 1, 64)
    assert main.ret_info.shape == (1, seq, 128)  # type: ignore[attr-defined]
    assert "rotary_embedding" in cm.explain() and "attention" in cm.explain()
    with pytest.raises(tw.TileworkError):
        cm(np.zeros((1, 65), np.int64))


def test_tied_embeddings_share_the_embedding_matrix() -> None:
    hf = hf_model(tie=True)
    model = LlamaForCausalLM(LlamaConfig.from_hf(hf.config))
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and "lm_head.weight" in hf.state_dict()
    model.load_state_dict(hf.state_dict())  # lm_head.weight is the embedding again: skipped
    cm = model.compile()
    ids = np.random.default_rng(1).integers(0, 128, size=(1, 9))
    assert_close(cm(ids), reference_logits(hf, ids), "tied, seq 9")


def test_linear_rotary_scaling_gives_transformers_logits() -> None:
    """``rope_scaling`` linear (factor 4: every angle a quarter; it was refused): the logits at
    each length are transformers', and the unscaled model's differ."""
    hf = hf_model(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})
    cfg = LlamaConfig.from_hf(hf.config)
    assert cfg.rope_factor == 4.0 and LlamaConfig.from_hf(hf_model().config).rope_factor == 1.0
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(hf.state_dict())
    cm = model.compile()
    plain = hf_model()  # the same weights (the same seed), unscaled
    rng = np.random.default_rng(3)
    for seq in SEQS:
        ids = rng.integers(0, 128, size=(1, seq))
        want = reference_logits(hf, ids)
        assert_close(cm(ids), want, f"linear, seq {seq}")
        if seq > 1:
            assert np.abs(reference_logits(plain, ids) - want).max() > 1e-2 * np.abs(want).max()


def test_unsupported_configs_are_refused() -> None:
    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0})
    with pytest.raises(UnsupportedError, match="type 'llama3': only the default kind, unscaled or scaled 'linear'"):
        LlamaConfig.from_hf(cfg)

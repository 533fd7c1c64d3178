"""A Llama-family decoder written with ``tilework.nn`` (prefill; the KV cache comes later).

    cfg = LlamaConfig.from_hf(hf_model.config)        # or LlamaConfig(hidden=..., ...)
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(hf_model.state_dict())       # Hugging Face names, NumPy or torch values
    cm = model.compile()                               # input_ids [1, seq], seq <= max_seq
    logits = cm(input_ids)                             # [1, seq, vocab]

Modules and parameter names mirror Hugging Face's ``LlamaForCausalLM``: ``model.embed_tokens``,
``model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
mlp.{gate,up,down}_proj}``, ``model.norm`` and ``lm_head`` (absent with tied embeddings: the
logits then use ``model.embed_tokens.weight``). Rotary embedding is the default kind with
``rope_theta``, unscaled or scaled ``linear`` (every angle divided by ``rope_factor``);
positions are ``0 .. seq - 1``, computed once and shared by the layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from tilework import nn
from tilework.errors import UnsupportedError
from tilework.ir.sym import SymVar
from tilework.nn import spec
from tilework.nn.core import Tensor
from tilework.nn.module import Module, ModuleList


@dataclass(frozen=True)
class LlamaConfig:
    """The shapes and constants of a Llama-family model (defaults: SmolLM-135M's)."""

    hidden: int = 576
    layers: int = 30
    heads: int = 9
    kv_heads: int = 3
    ffn: int = 1536
    vocab: int = 49152
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_word_embeddings: bool = True
    head_dim: int | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    max_seq: int = 2048
    dtype: str = "float32"
    rope_factor: float = 1.0  # transformers' linear rotary scaling factor (1: unscaled)

    @staticmethod
    def from_hf(config: Any, dtype: str = "float32") -> "LlamaConfig":
        """The config of a Hugging Face ``LlamaConfig`` (transformers 4 or 5 field names).
        Rotary embeddings unscaled or scaled ``linear`` (``factor``); another scaling
        (``llama3``, ``yarn``, ...) is refused."""
        rope = getattr(config, "rope_parameters", None) or {}
        scaling = getattr(config, "rope_scaling", None) or {}
        rope = rope if isinstance(rope, dict) else {}
        scaling = scaling if isinstance(scaling, dict) else {}

        def kind_of(d: dict[str, Any]) -> str:
            return str(d.get("rope_type", d.get("type", "default")))

        source = rope if kind_of(rope) != "default" else scaling  # transformers 5's key, else 4's
        kind = kind_of(source)
        if kind not in ("default", "linear"):
            raise UnsupportedError(f"rotary embedding of type {kind!r}: only the default kind, unscaled or scaled 'linear', is supported")
        factor = float(source["factor"]) if kind == "linear" else 1.0
        theta = rope["rope_theta"] if "rope_theta" in rope else getattr(config, "rope_theta", None)
        if getattr(config, "hidden_act", "silu") != "silu":
            raise UnsupportedError(f"hidden_act {config.hidden_act!r}: Llama models use silu")
        return LlamaConfig(
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            heads=config.num_attention_heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            ffn=config.intermediate_size,
            vocab=config.vocab_size,
            rope_theta=10000.0 if theta is None else float(theta),
            rms_eps=float(config.rms_norm_eps),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            head_dim=getattr(config, "head_dim", None),
            attention_bias=bool(getattr(config, "attention_bias", False)),
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            max_seq=int(getattr(config, "max_position_embeddings", 2048)),
            dtype=dtype,
            rope_factor=factor,
        )


class LlamaModel(Module):
    """Embeddings, the decoder layers and the final norm: ``input_ids [batch, seq]`` to hidden
    states ``[batch, seq, hidden]``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden, cfg.dtype)
        self.layers = ModuleList(
            nn.TransformerBlock(
                cfg.hidden,
                cfg.heads,
                cfg.ffn,
                kv_heads=cfg.kv_heads,
                head_dim=cfg.head_dim,
                norm="rms",
                eps=cfg.rms_eps,
                mlp="swiglu",
                rope_theta=cfg.rope_theta,
                attention_bias=cfg.attention_bias,
                mlp_bias=cfg.mlp_bias,
                dtype=cfg.dtype,
                rope_factor=cfg.rope_factor,
            )
            for _ in range(cfg.layers)
        )
        self.norm = nn.RMSNorm(cfg.hidden, cfg.rms_eps, cfg.dtype)

    def forward(self, input_ids: Tensor) -> Tensor:
        if input_ids.ndim != 2:
            raise UnsupportedError(f"input_ids must be [batch, seq], got rank {input_ids.ndim}")
        positions = nn.arange(0, input_ids.shape[1])
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h, positions)
        out: Tensor = self.norm(h)
        return out


class LlamaForCausalLM(Module):
    """``forward(input_ids [batch, seq] int64) -> logits [batch, seq, vocab]`` (prefill: every
    position's next-token logits, causal attention over the prompt)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden, cfg.vocab, bias=False, dtype=cfg.dtype)

    def forward(self, input_ids: Tensor) -> Tensor:
        h = self.model(input_ids)
        if self.lm_head is None:
            return nn.linear(h, self.model.embed_tokens.weight)
        out: Tensor = self.lm_head(h)
        return out

    def ignored_state_keys(self, keys: Iterable[str]) -> set[str]:
        """Rotary-frequency buffers some checkpoints carry, and ``lm_head.weight`` when the
        embeddings are tied (it is the embedding matrix again)."""
        out = {k for k in keys if k.endswith("rotary_emb.inv_freq")}
        if self.lm_head is None:
            out.add("lm_head.weight")
        return out

    def default_spec(self) -> spec.Spec:
        """``input_ids [1, seq]`` int64 with ``1 <= seq <= max_seq``."""
        return {"input_ids": spec.Tensor([1, SymVar("seq", 1, self.config.max_seq)], "int64")}


__all__ = ["LlamaConfig", "LlamaModel", "LlamaForCausalLM"]

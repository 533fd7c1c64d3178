"""The Llama-family decoder for serving: two entry points over a paged KV cache.

``LlamaDecoder(cfg, formats)`` is a ``tilework.nn`` module whose weights keep the format they
have in the model file: a matrix is an ``f32`` parameter (``nn.Linear``) or the ``uint8`` blocks
of a quantized format (``quant_linear``, never expanded); the embedding table likewise
(``quant_take`` for quantized tables), and a tied head multiplies by the embedding table itself.
``formats`` maps each Hugging Face parameter name to its format (``f32`` when absent).

Exported with ``decoder_spec`` it gives one module with two functions, compiled once:

- ``prefill(tokens int32[batch, seq], kv_len int32[batch], page_table int32[batch, pages],
  k_cache, v_cache, *weights) -> logits [batch, vocab]`` of each sequence's last token;
- ``decode(tokens int32[batch], kv_len, page_table, k_cache, v_cache, *weights) -> logits
  [batch, vocab]``.

Batch, sequence, page-table width and pool size are symbolic (bounded by the context), so one
compilation serves every prompt length and batch size. Token ``t`` of a sequence sits at
position ``kv_len + t`` (rotary embedding) and its key and value go to the cache there
(``paged_attention``); the caller advances ``kv_len``. The cache layout is
``tilework.llm.kv_cache``'s.
"""

from __future__ import annotations

from typing import Any

from tilework import op
from tilework.errors import UnsupportedError
from tilework.ir.sym import SymVar
from tilework.llm.config import LlmConfig
from tilework.nn import ops, spec
from tilework.nn.core import Parameter, Tensor, emit
from tilework.nn.module import Module, ModuleList
from tilework.nn.modules import Linear, RMSNorm
from tilework.llm.kv_cache import PAGE
from tilework.op.quant import QUANT_FORMATS


def _fmt(formats: dict[str, str], name: str) -> str:
    fmt = formats.get(name, "f32")
    if fmt not in QUANT_FORMATS:
        raise UnsupportedError(f"weight {name}: format {fmt!r} is not supported (supported: {', '.join(QUANT_FORMATS)})")
    return fmt


class QuantLinear(Module):
    """``x @ W.T`` with ``W`` kept in ``fmt`` blocks: the parameter is their ``uint8[out,
    row_bytes]`` (the rows of a GGUF tensor as they are in the file)."""

    def __init__(self, in_features: int, out_features: int, fmt: str, bias: bool = False) -> None:
        self.fmt, self.in_features, self.out_features = fmt, in_features, out_features
        self.weight = Parameter((out_features, QUANT_FORMATS[fmt].row_bytes(in_features)), "uint8", init="zeros")
        self.bias = Parameter((out_features,), "float32", init="zeros") if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = emit(op.quant_linear(x.expr, self.weight.expr, self.fmt, self.in_features))
        return y if self.bias is None else y + self.bias


def linear(in_features: int, out_features: int, fmt: str, bias: bool = False) -> Module:
    """A float32 ``nn.Linear``, or a ``QuantLinear`` for a block format."""
    if fmt == "f32":
        return Linear(in_features, out_features, bias)
    return QuantLinear(in_features, out_features, fmt, bias)


class Embedding(Module):
    """Rows of the token table, the table float32 or in ``fmt`` blocks; ``head(h)`` multiplies
    by it (a tied LM head)."""

    def __init__(self, vocab: int, hidden: int, fmt: str) -> None:
        self.vocab, self.hidden, self.fmt = vocab, hidden, fmt
        if fmt == "f32":
            self.weight = Parameter((vocab, hidden), "float32")
        else:
            self.weight = Parameter((vocab, QUANT_FORMATS[fmt].row_bytes(hidden)), "uint8", init="zeros")

    def forward(self, ids: Tensor) -> Tensor:
        if self.fmt == "f32":
            return ops.take(self.weight, ids, 0)
        return emit(op.quant_take(self.weight.expr, ids.expr, self.fmt, self.hidden))

    def head(self, h: Tensor) -> Tensor:
        if self.fmt == "f32":
            return ops.linear(h, self.weight)
        return emit(op.quant_linear(h.expr, self.weight.expr, self.fmt, self.hidden))


class Attention(Module):
    def __init__(self, cfg: LlmConfig, prefix: str, formats: dict[str, str], layer: int) -> None:
        h, hd = cfg.hidden, cfg.head_dim
        self.cfg, self.layer = cfg, layer
        bias = cfg.attention_bias

        def proj(name: str, n_in: int, n_out: int, b: bool) -> Module:
            return linear(n_in, n_out, _fmt(formats, f"{prefix}.self_attn.{name}.weight"), b)

        self.q_proj = proj("q_proj", h, cfg.heads * hd, bias)
        self.k_proj = proj("k_proj", h, cfg.kv_heads * hd, bias)
        self.v_proj = proj("v_proj", h, cfg.kv_heads * hd, bias)
        self.o_proj = proj("o_proj", cfg.heads * hd, h, cfg.attention_out_bias)

    def forward(self, x: Tensor, positions: Tensor, cache: "CacheInputs") -> Tensor:
        cfg = self.cfg
        batch, seq = x.shape[0], x.shape[1]
        q = self.q_proj(x).reshape(batch, seq, cfg.heads, cfg.head_dim)
        k = self.k_proj(x).reshape(batch, seq, cfg.kv_heads, cfg.head_dim)
        v = self.v_proj(x).reshape(batch, seq, cfg.kv_heads, cfg.head_dim)
        q = ops.rotary_embedding(q, positions, cfg.rope_theta)
        k = ops.rotary_embedding(k, positions, cfg.rope_theta)
        out = emit(op.paged_attention(q.expr, k.expr, v.expr, cache.k.expr, cache.v.expr, cache.kv_len.expr, cache.page_table.expr, layer=self.layer))
        return self.o_proj(out.reshape(batch, seq, cfg.heads * cfg.head_dim))


class MLP(Module):
    def __init__(self, cfg: LlmConfig, prefix: str, formats: dict[str, str]) -> None:
        def proj(name: str, n_in: int, n_out: int) -> Module:
            return linear(n_in, n_out, _fmt(formats, f"{prefix}.mlp.{name}.weight"))

        self.gate_proj = proj("gate_proj", cfg.hidden, cfg.ffn)
        self.up_proj = proj("up_proj", cfg.hidden, cfg.ffn)
        self.down_proj = proj("down_proj", cfg.ffn, cfg.hidden)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(ops.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(Module):
    def __init__(self, cfg: LlmConfig, i: int, formats: dict[str, str]) -> None:
        prefix = f"model.layers.{i}"
        # attribute (so parameter) order as in Hugging Face's decoder layers
        self.self_attn = Attention(cfg, prefix, formats, i)
        self.mlp = MLP(cfg, prefix, formats)
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)

    def forward(self, x: Tensor, positions: Tensor, cache: "CacheInputs") -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), positions, cache)
        out: Tensor = h + self.mlp(self.post_attention_layernorm(h))
        return out


class Model(Module):
    def __init__(self, cfg: LlmConfig, formats: dict[str, str]) -> None:
        self.embed_tokens = Embedding(cfg.vocab, cfg.hidden, _fmt(formats, "model.embed_tokens.weight"))
        self.layers = ModuleList(Layer(cfg, i, formats) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)


class CacheInputs:
    """The cache arguments of a step, as Tensors of the trace."""

    def __init__(self, kv_len: Tensor, page_table: Tensor, k: Tensor, v: Tensor) -> None:
        self.kv_len, self.page_table, self.k, self.v = kv_len, page_table, k, v


class LlamaDecoder(Module):
    """See the module docstring."""

    def __init__(self, cfg: LlmConfig, formats: dict[str, str] | None = None) -> None:
        formats = dict(formats or {})
        if cfg.architecture not in ("llama", "qwen2"):
            raise UnsupportedError(f"architecture {cfg.architecture!r}: the decoder runs llama-family models (llama, qwen2)")
        if cfg.rope_scaling.type != "default":
            raise UnsupportedError(f"rotary embedding scaled by {cfg.rope_scaling.type!r}: the decoder runs unscaled rotary embedding only (rope_theta)")
        self.config = cfg
        self.formats = formats
        self.model = Model(cfg, formats)
        self.lm_head = None if cfg.tie_word_embeddings else linear(cfg.hidden, cfg.vocab, _fmt(formats, "lm_head.weight"))

    def _logits(self, h: Tensor) -> Tensor:
        h = self.model.norm(h)
        if self.lm_head is None:
            return self.model.embed_tokens.head(h)
        out: Tensor = self.lm_head(h)
        return out

    def _layers(self, h: Tensor, positions: Tensor, cache: CacheInputs) -> Tensor:
        for layer in self.model.layers:
            h = layer(h, positions, cache)
        return h

    def prefill(self, tokens: Tensor, kv_len: Tensor, page_table: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        batch, seq = tokens.shape[0], tokens.shape[1]
        cache = CacheInputs(kv_len, page_table, k_cache, v_cache)
        positions = ops.expand_dims(kv_len.astype("int64"), 1) + ops.expand_dims(ops.arange(0, seq), 0)
        h = self._layers(self.model.embed_tokens(tokens), positions, cache)
        last = ops.take(h, ops.arange(seq - 1, seq), 1).reshape(batch, self.config.hidden)
        return self._logits(last)

    def decode(self, tokens: Tensor, kv_len: Tensor, page_table: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        batch = tokens.shape[0]
        cache = CacheInputs(kv_len, page_table, k_cache, v_cache)
        positions = ops.expand_dims(kv_len.astype("int64"), 1)
        ids = tokens.reshape(batch, 1)
        h = self._layers(self.model.embed_tokens(ids), positions, cache)
        return self._logits(h.reshape(batch, self.config.hidden))

    def ignored_state_keys(self, keys: Any) -> set[str]:
        out = {k for k in keys if k.endswith("rotary_emb.inv_freq")}
        if self.lm_head is None:
            out.add("lm_head.weight")
        return out


def decoder_spec(cfg: LlmConfig, max_batch: int = 64, page: int = PAGE) -> spec.Spec:
    """The spec of ``prefill`` and ``decode``: batch ``<= max_batch``, tokens ``<= context``,
    page-table width ``<= ceil(context / page)``, pool pages unbounded above."""
    ctx = cfg.context_length
    batch = SymVar("batch", 1, max_batch)
    seq = SymVar("seq", 1, ctx)
    width = SymVar("width", 1, (ctx + page - 1) // page)
    pages = SymVar("pages", 1, None)
    kc = spec.Tensor([cfg.layers, pages, cfg.kv_heads, cfg.head_dim, page], "float32")
    vc = spec.Tensor([cfg.layers, pages, page, cfg.kv_heads, cfg.head_dim], "float32")
    common = {"kv_len": spec.Tensor([batch], "int32"), "page_table": spec.Tensor([batch, width], "int32"), "k_cache": kc, "v_cache": vc}
    return {
        "prefill": {"tokens": spec.Tensor([batch, seq], "int32"), **common},
        "decode": {"tokens": spec.Tensor([batch], "int32"), **common},
    }


__all__ = ["LlamaDecoder", "QuantLinear", "Embedding", "decoder_spec", "PAGE"]

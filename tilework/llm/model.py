"""The Llama-family decoder for serving: two entry points over a paged KV cache.

``LlamaDecoder(cfg, formats)`` is a ``tilework.nn`` module whose weights keep the format they
have in the model file: a matrix is a float32 parameter packed in column panels
(``PackedLinear``: ``tilework.transform.panels.lay_out`` of the file's ``[out, in]``) or
the ``uint8`` blocks of a quantized format (``quant_linear``, never expanded); the embedding
table likewise (``quant_take`` for quantized tables), and a tied head multiplies by the
embedding table itself.
``formats`` maps each Hugging Face parameter name to its format (``f32`` when absent).

Exported with ``decoder_spec`` it gives one module with two functions, compiled once:

- ``prefill(tokens int32[batch, seq], rows int32[m], kv_len int32[batch], page_table
  int32[batch, pages], k_cache, v_cache, *weights) -> logits [batch * m, vocab]``: the logits
  after the step's tokens ``rows`` (indices into ``seq``; the same for every sequence), sequence
  by sequence: ``rows = [seq - 1]`` gives each sequence's next-token logits, ``arange(seq)``
  every position's (scoring a text, a prompt's log-probabilities);
- ``decode(tokens int32[batch], kv_len, page_table, k_cache, v_cache, *weights) -> logits
  [batch, vocab]``.

The cache arguments are float32, bfloat16 or float16 (``decoder_spec``'s ``kv_dtype``).

Batch, sequence, page-table width and pool size are symbolic (bounded by the context), so one
compilation serves every prompt length and batch size. Token ``t`` of a sequence sits at
position ``kv_len + t``: ``paged_rotary`` computes the rotary angles of the step's positions
(scaled as the config's ``rope_scaling`` says: longrope's factors chosen per sequence by the end
of its step, as transformers chooses them per forward call) once, and each layer's ``paged_attention`` turns
the token's query and key by them, writes its key and value to the cache there and attends; the
caller advances ``kv_len``. The cache layout is ``tilework.llm.kv_cache``'s. A ``qwen3`` layer
normalizes each query and key head (its ``q_norm`` / ``k_norm``) between the projection and
the attention op, which rotates them. A layer's q, k and v projections are one matrix multiply whose
output is the attention's input as it is (``MERGED``), and so are the MLP's gate and up
projections, when their weights share a format.

A ``gemma``, ``gemma2`` or ``gemma3`` model (``LlmConfig.gemma``, ``tilework.llm.gemma``) scales
the embedding by ``sqrt(hidden)`` (its config's ``embedding_multiplier``) and its MLP's activation
is GELU's tanh form; Gemma 1's layer is otherwise a Llama's. A ``gemma2`` or ``gemma3`` model
normalizes each sublayer's output too (``LlmConfig.sandwich_norm``: ``post_attention_layernorm``
after the attention, ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm`` around the
MLP), scales the scores by ``query_pre_attn_scalar ** -0.5``, and its sliding
layers attend in their window (``paged_attention``'s ``window``);
Gemma 3's are turned by a second rotary table of their own base (``paged_rotary`` unscaled: two
tables a step); Gemma 2 soft-caps the attention's scores (``paged_attention``'s ``softcap``) and
the logits (``c * tanh(logits / c)``). A ``smollm3`` model's ``nope_layers`` attend without the
rotary embedding (``paged_attention`` with no ``rope_theta``), as do an ``exaone4`` model's
global layers where it has sliding ones. An ``olmo2`` or ``exaone4`` layer
(``LlmConfig.post_norm``) normalizes each sublayer's output, not its input; OLMo 2 normalizes the
projected queries and keys over all their heads before they are split into heads
(``whole_qk_norm``), EXAONE 4 each head (as Qwen3).
A partial rotation (the config's ``rope_dim``: Phi-4-mini's) is both ops' ``rope_dim``: the
table holds its angles, the attention turns the first ``rope_dim`` dims of each query and key
head and passes the others. A ``granite`` model multiplies the embedding by
``embedding_multiplier``, each sublayer's output by ``residual_multiplier`` before the residual
add, the scores by ``attention_multiplier`` (``paged_attention``'s ``scale``), and divides the
logits by ``logit_scale``: float32 constants, as transformers' float32 model computes them.
A mixture of experts (``LlmConfig.experts``: Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, Granite MoE)
has a ``MoE`` as the MLP of its routed layers: the router's softmax, ``topk`` and the
renormalized weights in the graph, each of the experts' three projections one
``op.expert_linear`` over the experts' matrices stacked (``ExpertLinear``; ``merged_parts``
names the expert matrices a stack is made of), and Qwen2-MoE's shared expert, an ``MLP`` gated
by a sigmoid.
A ``phi2`` model (Phi-2, Phi-1.5) normalizes with LayerNorms of a weight and a bias
(``LlmConfig.layer_norm``), one a layer whose output both sublayers read, their outputs added
to the layer's input together (``parallel_residual``); its MLP has no gate,
``down_proj(gelu_tanh(up_proj(x)))`` (``gated_mlp`` false), and its head a bias (``head_bias``).
A ``starcoder2`` layer is a Llama's with Phi-2's LayerNorms and MLP.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilework import op
from tilework.errors import UnsupportedError
from tilework.ir import sym
from tilework.ir.sym import SymVar
from tilework.llm.config import ARCHITECTURES, LlmConfig
from tilework.nn import ops, spec
from tilework.nn.core import Parameter, Tensor, as_expr, emit
from tilework.nn.module import Module, ModuleList
from tilework.nn.modules import LayerNorm, RMSNorm
from tilework.llm.kv_cache import PAGE, kv_shapes
from tilework.op.linalg import linear_io
from tilework.op.quant import ALL_FORMATS
from tilework.transform.panels import PANEL, packed_shape


# Projections that read the same input are one matrix multiply when their weights share a
# format: the merged parameter's rows are the parts' rows, in this order (biases likewise).
MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def merged_parts(name: str, experts: int = 0) -> list[str] | None:
    """The Hugging Face parameters whose rows make up the decoder's parameter ``name`` (e.g.
    ``model.layers.0.mlp.gate_up_proj.weight`` is ``gate_proj.weight`` then ``up_proj.weight``;
    of a model with ``experts``, ``model.layers.0.mlp.experts.gate_proj.weight`` is
    ``mlp.experts.0.gate_proj.weight``, ``mlp.experts.1.gate_proj.weight``, ...), or None when
    ``name`` is one of them itself."""
    prefix, sep, rest = name.rpartition(".mlp.experts.")
    if sep and experts and rest.count(".") == 1:  # a stacked projection, not one expert's
        proj, kind = rest.split(".")
        return [f"{prefix}.mlp.experts.{e}.{proj}.{kind}" for e in range(experts)]
    prefix, _, leaf = name.rpartition(".")
    path, _, merged = prefix.rpartition(".")
    parts = MERGED.get(merged)
    return None if parts is None else [f"{path}.{part}.{leaf}" for part in parts]


def _fmt(formats: dict[str, str], name: str) -> str:
    fmt = formats.get(name, "f32")
    if fmt not in ALL_FORMATS:
        raise UnsupportedError(f"weight {name}: format {fmt!r} is not supported (supported: {', '.join(ALL_FORMATS)})")
    return fmt


def norm(cfg: LlmConfig, dim: int) -> Module:
    """A norm of ``dim`` features: an RMSNorm, or a LayerNorm with a bias (``LlmConfig.layer_norm``)."""
    return LayerNorm(dim, cfg.rms_eps) if cfg.layer_norm else RMSNorm(dim, cfg.rms_eps)


class QuantLinear(Module):
    """``x @ W.T`` with ``W`` kept in ``fmt`` blocks: the parameter is their ``uint8[out,
    row_bytes]`` (the rows of a GGUF tensor as they are in the file)."""

    def __init__(self, in_features: int, out_features: int, fmt: str, bias: bool = False) -> None:
        self.fmt, self.in_features, self.out_features = fmt, in_features, out_features
        self.weight = Parameter((out_features, ALL_FORMATS[fmt].row_bytes(in_features)), "uint8", init="zeros")
        self.bias = Parameter((out_features,), "float32", init="zeros") if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = emit(op.quant_linear(x.expr, self.weight.expr, self.fmt, self.in_features))
        return y if self.bias is None else y + self.bias


class PackedLinear(Module):
    """``x @ W.T`` with the float32 ``W [out, in]`` given packed in column panels,
    ``[ceil(out / PANEL), in, PANEL]`` (``tilework.transform.panels.lay_out``; zero past
    ``out``): a register tile of the matmul kernels streams one contiguous ``K x PANEL`` block,
    for every row of ``x`` it holds. With ``[out, in]`` a few rows (a decode batch) were dot
    products, each row reading the weight row again from L1 and summing its vector across."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(packed_shape(out_features, in_features), "float32")
        self.bias = Parameter((out_features,), "float32", init="zeros") if bias else None

    def forward(self, x: Tensor) -> Tensor:
        b = None if self.bias is None else self.bias.expr
        if x.ndim == 2:
            return emit(linear_io(x.expr, self.weight.expr, b, self.out_features))
        # one row dim: the matmul rule tiles only the last one (a decode step's x is [batch, 1,
        # hidden]: tiles of one row, the weight streamed once per sequence)
        lead = x.shape[:-1]
        rows = x.reshape(sym.product(lead), self.in_features)
        return emit(linear_io(rows.expr, self.weight.expr, b, self.out_features)).reshape(*lead, self.out_features)


def linear(in_features: int, out_features: int, fmt: str, bias: bool = False) -> Module:
    """A float32 ``PackedLinear``, or a ``QuantLinear`` for a block format."""
    if fmt == "f32":
        return PackedLinear(in_features, out_features, bias)
    return QuantLinear(in_features, out_features, fmt, bias)


class Embedding(Module):
    """Rows of the token table, the table float32 or in ``fmt`` blocks; ``head(h)`` multiplies
    by it (a tied LM head). A float32 table of a tied head is packed in column panels, as a
    ``PackedLinear``'s weight (the head is the largest matrix: its few-rows products need the
    layout most), and token ``t``'s row is gathered from it: element ``k`` at ``[t // PANEL, k,
    t % PANEL]``."""

    def __init__(self, vocab: int, hidden: int, fmt: str, tied: bool = False) -> None:
        self.vocab, self.hidden, self.fmt = vocab, hidden, fmt
        self.packed = fmt == "f32" and tied
        if self.packed:
            self.weight = Parameter(packed_shape(vocab, hidden), "float32")
        elif fmt == "f32":
            self.weight = Parameter((vocab, hidden), "float32")
        else:
            self.weight = Parameter((vocab, ALL_FORMATS[fmt].row_bytes(hidden)), "uint8", init="zeros")

    def forward(self, ids: Tensor) -> Tensor:
        if self.packed:
            t = ids.astype("int64")
            first = emit(op.floor_divide(t.expr, as_expr(PANEL, t))) * (self.hidden * PANEL) + emit(op.mod(t.expr, as_expr(PANEL, t)))
            at = first.reshape(*ids.shape, 1) + ops.arange(0, self.hidden * PANEL, PANEL)
            return ops.take(self.weight.reshape(-1), at, 0)
        if self.fmt == "f32":
            return ops.take(self.weight, ids, 0)
        return emit(op.quant_take(self.weight.expr, ids.expr, self.fmt, self.hidden))

    def head(self, h: Tensor) -> Tensor:
        if self.packed:
            return emit(linear_io(h.expr, self.weight.expr, None, self.vocab))
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

        self.q_size, self.kv_size = cfg.heads * hd, cfg.kv_heads * hd
        fmts = {_fmt(formats, f"{prefix}.self_attn.{n}.weight") for n in ("q_proj", "k_proj", "v_proj")}
        if len(fmts) == 1:  # one matrix multiply for the three (see MERGED)
            self.qkv_proj = linear(h, self.q_size + 2 * self.kv_size, fmts.pop(), bias)
        else:
            self.q_proj = proj("q_proj", h, self.q_size, bias)
            self.k_proj = proj("k_proj", h, self.kv_size, bias)
            self.v_proj = proj("v_proj", h, self.kv_size, bias)
        self.o_proj = proj("o_proj", cfg.heads * hd, h, cfg.attention_out_bias)
        if cfg.qk_norm:  # Qwen3, Gemma 3, EXAONE 4: each query and key head normalized before it is rotated (OLMo 2: all heads together)
            self.q_norm = RMSNorm(self.q_size if cfg.whole_qk_norm else hd, cfg.rms_eps)
            self.k_norm = RMSNorm(self.kv_size if cfg.whole_qk_norm else hd, cfg.rms_eps)

    def forward(self, x: Tensor, cache: "CacheInputs") -> Tensor:
        cfg = self.cfg
        batch, seq = x.shape[0], x.shape[1]
        heads = cfg.heads + 2 * cfg.kv_heads
        if hasattr(self, "qkv_proj"):
            flat = self.qkv_proj(x)
        else:
            flat = ops.concat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], axis=2)
        if cfg.whole_qk_norm:  # OLMo 2: the queries' and the keys' norms over all their heads
            q, k, v = flat[:, :, : self.q_size], flat[:, :, self.q_size : self.q_size + self.kv_size], flat[:, :, self.q_size + self.kv_size :]
            flat = ops.concat([self.q_norm(q), self.k_norm(k), v], axis=2)
        qkv = flat.reshape(batch, seq, heads, cfg.head_dim)
        if cfg.qk_norm and not cfg.whole_qk_norm:
            q, k, v = qkv[:, :, : cfg.heads], qkv[:, :, cfg.heads : cfg.heads + cfg.kv_heads], qkv[:, :, cfg.heads + cfg.kv_heads :]
            qkv = ops.concat([self.q_norm(q), self.k_norm(k), v], axis=2)
        # the rotary embedding of q and k happens inside the attention kernel (at kv_len + t,
        # the step's angles from cache.rotary; a sliding layer's from cache.local where its
        # base is another)
        window = cfg.layer_window(self.layer)
        local = window is not None and cache.local is not None
        rotary, theta = (cache.local, cfg.rope_local_theta) if local else (cache.rotary, cfg.rope_theta)
        assert rotary is not None and theta is not None
        turned = self.layer not in cfg.nope_layers  # SmolLM3: a NoPE layer's queries and keys are not rotated
        out = emit(op.paged_attention(qkv.expr, cache.k.expr, cache.v.expr, cache.kv_len.expr, cache.page_table.expr, layer=self.layer, kv_heads=cfg.kv_heads,
                                      rope_theta=theta if turned else None, scale=cfg.attention_scale, rotary=rotary.expr if turned else None, window=window,
                                      softcap=cfg.attn_softcap, rope_dim=cfg.rope_dim if turned else None))  # fmt: skip
        return self.o_proj(out.reshape(batch, seq, cfg.heads * cfg.head_dim))


class MLP(Module):
    """A gated MLP of width ``ffn`` (default: the config's) whose weights are ``{prefix}.{path}.*``
    (``mlp``; a Qwen2-MoE shared expert's ``mlp.shared_expert``); without a gate
    (``LlmConfig.gated_mlp`` false: Phi-2's) ``down_proj(gelu_tanh(up_proj(x)))``."""

    def __init__(self, cfg: LlmConfig, prefix: str, formats: dict[str, str], path: str = "mlp", ffn: int | None = None) -> None:
        bias = cfg.mlp_bias
        width = cfg.ffn if ffn is None else ffn

        def proj(name: str, n_in: int, n_out: int) -> Module:
            return linear(n_in, n_out, _fmt(formats, f"{prefix}.{path}.{name}.weight"), bias)

        self.ffn = width
        self.gated = cfg.gated_mlp
        self.gelu = cfg.gemma or not self.gated  # Gemma: gelu_tanh(gate) * up; Phi-2: gelu_tanh(up)
        fmts = {_fmt(formats, f"{prefix}.{path}.{n}.weight") for n in ("gate_proj", "up_proj")}
        if not self.gated:
            self.up_proj = proj("up_proj", cfg.hidden, width)
        elif len(fmts) == 1:  # one matrix multiply for the two (see MERGED)
            self.gate_up_proj = linear(cfg.hidden, 2 * width, fmts.pop(), bias)
        else:
            self.gate_proj = proj("gate_proj", cfg.hidden, width)
            self.up_proj = proj("up_proj", cfg.hidden, width)
        self.down_proj = proj("down_proj", width, cfg.hidden)

    def forward(self, x: Tensor) -> Tensor:
        if not self.gated:
            return self.down_proj(ops.gelu(self.up_proj(x), "tanh"))
        if hasattr(self, "gate_up_proj"):
            y = self.gate_up_proj(x)
            gate, up = y[:, :, : self.ffn], y[:, :, self.ffn :]
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        act = ops.gelu(gate, "tanh") if self.gelu else ops.silu(gate)
        return self.down_proj(act * up)


class ExpertLinear(Module):
    """The ``experts`` matrices ``[out, in]`` of a mixture's projection stacked as one weight
    (``[experts * out, ...]``: expert ``e``'s rows from ``e * out``; ``fmt`` blocks or float32
    rows): ``op.expert_linear`` of an input for each token (``[tokens, 1, in]``) or for each
    of its slots (``[tokens, slots, in]``) and the experts the slots chose (``[tokens, slots]``)."""

    def __init__(self, experts: int, in_features: int, out_features: int, fmt: str) -> None:
        self.experts, self.in_features, self.fmt = experts, in_features, fmt
        row = in_features if fmt == "f32" else ALL_FORMATS[fmt].row_bytes(in_features)
        self.weight = Parameter((experts * out_features, row), "float32" if fmt == "f32" else "uint8", init="zeros")

    def forward(self, x: Tensor, ids: Tensor) -> Tensor:
        return emit(op.expert_linear(x.expr, self.weight.expr, ids.expr, self.fmt, self.in_features, self.experts))


class Experts(Module):
    """A mixture's experts (:mod:`tilework.llm.moe`), each a SwiGLU MLP: one ``ExpertLinear``
    for the gates, one for the up projections, one for the down projections."""

    def __init__(self, cfg: LlmConfig, prefix: str, formats: dict[str, str]) -> None:
        def proj(name: str, n_in: int, n_out: int) -> ExpertLinear:
            fmts = {_fmt(formats, f"{prefix}.mlp.experts.{e}.{name}.weight") for e in range(cfg.experts)}  # (one tensor in a GGUF file but older Mixtral ones)
            if len(fmts) > 1:
                raise UnsupportedError(f"{prefix}.mlp.experts.*.{name}.weight: the experts' matrices are in different formats ({', '.join(sorted(fmts))}); they are run as one stack")
            return ExpertLinear(cfg.experts, n_in, n_out, fmts.pop())

        self.gate_proj = proj("gate_proj", cfg.hidden, cfg.expert_ffn)
        self.up_proj = proj("up_proj", cfg.hidden, cfg.expert_ffn)
        self.down_proj = proj("down_proj", cfg.expert_ffn, cfg.hidden)


class MoE(Module):
    """A mixture-of-experts MLP: the router (``gate``) picks ``experts_used`` experts a token,
    whose outputs are summed with their routing weights (:mod:`tilework.llm.moe`); with
    ``shared_ffn`` a shared expert (an MLP of that width) adds its output times
    ``sigmoid(shared_expert_gate(x))`` (Qwen2-MoE)."""

    def __init__(self, cfg: LlmConfig, prefix: str, formats: dict[str, str]) -> None:
        self.cfg = cfg
        self.gate = linear(cfg.hidden, cfg.experts, _fmt(formats, f"{prefix}.mlp.gate.weight"))
        self.experts = Experts(cfg, prefix, formats)
        if cfg.shared_ffn:
            self.shared_expert = MLP(cfg, prefix, formats, "mlp.shared_expert", cfg.shared_ffn)
            self.shared_expert_gate = linear(cfg.hidden, 1, _fmt(formats, f"{prefix}.mlp.shared_expert_gate.weight"))

    def forward(self, x: Tensor) -> Tensor:
        cfg = self.cfg
        lead, k = x.shape[:-1], cfg.experts_used
        tokens = sym.product(lead)
        flat = x.reshape(tokens, cfg.hidden)
        probs = ops.softmax(self.gate(flat), -1)  # [tokens, experts]
        weights, ids = ops.topk(probs, k)
        if cfg.expert_norm:
            weights = weights / ops.sum(weights, -1, keepdims=True)
        if cfg.expert_scale != 1.0:
            weights = weights * float(np.float32(cfg.expert_scale))
        one = flat.reshape(tokens, 1, cfg.hidden)
        experts = self.experts
        h = ops.silu(experts.gate_proj(one, ids)) * experts.up_proj(one, ids)  # [tokens, k, expert_ffn]
        y = experts.down_proj(h, ids)  # [tokens, k, hidden]
        out = ops.sum(y * weights.reshape(tokens, k, 1), 1).reshape(*lead, cfg.hidden)
        if cfg.shared_ffn:
            out = out + self.shared_expert(x) * ops.sigmoid(self.shared_expert_gate(x))
        return out


class Layer(Module):
    def __init__(self, cfg: LlmConfig, i: int, formats: dict[str, str]) -> None:
        prefix = f"model.layers.{i}"
        # attribute (so parameter) order as in Hugging Face's decoder layers
        self.self_attn = Attention(cfg, prefix, formats, i)
        self.mlp: Module = MoE(cfg, prefix, formats) if cfg.moe_layer(i) else MLP(cfg, prefix, formats)
        self.post_only = cfg.post_norm  # OLMo 2, EXAONE 4: each sublayer's output normalized, its input not
        if not self.post_only:
            self.input_layernorm = norm(cfg, cfg.hidden)
        self.parallel = cfg.parallel_residual  # Phi-2: one norm, both sublayers on its output
        if not self.parallel:
            self.post_attention_layernorm = norm(cfg, cfg.hidden)
        self.sandwich = cfg.sandwich_norm  # Gemma 2 and 3: each sublayer's output normalized too, before the residual add
        if self.sandwich:
            self.pre_feedforward_layernorm = norm(cfg, cfg.hidden)
        if self.sandwich or self.post_only:
            self.post_feedforward_layernorm = norm(cfg, cfg.hidden)
        self.residual = float(np.float32(cfg.residual_multiplier))  # Granite: each sublayer's output times it

    def _scaled(self, y: Tensor) -> Tensor:
        return y if self.residual == 1.0 else y * self.residual

    def forward(self, x: Tensor, cache: "CacheInputs") -> Tensor:
        if self.parallel:  # (attention + MLP) + x, as transformers and llama.cpp add them
            n = self.input_layernorm(x)
            phi: Tensor = self._scaled(self.self_attn(n, cache)) + self._scaled(self.mlp(n)) + x
            return phi
        if self.post_only:
            h = x + self._scaled(self.post_attention_layernorm(self.self_attn(x, cache)))
            olmo: Tensor = h + self._scaled(self.post_feedforward_layernorm(self.mlp(h)))
            return olmo
        if self.sandwich:
            h = x + self._scaled(self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cache)))
            gemma: Tensor = h + self._scaled(self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h))))
            return gemma
        h = x + self._scaled(self.self_attn(self.input_layernorm(x), cache))
        out: Tensor = h + self._scaled(self.mlp(self.post_attention_layernorm(h)))
        return out


class Model(Module):
    def __init__(self, cfg: LlmConfig, formats: dict[str, str]) -> None:
        self.embed_tokens = Embedding(cfg.vocab, cfg.hidden, _fmt(formats, "model.embed_tokens.weight"), cfg.tie_word_embeddings)
        self.layers = ModuleList(Layer(cfg, i, formats) for i in range(cfg.layers))
        self.norm = norm(cfg, cfg.hidden)


class CacheInputs:
    """The cache arguments of a step, as Tensors of the trace."""

    def __init__(self, kv_len: Tensor, page_table: Tensor, k: Tensor, v: Tensor, rotary: Tensor, local: Tensor | None = None) -> None:
        self.kv_len, self.page_table, self.k, self.v = kv_len, page_table, k, v
        self.rotary = rotary  # the step's rotary angles (paged_rotary), shared by the layers
        self.local = local  # the sliding layers' angles, where their base is another (Gemma 3)


class LlamaDecoder(Module):
    """See the module docstring."""

    def __init__(self, cfg: LlmConfig, formats: dict[str, str] | None = None) -> None:
        formats = dict(formats or {})
        if cfg.architecture not in ARCHITECTURES:
            raise UnsupportedError(f"architecture {cfg.architecture!r}: the decoder runs llama-family models ({', '.join(ARCHITECTURES)})")
        self.config = cfg
        self.formats = formats
        self.model = Model(cfg, formats)
        self.lm_head = None if cfg.tie_word_embeddings else linear(cfg.hidden, cfg.vocab, _fmt(formats, "lm_head.weight"), cfg.head_bias)

    def _logits(self, h: Tensor) -> Tensor:
        h = self.model.norm(h)
        out: Tensor = self.model.embed_tokens.head(h) if self.lm_head is None else self.lm_head(h)
        if self.config.logit_scale != 1.0:  # Granite: the logits divided by it
            out = out / float(np.float32(self.config.logit_scale))
        cap = self.config.final_softcap
        if cap is not None:  # Gemma 2: the logits soft-capped
            out = ops.tanh(out / cap) * cap
        return out

    def _layers(self, h: Tensor, cache: CacheInputs) -> Tensor:
        for layer in self.model.layers:
            h = layer(h, cache)
        return h

    def _cache(self, tokens: Tensor, kv_len: Tensor, page_table: Tensor, k_cache: Tensor, v_cache: Tensor) -> CacheInputs:
        """The cache inputs of a step of ``tokens [batch, seq]``, with the rotary angles of its
        positions computed once for every layer."""
        cfg = self.config
        rotary = emit(op.paged_rotary(tokens.expr, kv_len.expr, head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_op_scaling(), rope_dim=cfg.rope_dim))
        local = None
        if cfg.sliding_layers and cfg.rope_local_theta is not None:  # a second table, unscaled, for the sliding layers
            local = emit(op.paged_rotary(tokens.expr, kv_len.expr, head_dim=cfg.head_dim, rope_theta=cfg.rope_local_theta, rope_dim=cfg.rope_dim))
        return CacheInputs(kv_len, page_table, k_cache, v_cache, rotary, local)

    def _embed(self, ids: Tensor) -> Tensor:
        h = self.model.embed_tokens(ids)
        if self.config.embedding_multiplier != 1.0:  # Gemma's sqrt(hidden), Granite's multiplier: a float32 constant
            h = h * float(np.float32(self.config.embedding_multiplier))
        return h

    def prefill(self, tokens: Tensor, rows: Tensor, kv_len: Tensor, page_table: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        batch, m = tokens.shape[0], rows.shape[0]
        cache = self._cache(tokens, kv_len, page_table, k_cache, v_cache)
        h = self._layers(self._embed(tokens), cache)
        return self._logits(ops.take(h, rows, 1).reshape(batch * m, self.config.hidden))

    def decode(self, tokens: Tensor, kv_len: Tensor, page_table: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        batch = tokens.shape[0]
        ids = tokens.reshape(batch, 1)
        cache = self._cache(ids, kv_len, page_table, k_cache, v_cache)
        h = self._layers(self._embed(ids), cache)
        return self._logits(h.reshape(batch, self.config.hidden))

    def ignored_state_keys(self, keys: Any) -> set[str]:
        out = {k for k in keys if k.endswith("rotary_emb.inv_freq")}
        if self.lm_head is None:
            out.add("lm_head.weight")
        return out


def decoder_spec(cfg: LlmConfig, max_batch: int = 64, page: int = PAGE, kv_dtype: str = "float32") -> spec.Spec:
    """The spec of ``prefill`` and ``decode``: batch ``<= max_batch``, tokens ``<= context``,
    page-table width ``<= ceil(context / page)``, pool pages unbounded above, the pool's keys
    and values ``kv_dtype`` (``tilework.llm.kv_cache.KV_DTYPES``)."""
    ctx = cfg.context_length
    batch = SymVar("batch", 1, max_batch)
    seq = SymVar("seq", 1, ctx)
    rows = SymVar("rows", 1, ctx)
    width = SymVar("width", 1, (ctx + page - 1) // page)
    pages = SymVar("pages", 1, None)
    k_shape, v_shape = kv_shapes(cfg.layers, pages, cfg.kv_heads, cfg.head_dim, page, kv_dtype)
    kc, vc = spec.Tensor(list(k_shape), kv_dtype), spec.Tensor(list(v_shape), kv_dtype)
    common = {"kv_len": spec.Tensor([batch], "int32"), "page_table": spec.Tensor([batch, width], "int32"), "k_cache": kc, "v_cache": vc}
    return {
        "prefill": {"tokens": spec.Tensor([batch, seq], "int32"), "rows": spec.Tensor([rows], "int32"), **common},
        "decode": {"tokens": spec.Tensor([batch], "int32"), **common},
    }


__all__ = ["LlamaDecoder", "ExpertLinear", "MoE", "PackedLinear", "QuantLinear", "Embedding", "decoder_spec", "merged_parts", "MERGED", "PAGE"]

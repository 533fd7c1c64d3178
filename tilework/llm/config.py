"""The hyperparameters of a llama-family decoder: :class:`LlmConfig`.

One value describes the model whatever file it came from: a GGUF file's metadata
(:meth:`LlmConfig.from_gguf`) or a transformers ``config.json`` (:meth:`LlmConfig.from_hf_config`).
These architectures are read: ``llama``, ``qwen2`` (llama with biases on the q, k and v
projections), ``qwen3`` (llama with an RMSNorm over each query and key head, ``q_norm`` /
``k_norm``, before the rotary embedding; its ``head_dim`` need not be ``hidden / heads``);
``gemma``, ``gemma2`` and ``gemma3`` (Gemma's decoders: the embedding scaled, GELU-tanh MLPs; Gemma
1 with a Llama's two norms a layer, Gemma 2 and 3 with four, sliding-window layers, Gemma 2's
soft caps, Gemma 3's second rotary base, and more: :mod:`tilework.llm.gemma` reads their
configs); ``smollm3`` (SmolLM3: llama whose every fourth layer, ``no_rope_layers``, attends
without the rotary embedding); ``olmo2`` (OLMo 2: no norm before the sublayers, one after
each, before the residual add, and an RMSNorm over all query heads together and one over all
key heads, :attr:`LlmConfig.post_norm`); ``exaone4`` (EXAONE 4.0: OLMo 2's layer with Qwen3's
per-head q/k norms; with a sliding window, its global layers attend without the rotary
embedding); ``ernie4_5`` (ERNIE 4.5: llama whose rotary embedding pairs dims ``2i, 2i + 1`` of a
head, in its checkpoints and GGUF files alike: the loaders reorder its q / k rows to the
"rotate half" order, ``tilework.llm.gguf.INTERLEAVED``; ``use_bias``: every projection's bias);
``qwen3moe`` (Qwen3-MoE: qwen3 with a mixture of experts as its MLP), ``qwen2moe`` (Qwen2-MoE,
Qwen1.5-MoE: qwen2 with a mixture of experts and a shared expert), ``olmoe`` (OLMoE:
OLMo 2's q / k norms, llama's norms, a mixture of experts) and ``granitemoe`` (Granite 3.x MoE:
granite's multipliers and a mixture of experts), and ``llama`` files and ``mixtral``
checkpoints with experts (Mixtral): :mod:`tilework.llm.moe` reads the experts' fields;
``granite`` (IBM Granite 3.x: llama with four multipliers, of the
embedding, of each sublayer's output, of the attention's scores, and a divisor of the logits);
``phi3`` (Phi-3, Phi-3.5, Phi-4-mini: llama whose q, k,
v projections are one matrix in the file, and the MLP's gate and up another, split on loading;
from a transformers checkpoint every layer attends in its ``sliding_window``, where it is shorter
than the context, as transformers does; a GGUF file's window is not applied, as llama.cpp
applies none; Phi-4-mini turns 96 of each head's 128 dims, :attr:`LlmConfig.rope_dim`, from
its ``partial_rotary_factor`` or its GGUF file's ``phi3.rope.dimension_count``); ``phi2``
(Phi-2, Phi-1.5: transformers ``model_type`` ``phi``; LayerNorms with a bias, one a layer, a
parallel residual, an MLP without a gate, a head with a bias: :attr:`LlmConfig.layer_norm`,
:attr:`~LlmConfig.parallel_residual`, :attr:`~LlmConfig.gated_mlp`,
:attr:`~LlmConfig.head_bias`; every projection with a bias; the first ``partial_rotary_factor``
of each head turned, PhiConfig's 0.5 where absent, a GGUF file's ``phi2.rope.dimension_count``);
``starcoder2`` (StarCoder2: a Llama's layer with LayerNorms and an MLP without a gate, every
projection with a bias where ``use_bias``; from a checkpoint every layer attends in its
``sliding_window``, from a GGUF file in none, as llama.cpp); a
transformers ``mistral`` checkpoint is ``llama``, and a checkpoint's sliding-window layers
(Mistral's, Qwen2's and Qwen3's with ``use_sliding_window``) attend in their window as
transformers' do (a GGUF file's llama-family window is not applied: llama.cpp applies none). Anything the model family could
vary that tilework does not implement (another rotary scaling, a partial rotary dim outside
phi3 and phi2, shared experts, Phi's ``qk_layernorm``) raises :class:`~tilework.errors.UnsupportedError` naming it, rather than loading a model that
would compute something else. The rotary scaling (``rope_scaling``, a
:class:`~tilework.llm.rope.RopeScaling`) is read by :mod:`tilework.llm.rope`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from tilework.errors import TileworkError, UnsupportedError
from tilework.llm.hf_keys import key_reader, sliding_layers
from tilework.llm.moe import check_moe, gguf_moe, hf_moe
from tilework.llm.rope import RopeScaling, f32_value, gguf_freq_factors, gguf_longrope, gguf_rope_scaling, hf_rope, hf_rope_dim

if TYPE_CHECKING:
    from gguf import GGUFReader

    from tilework.llm.gguf import GGUFFile

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "smollm3", "olmo2", "granite", "exaone4", "ernie4_5", "qwen3moe", "olmoe", "granitemoe", "qwen2moe", "phi2", "starcoder2")
LAYER_NORM = ("phi2", "starcoder2")  # architectures whose norms are LayerNorms with a bias (LlmConfig.layer_norm)
UNGATED = ("phi2", "starcoder2")  # architectures whose MLP has no gate (LlmConfig.gated_mlp)
PARTIAL_ROTARY = ("phi3", "phi2")  # architectures whose heads may be turned in part (LlmConfig.rope_dim)
NOPE_INTERVAL = 4  # SmolLM3: every fourth layer is not rotated (transformers' no_rope_layer_interval default; llama.cpp's fixed step)
@dataclass(frozen=True, slots=True)
class LlmConfig:
    """A llama-family decoder. ``attention_bias``: q, k, v projections have biases;
    ``attention_out_bias``: the output projection has one too (llama's ``attention_bias``
    sets both, qwen2 has the first only); ``mlp_bias``: the gate, up and down projections have
    biases (llama's ``mlp_bias``). ``eos_token_ids``: every token that ends generation. A
    ``qwen3`` model normalizes each query and key head (:attr:`qk_norm`). ``sliding_layers``:
    the layers that attend to the last ``sliding_window`` tokens only (:meth:`layer_window`),
    turned by an unscaled rotary base of their own, ``rope_local_theta`` (None: the global
    ``rope_theta`` and scaling); ``query_pre_attn_scalar``: the attention's scores are scaled
    by its ``** -0.5`` (None: ``head_dim``'s); ``attn_softcap`` / ``final_softcap``: the scaled
    scores / the logits soft-capped to ``c * tanh(x / c)`` (None: not). Gemma 2 and 3 set these
    (:attr:`gemma`; Gemma 1 none of them). ``nope_layers``: the layers whose queries and keys are not rotated
    (SmolLM3's). ``rope_dim``: a partial rotation's rotated dims, the first of each query and key
    head (Phi-4-mini's 96 of 128: ``partial_rotary_factor``, GGUF ``rope.dimension_count``), the
    frequencies over them (:attr:`rotary_dims`); None (what a whole head's worth becomes): every
    dim is turned. ``embedding_multiplier``: the token embedding times it (Gemma's
    ``sqrt(hidden)``, Granite's ``embedding_multiplier``). Granite's other multipliers:
    ``residual_multiplier`` (each sublayer's output times it before it is added to the residual),
    ``attention_multiplier`` (the scores' scale in place of ``head_dim ** -0.5``: see
    :attr:`attention_scale`) and ``logit_scale`` (the logits divided by it); each is applied as a
    float32 constant, as transformers' float32 model and llama.cpp apply it. ``experts`` (0: a
    dense model), ``experts_used``, ``expert_ffn``, ``expert_norm``, ``expert_scale`` and
    ``dense_layers``: a mixture-of-experts MLP in every layer but ``dense_layers``
    (:mod:`tilework.llm.moe`, :meth:`moe_layer`); ``shared_ffn``: the width of its shared expert
    (0: none; Qwen2-MoE's). ``rms_eps``: the norms' eps, the LayerNorms' too (:attr:`layer_norm`)."""

    architecture: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float
    context_length: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    attention_out_bias: bool = False
    mlp_bias: bool = False
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    nope_layers: tuple[int, ...] = ()
    rope_dim: int | None = None
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logit_scale: float = 1.0
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    expert_norm: bool = False
    expert_scale: float = 1.0
    dense_layers: tuple[int, ...] = ()
    shared_ffn: int = 0

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise UnsupportedError(f"architecture {self.architecture!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context_length"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise TileworkError(f"LlmConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.heads % self.kv_heads:
            raise TileworkError(f"LlmConfig: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.rope_dim == self.head_dim:
            object.__setattr__(self, "rope_dim", None)  # a whole head's worth: the full rotation
        if self.rope_dim is not None and (not isinstance(self.rope_dim, int) or isinstance(self.rope_dim, bool) or not 2 <= self.rope_dim < self.head_dim or self.rope_dim % 2):
            raise TileworkError(f"LlmConfig.rope_dim must be None or a positive even int of at most head_dim ({self.head_dim}), got {self.rope_dim!r}")
        if self.rope_dim is None and self.head_dim % 2:
            raise TileworkError(f"LlmConfig: head_dim must be even for rotary embeddings, got {self.head_dim}")
        rs = self.rope_scaling
        factors = rs.short_factor if rs.type == "longrope" else rs.freq_factors
        if factors is not None and len(factors) != self.rotary_dims // 2:
            dims = f"head_dim {self.head_dim}" if self.rope_dim is None else f"rope_dim {self.rope_dim} (the rotated dims)"
            raise TileworkError(f"rope scaling {rs.type!r}: {len(factors)} factors for {dims} (it needs {self.rotary_dims // 2}, one a frequency)")
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        object.__setattr__(self, "sliding_layers", tuple(sorted(int(i) for i in self.sliding_layers)))
        if self.sliding_layers:
            if not isinstance(self.sliding_window, int) or self.sliding_window <= 0:
                raise TileworkError(f"LlmConfig: sliding layers need a positive int sliding_window, got {self.sliding_window!r}")
            if self.sliding_layers[0] < 0 or self.sliding_layers[-1] >= self.layers or len(set(self.sliding_layers)) != len(self.sliding_layers):
                raise TileworkError(f"LlmConfig: sliding_layers must be distinct layer indices below {self.layers}, got {list(self.sliding_layers)}")
        object.__setattr__(self, "nope_layers", tuple(sorted(int(i) for i in self.nope_layers)))
        if self.nope_layers and (self.nope_layers[0] < 0 or self.nope_layers[-1] >= self.layers or len(set(self.nope_layers)) != len(self.nope_layers)):
            raise TileworkError(f"LlmConfig: nope_layers must be distinct layer indices below {self.layers}, got {list(self.nope_layers)}")
        if self.query_pre_attn_scalar is not None and not self.query_pre_attn_scalar > 0:
            raise TileworkError(f"LlmConfig: query_pre_attn_scalar must be positive, got {self.query_pre_attn_scalar}")
        if self.attention_multiplier is not None and self.query_pre_attn_scalar is not None:
            raise TileworkError("LlmConfig: attention_multiplier and query_pre_attn_scalar both scale the scores: give one")
        for name in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logit_scale"):
            v = getattr(self, name)
            if v is None and name == "attention_multiplier":
                continue
            positive = name in ("attention_multiplier", "logit_scale")  # a scale of the scores, a divisor
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
                raise TileworkError(f"LlmConfig.{name} must be a finite number{' above 0' if positive else ''}, got {v!r}")
        object.__setattr__(self, "dense_layers", tuple(sorted(int(i) for i in self.dense_layers)))
        check_moe(self.experts, self.experts_used, self.expert_ffn, self.expert_scale, self.dense_layers, self.layers, self.shared_ffn)
        if self.head_bias and self.tie_word_embeddings:
            raise UnsupportedError(f"LlmConfig: a {self.architecture} head with a bias (lm_head.bias) tied to the embedding (tie_word_embeddings) is not supported")
        if self.experts and not self.gated_mlp:
            raise UnsupportedError(f"LlmConfig: a {self.architecture} model's MLP is not gated; its experts (experts = {self.experts}) would be")
        for name in ("attn_softcap", "final_softcap"):
            cap = getattr(self, name)
            if cap is not None and not (isinstance(cap, (int, float)) and not isinstance(cap, bool) and 0 < cap < math.inf):
                raise TileworkError(f"LlmConfig.{name} must be a positive finite number or None, got {cap!r}")

    @property
    def gemma(self) -> bool:
        """A Gemma decoder, 1, 2 or 3 (``tilework.llm.gemma``): the embedding scaled by
        ``sqrt(hidden)``, a GELU (tanh) gated MLP; its norm weights are the multipliers (``1 + w``
        of transformers' ``w``, as llama.cpp's GGUF files store them). Gemma 2's and 3's four
        norms a layer: :attr:`sandwich_norm`."""
        return self.architecture in ("gemma", "gemma2", "gemma3")

    @property
    def sandwich_norm(self) -> bool:
        """Gemma 2's and 3's layer: four norms, each sublayer's input and output normalized
        (``input_layernorm`` / ``post_attention_layernorm`` around the attention,
        ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm`` around the MLP), the
        output before the residual add. Gemma 1's is a Llama's two (``post_attention_layernorm``
        the one before the MLP)."""
        return self.architecture in ("gemma2", "gemma3")

    @property
    def prefill_boundary(self) -> int | None:
        """A position where a prefill step's results depend on where the step ends: longrope's
        original context (its factors are the long ones in a step that ends past it, for every
        position of the step, as transformers switches them per forward call), so the same
        tokens prefilled in other steps differ before it; None for every other model (its
        prefill gives a position the same result however the tokens are cut into steps)."""
        return self.rope_scaling.original_context if self.rope_scaling.type == "longrope" else None

    @property
    def layer_norm(self) -> bool:
        """Phi-2's and StarCoder2's norms: LayerNorms (the mean taken out, then scaled by
        ``weight`` and shifted by ``bias``; eps ``rms_eps``), where the others' are RMSNorms of a
        weight alone."""
        return self.architecture in LAYER_NORM

    @property
    def gated_mlp(self) -> bool:
        """The MLP is ``down(act(gate(x)) * up(x))``; Phi-2's and StarCoder2's are not gated:
        ``down(gelu_tanh(up(x)))`` (transformers' ``fc1`` / ``fc2``, ``c_fc`` / ``c_proj``, read
        as ``up_proj`` / ``down_proj``)."""
        return self.architecture not in UNGATED

    @property
    def parallel_residual(self) -> bool:
        """Phi-2's layer: one norm (``input_layernorm``) whose output both sublayers read, their
        outputs added to the layer's input together: ``x + attn(n) + mlp(n)``, ``n = norm(x)``."""
        return self.architecture == "phi2"

    @property
    def head_bias(self) -> bool:
        """The LM head has a bias (``lm_head.bias``; GGUF ``output.bias``): Phi-2's."""
        return self.architecture == "phi2"

    def moe_layer(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is a mixture of experts (:mod:`tilework.llm.moe`)."""
        return self.experts > 0 and layer not in self.dense_layers

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of ``layer``'s attention (None: it attends to every earlier token)."""
        return self.sliding_window if layer in self.sliding_layers else None

    @property
    def attention_scale(self) -> float | None:
        """What the attention's scores are multiplied by: Granite's ``attention_multiplier``, or
        Gemma's ``query_pre_attn_scalar ** -0.5`` (None: ``head_dim ** -0.5``)."""
        if self.attention_multiplier is not None:
            return float(self.attention_multiplier)
        return None if self.query_pre_attn_scalar is None else float(self.query_pre_attn_scalar) ** -0.5

    @property
    def post_norm(self) -> bool:
        """OLMo 2's and EXAONE 4's layer: each sublayer's input as it is (no
        ``input_layernorm``), its output normalized (``post_attention_layernorm``,
        ``post_feedforward_layernorm``) before the residual add."""
        return self.architecture in ("olmo2", "exaone4")

    @property
    def whole_qk_norm(self) -> bool:
        """OLMo 2's ``q_norm`` / ``k_norm``: over the whole projected queries and keys (``heads *
        head_dim`` and ``kv_heads * head_dim`` weights), before they are split into heads."""
        return self.architecture in ("olmo2", "olmoe")

    @property
    def qk_norm(self) -> bool:
        """Each query and key head goes through an RMSNorm of its own weights (``head_dim`` of
        them, ``self_attn.q_norm`` / ``self_attn.k_norm``, eps ``rms_eps``) before the rotary
        embedding: Qwen3's, Gemma 3's and EXAONE 4's attention (OLMo 2's over all heads together:
        :attr:`whole_qk_norm`)."""
        return self.architecture in ("qwen3", "qwen3moe", "gemma3", "olmo2", "olmoe", "exaone4")

    @property
    def rotary_dims(self) -> int:
        """The dims of each query and key head that are rotated, the first ones: ``rope_dim``
        (a partial rotation), else ``head_dim``."""
        return self.head_dim if self.rope_dim is None else self.rope_dim

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads

    def rope_inv_freq(self, step_end: int = 1) -> np.ndarray:
        """float32 ``[r // 2]`` for the ``r`` rotated dims (:attr:`rotary_dims`): the angle of pair
        ``i`` at position ``p`` is ``p * inv_freq[i]`` (rotate-half pairing: element ``i`` with
        ``i + r // 2``; the dims from ``r`` on are not turned); the cosines and sines
        are then multiplied by ``rope_scaling.attention_factor``. Computed in float64.
        ``step_end``: one past the last position of the step (a forward call) the angles are
        for, which ``longrope`` alone reads: its ``long_factor`` divides the frequencies of a
        step that ends past ``original_context``, ``short_factor`` those of the others
        (transformers' ``longrope_frequency_update``, with ``max(position_ids) + 1``)."""
        dims = self.rotary_dims
        inv = 1.0 / self.rope_theta ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
        rs = self.rope_scaling
        if rs.type == "yarn":
            low, high = rs.yarn_ramp(dims, self.rope_theta)
            ramp = np.clip((np.arange(dims // 2, dtype=np.float64) - low) / (high - low), 0, 1)
            inv = inv * (ramp / rs.factor + (1 - ramp))
        elif rs.type == "longrope":
            assert rs.original_context is not None and rs.short_factor is not None and rs.long_factor is not None
            inv = inv / np.asarray(rs.long_factor if step_end > rs.original_context else rs.short_factor, np.float64)
        elif rs.type == "freq_factors":
            inv = inv / np.asarray(rs.freq_factors, np.float64)
        elif rs.type == "linear":
            inv = inv / rs.factor
        elif rs.type == "llama3":
            assert rs.original_context is not None and rs.low_freq_factor is not None and rs.high_freq_factor is not None
            wavelen = 2 * math.pi / inv
            low_wavelen = rs.original_context / rs.low_freq_factor  # longer than this: divide by factor
            high_wavelen = rs.original_context / rs.high_freq_factor  # shorter than this: keep
            smooth = (rs.original_context / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
            blended = (1 - smooth) * inv / rs.factor + smooth * inv
            inv = np.where(wavelen > low_wavelen, inv / rs.factor, np.where(wavelen < high_wavelen, inv, blended))
        return inv.astype(np.float32)

    # ---- caching -------------------------------------------------------------------------

    def rope_op_scaling(self) -> tuple[Any, ...] | None:
        """``rope_scaling`` as ``tilework.op.paged_rotary`` takes it (None: unscaled), over the
        rotated dims (:attr:`rotary_dims`; the op's ``rope_dim`` is :attr:`rope_dim`)."""
        rs = self.rope_scaling
        if rs.type == "default":
            return None
        if rs.type == "linear":
            return ("linear", rs.factor)
        if rs.type == "llama3":
            return ("llama3", rs.factor, rs.original_context, rs.low_freq_factor, rs.high_freq_factor)
        if rs.type == "yarn":
            return ("yarn", rs.factor, *rs.yarn_ramp(self.rotary_dims, self.rope_theta), rs.attention_factor)
        if rs.type == "freq_factors":
            return ("freq_factors", rs.freq_factors)
        return ("longrope", rs.original_context, rs.attention_factor, rs.short_factor, rs.long_factor)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict; :meth:`from_dict` rebuilds an equal config."""
        d = asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LlmConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise TileworkError(f"LlmConfig.from_dict: unknown keys {unknown}")
        kw = dict(d)
        rope = kw.get("rope_scaling", {})
        kw["rope_scaling"] = RopeScaling(**rope) if isinstance(rope, Mapping) else rope
        kw["eos_token_ids"] = tuple(kw.get("eos_token_ids", ()))
        kw["sliding_layers"] = tuple(kw.get("sliding_layers", ()))
        kw["nope_layers"] = tuple(kw.get("nope_layers", ()))
        kw["dense_layers"] = tuple(kw.get("dense_layers", ()))
        return cls(**kw)

    # ---- GGUF ----------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, source: "str | os.PathLike[str] | GGUFFile | GGUFReader") -> "LlmConfig":
        """The config in a GGUF file's metadata (keys ``{arch}.block_count``, ...; ``arch`` is
        ``general.architecture``). The head is tied when the file has no ``output.weight``;
        biases are present when ``blk.0.attn_q.bias`` / ``blk.0.attn_output.bias`` /
        ``blk.0.ffn_up.bias`` are. ``qwen3``'s head dim is ``{arch}.attention.key_length``. A
        phi3 file's ``{arch}.rope.dimension_count`` below the head dim is a partial rotation
        (:attr:`rope_dim`, as llama.cpp's phi3 graph turns ``n_rot`` dims); its rotary factor
        tensors then hold ``rope.dimension_count / 2`` values."""
        from tilework.llm.gguf import FREQ_FACTORS_TENSOR, read_gguf

        gf = read_gguf(source)
        where, meta = gf.path, gf.metadata
        tensors = {t.name: t for t in gf.tensors}

        def get(key: str, default: Any = None) -> Any:
            return meta.get(key, default)

        def need(key: str) -> Any:
            if key not in meta:
                raise TileworkError(f"{where}: GGUF metadata has no {key!r}")
            return meta[key]

        arch = get("general.architecture")
        if arch not in ARCHITECTURES:
            raise UnsupportedError(f"{where}: architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
        longrope = [tensors.get(n) for n in ("rope_factors_short.weight", "rope_factors_long.weight")]
        if any(t is not None for t in longrope) and (arch != "phi3" or None in longrope):
            name = next(t.name for t in longrope if t is not None)
            raise UnsupportedError(f"{where}: per-frequency rotary factors for long contexts (tensor {name}: longrope scaling baked into the file) are read for phi3 files with both rope_factors_short and rope_factors_long only")
        hidden, heads = int(need(f"{arch}.embedding_length")), int(need(f"{arch}.attention.head_count"))
        head_dim = int(get(f"{arch}.attention.key_length", hidden // heads))
        value_dim = int(get(f"{arch}.attention.value_length", head_dim))
        rope_dim = int(get(f"{arch}.rope.dimension_count", head_dim))
        if value_dim != head_dim:
            raise UnsupportedError(f"{where}: key length {head_dim} != value length {value_dim} is not supported")
        if rope_dim != head_dim and arch not in PARTIAL_ROTARY:  # (llama.cpp's graphs of the others want every dim turned)
            raise UnsupportedError(f"{where}: partial rotary embeddings ({arch}.rope.dimension_count = {rope_dim}, head_dim {head_dim}) are supported for {' and '.join(PARTIAL_ROTARY)} files only")
        vocab = get(f"{arch}.vocab_size")
        if vocab is None:
            tokens = meta.get("tokenizer.ggml.tokens")
            vocab = len(tokens) if tokens is not None else int(tensors["token_embd.weight"].shape[0])
        eos = [get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
        bos = get("tokenizer.ggml.bos_token_id")
        layers = int(need(f"{arch}.block_count"))
        context = int(need(f"{arch}.context_length"))
        extra: dict[str, Any] = {}
        if arch in ("gemma", "gemma2", "gemma3"):
            from tilework.llm.gemma import gguf_fields

            extra = gguf_fields(get, arch, where, layers, hidden, heads, head_dim)
        if arch == "smollm3":  # llama.cpp's fixed step: no GGUF key states it
            extra = {"nope_layers": tuple(i for i in range(layers) if (i + 1) % NOPE_INTERVAL == 0)}
        if arch in ("granite", "granitemoe"):
            extra = _gguf_granite(get, need, arch, layers)
        if arch == "exaone4":
            extra = _gguf_exaone4(get, arch, where, layers)
        extra.update(gguf_moe(get, arch, where, layers, int(need(f"{arch}.feed_forward_length")), tensors))
        # phi3: {arch}.attention.sliding_window is not applied: llama.cpp attends to every earlier
        # token in phi3 files (transformers, from a checkpoint, does apply Phi-3's window)
        long_scaling = gguf_longrope(gf, longrope, get, arch, where, rope_dim, context) if longrope[0] is not None else None
        return cls(
            architecture=arch,
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=int(get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=head_dim,
            ffn=int(need(f"{arch}.feed_forward_length")),
            vocab=int(vocab),
            rope_theta=f32_value(get(f"{arch}.rope.freq_base", 10000.0)),
            rms_eps=f32_value(need(f"{arch}.attention.layer_norm_epsilon" if arch in LAYER_NORM else f"{arch}.attention.layer_norm_rms_epsilon")),
            context_length=context,
            tie_word_embeddings="output.weight" not in tensors,
            attention_bias="blk.0.attn_q.bias" in tensors or "blk.0.attn_qkv.bias" in tensors,
            attention_out_bias="blk.0.attn_output.bias" in tensors,
            mlp_bias="blk.0.ffn_up.bias" in tensors,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=tuple(dict.fromkeys(int(t) for t in eos if t is not None)),
            rope_scaling=gguf_rope_scaling(get, arch, where, gguf_freq_factors(gf, tensors.get(FREQ_FACTORS_TENSOR), rope_dim), long_scaling),
            rope_dim=rope_dim,
            **extra,
        )

    # ---- transformers --------------------------------------------------------------------

    @classmethod
    def from_hf_config(cls, source: "Mapping[str, Any] | str | os.PathLike[str]") -> "LlmConfig":
        """The config of a transformers checkpoint: a ``config.json`` dict, its path, or the
        checkpoint directory. Missing optional keys take the transformers class defaults.

        ``model_type`` ``llama``, ``qwen2``, ``qwen3``, ``smollm3``, ``olmo2``, ``exaone4``, ``ernie4_5``, ``granite``, ``phi3`` (longrope also under
        its early name ``su``) or ``mistral`` (llama with a sliding window: it reads as ``llama``);
        ``gemma``, ``gemma2``, ``gemma3_text`` and ``gemma3`` (its text part) are read by
        :func:`tilework.llm.gemma.hf_fields`. The layers that attend in a sliding window
        (Mistral's and Phi-3's ``sliding_window``, Qwen2's and Qwen3's with ``use_sliding_window``)
        attend in it (``sliding_layers``: ``_hf_sliding_window``), as transformers' mask does."""
        d, where = _hf_config_dict(source)
        model_type = d.get("model_type")
        if model_type in ("gemma", "gemma2", "gemma3_text", "gemma3"):  # Gemma's decoders: their own reading
            from tilework.llm.gemma import hf_fields

            return cls(**hf_fields(d, where, hf_rope))
        if model_type not in _HF_DEFAULTS:
            raise UnsupportedError(f"{where}: model_type {model_type!r} is not supported; supported: {', '.join(_HF_DEFAULTS)}, gemma, gemma2, gemma3_text, gemma3")
        defaults = _HF_DEFAULTS[model_type]

        get, need = key_reader(d, defaults, where)
        acts = _HF_ACTIVATIONS.get(model_type, ("silu",))
        if get("hidden_act") not in acts:
            raise UnsupportedError(f"{where}: hidden_act {get('hidden_act')!r} is not supported (only {' or '.join(map(repr, acts))})")
        if model_type == "phi" and get("qk_layernorm"):
            raise UnsupportedError(f"{where}: qk_layernorm = true is not supported (LayerNorms of the queries and keys)")
        if model_type == "phi" and get("tie_word_embeddings"):
            raise UnsupportedError(f"{where}: tie_word_embeddings = true is not supported for phi (its head has a bias of its own, lm_head.bias)")
        if model_type in ("qwen2", "qwen2_moe"):
            qkv_bias, out_bias = True, False
        elif model_type == "phi3":  # no biases (its projections are fused in the file: weights.split_fused)
            qkv_bias = out_bias = False
        elif model_type == "phi":  # every projection has a bias
            qkv_bias = out_bias = True
        elif model_type in ("ernie4_5", "starcoder2"):  # use_bias: every projection's, the MLP's too
            qkv_bias = out_bias = bool(get("use_bias"))  # (absent: ERNIE's False, StarCoder2's True)
        else:  # llama, mistral, qwen3, smollm3, olmo2, exaone4, granite: q, k, v and o alike
            qkv_bias = out_bias = bool(d.get("attention_bias", False))
        hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        context = int(get("max_position_embeddings"))
        if model_type == "exaone4":
            sliding, nope = _hf_exaone4_layers(d, int(need("num_hidden_layers")), context, where)
        else:
            sliding = _hf_sliding_window(d, model_type, int(need("num_hidden_layers")), context, where)
            nope = _hf_nope_layers(d, int(need("num_hidden_layers")), where) if model_type == "smollm3" else ()
        theta, scaling = hf_rope(d, get, where, partial=model_type in ("phi3", "phi"))
        head_dim = int(d.get("head_dim", defaults.get("head_dim")) or hidden // heads)  # absent: the class default (Qwen3's 128)
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(t) for t in eos) if isinstance(eos, list) else (int(eos),)
        if d.get("clip_qkv") is not None:
            raise UnsupportedError(f"{where}: clip_qkv = {d['clip_qkv']} is not supported (the projected queries, keys and values clipped)")
        return cls(
            architecture=_HF_ARCHITECTURE.get(model_type, model_type),
            hidden=hidden,
            layers=int(need("num_hidden_layers")),
            heads=heads,
            kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=head_dim,
            ffn=int(need("intermediate_size")),
            vocab=int(need("vocab_size")),
            rope_theta=theta,
            rms_eps=float(get(_HF_EPS.get(model_type, "rms_norm_eps"))),
            context_length=context,
            tie_word_embeddings=bool(get("tie_word_embeddings")),
            attention_bias=qkv_bias,
            attention_out_bias=out_bias,
            mlp_bias=_hf_mlp_bias(d, get, model_type),
            rope_scaling=scaling,
            bos_token_id=None if d.get("bos_token_id") is None else int(d["bos_token_id"]),
            eos_token_ids=eos_ids,
            nope_layers=nope,
            rope_dim=hf_rope_dim(d, head_dim, where, 0.5 if model_type == "phi" else 1.0) if model_type in ("phi3", "phi") else None,
            **sliding,
            **(_hf_granite(get) if model_type in ("granite", "granitemoe") else {}),
            **hf_moe(d, model_type, where, int(need("num_hidden_layers"))),
        )


def _hf_mlp_bias(d: Mapping[str, Any], get: Callable[[str], Any], model_type: str) -> bool:
    """Whether the MLP's projections have biases: ERNIE's and StarCoder2's ``use_bias``, llama's
    ``mlp_bias`` (SmolLM3's, Granite's), always Phi's (``fc1``, ``fc2``); Mistral's, Qwen2's,
    Qwen3's never."""
    if model_type in ("ernie4_5", "starcoder2"):
        return bool(get("use_bias"))
    if model_type == "phi":
        return True
    return model_type in ("llama", "smollm3", "granite") and bool(d.get("mlp_bias", False))


# the activations a model type's MLP may name (silu where absent): GELU's tanh form under its names
_HF_ACTIVATIONS = {"phi": ("gelu_new", "gelu_pytorch_tanh"), "starcoder2": ("gelu_pytorch_tanh", "gelu_new")}
# the key of a model type's norms' eps where it is not rms_norm_eps
_HF_EPS = {"phi": "layer_norm_eps", "starcoder2": "norm_epsilon"}
_QWEN = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")  # the model types of Qwen2Config's sliding-window keys
# the architecture (LlmConfig.architecture, GGUF's name) of a transformers model type where they differ
_HF_ARCHITECTURE = {"mistral": "llama", "mixtral": "llama", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "phi": "phi2"}  # (starcoder2 is itself)
# the transformers class defaults (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, ...) of the keys a
# config.json may omit; the model types read
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "tie_word_embeddings": False, "rope_theta": 10000.0},
    "mistral": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "tie_word_embeddings": False, "rope_theta": 10000.0, "sliding_window": 4096},
    "qwen2": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False, "rope_theta": 10000.0},
    "qwen3": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False, "rope_theta": 10000.0, "head_dim": 128},
    "phi3": {"hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "tie_word_embeddings": False, "rope_theta": 10000.0},
    "smollm3": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": True, "rope_theta": 2000000.0},
    "olmo2": {"hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "tie_word_embeddings": False, "rope_theta": 10000.0},
    "ernie4_5": {"hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "tie_word_embeddings": True, "rope_theta": 500000.0, "head_dim": 128},
    "exaone4": {"hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "tie_word_embeddings": False, "rope_theta": 10000.0, "sliding_window": 4096},
    "mixtral": {"hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "tie_word_embeddings": False, "rope_theta": 1000000.0},
    "qwen2_moe": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False, "rope_theta": 10000.0},
    "qwen3_moe": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False, "rope_theta": 10000.0, "head_dim": 128},
    "olmoe": {"hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "tie_word_embeddings": False, "rope_theta": 10000.0},
    "granitemoe": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "tie_word_embeddings": False, "rope_theta": 10000.0,
                   "embedding_multiplier": 1.0, "residual_multiplier": 1.0, "attention_multiplier": 1.0, "logits_scaling": 1.0},
    "phi": {"hidden_act": "gelu_new", "layer_norm_eps": 1e-5, "max_position_embeddings": 2048, "tie_word_embeddings": False, "rope_theta": 10000.0, "qk_layernorm": False},
    "starcoder2": {"hidden_act": "gelu_pytorch_tanh", "norm_epsilon": 1e-5, "max_position_embeddings": 4096, "tie_word_embeddings": True, "rope_theta": 10000.0, "use_bias": True},
    "granite": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "tie_word_embeddings": False, "rope_theta": 10000.0,
                "embedding_multiplier": 1.0, "residual_multiplier": 1.0, "attention_multiplier": 1.0, "logits_scaling": 1.0},
}


def _hf_granite(get: Callable[[str], Any]) -> dict[str, Any]:
    """GraniteConfig's multipliers (each 1.0 where absent: an absent ``attention_multiplier``
    scales the scores by 1, not by ``head_dim ** -0.5``); ``logits_scaling`` divides the logits."""
    return {
        "embedding_multiplier": float(get("embedding_multiplier")),
        "residual_multiplier": float(get("residual_multiplier")),
        "attention_multiplier": float(get("attention_multiplier")),
        "logit_scale": float(get("logits_scaling")),
    }


def _hf_nope_layers(d: Mapping[str, Any], layers: int, where: str) -> tuple[int, ...]:
    """SmolLM3's layers without the rotary embedding: the zeros of ``no_rope_layers`` (one flag
    a layer, 1: rotated), else every ``no_rope_layer_interval``-th layer (4), as SmolLM3Config
    makes them."""
    flags = d.get("no_rope_layers")
    if flags is None:
        interval = int(d.get("no_rope_layer_interval") or NOPE_INTERVAL)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(flags) != layers or any(f not in (0, 1) for f in flags):
        raise UnsupportedError(f"{where}: no_rope_layers {list(flags)} is not supported (a 0 or 1 for each of the {layers} layers)")
    return tuple(i for i, f in enumerate(flags) if not f)


def _gguf_granite(get: Callable[..., Any], need: Callable[[str], Any], arch: str, layers: int) -> dict[str, Any]:
    """A granite file's multipliers, as llama.cpp reads them: ``{arch}.embedding_scale`` and
    ``{arch}.residual_scale`` (absent or 0: none), ``{arch}.attention.scale`` (absent or 0:
    ``head_dim ** -0.5``), ``{arch}.logit_scale`` (required: llama.cpp refuses a file without
    it); ``{arch}.rope.scaling.finetuned`` false: no layer is rotated (llama.cpp's switch for
    Granite, whose default is true)."""

    def scale(key: str) -> float | None:
        v = get(key)
        return None if v is None or float(v) == 0.0 else f32_value(v)

    unrotated = get(f"{arch}.rope.scaling.finetuned") is False
    return {
        "embedding_multiplier": scale(f"{arch}.embedding_scale") or 1.0,
        "residual_multiplier": scale(f"{arch}.residual_scale") or 1.0,
        "attention_multiplier": scale(f"{arch}.attention.scale"),
        "logit_scale": f32_value(need(f"{arch}.logit_scale")),
        "nope_layers": tuple(range(layers)) if unrotated else (),
    }


def _hf_config_dict(source: "Mapping[str, Any] | str | os.PathLike[str]") -> tuple[dict[str, Any], str]:
    if isinstance(source, Mapping):
        return dict(source), "config"
    path = os.fspath(source)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise TileworkError(f"{path}: no such config file")
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise TileworkError(f"{path}: not a readable JSON config ({e})") from e
    if not isinstance(d, dict):
        raise TileworkError(f"{path}: a config must be a JSON object")
    return d, path


def _hf_sliding_window(d: Mapping[str, Any], model_type: str, layers: int, context: int, where: str) -> dict[str, Any]:
    """The config fields (``sliding_window``, ``sliding_layers``) of the layers that attend in a
    sliding window, as transformers decides them: Mistral's ``sliding_window`` (null: none,
    absent: MistralConfig's 4096) and Phi-3's, every layer; Qwen2's, Qwen3's and SmolLM3's when
    ``use_sliding_window`` and a layer is a ``sliding_attention`` one (``layer_types``, else the
    layers from ``max_window_layers`` on; SmolLM3's: its layers without rotation). None where the window is no shorter than the context."""
    if model_type == "mistral":
        window = d["sliding_window"] if "sliding_window" in d else _HF_DEFAULTS["mistral"]["sliding_window"]
    elif model_type in ("phi3", "mixtral", "starcoder2"):
        window = d.get("sliding_window")
    elif model_type in (*_QWEN, "smollm3") and d.get("use_sliding_window"):
        window = d.get("sliding_window", 4096 if model_type != "smollm3" else None)
    else:
        window = None
    types = d.get("layer_types")
    if types is None and model_type == "smollm3":  # SmolLM3Config: its layers without rotation slide
        nope = _hf_nope_layers(d, layers, where)
        types = ["sliding_attention" if window is not None and i in nope else "full_attention" for i in range(layers)]
    elif types is None:
        first = d.get("max_window_layers", 28) if model_type in _QWEN else 0
        types = ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(layers)]
    sliding = sliding_layers(types, None, where)
    if window is None or not sliding or int(window) >= context:
        return {}
    return {"sliding_window": int(window), "sliding_layers": sliding}


def _exaone4_pattern(pattern: Any, layers: int, where: str) -> tuple[int, ...]:
    """The sliding layers of EXAONE 4's ``sliding_window_pattern``: an int ``n`` (every ``n``-th
    layer global), a string of ``L`` (local) and ``G`` (global) repeated over the layers, or one
    flag a layer (a GGUF file's array)."""
    if isinstance(pattern, bool) or pattern is None:
        raise UnsupportedError(f"{where}: sliding_window_pattern {pattern!r} is not supported")
    if isinstance(pattern, int):
        return tuple(i for i in range(layers) if pattern > 0 and (i + 1) % pattern)
    if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
        return tuple(i for i in range(layers) if pattern[i % len(pattern)] == "L")
    if isinstance(pattern, (list, tuple)) and len(pattern) == layers:
        return tuple(i for i, flag in enumerate(pattern) if flag)
    raise UnsupportedError(f"{where}: sliding_window_pattern {pattern!r} is not supported (an int, a string of L and G, or a flag for each of the {layers} layers)")


def _hf_exaone4_layers(d: Mapping[str, Any], layers: int, context: int, where: str) -> tuple[dict[str, Any], tuple[int, ...]]:
    """EXAONE 4's sliding-window fields and its layers without rotation, as Exaone4Config and its
    attention decide them: with a ``sliding_window`` (absent: 4096) the ``sliding_attention``
    layers (``layer_types``, else ``sliding_window_pattern``: 4) attend in it and the others are
    global and not rotated; with ``sliding_window`` null every layer is global and rotated. The
    window's fields are left out where it is no shorter than the context (it cuts nothing); the
    global layers stay unrotated."""
    window = d["sliding_window"] if "sliding_window" in d else _HF_DEFAULTS["exaone4"]["sliding_window"]
    if window is None:
        return {}, ()
    types = d.get("layer_types")
    if types is None:
        sliding = _exaone4_pattern(d.get("sliding_window_pattern", 4), layers, where)
    else:
        sliding = sliding_layers(types, layers, where)
    nope = tuple(i for i in range(layers) if i not in sliding)
    fields = {"sliding_window": int(window), "sliding_layers": sliding} if sliding and int(window) < context else {}
    return fields, nope


def _gguf_exaone4(get: Callable[..., Any], arch: str, where: str, layers: int) -> dict[str, Any]:
    """An exaone4 file's sliding layers and unrotated layers, as llama.cpp reads them: a window
    ``{arch}.attention.sliding_window`` makes the layers ``{arch}.attention.sliding_window_pattern``
    flags sliding (rotated) and the others global without rotation; no window: every layer
    global and rotated."""
    window = int(get(f"{arch}.attention.sliding_window") or 0)
    if not window:
        return {}
    sliding = _exaone4_pattern(get(f"{arch}.attention.sliding_window_pattern", 4), layers, where)
    return {"sliding_window": window, "sliding_layers": sliding, "nope_layers": tuple(i for i in range(layers) if i not in sliding)}

"""The hyperparameters of a llama-family decoder: :class:`LlmConfig`.

One value describes the model whatever file it came from: a GGUF file's metadata
(:meth:`LlmConfig.from_gguf`) or a transformers ``config.json`` (:meth:`LlmConfig.from_hf_config`).
Three architectures are read: ``llama``, ``qwen2`` (llama with biases on the q, k and v
projections) and ``qwen3`` (llama with an RMSNorm over each query and key head, ``q_norm`` /
``k_norm``, before the rotary embedding; its ``head_dim`` need not be ``hidden / heads``); a
transformers ``mistral`` checkpoint is ``llama``, and a model with
sliding-window attention has its context cut to the window. Anything the model family could
vary that tilework does not implement (another rotary scaling, a partial rotary dim, experts)
raises :class:`~tilework.errors.UnsupportedError` naming it, rather than loading a model that
would compute something else.

Rotary scaling (``rope_scaling``) is exact for ``default``, ``dynamic`` (the default within the
context, ``max_position_embeddings``: it changes the frequencies of longer sequences only),
``linear`` (every inverse frequency divided by ``factor``) and ``llama3`` (low frequencies
divided by ``factor``, high ones kept, a smooth blend between; as
``transformers.modeling_rope_utils``): :meth:`LlmConfig.rope_inv_freq`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from tilework.errors import TileworkError, UnsupportedError

if TYPE_CHECKING:
    from gguf import GGUFReader

    from tilework.llm.gguf import GGUFFile

ARCHITECTURES = ("llama", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """How the rotary inverse frequencies are scaled. ``original_context``,
    ``low_freq_factor`` and ``high_freq_factor`` are used by ``llama3`` only."""

    type: str = "default"
    factor: float = 1.0
    original_context: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None

    def __post_init__(self) -> None:
        if self.type not in ROPE_TYPES:
            raise UnsupportedError(f"rope scaling {self.type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
        if self.factor <= 0:
            raise TileworkError(f"rope scaling {self.type!r}: factor must be positive, got {self.factor}")
        if self.type == "llama3":
            if self.original_context is None or self.low_freq_factor is None or self.high_freq_factor is None:
                raise TileworkError("rope scaling 'llama3' needs original_context, low_freq_factor and high_freq_factor")
            if self.high_freq_factor <= self.low_freq_factor:
                raise TileworkError(f"rope scaling 'llama3': high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor ({self.low_freq_factor})")


@dataclass(frozen=True, slots=True)
class LlmConfig:
    """A llama-family decoder. ``attention_bias``: q, k, v projections have biases;
    ``attention_out_bias``: the output projection has one too (llama's ``attention_bias``
    sets both, qwen2 has the first only); ``mlp_bias``: the gate, up and down projections have
    biases (llama's ``mlp_bias``). ``eos_token_ids``: every token that ends generation. A
    ``qwen3`` model normalizes each query and key head (:attr:`qk_norm`)."""

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

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise UnsupportedError(f"architecture {self.architecture!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context_length"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise TileworkError(f"LlmConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.heads % self.kv_heads:
            raise TileworkError(f"LlmConfig: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise TileworkError(f"LlmConfig: head_dim must be even for rotary embeddings, got {self.head_dim}")
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))

    @property
    def qk_norm(self) -> bool:
        """Each query and key head goes through an RMSNorm of its own weights (``head_dim`` of
        them, ``self_attn.q_norm`` / ``self_attn.k_norm``, eps ``rms_eps``) before the rotary
        embedding: Qwen3's attention."""
        return self.architecture == "qwen3"

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads

    def rope_inv_freq(self) -> np.ndarray:
        """float32 ``[head_dim // 2]``: the angle of pair ``i`` at position ``p`` is ``p * inv_freq[i]``
        (rotate-half pairing: element ``i`` with ``i + head_dim // 2``). Computed in float64."""
        inv = 1.0 / self.rope_theta ** (np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        rs = self.rope_scaling
        if rs.type == "linear":
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
        return cls(**kw)

    # ---- GGUF ----------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, source: "str | os.PathLike[str] | GGUFFile | GGUFReader") -> "LlmConfig":
        """The config in a GGUF file's metadata (keys ``{arch}.block_count``, ...; ``arch`` is
        ``general.architecture``). The head is tied when the file has no ``output.weight``;
        biases are present when ``blk.0.attn_q.bias`` / ``blk.0.attn_output.bias`` /
        ``blk.0.ffn_up.bias`` are. ``qwen3``'s head dim is ``{arch}.attention.key_length``."""
        from tilework.llm.gguf import read_gguf

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
        if get(f"{arch}.expert_count", 0):
            raise UnsupportedError(f"{where}: mixture-of-experts models ({arch}.expert_count = {get(f'{arch}.expert_count')}) are not supported")
        if "rope_freqs.weight" in tensors:
            raise UnsupportedError(f"{where}: per-frequency rotary factors (tensor rope_freqs.weight, llama3-style scaling baked into the file) are not supported")
        hidden, heads = int(need(f"{arch}.embedding_length")), int(need(f"{arch}.attention.head_count"))
        head_dim = int(get(f"{arch}.attention.key_length", hidden // heads))
        value_dim = int(get(f"{arch}.attention.value_length", head_dim))
        rope_dim = int(get(f"{arch}.rope.dimension_count", head_dim))
        if value_dim != head_dim:
            raise UnsupportedError(f"{where}: key length {head_dim} != value length {value_dim} is not supported")
        if rope_dim != head_dim:
            raise UnsupportedError(f"{where}: partial rotary embeddings ({arch}.rope.dimension_count = {rope_dim}, head_dim {head_dim}) are not supported")
        vocab = get(f"{arch}.vocab_size")
        if vocab is None:
            tokens = meta.get("tokenizer.ggml.tokens")
            vocab = len(tokens) if tokens is not None else int(tensors["token_embd.weight"].shape[0])
        eos = [get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
        bos = get("tokenizer.ggml.bos_token_id")
        return cls(
            architecture=arch,
            hidden=hidden,
            layers=int(need(f"{arch}.block_count")),
            heads=heads,
            kv_heads=int(get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=head_dim,
            ffn=int(need(f"{arch}.feed_forward_length")),
            vocab=int(vocab),
            rope_theta=_f32_value(get(f"{arch}.rope.freq_base", 10000.0)),
            rms_eps=_f32_value(need(f"{arch}.attention.layer_norm_rms_epsilon")),
            context_length=int(need(f"{arch}.context_length")),
            tie_word_embeddings="output.weight" not in tensors,
            attention_bias="blk.0.attn_q.bias" in tensors,
            attention_out_bias="blk.0.attn_output.bias" in tensors,
            mlp_bias="blk.0.ffn_up.bias" in tensors,
            rope_scaling=_gguf_rope_scaling(get, arch, where),
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=tuple(dict.fromkeys(int(t) for t in eos if t is not None)),
        )

    # ---- transformers --------------------------------------------------------------------

    @classmethod
    def from_hf_config(cls, source: "Mapping[str, Any] | str | os.PathLike[str]") -> "LlmConfig":
        """The config of a transformers checkpoint: a ``config.json`` dict, its path, or the
        checkpoint directory. Missing optional keys take the transformers class defaults.

        ``model_type`` ``llama``, ``qwen2``, ``qwen3`` or ``mistral`` (llama with a sliding window:
        it reads as ``llama``). A model whose layers attend in a sliding window (Mistral's, Qwen2's
        and Qwen3's with ``use_sliding_window``) has a context of at most the window: a sequence that fits in the
        window attends to every earlier token, exactly what the decoder does; a longer one is
        refused as any prompt past the context is."""
        d, where = _hf_config_dict(source)
        model_type = d.get("model_type")
        if model_type not in _HF_DEFAULTS:
            raise UnsupportedError(f"{where}: model_type {model_type!r} is not supported; supported: {', '.join(_HF_DEFAULTS)}")
        defaults = _HF_DEFAULTS[model_type]

        def get(key: str) -> Any:
            v = d.get(key)
            return defaults.get(key) if v is None else v

        def need(key: str) -> Any:
            if d.get(key) is None:
                raise TileworkError(f"{where}: config has no {key!r}")
            return d[key]

        if get("hidden_act") != "silu":
            raise UnsupportedError(f"{where}: hidden_act {get('hidden_act')!r} is not supported (only 'silu')")
        if model_type == "qwen2":
            qkv_bias, out_bias = True, False
        else:  # llama, mistral, qwen3: q, k, v and o alike
            qkv_bias = out_bias = bool(d.get("attention_bias", False))
        hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        context = int(get("max_position_embeddings"))
        window = _hf_sliding_window(d, model_type, int(need("num_hidden_layers")), where)
        if window is not None:
            context = min(context, window)  # within the window it masks nothing
        theta, scaling = _hf_rope(d, get, where)
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else tuple(int(t) for t in eos) if isinstance(eos, list) else (int(eos),)
        return cls(
            architecture="llama" if model_type == "mistral" else model_type,
            hidden=hidden,
            layers=int(need("num_hidden_layers")),
            heads=heads,
            kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            ffn=int(need("intermediate_size")),
            vocab=int(need("vocab_size")),
            rope_theta=theta,
            rms_eps=float(get("rms_norm_eps")),
            context_length=context,
            tie_word_embeddings=bool(get("tie_word_embeddings")),
            attention_bias=qkv_bias,
            attention_out_bias=out_bias,
            mlp_bias=model_type == "llama" and bool(d.get("mlp_bias", False)),  # (Mistral, Qwen2 and Qwen3 have none)
            rope_scaling=scaling,
            bos_token_id=None if d.get("bos_token_id") is None else int(d["bos_token_id"]),
            eos_token_ids=eos_ids,
        )


# the transformers class defaults (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config) of the keys a
# config.json may omit; the model types read
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "tie_word_embeddings": False, "rope_theta": 10000.0},
    "mistral": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "tie_word_embeddings": False, "rope_theta": 10000.0, "sliding_window": 4096},
    "qwen2": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False, "rope_theta": 10000.0},
    "qwen3": {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False, "rope_theta": 10000.0},
}


def _f32_value(v: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-5, not
    9.999999747378752e-06): the value the model's authors wrote."""
    return float(str(np.float32(v)))


def _gguf_rope_scaling(get: Callable[..., Any], arch: str, where: str) -> RopeScaling:
    kind = get(f"{arch}.rope.scaling.type")
    factor = get(f"{arch}.rope.scaling.factor")
    if kind is None:
        linear = get(f"{arch}.rope.scale_linear")  # the key of older files
        return RopeScaling("linear", _f32_value(linear)) if linear not in (None, 1.0) else RopeScaling()
    if kind == "none":
        return RopeScaling()
    if kind == "linear" and factor is not None:
        return RopeScaling("linear", _f32_value(factor))
    raise UnsupportedError(f"{where}: rope scaling {kind!r} ({arch}.rope.scaling.type) is not supported; supported: none, linear")


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


def _hf_sliding_window(d: Mapping[str, Any], model_type: str, layers: int, where: str) -> int | None:
    """The sliding window of the model's attention when a layer has one, as transformers decides
    it: Mistral's ``sliding_window`` (null: none, absent: MistralConfig's 4096); Qwen2's and
    Qwen3's when ``use_sliding_window`` and a layer is a ``sliding_attention`` one (``layer_types``, else
    the layers from ``max_window_layers`` on)."""
    if model_type == "mistral":
        window = d["sliding_window"] if "sliding_window" in d else _HF_DEFAULTS["mistral"]["sliding_window"]
    elif model_type in ("qwen2", "qwen3") and d.get("use_sliding_window"):
        window = d.get("sliding_window", 4096)
    else:
        window = None
    types = d.get("layer_types")
    if types is None:
        first = d.get("max_window_layers", 28) if model_type in ("qwen2", "qwen3") else 0
        types = ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(layers)]
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise UnsupportedError(f"{where}: layer types {unknown} (layer_types) are not supported; supported: full_attention, sliding_attention")
    return int(window) if window is not None and "sliding_attention" in types else None


def _hf_rope(d: Mapping[str, Any], get: Callable[[str], Any], where: str) -> tuple[float, RopeScaling]:
    """``(rope_theta, scaling)`` from ``rope_parameters`` (transformers 5) or ``rope_theta`` +
    ``rope_scaling`` (earlier versions)."""
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, Mapping) or any(isinstance(v, Mapping) for v in params.values()):
        raise UnsupportedError(f"{where}: per-layer-type rope parameters are not supported")
    theta = float(params.get("rope_theta") or get("rope_theta"))
    partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise UnsupportedError(f"{where}: partial rotary embeddings (partial_rotary_factor = {partial}) are not supported")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in ("default", "dynamic"):
        # dynamic NTK scales theta by (factor * seq / max_position_embeddings - factor + 1) once
        # a sequence is longer than max_position_embeddings, the context: never within it
        return theta, RopeScaling()
    if kind == "linear":
        return theta, RopeScaling("linear", float(params["factor"]))
    if kind == "llama3":
        original = params.get("original_max_position_embeddings") or get("max_position_embeddings")
        return theta, RopeScaling("llama3", float(params["factor"]), int(original), float(params["low_freq_factor"]), float(params["high_freq_factor"]))
    raise UnsupportedError(f"{where}: rope scaling {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}")

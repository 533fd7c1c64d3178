"""Rotary embeddings' scaling: :class:`RopeScaling`, and how a GGUF file's metadata and tensors
(:func:`gguf_rope_scaling`) and a transformers config (:func:`hf_rope`, :func:`hf_rope_dim`)
state it, read as llama.cpp and transformers read them. ``tilework.llm.config`` keeps one in
each :class:`~tilework.llm.config.LlmConfig` (whose ``rope_inv_freq`` computes the scaled
frequencies).

Rotary scaling (``rope_scaling``) is exact for ``default``, ``dynamic`` (the default within the
context, ``max_position_embeddings``: it changes the frequencies of longer sequences only),
``linear`` (every inverse frequency divided by ``factor``), ``llama3`` (low frequencies
divided by ``factor``, high ones kept, a smooth blend between), ``yarn`` (a linear ramp over the
frequency index between kept and divided by ``factor``, the cosines and sines multiplied by its
attention factor) and ``longrope`` (each frequency divided by its ``short_factor``, or by its
``long_factor`` in a step that ends past ``original_max_position_embeddings``, as transformers
switches per forward call; the attention factor too); as ``transformers.modeling_rope_utils``:
:meth:`~tilework.llm.config.LlmConfig.rope_inv_freq`. A GGUF file may instead hold one divisor per frequency in a
``rope_freqs`` tensor (llama.cpp's converter stores ``llama3`` scaling so): ``freq_factors``,
each frequency divided by its factor, as llama.cpp does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from tilework.errors import TileworkError, UnsupportedError

if TYPE_CHECKING:
    from tilework.llm.gguf import GGUFFile

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "freq_factors")
HF_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "dynamic")  # the names a transformers config uses


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """How the rotary inverse frequencies are scaled (see :meth:`~tilework.llm.config.LlmConfig.rope_inv_freq`).
    ``original_context``: the pretraining context of ``llama3``, ``yarn`` and ``longrope``;
    ``low_freq_factor`` / ``high_freq_factor``: ``llama3``'s bands; ``beta_fast``,
    ``beta_slow``, ``truncate``: ``yarn``'s ramp; ``short_factor`` / ``long_factor``:
    ``longrope``'s per-frequency divisors (``rotary_dims / 2`` each); ``freq_factors``: the divisors
    of ``freq_factors`` (a GGUF file's ``rope_freqs`` tensor, ``rotary_dims / 2`` of them: how
    llama.cpp's converter stores ``llama3`` scaling, applied as llama.cpp applies it);
    ``attention_factor``: what the cosines and sines are multiplied by (``yarn``, ``longrope``:
    transformers' ``attention_scaling``, resolved from the file's keys when it does not give one)."""

    type: str = "default"
    factor: float = 1.0
    original_context: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    attention_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.type not in ROPE_TYPES:
            raise UnsupportedError(f"rope scaling {self.type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
        if self.factor <= 0:
            raise TileworkError(f"rope scaling {self.type!r}: factor must be positive, got {self.factor}")
        if not self.attention_factor > 0:
            raise TileworkError(f"rope scaling {self.type!r}: attention_factor must be positive, got {self.attention_factor}")
        if self.type in ("llama3", "yarn", "longrope") and (self.original_context is None or self.original_context <= 0):
            raise TileworkError(f"rope scaling {self.type!r} needs a positive original_context (original_max_position_embeddings), got {self.original_context}")
        if self.type == "llama3":
            if self.low_freq_factor is None or self.high_freq_factor is None:
                raise TileworkError("rope scaling 'llama3' needs original_context, low_freq_factor and high_freq_factor")
            if self.high_freq_factor <= self.low_freq_factor:
                raise TileworkError(f"rope scaling 'llama3': high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor ({self.low_freq_factor})")
        for name in ("short_factor", "long_factor", "freq_factors"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(float(x) for x in value))
        if self.type == "longrope":
            short, long = self.short_factor, self.long_factor
            if short is None or long is None or len(short) != len(long) or not short:
                raise TileworkError(f"rope scaling 'longrope' needs short_factor and long_factor of one length (head_dim / 2), got {short} and {long}")
            if not all(x > 0 for x in short + long):
                raise TileworkError("rope scaling 'longrope': short_factor and long_factor must be positive")
        if (self.type == "freq_factors") != (self.freq_factors is not None):
            raise TileworkError(f"rope scaling {self.type!r}: freq_factors go with the type 'freq_factors' and it needs them, got {self.freq_factors}")
        if self.freq_factors is not None and not (self.freq_factors and all(x > 0 and math.isfinite(x) for x in self.freq_factors)):
            raise TileworkError(f"rope scaling 'freq_factors': the factors must be positive and finite, got {self.freq_factors}")

    def yarn_ramp(self, head_dim: int, theta: float) -> tuple[float, float]:
        """``yarn``'s ramp over the frequency index ``j``: ``(low, high)``, the ramp
        ``clamp((j - low) / (high - low), 0, 1)`` (0: the frequency kept, 1: divided by
        ``factor``), as transformers' ``find_correction_range`` and ``linear_ramp_factor``;
        ``head_dim``: the rotated dims (:attr:`LlmConfig.rotary_dims`)."""
        assert self.original_context is not None

        def dim(rotations: float) -> float:
            return head_dim * math.log(self.original_context / (rotations * 2 * math.pi)) / (2 * math.log(theta))  # type: ignore[operator]

        low, high = dim(self.beta_fast), dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        return float(low), float(high + 0.001 if low == high else high)


def f32_value(v: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-5, not
    9.999999747378752e-06): the value the model's authors wrote."""
    return float(str(np.float32(v)))


def gguf_freq_factors(gf: "GGUFFile", t: Any, dims: int) -> tuple[float, ...] | None:
    """The values of a GGUF file's per-frequency rotary divisors ``t`` (None: the file has none):
    ``dims / 2`` float32 values (``dims``: the rotated dims, ``rope.dimension_count``). ``rope_freqs``: llama.cpp's converter writes them for
    ``llama3`` scaling (Llama 3.1, 3.2, ...: 1 for the high frequencies, the factor for the low
    ones, a blend between) and llama.cpp divides each frequency by its factor; phi3's
    ``rope_factors_short`` / ``_long``: longrope's (:func:`gguf_longrope`)."""
    if t is None:
        return None
    if t.ggml_type != 0 or t.shape != (dims // 2,):
        raise TileworkError(f"{gf.path}: tensor {t.name} must be {dims // 2} float32 values (rotated dims {dims} / 2), got GGML type {t.ggml_type} of shape {list(t.shape)}")
    return tuple(float(v) for v in gf.tensor_bytes(t).view("<f4"))


def gguf_longrope(gf: "GGUFFile", tensors: list[Any], get: Callable[..., Any], arch: str, where: str, dims: int, context: int) -> RopeScaling:
    """A phi3 file's longrope scaling, as llama.cpp's converter writes it: the per-frequency
    divisors in tensors ``rope_factors_short`` / ``rope_factors_long`` (``tensors``, in that
    order), ``{arch}.rope.scaling.original_context_length`` and the attention factor
    ``{arch}.rope.scaling.attn_factor`` (transformers' ``sqrt(1 + ln(factor) / ln(original))``
    where absent). Run as transformers runs it: the long factors for a step that ends past the
    original context (llama.cpp takes them for the whole run when its context is longer)."""
    original = get(f"{arch}.rope.scaling.original_context_length")
    if original is None:
        raise TileworkError(f"{where}: longrope factors need {arch}.rope.scaling.original_context_length")
    short, long = (gguf_freq_factors(gf, t, dims) for t in tensors)
    factor = context / int(original)
    attention = get(f"{arch}.rope.scaling.attn_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(int(original)))
    return RopeScaling("longrope", factor, int(original), attention_factor=f32_value(attention), short_factor=short, long_factor=long)


def gguf_rope_scaling(get: Callable[..., Any], arch: str, where: str, freq_factors: tuple[float, ...] | None = None, longrope: RopeScaling | None = None) -> RopeScaling:
    """The rotary scaling of a GGUF file: its ``freq_factors`` (the ``rope_freqs`` tensor) or
    its ``longrope`` (phi3's ``rope_factors_*`` tensors, :func:`gguf_longrope`) if it has them,
    else its keys (:func:`_gguf_keys_rope_scaling`); tensors together with a scaling type in the
    keys are refused."""
    scaling = _gguf_keys_rope_scaling(get, arch, where)
    if freq_factors is None and longrope is None:
        return scaling
    tensor = "rope_freqs.weight" if freq_factors is not None else "rope_factors_short/long.weight"
    if scaling.type != "default":
        raise UnsupportedError(f"{where}: rope scaling {scaling.type!r} ({arch}.rope.scaling.*) together with per-frequency factors ({tensor}) is not supported")
    return longrope if longrope is not None else RopeScaling("freq_factors", freq_factors=freq_factors)


def _gguf_keys_rope_scaling(get: Callable[..., Any], arch: str, where: str) -> RopeScaling:
    """The rotary scaling of a GGUF file's ``{arch}.rope.scaling.*`` keys, as llama.cpp reads
    them: ``linear``; ``yarn`` with ``factor``, ``original_context_length`` and
    ``yarn_beta_fast`` / ``yarn_beta_slow`` (32 and 1 when absent), its attention factor
    ``1 + 0.1 ln(factor)`` (llama.cpp's and transformers' alike). The keys that change yarn
    otherwise in llama.cpp (``attn_factor``, ``yarn_ext_factor``, ``yarn_attn_factor``,
    ``yarn_log_multiplier``, set by its converters for other families) are refused unless they
    hold their neutral values, as is ``longrope`` (llama.cpp keeps its factors in tensors)."""
    kind = get(f"{arch}.rope.scaling.type")
    factor = get(f"{arch}.rope.scaling.factor")
    if kind is None:
        linear = get(f"{arch}.rope.scale_linear")  # the key of older files
        return RopeScaling("linear", f32_value(linear)) if linear not in (None, 1.0) else RopeScaling()
    if kind == "none":
        return RopeScaling()
    if kind == "linear" and factor is not None:
        return RopeScaling("linear", f32_value(factor))
    if kind == "yarn":
        original = get(f"{arch}.rope.scaling.original_context_length")
        if original is None or factor is None:
            raise TileworkError(f"{where}: yarn rope scaling needs {arch}.rope.scaling.factor and {arch}.rope.scaling.original_context_length")
        for key, neutral in (("attn_factor", 1.0), ("yarn_ext_factor", 1.0), ("yarn_attn_factor", 1.0), ("yarn_log_multiplier", 0.0)):
            value = get(f"{arch}.rope.scaling.{key}")
            if value is not None and f32_value(value) != neutral:
                raise UnsupportedError(f"{where}: yarn rope scaling with {arch}.rope.scaling.{key} = {f32_value(value)} is not supported (only {neutral})")
        f = f32_value(factor)
        beta_fast, beta_slow = (f32_value(get(f"{arch}.rope.scaling.yarn_beta_{b}", d)) for b, d in (("fast", 32.0), ("slow", 1.0)))
        return RopeScaling("yarn", f, int(original), attention_factor=yarn_mscale(f), beta_fast=beta_fast, beta_slow=beta_slow)
    raise UnsupportedError(f"{where}: rope scaling {kind!r} ({arch}.rope.scaling.type) is not supported; supported: none, linear, yarn")


def _hf_rope_params(d: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, Mapping) or any(isinstance(v, Mapping) for v in params.values()):
        raise UnsupportedError(f"{where}: per-layer-type rope parameters are not supported")
    return params


def _hf_partial_factor(d: Mapping[str, Any], where: str, default: float = 1.0) -> float:
    """``partial_rotary_factor`` (1: every dim turned): in the rope parameters, else at the top
    level (Phi-4-mini's and Phi-2's ``config.json``), as ``Phi3Config`` takes it; ``default``
    where neither has it."""
    params = _hf_rope_params(d, where)
    partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    return default if partial is None else float(partial)


def hf_rope_dim(d: Mapping[str, Any], head_dim: int, where: str, default: float = 1.0) -> int | None:
    """A phi3 or phi checkpoint's rotated dims, ``int(head_dim * partial_rotary_factor)`` as
    transformers' rotary init computes them (None: every dim); ``default``: the factor where the
    config has none (PhiConfig's 0.5)."""
    factor = _hf_partial_factor(d, where, default)
    if not 0 < factor <= 1:
        raise TileworkError(f"{where}: partial_rotary_factor must be in (0, 1], got {factor}")
    dims = int(head_dim * factor)
    if dims % 2 or dims < 2:
        raise UnsupportedError(f"{where}: partial_rotary_factor {factor} of head_dim {head_dim} turns {dims} dims: an even number (pairs) of at least 2 is supported")
    return None if dims == head_dim else dims


def hf_rope(d: Mapping[str, Any], get: Callable[[str], Any], where: str, partial: bool = False) -> tuple[float, RopeScaling]:
    """``(rope_theta, scaling)`` from ``rope_parameters`` (transformers 5) or ``rope_theta`` +
    ``rope_scaling`` (earlier versions). A ``partial_rotary_factor`` below 1 is refused unless
    ``partial`` (phi3, phi: :func:`hf_rope_dim` reads it); its scaling is then over the rotated dims."""
    params = _hf_rope_params(d, where)
    theta = float(params.get("rope_theta") or get("rope_theta"))
    factor = _hf_partial_factor(d, where)
    if factor != 1.0 and not partial:
        raise UnsupportedError(f"{where}: partial rotary embeddings (partial_rotary_factor = {factor}) are supported for phi3 and phi checkpoints only")
    kind = params.get("rope_type", params.get("type", "default"))
    kind = "longrope" if kind == "su" else kind  # the name early Phi-3 configs gave it
    if kind in ("default", "dynamic"):
        # dynamic NTK scales theta by (factor * seq / max_position_embeddings - factor + 1) once
        # a sequence is longer than max_position_embeddings, the context: never within it
        return theta, RopeScaling()
    if kind == "linear":
        return theta, RopeScaling("linear", float(params["factor"]))
    # transformers' standardize_rope_params: a top-level original_max_position_embeddings (Phi3
    # keeps it there) wins over the one in the rope parameters; the context when neither is
    context = int(get("max_position_embeddings"))
    original = int(d.get("original_max_position_embeddings") or params.get("original_max_position_embeddings") or context)
    if kind == "llama3":
        return theta, RopeScaling("llama3", float(params["factor"]), original, float(params["low_freq_factor"]), float(params["high_freq_factor"]))
    factor = float(params.get("factor") or context / original)  # the ratio of the two contexts where no factor is given
    attention = params.get("attention_factor")
    if kind == "yarn":
        if attention is None:
            mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
            attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim) if mscale and mscale_all_dim else yarn_mscale(factor)
        beta_fast, beta_slow = float(params.get("beta_fast") or 32.0), float(params.get("beta_slow") or 1.0)
        return theta, RopeScaling("yarn", factor, original, attention_factor=float(attention), beta_fast=beta_fast, beta_slow=beta_slow, truncate=bool(params.get("truncate", True)))
    if kind == "longrope":
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        for key in ("short_factor", "long_factor"):
            if not isinstance(params.get(key), list):
                raise TileworkError(f"{where}: rope scaling 'longrope' needs a list {key}, got {params.get(key)!r}")
        return theta, RopeScaling("longrope", factor, original, attention_factor=float(attention), short_factor=tuple(params["short_factor"]), long_factor=tuple(params["long_factor"]))
    raise UnsupportedError(f"{where}: rope scaling {kind!r} is not supported; supported: {', '.join(HF_ROPE_TYPES)}")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor of a ``factor`` (transformers' ``yarn_get_mscale``)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


__all__ = ["RopeScaling", "ROPE_TYPES", "HF_ROPE_TYPES", "f32_value", "gguf_freq_factors", "gguf_longrope", "gguf_rope_scaling", "hf_rope", "hf_rope_dim", "yarn_mscale"]

"""Gemma's text decoders in an :class:`~tilework.llm.config.LlmConfig`: Gemma 1's, Gemma 2's and
Gemma 3's, what their GGUF metadata (``general.architecture`` ``gemma`` / ``gemma2`` /
``gemma3``; :func:`gguf_fields`) and their transformers configs (``model_type`` ``gemma``,
``gemma2``, ``gemma3_text``, or the ``text_config`` of a multimodal ``gemma3`` one;
:func:`hf_fields`) say, read as transformers' ``GemmaForCausalLM`` / ``Gemma2ForCausalLM`` /
``Gemma3ForCausalLM`` and llama.cpp's ``gemma`` / ``gemma2`` / ``gemma3`` compute them.
``LlmConfig.from_gguf`` / ``from_hf_config`` call them (this module imports nothing of the
config's but its types).

What sets every Gemma apart from a Llama (``LlmConfig.gemma``; ``tilework.llm.model`` computes it):

- the token embedding multiplied by ``sqrt(hidden)`` (a float32 constant: the config's
  ``embedding_multiplier``, the one home of an embedding's scale, Granite's too);
- RMSNorms that multiply by ``1 + w`` in float32 in transformers; llama.cpp's converter stores
  ``w + 1`` in the GGUF file, which tilework's norms take as they are (``tilework.llm.weights``
  adds the 1 to a checkpoint's norm weights);
- a gated MLP of GELU (tanh form): ``down(gelu_tanh(gate(x)) * up(x))``;
- a tied head (a checkpoint may untie it: ``tie_word_embeddings``).

Gemma 1 (``gemma``: gemma-2b / 7b, CodeGemma) is that and no more: a Llama's two norms a layer
(``input_layernorm`` before the attention, ``post_attention_layernorm`` before the MLP; GGUF
``attn_norm``, ``ffn_norm``), the scores scaled by ``head_dim ** -0.5`` (gemma-7b's head dim,
256, is not ``hidden / heads``, 3072 / 16), every layer global, one rotary base, no soft caps.
Its config's activation is ``hidden_act`` (transformers 5; ``gelu``, the released configs'
value, read as the tanh form, as ``GemmaConfig`` reads it) and was ``hidden_activation``
(transformers 4, absent: the tanh form): a config where either names another is refused. A
GGUF file's keys beyond a Llama's are not read, as llama.cpp's ``gemma`` graph reads none (its
converter writes no rotary base: llama.cpp's default, 10000).

Gemma 2 and 3 add:

- four RMSNorms a layer: before and after the attention, before and after the MLP (each
  sublayer's output normalized before it is added to the residual; ``LlmConfig.sandwich_norm``);
- the attention's scores scaled by ``query_pre_attn_scalar ** -0.5`` (a GGUF file has no such
  key: llama.cpp takes ``hidden / heads`` for the 27B models, 46 layers of Gemma 2 and 62 of
  Gemma 3, and ``head_dim`` for the others, as Google's configs set it);
- sliding-window layers that attend to the last ``sliding_window`` tokens only, ``(p - window,
  p]`` (``layer_types``, else the fixed patterns llama.cpp uses too).

Gemma 2 (``gemma2``): every other layer slides (layers 0, 2, 4, ...; a window of 4096 where a
GGUF file states none, as llama.cpp takes it), one rotary base for all, and two soft caps
``c * tanh(x / c)``: on the attention's scaled scores (``attn_logit_softcapping``, 50) and on
the logits (``final_logit_softcapping``, 30).

Gemma 3 (``gemma3``): RMSNorms over each query and key head (``q_norm`` / ``k_norm``); five
layers of every six slide (llama.cpp's fixed pattern: layer ``i`` is global when ``i % 6 ==
5``), with an unscaled rotary base of their own (``rope_local_base_freq``, 10000; llama.cpp's
fixed 10000), the global ones with ``rope_theta`` and the config's rotary scaling (linear,
factor 8, on 4B and larger); no soft caps.

Variants tilework does not compute are refused naming the key: Gemma 3 with logit soft-capping,
bidirectional attention (any Gemma), another activation, rotary scaling of the sliding layers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from tilework.errors import UnsupportedError
from tilework.llm.hf_keys import key_reader, sliding_layers

if TYPE_CHECKING:
    from tilework.llm.rope import RopeScaling

SLIDING_PATTERN = 6  # Gemma 3: every sixth layer is global (transformers' default sliding_window_pattern, llama.cpp's fixed one)
GEMMA2_PATTERN = 2  # Gemma 2: every second layer is global
GEMMA2_WINDOW = 4096  # Gemma 2's window where a GGUF file states none (llama.cpp's default)
GEMMA2_SOFTCAPS = (50.0, 30.0)  # Gemma 2's attention and final soft caps (Gemma2Config's and llama.cpp's defaults)
LARGE_LAYERS = {"gemma2": 46, "gemma3": 62}  # the 27B models: llama.cpp scales their scores by hidden / heads
LOCAL_THETA = 10000.0  # the sliding layers' rotary base (rope_local_base_freq's default; llama.cpp's fixed value)
# Gemma3TextConfig's and Gemma2Config's defaults of the keys a config.json may omit
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262208, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
    "head_dim": 256, "num_key_value_heads": 4, "num_attention_heads": 8, "tie_word_embeddings": True, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "rope_theta": 1_000_000.0, "rope_local_base_freq": LOCAL_THETA, "bos_token_id": 2, "eos_token_id": 1,
}  # fmt: skip
HF2_DEFAULTS: dict[str, Any] = {
    **HF_DEFAULTS, "vocab_size": 256000, "max_position_embeddings": 8192, "rope_theta": 10000.0,
    "attn_logit_softcapping": GEMMA2_SOFTCAPS[0], "final_logit_softcapping": GEMMA2_SOFTCAPS[1],
}  # fmt: skip
HF1_DEFAULTS: dict[str, Any] = {  # GemmaConfig's (gemma-7b's)
    "vocab_size": 256000, "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "head_dim": 256,
    "num_key_value_heads": 16, "num_attention_heads": 16, "tie_word_embeddings": True, "rope_theta": 10000.0, "bos_token_id": 2, "eos_token_id": 1,
}  # fmt: skip
# Gemma 1's activation keys and the values that name GELU's tanh form there: hidden_act (transformers
# 5's GemmaMLP; its legacy value "gelu" is read as the tanh form) and hidden_activation (transformers 4's)
HF1_ACTIVATIONS = {"hidden_act": ("gelu_pytorch_tanh", "gelu"), "hidden_activation": ("gelu_pytorch_tanh",)}


def pattern_layers(layers: int, period: int = SLIDING_PATTERN) -> tuple[int, ...]:
    """The sliding layers of ``layers`` in a pattern of ``period``: all but every ``period``-th."""
    return tuple(i for i in range(layers) if (i + 1) % period)


def gguf_fields(get: Callable[..., Any], arch: str, where: str, layers: int, hidden: int, heads: int, head_dim: int) -> dict[str, Any]:
    """The Gemma fields of an ``LlmConfig`` from a GGUF file's ``gemma.*`` / ``gemma2.*`` /
    ``gemma3.*`` keys (``get``), as llama.cpp reads them: the embedding's scale (every Gemma's;
    Gemma 1 has nothing more, the rest is a Llama's), the window ``{arch}.attention.sliding_window`` (Gemma 3:
    absent or 0, every layer global; Gemma 2: absent, 4096), the fixed pattern of global layers,
    Gemma 3's sliding layers' rotary base ``{arch}.rope.freq_base_swa`` where the file has it
    (else 10000), Gemma 2's soft caps (absent: 50 and 30), and the attention scale's scalar as
    llama.cpp derives it (see the module docstring)."""
    if arch == "gemma":
        return {"embedding_multiplier": embedding_scale(hidden)}
    caps = {key: get(f"{arch}.{key}") for key in ("attn_logit_softcapping", "final_logit_softcapping")}
    softcaps: tuple[float | None, ...]
    if arch == "gemma2":
        window, period = int(get(f"{arch}.attention.sliding_window", GEMMA2_WINDOW) or 0), GEMMA2_PATTERN
        softcaps = tuple(float(caps[k]) if caps[k] is not None else d for k, d in zip(caps, GEMMA2_SOFTCAPS))
    else:
        for key, value in caps.items():
            if value not in (None, 0, 0.0):
                raise UnsupportedError(f"{where}: logit soft-capping ({arch}.{key} = {value}) is not supported in {arch}")
        window, period, softcaps = int(get(f"{arch}.attention.sliding_window") or 0), SLIDING_PATTERN, (None, None)
    pattern = get(f"{arch}.attention.sliding_window_pattern")
    sliding = pattern_layers(layers, period) if window > 0 else ()
    if pattern is not None:  # llama.cpp fixes the pattern; a file that states another is refused
        stated = pattern_layers(layers, int(pattern)) if isinstance(pattern, int) else tuple(i for i, s in enumerate(pattern) if s)
        if stated != sliding:
            raise UnsupportedError(f"{where}: a sliding-window pattern other than every {_nth(period)} layer global ({arch}.attention.sliding_window_pattern = {pattern}) is not supported")
    scalar = hidden // heads if layers == LARGE_LAYERS[arch] else head_dim  # llama.cpp: the 27B's hidden / heads, else head_dim
    local = get(f"{arch}.rope.freq_base_swa")
    return {
        "sliding_window": window or None,
        "sliding_layers": sliding,
        "rope_local_theta": None if arch == "gemma2" else float(local) if local is not None else LOCAL_THETA,
        "query_pre_attn_scalar": float(scalar),
        "embedding_multiplier": embedding_scale(hidden),
        "attn_softcap": softcaps[0],
        "final_softcap": softcaps[1],
    }


def _nth(period: int) -> str:
    return {2: "second", 6: "sixth"}.get(period, f"{period}th")


def text_config(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The text decoder's part of a ``gemma3`` (multimodal: ``Gemma3ForConditionalGeneration``)
    config: its ``text_config``, with the top level's token ids and head tying where the text part
    does not state them; a ``gemma3_text`` config as it is."""
    if d.get("model_type") != "gemma3":
        return dict(d)
    text = d.get("text_config")
    if not isinstance(text, Mapping):
        raise UnsupportedError(f"{where}: a gemma3 config without a text_config object is not supported")
    out = dict(text)
    for key in ("tie_word_embeddings", "bos_token_id", "eos_token_id"):
        if out.get(key) is None and d.get(key) is not None:
            out[key] = d[key]
    return out


def hf_fields(d0: Mapping[str, Any], where: str, hf_rope: Callable[..., tuple[float, "RopeScaling"]]) -> dict[str, Any]:
    """The ``LlmConfig`` fields of a transformers Gemma config (``gemma``; ``gemma2``;
    ``gemma3_text``; ``gemma3``: its text part, :func:`text_config`); missing keys take
    GemmaConfig's / Gemma2Config's / Gemma3TextConfig's defaults. Gemma 3's rotary parameters
    are transformers 5's ``rope_parameters`` per layer type (``full_attention``,
    ``sliding_attention``) or the earlier ``rope_theta``, ``rope_scaling`` (the global layers')
    and ``rope_local_base_freq``; Gemma 1's and 2's are one set for every layer. ``hf_rope``
    reads the global layers' as a llama config's (``LlmConfig.from_hf_config`` passes its
    reader: this module sits below the config's)."""
    d = text_config(d0, where)
    version = {"gemma": 1, "gemma2": 2}.get(str(d.get("model_type")), 3)
    defaults = HF1_DEFAULTS if version == 1 else HF2_DEFAULTS if version == 2 else HF_DEFAULTS
    get, need = key_reader(d, defaults, where)
    if d.get("use_bidirectional_attention"):
        raise UnsupportedError(f"{where}: bidirectional attention (use_bidirectional_attention) is not supported")
    if version == 1:
        for key, names in HF1_ACTIVATIONS.items():
            if d.get(key) is not None and d[key] not in names:
                raise UnsupportedError(f"{where}: {key} {d[key]!r} is not supported (only GELU's tanh form: {' or '.join(map(repr, names))})")
    else:
        act = d.get("hidden_activation") or d.get("hidden_act") or defaults["hidden_activation"]
        if act != "gelu_pytorch_tanh":
            raise UnsupportedError(f"{where}: hidden_activation {act!r} is not supported (only 'gelu_pytorch_tanh')")
    layers = int(need("num_hidden_layers"))
    hidden, heads = int(need("hidden_size")), int(get("num_attention_heads"))
    attn_bias = bool(d.get("attention_bias", False))
    eos = get("eos_token_id")
    common = dict(
        architecture=("gemma", "gemma2", "gemma3")[version - 1],
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=int(get("num_key_value_heads")),
        head_dim=int(get("head_dim")),
        ffn=int(need("intermediate_size")),
        vocab=int(get("vocab_size")),
        rms_eps=float(get("rms_norm_eps")),
        context_length=int(get("max_position_embeddings")),
        tie_word_embeddings=bool(get("tie_word_embeddings")),
        attention_bias=attn_bias,
        attention_out_bias=attn_bias,
        bos_token_id=None if get("bos_token_id") is None else int(get("bos_token_id")),
        eos_token_ids=tuple(int(t) for t in eos) if isinstance(eos, list) else (int(eos),),
        embedding_multiplier=embedding_scale(hidden),
    )
    if version == 1:  # every layer global, one rotary base, scores scaled by head_dim ** -0.5, no caps
        theta, scaling = hf_rope(d, get, where)
        return {**common, "rope_theta": theta, "rope_scaling": scaling}
    gemma2 = version == 2

    caps: tuple[float | None, ...] = (None, None)
    if gemma2:  # a key set to null: no cap (absent: the class default)
        caps = tuple(None if v is None else float(v) for v in (d.get(k, defaults[k]) for k in ("attn_logit_softcapping", "final_logit_softcapping")))
    else:
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if d.get(key) is not None:
                raise UnsupportedError(f"{where}: logit soft-capping ({key} = {d[key]}) is not supported in Gemma 3")
    period = GEMMA2_PATTERN if gemma2 else int(d.get("sliding_window_pattern") or SLIDING_PATTERN)
    types = d.get("layer_types") or ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(layers)]
    window = d.get("sliding_window", defaults["sliding_window"])
    sliding = sliding_layers(types, layers, where) if window else ()
    # the rotary parameters of each layer type
    params = d.get("rope_parameters")
    if isinstance(params, Mapping) and any(isinstance(v, Mapping) for v in params.values()):
        full, local = dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
    else:
        full = dict(params or d.get("rope_scaling") or {})
        local = {} if gemma2 else {"rope_type": "default", "rope_theta": get("rope_local_base_freq")}
    full.setdefault("rope_theta", get("rope_theta"))
    if gemma2 and local and local != full:
        raise UnsupportedError(f"{where}: Gemma 2 with rotary parameters of its own for the sliding layers (rope_parameters.sliding_attention) is not supported")
    local_kind = local.get("rope_type", local.get("type", "default"))
    if local_kind != "default":
        raise UnsupportedError(f"{where}: rotary scaling {local_kind!r} of the sliding layers (rope_parameters.sliding_attention) is not supported")
    theta, scaling = hf_rope({**d, "rope_parameters": full, "rope_scaling": None}, get, where)
    return dict(
        common,
        rope_theta=theta,
        rope_scaling=scaling,
        sliding_window=int(window) if sliding else None,
        sliding_layers=sliding,
        rope_local_theta=None if gemma2 else float(local.get("rope_theta") or LOCAL_THETA),
        query_pre_attn_scalar=float(get("query_pre_attn_scalar")),
        attn_softcap=caps[0],
        final_softcap=caps[1],
    )


def embedding_scale(hidden: int) -> float:
    """What Gemma's token embedding is multiplied by: ``sqrt(hidden)`` rounded to float32 (as
    transformers' float32 model and llama.cpp take it)."""
    return float(np.float32(math.sqrt(hidden)))


__all__ = ["gguf_fields", "hf_fields", "text_config", "pattern_layers", "embedding_scale", "SLIDING_PATTERN", "GEMMA2_PATTERN", "LOCAL_THETA"]

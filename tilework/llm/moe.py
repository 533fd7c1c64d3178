"""Mixture-of-experts layers' hyperparameters: what a GGUF file's metadata or a transformers
config says about them, as :class:`~tilework.llm.config.LlmConfig` fields.

A mixture-of-experts MLP (Mixtral, Qwen3-MoE, OLMoE) routes each token to ``experts_used`` of
``experts`` SwiGLU MLPs of width ``expert_ffn``: the router's logits (``mlp.gate``, ``[experts,
hidden]``) through a softmax over every expert, the ``experts_used`` largest probabilities kept,
renormalized to sum 1 where ``expert_norm`` (Mixtral's softmax over the top logits is the same
values), times ``expert_scale``; the MLP's output is the experts' outputs summed with those
weights (plus a shared expert's, gated, where ``shared_ffn``). ``dense_layers`` keep the dense MLP (Qwen3-MoE's ``mlp_only_layers`` and
``decoder_sparse_step``).

Read (the rest is refused, naming the key): GGUF ``llama`` files with ``expert_count`` (Mixtral;
the top weights renormalized, as llama.cpp's graph does), ``qwen3moe`` and ``granitemoe``
(renormalized, as llama.cpp does whatever the file says) and ``olmoe`` (not renormalized);
transformers ``mixtral``, ``granitemoe`` (a softmax over the top logits: renormalized),
``qwen3_moe`` and ``qwen2_moe`` (``norm_topk_prob``) and ``olmoe`` (``norm_topk_prob``) configs.
Qwen2-MoE (GGUF ``qwen2moe``, its ``expert_shared_feed_forward_length``; transformers
``shared_expert_intermediate_size``) adds a shared expert, an MLP every token goes through,
times ``sigmoid(shared_expert_gate(x))`` (``shared_ffn``). A
softmax router alone (``{arch}.expert_gating_func`` 1 or absent); no shared experts but
Qwen2-MoE's, no leading
dense blocks in GGUF files (``leading_dense_block_count``; a layer without a router is dense).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Collection, Mapping

from tilework.errors import TileworkError, UnsupportedError

MOE_GGUF = ("llama", "qwen3moe", "olmoe", "granitemoe", "qwen2moe")  # GGUF architectures whose files may hold experts
_GGUF_NORM = {"llama": True, "qwen3moe": True, "olmoe": False, "granitemoe": True, "qwen2moe": False}  # llama.cpp's graphs renormalize the top weights of these
_SOFTMAX = 1  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX


def gguf_moe(get: Callable[..., Any], arch: str, where: str, layers: int, ffn: int, tensors: Collection[str]) -> dict[str, Any]:
    """The experts' fields of a GGUF file's metadata (``{}``: a dense model); ``ffn`` is its
    ``feed_forward_length`` (Mixtral's experts' width where no
    ``expert_feed_forward_length`` is given); the layers without a router (``ffn_gate_inp``
    among the file's ``tensors``) are dense."""
    count = int(get(f"{arch}.expert_count", 0) or 0)
    if count == 0:
        if arch in ("qwen3moe", "olmoe", "granitemoe", "qwen2moe"):
            raise TileworkError(f"{where}: a {arch} file needs {arch}.expert_count > 0")
        return {}
    if arch not in MOE_GGUF:
        raise UnsupportedError(f"{where}: mixture-of-experts {arch} models ({arch}.expert_count = {count}) are not supported; experts are read for {', '.join(MOE_GGUF)} files")
    for key in ("expert_shared_count", "leading_dense_block_count"):
        if int(get(f"{arch}.{key}", 0) or 0) and not (arch == "qwen2moe" and key == "expert_shared_count"):
            raise UnsupportedError(f"{where}: {arch}.{key} = {get(f'{arch}.{key}')} is not supported (shared experts, dense leading blocks)")
    gating = get(f"{arch}.expert_gating_func")
    if gating is not None and int(gating) != _SOFTMAX:
        raise UnsupportedError(f"{where}: {arch}.expert_gating_func = {gating} is not supported (only 1, a softmax over the router's logits)")
    scale = float(get(f"{arch}.expert_weights_scale", 0.0) or 0.0)
    return {
        "experts": count,
        "experts_used": int(get(f"{arch}.expert_used_count", 0) or 0),
        "expert_ffn": int(get(f"{arch}.expert_feed_forward_length", 0) or ffn),
        "expert_norm": _GGUF_NORM[arch],
        "expert_scale": scale if scale not in (0.0, 1.0) else 1.0,  # llama.cpp: 0 or 1 scale nothing
        "dense_layers": tuple(i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in tensors),
        "shared_ffn": int(get(f"{arch}.expert_shared_feed_forward_length", 0) or 0) if arch == "qwen2moe" else 0,
    }


def hf_moe(d: Mapping[str, Any], model_type: str, where: str, layers: int) -> dict[str, Any]:
    """The experts' fields of a transformers ``mixtral``, ``granitemoe``, ``qwen3_moe`` or ``olmoe`` config
    (``{}`` for the dense model types)."""
    if model_type in ("mixtral", "granitemoe"):  # (Granite's softmax over the top logits: the renormalized weights)
        count, ffn, norm = d.get("num_local_experts", 8), d.get("intermediate_size", 14336 if model_type == "mixtral" else 1024), True
    elif model_type in ("qwen3_moe", "qwen2_moe", "olmoe"):
        default = {"qwen3_moe": (128, 768), "qwen2_moe": (60, 1408), "olmoe": (64, 1024)}[model_type]
        count = d.get("num_experts", d.get("num_local_experts", default[0]))  # (transformers 5 writes the second name)
        ffn = d.get("intermediate_size", default[1]) if model_type == "olmoe" else d.get("moe_intermediate_size", default[1])
        norm = bool(d.get("norm_topk_prob", False))
    else:
        return {}
    used = d.get("num_experts_per_tok", {"mixtral": 2, "qwen2_moe": 4}.get(model_type, 8))
    dense: tuple[int, ...] = ()
    if model_type in ("qwen3_moe", "qwen2_moe"):  # Qwen3MoeDecoderLayer: a dense MLP in mlp_only_layers and off the sparse step
        step = int(d.get("decoder_sparse_step", 1) or 1)
        only = d.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
            raise TileworkError(f"{where}: mlp_only_layers must be a list of layer indices, got {only!r}")
        dense = tuple(i for i in range(layers) if i in only or (i + 1) % step != 0)
    shared = int(d.get("shared_expert_intermediate_size", 5632)) if model_type == "qwen2_moe" else 0
    return {"experts": int(count), "experts_used": int(used), "expert_ffn": int(ffn), "expert_norm": norm, "dense_layers": dense, "shared_ffn": shared}


def check_moe(experts: int, experts_used: int, expert_ffn: int, expert_scale: float, dense_layers: tuple[int, ...], layers: int, shared_ffn: int = 0) -> None:
    """:class:`~tilework.llm.config.LlmConfig`'s checks of the experts' fields."""
    if not isinstance(experts, int) or isinstance(experts, bool) or experts < 0:
        raise TileworkError(f"LlmConfig.experts must be a non-negative int, got {experts!r}")
    if not isinstance(shared_ffn, int) or isinstance(shared_ffn, bool) or shared_ffn < 0:
        raise TileworkError(f"LlmConfig.shared_ffn must be a non-negative int, got {shared_ffn!r}")
    if experts == 0:
        if experts_used or dense_layers or shared_ffn:
            raise TileworkError("LlmConfig: experts_used, dense_layers and shared_ffn need experts > 0")
        return
    if not isinstance(experts_used, int) or not 0 < experts_used <= experts:
        raise TileworkError(f"LlmConfig.experts_used must be an int in 1..{experts} (experts), got {experts_used!r}")
    if not isinstance(expert_ffn, int) or expert_ffn <= 0:
        raise TileworkError(f"LlmConfig.expert_ffn must be a positive int, got {expert_ffn!r}")
    if isinstance(expert_scale, bool) or not isinstance(expert_scale, (int, float)) or not math.isfinite(expert_scale):
        raise TileworkError(f"LlmConfig.expert_scale must be a finite number, got {expert_scale!r}")
    if dense_layers and (dense_layers[0] < 0 or dense_layers[-1] >= layers or len(set(dense_layers)) != len(dense_layers)):
        raise TileworkError(f"LlmConfig: dense_layers must be distinct layer indices below {layers}, got {list(dense_layers)}")


__all__ = ["MOE_GGUF", "check_moe", "gguf_moe", "hf_moe"]

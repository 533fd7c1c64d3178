"""Load a model's config and tensors: :func:`load_weights`.

Reads a GGUF file, or a transformers checkpoint (a directory with ``config.json`` and
``*.safetensors``, sharded or not, or one ``.safetensors`` file with ``config.json`` beside it).
Either way the result is an :class:`~tilework.llm.config.LlmConfig` and the tensors under their
transformers names in transformers' layout, each a :class:`~tilework.llm.quant.QuantTensor`
whose bytes are a read-only view of the memory-mapped file (the GGUF ``q_proj`` / ``k_proj``
rows excepted: see :mod:`tilework.llm.gguf`). The set of tensors and their shapes are checked
against the config; a tied model has no ``lm_head.weight``. A Gemma checkpoint's norm weights
are made the multipliers ``1 + w`` its norms compute with (:func:`gemma_norm_multipliers`: what a
GGUF file holds), and a multimodal one's text decoder is read under ``Gemma3ForCausalLM``'s names.
A mixture of experts' matrices are one tensor an expert (``mlp.experts.{e}.gate_proj.weight``,
...): a GGUF file's stacked ``ffn_*_exps`` and a Granite MoE checkpoint's fused
``input_linear`` / ``output_linear`` are parted into views of their rows (:func:`split_experts`),
Mixtral's ``block_sparse_moe`` names read as the others' (the decoder stacks them again).
A Phi checkpoint's ``self_attn.dense``, ``mlp.fc1`` / ``mlp.fc2`` and ``model.final_layernorm``
and a StarCoder2 one's ``mlp.c_fc`` / ``mlp.c_proj`` are read under llama's names (``o_proj``,
``up_proj`` / ``down_proj``, ``model.norm``), as their GGUF files' are.

safetensors files are read by their documented layout (an 8-byte little-endian header length, a
JSON header of dtype, shape and byte offsets, then the data) and mapped with ``np.memmap``:
``safetensors.safe_open(framework="numpy")`` cannot give bfloat16 (NumPy has no such dtype)
and copies what it reads.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
from typing import Any

import numpy as np

from tilework.errors import FileFormatError, ParameterError, ShapeError, TileworkError, UnsupportedError
from tilework.llm.config import LlmConfig
from tilework.llm.gguf import GGUF_MAGIC, INTERLEAVED, gguf_tensors, read_gguf, rope_row_order
from tilework.llm.quant import QuantTensor, block_format

_SAFETENSORS_FORMATS = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # a buffer some older checkpoints saved


def load_weights(path: "str | os.PathLike[str]", gguf_file: Any = None) -> tuple[LlmConfig, dict[str, QuantTensor]]:
    """The config and tensors of the model at ``path`` (see the module docstring); ``gguf_file``
    is the file's :class:`~tilework.llm.gguf.GGUFFile` (or ``gguf.GGUFReader``) when the caller
    has it already."""
    path = os.fspath(path)
    kind = model_kind(path)
    if kind == "gguf":
        gf = read_gguf(gguf_file if gguf_file is not None else path)
        config = LlmConfig.from_gguf(gf)
        return config, _checked(config, split_fused(config, split_experts(gguf_tensors(gf, config))), path)
    config_path, shards = _checkpoint_files(path)
    config = LlmConfig.from_hf_config(config_path)
    tensors: dict[str, QuantTensor] = {}
    for shard in shards:
        tensors.update(read_safetensors(shard))
    tensors = {n: t for n, t in tensors.items() if not n.endswith(_IGNORED_SUFFIXES)}
    if config.gemma:
        tensors = gemma_norm_multipliers(_gemma_text_tensors(tensors))
    if config.architecture in INTERLEAVED:
        tensors = _rotate_half_rows(config, tensors)
    tensors = split_experts(_moe_names(_llama_names(config, tensors)))
    tensors = split_fused(config, tensors)
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # the embedding itself; some checkpoints store it twice
    return config, _checked(config, tensors, path)


# a fused projection (Phi-3's) -> its parts, in the order of their rows
_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def split_fused(config: LlmConfig, tensors: dict[str, QuantTensor]) -> dict[str, QuantTensor]:
    """``tensors`` with each fused projection (``qkv_proj``: the q, k and v rows one after the
    other; ``gate_up_proj``: the gate's, then the up projection's; Phi-3's files, GGUF and
    transformers alike) parted into the projections it holds, each a view of its rows (of its
    values, for a bias; the decoder joins them again where their formats agree:
    ``model.MERGED``)."""
    c = config
    sizes = {"self_attn.qkv_proj": (c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim), "mlp.gate_up_proj": (c.ffn, c.ffn)}
    out: dict[str, QuantTensor] = {}
    for name, t in tensors.items():
        fused = next((f for f in _FUSED if f".{f}." in name), None)
        if fused is None:
            out[name] = t
            continue
        prefix, _, kind = name.rpartition(f".{fused}.")
        if t.shape[0] != sum(sizes[fused]):
            raise ShapeError(f"tensor {name} has {t.shape[0]} rows, the config implies {sum(sizes[fused])} ({' + '.join(str(n) for n in sizes[fused])})")
        at = 0
        for part, n in zip(_FUSED[fused], sizes[fused]):
            part_name = f"{prefix}.{part}.{kind}"
            # a matrix's rows are rows of blocks; a bias's values are bytes of its one row
            data = t.data[at : at + n] if len(t.shape) > 1 else t.data[t.format.row_bytes(at) : t.format.row_bytes(at + n)]
            out[part_name] = QuantTensor(part_name, (n, *t.shape[1:]), t.fmt, data)
            at += n
    return out


_STACKED = re.compile(r"(.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj)\.weight")
_MIXTRAL = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}  # Mixtral's experts' matrices
_MIXTRAL_NAME = re.compile(r"(.*)\.block_sparse_moe\.(gate|experts\.\d+\.(w1|w2|w3))\.weight")
_GRANITE_NAME = re.compile(r"(.*)\.block_sparse_moe\.(router\.layer|input_linear|output_linear)\.weight")  # Granite MoE's


def split_experts(tensors: dict[str, QuantTensor]) -> dict[str, QuantTensor]:
    """``tensors`` with each stack of experts' matrices (``mlp.experts.gate_proj.weight``
    ``[experts, out, in]``: a GGUF ``ffn_gate_exps``, or a transformers checkpoint saved with
    its experts fused) parted into one matrix an expert (``mlp.experts.{e}.gate_proj.weight``),
    each a view of its rows (the decoder stacks them again: ``model.merged_parts``)."""
    out: dict[str, QuantTensor] = {}
    for name, t in tensors.items():
        m = _STACKED.fullmatch(name)
        if m is None:
            out[name] = t
            continue
        if len(t.shape) != 3:
            raise ShapeError(f"tensor {name}: stacked experts' matrices must be 3-D [experts, out, in], got shape {list(t.shape)}")
        for e in range(t.shape[0]):
            part = f"{m.group(1)}.{e}.{m.group(2)}.weight"
            out[part] = QuantTensor(part, t.shape[1:], t.fmt, t.data[e])
    return out


# transformers' names of an architecture's parts -> the llama names they are read under (what a
# GGUF file's are mapped to: attn_output, ffn_up, ffn_down, output_norm)
_LLAMA_NAMES = {
    "phi2": {"self_attn.dense": "self_attn.o_proj", "mlp.fc1": "mlp.up_proj", "mlp.fc2": "mlp.down_proj", "model.final_layernorm": "model.norm"},
    "starcoder2": {"mlp.c_fc": "mlp.up_proj", "mlp.c_proj": "mlp.down_proj"},
}


def _llama_names(config: LlmConfig, tensors: dict[str, QuantTensor]) -> dict[str, QuantTensor]:
    """A checkpoint's tensors under the llama names of their parts (Phi's ``self_attn.dense``
    is ``self_attn.o_proj``, ``mlp.fc1`` / ``mlp.fc2`` are ``mlp.up_proj`` / ``mlp.down_proj``,
    ``model.final_layernorm`` is ``model.norm``; StarCoder2's ``mlp.c_fc`` / ``mlp.c_proj`` are
    ``mlp.up_proj`` / ``mlp.down_proj``)."""
    renames = _LLAMA_NAMES.get(config.architecture)
    if not renames:
        return tensors
    out: dict[str, QuantTensor] = {}
    for name, t in tensors.items():
        prefix, _, kind = name.rpartition(".")
        for old, new in renames.items():
            if prefix == old or prefix.endswith("." + old):
                name = prefix[: len(prefix) - len(old)] + new + "." + kind
                t = dataclasses.replace(t, name=name)
                break
        out[name] = t
    return out


def _moe_names(tensors: dict[str, QuantTensor]) -> dict[str, QuantTensor]:
    """A Mixtral or Granite MoE checkpoint's ``block_sparse_moe`` tensors under the names of
    the other mixtures: Mixtral's ``gate`` and each expert's ``w1`` / ``w3`` / ``w2`` are
    ``mlp.gate`` and ``mlp.experts.{e}.gate_proj`` / ``up_proj`` / ``down_proj``; Granite's
    ``router.layer`` is ``mlp.gate``, its ``input_linear`` (``[experts, 2 * ffn, hidden]``, the
    gates' rows, then the up projections') and ``output_linear`` the stacked experts'
    ``gate_proj`` / ``up_proj`` and ``down_proj`` (each a view of its rows; ``split_experts``
    parts them)."""
    out: dict[str, QuantTensor] = {}
    for name, t in tensors.items():
        m = _MIXTRAL_NAME.fullmatch(name)
        if m is not None:
            part = "gate" if m.group(3) is None else f"{m.group(2).rsplit('.', 1)[0]}.{_MIXTRAL[m.group(3)]}"
            name = f"{m.group(1)}.mlp.{part}.weight"
            out[name] = dataclasses.replace(t, name=name)
            continue
        m = _GRANITE_NAME.fullmatch(name)
        if m is None:
            out[name] = t
        elif m.group(2) == "router.layer":
            out[f"{m.group(1)}.mlp.gate.weight"] = dataclasses.replace(t, name=f"{m.group(1)}.mlp.gate.weight")
        elif m.group(2) == "output_linear":
            out[f"{m.group(1)}.mlp.experts.down_proj.weight"] = dataclasses.replace(t, name=f"{m.group(1)}.mlp.experts.down_proj.weight")
        else:  # input_linear: the gates' rows, then the up projections'
            if len(t.shape) != 3 or t.shape[1] % 2:
                raise ShapeError(f"tensor {name}: Granite's input_linear must be [experts, 2 * ffn, hidden], got shape {list(t.shape)}")
            ffn = t.shape[1] // 2
            for proj, rows in (("gate_proj", slice(0, ffn)), ("up_proj", slice(ffn, 2 * ffn))):
                part = f"{m.group(1)}.mlp.experts.{proj}.weight"
                out[part] = QuantTensor(part, (t.shape[0], ffn, t.shape[2]), t.fmt, t.data[:, rows])
    return out


def expected_shapes(config: LlmConfig) -> dict[str, tuple[int, ...]]:
    """The tensors a model of ``config`` has, transformers names -> shapes, in a fixed order."""
    c = config
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab, c.hidden)}

    def norm(name: str) -> None:  # a LayerNorm's bias beside its weight
        out[name + ".weight"] = (c.hidden,)
        if c.layer_norm:
            out[name + ".bias"] = (c.hidden,)

    for i in range(c.layers):
        p = f"model.layers.{i}."
        if not c.post_norm:
            norm(p + "input_layernorm")
        out[p + "self_attn.q_proj.weight"] = (q, c.hidden)
        out[p + "self_attn.k_proj.weight"] = (kv, c.hidden)
        out[p + "self_attn.v_proj.weight"] = (kv, c.hidden)
        if c.attention_bias:
            out[p + "self_attn.q_proj.bias"] = (q,)
            out[p + "self_attn.k_proj.bias"] = (kv,)
            out[p + "self_attn.v_proj.bias"] = (kv,)
        out[p + "self_attn.o_proj.weight"] = (c.hidden, q)
        if c.attention_out_bias:
            out[p + "self_attn.o_proj.bias"] = (c.hidden,)
        if c.qk_norm:  # each head's (OLMo 2: all heads' together)
            out[p + "self_attn.q_norm.weight"] = (q,) if c.whole_qk_norm else (c.head_dim,)
            out[p + "self_attn.k_norm.weight"] = (kv,) if c.whole_qk_norm else (c.head_dim,)
        if not c.parallel_residual:  # (Phi-2's MLP reads the input_layernorm's output too)
            norm(p + "post_attention_layernorm")
        if c.sandwich_norm:
            norm(p + "pre_feedforward_layernorm")
        if c.sandwich_norm or c.post_norm:
            norm(p + "post_feedforward_layernorm")
        if c.moe_layer(i):  # the router and each expert's MLP (tilework.llm.moe)
            out[p + "mlp.gate.weight"] = (c.experts, c.hidden)
            for e in range(c.experts):
                out[p + f"mlp.experts.{e}.gate_proj.weight"] = (c.expert_ffn, c.hidden)
                out[p + f"mlp.experts.{e}.up_proj.weight"] = (c.expert_ffn, c.hidden)
                out[p + f"mlp.experts.{e}.down_proj.weight"] = (c.hidden, c.expert_ffn)
            if c.shared_ffn:  # Qwen2-MoE's shared expert and its gate
                out[p + "mlp.shared_expert.gate_proj.weight"] = (c.shared_ffn, c.hidden)
                out[p + "mlp.shared_expert.up_proj.weight"] = (c.shared_ffn, c.hidden)
                out[p + "mlp.shared_expert.down_proj.weight"] = (c.hidden, c.shared_ffn)
                out[p + "mlp.shared_expert_gate.weight"] = (1, c.hidden)
            continue
        if c.gated_mlp:
            out[p + "mlp.gate_proj.weight"] = (c.ffn, c.hidden)
        out[p + "mlp.up_proj.weight"] = (c.ffn, c.hidden)
        out[p + "mlp.down_proj.weight"] = (c.hidden, c.ffn)
        if c.mlp_bias:
            if c.gated_mlp:
                out[p + "mlp.gate_proj.bias"] = (c.ffn,)
            out[p + "mlp.up_proj.bias"] = (c.ffn,)
            out[p + "mlp.down_proj.bias"] = (c.hidden,)
    norm("model.norm")
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab, c.hidden)
    if c.head_bias:
        out["lm_head.bias"] = (c.vocab,)
    return out


def _rotate_half_rows(config: LlmConfig, tensors: dict[str, QuantTensor]) -> dict[str, QuantTensor]:
    """A checkpoint whose rotary embedding pairs dims ``2i, 2i + 1`` of a head (ERNIE 4.5) with its
    q / k rows (weights and biases) gathered into the rotate-half order the decoder's rotary
    embedding takes: the same pairs turned by the same angles (``tilework.llm.gguf.INTERLEAVED``)."""
    out = dict(tensors)
    for name, t in tensors.items():
        heads = config.heads if ".self_attn.q_proj." in name else config.kv_heads if ".self_attn.k_proj." in name else None
        if heads is not None:
            if t.shape[0] != heads * config.head_dim:
                raise ShapeError(f"tensor {name} has {t.shape[0]} rows, expected {heads} heads x {config.head_dim}")
            out[name] = t.gather_rows(rope_row_order(heads, config.head_dim))
    return out


def gemma_norm_multipliers(tensors: dict[str, QuantTensor]) -> dict[str, QuantTensor]:
    """A Gemma checkpoint's tensors with each RMSNorm weight ``w`` (``*norm.weight``) made the
    multiplier ``1 + w`` in float32, as transformers' ``GemmaRMSNorm`` / ``Gemma2RMSNorm`` / ``Gemma3RMSNorm`` compute it and as
    llama.cpp's converter stores it in a GGUF file: the decoder's norms multiply by their weight."""
    out = dict(tensors)
    for name, t in tensors.items():
        if name.endswith("norm.weight"):
            values = (1.0 + t.dequantize().astype(np.float32)).reshape(t.shape)
            out[name] = QuantTensor(name, t.shape, "f32", values.view(np.uint8).reshape(t.shape[:-1] + (t.shape[-1] * 4,)))
    return out


# a multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration): its text decoder's tensors
# under these prefixes (transformers 5's and earlier versions' names), the vision tower's dropped
_GEMMA_TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."))
_GEMMA_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def _gemma_text_tensors(tensors: dict[str, QuantTensor]) -> dict[str, QuantTensor]:
    """The text decoder's tensors of a Gemma 3 checkpoint under ``Gemma3ForCausalLM``'s names (a
    text-only checkpoint's as they are)."""
    out = {}
    for name, t in tensors.items():
        if name.startswith(_GEMMA_VISION_PREFIXES):
            continue
        for old, new in _GEMMA_TEXT_PREFIXES:
            if name.startswith(old):
                name = new + name[len(old) :]
                t = dataclasses.replace(t, name=name)
                break
        out[name] = t
    return out


def read_safetensors(path: "str | os.PathLike[str]") -> dict[str, QuantTensor]:
    """The tensors of one safetensors file (F32, F16, BF16), as read-only views of its map."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= size - 8:
                raise ValueError(f"header length {n} in a file of {size} bytes")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise TileworkError(f"{path}: not a readable safetensors file ({e})") from e
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        fmt = _SAFETENSORS_FORMATS.get(info["dtype"])
        if fmt is None:
            raise UnsupportedError(f"{path}: tensor {name} has dtype {info['dtype']}, which tilework does not read; readable: {', '.join(_SAFETENSORS_FORMATS)}")
        shape = tuple(int(d) for d in info["shape"])
        if not shape:
            raise UnsupportedError(f"{path}: tensor {name} is a scalar; model weights are tensors")
        start, end = (8 + n + int(o) for o in info["data_offsets"])
        nbytes = math.prod(shape) * block_format(fmt).nbytes
        if end - start != nbytes or end > size:
            raise TileworkError(f"{path}: tensor {name} of shape {list(shape)} {info['dtype']} has a bad byte range [{start}, {end})")
        data = mm[start:end].view(np.ndarray).reshape(shape[:-1] + (shape[-1] * block_format(fmt).nbytes,))
        out[name] = QuantTensor(name, shape, fmt, data)
    return out


def model_kind(path: str) -> str:
    """``"gguf"`` or ``"checkpoint"`` (transformers safetensors): a GGUF file is known by its
    magic bytes, whatever its name (``model.bin``, ``model.GGUF``), a safetensors file by its
    header. The one place that tells them apart."""
    if os.path.isdir(path):
        return "checkpoint"
    if not os.path.exists(path):
        raise TileworkError(f"{path}: no such file or directory")
    with open(path, "rb") as f:
        head = f.read(9)
    if not head:
        raise FileFormatError(f"{path}: the file is empty (not a GGUF file or a safetensors checkpoint)")
    if head[:4] == GGUF_MAGIC:
        return "gguf"
    if len(head) == 9 and head[8:] == b"{" and int.from_bytes(head[:8], "little") <= os.path.getsize(path) - 8:
        return "checkpoint"
    if path.lower().endswith(".gguf"):
        raise UnsupportedError(f"{path}: not a GGUF file (it starts with {head[:4]!r}, not {GGUF_MAGIC!r})")
    raise UnsupportedError(f"{path}: neither a GGUF file nor a safetensors checkpoint (it starts with {head[:8]!r})")


def _checkpoint_files(path: str) -> tuple[str, list[str]]:
    """``(config.json, safetensors files)`` of a checkpoint directory or of one safetensors file."""
    if not os.path.isdir(path):
        config = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
        if not os.path.isfile(config):
            raise TileworkError(f"{path}: a safetensors file needs the checkpoint's config.json beside it ({config} does not exist)")
        return config, [path]
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise TileworkError(f"{path}: a checkpoint directory needs a config.json")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise FileFormatError(f"{index}: not a safetensors index (a JSON object whose weight_map maps tensors to files): {type(e).__name__}: {e}") from None
        return config, [os.path.join(path, s) for s in shards]
    shards = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not shards:
        raise TileworkError(f"{path}: no .safetensors files (tilework reads safetensors checkpoints only)")
    return config, shards


def _names(names: list[str], limit: int = 8) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _checked(config: LlmConfig, tensors: dict[str, QuantTensor], where: str) -> dict[str, QuantTensor]:
    """``tensors`` in the order of :func:`expected_shapes`, once they are exactly those."""
    want = expected_shapes(config)
    missing = [n for n in want if n not in tensors]
    if missing:
        raise ParameterError(f"{where}: missing tensors of a {config.layers}-layer {config.architecture} model: {_names(missing)}")
    extra = [n for n in tensors if n not in want]
    if extra:
        raise UnsupportedError(f"{where}: tensors a {config.architecture} model of this config does not have: {_names(extra)}")
    for name, shape in want.items():
        if tensors[name].shape != shape:
            raise ShapeError(f"{where}: tensor {name} has shape {list(tensors[name].shape)}, the config implies {list(shape)}")
    return {n: tensors[n] for n in want}

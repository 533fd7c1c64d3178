"""GGUF files: metadata, and tensors as :class:`~tilework.llm.quant.QuantTensor` views.

A file is opened with ``gguf.GGUFReader``, which memory-maps it read-only. Each tensor's bytes
are a view of that map (nothing is read until used); its logical shape is GGUF's dim list
reversed, since GGUF lists dims fastest-first (``attn_k`` ``[576, 192]`` is 192 rows of 576).

Names are mapped to the transformers Llama names (``blk.{i}.attn_q.weight`` ->
``model.layers.{i}.self_attn.q_proj.weight``, ...). llama.cpp's converter reorders the rows of
``attn_q`` and ``attn_k`` (weights and biases) of ``llama`` models for its rotary layout: within
each head, transformers pairs dim ``i`` with ``i + head_dim / 2`` (rotate-half), llama.cpp pairs
``2i`` with ``2i + 1``. :func:`gguf_tensors` undoes it by gathering whole rows, which copies the
quantized bytes of those two tensors per layer and nothing else. ``qwen2`` files keep the
transformers order.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from tilework.errors import ShapeError, TileworkError, UnsupportedError
from tilework.llm.quant import QUANT_FORMATS, QuantTensor, format_of_ggml_type

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderField

    from tilework.llm.config import LlmConfig

GGUF_MAGIC = b"GGUF"

_TOP_LEVEL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_PER_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_NAME = re.compile(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)")


def open_gguf(source: "str | os.PathLike[str] | GGUFReader") -> "GGUFReader":
    """A reader of the GGUF file at ``source`` (memory-mapped read-only); a reader is returned as is."""
    if not isinstance(source, (str, os.PathLike)):
        return source
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise TileworkError(f"{path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise UnsupportedError(f"{path}: not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path, "r")
    except Exception as e:  # the reader raises ValueError, struct.error, IndexError on damage
        raise TileworkError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e
    if getattr(reader, "byte_order", "I") != "I":
        raise UnsupportedError(f"{path}: a GGUF file of the other byte order is not supported")
    return reader


def reader_path(reader: "GGUFReader") -> str:
    """The file a reader maps (for messages)."""
    return str(getattr(reader.data, "filename", None) or "<gguf>")


def field_value(field: "ReaderField") -> Any:
    """A metadata field as Python: int, float, bool, str or a list of them. Strings are UTF-8;
    bytes that are not decode as surrogates (``.encode("utf-8", "surrogateescape")`` gives them back)."""
    from gguf import GGUFValueType

    def text(part: np.ndarray) -> str:
        return part.tobytes().decode("utf-8", errors="surrogateescape")

    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        if field.types[-1] == GGUFValueType.STRING:
            return [text(field.parts[i]) for i in field.data]
        if not field.data:
            return []
        return np.concatenate([field.parts[i] for i in field.data]).tolist()
    if kind == GGUFValueType.STRING:
        return text(field.parts[field.data[0]])
    return field.parts[field.data[0]].tolist()[0]


def gguf_metadata(source: "str | os.PathLike[str] | GGUFReader") -> dict[str, Any]:
    """Every key/value of a GGUF file's metadata (not the ``GGUF.*`` header fields)."""
    reader = open_gguf(source)
    return {k: field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def raw_tensors(source: "str | os.PathLike[str] | GGUFReader") -> dict[str, QuantTensor]:
    """The tensors under their GGUF names, rows as stored: read-only views of the memory map."""
    reader = open_gguf(source)
    out = {}
    for t in reader.tensors:
        fmt = format_of_ggml_type(int(t.tensor_type))
        if fmt is None:
            raise UnsupportedError(f"{reader_path(reader)}: tensor {t.name} is stored as {t.tensor_type.name}, which tilework does not read; readable formats: {', '.join(f.upper() for f in QUANT_FORMATS)}")
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        start = int(t.data_offset)
        data = reader.data[start : start + int(t.n_bytes)].view(np.ndarray)
        out[t.name] = QuantTensor(t.name, shape, fmt.name, data.reshape(shape[:-1] + (fmt.row_bytes(shape[-1]),)))
    return out


def hf_tensor_name(gguf_name: str) -> str | None:
    """The transformers Llama name of a GGUF tensor name, or None when it has none."""
    m = _NAME.fullmatch(gguf_name)
    if m is None:
        return None
    layer, part, kind = m.groups()
    if layer is None:
        base = _TOP_LEVEL.get(part)
        return None if base is None else f"{base}.{kind}"
    base = _PER_LAYER.get(part)
    return None if base is None else f"model.layers.{int(layer)}.{base}.{kind}"


def rope_row_order(n_heads: int, head_dim: int) -> np.ndarray:
    """``order`` with ``hf_rows = gguf_rows[order]`` for a llama ``attn_q`` / ``attn_k``:
    transformers row ``h * head_dim + k * head_dim/2 + i`` is llama.cpp row ``h * head_dim + 2i + k``."""
    return np.arange(n_heads * head_dim).reshape(n_heads, head_dim // 2, 2).transpose(0, 2, 1).reshape(-1)


def gguf_tensors(source: "str | os.PathLike[str] | GGUFReader", config: "LlmConfig") -> dict[str, QuantTensor]:
    """The tensors under their transformers names, with transformers' row order (see the
    module docstring); every tensor but the reordered ``q_proj`` / ``k_proj`` is a view of the map."""
    reader = open_gguf(source)
    out = {}
    for gguf_name, t in raw_tensors(reader).items():
        name = hf_tensor_name(gguf_name)
        if name is None:
            raise UnsupportedError(f"{reader_path(reader)}: tensor {gguf_name} has no counterpart in a {config.architecture} model")
        part = _NAME.fullmatch(gguf_name).group(2)  # type: ignore[union-attr]  # it has a name, so it matched
        heads = {"attn_q": config.heads, "attn_k": config.kv_heads}.get(part)
        if config.architecture == "llama" and heads is not None:
            if t.shape[0] != heads * config.head_dim:
                raise ShapeError(f"{reader_path(reader)}: tensor {gguf_name} has {t.shape[0]} rows, expected {heads} heads x {config.head_dim}")
            t = t.gather_rows(rope_row_order(heads, config.head_dim))
        out[name] = dataclasses.replace(t, name=name)
    return out

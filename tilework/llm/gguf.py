"""GGUF files: metadata, and tensors as :class:`~tilework.llm.quant.QuantTensor` views.

:func:`read_gguf` gives a :class:`GGUFFile`: the metadata and tensor table as ``gguf.GGUFReader``
reads them (kept as a JSON index in the cache directory, since the reader takes seconds on a
large vocabulary), and the file memory-mapped read-only. Each tensor's bytes are a view of that
map (nothing is read until used); its logical shape is GGUF's dim list reversed, since GGUF lists
dims fastest-first (``attn_k`` ``[576, 192]`` is 192 rows of 576).

Names are mapped to the transformers Llama names (``blk.{i}.attn_q.weight`` ->
``model.layers.{i}.self_attn.q_proj.weight``, ...). llama.cpp's converter reorders the rows of
``attn_q`` and ``attn_k`` (weights and biases) of ``llama``, ``smollm3`` and ``granite`` models for its rotary layout: within
each head, transformers pairs dim ``i`` with ``i + head_dim / 2`` (rotate-half), llama.cpp pairs
``2i`` with ``2i + 1``. :func:`gguf_tensors` undoes it by gathering whole rows, which copies the
quantized bytes of those two tensors per layer and nothing else. ``qwen2`` and ``qwen3`` files
keep the transformers order (llama.cpp rotates them rotate-half, as transformers does), so
``qwen3``'s per-head ``attn_q_norm`` / ``attn_k_norm`` weights are in transformers' order too;
so do ``starcoder2`` files and ``phi2`` files (llama.cpp turns their first ``rope.dimension_count`` dims rotate-half;
their q, k and v one ``attn_qkv`` tensor in some, three in others; their norms' and head's
biases ``attn_norm.bias``, ``output_norm.bias``, ``output.bias``) and ``gemma``, ``gemma2`` and ``gemma3`` files, whose norm weights are the multipliers ``1 + w`` (llama.cpp's converter
adds the 1 transformers' Gemma norms add), as tilework's Gemma norms take them (Gemma 1's two a
layer named as a Llama's: ``ffn_norm`` is ``post_attention_layernorm``, the norm before the MLP). ``ernie4_5``
pairs ``2i`` with ``2i + 1`` in transformers itself, and its files keep that order: its rows are
gathered the same way, into the rotate-half order tilework's rotary embedding takes (a
transformers ERNIE checkpoint's rows too: ``tilework.llm.weights``), the same pairs turned by
the same angles.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tilework.errors import FileFormatError, ShapeError, TileworkError, UnsupportedError
from tilework.llm.quant import QUANT_FORMATS, QuantTensor, format_of_ggml_type
from tilework.runtime.atomic import write_atomic

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
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    # a mixture of experts' router, and its experts' projections stacked ([experts, out, in]:
    # tilework.llm.weights.split_experts parts them)
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    # Qwen2-MoE's shared expert and its gate (a GGUF vector of hidden weights: the [1, hidden] matrix)
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# Gemma 2's and 3's four norms a layer (Gemma 1's two are a Llama's): ffn_norm is the one before the MLP, and two more after the sublayers
_GEMMA_PER_LAYER = {
    **_PER_LAYER,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Phi-3: the q, k, v projections one tensor, the MLP's gate and up another (weights.split_fused parts them)
_PHI3_PER_LAYER = {**_PER_LAYER, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
# OLMo 2, EXAONE 4: the two norms after the sublayers only (no attn_norm, no ffn_norm)
_OLMO2_PER_LAYER = {k: v for k, v in _GEMMA_PER_LAYER.items() if k not in ("attn_norm", "ffn_norm")}
# Phi-2: the q, k, v projections one tensor in some files (attn_qkv), three in others; its MLP's up and down (fc1, fc2) as llama's
_PHI2_PER_LAYER = {**_PER_LAYER, "attn_qkv": "self_attn.qkv_proj"}
_PER_LAYER_OF = {"gemma2": _GEMMA_PER_LAYER, "gemma3": _GEMMA_PER_LAYER, "phi3": _PHI3_PER_LAYER, "olmo2": _OLMO2_PER_LAYER, "exaone4": _OLMO2_PER_LAYER, "phi2": _PHI2_PER_LAYER}
_NAME = re.compile(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)")
_EXPERT_NAME = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight")  # one expert's matrix (older Mixtral files)
PERMUTED = ("llama", "smollm3", "granite", "granitemoe")  # architectures whose attn_q / attn_k rows llama.cpp's converter reorders (see the module docstring)
# architectures whose rotary embedding pairs dims 2i, 2i + 1 of a head in transformers too (their
# checkpoints' and GGUF files' q / k rows alike): reordered on loading as llama's GGUF rows are
INTERLEAVED = ("ernie4_5",)
FREQ_FACTORS_TENSOR = "rope_freqs.weight"  # per-frequency rotary divisors: part of the config (LlmConfig.from_gguf), not a weight
CONFIG_TENSORS = (FREQ_FACTORS_TENSOR, "rope_factors_short.weight", "rope_factors_long.weight")  # read into the config (phi3's longrope: the other two)


@dataclasses.dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of a GGUF file's tensor table: ``shape`` is the logical shape (GGUF's dims
    reversed), ``offset`` the absolute position of its bytes in the file."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class GGUFFile:
    """A GGUF file's metadata (``key -> value``, Python values as :func:`field_value` gives
    them) and tensor table, with the file memory-mapped read-only on first use of :attr:`data`."""

    def __init__(self, path: str, metadata: dict[str, Any], tensors: list[GGUFTensorInfo]) -> None:
        self.path = path
        self.metadata = metadata
        self.tensors = tensors
        self._data: np.ndarray | None = None

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._data

    def tensor_bytes(self, t: GGUFTensorInfo) -> np.ndarray:
        if t.offset + t.nbytes > self.data.size:
            raise TileworkError(f"{self.path}: tensor {t.name} ends at byte {t.offset + t.nbytes}, past the end of the file ({self.data.size} bytes): the file is truncated")
        return self.data[t.offset : t.offset + t.nbytes].view(np.ndarray)


_INDEX_VERSION = 1


def read_gguf(source: "str | os.PathLike[str] | GGUFFile | GGUFReader", *, use_cache: bool = True) -> GGUFFile:
    """The GGUF file at ``source`` (a :class:`GGUFFile` or an open ``gguf.GGUFReader`` is taken as is).

    ``gguf.GGUFReader`` takes seconds on a 49152-token vocabulary, so the metadata and tensor
    table it reads are kept as JSON in the cache directory (``$TILEWORK_CACHE_DIR/llm``, written
    atomically) under a key of the file's real path, size and modification time; a later read
    of the same file loads that instead. The index holds data only: no code runs from it."""
    if isinstance(source, GGUFFile):
        return source
    if not isinstance(source, (str, os.PathLike)):
        return _from_reader(source)
    path = _checked_path(source)
    index = _index_path(path) if use_cache else None
    if index is not None:
        cached = _load_index(index, path)
        if cached is not None:
            return cached
    gf = _from_reader(open_gguf(path))
    if index is not None:
        _save_index(index, gf)
    return gf


def open_gguf(source: "str | os.PathLike[str] | GGUFReader") -> "GGUFReader":
    """A ``gguf.GGUFReader`` of the file at ``source`` (memory-mapped read-only); a reader is
    returned as is. Slow on large vocabularies: :func:`read_gguf` caches what it reads."""
    if not isinstance(source, (str, os.PathLike)):
        return source
    path = _checked_path(source)
    try:
        reader = _reader_class()(path, "r")
    except Exception as e:  # the reader raises ValueError, struct.error, IndexError on damage
        raise FileFormatError(f"{path}: not a readable GGUF file: it is truncated or damaged ({os.path.getsize(path)} bytes; {type(e).__name__}: {e})") from e
    if getattr(reader, "byte_order", "I") != "I":
        raise UnsupportedError(f"{path}: a GGUF file of the other byte order is not supported")
    return reader


@functools.lru_cache(maxsize=None)
def _reader_class() -> type["GGUFReader"]:
    """``gguf.GGUFReader`` reading the file's bytes through a plain ndarray view of its map:
    its parse slices them hundreds of thousands of times (every string of the vocabulary), and
    each slice of an ``np.memmap`` runs Python code (``memmap.__array_finalize__``). The map is
    the same (the view's base, whose ``filename`` names the file)."""
    from gguf import GGUFReader

    class Reader(GGUFReader):
        @property  # type: ignore[override]  # the same bytes as a plain ndarray, not a memmap
        def data(self) -> np.ndarray:
            return self._tw_bytes

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._tw_bytes = value.view(np.ndarray)

    return Reader


def _checked_path(source: "str | os.PathLike[str]") -> str:
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise TileworkError(f"{path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise UnsupportedError(f"{path}: not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    return path


def _from_reader(reader: "GGUFReader") -> GGUFFile:
    metadata = {k: field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = [
        GGUFTensorInfo(t.name, int(t.tensor_type), tuple(int(n) for n in reversed(t.shape.tolist())), int(t.data_offset), int(t.n_bytes))
        for t in reader.tensors
    ]
    gf = GGUFFile(reader_path(reader), metadata, tensors)
    gf._data = reader.data
    return gf


def _index_path(path: str) -> Path | None:
    from tilework.codegen.c.toolchain import cache_dir

    st = os.stat(path)
    key = json.dumps([_INDEX_VERSION, os.path.realpath(path), st.st_size, st.st_mtime_ns])
    try:
        return cache_dir() / "llm" / f"gguf-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    except TileworkError:
        return None  # no usable cache directory: read the file each time


def _load_index(index: Path, path: str) -> GGUFFile | None:
    try:
        blob = json.loads(index.read_text(encoding="utf-8"))
        metadata, rows = blob["metadata"], blob["tensors"]
        if blob.get("version") != _INDEX_VERSION or not isinstance(metadata, dict) or not isinstance(rows, list):
            return None
        tensors = [GGUFTensorInfo(str(n), int(k), tuple(int(d) for d in shape), int(o), int(b)) for n, k, shape, o, b in rows]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or damaged: read the file again
    return GGUFFile(path, metadata, tensors)


def _save_index(index: Path, gf: GGUFFile) -> None:
    blob = {"version": _INDEX_VERSION, "metadata": gf.metadata, "tensors": [[t.name, t.ggml_type, list(t.shape), t.offset, t.nbytes] for t in gf.tensors]}
    data = json.dumps(blob).encode("utf-8")
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(index, lambda fh: fh.writelines([data]))
    except (OSError, TileworkError):
        pass  # a read-only cache only costs the next start its speed


def reader_path(reader: "GGUFReader") -> str:
    """The file a reader maps (for messages)."""
    data = reader.data
    return str(getattr(data, "filename", None) or getattr(data.base, "filename", None) or "<gguf>")


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


def gguf_metadata(source: "str | os.PathLike[str] | GGUFFile | GGUFReader") -> dict[str, Any]:
    """Every key/value of a GGUF file's metadata (not the ``GGUF.*`` header fields)."""
    return read_gguf(source).metadata


def raw_tensors(source: "str | os.PathLike[str] | GGUFFile | GGUFReader") -> dict[str, QuantTensor]:
    """The tensors under their GGUF names, rows as stored: read-only views of the memory map."""
    gf = read_gguf(source)
    out = {}
    for t in gf.tensors:
        fmt = format_of_ggml_type(t.ggml_type)
        if fmt is None:
            raise UnsupportedError(f"{gf.path}: tensor {t.name} is stored as {_ggml_type_name(t.ggml_type)}, which tilework does not read; readable formats: {', '.join(f.upper() for f in QUANT_FORMATS)}")
        data = gf.tensor_bytes(t)
        out[t.name] = QuantTensor(t.name, t.shape, fmt.name, data.reshape(t.shape[:-1] + (fmt.row_bytes(t.shape[-1]),)))
    return out


def _ggml_type_name(code: int) -> str:
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(code).name
    except (ImportError, ValueError):
        return f"GGML type {code}"


def hf_tensor_name(gguf_name: str, architecture: str = "llama") -> str | None:
    """The transformers name of a GGUF tensor name in a model of ``architecture`` (Llama's
    names; Gemma's norms are others), or None when it has none."""
    m = _NAME.fullmatch(gguf_name)
    if m is None:
        e = _EXPERT_NAME.fullmatch(gguf_name)
        return None if e is None else f"model.layers.{int(e.group(1))}.mlp.experts.{int(e.group(3))}.{e.group(2)}_proj.weight"
    layer, part, kind = m.groups()
    if layer is None:
        base = _TOP_LEVEL.get(part)
        return None if base is None else f"{base}.{kind}"
    base = _PER_LAYER_OF.get(architecture, _PER_LAYER).get(part)
    return None if base is None else f"model.layers.{int(layer)}.{base}.{kind}"


def rope_row_order(n_heads: int, head_dim: int) -> np.ndarray:
    """``order`` with ``hf_rows = gguf_rows[order]`` for a llama ``attn_q`` / ``attn_k``:
    transformers row ``h * head_dim + k * head_dim/2 + i`` is llama.cpp row ``h * head_dim + 2i + k``."""
    return np.arange(n_heads * head_dim).reshape(n_heads, head_dim // 2, 2).transpose(0, 2, 1).reshape(-1)


def gguf_tensors(source: "str | os.PathLike[str] | GGUFFile | GGUFReader", config: "LlmConfig") -> dict[str, QuantTensor]:
    """The tensors under their transformers names, with transformers' row order (see the
    module docstring); every tensor but the reordered ``q_proj`` / ``k_proj`` is a view of the map."""
    gf = read_gguf(source)
    out = {}
    for gguf_name, t in raw_tensors(gf).items():
        if gguf_name in CONFIG_TENSORS:
            continue
        name = hf_tensor_name(gguf_name, config.architecture)
        if name is None:
            raise UnsupportedError(f"{gf.path}: tensor {gguf_name} has no counterpart in a {config.architecture} model")
        m = _NAME.fullmatch(gguf_name)
        heads = None if m is None else {"attn_q": config.heads, "attn_k": config.kv_heads}.get(m.group(2))
        if config.architecture in PERMUTED + INTERLEAVED and heads is not None:
            if t.shape[0] != heads * config.head_dim:
                raise ShapeError(f"{gf.path}: tensor {gguf_name} has {t.shape[0]} rows, expected {heads} heads x {config.head_dim}")
            t = t.gather_rows(rope_row_order(heads, config.head_dim))
        if name.endswith(".shared_expert_gate.weight") and len(t.shape) == 1:  # stored as a vector: a matrix of one row
            t = QuantTensor(name, (1, *t.shape), t.fmt, t.data.reshape(1, -1))
        out[name] = dataclasses.replace(t, name=name)
    return out

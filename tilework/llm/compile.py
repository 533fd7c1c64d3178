"""The compiled decoder of a model, built once per model shape, weight formats and machine.

``prepare_weights(config, tensors, precision)`` decides each weight's format and gives the
arrays in the decoder's parameter order: ``"q"`` keeps the file's block formats (quantized
matrices stay quantized; the q4_0, q4_1, q5_0, q5_1, q8_0, k-quant (q4_k, q5_k, q6_k, q3_k,
q2_k), iq4_nl and iq4_xs matrices whose rows are whole groups of 16, the token table among them,
are copied once into their interleaved layout,
``tilework.op.quant.interleave_rows``, which the quant backend's GEMV reads without
transposing (SmolLM2's tied q8_0 head, the plain and the interleaved rows alternating in one
process, cold: 1.22 ms instead of 1.25 at one row, 3.35 instead of 3.81 at eight; the lookup
of the prompt's rows decodes the layout too; peak memory measured the same, 283 MiB,
``bench/bench_llm.py``'s ``peak_rss_mib``);
the rest are views of the memory-mapped file), ``"bf16"`` converts
every matrix to bfloat16 (one tensor at a time, never the whole model in float32; in whole
groups of 16 rows, where the quant library has AVX-512 BF16, interleaved as ``bf16x16``, whose
GEMV reads one stream of weights and stores whole vectors of outputs: SmolLM2's matrices cold
1.0-1.6x at one row of x, 1.2-1.5x at eight, and whose GEMM reads the groups unpacked), ``"fp32"``
dequantizes them, and gives each float32 projection packed in column panels (the layout of
``tilework.llm.model.PackedLinear``; the token table too when the head is tied to it). Norm weights
are float32 in all three. Projections that share an input and a format are given as one matrix
(``tilework.llm.model.MERGED``: q/k/v, gate/up), their rows concatenated.

``compiled_decoder(config, formats)`` exports ``tilework.llm.model.LlamaDecoder`` (``prefill``
and ``decode``, symbolic batch, length and pages), builds it with the ``quant`` backend for the
block formats and tilework's kernels for the rest, and keeps the executable in the cache
directory (``$TILEWORK_CACHE_DIR/llm``, like the kernel cache) under a key of the config (less
its bos / eos tokens, which the graph does not read: a checkpoint and its GGUF file share one), the
formats, the batch bound, the KV cache's dtype, tilework's code and the machine; the next start
loads it (the kernels come from the kernel cache: no compiler runs); a second process that
wants the same model while it compiles waits for it (``tilework.codegen.cache.building``). Weights are not in the
executable: they are passed at every call.

``KV_DTYPE_OF[precision]`` is the KV cache's default dtype: bfloat16 for ``bf16`` and ``q``
(half the bytes a decode step's attention reads, which dominate at batch 8 and long prompts),
float32 for ``fp32``, which keeps the reference path's logits within 1e-3 of transformers'.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import time
import warnings
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from tilework.backend import quant
from tilework.codegen.cache import CacheWarning, building, cache_dir
from tilework.errors import TileworkError
from tilework.llm.config import LlmConfig
from tilework.llm.model import LlamaDecoder, decoder_spec, merged_parts
from tilework.nn.core import Parameter
from tilework.llm.quant import QuantTensor
from tilework.op.quant import GROUP, INTERLEAVED_FORMATS, interleavable, interleave_rows, interleaved
from tilework.runtime.executable import Executable
from tilework.runtime.pages import aligned, huge_page_arena, release_file_pages, trim_heap
from tilework.transform.panels import lay_out

PRECISIONS = ("q", "bf16", "fp32")
KV_DTYPE_OF = {"q": "bfloat16", "bf16": "bfloat16", "fp32": "float32"}
Progress = Callable[[str], None]


def prepare_weights(config: LlmConfig, tensors: Mapping[str, QuantTensor], precision: str, huge_pages: bool = False) -> tuple[dict[str, str], list[np.ndarray]]:
    """``(formats, arrays)``: each weight's format (``f32`` or a block format) and the arrays in
    the order of the decoder's parameters. Each array is made as its parameter comes (a tensor
    decoded, merged and laid out at a time: never the whole model twice), and the file pages of
    a tensor made into a copy leave the resident set (``release_file_pages``). ``huge_pages``:
    the arrays the loader makes (not views of the file) are written straight into one
    ``HugePageArena`` whose pages a thread faults in meanwhile (``tilework.runtime.pages``)."""
    if precision not in PRECISIONS:
        raise TileworkError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    formats = weight_formats(tensors, precision)
    decoder = LlamaDecoder(config, {n: f for n, f in formats.items() if f != "f32"})
    params = decoder.named_parameters()
    missing = [p for n, _ in params for p in (merged_parts(n, config.experts) or [n]) if p not in tensors]
    if missing:
        raise TileworkError(f"the model file lacks weight(s) {', '.join(missing[:5])}")
    groups = [(param, [tensors[p] for p in merged_parts(n, config.experts) or [n]]) for n, param in params]
    decoded = [[_decoded_bytes(t, formats[parts[0].name]) for t in parts] for _, parts in groups]  # a merged matrix's parts share a format
    made = [_made(param, parts, formats[parts[0].name], sizes) for (param, parts), sizes in zip(groups, decoded)]  # else a view of the file
    arena = None
    if huge_pages:
        arena = huge_page_arena(sum(aligned(int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize) for (p, _), m in zip(groups, made) if m), prefault=True)

    def new(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        return None if arena is None else arena.take(shape, dtype)

    # the decoded values of a parameter's tensors, side by side (a merged matrix's rows in
    # order: no concatenation), in one buffer reused from parameter to parameter
    scratch = np.empty(max((sum(sizes) for sizes in decoded), default=0), np.uint8)
    arrays = []
    for (param, parts), sizes, copied in zip(groups, decoded, made):
        fmt = formats[parts[0].name]
        offsets = np.cumsum([0, *sizes])
        values = [_rows(t, fmt, scratch[at : at + size] if size else None) for t, size, at in zip(parts, sizes, offsets)]
        if len(values) == 1:
            a = values[0]
        elif all(sizes):  # decoded side by side: the merged rows in order already
            a = scratch[: offsets[-1]].view(values[0].dtype).reshape(sum(len(v) for v in values), *values[0].shape[1:])
        else:
            a = np.concatenate(values)
        if len(param.shape) == 3 and a.ndim == 2:  # a PackedLinear's weight: laid out in panels
            a = lay_out(a, out=new(tuple(param.shape), a.dtype))
        elif fmt in INTERLEAVED_FORMATS:  # interleaved in groups of 16 rows (a merged matrix's parts too: whole groups each)
            a = _interleaved(a, fmt.removesuffix(f"x{GROUP}"), new(a.shape, a.dtype))
        if arena is not None and copied:
            a = arena.hold(a)
        elif np.may_share_memory(a, scratch):
            a = a.copy()  # the scratch holds the next parameter's values
        if copied:
            for t in parts:
                release_file_pages(t.data)  # read once: out of the resident set
        arrays.append(a)
    del scratch
    trim_heap()  # the temporaries' memory back to the system
    return {n: f for n, f in formats.items() if f != "f32"}, arrays


def weight_formats(tensors: Mapping[str, QuantTensor], precision: str) -> dict[str, str]:
    """The format ``prepare_weights`` gives each tensor (``f32`` or a block format)."""
    bf16_groups = precision == "bf16" and quant.bf16dot_available()  # bf16x16 where it has AVX-512 BF16; elsewhere the plain rows' kernels are faster
    return {name: _format(t, precision, bf16_groups) for name, t in tensors.items()}


def _format(t: QuantTensor, precision: str, bf16_groups: bool) -> str:
    """The format ``prepare_weights`` gives tensor ``t``."""
    if len(t.shape) != 2 or precision == "fp32" or (t.fmt == "f32" and precision == "q"):  # q keeps float32 matrices as they are
        return "f32"
    if precision == "bf16":
        return "bf16x16" if bf16_groups and interleavable("bf16", *t.shape) else "bf16"
    return (interleaved(t.fmt) or t.fmt) if interleavable(t.fmt, *t.shape) else t.fmt


def _interleaved(rows: np.ndarray, base: str, out: np.ndarray | None) -> np.ndarray:
    """``interleave_rows(rows, base, out)``, in the quant library where it is built (C on every
    thread, the same bytes: SmolLM2's q matrices 0.15 -> 0.03 s; ``library_if_built``: a first
    start does not wait for its compiler)."""
    lib = quant.library_if_built()
    return interleave_rows(rows, base, out=out) if lib is None else lib.interleave(rows, base, out=out)


def _made(param: Parameter, parts: list[QuantTensor], fmt: str, decoded: list[int]) -> bool:
    """Whether ``prepare_weights`` makes a new array for ``param`` (merged, laid out, interleaved
    or decoded: ``decoded`` the parts' ``_decoded_bytes``), rather than give a view of the
    file's bytes."""
    return len(parts) > 1 or (len(param.shape) == 3 and len(parts[0].shape) == 2) or fmt in INTERLEAVED_FORMATS or decoded[0] > 0


def _decoded_bytes(t: QuantTensor, fmt: str) -> int:
    """Bytes of the values tensor ``t`` is decoded to for format ``fmt`` (0: none, the file's
    bytes are used as they are)."""
    if fmt == "f32" and t.fmt != "f32":
        return int(np.prod(t.shape)) * 4
    if fmt in ("bf16", "bf16x16") and t.fmt != "bf16":
        return int(np.prod(t.shape)) * 2
    return 0


def _rows(t: QuantTensor, fmt: str, scratch: np.ndarray | None) -> np.ndarray:
    """Tensor ``t``'s values for format ``fmt`` before any layout (panels, interleaving): decoded
    into ``scratch`` (``_decoded_bytes`` of it) where it is given, else the file's bytes."""
    if fmt == "f32":
        return t.data.view(np.float32).reshape(t.shape) if scratch is None else t.dequantize(out=scratch.view(np.float32))
    if fmt in ("bf16", "bf16x16"):
        bits = t.data if scratch is None else t.dequantize(bf16=True, out=scratch.view(np.uint16))
        return np.ascontiguousarray(bits).view(np.uint8).reshape(t.shape[0], t.shape[1] * 2)
    return t.data


def compiled_decoder(
    config: LlmConfig,
    formats: Mapping[str, str],
    *,
    max_batch: int = 16,
    kv_dtype: str = "float32",
    progress: Progress | None = None,
    use_cache: bool = True,
) -> Executable:
    """The executable of the decoder (see the module docstring); ``kv_dtype`` is the KV cache's
    (``tilework.llm.kv_cache.KV_DTYPES``)."""
    say = progress or (lambda _msg: None)
    path = _cache_path(config, formats, max_batch, kv_dtype)
    if not use_cache:
        return _build(config, formats, max_batch, kv_dtype, say, None)
    exe = _load_cached(path, say)
    if exe is not None:
        return exe
    with building(cache_dir(), path.stem):  # another process compiling this model: wait for it
        return _load_cached(path, say) or _build(config, formats, max_batch, kv_dtype, say, path)


def _load_cached(path: Path, say: Progress) -> Executable | None:
    if not path.exists():
        return None
    say("loading the compiled model")
    try:
        exe = Executable.load(str(path))
    except TileworkError:
        return None  # a stale or damaged entry: build again
    # our own entry in the private cache directory (its content hash checked on load), not a
    # file from elsewhere: its kernel calls need no per-call argument checks
    exe.untrusted = False
    return exe


def _build(config: LlmConfig, formats: Mapping[str, str], max_batch: int, kv_dtype: str, say: Progress, path: Path | None) -> Executable:
    if not _BUILDER:
        raise TileworkError("no compiler is registered: import tilework (tilework.driver registers tilework.build)")
    t0 = time.perf_counter()
    if formats:  # the matrices' library (the paths their formats take), compiled meanwhile (the native runtime loads it)
        quant.library_in_background(quant.families_of(formats.values()))
    say("exporting the decoder (prefill and decode)")
    decoder = LlamaDecoder(config, dict(formats))
    module, _ = decoder.export(decoder_spec(config, max_batch=max_batch, kv_dtype=kv_dtype))
    say("compiling (graph passes, fusion, kernels; once per model and machine)")
    backends = ["quant", "codegen"] if formats else None
    exe = _BUILDER[0](module, backends=backends)
    exe.meta["llm"] = {"config": config.to_dict(), "max_batch": max_batch, "kv_dtype": kv_dtype, "compile_s": round(time.perf_counter() - t0, 2)}
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            exe.save(str(path))
        except OSError as e:  # a read-only cache: the model runs, it is compiled again next time
            warnings.warn(f"the compiled model is not kept in the cache ({e})", CacheWarning, stacklevel=2)
    return exe


_BUILDER: list[Callable[..., Executable]] = []


def register_builder(build: Callable[..., Executable]) -> None:
    """Make ``compiled_decoder`` compile with ``build`` (``tilework.build``, registered by the
    layer above: the LLM flow sits below the driver)."""
    _BUILDER[:] = [build]


# config fields the compiled graph does not read (the tokenizer's and the sampler's): an
# executable built for one serves a model that differs only there
_GRAPH_FREE_FIELDS = ("bos_token_id", "eos_token_ids")


def _cache_path(config: LlmConfig, formats: Mapping[str, str], max_batch: int, kv_dtype: str = "float32") -> Path:
    graph = {k: v for k, v in config.to_dict().items() if k not in _GRAPH_FREE_FIELDS}
    blob = json.dumps(
        {"config": graph, "formats": sorted(formats.items()), "max_batch": max_batch, "kv_dtype": kv_dtype, "code": _code_identity(), "machine": platform.machine()},
        sort_keys=True,
        default=str,
    )
    return cache_dir() / "llm" / f"decoder-{hashlib.sha256(blob.encode()).hexdigest()[:24]}.tw"


@functools.lru_cache(maxsize=1)
def _code_identity() -> str:
    """A digest of tilework's sources: an executable built by other code is not reused."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".c") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


__all__ = ["PRECISIONS", "KV_DTYPE_OF", "prepare_weights", "weight_formats", "compiled_decoder", "register_builder"]

"""GGUF files the benchmarks make for themselves: an F32 copy of a file, llama.cpp's
requantizations of it, and a random-weight Llama whose widths are multiples of 256.

Every file is made once under ``<temp>/tilework-bench/`` (written to a ``.partial`` name, then
renamed) and reused while it is newer than what it was made from:

- :func:`f32_gguf`: a file's metadata and every tensor dequantized to F32 (the ``gguf``
  package): ``<stem>.F32.gguf``;
- :func:`quantized`: an F32 file quantized by llama.cpp (llama-cpp-python's
  ``llama_model_quantize``) to one of its file types (``Q4_K_M``, ``Q8_0``, ...):
  ``<stem>.F32.gguf`` -> ``<stem>.Q4_K_M.gguf``;
- :func:`random_llama_gguf`: a Llama-architecture F32 file of random weights
  (:class:`RandomLlama`: normal, std 0.02 for the matrices and the token table, 1.0 for the
  norms) with the vocabulary, tokenizer, rotary base and norm epsilon of the embedded
  SmolLM2-135M (``tilework.llm.engine.default_model_path``), the head tied to the token table
  as SmolLM2's. Its widths (default hidden 1024, intermediate 2816) are multiples of 256, so
  llama.cpp's k-quant mixes hold k-quant blocks (``Q4_K_M``: Q4_K and Q6_K), where SmolLM2's
  576 falls back to Q5_0 / Q8_0; with ``experts``, a mixture of experts in every layer
  (Mixtral's layout: a router ``ffn_gate_inp``, the experts stacked in ``ffn_*_exps``);
- :func:`block_formats`: the tensor types a file holds, with their counts;
- :func:`llama_cpp_scores`: llama.cpp's logits of a file after every prefix of some tokens.

    python bench/gguf_files.py [--ftype Q4_K_M] [--hidden 1024 ...]

makes the random Llama in ``--ftype`` and prints its path and tensor types.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

# the random Llama's metadata taken from the embedded model: everything of its vocabulary and
# tokenizer, and these hyperparameters; the architecture's widths are the config's
KEPT_KEYS = ("llama.context_length", "llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon", "llama.vocab_size")
GENERATION = 1  # bump when random_llama_gguf writes other weights for the same config


def cache_dir() -> Path:
    d = Path(tempfile.gettempdir()) / "tilework-bench"
    d.mkdir(parents=True, exist_ok=True)
    return d


def fresh(dst: Path, src: str | Path) -> bool:
    """``dst`` exists and was made after ``src`` last changed."""
    return dst.exists() and dst.stat().st_mtime > Path(src).stat().st_mtime


def copy_fields(reader: Any, writer: Any, keep: Callable[[str], bool]) -> None:
    """Copy the key-value fields of ``reader`` that ``keep`` names into ``writer`` (never the
    ``GGUF.*`` header fields, the architecture or the file type, which the writer sets)."""
    import gguf

    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.file_type") or not keep(f.name):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), vtype, sub_type=sub)


def _write(writer: Any, tmp: Path, dst: Path) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(dst)


def f32_gguf(src: str) -> str:
    """An F32 GGUF of ``src``'s weights (metadata copied, every tensor dequantized), made once
    under the temp directory."""
    import gguf

    dst = cache_dir() / f"{Path(src).stem}.F32.gguf"
    if fresh(dst, src):
        return str(dst)
    reader = gguf.GGUFReader(src)
    tmp = dst.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(tmp), reader.fields["general.architecture"].contents())
    copy_fields(reader, writer, lambda name: True)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32))
    _write(writer, tmp, dst)
    return str(dst)


def quantized(f32: str, ftype: str, threads: int | None = None) -> str:
    """The F32 GGUF ``f32`` quantized by llama.cpp to ``ftype`` (``llama_cpp.LLAMA_FTYPE_MOSTLY_<ftype>``:
    ``Q4_K_M``, ``Q8_0``, ...), made once beside it; ``F32`` is ``f32`` itself."""
    if ftype == "F32":
        return f32
    import llama_cpp

    dst = Path(f32).with_name(Path(f32).name.removesuffix(".F32.gguf") + f".{ftype}.gguf")
    if fresh(dst, f32):
        return str(dst)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads or int(os.environ.get("OMP_NUM_THREADS", "2"))
    tmp = dst.with_suffix(".partial")
    rc = llama_cpp.llama_model_quantize(f32.encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize to {ftype} failed ({rc})")
    tmp.rename(dst)
    return str(dst)


def tensor_types(path: str) -> Counter[str]:
    """How many tensors of each type (``Q4_K``, ``F32``, ...) the GGUF file ``path`` holds."""
    import gguf

    return Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)


def llama_cpp_scores(path: str, tokens: list[int], threads: int | None = None, f32_cache: bool = False) -> np.ndarray:
    """llama.cpp's logits after every prefix of ``tokens`` (one batch, ``logits_all``); its KV
    cache float16 (llama.cpp's default), or float32 with ``f32_cache`` (then a float32 model's
    logits are float32 work throughout: what a tight comparison wants)."""
    import llama_cpp

    threads = threads or int(os.environ.get("OMP_NUM_THREADS", "2"))
    cache = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if f32_cache else {}
    llm = llama_cpp.Llama(path, n_ctx=max(512, len(tokens) + 8), n_batch=512, n_threads=threads, logits_all=True, verbose=False, **cache)
    try:
        llm.eval(tokens)
        return np.array(llm.scores[: len(tokens)], np.float32)
    finally:
        llm.close()


def file_type(path: str) -> str:
    """The llama.cpp file type the GGUF file ``path`` says it is (``general.file_type``):
    ``Q4_K_M``, ``Q4_1``, ``F32``...; ``?`` where it does not say."""
    import gguf

    field = gguf.GGUFReader(path).fields.get("general.file_type")
    if field is None:
        return "?"
    try:
        return gguf.LlamaFileType(int(field.contents())).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"file type {field.contents()}"


def block_formats(path: str) -> str:
    """``tensor_types(path)`` as text, the most common first: ``"Q4_K 97, F32 65, Q6_K 16"``."""
    return ", ".join(f"{name} {n}" for name, n in sorted(tensor_types(path).items(), key=lambda kv: -kv[1]))


@dataclass(frozen=True)
class RandomLlama:
    """A random-weight Llama: widths, depth, and how its weights are drawn (normal: ``std`` for
    the matrices and the token table, every norm weight 1.0)."""

    hidden: int = 1024
    intermediate: int = 2816
    heads: int = 16
    kv_heads: int = 4
    layers: int = 16
    std: float = 0.02
    seed: int = 0
    experts: int = 0  # > 0: a mixture of experts in every layer (Mixtral's layout), each of width ``intermediate``
    experts_used: int = 0

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden {self.hidden} must split into {self.heads} heads, and the heads into {self.kv_heads} kv heads")
        if self.experts and not 0 < self.experts_used <= self.experts:
            raise ValueError(f"experts_used must be in 1..{self.experts}, got {self.experts_used}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def name(self) -> str:
        """The file's stem: the config, so that each config is made once."""
        moe = f"-e{self.experts}x{self.experts_used}" if self.experts else ""
        return f"random-llama-h{self.hidden}-i{self.intermediate}-a{self.heads}-kv{self.kv_heads}-l{self.layers}{moe}-std{self.std:g}-s{self.seed}-g{GENERATION}"


def random_llama_gguf(cfg: RandomLlama = RandomLlama(), ftype: str = "F32", vocab_from: str | None = None, directory: str | Path | None = None) -> str:
    """The random Llama ``cfg`` as an F32 GGUF file, quantized by llama.cpp to ``ftype``
    (:func:`quantized`), each made once in ``directory`` (default: ``<temp>/tilework-bench``),
    named by the config (:attr:`RandomLlama.name`). The vocabulary, tokenizer,
    context length, rotary base and norm epsilon come from the GGUF ``vocab_from`` (default:
    the embedded SmolLM2-135M); the head is the token table (tied, no ``output.weight``)."""
    import gguf

    if vocab_from is None:
        from tilework.llm.engine import default_model_path

        vocab_from = default_model_path()
    dst = (Path(directory) if directory is not None else cache_dir()) / f"{cfg.name}.F32.gguf"
    if not fresh(dst, vocab_from):
        reader = gguf.GGUFReader(vocab_from)
        if reader.fields["general.architecture"].contents() != "llama":
            raise ValueError(f"{vocab_from} is not a llama GGUF file")
        vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
        tmp = dst.with_suffix(".partial")
        w = gguf.GGUFWriter(str(tmp), "llama")
        w.add_name(f"random Llama ({', '.join(f'{k} {v}' for k, v in asdict(cfg).items())})")
        w.add_block_count(cfg.layers)
        w.add_embedding_length(cfg.hidden)
        w.add_feed_forward_length(cfg.intermediate)
        w.add_head_count(cfg.heads)
        w.add_head_count_kv(cfg.kv_heads)
        w.add_rope_dimension_count(cfg.head_dim)
        if cfg.experts:
            w.add_expert_count(cfg.experts)
            w.add_expert_used_count(cfg.experts_used)
        copy_fields(reader, w, lambda name: name.startswith("tokenizer.") or name in KEPT_KEYS)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        rng = np.random.default_rng(cfg.seed)

        def normal(*shape: int) -> np.ndarray:  # numpy's [rows, columns]: GGUF's [columns, rows]
            return rng.standard_normal(shape, np.float32) * np.float32(cfg.std)

        ones = np.ones(cfg.hidden, np.float32)
        w.add_tensor("token_embd.weight", normal(vocab, cfg.hidden))
        kv = cfg.kv_heads * cfg.head_dim
        for i in range(cfg.layers):
            for name, value in (
                ("attn_norm", ones),
                ("attn_q", normal(cfg.hidden, cfg.hidden)),
                ("attn_k", normal(kv, cfg.hidden)),
                ("attn_v", normal(kv, cfg.hidden)),
                ("attn_output", normal(cfg.hidden, cfg.hidden)),
                ("ffn_norm", ones),
                *(
                    (
                        ("ffn_gate_inp", normal(cfg.experts, cfg.hidden) * np.float32(10.0)),  # router logits of std ~1: varied choices
                        ("ffn_gate_exps", normal(cfg.experts, cfg.intermediate, cfg.hidden)),
                        ("ffn_up_exps", normal(cfg.experts, cfg.intermediate, cfg.hidden)),
                        ("ffn_down_exps", normal(cfg.experts, cfg.hidden, cfg.intermediate)),
                    )
                    if cfg.experts
                    else (
                        ("ffn_gate", normal(cfg.intermediate, cfg.hidden)),
                        ("ffn_up", normal(cfg.intermediate, cfg.hidden)),
                        ("ffn_down", normal(cfg.hidden, cfg.intermediate)),
                    )
                ),
            ):
                w.add_tensor(f"blk.{i}.{name}.weight", value)
        w.add_tensor("output_norm.weight", ones)
        _write(w, tmp, dst)
    return quantized(str(dst), ftype)


def main() -> None:
    d = RandomLlama()
    ap = argparse.ArgumentParser(description="make the random-weight Llama GGUF (bench/gguf_files.py) and print its path and tensor types")
    ap.add_argument("--ftype", default="Q4_K_M", help="llama.cpp file type (F32, Q4_K_M, Q4_0, Q8_0, ...)")
    for field, value in asdict(d).items():
        ap.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    args = ap.parse_args()
    cfg = RandomLlama(**{k: getattr(args, k) for k in asdict(d)})
    path = random_llama_gguf(cfg, args.ftype)
    print(path)
    print(f"{Path(path).stat().st_size / 1e6:.1f} MB; tensor types: {block_formats(path)}")


if __name__ == "__main__":
    main()

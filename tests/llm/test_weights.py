"""``load_weights``: the embedded SmolLM2 GGUF file (config, every tensor against ``gguf.quants``,
the q/k rows against transformers' GGUF loader), small GGUF files written here with every
format, transformers safetensors checkpoints, and the errors.

The dequantization of the embedded file's tensors against ``gguf.quants`` checks the first
tensor of each format by default; all 272 are checked in the long tier
(``TILEWORK_LONG_TESTS=1``)."""

from __future__ import annotations

import collections
import dataclasses
import json
import mmap
import os
import re
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.backend.helpers import k_quant_blocks
from tests.llm.models import SMOLLM2, needs_smollm2
from tilework.errors import FileFormatError, ParameterError, ShapeError, TileworkError, UnsupportedError
from tilework.llm.config import LlmConfig, RopeScaling
from tilework.llm.gguf import gguf_metadata, hf_tensor_name, raw_tensors, rope_row_order
from tilework.llm.quant import QUANT_FORMATS, QuantTensor, quantize
from tilework.llm.weights import expected_shapes, load_weights
from tests.long import long_param

gguf = pytest.importorskip("gguf")
from gguf import quants as gq  # noqa: E402


SMOLLM, needs_smollm = SMOLLM2, needs_smollm2


def mapped(a: np.ndarray) -> bool:
    """Whether ``a`` is a view of a memory map (its base chain ends in an ``mmap``)."""
    base: Any = a
    while isinstance(base, np.ndarray):
        if base.base is None:
            return False
        base = base.base
    return isinstance(base, mmap.mmap)


def ggml(fmt: str) -> Any:
    """``fmt``'s ``gguf.GGMLQuantizationType``."""
    return gguf.GGMLQuantizationType(QUANT_FORMATS[fmt].ggml_type)


# ---- the embedded SmolLM2-135M-Instruct Q4_1 file -------------------------------------------


@pytest.fixture(scope="module")
def smollm() -> tuple[LlmConfig, dict[str, QuantTensor]]:
    assert SMOLLM is not None
    return load_weights(SMOLLM)


@pytest.fixture(scope="module")
def smollm_reader() -> Any:
    return gguf.GGUFReader(SMOLLM)


@needs_smollm
def test_smollm_config(smollm: tuple[LlmConfig, dict[str, QuantTensor]]) -> None:
    cfg, _ = smollm
    assert cfg == LlmConfig(
        architecture="llama", hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152,
        rope_theta=100000.0, rms_eps=1e-5, context_length=8192, tie_word_embeddings=True,
        rope_scaling=RopeScaling(), bos_token_id=1, eos_token_ids=(2,),
    )
    assert LlmConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@needs_smollm
def test_smollm_config_matches_transformers_gguf_reading(smollm: tuple[LlmConfig, dict[str, QuantTensor]], smollm_reader: Any) -> None:
    """transformers' GGUF loader reads the metadata through its key table (``GGUF_CONFIG_MAPPING``)
    into a LlamaConfig; the same keys give the same hyperparameters (done here on the open file:
    ``load_gguf_checkpoint`` would parse it again)."""
    import transformers
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    cfg, _ = smollm
    meta = gguf_metadata(smollm_reader)
    hf = transformers.LlamaConfig(**{hf_key: meta[f"llama.{key}"] for key, hf_key in cast(dict[str, str], GGUF_CONFIG_MAPPING["llama"]).items() if f"llama.{key}" in meta})
    assert (hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads) == (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads)
    assert (hf.head_dim, hf.intermediate_size, hf.vocab_size, hf.max_position_embeddings) == (cfg.head_dim, cfg.ffn, cfg.vocab, cfg.context_length)
    assert hf.rope_parameters == {"rope_type": "default", "rope_theta": cfg.rope_theta}
    assert np.float32(hf.rms_norm_eps) == np.float32(cfg.rms_eps)  # the file stores float32; we keep its shortest decimal, 1e-5
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (cfg.bos_token_id, cfg.eos_token_ids[0])
    assert all(t.name != "output.weight" for t in smollm_reader.tensors) == cfg.tie_word_embeddings


@needs_smollm
def test_smollm_tensors(smollm: tuple[LlmConfig, dict[str, QuantTensor]]) -> None:
    """272 tensors, named and shaped as transformers', no head (tied); all but q/k are read-only
    views of the file's memory map; q/k are reordered copies of the quantized rows."""
    cfg, w = smollm
    assert list(w) == list(expected_shapes(cfg)) and len(w) == 272 and "lm_head.weight" not in w
    assert collections.Counter(t.fmt for t in w.values()) == {"q4_1": 210, "f32": 61, "q8_0": 1}
    assert w["model.embed_tokens.weight"].fmt == "q8_0" and w["model.embed_tokens.weight"].data.shape == (49152, 612)
    assert w["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    for name, t in w.items():
        assert t.name == name and not t.data.flags.writeable
        reordered = re.search(r"\.(q|k)_proj\.", name) is not None
        assert mapped(t.data) != reordered, name


@needs_smollm
@pytest.mark.parametrize("every", [pytest.param(False, id="each-format"), long_param(True, why="the same formats again, on every tensor", id="every-tensor")])
def test_smollm_every_tensor_dequantizes_like_gguf(smollm_reader: Any, every: bool) -> None:
    """The first tensor of each format (q4_1, q8_0, f32); all of them in the long tier only."""
    raw = raw_tensors(smollm_reader)
    seen: set[Any] = set()
    for t in smollm_reader.tensors:
        if not every and t.tensor_type in seen:
            continue
        seen.add(t.tensor_type)
        mine = raw[t.name]
        assert np.shares_memory(mine.data, smollm_reader.data)
        ref = gq.dequantize(t.data, t.tensor_type)
        np.testing.assert_array_equal(mine.dequantize(), ref.reshape(mine.shape), err_msg=t.name)


@needs_smollm
def test_smollm_qk_rows_match_transformers_gguf_loader(smollm: tuple[LlmConfig, dict[str, QuantTensor]], smollm_reader: Any) -> None:
    """transformers' GGUF loader (``LlamaTensorProcessor``, what ``from_pretrained(gguf_file=)``
    applies to every dequantized tensor) gives the same q/k weights. ``from_pretrained`` itself
    needs ``accelerate`` for GGUF files, which is not installed here."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    cfg, w = smollm
    processor = LlamaTensorProcessor(config={"num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads})
    checked = 0
    for t in smollm_reader.tensors:
        if ".attn_q." not in t.name and ".attn_k." not in t.name:
            continue
        hf = processor.process(weights=gq.dequantize(t.data, t.tensor_type), name=t.name).weights
        name = hf_tensor_name(t.name)
        assert name is not None
        np.testing.assert_array_equal(w[name].dequantize(), hf, err_msg=t.name)
        checked += 1
    assert checked == 60


@needs_smollm
def test_smollm_names_match_transformers_gguf_loader(smollm_reader: Any) -> None:
    """Our GGUF -> transformers names equal the map transformers builds from a Llama model
    (two layers of it, on the meta device)."""
    import torch
    import transformers
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, get_gguf_hf_weights_map

    hf_config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(hf_config)
    hf_map = get_gguf_hf_weights_map(model, LlamaTensorProcessor(hf_config.to_dict()))
    names = [t.name for t in smollm_reader.tensors if not t.name.startswith("blk.") or t.name.split(".")[1] in ("0", "1")]
    assert len(names) == 2 + 2 * 9
    for name in names + ["output.weight"]:
        assert hf_tensor_name(name) == hf_map[name], name


@needs_smollm
def test_smollm_reordered_rows_give_the_same_attention_scores(smollm: tuple[LlmConfig, dict[str, QuantTensor]], smollm_reader: Any) -> None:
    """The permutation's meaning: llama.cpp's rotary (pairs 2i, 2i+1) on the file's rows and
    transformers' rotate-half (pairs i, i + 32) on ours give the same q.k scores."""
    cfg, w = smollm
    raw = raw_tensors(smollm_reader)
    x = np.random.default_rng(0).standard_normal((5, cfg.hidden)).astype(np.float64)
    pos = np.arange(5)[:, None] * 7.0
    angle = pos * cfg.rope_inv_freq().astype(np.float64)  # [5, 32]
    cos, sin = np.cos(angle), np.sin(angle)

    def interleaved(v: np.ndarray) -> np.ndarray:  # [5, heads, 64], pairs (2i, 2i+1)
        a, b = v[..., 0::2], v[..., 1::2]
        out = np.empty_like(v)
        out[..., 0::2] = a * cos[:, None] - b * sin[:, None]
        out[..., 1::2] = a * sin[:, None] + b * cos[:, None]
        return out

    def rotate_half(v: np.ndarray) -> np.ndarray:  # pairs (i, i + 32)
        a, b = v[..., :32], v[..., 32:]
        return np.concatenate([a * cos[:, None] - b * sin[:, None], a * sin[:, None] + b * cos[:, None]], axis=-1)

    def scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
        k = np.repeat(k, cfg.group, axis=1)
        return np.einsum("shd,thd->hst", q, k)

    layer = 3
    gq_, gk_ = (raw[f"blk.{layer}.attn_{p}.weight"].dequantize().astype(np.float64) for p in "qk")
    hq, hk = (w[f"model.layers.{layer}.self_attn.{p}_proj.weight"].dequantize().astype(np.float64) for p in "qk")
    ours = scores(rotate_half((x @ hq.T).reshape(5, 9, 64)), rotate_half((x @ hk.T).reshape(5, 3, 64)))
    theirs = scores(interleaved((x @ gq_.T).reshape(5, 9, 64)), interleaved((x @ gk_.T).reshape(5, 3, 64)))
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-9)
    assert not np.allclose(hq, gq_)  # the rows really moved


@needs_smollm
def test_smollm_metadata(smollm_reader: Any) -> None:
    meta = gguf_metadata(smollm_reader)
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 30
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "smollm"
    assert isinstance(meta["llama.rope.freq_base"], float) and meta["tokenizer.ggml.add_bos_token"] is False
    assert len(meta["tokenizer.ggml.tokens"]) == 49152 and all(isinstance(s, str) for s in meta["tokenizer.ggml.tokens"][:100])
    assert len(meta["tokenizer.ggml.merges"]) == 48900 and len(meta["tokenizer.ggml.token_type"]) == 49152
    assert "<|im_start|>" in meta["tokenizer.chat_template"]
    assert not any(k.startswith("GGUF.") for k in meta)


# ---- small GGUF files written here ----------------------------------------------------------

TINY = LlmConfig(
    architecture="llama", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=256, vocab=96, rope_theta=10000.0, rms_eps=1e-5,
    context_length=128, tie_word_embeddings=False, attention_bias=True, attention_out_bias=True, bos_token_id=1, eos_token_ids=(2,),
)
# the llama.cpp names, spelled out here rather than derived from the code under test
_GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
_GGUF_PART = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp", "mlp.experts.gate_proj": "ffn_gate_exps",
              "mlp.experts.up_proj": "ffn_up_exps", "mlp.experts.down_proj": "ffn_down_exps", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
              "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
_FORMAT_OF = {"embed_tokens": "q8_0", "q_proj.weight": "q8_0", "k_proj.weight": "q4_0", "v_proj.weight": "q4_1", "o_proj.weight": "f16", "gate_proj": "bf16", "up_proj.weight": "q5_0",
              "lm_head": "q5_1"}


# OLMo 2's and EXAONE 4's norms after their sublayers (gguf-py's tensor map)
_GGUF_PART_OF = {arch: {**_GGUF_PART, "post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"} for arch in ("olmo2", "exaone4")}
# Phi's names (PhiForCausalLM: dense, fc1, fc2, final_layernorm; a LayerNorm's bias and the head's)
_GGUF_PART_OF["phi2"] = {**_GGUF_PART, "self_attn.dense": "attn_output", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down", "self_attn.qkv_proj": "attn_qkv"}
_GGUF_PART_OF["starcoder2"] = {**_GGUF_PART, "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}  # (Starcoder2ForCausalLM's MLP)
_GGUF_TOP.update({"model.final_layernorm.weight": "output_norm.weight", "model.final_layernorm.bias": "output_norm.bias", "model.norm.bias": "output_norm.bias", "lm_head.bias": "output.bias"})


def gguf_name(hf: str, arch: str = "llama") -> str:
    """The GGUF name llama.cpp's converter gives transformers tensor ``hf`` of an ``arch`` model."""
    if hf in _GGUF_TOP:
        return _GGUF_TOP[hf]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf)
    assert m is not None
    return f"blk.{m[1]}.{_GGUF_PART_OF.get(arch, _GGUF_PART)[m[2]]}.{m[3]}"


K_QUANTS = ("q6_k", "q4_k", "q5_k", "q3_k", "q2_k", "iq4_xs", "iq4_nl")  # the down projection of layer i: K_QUANTS[i % 7] (the k-quants, and iq4's super-block and block formats)


def k_quant_rows(fmt: str, rows: int, cols: int, seed: int) -> QuantTensor:
    """Random k-quant rows (tilework cannot write them; any bytes are valid but the fp16 scales)."""
    return QuantTensor("", (rows, cols), fmt, k_quant_blocks(np.random.default_rng(seed), fmt, rows, cols))


def tiny_tensors(cfg: LlmConfig, seed: int = 0) -> dict[str, QuantTensor]:
    """Random weights for ``cfg``, transformers names and order, in a mix of every format."""
    rng = np.random.default_rng(seed)
    out: dict[str, QuantTensor] = {}
    for name, shape in expected_shapes(cfg).items():
        fmt = next((f for key, f in _FORMAT_OF.items() if key in name), "f32")
        if "down_proj.weight" in name:
            rows, cols = shape
            layer = int(re.findall(r"\.(\d+)\.", name)[0])
            out[name] = k_quant_rows(K_QUANTS[layer % len(K_QUANTS)], rows, cols, seed=len(out))
            continue
        out[name] = quantize(rng.standard_normal(shape).astype(np.float32) * 0.1, fmt if len(shape) == 2 else "f32", name)
    return out


def llama_cpp_permute(data: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter on q/k rows: ``w.reshape(n_head, 2, rows/n_head/2, ...).swapaxes(1, 2)``."""
    rows = data.reshape(data.shape[0] // 4, 4) if data.ndim == 1 else data  # a 1-D f32 bias: 4 bytes a row
    out = rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, rows.shape[1]).swapaxes(1, 2).reshape(rows.shape)
    return out.reshape(data.shape)


def write_gguf(path: Path, cfg: LlmConfig, tensors: dict[str, QuantTensor], arch: str | None = None, meta: dict[str, Any] | None = None,
               extra: dict[str, tuple[np.ndarray, Any]] | None = None) -> Path:
    a = arch or cfg.architecture
    w = gguf.GGUFWriter(str(path), a)
    for key, value in {"block_count": cfg.layers, "context_length": cfg.context_length, "embedding_length": cfg.hidden, "feed_forward_length": cfg.ffn,
                       "attention.head_count": cfg.heads, "attention.head_count_kv": cfg.kv_heads, "vocab_size": cfg.vocab, "rope.dimension_count": cfg.head_dim}.items():
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.rope.freq_base", cfg.rope_theta)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.rms_eps)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    for key, value in (meta or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    heads = {"q_proj": cfg.heads, "k_proj": cfg.kv_heads}
    for name, t in tensors.items():
        data = t.data
        part = re.search(r"\.(q_proj|k_proj)\.", name)
        if a == "llama" and part:
            data = llama_cpp_permute(data, heads[part[1]])
        w.add_tensor(gguf_name(name), np.ascontiguousarray(data), raw_dtype=ggml(t.fmt))
    for name, (data, raw_dtype) in (extra or {}).items():
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tiny_llama_gguf_every_format(tmp_path: Path) -> None:
    """A file with Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, Q5_K, Q3_K, Q2_K, IQ4_XS, IQ4_NL, F16, BF16, F32 tensors (7
    layers: a k-quant or iq4 down projection each) and q/k biases loads back to the transformers
    layout: names, row order (q/k rows and biases were permuted as llama.cpp does), values
    (checked with gguf.quants)."""
    five = dataclasses.replace(TINY, layers=len(K_QUANTS))
    tensors = tiny_tensors(five)
    path = write_gguf(tmp_path / "tiny.gguf", five, tensors)
    cfg, w = load_weights(path)
    assert cfg == five
    assert list(w) == list(tensors)
    assert {t.fmt for t in w.values()} == set(QUANT_FORMATS)
    for name, t in tensors.items():
        assert (w[name].shape, w[name].fmt) == (t.shape, t.fmt), name
        ref = gq.dequantize(np.asarray(t.data), ggml(t.fmt)).reshape(t.shape)
        np.testing.assert_array_equal(w[name].dequantize(), ref, err_msg=name)
        assert mapped(w[name].data) == (re.search(r"\.(q|k)_proj\.", name) is None), name


def test_k_quant_matrices_load_in_every_precision(tmp_path: Path) -> None:
    """The k-quant and iq4 down projections of a 7-layer file (one of each format) as the decoder gets
    them: ``fp32`` the values gguf.quants decodes (laid out in panels), ``bf16`` those rounded
    to bfloat16 (16 rows side by side where the quant library has AVX-512 BF16), ``q`` the
    file's blocks as they are (16 rows side by side where the rows are whole groups)."""
    from tilework.llm.compile import PRECISIONS, prepare_weights
    from tilework.llm.model import LlamaDecoder
    from tilework.op.quant import bf16_rows, interleavable, interleave_rows, interleaved
    from tilework.transform.panels import lay_out

    five = dataclasses.replace(TINY, layers=len(K_QUANTS))
    cfg, w = load_weights(write_gguf(tmp_path / "tiny.gguf", five, tiny_tensors(five)))
    for precision in PRECISIONS:
        formats, arrays = prepare_weights(cfg, w, precision)
        names = [n for n, _ in LlamaDecoder(cfg, {n: f for n, f in formats.items() if f != "f32"}).named_parameters()]
        for i, fmt in enumerate(K_QUANTS):
            name = f"model.layers.{i}.mlp.down_proj.weight"
            t, got = w[name], arrays[names.index(name)]
            values = gq.dequantize(np.asarray(t.data), ggml(fmt)).reshape(t.shape)
            if precision == "q":  # 16 rows side by side (q4_kx16 & co.) where they are whole groups
                x16 = interleavable(fmt, *t.shape) and interleaved(fmt)
                assert formats[name] == (x16 or fmt) and np.array_equal(got, interleave_rows(t.data, fmt) if x16 else t.data), name
            elif precision == "bf16":
                want = bf16_rows(values)
                np.testing.assert_array_equal(got, interleave_rows(want, "bf16") if formats[name] == "bf16x16" else want, err_msg=name)
            else:
                assert name not in formats
                np.testing.assert_array_equal(got, lay_out(values), err_msg=name)


def test_q5_gguf_matrices_load_in_every_precision(tmp_path: Path) -> None:
    """Q5_0 / Q5_1 matrices of a GGUF file (llama.cpp's Q4_K_M / Q5_K_M mixes hold them where a
    row is not a multiple of 256) in each precision ``prepare_weights`` takes: ``fp32`` their
    values (gguf's), ``bf16`` those rounded to bfloat16, ``q`` the file's blocks, interleaved in
    groups of 16 rows."""
    from tilework.llm import compile as llm_compile
    from tilework.op.quant import bf16_bits, bf16_rows, interleave_rows
    from tilework.transform.panels import lay_out

    tensors = tiny_tensors(TINY)
    _, w = load_weights(write_gguf(tmp_path / "tiny.gguf", TINY, tensors))
    head, up = w["lm_head.weight"], w["model.layers.1.mlp.up_proj.weight"]
    assert (head.fmt, up.fmt) == ("q5_1", "q5_0")
    values = gq.dequantize(np.asarray(head.data), gguf.GGMLQuantizationType.Q5_1).reshape(head.shape)
    np.testing.assert_array_equal(up.dequantize(), gq.dequantize(np.asarray(up.data), gguf.GGMLQuantizationType.Q5_0).reshape(up.shape))
    np.testing.assert_array_equal(head.dequantize(bf16=True), bf16_bits(values))
    grouped = llm_compile.weight_formats(w, "bf16")["lm_head.weight"]
    for precision, fmt, want in (
        ("fp32", "f32", lay_out(values)),  # a float32 matrix is laid out in panels
        ("bf16", grouped, interleave_rows(bf16_rows(values), "bf16") if grouped == "bf16x16" else bf16_rows(values)),
        ("q", "q5_1x16", interleave_rows(head.data, "q5_1")),
    ):
        formats, arrays = llm_compile.prepare_weights(TINY, w, precision)
        assert formats.get("lm_head.weight", "f32") == fmt
        assert formats.get(up.name, "f32") == {"q": "q5_0x16", "fp32": "f32"}.get(precision, grouped), precision
        assert any(a.shape == want.shape and np.array_equal(a, want) for a in arrays), precision


def test_tiny_qwen2_gguf_keeps_row_order(tmp_path: Path) -> None:
    cfg = LlmConfig(**{**TINY.to_dict(), "architecture": "qwen2", "attention_out_bias": False, "tie_word_embeddings": True, "rope_scaling": RopeScaling()})
    tensors = tiny_tensors(cfg, seed=1)
    loaded_cfg, w = load_weights(write_gguf(tmp_path / "qwen.gguf", cfg, tensors))
    assert loaded_cfg == cfg
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.bias"):
        np.testing.assert_array_equal(w[name].data, tensors[name].data)


def test_tiny_qwen3_gguf_has_its_qk_norms(tmp_path: Path) -> None:
    """``attn_q_norm`` / ``attn_k_norm`` are the per-head norms ``self_attn.q_norm`` /
    ``k_norm`` (transformers order: no row is permuted in a qwen3 file); the head dim is
    ``attention.key_length`` (24, not hidden / heads)."""
    cfg = LlmConfig(**{**TINY.to_dict(), "architecture": "qwen3", "head_dim": 24, "attention_bias": False, "attention_out_bias": False, "rope_scaling": RopeScaling()})
    tensors = tiny_tensors(cfg, seed=3)
    loaded_cfg, w = load_weights(write_gguf(tmp_path / "qwen3.gguf", cfg, tensors, meta={"qwen3.attention.key_length": 24, "qwen3.attention.value_length": 24}))
    assert loaded_cfg == cfg and list(w) == list(tensors)
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_norm.weight", "model.layers.0.self_attn.q_norm.weight"):
        np.testing.assert_array_equal(w[name].data, tensors[name].data)


def test_tiny_gguf_with_mlp_biases(tmp_path: Path) -> None:
    """``ffn_gate``/``ffn_up``/``ffn_down`` biases make an ``mlp_bias`` config (they were
    tensors the model did not have)."""
    cfg = LlmConfig(**{**TINY.to_dict(), "mlp_bias": True, "rope_scaling": RopeScaling()})
    tensors = tiny_tensors(cfg, seed=2)
    loaded_cfg, w = load_weights(write_gguf(tmp_path / "mlp.gguf", cfg, tensors))
    assert loaded_cfg == cfg and list(w) == list(tensors)
    np.testing.assert_array_equal(w["model.layers.1.mlp.down_proj.bias"].data, tensors["model.layers.1.mlp.down_proj.bias"].data)


def test_gguf_rope_scaling(tmp_path: Path) -> None:
    tensors = tiny_tensors(TINY)
    meta = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    cfg, _ = load_weights(write_gguf(tmp_path / "linear.gguf", TINY, tensors, meta=meta))
    assert cfg.rope_scaling == RopeScaling("linear", 4.0)
    yarn = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0, "llama.rope.scaling.original_context_length": 32}
    cfg, _ = load_weights(write_gguf(tmp_path / "yarn.gguf", TINY, tensors, meta=yarn))
    assert cfg.rope_scaling == RopeScaling("yarn", 4.0, 32, attention_factor=1 + 0.1 * np.log(4.0))  # llama.cpp's mscale, transformers' too
    cfg, _ = load_weights(write_gguf(tmp_path / "betas.gguf", TINY, tensors, meta={**yarn, "llama.rope.scaling.yarn_beta_fast": 8.0, "llama.rope.scaling.yarn_beta_slow": 2.0}))
    assert (cfg.rope_scaling.beta_fast, cfg.rope_scaling.beta_slow) == (8.0, 2.0)
    for key, message in (("yarn_log_multiplier", "yarn_log_multiplier = 0.1"), ("attn_factor", "attn_factor = 0.1")):
        with pytest.raises(UnsupportedError, match=message):
            load_weights(write_gguf(tmp_path / f"{key}.gguf", TINY, tensors, meta={**yarn, f"llama.rope.scaling.{key}": 0.1}))
    with pytest.raises(TileworkError, match="original_context_length"):
        load_weights(write_gguf(tmp_path / "yarn-no-ctx.gguf", TINY, tensors, meta={"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}))
    with pytest.raises(UnsupportedError, match="rope scaling 'longrope'.*supported: none, linear, yarn"):
        load_weights(write_gguf(tmp_path / "longrope.gguf", TINY, tensors, meta={"llama.rope.scaling.type": "longrope", "llama.rope.scaling.factor": 4.0}))
    factors = np.linspace(1.0, 8.0, TINY.head_dim // 2, dtype=np.float32)
    cfg, w = load_weights(write_gguf(tmp_path / "freqs.gguf", TINY, tensors, extra={"rope_freqs.weight": (factors, None)}))
    assert cfg.rope_scaling == RopeScaling("freq_factors", freq_factors=tuple(float(f) for f in factors)) and list(w) == list(tensors)  # read into the config, not a weight
    np.testing.assert_allclose(cfg.rope_inv_freq(), TINY.rope_inv_freq() / factors, rtol=1e-6)
    assert cfg.rope_op_scaling() == ("freq_factors", cfg.rope_scaling.freq_factors)
    with pytest.raises(TileworkError, match=f"rope_freqs.weight must be {TINY.head_dim // 2} float32 values"):
        load_weights(write_gguf(tmp_path / "freqs-short.gguf", TINY, tensors, extra={"rope_freqs.weight": (factors[:-1], None)}))
    with pytest.raises(UnsupportedError, match="'linear' .* together with per-frequency factors"):
        load_weights(write_gguf(tmp_path / "freqs-linear.gguf", TINY, tensors, meta=meta, extra={"rope_freqs.weight": (factors, None)}))
    with pytest.raises(UnsupportedError, match="rope_factors_long.weight"):
        load_weights(write_gguf(tmp_path / "factors.gguf", TINY, tensors, extra={"rope_factors_long.weight": (factors, None)}))


def test_rope_row_order_inverts_llama_cpp() -> None:
    rows = np.arange(4 * 16 * 3).reshape(48, 4).astype(np.uint8)
    np.testing.assert_array_equal(llama_cpp_permute(rows, 3)[rope_row_order(3, 16)], rows)


def test_gguf_errors(tmp_path: Path) -> None:
    tensors = tiny_tensors(TINY)
    bad = dict(tensors)
    bad["model.layers.1.self_attn.v_proj.weight"] = QuantTensor("v", (32, 64), "f32", np.zeros((32, 256), np.uint8))
    path = write_gguf(tmp_path / "q8_1.gguf", TINY, {k: v for k, v in bad.items() if "layers.1.self_attn.v_proj.weight" not in k},
                      extra={"blk.1.attn_v.weight": (np.zeros((32, 2 * 40), np.uint8), gguf.GGMLQuantizationType.Q8_1)})
    with pytest.raises(UnsupportedError, match=r"q8_1\.gguf: tensor blk\.1\.attn_v\.weight is stored as Q8_1"):
        load_weights(path)

    path = write_gguf(tmp_path / "missing.gguf", TINY, {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"})
    with pytest.raises(ParameterError, match=r"missing\.gguf: missing tensors .*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_weights(path)

    path = write_gguf(tmp_path / "gpt2.gguf", TINY, tensors, arch="gpt2")
    with pytest.raises(UnsupportedError, match=r"gpt2\.gguf: architecture 'gpt2'"):
        load_weights(path)

    extra = {"blk.0.attn_qkv.weight": (np.zeros((4, 64), np.float32), None)}
    with pytest.raises(UnsupportedError, match=r"blk\.0\.attn_qkv\.weight"):
        load_weights(write_gguf(tmp_path / "fused.gguf", TINY, tensors, extra=extra))

    wrong = dict(tensors)
    wrong["model.norm.weight"] = quantize(np.ones(32, np.float32), "f32")
    with pytest.raises(ShapeError, match=r"model\.norm\.weight has shape \[32\], the config implies \[64\]"):
        load_weights(write_gguf(tmp_path / "shape.gguf", TINY, wrong))

    whole = (tmp_path / "tiny.gguf")
    write_gguf(whole, TINY, tensors)
    (tmp_path / "cut.gguf").write_bytes(whole.read_bytes()[:200])
    with pytest.raises(FileFormatError, match=r"cut\.gguf: not a readable GGUF file: it is truncated or damaged \(200 bytes; "):
        load_weights(tmp_path / "cut.gguf")
    size = whole.stat().st_size
    (tmp_path / "short.gguf").write_bytes(whole.read_bytes()[: size - 100])  # the header whole, the last tensor's data cut
    with pytest.raises(FileFormatError, match=rf"short\.gguf: not a readable GGUF file: it is truncated or damaged \({size - 100} bytes; "):
        load_weights(tmp_path / "short.gguf")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(TileworkError, match=r"nothing\.gguf: no such file"):
        load_weights(tmp_path / "nothing.gguf")
    (tmp_path / "notes.txt").write_text("hello, these are not weights")
    with pytest.raises(UnsupportedError, match=r"notes\.txt: neither a GGUF file nor a safetensors checkpoint"):
        load_weights(tmp_path / "notes.txt")
    with pytest.raises(TileworkError, match="needs a config.json"):
        load_weights(tmp_path)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(FileFormatError, match=r"empty\.gguf: the file is empty"):
        load_weights(tmp_path / "empty.gguf")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": 3}')
    with pytest.raises(FileFormatError, match=r"model\.safetensors\.index\.json: not a safetensors index"):
        load_weights(tmp_path)


# ---- transformers safetensors checkpoints ---------------------------------------------------

HF_SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=100, max_position_embeddings=256)
FMT_OF_TORCH = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def save_checkpoint(tmp_path: Path, model_type: str = "llama", dtype: str = "float32", **kw: Any) -> tuple[Path, dict[str, np.ndarray]]:
    """A random transformers model saved with ``save_pretrained``, and its state dict in float32."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[model_type]
    model_cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[model_type]
    model = model_cls(config_cls(**{**HF_SMALL, **kw})).to(getattr(torch, dtype))
    model.save_pretrained(tmp_path, **({"max_shard_size": "40KB"} if kw.pop("_sharded", False) else {}))
    return tmp_path, {k: v.float().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("dtype, tied", [("float32", False), ("bfloat16", True), ("float16", False)])
def test_safetensors_checkpoint_loads_back_equal(tmp_path: Path, dtype: str, tied: bool) -> None:
    path, state = save_checkpoint(tmp_path, dtype=dtype, tie_word_embeddings=tied)
    for source in (path, path / "model.safetensors"):
        cfg, w = load_weights(source)
        assert cfg == LlmConfig.from_hf_config(path / "config.json") and cfg.tie_word_embeddings == tied
        assert set(w) == set(state) - ({"lm_head.weight"} if tied else set())
        for name, t in w.items():
            assert t.fmt == FMT_OF_TORCH[dtype] and mapped(t.data) and not t.data.flags.writeable
            np.testing.assert_array_equal(t.dequantize(), state[name], err_msg=name)
    if dtype == "float32":  # and what safetensors' own NumPy reader gives
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), framework="numpy") as f:
            for name in f.keys():
                np.testing.assert_array_equal(w[name].dequantize(), f.get_tensor(name))


def test_qwen2_and_sharded_checkpoints(tmp_path: Path) -> None:
    path, state = save_checkpoint(tmp_path / "qwen", "qwen2", tie_word_embeddings=True)
    cfg, w = load_weights(path)
    assert cfg.architecture == "qwen2" and "model.layers.1.self_attn.v_proj.bias" in w
    np.testing.assert_array_equal(w["model.layers.1.self_attn.k_proj.bias"].dequantize(), state["model.layers.1.self_attn.k_proj.bias"])

    path, state = save_checkpoint(tmp_path / "sharded", _sharded=True)
    assert (path / "model.safetensors.index.json").exists()
    _, w = load_weights(path)
    assert set(w) == set(state)
    np.testing.assert_array_equal(w["lm_head.weight"].dequantize(), state["lm_head.weight"])


def test_safetensors_errors(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    path, state = save_checkpoint(tmp_path)
    save_file({k: v for k, v in state.items() if k != "model.layers.0.mlp.up_proj.weight"}, str(path / "model.safetensors"))
    with pytest.raises(ParameterError, match=r"missing tensors .*model\.layers\.0\.mlp\.up_proj\.weight"):
        load_weights(path)

    save_file({**state, "model.layers.0.mlp.up_proj.weight": state["model.layers.0.mlp.up_proj.weight"].astype(np.int8)}, str(path / "model.safetensors"))
    with pytest.raises(UnsupportedError, match=r"model\.safetensors: tensor model\.layers\.0\.mlp\.up_proj\.weight has dtype I8"):
        load_weights(path)

    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(UnsupportedError, match=r"config\.json: model_type 'gpt2'"):
        load_weights(path)

    (path / "config.json").unlink()
    with pytest.raises(TileworkError, match=r"model\.safetensors: a safetensors file needs the checkpoint's config\.json"):
        load_weights(path / "model.safetensors")

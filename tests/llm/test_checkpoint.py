"""``LLM`` on a transformers checkpoint directory (``save_pretrained`` of a random model and of a
small word-level tokenizer): the text and token ids of greedy generation and ``score``'s
log-probabilities are transformers', from float32, bfloat16 and sharded files (Qwen3 also from
a GGUF file written here from the same weights); a checkpoint
without a tokenizer is refused before anything compiles; the CLI runs one."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from tilework.llm import LLM, SamplingParams  # noqa: E402
from tilework.llm import engine  # noqa: E402
from tilework.llm.config import LlmConfig  # noqa: E402
from tilework.llm.quant import QuantTensor, quantize  # noqa: E402
from tilework.llm.tokenizer import TokenizerError  # noqa: E402
from tests.backend.helpers import k_quant_blocks  # noqa: E402
from tests.llm.test_weights import ggml, gguf_name, llama_cpp_permute  # noqa: E402

gguf = pytest.importorskip("gguf")

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 101
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
             max_position_embeddings=64, bos_token_id=1, eos_token_id=2, initializer_range=0.2)  # fmt: skip
PROMPT = "w5 w17 w33 w9 w41 w7 w60 w12"


def word_tokenizer() -> Any:
    """``<unk> <s> </s> w3 .. w100``, split on spaces, joined by spaces."""
    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def save(path: Path, kind: str = "llama", dtype: str = "float32", tokenizer: bool = True, shard: str | None = None, biases: bool = False, **kw: Any) -> Any:
    """A random model saved to ``path`` in ``dtype`` (with its tokenizer); the model read back
    from there in float32 (not the saved model cast: ``.to(bfloat16)`` rounds its rotary
    frequencies too, which the files do not hold). Its norm weights are moved away from one;
    with ``biases``, every bias and every norm parameter away from its start (transformers
    starts biases at zero and LayerNorms at one and zero)."""
    torch.manual_seed(0)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "smollm3": (transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM),
        "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM),
        "exaone4": (transformers.Exaone4Config, transformers.Exaone4ForCausalLM),
        "ernie4_5": (transformers.Ernie4_5Config, transformers.Ernie4_5ForCausalLM),
        "granite": (transformers.GraniteConfig, transformers.GraniteForCausalLM),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
        "olmoe": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM),
        "granitemoe": (transformers.GraniteMoeConfig, transformers.GraniteMoeForCausalLM),
        "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
        "phi": (transformers.PhiConfig, transformers.PhiForCausalLM),
        "starcoder2": (transformers.Starcoder2Config, transformers.Starcoder2ForCausalLM),
    }[kind]
    model = model_cls(config_cls(**{**SMALL, **kw})).eval()
    with torch.no_grad():  # norm weights away from transformers' ones: their values count too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or (biases and (name.endswith("bias") or "norm" in name)):
                p.add_(0.3 * torch.randn_like(p))
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    if tokenizer:
        word_tokenizer().save_pretrained(path)
    return model_cls.from_pretrained(path, dtype=torch.float32).eval()


def greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return [int(t) for t in out[0, len(ids) :]]


def assert_greedy(llm: Any, hf: Any, ids: list[int], n: int) -> list[int]:
    """``llm``'s greedy tokens after the words ``w{id}`` of ``ids`` are transformers'
    ``generate``'s, up to its first eos (2); returns those."""
    want = greedy(hf, ids, n)
    want = want[: want.index(2)] if 2 in want else want
    out = llm.generate(" ".join(f"w{t}" for t in ids), SamplingParams(temperature=0, max_tokens=n), chat=False)[0]
    assert out.token_ids[: len(want)] == want
    return want


def assert_transformers_tokens(llm: Any, hf: Any, tol: float = 1e-4, steps: int = 10) -> np.ndarray:
    """After each of ``PROMPTS`` (1, 7 and 13 tokens), ``llm``'s log-probabilities within ``tol``
    of transformers' and its ``steps`` greedy tokens transformers'; returns transformers'
    log-probabilities of the last prompt."""
    for ids in PROMPTS:
        ref = log_probs(hf, ids)
        np.testing.assert_allclose(llm.score(ids), ref, rtol=0, atol=tol)
        assert_greedy(llm, hf, ids, steps)
    return ref


@pytest.mark.parametrize(
    "kind, dtype, shard, kw",
    [("llama", "float32", "40KB", {}), ("qwen2", "bfloat16", None, {"tie_word_embeddings": True})],
    ids=["llama-f32-sharded", "qwen2-bf16-tied"],
)
def test_a_checkpoint_directory_generates_transformers_tokens(tmp_path: Path, kind: str, dtype: str, shard: str | None, kw: dict[str, Any]) -> None:
    hf = save(tmp_path, kind, dtype, shard=shard, **kw)
    assert shard is None or (tmp_path / "model.safetensors.index.json").exists()
    llm = LLM(str(tmp_path), precision="fp32", max_batch=2, kv_tokens=256)
    ids = llm.encode(PROMPT)
    assert ids == word_tokenizer()(PROMPT)["input_ids"] == [5, 17, 33, 9, 41, 7, 60, 12]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0], -1).numpy()
    np.testing.assert_allclose(llm.score(ids), ref, rtol=0, atol=1e-4)
    want = greedy(hf, ids, 12)
    want = want[: want.index(2)] if 2 in want else want  # tilework stops at the end of sequence
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12), chat=False)[0]
    assert out.token_ids[: len(want)] == want and out.text.startswith(" " + word_tokenizer().decode(want))  # it continues the prompt's words


def test_a_mistral_checkpoint_attends_in_its_sliding_window(tmp_path: Path) -> None:
    """A 16-token window in a 64-token context: every layer attends to its last 16 tokens, so 40
    tokens' log-probabilities (token by token, as score feeds them) and greedy tokens past the
    window are transformers'; the same weights without the window give others."""
    hf = save(tmp_path / "ckpt", "mistral", sliding_window=16)
    llm = LLM(str(tmp_path / "ckpt"), precision="fp32", max_batch=2, kv_tokens=256)
    assert (llm.config.context_length, llm.config.sliding_window, llm.config.sliding_layers) == (64, 16, (0, 1))
    ids = [int(t) for t in np.random.default_rng(3).integers(3, VOCAB, 40)]
    ref = log_probs(hf, ids)
    np.testing.assert_allclose(llm.score(ids), ref, rtol=0, atol=1e-4)
    prompt = " ".join(f"w{t}" for t in ids[:20])
    want = greedy(hf, ids[:20], 10)
    want = want[: want.index(2)] if 2 in want else want
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10), chat=False)[0]
    assert out.token_ids[: len(want)] == want and len(want) >= 5
    wide = save(tmp_path / "wide", "mistral", sliding_window=None)
    assert np.abs(log_probs(wide, ids) - ref).max() > 1e-2


def test_dynamic_rotary_scaling_is_the_default_to_the_end_of_the_context(tmp_path: Path) -> None:
    """transformers' ``dynamic`` NTK scaling changes the frequencies of sequences longer than
    ``max_position_embeddings`` only, which is the context: a whole context's log-probabilities
    (refused before)."""
    hf = save(tmp_path, rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0})
    llm = LLM(str(tmp_path), precision="fp32", max_batch=2, kv_tokens=256)
    assert llm.config.rope_scaling.type == "default" and llm.config.context_length == 64
    ids = [int(t) for t in np.random.default_rng(4).integers(3, VOCAB, 64)]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0], -1).numpy()
    np.testing.assert_allclose(llm.score(ids), ref, rtol=0, atol=1e-4)


def write_gguf_of(hf: Any, path: Path, fmt: str = "f32", meta: dict[str, Any] | None = None, blocks: dict[str, QuantTensor] | None = None,
                  extra: dict[str, np.ndarray] | None = None, fused_qkv: bool = False) -> Path:
    """The weights of transformers model ``hf`` in a GGUF file of its architecture (``fmt``: the
    format of its matrices; the token table too; ``blocks``: the stored rows of the named
    matrices instead), with a byte-level BPE vocabulary of ``VOCAB`` tokens (the ids are what is
    fed; the text is never read), the metadata llama.cpp's converter writes, and ``meta``
    (strings, floats, ints, bools, arrays) after it; ``extra``: more tensors, under their GGUF names;
    ``fused_qkv``: each layer's q, k, v rows (and biases) one ``attn_qkv`` tensor (older phi2 files)."""
    c = hf.config
    arch = GGUF_ARCH.get(c.model_type, c.model_type)
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rot = int(hd * c.rope_parameters.get("partial_rotary_factor", 1.0))  # (phi: the converter's int(factor * hidden) // heads)
    w = gguf.GGUFWriter(str(path), arch)
    experts = getattr(c, "num_local_experts", None) or getattr(c, "num_experts", None)
    if experts:  # a mixture of experts (the converter's keys)
        w.add_uint32(f"{arch}.expert_count", experts)
        w.add_uint32(f"{arch}.expert_used_count", c.num_experts_per_tok)
        if arch in ("qwen3moe", "qwen2moe"):
            w.add_uint32(f"{arch}.expert_feed_forward_length", c.moe_intermediate_size)
        if arch == "qwen2moe":
            w.add_uint32(f"{arch}.expert_shared_feed_forward_length", c.shared_expert_intermediate_size)
    for key, value in {"block_count": c.num_hidden_layers, "context_length": c.max_position_embeddings, "embedding_length": c.hidden_size, "feed_forward_length": c.intermediate_size,
                       "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads, "attention.key_length": hd,
                       "attention.value_length": hd, "rope.dimension_count": rot}.items():  # fmt: skip
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", c.rope_parameters["rope_theta"])
    if arch in ("phi2", "starcoder2"):  # LayerNorms
        w.add_float32(f"{arch}.attention.layer_norm_epsilon", c.layer_norm_eps if arch == "phi2" else c.norm_epsilon)
    else:
        w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "ab", *(f"w{i}" for i in range(3, VOCAB))])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(2)
    if arch in ("granite", "granitemoe"):  # its multipliers under llama.cpp's names, where set (as its converter writes them)
        for key, name in (("embedding_scale", "embedding_multiplier"), ("residual_scale", "residual_multiplier"), ("attention.scale", "attention_multiplier"),
                          ("logit_scale", "logits_scaling")):  # fmt: skip
            if getattr(c, name):
                w.add_float32(f"{arch}.{key}", float(getattr(c, name)))
    for key, value in (meta or {}).items():
        {str: w.add_string, float: w.add_float32, int: w.add_uint32, bool: w.add_bool, list: w.add_array}[type(value)](key, value)
    state = moe_state(hf.state_dict())
    if fused_qkv:
        state = fuse_qkv(state)
    for name, value in state.items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        given = (blocks or {}).get(name)
        data = value.detach().float().numpy() if given is None else np.asarray(given.data)
        if arch in ("llama", "smollm3", "granite", "granitemoe") and re.search(r"\.(q|k)_proj\.", name):  # rows of values or of blocks alike
            data = llama_cpp_permute(data, c.num_attention_heads if ".q_proj." in name else c.num_key_value_heads)
        if given is None and data.ndim == 3:  # stacked experts: each expert's rows in fmt
            t = quantize(np.ascontiguousarray(data.reshape(-1, data.shape[-1])), fmt, name)
            t = QuantTensor(name, data.shape, t.fmt, t.data.reshape(*data.shape[:2], -1))
        elif given is None:
            t = quantize(np.ascontiguousarray(data), fmt if data.ndim == 2 else "f32", name)
        else:
            t = QuantTensor(name, given.shape, given.fmt, np.ascontiguousarray(data))
        w.add_tensor(gguf_name(name, arch), np.ascontiguousarray(t.data), raw_dtype=ggml(t.fmt))
    for name, value in (extra or {}).items():
        w.add_tensor(name, value)
    return close_gguf(w, path)


GGUF_ARCH = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama", "phi": "phi2"}  # llama.cpp's architecture of a transformers model type where they differ


def assert_gguf_scores_as_transformers(hf: Any, path: Path, want: LlmConfig | None = None, **write: Any) -> None:
    """``hf``'s weights in a GGUF file (``write_gguf_of(hf, path, **write)``), loaded in fp32:
    its config ``want`` (default: the checkpoint's) but for the bos token, which the file's
    vocabulary does not name, and transformers' log-probabilities after each of ``PROMPTS``
    within 1e-4."""
    from_file = LLM(str(write_gguf_of(hf, path, **write)), precision="fp32", max_batch=2, kv_tokens=256)
    assert from_file.config == dataclasses.replace(want or LlmConfig.from_hf_config(hf.config.to_dict()), bos_token_id=None)
    for ids in PROMPTS:
        np.testing.assert_allclose(from_file.score(ids), log_probs(hf, ids), rtol=0, atol=1e-4)


def fuse_qkv(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each layer's q, k and v projections (weights and biases) one
    ``self_attn.qkv_proj``, their rows one after the other."""
    out = {}
    for name, value in state.items():
        if ".self_attn.q_proj." in name:
            parts = [state[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            out[name.replace("q_proj", "qkv_proj")] = torch.cat(parts, 0)
        elif ".self_attn.k_proj." not in name and ".self_attn.v_proj." not in name:
            out[name] = value
    return out


def moe_state(state: dict[str, Any]) -> dict[str, Any]:
    """A transformers 5 state dict with each mixture's fused ``mlp.experts.gate_up_proj``
    (``[experts, 2 * ffn, hidden]``) parted into ``mlp.experts.gate_proj`` and ``up_proj``, as
    the GGUF file stacks them (``ffn_gate_exps``, ``ffn_up_exps``)."""
    out = {}
    for name, value in state.items():
        name = name.replace(".block_sparse_moe.router.", ".mlp.gate.").replace(".block_sparse_moe.experts.", ".mlp.experts.")  # Granite MoE's
        if name.endswith("mlp.experts.gate_up_proj"):
            gate, up = value.chunk(2, dim=1)
            out[name.replace("gate_up_proj", "gate_proj.weight")], out[name.replace("gate_up_proj", "up_proj.weight")] = gate, up
        elif name.endswith("mlp.experts.down_proj"):
            out[name + ".weight"] = value
        else:
            out[name] = value
    return out


def add_tensor(w: Any, gguf_name: str, data: np.ndarray, fmt: str, name: str = "") -> None:
    """``data`` (float32 values) into GGUF writer ``w`` under ``gguf_name``: a matrix in ``fmt``, the
    rest in f32."""
    t = quantize(np.ascontiguousarray(data, np.float32), fmt if data.ndim == 2 else "f32", name or gguf_name)
    w.add_tensor(gguf_name, np.ascontiguousarray(t.data), raw_dtype=ggml(t.fmt))


def close_gguf(w: Any, path: Path) -> Path:
    """Writes GGUF writer ``w``'s header, metadata and tensors, closes it; returns ``path``."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama_cpp_and_tilework(hf: Any, path: Path, seed: int, meta: dict[str, Any] | None = None, n: int = 40) -> tuple[np.ndarray, np.ndarray, Any, list[int]]:
    """``hf``'s GGUF file (``write_gguf_of`` at ``path``, with ``meta``) scored over ``n`` random
    tokens (``seed``) by llama.cpp (llama-cpp-python: the test is skipped without it, an optional
    bench dependency) and by tilework (``fp32``): (tilework's log-probabilities, llama.cpp's, the
    tilework LLM, the ids). The log-probabilities must differ enough across the vocabulary to
    compare."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (an optional bench dependency) reads the file")
    from tests.llm.test_llama_cpp_q4_k_m import gguf_files, log_softmax

    file = str(write_gguf_of(hf, path, meta=meta))
    ids = [int(t) for t in np.random.default_rng(seed).integers(3, VOCAB, n)]
    want = log_softmax(gguf_files().llama_cpp_scores(file, ids, threads=2))
    llm = LLM(file, precision="fp32", max_batch=1, kv_tokens=128)
    got = llm.score(ids)
    assert (got.max(-1) - got.min(-1)).min() > 0.5
    return got, want, llm, ids


def log_probs(hf: Any, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0], -1).numpy()


QWEN3 = dict(head_dim=24, tie_word_embeddings=True)  # head_dim is not hidden / heads (16)
PROMPTS = [[7], [5, 17, 33, 9, 41, 7, 60], [int(t) for t in np.random.default_rng(5).integers(3, VOCAB, 13)]]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_qwen3_checkpoint_gives_transformers_tokens(tmp_path: Path, dtype: str) -> None:
    """Qwen3: an RMSNorm over each query and key head (random weights here) before they are
    rotated, no biases, a head_dim of its own, a tied head. A float32 file gives transformers'
    log-probabilities and greedy tokens after prompts of 1, 7 and 13 tokens; a bfloat16 one
    (read in float32) its greedy tokens, and its log-probabilities to bfloat16's precision under
    ``bf16`` (matrices and KV cache in bfloat16). Without the norms the model is another."""
    hf = save(tmp_path, "qwen3", dtype, **QWEN3)
    precision = "fp32" if dtype == "float32" else "bf16"
    llm = LLM(str(tmp_path), precision=precision, max_batch=2, kv_tokens=256)
    assert llm.config.architecture == "qwen3" and llm.config.qk_norm and llm.config.head_dim == 24
    tol = 1e-4 if precision == "fp32" else 0.1
    ref = assert_transformers_tokens(llm, hf, tol, steps=6)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_norm.weight.fill_(1.0)
    assert np.abs(log_probs(hf, PROMPTS[2]) - ref).max() > 10 * tol


@pytest.mark.parametrize("fmt, precision", [("f32", "fp32"), ("q8_0", "q")])
def test_a_qwen3_gguf_gives_transformers_log_probabilities(tmp_path: Path, fmt: str, precision: str) -> None:
    """The same model as a GGUF file (architecture ``qwen3``: ``attn_q_norm`` / ``attn_k_norm``,
    ``attention.key_length`` its head dim): float32 tensors give transformers' log-probabilities
    to 1e-4; q8_0 matrices run as blocks (``q``) give those of transformers with their
    dequantized values, within what quantizing the activations to 8-bit blocks moves them
    (weights 4x smaller for that: at ``SMALL``'s scale it moves Qwen2's as much, 0.1-0.2; here
    0.03 at most, 1e-6 for the same file at ``fp32``)."""
    hf = save(tmp_path / "ckpt", "qwen3", **QWEN3, **({} if fmt == "f32" else {"initializer_range": 0.05}))
    path = write_gguf_of(hf, tmp_path / "qwen3.gguf", fmt)
    llm = LLM(str(path), precision=precision, max_batch=2, kv_tokens=256, kv_dtype="float32")
    assert llm.config.architecture == "qwen3" and llm.config.head_dim == 24 and llm.config.tie_word_embeddings
    assert ("model.layers.0.self_attn.q_proj.weight" in llm.formats) == (fmt != "f32")  # kept in blocks under q
    if fmt != "f32":
        with torch.no_grad():
            for name, p in hf.named_parameters():
                if p.ndim == 2:
                    p.copy_(torch.from_numpy(quantize(p.numpy(), fmt, name).dequantize().reshape(p.shape)))
    tol = 1e-4 if fmt == "f32" else 5e-2
    for ids in PROMPTS:
        np.testing.assert_allclose(llm.score(ids), log_probs(hf, ids), rtol=0, atol=tol)


def k_quant_matrix(name: str, fmt: str, shape: tuple[int, int], std: float, seed: int) -> QuantTensor:
    """Random ``fmt`` rows (``k_quant_blocks``) whose values have a standard deviation of about
    ``std``: the same payload bytes with the fp16 scales of a first draw scaled to it."""
    first = QuantTensor(name, shape, fmt, k_quant_blocks(np.random.default_rng(seed), fmt, *shape, scale=1.0))
    scale = std / float(first.dequantize().std())
    return QuantTensor(name, shape, fmt, k_quant_blocks(np.random.default_rng(seed), fmt, *shape, scale=scale))


@pytest.mark.parametrize("fmts", [("q3_k", "q2_k"), ("q4_k", "q5_k", "q6_k"), ("iq4_nl", "iq4_xs")])
def test_a_llama_gguf_of_k_quants_gives_the_log_probabilities_of_its_values(tmp_path: Path, fmts: tuple[str, ...]) -> None:
    """Llama matrices stored as k-quants (each format in the q/k projections, whose rows
    llama.cpp permutes, the others, the head and the token table, as llama.cpp's k-quant files
    store theirs): kept in their blocks (``q``; GEMV at one token, GEMM over 13; the table's rows
    decoded by ``quant_take``) they give transformers' log-probabilities with the dequantized
    values, off by what the quant library's integer path adds (16 rows interleaved, activations
    rounded to 8-bit blocks as llama.cpp's are): on average under 0.02, at worst under 5% of a
    position's spread of log-probabilities (measured: Q4_K/Q5_K/Q6_K 0.004-0.008 and 0.11 of
    4.4; Q3_K/Q2_K 0.006-0.0198 and 0.16 of 3.9: each random model amplifies the rounding of
    the activations by its own amount, one of Q6_K matrices alone to 0.021 at one token; IQ4_NL,
    IQ4_XS 0.009-0.011 and 0.13 of 5.1)."""
    hf = save(tmp_path / "ckpt", "llama", hidden_size=256, intermediate_size=256)
    matrices = [n for n, p in hf.named_parameters() if p.ndim == 2]
    blocks = {n: k_quant_matrix(n, fmts[i % len(fmts)], tuple(hf.get_parameter(n).shape), 0.05, seed=i) for i, n in enumerate(matrices)}
    assert {b.fmt for n, b in blocks.items() if ".q_proj." in n or ".k_proj." in n} == set(fmts)
    with torch.no_grad():
        for n, b in blocks.items():
            hf.get_parameter(n).copy_(torch.from_numpy(b.dequantize()))
    llm = LLM(str(write_gguf_of(hf, tmp_path / "kq.gguf", blocks=blocks)), precision="q", max_batch=2, kv_tokens=256, kv_dtype="float32")
    assert {llm.formats[n].removesuffix("x16") for n in blocks} == set(fmts)
    assert all(llm.formats[n].endswith("x16") for n in blocks if fmts[0] != "q3_k" and blocks[n].shape[0] % 16 == 0)  # the 16-row layouts
    for ids in PROMPTS:  # 1, 7 and 13 tokens
        got, want = llm.score(ids), log_probs(hf, ids)
        err = np.abs(got - want)
        assert err.mean() < 0.02 and (err.max(-1) < 0.05 * (want.max(-1) - want.min(-1))).all(), (err.mean(), err.max())


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0}


def test_yarn_scaled_qwen3_from_a_checkpoint_and_a_gguf_file(tmp_path: Path) -> None:
    """Qwen3 with yarn (4x an original context of 16, in a context of 64): the log-probabilities
    of 40 tokens are transformers', from the checkpoint and from a GGUF file of the same weights
    whose ``rope.scaling.*`` keys say the same (llama.cpp's yarn keys), and so are the greedy
    tokens after 20 (from the checkpoint, whose tokenizer reads the words); unscaled, the model
    gives others."""
    hf = save(tmp_path / "ckpt", "qwen3", rope_parameters=YARN, **QWEN3)
    meta = {"qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0, "qwen3.rope.scaling.original_context_length": 16}
    gguf_path = write_gguf_of(hf, tmp_path / "yarn.gguf", meta=meta)
    ids = [int(t) for t in np.random.default_rng(6).integers(3, VOCAB, 40)]
    ref = log_probs(hf, ids)
    for path in (tmp_path / "ckpt", gguf_path):
        llm = LLM(str(path), precision="fp32", max_batch=2, kv_tokens=256)
        assert llm.config.rope_scaling.type == "yarn" and llm.config.rope_scaling.attention_factor == pytest.approx(hf.model.rotary_emb.attention_scaling, rel=1e-6)
        np.testing.assert_allclose(llm.score(ids), ref, rtol=0, atol=1e-4)
        if path == gguf_path:
            continue
        assert_greedy(llm, hf, ids[:20], 8)
    plain = save(tmp_path / "plain", "qwen3", **QWEN3)
    assert np.abs(log_probs(plain, ids) - ref).max() > 1e-2


def test_longrope_switches_to_its_long_factors_where_transformers_does(tmp_path: Path) -> None:
    """longrope (original context 16, context 64): generation from a 12-token prompt crosses
    the original context while decoding, one from a 20-token prompt starts past it; the greedy
    tokens are transformers' ``generate``'s, which switches factors per forward call (the keys
    cached before keep their short factors)."""
    rng = np.random.default_rng(8)
    rope = {"rope_type": "longrope", "original_max_position_embeddings": 16, "rope_theta": 10000.0,
            "short_factor": [round(float(x), 3) for x in rng.uniform(1, 2, 8)], "long_factor": [round(float(x), 3) for x in rng.uniform(2, 8, 8)]}  # fmt: skip
    hf = save(tmp_path, rope_parameters=rope)
    llm = LLM(str(tmp_path), precision="fp32", max_batch=2, kv_tokens=256)
    assert llm.config.rope_scaling.type == "longrope" and llm.config.rope_scaling.original_context == 16
    for n in (12, 20):
        ids = [int(t) for t in rng.integers(3, VOCAB, n)]
        assert len(assert_greedy(llm, hf, ids, 10)) >= 5


def test_a_checkpoint_without_a_tokenizer_is_refused_before_compiling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It used to compile the model first and then fail on the missing file (an os error)."""
    save(tmp_path, tokenizer=False)

    def no_build(*_args: Any, **_kw: Any) -> Any:
        raise AssertionError("compiled before the tokenizer was read")

    monkeypatch.setattr(engine, "compiled_decoder", no_build)
    for path in (tmp_path, tmp_path / "model.safetensors"):
        with pytest.raises(TokenizerError, match=r"the checkpoint has no tokenizer\.json"):
            LLM(str(path), precision="fp32")


@pytest.mark.parametrize("precision", ["bf16", "q"])
def test_the_cli_generates_from_a_checkpoint_directory(tmp_path: Path, precision: str) -> None:
    """``tilework generate --model DIR``: the text of transformers' greedy tokens (a float
    checkpoint under ``q`` keeps its float32 matrices; the logits here are far apart enough for
    ``bf16`` and the 16-bit KV cache to keep the same tokens)."""
    hf = save(tmp_path / "ckpt", "llama", "float32", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    want = greedy(hf, word_tokenizer()(PROMPT)["input_ids"], 6)
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    cmd = [sys.executable, "-m", "tilework", "generate", PROMPT, "--model", str(tmp_path / "ckpt"), "--temperature", "0", "--max-tokens", "6", "--precision", precision]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    want = want[: want.index(2)] if 2 in want else want
    assert done.stdout.strip().splitlines()[0] == word_tokenizer().decode(want)

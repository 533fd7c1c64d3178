"""Phi-3 (``phi3``): llama with its q, k, v projections one matrix and the MLP's gate and up
another (``qkv_proj``, ``gate_up_proj``; GGUF ``attn_qkv``, ``ffn_up``), every layer attending in
its ``sliding_window``, Phi-3.5's longrope (GGUF: ``rope_factors_short`` / ``_long`` tensors) and
Phi-4-mini's partial rotation (``partial_rotary_factor``; GGUF ``rope.dimension_count`` below the
head dim). A random ``Phi3ForCausalLM`` gives transformers' log-probabilities and greedy tokens
from its checkpoint directory and from a GGUF file written as llama.cpp's converter writes it,
and llama.cpp's log-probabilities on that file (where llama-cpp-python is installed)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tilework.llm import LLM, SamplingParams  # noqa: E402
from tests.llm.test_checkpoint import VOCAB, add_tensor, close_gguf, greedy, log_probs, save  # noqa: E402
from tests.llm.test_decoder import _hf_incremental  # noqa: E402

PHI3 = dict(pad_token_id=0)  # Phi3Config's default (32000) is outside the small vocabulary
WINDOW = dict(PHI3, sliding_window=6)  # shorter than the 20-token prompts: the window is what is checked
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.4, 2.9, 3.5],
            "long_factor": [1.0, 1.5, 2.2, 3.1, 4.0, 5.5, 7.0, 9.0]}  # fmt: skip
# Phi-4-mini's partial rotation, small: 0.75 of a head dim of 16, 12 dims turned (6 frequencies)
PARTIAL = dict(PHI3, partial_rotary_factor=0.75)
PARTIAL_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75, "short_factor": [1.0, 1.2, 1.5, 2.0, 2.6, 3.3],
                    "long_factor": [1.0, 1.8, 3.0, 4.5, 6.5, 9.0]}  # fmt: skip


def phi3_gguf(hf: Any, path: Path, fmt: str = "f32") -> Path:
    """``hf``'s weights as llama.cpp's converter writes a phi3 file: fused ``attn_qkv`` and
    ``ffn_up`` (gate rows, then up rows) in transformers' row order (llama.cpp rotates phi3
    rotate-half), ``sliding_window`` and ``original_context_length`` keys, and for longrope its
    factors as tensors with the attention factor; ``rope.dimension_count`` the rotated dims
    (``int(partial_rotary_factor * hidden) // heads``, as the converter computes them); a
    byte-level BPE vocabulary (ids are fed)."""
    c = hf.config
    w = gguf.GGUFWriter(str(path), "phi3")
    rope_dims = int(c.rope_parameters.get("partial_rotary_factor", 1.0) * c.hidden_size) // c.num_attention_heads
    for key, value in {"block_count": c.num_hidden_layers, "context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
                       "feed_forward_length": c.intermediate_size, "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads,
                       "rope.dimension_count": rope_dims, "rope.scaling.original_context_length": c.original_max_position_embeddings}.items():  # fmt: skip
        w.add_uint32(f"phi3.{key}", value)
    if c.sliding_window is not None:
        w.add_uint32("phi3.attention.sliding_window", c.sliding_window)
    w.add_float32("phi3.rope.freq_base", c.rope_parameters["rope_theta"])
    w.add_float32("phi3.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "ab", *(f"w{i}" for i in range(3, VOCAB))])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(2)
    rope = c.rope_parameters
    if rope.get("rope_type") == "longrope":
        scale = c.max_position_embeddings / c.original_max_position_embeddings
        w.add_float32("phi3.rope.scaling.attn_factor", math.sqrt(1 + math.log(scale) / math.log(c.original_max_position_embeddings)))
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    names = {"self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}  # fmt: skip
    for name, value in hf.state_dict().items():
        data = value.detach().float().numpy()
        if name.startswith("model.layers."):
            layer, part = name.removeprefix("model.layers.").split(".", 1)
            out = f"blk.{layer}.{names[part.removesuffix('.weight')]}.weight"
        else:
            out = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}[name]
        add_tensor(w, out, data, fmt, name)
    return close_gguf(w, path)


@pytest.mark.parametrize("rope", ["window", "longrope"])
def test_a_phi3_checkpoint_and_gguf_give_transformers_log_probabilities(tmp_path: Path, rope: str) -> None:
    """window: every layer attends to its last 6 tokens (context 64); longrope: an original
    context of 16 in a context of 64, crossed at the 17th token. The greedy tokens after 20
    words (a step past the original context: long factors) from the checkpoint, whose tokenizer
    reads them."""
    kw: dict[str, Any] = dict(WINDOW, original_max_position_embeddings=64) if rope == "window" else dict(PHI3, rope_parameters=LONGROPE, original_max_position_embeddings=16)
    hf = save(tmp_path / "ckpt", "phi3", **kw)
    ids = [int(t) for t in np.random.default_rng(11).integers(3, VOCAB, 20)]
    # the references: token by token through transformers' cache, as score feeds them (longrope's
    # factors are chosen per step: short ones up to 16 tokens, long ones after, cached keys keeping theirs)
    gguf_path = phi3_gguf(hf, tmp_path / "phi3.gguf")
    # a GGUF file's window is not applied (llama.cpp applies none): its reference is the same model without one
    wide = save(tmp_path / "wide", "phi3", **PHI3, original_max_position_embeddings=64) if rope == "window" else hf
    llms = {}
    for path, model in ((tmp_path / "ckpt", hf), (gguf_path, wide)):
        llm = llms[path] = LLM(str(path), precision="fp32", max_batch=1, kv_tokens=256)
        cfg = llm.config
        if rope == "window":
            assert (cfg.sliding_window, cfg.sliding_layers) == ((6, tuple(range(cfg.layers))) if model is hf else (None, ()))
        else:
            assert cfg.rope_scaling.type == "longrope" and cfg.rope_scaling.attention_factor == pytest.approx(hf.model.rotary_emb.attention_scaling, rel=1e-6)
        ref = torch.log_softmax(torch.tensor(np.array(_hf_incremental(model, ids[:1], ids[1:]))), -1).numpy()
        np.testing.assert_allclose(llm.score(ids), ref, rtol=0, atol=1e-4)
    want = greedy(hf, ids, 8)
    want = want[: want.index(2)] if 2 in want else want
    out = llms[tmp_path / "ckpt"].generate(" ".join(f"w{t}" for t in ids), SamplingParams(temperature=0, max_tokens=8), chat=False)[0]
    assert out.token_ids[: len(want)] == want and len(want) >= 4
    # longrope's prefill depends on where a step ends: no prefix cache (LlmConfig.prefill_boundary)
    assert llms[tmp_path / "ckpt"].prefix_cache == (rope != "longrope")
    if rope == "window":  # without the window the model gives others
        assert np.abs(log_probs(wide, ids) - log_probs(hf, ids)).max() > 1e-2


@pytest.mark.parametrize("rope", ["default", "longrope"])
def test_a_partially_rotated_phi3_gives_transformers_log_probabilities(tmp_path: Path, rope: str) -> None:
    """Phi-4-mini's partial rotation, small: ``partial_rotary_factor`` 0.75 of a head dim of 16,
    the first 12 dims of each query and key turned (frequencies over 12), the last 4 as they
    are; with longrope its 6 short and long factors (an original context of 16, crossed at the
    17th token). From the checkpoint and from its GGUF file (``rope.dimension_count`` 12, factor
    tensors of 6): transformers' log-probabilities (1e-4) and greedy tokens after 20 words
    (the GGUF file's: each a teacher-forced argmax of the tokens before). The same weights
    turned in every dim give others (the partial rotation counts)."""
    kw: dict[str, Any] = dict(PARTIAL, original_max_position_embeddings=64) if rope == "default" else dict(PARTIAL, rope_parameters=PARTIAL_LONGROPE, original_max_position_embeddings=16)
    hf = save(tmp_path / "ckpt", "phi3", **kw)
    assert hf.model.rotary_emb.inv_freq.shape == (6,)
    ids = [int(t) for t in np.random.default_rng(14).integers(3, VOCAB, 20)]
    want = greedy(hf, ids, 8)
    want = want[: want.index(2)] if 2 in want else want
    assert len(want) >= 4
    # the references: token by token through transformers' cache, as score feeds them (longrope's
    # factors chosen per step: generate's one call over the prompt takes the long ones for all of it)
    steps = np.array(_hf_incremental(hf, ids[:1], ids[1:] + want))
    ref = torch.log_softmax(torch.tensor(steps), -1).numpy()
    choices = steps[len(ids) - 1 : -1].argmax(-1).tolist()  # transformers' greedy choice after each prefix
    assert rope == "longrope" or choices == want
    gguf_path = phi3_gguf(hf, tmp_path / "phi3.gguf")
    for path in (tmp_path / "ckpt", gguf_path):
        llm = LLM(str(path), precision="fp32", max_batch=1, kv_tokens=256)
        assert (llm.config.head_dim, llm.config.rope_dim, llm.config.rope_scaling.type) == (16, 12, rope)
        got = llm.score(ids + want)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)
        assert got[len(ids) - 1 : -1].argmax(-1).tolist() == choices
        if path != gguf_path:  # (the file's vocabulary does not spell the words)
            out = llm.generate(" ".join(f"w{t}" for t in ids), SamplingParams(temperature=0, max_tokens=8), chat=False)[0]
            assert out.token_ids[: len(want)] == want
    if rope == "default":
        full = save(tmp_path / "full", "phi3", **{**kw, "partial_rotary_factor": 1.0})
        assert np.abs(log_probs(full, ids) - ref[: len(ids)]).max() > 0.1


def test_a_quantized_phi3_gguf_runs_its_blocks(tmp_path: Path) -> None:
    """q8_0 matrices under ``q``: the fused tensors part into rows of blocks (views), the decoder
    joins them again; the log-probabilities are those of the dequantized weights to what 8-bit
    activations add."""
    hf = save(tmp_path / "ckpt", "phi3", **WINDOW, original_max_position_embeddings=64)
    path = phi3_gguf(hf, tmp_path / "q8.gguf", "q8_0")
    ids = [int(t) for t in np.random.default_rng(12).integers(3, VOCAB, 12)]
    fp32 = LLM(str(path), precision="fp32", max_batch=1, kv_tokens=128).score(ids)
    q = LLM(str(path), precision="q", max_batch=1, kv_tokens=128)
    assert {f.removesuffix("x16") for n, f in q.formats.items() if n.endswith("proj.weight")} == {"q8_0"}
    err = np.abs(q.score(ids) - fp32)  # 8-bit activations of a random model with weights of std 0.2: ~0.03 on average
    assert err.mean() < 0.06 and err.max() < 0.4 and np.ptp(fp32, axis=1).min() > 5  # rows parted wrongly would be off by whole units


@pytest.mark.slow
def test_llama_cpp_scores_a_phi3_file_as_tilework_does(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (an optional bench dependency) reads the file")
    from tests.llm.test_llama_cpp_q4_k_m import gguf_files, log_softmax

    """30 tokens of a file that says a window of 6, which neither llama.cpp nor tilework applies
    to a phi3 GGUF file."""
    hf = save(tmp_path / "ckpt", "phi3", **WINDOW, original_max_position_embeddings=64)
    path = str(phi3_gguf(hf, tmp_path / "phi3.gguf"))
    ids = [int(t) for t in np.random.default_rng(13).integers(3, VOCAB, 30)]
    want = log_softmax(gguf_files().llama_cpp_scores(path, ids, threads=2))
    got = LLM(path, precision="fp32", max_batch=1, kv_tokens=128).score(ids)
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-2)  # llama.cpp's float16 KV cache: 0.012 here, as transformers without the window
    assert np.abs(log_probs(hf, ids) - want).max() > 0.5  # transformers applies the window


@pytest.mark.slow
@pytest.mark.parametrize("rope", ["default", "longrope"])
def test_llama_cpp_scores_a_partially_rotated_phi3_file_as_tilework_does(tmp_path: Path, rope: str) -> None:
    """llama.cpp (llama-cpp-python, its KV cache float32) on the GGUF file of a random Phi-3 with
    Phi-4-mini's partial rotation (``rope.dimension_count`` 12 of 16): 30 tokens'
    log-probabilities as tilework's, within 5e-5 (1.1e-5 measured, longrope 1.3e-5; 0.016 with
    llama.cpp's float16 cache), where the same weights turned in every dim are 8.3 from llama.cpp's.
    longrope: its 6 factors, short and long equal (llama.cpp takes the long ones for its whole
    run, its context past the original 16; tilework the short ones up to 16 tokens)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (an optional bench dependency) reads the file")
    from tests.llm.test_llama_cpp_q4_k_m import gguf_files, log_softmax

    if rope == "default":
        kw: dict[str, Any] = dict(PARTIAL, original_max_position_embeddings=64)
    else:
        kw = dict(PARTIAL, rope_parameters={**PARTIAL_LONGROPE, "long_factor": PARTIAL_LONGROPE["short_factor"]}, original_max_position_embeddings=16)
    hf = save(tmp_path / "ckpt", "phi3", **kw)
    path = str(phi3_gguf(hf, tmp_path / "phi3.gguf"))
    ids = [int(t) for t in np.random.default_rng(13).integers(3, VOCAB, 30)]
    want = log_softmax(gguf_files().llama_cpp_scores(path, ids, threads=2, f32_cache=True))
    got = LLM(path, precision="fp32", max_batch=1, kv_tokens=128).score(ids)
    assert (got.max(-1) - got.min(-1)).min() > 0.5  # the log-probabilities differ enough to compare
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-5)
    if rope == "default":
        full = save(tmp_path / "full", "phi3", **{**kw, "partial_rotary_factor": 1.0})
        assert np.abs(log_probs(full, ids) - want).max() > 1.0


def test_a_partial_rotation_is_read_from_phi3_files_only(tmp_path: Path) -> None:
    """``rope.dimension_count`` below the head dim in a llama file is refused (llama.cpp's llama
    graph turns every dim), naming the key; longrope factor tensors of the head dim's length in a
    partially rotated phi3 file are refused, naming the tensor."""
    from tilework.errors import TileworkError, UnsupportedError
    from tilework.llm.config import LlmConfig

    w = gguf.GGUFWriter(str(tmp_path / "llama.gguf"), "llama")
    for key, value in {"embedding_length": 64, "attention.head_count": 4, "rope.dimension_count": 12}.items():
        w.add_uint32(f"llama.{key}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedError, match=r"partial rotary embeddings \(llama.rope.dimension_count = 12, head_dim 16\) are supported for phi3 and phi2 files only"):
        LlmConfig.from_gguf(tmp_path / "llama.gguf")
    hf = save(tmp_path / "ckpt", "phi3", **PHI3, rope_parameters=LONGROPE, original_max_position_embeddings=16)
    hf.config.rope_parameters["partial_rotary_factor"] = 0.75  # the file says 12 dims, its factors are 8
    with pytest.raises(TileworkError, match="rope_factors_short.weight must be 6 float32 values .rotated dims 12 / 2."):
        LlmConfig.from_gguf(phi3_gguf(hf, tmp_path / "phi3.gguf"))


def test_fused_tensors_part_into_views_of_their_rows() -> None:
    """``split_fused``: a fused matrix's rows and a fused bias's values go to q, k, v (gate, up)
    in order, as views; a fused tensor of the wrong size is refused naming it."""
    from tilework.errors import ShapeError
    from tilework.llm.config import LlmConfig
    from tilework.llm.quant import QuantTensor
    from tilework.llm.weights import split_fused

    cfg = LlmConfig(architecture="phi3", hidden=8, layers=1, heads=2, kv_heads=1, head_dim=4, ffn=6, vocab=10, rope_theta=1e4, rms_eps=1e-5, context_length=16)
    w, b = np.arange(16 * 8, dtype=np.float32).reshape(16, 8), np.arange(16, dtype=np.float32)
    gu = np.arange(12 * 8, dtype=np.float32).reshape(12, 8)
    tensors = {"model.layers.0.self_attn.qkv_proj.weight": QuantTensor("w", (16, 8), "f32", w.view(np.uint8).reshape(16, 32)),
               "model.layers.0.self_attn.qkv_proj.bias": QuantTensor("b", (16,), "f32", b.view(np.uint8)),
               "model.layers.0.mlp.gate_up_proj.weight": QuantTensor("g", (12, 8), "f32", gu.view(np.uint8).reshape(12, 32))}  # fmt: skip
    out = split_fused(cfg, tensors)
    want = {"self_attn.q_proj.weight": w[:8], "self_attn.k_proj.weight": w[8:12], "self_attn.v_proj.weight": w[12:], "self_attn.q_proj.bias": b[:8],
            "self_attn.k_proj.bias": b[8:12], "self_attn.v_proj.bias": b[12:], "mlp.gate_proj.weight": gu[:6], "mlp.up_proj.weight": gu[6:]}  # fmt: skip
    assert sorted(out) == sorted(f"model.layers.0.{n}" for n in want)
    for n, v in want.items():
        t = out[f"model.layers.0.{n}"]
        np.testing.assert_array_equal(t.dequantize(), v)
        assert np.shares_memory(t.data, tensors[f"model.layers.0.{n.split('.')[0]}.{'qkv_proj' if 'self_attn' in n else 'gate_up_proj'}.{n.rsplit('.', 1)[1]}"].data)
    with pytest.raises(ShapeError, match="qkv_proj.weight has 15 rows, the config implies 16"):
        split_fused(cfg, {"model.layers.0.self_attn.qkv_proj.weight": QuantTensor("w", (15, 8), "f32", w[:15].view(np.uint8).reshape(15, 32))})

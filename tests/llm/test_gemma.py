"""Gemma 3's text decoder (``Gemma3ForCausalLM``; GGUF ``gemma3``), Gemma 2's
(``Gemma2ForCausalLM``; GGUF ``gemma2``: soft-capped scores and logits, every other layer
sliding, one rotary base) and Gemma 1's (``GemmaForCausalLM``; GGUF ``gemma``: two norms a layer,
no window, the scores scaled by ``head_dim ** -0.5``; odd sizes, one key / value head, three
query heads of 20 over a hidden size of 48) on small random models: the configs read as transformers reads them, and the decoder gives transformers' logits and greedy
tokens from a checkpoint directory and from a GGUF file written as llama.cpp's converter writes
it (norm weights stored as ``w + 1``, ``ffn_norm`` the norm before the MLP), with prompts of 1, 7
and 13 tokens across a sliding window of 5 (layers sliding, global, sliding: two rotary bases,
the global one scaled), a head dim (24) that is not ``hidden / heads`` and a query scalar of its
own (from a GGUF file six layers, llama.cpp's fixed pattern); one compilation serves every prompt and decode step; ``bf16`` and ``q`` run it. With
llama-cpp-python, llama.cpp scores a random ``gemma3``, ``gemma2`` and ``gemma`` file as tilework does."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tilework.errors import UnsupportedError  # noqa: E402
from tilework.llm import LLM  # noqa: E402
from tilework.llm.config import LlmConfig  # noqa: E402
from tilework.llm.quant import quantize  # noqa: E402
from tilework.llm.weights import expected_shapes  # noqa: E402
from tests.long import long_param  # noqa: E402
from tests.llm.test_checkpoint import VOCAB, add_tensor, assert_transformers_tokens, close_gguf, log_probs, word_tokenizer  # noqa: E402
from tests.llm.test_decoder import Runner, _hf_incremental  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0}, "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}
GEMMA = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=24, vocab_size=VOCAB,
             max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.2, query_pre_attn_scalar=20,
             sliding_window=5, layer_types=TYPES, rope_parameters=ROPE)  # fmt: skip
# Gemma 2: layers 0 and 2 sliding (its default pattern), caps low enough that most scores and
# logits of the random model are capped
GEMMA2 = {**{k: v for k, v in GEMMA.items() if k not in ("layer_types", "rope_parameters")}, "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0},
          "attn_logit_softcapping": 1.5, "final_logit_softcapping": 4.0}  # fmt: skip
# Gemma 1: odd sizes, one key/value head (gemma-2b's multi-query attention), a head dim of 20 whose
# three heads (60) are not the hidden size (48), as gemma-7b's 16 x 256 are not its 3072
GEMMA1 = dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1, head_dim=20, vocab_size=VOCAB,
              max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.2,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})  # fmt: skip
PROMPTS = [[7], [5, 17, 33, 9, 41, 7, 60], [int(t) for t in np.random.default_rng(5).integers(3, VOCAB, 13)]]


def gemma(path: Path | None = None, dtype: str = "float32", version: int = 3, **kw: Any) -> Any:
    """A random ``Gemma3ForCausalLM`` (``version`` 2: ``Gemma2ForCausalLM``; 1: ``GemmaForCausalLM``
    of ``GEMMA1``'s sizes; its norm weights random too: transformers starts them at 0, a
    multiplier of 1), saved to ``path`` in ``dtype`` with a word tokenizer and read back in
    float32, where a path is given."""
    torch.manual_seed(0)
    cls, config, base = {
        1: (transformers.GemmaForCausalLM, transformers.GemmaConfig, GEMMA1),
        2: (transformers.Gemma2ForCausalLM, transformers.Gemma2Config, GEMMA2),
        3: (transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig, GEMMA),
    }[version]
    model = cls(config(**{**base, **kw})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    if path is None:
        return model
    model.to(getattr(torch, dtype)).save_pretrained(path)
    word_tokenizer().save_pretrained(path)
    return cls.from_pretrained(path, dtype=torch.float32).eval()


# llama.cpp's tensor names of Gemma 2 and 3 (gguf-py's tensor map); Gemma 1's norm before the MLP is ffn_norm
# (as a Llama's)
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
_PART = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip
_PART1 = {**_PART, "post_attention_layernorm": "ffn_norm"}


def gemma_gguf(hf: Any, path: Path, fmt: str = "f32", vocab: list[str] | None = None) -> Path:
    """``hf`` as llama.cpp's ``convert_hf_to_gguf.py`` writes a Gemma 3 model (``Gemma3Model``):
    the ``gemma3.*`` keys it writes (the global layers' rotary base and linear scaling, the
    window; no pattern, no local base, no query scalar: llama.cpp fixes or derives those), every
    ``*norm.weight`` stored as ``w + 1``, q and k rows in transformers' order, no output tensor
    (tied); the matrices in ``fmt``. ``vocab``: the token texts (else words ``w0 ..``). A Gemma 2
    model as ``Gemma2Model`` writes it: ``gemma2.*`` keys, the two soft caps, the window, the
    rotary base (which the converter leaves to llama.cpp's default, 10000, where it is that). A
    Gemma 1 model as ``GemmaModel`` writes it: ``gemma.*`` keys, no window, no caps, no rotary
    base (written here where it is not llama.cpp's default, as the converter never does),
    ``post_attention_layernorm`` as ``ffn_norm``."""
    c = hf.config
    arch = {"gemma": "gemma", "gemma2": "gemma2"}.get(c.model_type, "gemma3")
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size, "block_count": c.num_hidden_layers,
                       "feed_forward_length": c.intermediate_size, "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads,
                       "attention.key_length": c.head_dim, "attention.value_length": c.head_dim}.items():  # fmt: skip
        w.add_uint32(f"{arch}.{key}", value)
    if arch != "gemma":
        w.add_uint32(f"{arch}.attention.sliding_window", c.sliding_window)
    full = c.rope_parameters["full_attention"] if arch == "gemma3" else c.rope_parameters
    if arch == "gemma3" or full["rope_theta"] != 10000.0:
        w.add_float32(f"{arch}.rope.freq_base", full["rope_theta"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
    if full["rope_type"] == "linear":
        w.add_string(f"{arch}.rope.scaling.type", "linear")
        w.add_float32(f"{arch}.rope.scaling.factor", full["factor"])
    if arch == "gemma2":
        w.add_float32("gemma2.attn_logit_softcapping", c.attn_logit_softcapping)
        w.add_float32("gemma2.final_logit_softcapping", c.final_logit_softcapping)
    w.add_tokenizer_model("llama")
    tokens = vocab or [f"w{i}" for i in range(c.vocab_size)]
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([1] * len(tokens))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_space_prefix(False)
    for name, value in hf.state_dict().items():
        if name == "lm_head.weight":
            continue
        data = value.detach().float().numpy()
        if name.endswith("norm.weight"):
            data = data + 1  # Gemma's RMSNorm multiplies by 1 + w: the converter stores it so
        if name in _TOP:
            gname = _TOP[name]
        else:
            _, _, layer, rest = name.split(".", 3)
            gname = f"blk.{layer}.{(_PART1 if arch == 'gemma' else _PART)[rest.removesuffix('.weight')]}.weight"
        add_tensor(w, gname, data, fmt, name)
    return close_gguf(w, path)


def test_configs_read_as_transformers_reads_them() -> None:
    """transformers 5's ``rope_parameters`` per layer type, and the keys of the configs on the Hub
    (``rope_theta``, ``rope_local_base_freq``, ``rope_scaling`` of the global layers, no
    ``layer_types``: every sixth layer global), and a multimodal ``gemma3`` config's text part;
    the variants tilework does not compute are refused naming their key."""
    cfg = LlmConfig.from_hf_config(transformers.Gemma3TextConfig(**GEMMA).to_dict())
    assert cfg.architecture == "gemma3" and cfg.gemma and cfg.qk_norm and cfg.tie_word_embeddings
    assert (cfg.sliding_window, cfg.sliding_layers, [cfg.layer_window(i) for i in range(3)]) == (5, (0, 2), [5, None, 5])
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_scaling.type, cfg.rope_scaling.factor) == (10000.0, 100.0, "linear", 2.0)
    assert (cfg.head_dim, cfg.query_pre_attn_scalar, cfg.attention_scale) == (24, 20.0, 20**-0.5)
    hub = {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 13, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 24, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
           "sliding_window": 1024, "sliding_window_pattern": 6, "query_pre_attn_scalar": 24, "vocab_size": 262208, "eos_token_id": [1, 106]}  # fmt: skip
    cfg = LlmConfig.from_hf_config(hub)
    want = [i for i, t in enumerate(transformers.Gemma3TextConfig(**{k: v for k, v in hub.items() if k != "model_type"}).layer_types) if t == "sliding_attention"]
    assert list(cfg.sliding_layers) == want == [i for i in range(13) if i not in (5, 11)]
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_scaling.factor, cfg.eos_token_ids, cfg.context_length) == (1e6, 1e4, 8.0, (1, 106), 131072)
    multimodal = {"model_type": "gemma3", "text_config": {k: v for k, v in hub.items() if k != "eos_token_id"}, "eos_token_id": [1, 106], "vision_config": {}}
    assert LlmConfig.from_hf_config(multimodal) == cfg
    assert LlmConfig.from_dict(cfg.to_dict()) == cfg
    for key, value in (("final_logit_softcapping", 30.0), ("attn_logit_softcapping", 50.0), ("use_bidirectional_attention", True), ("hidden_activation", "gelu")):
        with pytest.raises(UnsupportedError, match=key):
            LlmConfig.from_hf_config({**hub, key: value})
    local_scaled = {"full_attention": {"rope_type": "default", "rope_theta": 1e6}, "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}
    with pytest.raises(UnsupportedError, match="sliding_attention"):
        LlmConfig.from_hf_config({**hub, "rope_parameters": local_scaled})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_gemma3_checkpoint_gives_transformers_tokens(tmp_path: Path, dtype: str) -> None:
    """A float32 checkpoint: transformers' log-probabilities (1e-4) and greedy tokens after
    prompts of 1, 7 and 13 tokens (the window of 5 crossed in prefill and in decode); a bfloat16
    one under ``bf16`` (matrices and KV cache in bfloat16) its greedy tokens, its
    log-probabilities to bfloat16's precision. A model whose window covers the prompt gives
    other log-probabilities: the window counts."""
    hf = gemma(tmp_path, dtype)
    precision = "fp32" if dtype == "float32" else "bf16"
    llm = LLM(str(tmp_path), precision=precision, max_batch=2, kv_tokens=256)
    assert llm.config.gemma and llm.config.sliding_layers == (0, 2)
    tol = 1e-4 if precision == "fp32" else 0.1
    ref = assert_transformers_tokens(llm, hf, tol)
    assert np.abs(log_probs(gemma(sliding_window=64), PROMPTS[2]) - ref).max() > 10 * tol


@pytest.mark.parametrize("version", [3, 2, long_param(1, why="Gemma 1's layer is a Llama's (its checkpoint and GGUF tests run by default)")])
def test_prefill_and_every_decode_step_from_one_compilation(version: int) -> None:
    """The compiled decoder (one build) fed like the engine: transformers' logits after prompts
    of 1, 6 and 13 tokens and after each of 9 greedy steps through its cache, the decode steps'
    windows sliding over the cached keys (Gemma 2: their scores and the logits soft-capped;
    Gemma 1: every layer global, two norms a layer); greedy tokens too."""
    hf = gemma(version=version)
    r = Runner(hf, max_batch=2)
    assert r.builds == 1
    for prompt in ([3], [5, 17, 33, 9, 41, 7], PROMPTS[2]):
        tokens, logits = r.run(prompt, 9)
        want = _hf_incremental(hf, prompt, tokens)
        assert tokens == [int(np.argmax(x)) for x in want[:-1]]
        for got, ref in zip(logits, want):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert r.builds == 1


@pytest.mark.parametrize("version, fmt, precision", [(3, "f32", "fp32"), (3, "q8_0", "q"), (2, "f32", "fp32"), (1, "f32", "fp32")])  # (q8_0 blocks: the same kernels for both)
def test_a_gemma_gguf_gives_transformers_log_probabilities(tmp_path: Path, version: int, fmt: str, precision: str) -> None:
    """The model as a GGUF file of llama.cpp's converter, its config the checkpoint's (Gemma 3:
    six layers in transformers' default pattern, layer 5 global, the one llama.cpp fixes; its
    rotary bases and query scalar the ones llama.cpp fixes or derives, 10000 for the sliding
    layers and ``head_dim``; Gemma 2: the caps and window from the file, the rotary base
    llama.cpp's default; Gemma 1: its file's keys a Llama's, its norm before the MLP ``ffn_norm``):
    float32 tensors give transformers' log-probabilities to 1e-4; q8_0
    matrices kept in blocks (``q``) those of the dequantized values within what 8-bit activations
    move them (as for Qwen2 and Qwen3)."""
    small = {} if fmt == "f32" else {"initializer_range": 0.05}
    if version == 3:
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}
        hf = gemma(rope_parameters=rope, query_pre_attn_scalar=24, num_hidden_layers=6, layer_types=None, **small)
    elif version == 2:
        hf = gemma(version=2, query_pre_attn_scalar=24, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **small)
    else:
        hf = gemma(version=1)
    path = gemma_gguf(hf, tmp_path / "gemma.gguf", fmt)
    llm = LLM(str(path), precision=precision, max_batch=2, kv_tokens=256, kv_dtype="float32")
    c = llm.config
    assert c == LlmConfig.from_hf_config(hf.config.to_dict())  # the file's config is the checkpoint's
    if version == 3:
        assert (c.sliding_window, c.sliding_layers, c.rope_local_theta, c.rope_theta, c.query_pre_attn_scalar, c.tie_word_embeddings) == (5, (0, 1, 2, 3, 4), 1e4, 1e6, 24.0, True)
    assert ("model.layers.0.self_attn.q_proj.weight" in llm.formats) == (fmt != "f32")
    if fmt != "f32":
        with torch.no_grad():
            for name, p in hf.named_parameters():
                if p.ndim == 2:
                    p.copy_(torch.from_numpy(quantize(p.numpy(), fmt, name).dequantize().reshape(p.shape)))
    for ids in PROMPTS:
        got, want = llm.score(ids), log_probs(hf, ids)
        if fmt == "f32":
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
        else:  # 8-bit activations: measured 0.01 on average, 0.05 at worst (Gemma 3's six layers)
            err = np.abs(got - want)
            assert err.mean() < 0.02 and err.max() < 0.1, (err.mean(), err.max())


@pytest.mark.slow
@pytest.mark.parametrize("version", [3, 2, 1])
def test_llama_cpp_scores_a_gemma_file_as_tilework_does(tmp_path: Path, version: int) -> None:
    """llama.cpp (llama-cpp-python) reads the same kind of file: a random Gemma of 6 layers
    (hidden 256, head dim 64, window 8; Gemma 3: layer 5 global; Gemma 2: layers 1, 3, 5, caps
    of 10 on the scores and 8 on the logits, which move its log-probabilities by 0.3; Gemma 1:
    no window, head dim 96, three heads of 96 over a hidden size of 256) scores 40
    tokens as tilework does: within 0.004 measured (Gemma 3), 0.002 (Gemma 2) and 0.002 (Gemma 1), what
    transformers' own log-probabilities differ from llama.cpp's by (llama.cpp's GELU reads a
    table of half-precision inputs on CPU), where tilework's are transformers' to 1e-5."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (an optional bench dependency) reads the file")
    from tests.llm.test_llama_cpp_q4_k_m import gguf_files, log_softmax

    sizes: dict[str, Any] = dict(num_hidden_layers=6, hidden_size=256, intermediate_size=512, max_position_embeddings=128, vocab_size=512, initializer_range=0.05)
    if version == 1:  # one key / value head, three query heads of 96 over a hidden size of 256
        hf = gemma(version=1, **sizes, num_attention_heads=3, num_key_value_heads=1, head_dim=96)
    else:
        if version == 3:
            rope: dict[str, Any] = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}
            own: dict[str, Any] = {"rope_parameters": rope}
        else:
            own = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "attn_logit_softcapping": 10.0, "final_logit_softcapping": 8.0}
        hf = gemma(**sizes, layer_types=None, num_attention_heads=4, num_key_value_heads=2, head_dim=64, query_pre_attn_scalar=64, sliding_window=8, version=version, **own)
    vocab = ["<pad>", "<bos>", "<eos>", *(f"w{i}" for i in range(3, 512))]
    path = str(gemma_gguf(hf, tmp_path / "gemma.gguf", vocab=vocab))
    ids = [1] + [int(t) for t in np.random.default_rng(0).integers(3, 512, 39)]
    want = log_softmax(gguf_files().llama_cpp_scores(path, ids, threads=2))
    got = LLM(path, precision="fp32", max_batch=1, kv_tokens=256).score(ids)
    assert (got.max(-1) - got.min(-1)).min() > 1.0  # the log-probabilities differ enough to compare
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-2)
    np.testing.assert_allclose(got, log_probs(hf, ids), rtol=0, atol=1e-4)


def test_gemma2_configs_read_as_transformers_reads_them() -> None:
    """A ``gemma2`` config: every other layer sliding (transformers' default ``layer_types``), one
    rotary base, no q / k norms, both soft caps (absent: Gemma2Config's 50 and 30; null: none);
    the GGUF keys llama.cpp reads give the same fields (absent caps: 50 and 30; absent window:
    4096; the 46-layer 27B's query scalar hidden / heads)."""
    cfg = LlmConfig.from_hf_config(transformers.Gemma2Config(**GEMMA2).to_dict())
    assert (cfg.architecture, cfg.gemma, cfg.qk_norm, cfg.tie_word_embeddings) == ("gemma2", True, False, True)
    assert (cfg.sliding_window, cfg.sliding_layers, cfg.rope_local_theta, cfg.rope_theta) == (5, (0, 2), None, 1000.0)
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.attention_scale) == (1.5, 4.0, 20**-0.5)
    hub = {"model_type": "gemma2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 24, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 24, "sliding_window": 4096,
           "max_position_embeddings": 8192, "vocab_size": 256000, "eos_token_id": 1}  # fmt: skip
    cfg = LlmConfig.from_hf_config(hub)
    want = [i for i, t in enumerate(transformers.Gemma2Config(**{k: v for k, v in hub.items() if k != "model_type"}).layer_types) if t == "sliding_attention"]
    assert list(cfg.sliding_layers) == want == [0, 2, 4, 6]
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.rope_theta, cfg.context_length) == (50.0, 30.0, 10000.0, 8192)
    assert LlmConfig.from_hf_config({**hub, "final_logit_softcapping": None}).final_softcap is None
    assert LlmConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(UnsupportedError, match="hidden_activation"):
        LlmConfig.from_hf_config({**hub, "hidden_activation": "gelu"})

    from tilework.llm.gemma import gguf_fields

    def fields(meta: dict[str, Any], layers: int = 26, hidden: int = 2304) -> dict[str, Any]:
        return gguf_fields(lambda k, default=None: meta.get(k, default), "gemma2", "f.gguf", layers, hidden, 8, 256)

    got = fields({"gemma2.attention.sliding_window": 4096, "gemma2.attn_logit_softcapping": 50.0, "gemma2.final_logit_softcapping": 30.0})
    assert got == fields({}) == {"sliding_window": 4096, "sliding_layers": tuple(range(0, 26, 2)), "rope_local_theta": None, "query_pre_attn_scalar": 256.0,
                                 "attn_softcap": 50.0, "final_softcap": 30.0, "embedding_multiplier": 48.0}  # fmt: skip
    assert fields({}, layers=46, hidden=4608)["query_pre_attn_scalar"] == 4608 // 8


def test_a_gemma2_checkpoint_gives_transformers_log_probabilities(tmp_path: Path) -> None:
    """A float32 Gemma 2 checkpoint: transformers' log-probabilities (1e-4) and greedy tokens after
    prompts of 1, 7 and 13 tokens, the window of 5 crossed; the model without its caps gives
    other log-probabilities (the caps count)."""
    hf = gemma(tmp_path, version=2)
    llm = LLM(str(tmp_path), precision="fp32", max_batch=2, kv_tokens=256)
    assert llm.config.architecture == "gemma2" and llm.config.sliding_layers == (0, 2)
    ref = assert_transformers_tokens(llm, hf)
    uncapped = gemma(version=2, attn_logit_softcapping=None, final_logit_softcapping=None)
    assert np.abs(log_probs(uncapped, PROMPTS[2]) - ref).max() > 0.1


def test_a_multimodal_checkpoint_runs_its_text_decoder(tmp_path: Path) -> None:
    """A ``Gemma3ForConditionalGeneration`` checkpoint (4B and larger): its config's
    ``text_config`` and its text decoder's tensors (``model.language_model.*``, transformers 5's
    names) give the text model's log-probabilities; the vision tower's tensors are left out."""
    from safetensors.numpy import save_file

    from tilework.llm.weights import read_safetensors

    hf = gemma(tmp_path / "text")
    mm = tmp_path / "mm"
    mm.mkdir()
    tensors = {n: t.dequantize().reshape(t.shape) for n, t in read_safetensors(tmp_path / "text" / "model.safetensors").items()}
    renamed = {("model.language_model." + n.removeprefix("model.")) if n.startswith("model.") else n: v for n, v in tensors.items()}
    save_file({**renamed, "model.vision_tower.vision_model.post_layernorm.weight": np.ones(8, np.float32), "model.multi_modal_projector.mm_input_projection_weight": np.ones((8, 64), np.float32)}, str(mm / "model.safetensors"))
    text = hf.config.to_dict()
    (mm / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text, "vision_config": {"model_type": "siglip_vision_model"}}))
    word_tokenizer().save_pretrained(mm)
    llm = LLM(str(mm), precision="fp32", max_batch=1, kv_tokens=64)
    assert llm.config == LlmConfig.from_hf_config(text)
    np.testing.assert_allclose(llm.score(PROMPTS[1]), log_probs(hf, PROMPTS[1]), rtol=0, atol=1e-4)


def test_gemma1_configs_read_as_transformers_reads_them() -> None:
    """A ``gemma`` config: two norms a layer (no sandwich), no q / k norms, every layer global,
    no caps, the scores scaled by ``head_dim ** -0.5`` (no query scalar), the embedding by
    ``sqrt(hidden)``, a tied head; gemma-7b's config.json as on the Hub (``hidden_act`` "gelu",
    which transformers reads as the tanh form; 16 heads of 256 over a hidden size of 3072) reads
    as GemmaConfig's defaults do, and so does a config with both activation keys (Gemma 1.1's);
    an activation other than GELU's tanh form in either key, and bidirectional attention, are
    refused naming the key."""
    cfg = LlmConfig.from_hf_config(transformers.GemmaConfig(**GEMMA1).to_dict())
    assert (cfg.architecture, cfg.gemma, cfg.sandwich_norm, cfg.qk_norm, cfg.tie_word_embeddings) == ("gemma", True, False, False, True)
    assert (cfg.head_dim, cfg.heads, cfg.kv_heads, cfg.attention_scale, cfg.query_pre_attn_scalar) == (20, 3, 1, None, None)
    assert (cfg.sliding_window, cfg.sliding_layers, cfg.rope_local_theta, cfg.attn_softcap, cfg.final_softcap) == (None, (), None, None, None)
    assert cfg.embedding_multiplier == float(np.float32(48**0.5)) and cfg.rope_theta == 10000.0
    assert LlmConfig.from_dict(cfg.to_dict()) == cfg
    hub = {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28, "num_attention_heads": 16,
           "num_key_value_heads": 16, "head_dim": 256, "hidden_act": "gelu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
           "vocab_size": 256000, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "attention_bias": False}  # fmt: skip
    cfg = LlmConfig.from_hf_config(hub)
    assert transformers.GemmaConfig(**{k: v for k, v in hub.items() if k != "model_type"}).hidden_act == "gelu_pytorch_tanh"
    assert (cfg.heads * cfg.head_dim, cfg.hidden, cfg.kv_heads, cfg.eos_token_ids, cfg.bos_token_id, cfg.context_length, cfg.tie_word_embeddings) == (4096, 3072, 16, (1,), 2, 8192, True)
    assert LlmConfig.from_hf_config({"model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28}) == cfg
    assert LlmConfig.from_hf_config({**hub, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh"}) == cfg
    for key, value in (("hidden_act", "silu"), ("hidden_activation", "gelu"), ("use_bidirectional_attention", True)):
        with pytest.raises(UnsupportedError, match=key):
            LlmConfig.from_hf_config({**hub, key: value})


def test_a_gemma1_checkpoint_gives_transformers_tokens(tmp_path: Path) -> None:
    """A float32 ``GemmaForCausalLM`` checkpoint (``GEMMA1``'s odd sizes): transformers'
    log-probabilities (1e-4) and greedy tokens after prompts of 1, 7 and 13 tokens; its layer's
    tensors are a Llama's (no ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm``)."""
    hf = gemma(tmp_path, version=1)
    llm = LLM(str(tmp_path), precision="fp32", max_batch=2, kv_tokens=256)
    assert llm.config.architecture == "gemma" and not llm.config.sandwich_norm
    names = expected_shapes(llm.config)  # the tensors load_weights found the checkpoint to hold
    assert not any("feedforward" in name for name in names) and "model.layers.2.post_attention_layernorm.weight" in names
    assert_transformers_tokens(llm, hf)

"""The compiled decoder on small random Llama and Qwen2 models from transformers configs:
``prefill`` and ``decode`` through the paged KV cache give Hugging Face's logits, quantized
weights give the logits of their dequantized values, a batch decodes like its sequences alone,
and one compilation serves every prompt length and batch size.

Each decoder (model kind, weight format, KV dtype) is compiled once for the module and shared by
the tests (``_runner``). The long tier (``TILEWORK_LONG_TESTS=1``) adds the batched decode of the
Qwen2 model (the Llama one runs by default; the QKV bias is checked by the prefill/decode test)
and the q4_1 weights (q8_0 and q4_0 cover the 8-bit and 4-bit kernels by default, q5_1 and q5_0
the 5-bit ones)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tilework  # noqa: E402
from tilework.llm import compile as llm_compile  # noqa: E402
from tilework.llm.config import LlmConfig  # noqa: E402
from tilework.llm.engine import logit_rows  # noqa: E402
from tilework.llm.kv_cache import PagedKVCache  # noqa: E402
from tilework.llm.quant import QuantTensor, quantize  # noqa: E402
from tilework.llm.weights import gemma_norm_multipliers  # noqa: E402
from tests.long import long_param  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _hf(kind: str = "llama") -> Any:
    torch.manual_seed(0)
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=96, max_position_embeddings=128, rope_theta=10000.0)
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, tie_word_embeddings=False)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, tie_word_embeddings=True)).eval()


def _counting(builds: list[int]) -> Callable[..., Any]:
    """The registered decoder builder, counting its calls in ``builds``."""
    real = llm_compile._BUILDER[0]

    def build(*args: Any, **kwargs: Any) -> Any:
        builds.append(1)
        return real(*args, **kwargs)

    return build


def _format_of(fmt: str, name: str) -> str:
    """The format of matrix ``name`` in a model of ``fmt``: one format, or ``"A+B"``: the MLP's
    matrices in ``B``, the others (attention, token table, lm head) in ``A``."""
    first, _, mlp = fmt.partition("+")
    return mlp if mlp and ".mlp." in name else first


class Runner:
    """The compiled decoder with a KV cache, fed like the engine feeds it."""

    def __init__(self, hf: Any, fmt: str | None = None, max_batch: int = 4, kv: str = "float32", cfg: LlmConfig | None = None) -> None:
        self.cfg = cfg or LlmConfig.from_hf_config(hf.config.to_dict())  # cfg: the same model's, read elsewhere (a GGUF file)
        tensors: dict[str, QuantTensor] = {}
        for name, value in hf.state_dict().items():
            if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and self.cfg.tie_word_embeddings):
                continue
            arr = value.detach().numpy().astype(np.float32)
            if fmt is not None and arr.ndim == 2:
                tensors[name] = quantize(arr, _format_of(fmt, name), name)
            else:
                tensors[name] = QuantTensor(name, arr.shape, "f32", arr.view(np.uint8).reshape(arr.shape[0], -1) if arr.ndim == 2 else arr.view(np.uint8))
        if self.cfg.gemma:  # transformers' Gemma norm weights w: the multipliers 1 + w, as load_weights gives them
            tensors = gemma_norm_multipliers(tensors)
        self.tensors = tensors
        self.formats, weights = llm_compile.prepare_weights(self.cfg, tensors, "q" if fmt else "fp32")
        builds: list[int] = []  # the compilations this runner's decoder took
        real = llm_compile._BUILDER[0]
        llm_compile._BUILDER[0] = _counting(builds)
        try:
            exe = llm_compile.compiled_decoder(self.cfg, self.formats, max_batch=max_batch, kv_dtype=kv, use_cache=False)
        finally:
            llm_compile._BUILDER[0] = real
        self.builds = len(builds)
        vm = tilework.VM(exe)
        self.prefill = vm.bind("prefill", *weights)
        self.decode = vm.bind("decode", *weights)
        self.cache = PagedKVCache.for_tokens(self.cfg.layers, self.cfg.kv_heads, self.cfg.head_dim, 256, dtype=kv)

    def run(self, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
        """Greedy ``steps`` tokens after ``prompt``; every step's logits."""
        sid = self.cache.add()
        kv_len, table = self.cache.step_inputs([sid], len(prompt))
        logits = self.prefill(np.array([prompt], np.int32), logit_rows(len(prompt)), kv_len, table, self.cache.k, self.cache.v)[0]
        self.cache.advance([sid], len(prompt))
        out, all_logits = [], [logits]
        for _ in range(steps):
            out.append(int(np.argmax(logits)))
            kv_len, table = self.cache.step_inputs([sid], 1)
            logits = self.decode(np.array(out[-1:], np.int32), kv_len, table, self.cache.k, self.cache.v)[0]
            self.cache.advance([sid], 1)
            all_logits.append(logits)
        self.cache.remove(sid)
        return out, all_logits


def test_precision_sets_every_matrix_format() -> None:
    """``prepare_weights``: ``fp32`` keeps every matrix in float32; ``bf16`` converts every matrix
    to bfloat16, float32 ones too (``bf16x16`` where its rows are whole groups of 16 and the quant
    library has AVX-512 BF16; the values the weights rounded to bf16); ``q`` keeps float32
    matrices as they are and blocks as blocks (interleaved in whole groups of 16 rows)."""
    from tilework.backend import quant as Q
    from tilework.op.quant import bf16_rows, interleave_rows

    cfg = LlmConfig.from_hf_config(_hf().config.to_dict())
    rng = np.random.default_rng(0)
    floats = {n: rng.standard_normal((96, 64)).astype(np.float32) for n in ("model.embed_tokens.weight",)}
    floats.update({f"model.layers.{i}.{n}": rng.standard_normal(s).astype(np.float32) for i in range(cfg.layers) for n, s in (
        ("self_attn.q_proj.weight", (64, 64)), ("self_attn.k_proj.weight", (32, 64)), ("self_attn.v_proj.weight", (32, 64)), ("self_attn.o_proj.weight", (64, 64)),
        ("mlp.gate_proj.weight", (128, 64)), ("mlp.up_proj.weight", (128, 64)), ("mlp.down_proj.weight", (64, 128)))})
    norms = {n: np.ones(64, np.float32) for n in ["model.norm.weight", *(f"model.layers.{i}.{k}" for i in range(cfg.layers) for k in ("input_layernorm.weight", "post_attention_layernorm.weight"))]}
    as_f32 = {n: QuantTensor(n, a.shape, "f32", a.view(np.uint8).reshape(a.shape[0], -1)) for n, a in floats.items()} | {n: QuantTensor(n, a.shape, "f32", a.view(np.uint8)) for n, a in norms.items()}
    assert llm_compile.prepare_weights(cfg, as_f32, "fp32")[0] == {}
    grouped = "bf16x16" if Q.library().bf16dot else "bf16"
    formats, arrays = llm_compile.prepare_weights(cfg, as_f32, "bf16")
    assert formats == dict.fromkeys(floats, grouped)
    table = floats["model.embed_tokens.weight"]
    want = interleave_rows(bf16_rows(table), "bf16") if grouped == "bf16x16" else bf16_rows(table)
    assert any(a.shape == want.shape and np.array_equal(a, want) for a in arrays)
    assert llm_compile.prepare_weights(cfg, as_f32, "q")[0] == {}
    blocks = {n: quantize(a, "q8_0", n) for n, a in floats.items()} | {n: t for n, t in as_f32.items() if n in norms}
    assert llm_compile.prepare_weights(cfg, blocks, "q")[0] == dict.fromkeys(floats, "q8_0x16")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "q"])
def test_weights_in_huge_pages_are_the_same_arrays(precision: str, tmp_path: Path) -> None:
    """``prepare_weights(huge_pages=True)``: the same arrays, those the loader made (decoded,
    merged, laid out, interleaved) read-only in one arena, views of the file left as views; and
    the file pages of the tensors it copied are released (``release_file_pages``)."""
    from tilework.runtime import pages

    cfg = LlmConfig.from_hf_config(_hf().config.to_dict())
    rng = np.random.default_rng(1)
    shapes = {"model.embed_tokens.weight": (96, 64)} | {f"model.layers.{i}.{n}": s for i in range(cfg.layers) for n, s in (
        ("self_attn.q_proj.weight", (64, 64)), ("self_attn.k_proj.weight", (32, 64)), ("self_attn.v_proj.weight", (32, 64)), ("self_attn.o_proj.weight", (64, 64)),
        ("mlp.gate_proj.weight", (128, 64)), ("mlp.up_proj.weight", (128, 64)), ("mlp.down_proj.weight", (64, 128)))}
    norms = ["model.norm.weight", *(f"model.layers.{i}.{k}" for i in range(cfg.layers) for k in ("input_layernorm.weight", "post_attention_layernorm.weight"))]
    made = {n: quantize(rng.standard_normal(s).astype(np.float32), "q4_1", n) for n, s in shapes.items()} | {n: quantize(rng.standard_normal(64).astype(np.float32), "f32", n) for n in norms}
    blob = np.concatenate([t.data.reshape(-1) for t in made.values()])  # one file, mapped, as a GGUF is
    blob.tofile(tmp_path / "w.bin")
    mapped = np.memmap(tmp_path / "w.bin", dtype=np.uint8, mode="r")
    tensors, at = {}, 0
    for n, t in made.items():
        tensors[n] = QuantTensor(n, t.shape, t.fmt, mapped[at : at + t.data.size].reshape(t.data.shape))
        at += t.data.size
    released: list[int] = []
    real = pages.release_file_pages

    def spy(a: np.ndarray) -> bool:
        released.append(a.ctypes.data)
        return real(a)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llm_compile, "release_file_pages", spy)
        formats, plain = llm_compile.prepare_weights(cfg, tensors, precision)
        assert sorted(released) == sorted(t.data.ctypes.data for n, t in tensors.items() if n not in norms)  # every matrix is copied
        released.clear()
        formats2, huge = llm_compile.prepare_weights(cfg, tensors, precision, huge_pages=True)
    assert formats2 == formats and len(huge) == len(plain)
    bases = set()
    for a, b in zip(plain, huge):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        if np.may_share_memory(b, mapped):
            assert np.may_share_memory(a, mapped)  # a view of the file stays one
        else:
            assert not b.flags.writeable
            base = b
            while isinstance(base, np.ndarray):
                base = base.base
            bases.add(id(base))
    assert len(bases) == 1  # one arena (the engine asks for it for the float precisions only)


_hf_shared = functools.cache(_hf)


@functools.cache
def _runner(kind: str = "llama", kv: str = "float32") -> Runner:
    """The float32-weight decoder of ``_hf(kind)`` at a max batch of 8, compiled once for the
    module; each test removes the sequences it adds."""
    return Runner(_hf_shared(kind), max_batch=8, kv=kv)


def _hf_logits(hf: Any, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_prefill_and_decode_give_hugging_faces_logits(kind: str) -> None:
    hf, r = _hf_shared(kind), _runner(kind)
    prompt = [5, 17, 33, 2, 9, 41, 7]
    tokens, logits = r.run(prompt, 8)
    ref = _hf_logits(hf, prompt + tokens)
    for i, got in enumerate(logits):
        np.testing.assert_allclose(got, ref[len(prompt) - 1 + i], rtol=1e-4, atol=1e-4)


_FACTORS = np.random.default_rng(7)
ROPE_SCALED = {
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    # head_dim 16: wavelengths 6.3 (kept: < 32 / 4), 19.9 (blended) and 63 up (divided: > 32 / 1)
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0},
    # the ramp over frequencies 0..7 from 0 to 2 (kept below, divided from 2 on); attention factor 1.139
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0},
    # no truncation: a ramp between 1.2 and 2.8 (two frequencies blended); attention factor given
    "yarn-betas": {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 32, "beta_fast": 8.0, "beta_slow": 2.0, "truncate": False, "attention_factor": 1.3, "rope_theta": 10000.0},
    # factor from the contexts (128 / 32): attention factor sqrt(1 + ln 4 / ln 32) = 1.183
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": 32, "short_factor": [round(float(x), 3) for x in _FACTORS.uniform(1, 2, 8)],
                 "long_factor": [round(float(x), 3) for x in _FACTORS.uniform(2, 6, 8)], "rope_theta": 10000.0},
}


def _hf_incremental(hf: Any, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """transformers' logits after ``prompt`` and after each of ``tokens`` fed one at a time
    through its cache, as ``generate`` computes them: longrope picks its factors per forward
    call (by its last position), so for it these are not one forward call's logits."""
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), use_cache=True)
        logits = [out.logits[0, -1].numpy()]
        for t in tokens:
            out = hf(torch.tensor([[t]]), cache=out.cache, use_cache=True)
            logits.append(out.logits[0, -1].numpy())
    return logits


@pytest.mark.parametrize("rope", list(ROPE_SCALED))
def test_scaled_rotary_gives_hugging_faces_logits(rope: str) -> None:
    """``rope_scaling`` linear, llama3, yarn and longrope are what the decoder computes: greedy
    tokens and every step's logits after prompts of 1, 27 and 40 tokens (the original context
    32 crossed while decoding, and by the prompt itself; the context is 128). The logits of the
    same weights unscaled differ far more than the tolerance, so the scaling is what is checked
    (weights 10x ``_hf``'s: with theirs the attention scores are too small for the angles to
    matter). longrope switches to its long factors in the step that goes past the original
    context, the keys cached before keeping theirs, as transformers' cache does: the 27-token
    prompt's decode differs from one forward call over the whole sequence."""
    torch.manual_seed(0)
    config = {**_hf().config.to_dict(), "initializer_range": 0.2}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
    scaled = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**config, "rope_parameters": ROPE_SCALED[rope]})).eval()
    scaled.load_state_dict(hf.state_dict())
    r = Runner(scaled, max_batch=1)
    assert r.cfg.rope_scaling.type == rope.partition("-")[0]
    assert r.cfg.rope_scaling.attention_factor == pytest.approx(scaled.model.rotary_emb.attention_scaling, rel=1e-12)
    np.testing.assert_allclose(r.cfg.rope_inv_freq(), scaled.model.rotary_emb.inv_freq.numpy(), rtol=1e-6)
    rng = np.random.default_rng(2)
    for n in (1, 27, 40):
        prompt = [int(t) for t in rng.integers(0, 96, n)]
        tokens, logits = r.run(prompt, 8)
        ref = _hf_incremental(scaled, prompt, tokens)
        assert tokens == [int(np.argmax(x)) for x in ref[:-1]]
        for got, want in zip(logits, ref):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        plain = _hf_logits(hf, prompt + tokens)
        assert np.abs(plain[n - 1 :] - np.array(ref)).max() > 100 * 1e-4
        if rope == "longrope" and n == 27:  # one forward call of 35 tokens: long factors throughout
            assert np.abs(_hf_logits(scaled, prompt + tokens)[n - 1 :] - np.array(ref)).max() > 100 * 1e-4


@pytest.mark.parametrize("fmt", [None, "q8_0"])
def test_mlp_biases_give_hugging_faces_logits(fmt: str | None) -> None:
    """llama's ``mlp_bias`` (gate, up and down biases; refused before), with ``attention_bias``
    too; the biases are random (transformers makes them zero), and float32 or q8_0 matrices (the
    merged gate/up bias either way). Quantized weights are compared with the model of their
    dequantized values."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**_hf().config.to_dict(), "mlp_bias": True, "attention_bias": True})).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.5)
    r = Runner(hf, fmt, max_batch=1)
    assert r.cfg.mlp_bias and "model.layers.1.mlp.gate_proj.bias" in r.tensors
    with torch.no_grad():  # the model of the values the runner's weights hold
        for name, t in r.tensors.items():
            if t.fmt != "f32":
                hf.get_parameter(name).copy_(torch.from_numpy(t.dequantize().reshape(t.shape)))
    prompt = [5, 17, 33, 2, 9, 41, 7]
    tokens, logits = r.run(prompt, 5)
    ref = _hf_logits(hf, prompt + tokens)
    tol = 1e-4 if fmt is None else 1.5e-2  # q: the activations' 8-bit blocks (see the test below)
    for i, got in enumerate(logits):
        np.testing.assert_allclose(got, ref[len(prompt) - 1 + i], rtol=tol, atol=tol)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ".mlp." in name and name.endswith(".bias"):
                p.zero_()
    assert np.abs(_hf_logits(hf, prompt + tokens) - ref).max() > 10 * tol


def test_a_bfloat16_kv_cache_gives_hugging_faces_logits_to_its_precision() -> None:
    """Keys and values rounded to bfloat16 as they are cached (8 significant bits): the logits
    move by about what that rounding explains, far more than float32's 1e-4, and the greedy
    tokens stay; prompt and continuation cross pages (16 tokens each)."""
    fp32, half = _runner(), _runner(kv="bfloat16")
    assert half.cache.k.dtype.name == "bfloat16" and half.cache.k.nbytes * 2 == fp32.cache.k.nbytes
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, 96, 13)]
    tokens, logits = half.run(prompt, 9)
    ref_tokens, ref_logits = fp32.run(prompt, 9)
    assert tokens == ref_tokens
    err = max(float(np.abs(a - b).max()) for a, b in zip(logits, ref_logits))
    scale = max(float(np.abs(b).max()) for b in ref_logits)
    assert 0 < err <= 2.0**-8 * scale, (err, scale)


@pytest.mark.parametrize("kind", ["llama", long_param("qwen2", why="the second model kind (its QKV bias is checked by the prefill/decode test)")])
def test_batched_decode_gives_hugging_faces_logits_at_every_batch_size(kind: str) -> None:
    """The float32 projections (weights packed in column panels; llama's tied token table too,
    its rows gathered from the panels) at batches of 1, 3, 5 and 8 rows: every sequence's
    logits are Hugging Face's for it alone. (Qwen2: long tier only.)"""
    hf, r = _hf_shared(kind), _runner(kind)
    rng = np.random.default_rng(0)
    for batch in (1, 3, 5, 8):
        prompts = [[int(t) for t in rng.integers(0, r.cfg.vocab, n)] for n in rng.integers(1, 12, batch)]
        sids = [r.cache.add() for _ in prompts]
        seqs = [list(p) for p in prompts]
        for sid, p in zip(sids, prompts):
            kv_len, table = r.cache.step_inputs([sid], len(p))
            ref = _hf_logits(hf, p)[-1]
            np.testing.assert_allclose(r.prefill(np.array([p], np.int32), logit_rows(len(p)), kv_len, table, r.cache.k, r.cache.v)[0], ref, rtol=1e-4, atol=1e-4)
            r.cache.advance([sid], len(p))
        for _ in range(3):
            nxt = [int(t) for t in rng.integers(0, r.cfg.vocab, batch)]
            kv_len, table = r.cache.step_inputs(sids, 1)
            logits = r.decode(np.array(nxt, np.int32), kv_len, table, r.cache.k, r.cache.v)
            r.cache.advance(sids, 1)
            for seq, t, got in zip(seqs, nxt, logits):
                seq.append(t)
                np.testing.assert_allclose(got, _hf_logits(hf, seq)[-1], rtol=1e-4, atol=1e-4)
        for sid in sids:
            r.cache.remove(sid)


@pytest.mark.parametrize("fmt", ["q8_0+q4_0", "q5_1+q5_0"] + [long_param(f, why="one format throughout (q8_0+q4_0 checks both kernel families in one build)") for f in ("q8_0", "q4_0", "q4_1")])
def test_quantized_weights_give_the_logits_of_their_values(fmt: str) -> None:
    """By default one model of both kernel families, an 8-bit and a 4-bit one: q8_0 attention,
    token table and lm head, q4_0 MLP (one build), and one of the 5-bit formats (q5_1 and q5_0,
    as llama.cpp's Q4_K_M / Q5_K_M files hold them). The long tier adds a model all in q8_0, all
    in q4_0 and all in q4_1."""
    hf = _hf()  # its own copy: its weights are replaced by the dequantized values
    quant = Runner(hf, fmt)
    with torch.no_grad():
        for name, t in quant.tensors.items():
            if t.fmt != "f32":
                hf.get_parameter(name).copy_(torch.from_numpy(t.dequantize().reshape(t.shape)))
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    tokens, logits = quant.run(prompt, 5)
    ref = _hf_logits(hf, prompt + tokens)
    # The quant backend quantizes each quant_linear's input to 8-bit blocks of 32
    # (tilework.backend.quant.activation_bound): for the lm head alone that bound is up to 1.4e-2
    # on these logits (5e-3 seen), so atol covers it where 1e-3 did before.
    for i, got in enumerate(logits):
        np.testing.assert_allclose(got, ref[len(prompt) - 1 + i], rtol=1e-3, atol=1.5e-2)


def test_a_batch_decodes_like_its_sequences_alone_and_one_build_serves_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared decoder took one compilation, and running prompts of 1, 3 and 17 tokens alone
    and in batches of 1 and 3 takes no other."""
    r = _runner()
    assert r.builds == 1
    builds: list[int] = []
    monkeypatch.setattr(llm_compile, "_BUILDER", [_counting(builds)])
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23], [42]]
    alone = [r.run(p, 6)[0] for p in prompts]
    sids = [r.cache.add() for _ in prompts]
    last = []
    for sid, p in zip(sids, prompts):
        kv_len, table = r.cache.step_inputs([sid], len(p))
        last.append(int(np.argmax(r.prefill(np.array([p], np.int32), logit_rows(len(p)), kv_len, table, r.cache.k, r.cache.v)[0])))
        r.cache.advance([sid], len(p))
    together: list[list[int]] = [[t] for t in last]
    for _ in range(5):
        kv_len, table = r.cache.step_inputs(sids, 1)
        logits = r.decode(np.array([t[-1] for t in together], np.int32), kv_len, table, r.cache.k, r.cache.v)
        r.cache.advance(sids, 1)
        for t, row in zip(together, logits):
            t.append(int(np.argmax(row)))
    for sid in sids:
        r.cache.remove(sid)
    assert together == alone
    assert builds == []  # the one compilation serves prompts of 1, 3 and 17 tokens and batches of 1 and 3


def test_a_cache_that_cannot_be_written_leaves_the_model_working(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """The compiled decoder is kept in the cache when it can be; a read-only cache gives a
    warning, not an error (the build itself is stubbed: this is about the cache)."""
    from tilework.codegen.cache import CacheWarning
    from tilework.runtime.executable import Executable

    cfg = LlmConfig.from_hf_config(_hf().config.to_dict())
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(tmp_path / "cache"))
    built: list[Any] = []

    def stub(module: Any, backends: Any = None) -> Executable:
        built.append(module)
        return Executable({}, [], {})

    monkeypatch.setattr(llm_compile, "_BUILDER", [stub])

    def refuse(self: Executable, path: str) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(Executable, "save", refuse)
    with pytest.warns(CacheWarning, match="not kept in the cache"):
        exe = llm_compile.compiled_decoder(cfg, {}, max_batch=1)
    assert len(built) == 1 and isinstance(exe, Executable)


def test_the_compiled_model_is_keyed_by_what_the_graph_reads() -> None:
    """A model that differs only in its bos / eos tokens (a checkpoint and its GGUF file) shares
    one compiled executable; a width, a format or the batch bound is another."""
    import dataclasses

    cfg = LlmConfig(architecture="llama", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=101, rope_theta=10000.0, rms_eps=1e-6, context_length=64,
                    bos_token_id=1, eos_token_ids=(2,))  # fmt: skip
    path = llm_compile._cache_path(cfg, {}, 16)
    assert llm_compile._cache_path(dataclasses.replace(cfg, bos_token_id=None, eos_token_ids=(2, 7)), {}, 16) == path
    for other in (llm_compile._cache_path(dataclasses.replace(cfg, ffn=128), {}, 16), llm_compile._cache_path(cfg, {"lm_head.weight": "q8_0"}, 16), llm_compile._cache_path(cfg, {}, 8)):
        assert other != path

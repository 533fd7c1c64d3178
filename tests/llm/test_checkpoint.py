"""``LLM`` on a transformers checkpoint directory (``save_pretrained`` of a random model and of a
small word-level tokenizer): the text and token ids of greedy generation and ``score``'s
log-probabilities are transformers', from float32, bfloat16 and sharded files; a checkpoint
without a tokenizer is refused before anything compiles; the CLI runs one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from tilework.errors import TileworkError  # noqa: E402
from tilework.llm import LLM, SamplingParams  # noqa: E402
from tilework.llm import engine  # noqa: E402
from tilework.llm.tokenizer import TokenizerError  # noqa: E402

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


def save(path: Path, kind: str = "llama", dtype: str = "float32", tokenizer: bool = True, shard: str | None = None, **kw: Any) -> Any:
    """A random model saved to ``path`` in ``dtype`` (with its tokenizer); the model read back
    from there in float32 (not the saved model cast: ``.to(bfloat16)`` rounds its rotary
    frequencies too, which the files do not hold)."""
    torch.manual_seed(0)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[kind]
    model = model_cls(config_cls(**{**SMALL, **kw})).to(getattr(torch, dtype)).eval()
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    if tokenizer:
        word_tokenizer().save_pretrained(path)
    return model_cls.from_pretrained(path, dtype=torch.float32).eval()


def greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return [int(t) for t in out[0, len(ids) :]]


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
    assert out.token_ids[: len(want)] == want and out.text.startswith(word_tokenizer().decode(want))


def test_a_mistral_checkpoint_runs_to_the_end_of_its_sliding_window(tmp_path: Path) -> None:
    """A 16-token window in a 64-token context: the context is the window, and every position of
    it gives transformers' log-probabilities (its mask is causal there); a longer prompt is
    refused, as one past any context is."""
    hf = save(tmp_path, "mistral", sliding_window=16)
    llm = LLM(str(tmp_path), precision="fp32", max_batch=2, kv_tokens=256)
    assert llm.config.context_length == 16
    ids = [int(t) for t in np.random.default_rng(3).integers(3, VOCAB, 16)]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0], -1).numpy()
    np.testing.assert_allclose(llm.score(ids), ref, rtol=0, atol=1e-4)
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=30), chat=False)[0]
    assert len(out.token_ids) <= 8 and out.token_ids == greedy(hf, llm.encode(PROMPT), 8)[: len(out.token_ids)]
    with pytest.raises(TileworkError, match="the prompt needs 16 tokens of context"):
        llm.generate(" ".join(f"w{t}" for t in ids), SamplingParams(temperature=0, max_tokens=1), chat=False)


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

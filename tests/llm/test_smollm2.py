"""The embedded SmolLM2-135M-Instruct (a Q4_1 GGUF) end to end, against transformers.

``fp32`` (the GGUF's weights dequantized) generates Hugging Face's greedy tokens, and its logits
are HF's within 1e-3, HF's ``LlamaForCausalLM`` (eager attention, float32) being loaded by
transformers' own GGUF reader (which undoes llama.cpp's q/k row permutation by itself). ``q``
and ``bf16`` pick fp32's greedy token at >= 90% of positions when fed fp32's continuation
(teacher forcing), and their perplexity on a fixed paragraph is within 3% of fp32's (``q`` with
an int8 KV cache too, in the acceptance run). The
quantized engine's peak resident memory is under 40% of fp32's, each measured in a fresh
process that loads a compiled model from the cache.

By default a short run: 2 prompts x 16 tokens, ``q`` only, no perplexity. The acceptance run
(5 prompts x 64 tokens, ``bf16`` too, perplexity) is opt-in; it prints every figure:

    TILEWORK_LONG_TESTS=1 python -m pytest tests/llm/test_smollm2.py -n 0 -s
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
from tests.long import LONG, long_only

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from tilework.errors import TileworkError  # noqa: E402
from tilework.llm import LLM, SamplingParams  # noqa: E402
from tilework.llm.engine import default_model_path, logit_rows  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

acceptance_only = long_only("the acceptance run")
# The decoder's modules round-trip through text in test_decoder.py; printing and parsing this
# 30-layer copy of them again would double the cost of a cold build.
pytestmark = [pytest.mark.slow, pytest.mark.no_roundtrip]

PROMPTS = [
    "The",  # one token
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Photosynthesis is the process by which green plants turn light into chemical energy. In the "
    "leaves, chlorophyll absorbs sunlight, and the plant uses that energy to combine carbon dioxide "
    "from the air with water from the soil. The products are glucose, which the plant stores or "
    "burns for growth, and oxygen, which it releases into the air. In simple words, this matters "
    "for animals because",
]
PROMPT_COUNT, NEW_TOKENS = (5, 64) if LONG else (2, 16)
CHECKED_STEPS = 4  # decode steps whose logits are compared with HF's, after the prompt's

# Written for this test (not quoted from anywhere): ~260 tokens of plain English.
TEXT = (
    "Bread is one of the oldest foods that people make, and the basic recipe has changed very little "
    "over thousands of years. Flour is mixed with water and a little salt, and then yeast is added so "
    "that the dough will rise. The yeast feeds on the sugars in the flour and releases small bubbles of "
    "gas, which become trapped in a stretchy network of gluten. Kneading the dough by hand or by machine "
    "helps to build this network, so that the loaf holds its shape in the oven. After kneading, the "
    "dough is left to rest in a warm place for an hour or two, until it has roughly doubled in size. The "
    "baker then presses out the largest bubbles, shapes the dough into a round or a long loaf, and lets "
    "it rise once more. A hot oven sets the crust quickly, while the inside finishes cooking more slowly. "
    "Many bakers put a tray of water at the bottom of the oven, because the steam keeps the surface soft "
    "for the first few minutes and lets the loaf expand. When the bread is done, it sounds hollow when "
    "tapped on the bottom. It should cool on a rack before it is cut, since the crumb is still setting as "
    "the heat leaves it. Fresh bread keeps for a day or two in a paper bag, and it can be frozen in "
    "slices for much longer."
)


@dataclass(frozen=True)
class Run:
    """fp32's greedy continuation of one prompt."""

    prompt: list[int]
    ids: list[int]


@pytest.fixture(scope="module")
def model_path() -> str:
    try:
        return default_model_path()
    except TileworkError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def llms(model_path: str) -> Callable[[str], LLM]:
    """One engine per precision, made on first use (default batch bound: the cached build);
    ``"q/int8"`` is ``q`` with an int8 KV cache."""
    made: dict[str, LLM] = {}

    def get(precision: str) -> LLM:
        if precision not in made:
            name, _, kv = precision.partition("/")
            made[precision] = LLM(model_path, name, kv_tokens=2048, kv_dtype=kv or None)
        return made[precision]

    return get


@pytest.fixture(scope="module")
def hf(model_path: str) -> Any:
    """HF's Llama with the GGUF's weights, as transformers itself reads and dequantizes them.
    Its two readings of the file (config, then tensors) share one ``gguf.GGUFReader`` (parsing
    the 49k-token vocabulary takes seconds); transformers asks gguf for the same tensor-name
    map once per module (397 times, 12 s), here made once; and the model is made without a
    random initialization (the file's values replace every weight)."""
    import functools

    import gguf
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    real = gguf.GGUFReader
    reader = real(model_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", lambda path, *a, **k: reader if (path, a, k) == (model_path, (), {}) else real(path, *a, **k))
        mp.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))  # (arch, blocks) -> a map read only
        config = {k: v for k, v in load_gguf_checkpoint(model_path)["config"].items() if k != "model_type"}
        with no_init_weights():
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config, attn_implementation="eager"))
        tensors = load_gguf_checkpoint(model_path, return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    model.tie_weights()  # made without initialization, the head is tied only now
    assert not unexpected and missing == ["lm_head.weight"] and model.lm_head.weight is model.model.embed_tokens.weight
    return model.float().eval()


@pytest.fixture(scope="module")
def fp32_runs(llms: Callable[[str], LLM]) -> list[Run]:
    llm = llms("fp32")
    prompts = PROMPTS[:PROMPT_COUNT]
    gens = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS), chat=False)
    return [Run(llm.encode(p), g.token_ids) for p, g in zip(prompts, gens)]


def _hf_greedy(hf: Any, prompt: list[int], steps: int, eos: set[int]) -> list[int]:
    """HF's greedy continuation (its own KV cache), ending at an end token like the engine."""
    out: list[int] = []
    with torch.no_grad():
        step = hf(torch.tensor([prompt]), use_cache=True)
        while len(out) < steps:
            token = int(step.logits[0, -1].argmax())
            if token in eos:
                break
            out.append(token)
            step = hf(torch.tensor([[token]]), past_key_values=step.past_key_values, use_cache=True)
    return out


def _hf_logits(hf: Any, tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].numpy()


def _our_logits(llm: LLM, prompt: list[int], then: list[int]) -> np.ndarray:
    """The logits after ``prompt`` (one prefill) and after each of ``then`` (one decode each)."""
    cache = llm.cache
    sid = cache.add()
    rows = []
    try:
        kv_len, table = cache.step_inputs([sid], len(prompt))
        rows.append(llm._prefill(np.asarray([prompt], np.int32), logit_rows(len(prompt)), kv_len, table, cache.k, cache.v)[0].copy())
        cache.advance([sid], len(prompt))
        for token in then:
            kv_len, table = cache.step_inputs([sid], 1)
            rows.append(llm._decode(np.asarray([token], np.int32), kv_len, table, cache.k, cache.v)[0].copy())
            cache.advance([sid], 1)
    finally:
        cache.remove(sid)
    return np.stack(rows)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _perplexity(llm: LLM) -> float:
    return llm.perplexity(llm.encode(TEXT))[0]


def test_fp32_generates_hugging_faces_tokens_and_logits(llms: Callable[[str], LLM], hf: Any, fp32_runs: list[Run]) -> None:
    llm = llms("fp32")
    worst = 0.0
    for run in fp32_runs:
        assert _hf_greedy(hf, run.prompt, NEW_TOKENS, llm.eos) == run.ids, f"prompt {llm.tokenizer.decode(run.prompt)!r}"
        then = run.ids[:CHECKED_STEPS]
        ours = _our_logits(llm, run.prompt, then)
        ref = _hf_logits(hf, run.prompt + then)[len(run.prompt) - 1 :]
        worst = max(worst, float(np.abs(ours - ref).max()))
    print(f"\nfp32 vs HF: {len(fp32_runs)} prompts x {NEW_TOKENS} greedy tokens equal; max |logits diff| {worst:.2e}")
    assert worst <= 1e-3


def test_score_gives_the_log_probabilities_after_every_prefix(llms: Callable[[str], LLM], hf: Any) -> None:
    llm = llms("fp32")
    tokens = llm.encode("The capital of Italy is Rome.")
    before = llm.cache.sequences()
    lp = llm.score(tokens)
    assert lp.shape == (len(tokens), llm.config.vocab) and lp.dtype == np.float32
    assert llm.cache.sequences() == before  # its sequence is gone
    np.testing.assert_allclose(np.exp(lp).sum(axis=1), 1.0, rtol=1e-4)
    np.testing.assert_allclose(lp, _log_softmax(_hf_logits(hf, tokens)), atol=1e-3)
    # row i is what a prefill of the first i + 1 tokens gives
    i = len(tokens) // 2
    np.testing.assert_allclose(lp[i], _log_softmax(_our_logits(llm, tokens[: i + 1], [])[0]), atol=1e-4)
    with pytest.raises(TileworkError, match="empty"):
        llm.score([])


@pytest.mark.parametrize("precision", ["q", pytest.param("bf16", marks=acceptance_only), pytest.param("q/int8", marks=acceptance_only)])
def test_precision_picks_fp32s_tokens_under_teacher_forcing(llms: Callable[[str], LLM], fp32_runs: list[Run], precision: str) -> None:
    llm = llms(precision)
    same = total = 0
    for run in fp32_runs:
        lp = llm.score(run.prompt + run.ids)
        picks = lp[len(run.prompt) - 1 : len(run.prompt) - 1 + len(run.ids)].argmax(axis=1)
        same += int((picks == np.asarray(run.ids)).sum())
        total += len(run.ids)
    print(f"\n{precision} vs fp32, teacher forcing: {same}/{total} = {100 * same / total:.1f}% of greedy tokens agree")
    assert same >= 0.9 * total


@pytest.fixture(scope="module")
def fp32_perplexity(llms: Callable[[str], LLM]) -> float:
    return _perplexity(llms("fp32"))


@acceptance_only
@pytest.mark.parametrize("precision", ["q", "bf16", "q/int8"])
def test_precision_perplexity_is_within_3_percent_of_fp32s(llms: Callable[[str], LLM], fp32_perplexity: float, precision: str) -> None:
    ppl = _perplexity(llms(precision))
    print(f"\nperplexity on {len(llms('fp32').encode(TEXT))} tokens: fp32 {fp32_perplexity:.4f}, {precision} {ppl:.4f} ({100 * (ppl / fp32_perplexity - 1):+.3f}%)")
    assert abs(ppl / fp32_perplexity - 1) <= 0.03


# ru_maxrss would not do: Linux carries it over fork and exec, so a child of this (large)
# process would report this process's peak. VmHWM is the peak of the child's own memory.
_PEAK_RSS = """
import sys
from tilework.llm import LLM, SamplingParams
llm = LLM(precision=sys.argv[1])
llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8), chat=False)
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def _peak_rss_kib(precision: str) -> int:
    """Peak resident memory of a fresh process that loads the engine and generates 8 tokens."""
    out = subprocess.run([sys.executable, "-c", _PEAK_RSS, precision], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


_NO_ML_DTYPES = """
import sys
from tilework.llm import LLM, SamplingParams
llm = LLM(precision="q")
text = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4), chat=False)[0].text
print(llm.cache.dtype, "ml_dtypes" in sys.modules, repr(text))
"""


def test_a_start_of_the_native_engine_does_not_import_ml_dtypes(llms: Callable[[str], LLM]) -> None:
    """NumPy's bfloat16 is ml_dtypes', whose import takes about a second: the native runtime is
    given the bfloat16 KV cache as its uint16 bits, and the VM is made only when used."""
    q = llms("q")
    out = subprocess.run([sys.executable, "-c", _NO_ML_DTYPES], capture_output=True, text=True, check=True).stdout.split(maxsplit=2)
    assert out[:2] == ["bfloat16", "False"]
    assert out[2].strip() == repr(q.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4), chat=False)[0].text)
    assert q.cache.k.dtype.name == "bfloat16" and np.shares_memory(q.cache.k, q.cache.k_bits)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak from /proc/self/status")
def test_quantized_peak_memory_is_under_40_percent_of_fp32s(llms: Callable[[str], LLM]) -> None:
    for precision in ("q", "fp32"):
        llms(precision)  # the compiled model is in the cache: the processes below only load it
    q, fp32 = _peak_rss_kib("q"), _peak_rss_kib("fp32")
    print(f"\npeak RSS: q {q / 1024:.0f} MiB, fp32 {fp32 / 1024:.0f} MiB ({100 * q / fp32:.1f}%)")
    assert q < 0.4 * fp32

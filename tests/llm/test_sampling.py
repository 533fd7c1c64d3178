"""Sampling: processed logits equal transformers' logits processors on random logits; greedy,
seeding, the draw itself, parameter validation and stop strings."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from tilework.errors import TileworkError
from tilework.llm.sampling import Sampler, SamplingParams, SamplingParamsError, StopChecker, StopStream, _draw

VOCAB = 1000


def _hf_process(logits: np.ndarray, history: np.ndarray, params: SamplingParams) -> np.ndarray:
    """transformers' processors, in the order generate() applies them."""
    torch = pytest.importorskip("torch")
    gen = pytest.importorskip("transformers.generation.logits_process")
    scores = torch.from_numpy(logits.copy())[None]
    ids = torch.from_numpy(history.astype(np.int64))[None]
    processors: list[Any] = []
    if params.repetition_penalty != 1.0:
        processors.append(gen.RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if not params.greedy:
        if params.temperature != 1.0:
            processors.append(gen.TemperatureLogitsWarper(params.temperature))
        if params.top_k > 0:
            processors.append(gen.TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            processors.append(gen.TopPLogitsWarper(params.top_p))
    for processor in processors:
        scores = processor(ids, scores)
    return np.asarray(scores[0].numpy())


CONFIGS = [
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(repetition_penalty=0.8, temperature=0.7),
    SamplingParams(temperature=1.5, top_k=50),
    SamplingParams(top_p=0.9),
    SamplingParams(temperature=0.6, top_k=40, top_p=0.95, repetition_penalty=1.1),
    SamplingParams(temperature=2.0, top_k=1),
    SamplingParams(top_p=0.05, repetition_penalty=1.5),
    SamplingParams(temperature=0.0, repetition_penalty=1.2),
]


@pytest.mark.parametrize("params", CONFIGS, ids=repr)
@pytest.mark.parametrize("seed", range(5))
def test_processed_logits_match_transformers(params: SamplingParams, seed: int) -> None:
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(VOCAB) * 3).astype(np.float32)
    history = rng.integers(0, VOCAB, size=rng.integers(1, 60))  # with repeats
    ours = Sampler(params, VOCAB).process(logits, history)
    ref = _hf_process(logits, history, params)
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(ref))
    kept = np.isfinite(ref)
    np.testing.assert_allclose(ours[kept], ref[kept], rtol=1e-6, atol=0)


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.99])
@pytest.mark.parametrize("spread", [0.1, 2.0, 8.0])  # flat (no first-round candidates), broad, peaked as a model's
def test_top_p_on_a_model_sized_vocabulary(top_p: float, spread: float) -> None:
    """49152 logits: the nucleus among the tokens of non-negligible weight, or (flat) past the
    first candidate batch of the partition."""
    logits = (np.random.default_rng(1).standard_normal(49152) * spread).astype(np.float32)
    params = SamplingParams(top_p=top_p, temperature=0.8)
    ours = Sampler(params, logits.size).process(logits, [])
    ref = _hf_process(logits, np.array([0]), params)
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(ref))
    if spread == 2.0:
        assert np.isfinite(ours).sum() > (128 if top_p > 0.5 else 1)


def test_top_k_keeps_ties_like_transformers() -> None:
    logits = np.array([3, 1, 3, 2, 3, 0, 2], dtype=np.float32)
    params = SamplingParams(top_k=2)
    ours = Sampler(params, logits.size).process(logits, [])
    np.testing.assert_array_equal(ours, _hf_process(logits, np.array([0]), params))
    assert np.isfinite(ours).sum() == 3  # all three 3s stay


@pytest.mark.parametrize("k", [1, 7, 40, 1000])
def test_top_k_on_a_model_sized_vocabulary_with_ties(k: int) -> None:
    """49152 logits rounded so that many tie, some -inf and a NaN: the k-th largest found
    through every 16th score is the exact one (transformers' warper on the same logits)."""
    rng = np.random.default_rng(k)
    logits = np.round(rng.standard_normal(49152) * 4, 1).astype(np.float32)
    logits[rng.integers(0, logits.size, 50)] = -np.inf
    params = SamplingParams(top_k=k, temperature=0.7)
    ours = Sampler(params, logits.size).process(logits, [])
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(_hf_process(logits, np.array([0]), params)))
    logits[3] = np.nan  # never kept (transformers would keep it: NaN sorts above every score)
    scores, keep = Sampler(params, logits.size).kept(logits, [])
    assert keep is not None and 3 not in keep and np.all(keep[1:] > keep[:-1]) and keep.size >= k


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, seed=2), SamplingParams(top_k=30, seed=2), SamplingParams(top_p=0.9, temperature=0.7, seed=2),
                                    SamplingParams(top_k=100, seed=2), SamplingParams(temperature=1.0, seed=2)], ids=repr)
@pytest.mark.parametrize("finite", [1, 60, 24576, 49151])
def test_held_back_tokens_are_never_kept_nor_drawn(params: SamplingParams, finite: int) -> None:
    """-inf logits without a NaN (an end of sequence held back, a grammar's mask) stay in place
    (no list of the other tokens is made): what is kept is transformers' (top-k with fewer
    tokens than k included), never a -inf token, and no draw is one."""
    rng = np.random.default_rng(finite)
    logits = (rng.standard_normal(49152) * 3).astype(np.float32)
    logits[rng.permutation(logits.size)[finite:]] = -np.inf
    ours = Sampler(params, logits.size).process(logits, [])
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(_hf_process(logits, np.array([0]), params)))
    scores, keep = Sampler(params, logits.size).kept(logits, [])
    assert keep is None or (keep.size and np.isfinite(scores[keep]).all())
    sampler = Sampler(params, logits.size)
    drawn = np.array([sampler.sample(logits, []) for _ in range(200)])
    assert np.isfinite(logits[drawn]).all() and (finite > 1 or (drawn == np.flatnonzero(np.isfinite(logits))[0]).all())


def test_sample_draws_from_the_kept_tokens_as_from_the_processed_logits() -> None:
    """``sample`` takes the kept tokens' ids without writing -inf over the vocabulary: the same
    draws as the distribution of ``process`` (``probs``) gives, token for token."""
    rng = np.random.default_rng(3)
    steps = [(rng.standard_normal(VOCAB) * s).astype(np.float32) for s in (0.5, 3.0, 9.0) for _ in range(5)]
    for params in (SamplingParams(temperature=0.8, top_p=0.9, seed=5), SamplingParams(top_k=30, repetition_penalty=1.3, seed=5), SamplingParams(seed=5)):
        fast, slow = Sampler(params, VOCAB), Sampler(params, VOCAB)
        for logits in steps:
            probs = slow.probs(logits, [1, 2, 3])
            want = _inverse_cdf(probs, slow.rng.random())
            assert fast.sample(logits, [1, 2, 3]) == want


def _inverse_cdf(weights: np.ndarray, u: float) -> int:
    """The reference draw: the first index whose float64 running sum of ``weights`` exceeds
    ``u`` times their sum."""
    return int(np.searchsorted(np.cumsum(weights, dtype=np.float64), u * weights.sum(dtype=np.float64), side="right"))


@pytest.mark.parametrize("n", [1, 2, 7, 1023, 1024, 1025, 4097, 49152])
def test_draw_is_the_inverse_cdf_of_the_softmax(n: int) -> None:
    """``_draw`` (``sampling_draw.c``): the weights exp(s - max) in place, within float32
    rounding of the softmax's, and the index the float64 inverse CDF of the softmax gives,
    held-back (-inf) scores never drawn, at the ends of [0, 1) too."""
    rng = np.random.default_rng(n)
    scores = (rng.standard_normal(n) * 4).astype(np.float32)
    if n > 2:
        scores[rng.choice(n, n // 3, replace=False)] = -np.inf
        scores[-1] = -np.inf  # the last index held back: a u near 1 must not land on it
    soft = np.exp(scores.astype(np.float64) - scores.max())
    for u in [0.0, 1e-12, *rng.random(40), 1 - 1e-12, float(np.nextafter(1.0, 0.0))]:
        weights = scores.copy()
        i = _draw(weights, u)
        np.testing.assert_allclose(weights, soft, rtol=4e-6, atol=0)  # (s - max rounded to float32, then 1 ulp)
        assert np.isfinite(scores[i])
        want = _inverse_cdf(soft, u)
        if want == n or soft[want] == 0:  # past the end, or on a held-back one: the last positive before it
            want = int(np.flatnonzero(soft[: min(want, n - 1) + 1] > 0)[-1])
        assert i == want or abs(np.cumsum(soft)[min(i, want)] / soft.sum() - u) < 1e-6  # (a boundary within float32 rounding)


def test_draw_refuses_scores_without_a_finite_one() -> None:
    with pytest.raises(SamplingParamsError, match="logits"):
        _draw(np.full(5, -np.inf, np.float32), 0.5)
    with pytest.raises(TypeError, match="float32"):  # what the C function could not read as float32
        _draw(np.zeros(3), 0.5)
    with pytest.raises(TypeError, match="C-contiguous"):
        _draw(np.zeros(6, np.float32)[::2], 0.5)


def test_draw_weights_below_float32s_normal_range_are_zero() -> None:
    """A weight below float32's normal range (1.2e-38: a score about 87.3 below the top one) is
    0, never a subnormal float32 (flushed while the exp runs: subnormal products are slow on
    x86), and is never drawn; the ones above it are exp's."""
    scores = np.array([0.0, -50.0, -86.9, -87.5, -200.0, -np.inf], np.float32)
    for u in (0.0, 0.5, float(np.nextafter(1.0, 0.0))):
        w = scores.copy()
        assert _draw(w, u) == 0  # (the others' mass is below float64's resolution of 1)
        assert (w[3:] == 0).all() and w[2] > 0
        np.testing.assert_allclose(w[:3], np.exp(scores[:3].astype(np.float64)), rtol=4e-6)
    assert np.array([1e-30], np.float32)[0] * np.float32(1e-10) > 0  # the caller's floating-point mode put back


def test_greedy_is_argmax_after_penalty() -> None:
    logits = np.array([1.0, 5.0, 4.5, -2.0], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=0, top_k=1, top_p=0.1, repetition_penalty=1.5), 4)
    assert sampler.sample(logits, []) == 1
    assert sampler.sample(logits, [1]) == 2  # 5 / 1.5 < 4.5
    assert sampler.sample(np.array([-1.0, -1.2, -3, -4], dtype=np.float32), [0]) == 1  # -1 * 1.5 < -1.2
    np.testing.assert_array_equal(sampler.probs(logits, [1]), [0, 0, 1, 0])


@pytest.mark.parametrize(("temperature", "penalty"), [(1e-300, 1.0), (1e-40, 1.0), (1e-30, 1.0), (1e-5, 1.0), (1e300, 1.0), (1e38, 1.0),
                                                       (1.0, 1e-300), (0.7, 1e300), (0.0, 1e-300), (0.0, 1e300), (1e-300, 1e-300), (1e300, 1e300)])
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (40, 0.9)])
def test_every_positive_temperature_and_penalty_samples_without_overflow(temperature: float, penalty: float, top_k: int, top_p: float) -> None:
    """A temperature or penalty far from 1 made float32 divide by 0 (1e-300 is 0 as a float32) or
    overflow: NaN scores, an IndexError or a message about logits, and NumPy warnings. Now no
    warning (they are errors here), a proper distribution, and the limits: a tiny temperature
    picks the most likely token, a huge one is uniform."""
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal(VOCAB) * 5).astype(np.float32)
    history = [int(i) for i in np.argsort(logits)[[0, 1, -3, -2]]]  # two very unlikely tokens, two likely ones
    params = SamplingParams(temperature, top_k, top_p, penalty, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = Sampler(params, VOCAB)
        probs = sampler.probs(logits, history)
        tokens = [sampler.sample(logits, history) for _ in range(20)]
    assert np.isfinite(probs).all() and abs(probs.sum() - 1) < 1e-9
    assert all(probs[t] > 0 for t in tokens)
    if temperature in (1e-300, 1e-40) and penalty == 1.0:
        assert set(tokens) == {int(np.argmax(logits))} and probs.max() == 1.0
    if temperature == 1e300 and penalty == 1.0 and top_k == 0:
        assert np.all(probs == probs[0])  # every score is 0: uniform
    if penalty == 1e-300 and temperature < 1:
        assert set(tokens) <= set(history[2:])  # a seen positive logit / 1e-300 is the largest float32


def test_same_seed_same_tokens() -> None:
    rng = np.random.default_rng(0)
    steps = [(rng.standard_normal(VOCAB) * 2).astype(np.float32) for _ in range(30)]
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)

    def run(p: SamplingParams) -> list[int]:
        sampler, out = Sampler(p, VOCAB), list[int]()
        for logits in steps:
            out.append(sampler.sample(logits, out))
        return out

    assert run(params) == run(params)
    assert run(params) != run(SamplingParams(temperature=0.9, top_p=0.95, seed=4321))


def test_draws_follow_the_processed_distribution() -> None:
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.07, 0.03], dtype=np.float32))
    sampler = Sampler(SamplingParams(top_p=0.85, seed=7), 5)
    probs = sampler.probs(logits, [])
    np.testing.assert_allclose(probs, [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0, 0], rtol=1e-6)
    n = 20000
    counts = np.bincount([sampler.sample(logits, []) for _ in range(n)], minlength=5)
    assert counts[3] == counts[4] == 0
    np.testing.assert_allclose(counts / n, probs, atol=0.015)


def test_sampler_refuses_bad_input() -> None:
    sampler = Sampler(SamplingParams(repetition_penalty=1.2), 4)
    with pytest.raises(SamplingParamsError, match=r"logits.*\(5,\).*\(4,\)"):
        sampler.sample(np.zeros(5, dtype=np.float32), [])
    with pytest.raises(SamplingParamsError, match="token id 9"):
        sampler.sample(np.zeros(4, dtype=np.float32), [1, 9])
    with pytest.raises(SamplingParamsError, match="all -inf"):
        Sampler(SamplingParams(), 2).sample(np.full(2, -np.inf, dtype=np.float32), [])
    with pytest.raises(SamplingParamsError, match="vocab_size=0"):
        Sampler(SamplingParams(), 0)


# ---------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", "hot"),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_k", True),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", float("inf")),
        ("max_tokens", 0),
        ("max_tokens", 3.0),
        ("stop", [""]),
        ("stop", ["ok", 3]),
        ("seed", -5),
        ("seed", "x"),
    ],
)
def test_params_validation_names_field_and_value(field: str, value: Any) -> None:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**{field: value})
    assert isinstance(info.value, TileworkError) and isinstance(info.value, ValueError)
    assert info.value.field == field
    assert f"{field}={value!r}" in str(info.value)


def test_params_defaults_and_normalization() -> None:
    p = SamplingParams(stop="###", seed=3, max_tokens=np.int64(5))  # type: ignore[arg-type]
    assert p.stop == ("###",) and not p.greedy and SamplingParams(temperature=0).greedy
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert hash(SamplingParams(stop=["a"])) == hash(SamplingParams(stop=("a",)))
    with pytest.raises(AttributeError):
        p.temperature = 0.5  # type: ignore[misc]


# ---------------------------------------------------------------- stop strings


def test_stop_checker_find_and_holdback() -> None:
    checker = StopChecker(["STOP", "\n\n", "END!"])
    assert checker.find("no stop here") is None
    assert checker.find("a\n\nb STOP") == 1  # earliest wins
    assert checker.find("xxSTOP", start=5) == 2  # a stop ending in the new text is found
    assert checker.holdback("hello ST") == 2 and checker.holdback("hello\n") == 1
    assert checker.holdback("hello") == 0 and checker.holdback("STO") == 3
    with pytest.raises(SamplingParamsError):
        StopChecker([""])


def _stream(stop: list[str], pieces: list[str]) -> tuple[list[str], str, bool]:
    stream = StopStream(StopChecker(stop))
    shown = []
    for piece in pieces:
        out, stopped = stream.push(piece)
        shown.append(out)
        if stopped:
            return shown, stream.text, True
    shown.append(stream.finish())
    return shown, stream.text, False


def test_stop_string_across_tokens() -> None:
    shown, text, stopped = _stream(["STOP"], ["Hel", "lo ST", "O", "P and more"])
    assert stopped and text == "Hello " and shown == ["Hel", "lo ", "", ""]
    assert "".join(shown) == text


def test_held_back_text_is_released() -> None:
    shown, text, stopped = _stream(["STOP"], ["a S", "Tx", " ST"])  # "ST" never became "STOP"
    assert not stopped and shown == ["a ", "STx", " ", "ST"] and "".join(shown) == text == "a STx ST"


def test_stop_inside_one_piece_and_earliest_of_several() -> None:
    shown, text, stopped = _stream(["</s>", "##"], ["ok</s>## more"])
    assert stopped and text == "ok" and shown == ["ok"]
    # Generation stops at the first check that finds a stop string, cutting at its earliest start.
    shown, text, stopped = _stream(["abcd", "bc"], ["xab", "cd"])  # both complete at once
    assert stopped and text == "x" and "".join(shown) == "x"
    shown, text, stopped = _stream(["abcd", "bc"], ["xab", "c", "d"])  # "bc" completes first
    assert stopped and text == "xa" and "".join(shown) == "xa"


def test_completion_logprobs_are_the_models_whatever_the_sampling() -> None:
    """``Completion(logprobs=k)``: each added token's log-softmax of the raw logits (not of the
    temperature- or penalty-reshaped ones), the k most likely tokens in order with their text;
    an end-of-sequence token gets none (it is not output)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tilework.llm.completion import Completion
    from tilework.llm.tokenizer import Tokenizer

    vocab = {f"w{i}": i for i in range(VOCAB)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    backend.decoder = tokenizers.decoders.WordPiece(prefix="##")  # words joined by spaces
    tok = Tokenizer(backend)
    rng = np.random.default_rng(3)
    params = SamplingParams(temperature=1.7, top_k=5, repetition_penalty=1.4, max_tokens=4, seed=1)
    out = Completion(params, VOCAB, {7}, tok.stream_decoder(context=[1]), [1, 2], logprobs=3)
    steps = [rng.standard_normal(VOCAB).astype(np.float32) * 4 for _ in range(4)]
    for logits in steps:
        out.add(logits.copy())
    assert len(out.token_logprobs) == len(out.ids) == 4
    for logits, e, prev in zip(steps, out.token_logprobs, [2, *out.ids]):
        ref = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
        assert e.logprob == pytest.approx(ref[e.id], abs=1e-9) and e.text == f" w{e.id}"
        assert [t for t, _, _ in e.top] == list(np.argsort(-ref, kind="stable")[:3])
        assert [lp for _, _, lp in e.top] == pytest.approx(sorted(ref, reverse=True)[:3], abs=1e-9)
    assert tok.decode([2]) == "w2" and out.text == " " + " ".join(f"w{i}" for i in out.ids)
    eos = Completion(SamplingParams(temperature=0), VOCAB, {7}, tok.stream_decoder(), [1], logprobs=0)
    logits = np.zeros(VOCAB, np.float32)
    logits[5], logits[7] = 3, 9
    eos.add(logits.copy())
    assert eos.finish == "stop" and eos.ids == [] and eos.token_logprobs == []
    with pytest.raises(TileworkError, match=r"logprobs must be in \[0, 20\]"):
        Completion(SamplingParams(), VOCAB, {7}, tok.stream_decoder(), [1], logprobs=21)


def test_frequency_and_presence_penalties_lower_the_generated_tokens() -> None:
    """OpenAI's penalties: ``c * frequency + (c > 0) * presence`` off the logit of a token
    generated ``c`` times (the output's counts, not the prompt's), after the repetition
    penalty, before the temperature; a -inf logit stays -inf; greedy sees them too."""
    rng = np.random.default_rng(5)
    logits = rng.standard_normal(VOCAB).astype(np.float32)
    logits[9] = -np.inf
    prompt, output = [1, 2, 3], [4, 4, 5, 9, 4]
    params = SamplingParams(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=-0.25, temperature=0.8)
    want = Sampler(SamplingParams(repetition_penalty=1.2, temperature=0.8), VOCAB).penalize(logits, prompt + output).astype(np.float64)
    for token, count in ((4, 3), (5, 1)):
        want[token] -= count * -0.25 + 0.5
    got = Sampler(params, VOCAB).penalize(logits, prompt + output, output)
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=0, atol=1e-6)
    assert got[9] == -np.inf and got[1] == want[1]  # a prompt token: the repetition penalty only
    np.testing.assert_allclose(Sampler(params, VOCAB).process(logits, prompt + output, output), want.astype(np.float32) / np.float32(0.8), rtol=1e-6)
    top = int(np.argmax(logits))
    assert Sampler(SamplingParams(temperature=0, presence_penalty=2), VOCAB).sample(logits, [top], [top]) != top
    assert Sampler(SamplingParams(temperature=0, presence_penalty=2), VOCAB).sample(logits, [top], []) == top  # the prompt's do not count
    for name, value in (("presence_penalty", 2.5), ("frequency_penalty", -3), ("presence_penalty", True)):
        with pytest.raises(SamplingParamsError, match=f"{name}=.* must be a number in \\[-2, 2\\]"):
            SamplingParams(**{name: value})


def test_logit_bias_is_added_to_the_models_logits_before_the_penalties() -> None:
    """OpenAI's ``logit_bias``: added to the given tokens' logits, then the repetition penalty
    (so a biased token's penalty acts on the biased value); -100 bans a likely token for
    greedy, 100 forces an unlikely one; stored as sorted pairs (a mapping and pairs give equal
    params); ids must be in the vocabulary, biases in [-100, 100], each id once."""
    rng = np.random.default_rng(6)
    logits = rng.standard_normal(VOCAB).astype(np.float32)
    top, low = int(np.argmax(logits)), int(np.argmin(logits))
    params = SamplingParams(temperature=0, logit_bias={top: -100, low: 100})
    assert params.logit_bias == ((min(top, low), params.bias[0][1]), (max(top, low), params.bias[1][1])) == tuple(sorted({top: -100.0, low: 100.0}.items()))
    assert params == SamplingParams(temperature=0, logit_bias=[(low, 100), (top, -100.0)]) and hash(params) == hash(SamplingParams(temperature=0, logit_bias=[(low, 100), (top, -100)]))
    assert Sampler(params, VOCAB).sample(logits) == low
    assert Sampler(SamplingParams(temperature=0, logit_bias={top: -100}), VOCAB).sample(logits) == int(np.argsort(logits)[-2])
    want = logits.copy()
    want[3] += 2.5
    want[3] = want[3] / 1.3 if want[3] > 0 else want[3] * 1.3
    got = Sampler(SamplingParams(logit_bias={3: 2.5}, repetition_penalty=1.3), VOCAB).penalize(logits, [3])
    assert got[3] == pytest.approx(want[3], abs=1e-6) and (np.delete(got, 3) == np.delete(logits, 3)).all()
    for bad in ({-1: 1}, {1: 101}, {1: float("nan")}, {True: 1}, [(1, 2, 3)], "x", [(1, 2), (1, 3)]):
        with pytest.raises(SamplingParamsError, match="logit_bias=.* token id -> a number in \\[-100, 100\\]"):
            SamplingParams(logit_bias=bad)  # type: ignore[arg-type]
    with pytest.raises(SamplingParamsError, match="ids within the vocabulary"):
        Sampler(SamplingParams(logit_bias={VOCAB: 1}), VOCAB)


def test_min_tokens_and_ignore_eos_keep_the_end_of_sequence_from_being_sampled() -> None:
    """An end-of-sequence token that greedy would take is passed over until ``min_tokens``
    tokens are out (then it ends the text), and always with ``ignore_eos`` (the text runs to
    ``max_tokens``); ``min_tokens`` above ``max_tokens`` is refused."""
    tokenizers = pytest.importorskip("tokenizers")
    from tilework.llm.completion import Completion
    from tilework.llm.tokenizer import Tokenizer

    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok = Tokenizer(backend)
    logits = np.zeros(VOCAB, np.float32)
    logits[5], logits[7], logits[8] = 3, 9, 9.5  # 7 and 8: the ends of sequence, the likeliest
    for params, ids, finish in ((SamplingParams(temperature=0, max_tokens=6, min_tokens=3), [5, 5, 5], "stop"),
                                (SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), [5] * 6, "length"),
                                (SamplingParams(temperature=0.5, max_tokens=4, ignore_eos=True, seed=1), None, "length")):
        out = Completion(params, VOCAB, {7, 8}, tok.stream_decoder(), [1])
        while out.finish is None:
            out.add(logits.copy())
        assert out.finish == finish and (ids is None or out.ids == ids) and not {7, 8} & set(out.ids)
    with pytest.raises(SamplingParamsError, match="min_tokens=5 is invalid: it must be an integer in \\[0, max_tokens=4\\]"):
        SamplingParams(max_tokens=4, min_tokens=5)
    with pytest.raises(SamplingParamsError, match="ignore_eos='yes'"):
        SamplingParams(ignore_eos="yes")  # type: ignore[arg-type]

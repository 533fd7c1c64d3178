"""``tilework.llm.LLM`` on the embedded SmolLM2 (quantized): batches decode like their
sequences alone, a chat's later turns feed only the new text and answer as the whole
conversation would, KV-cache pages come back, stop strings, limits, seeds and the errors."""

from __future__ import annotations

import copy
import dataclasses
import re

from pathlib import Path

import numpy as np
import pytest

from tests.llm.models import needs_smollm2
from tilework.errors import TileworkError

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

pytestmark = needs_smollm2

from tilework.llm import LLM, SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(precision="q", kv_tokens=4096)  # the default build: the CLI tests load the same


@pytest.fixture(scope="module")
def llm32() -> LLM:
    """fp32: feeding the same tokens in other calls (one prefill, or a prefill per turn) changes
    its logits by float rounding only, far below the gaps between greedy choices; on the
    quantized path (8-bit activations) the differences are large enough to flip near ties."""
    return LLM(precision="fp32", kv_tokens=4096)


def test_a_batch_decodes_like_each_prompt_alone(llm: LLM) -> None:
    prompts = ["Hi!", "Name three colors of the rainbow.", "What is 2 + 2? Answer with a number."]
    together = llm.generate(prompts, GREEDY)
    assert llm.stats.decode_steps == max(len(g.token_ids) + (g.finish_reason == "stop") for g in together) - 1
    for prompt, got in zip(prompts, together):
        alone = llm.generate(prompt, GREEDY)[0]
        assert got.token_ids == alone.token_ids and got.text == alone.text, prompt
        assert got.prompt_tokens == alone.prompt_tokens


def test_pages_come_back_after_generating(llm: LLM) -> None:
    free = llm.cache.free_pages
    llm.generate(["one", "two three"], GREEDY)
    assert llm.cache.free_pages == free and llm.cache.sequences() == []


def test_a_chat_turn_feeds_only_the_new_text_and_answers_like_the_whole_conversation(llm32: LLM) -> None:
    llm = llm32
    chat = llm.chat()
    try:
        first = chat.send("What is the capital of France?", params=GREEDY)
        cached = llm.cache.length(chat.sid)
        second = chat.send("And of Italy?", params=GREEDY)
        fed = llm.stats.prompt_tokens
    finally:
        chat.close()
    assert cached > 0 and fed < cached  # the second turn's prefill is the new message only
    assert first and second

    messages = [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": first},
                {"role": "user", "content": "And of Italy?"}]
    assert llm.template is not None
    whole = llm.template.render(messages, add_generation_prompt=True)
    fresh = llm.generate(whole, GREEDY, chat=False)[0]
    assert fresh.text == second
    assert llm.cache.sequences() == []


def test_chat_history_in_the_cache_is_the_conversation_after_max_tokens_and_stop(llm32: LLM) -> None:
    """A reply cut by max_tokens or a stop string: its last sampled token was never fed, and a
    stop string's tokens are past what the user saw. After each turn the cache holds exactly
    the recorded conversation (the replies as shown), and the next answer is the one a fresh
    prefill of that conversation gives."""
    llm = llm32
    turns = [("Tell me a long story about a dragon.", SamplingParams(temperature=0, max_tokens=5)),
             ("Count from 1 to 20, one number per line.", SamplingParams(temperature=0, max_tokens=60, stop=["5"])),
             ("Continue.", SamplingParams(temperature=0, max_tokens=5))]
    chat = llm.chat()
    try:
        for text, params in turns:
            reply = chat.send(text, params=params)
            assert chat.conversation.messages[-1] == {"role": "assistant", "content": reply}
            assert llm.cache.length(chat.sid) == len(llm.encode(chat.conversation.seen))
        assert "4" in chat.conversation.messages[3]["content"] and "5" not in chat.conversation.messages[3]["content"]
        answer = chat.send("What is 2+2? Answer with just the number.", params=SamplingParams(temperature=0, max_tokens=20))
    finally:
        chat.close()
    assert llm.template is not None
    whole = llm.template.render(chat.conversation.messages[:-1], add_generation_prompt=True)
    assert llm.generate(whole, SamplingParams(temperature=0, max_tokens=20), chat=False)[0].text == answer


def test_a_failed_chat_turn_leaves_the_session_as_it_was(llm: LLM) -> None:
    """A message past the context and a KV cache that fills up in the middle of a reply: each
    failed turn is undone (messages, what the model has seen, the cache), and the next turn
    answers as if it had never been sent. (On a copy of the model told its context is 96
    tokens, and on a model with a pool of 80 tokens.)"""
    short = SamplingParams(temperature=0, max_tokens=4)
    small = copy.copy(llm)
    small.config = dataclasses.replace(llm.config, context_length=96)
    tight = LLM(precision="q", kv_tokens=80)
    for model, failing, params in ((small, "word " * 100, short),
                                   (tight, "Write a long poem about the sea.", SamplingParams(temperature=0, max_tokens=60))):
        fresh = model.chat()
        fresh.send("Hi!", params=short)
        want = fresh.send("Name a color.", params=short)
        fresh.close()
        chat = model.chat()
        try:
            chat.send("Hi!", params=short)
            before = (list(chat.conversation.messages), chat.conversation.seen, model.cache.length(chat.sid))
            with pytest.raises(TileworkError, match="context|KV cache"):
                chat.send(failing, params=params)
            assert (chat.conversation.messages, chat.conversation.seen, model.cache.length(chat.sid)) == before
            assert chat.send("Name a color.", params=short) == want
            assert model.cache.length(chat.sid) == len(model.encode(chat.conversation.seen))
        finally:
            chat.close()
        assert model.cache.sequences() == [] and model.cache.free_pages == model.cache.num_pages


def test_stop_strings_and_limits(llm: LLM) -> None:
    counted = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=40), chat=False)[0]
    assert "7" in counted.text
    stopped = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=40, stop=["7"]), chat=False)[0]
    assert stopped.finish_reason == "stop" and "7" not in stopped.text and counted.text.startswith(stopped.text)
    short = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=3), chat=False)[0]
    assert short.finish_reason == "length" and len(short.token_ids) == 3 and short.token_ids == counted.token_ids[:3]


def test_a_seed_gives_the_same_sample(llm: LLM) -> None:
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=7)
    a, b = (llm.generate("Tell me a story.", params)[0] for _ in range(2))
    assert a.token_ids == b.token_ids
    others = [llm.generate("Tell me a story.", SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=s))[0].token_ids for s in (8, 9, 10)]
    assert any(o != a.token_ids for o in others)
    # in a batch, prompt i is seeded with seed + i (docs/llm.md): the second prompt repeats alone with seed 8
    both = llm.generate(["Name a fruit.", "Tell me a story."], params)
    assert both[1].token_ids == llm.generate("Tell me a story.", SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=8))[0].token_ids


def test_streamed_pieces_make_the_text(llm: LLM) -> None:
    pieces: dict[int, list[str]] = {0: [], 1: []}
    out = llm.generate(["Say hello in French.", "Count to five."], GREEDY, on_text=lambda i, p: pieces[i].append(p))
    assert ["".join(pieces[i]) for i in (0, 1)] == [g.text for g in out]


def test_text_cut_inside_a_character_ends_at_the_last_whole_one(llm: LLM) -> None:
    """max_tokens can end the ids inside a multi-byte character (here an emoji of several
    byte-level tokens): the text, streamed or not, ends at the last whole character instead of
    U+FFFD; token_ids keeps every generated id."""
    cut = 0
    for n in range(1, 6):
        pieces: list[str] = []
        out = llm.generate("Hi 🎉 日本", SamplingParams(temperature=0, max_tokens=n), on_text=lambda _i, p: pieces.append(p))[0]
        assert "\ufffd" not in out.text and "".join(pieces) == out.text
        assert llm.tokenizer.decode(out.token_ids).rstrip("\ufffd") == out.text
        cut += llm.tokenizer.decode(out.token_ids).endswith("\ufffd")
    assert cut  # some n cut a character


def test_errors(llm: LLM) -> None:
    with pytest.raises(TileworkError, match="at most 16"):
        llm.generate(["a"] * 17, GREEDY)
    with pytest.raises(TileworkError, match="empty"):
        llm.generate("", GREEDY, chat=False)
    with pytest.raises(TileworkError, match="context"):
        llm.generate("word " * 9000, GREEDY, chat=False)
    with pytest.raises(TileworkError, match="precision"):
        LLM(precision="int3")
    with pytest.raises(TileworkError, match=re.escape("prompts[1] is not valid Unicode: character 3 is a lone surrogate U+D800")):
        llm.generate(["ok", "caf\ud800"], GREEDY)
    with pytest.raises(TileworkError, match="a system message goes into the chat template, which chat=False leaves out"):
        llm.generate("ok", GREEDY, chat=False, system="Be brief.")
    with pytest.raises(TileworkError, match="the system message is not valid Unicode: character 0"):
        llm.generate("ok", GREEDY, system="\udfff")
    chat = llm.chat()
    with pytest.raises(TileworkError, match="the message is not valid Unicode: character 1"):
        chat.send("a\udce9")
    assert chat.conversation.messages == [] and llm.cache.length(chat.sid) == 0
    chat.close()
    assert llm.cache.sequences() == []  # nothing left behind by the failed calls


@pytest.mark.parametrize("prompts, message", [(None, "prompts must be a string or a list of strings, got NoneType"),
                                              (5, "prompts must be a string or a list of strings, got int"),
                                              (b"hi", "prompts must be a string or a list of strings, got bytes"),
                                              ([1, 2], "prompts[0] must be a str, got int"),
                                              (["ok", None], "prompts[1] must be a str, got NoneType")])
def test_prompts_that_are_not_strings_are_refused(llm: LLM, prompts: object, message: str) -> None:
    """They gave a raw TypeError or a misleading "chat template failed"."""
    with pytest.raises(TileworkError, match=re.escape(message)):
        llm.generate(prompts, GREEDY)  # type: ignore[arg-type]
    with pytest.raises(TileworkError, match=re.escape(message)):
        llm.generate(prompts, GREEDY, chat=False)  # type: ignore[arg-type]
    assert llm.cache.sequences() == []


def test_prompt_and_reply_fill_the_context_exactly(llm: LLM) -> None:
    """Prompt + generated tokens reach the context size and no further (as the server caps
    max_tokens at context - prompt): a prompt of context - 1 tokens gets one token. (On a
    copy of the model told its context is the prompt + 8 tokens: the same code at a context a
    test can fill.)"""
    text = "1, 2, 3, 4,"
    prompt = llm.encode(text)
    context = len(prompt) + 8
    small = copy.copy(llm)
    small.config = dataclasses.replace(llm.config, context_length=context)
    params = SamplingParams(temperature=0, max_tokens=100)
    out = small.generate(text, params, chat=False)[0]
    assert out.finish_reason == "length" and len(prompt) + len(out.token_ids) == context
    longer = text + out.text
    assert len(llm.encode(longer)) == context  # the greedy continuation tokenizes back to its ids
    one = small.generate(llm.tokenizer.decode(prompt + out.token_ids[:-1]), params, chat=False)[0]
    assert one.token_ids == out.token_ids[-1:]
    with pytest.raises(TileworkError, match=f"the prompt needs {context} tokens of context and its reply one more at least, the model has {context}"):
        small.generate(longer, params, chat=False)
    assert llm.cache.sequences() == []


@pytest.mark.parametrize("tokens, bad", [([49152], "token id 49152 (token 0)"), ([-1], "token id -1 (token 0)"),
                                         ([1, 99999999], "token id 99999999 (token 1)"), ([1, 2.0], "token 1 is 2.0"),
                                         ([True], "token 0 is True"), (5, "got int")])
def test_token_ids_outside_the_vocabulary_are_refused(llm: LLM, tokens: list[int], bad: str) -> None:
    """The compiled embedding reads its row unchecked: an id past the vocabulary crashed the
    process (or gave garbage), so every id a user gives is checked first."""
    with pytest.raises(TileworkError, match=re.escape(bad)):
        llm.score(tokens)
    with pytest.raises(TileworkError, match=re.escape(bad)):
        llm._start(tokens, GREEDY, 0)  # type: ignore[arg-type]
    assert llm.cache.sequences() == []
    assert llm.score(np.array([1, 49151]))[1].shape == (llm.config.vocab,)


@pytest.mark.parametrize("name", ["noext.bin", "model.GGUF", "model"])
def test_a_gguf_file_is_known_by_its_magic_not_its_name(llm: LLM, tmp_path: Path, name: str) -> None:
    """The weights were read as GGUF by the magic bytes, the tokenizer only from a name ending
    in .gguf (else a missing tokenizer.json)."""
    (tmp_path / name).symlink_to(llm.path)
    other = LLM(str(tmp_path / name), precision="q", kv_tokens=256)
    assert other.generate("Name a color.", GREEDY)[0].token_ids == llm.generate("Name a color.", GREEDY)[0].token_ids


def test_native_code_and_the_vm_give_the_same_bits(llm: LLM) -> None:
    """The default runtime (native graph code) and the Python VM run the same kernels: the
    same logits bit for bit, prefill and decode, so the same greedy tokens (8 of them: each
    decode step is the same kernels again, and the VM's steps are the slow ones)."""
    assert llm.runtime == "native"
    vm = LLM(precision="q", kv_tokens=4096, runtime="vm")
    tokens = llm.encode("The capital of France is")
    np.testing.assert_array_equal(llm.score(tokens), vm.score(tokens))
    params = SamplingParams(temperature=0, max_tokens=8)
    assert llm.generate("Name a color.", params)[0].token_ids == vm.generate("Name a color.", params)[0].token_ids
    with pytest.raises(TileworkError, match="runtime must be one of native, vm"):
        LLM(precision="q", runtime="jit")


def test_an_int8_kv_cache_holds_half_the_bytes_and_runs_on_both_runtimes(llm: LLM) -> None:
    """``kv_dtype="int8"``: keys and values quantized as they are written (a scale each, the
    pool half of bfloat16's bytes); native code and the VM give the same bits; a batch decodes
    like each prompt alone; the greedy tokens stay close to the bfloat16 cache's (the
    kernels' numerics are tests/llm/test_paged_attention_int8.py's; the perplexity: docs/llm.md)."""
    native = LLM(precision="q", kv_tokens=4096, kv_dtype="int8")
    vm = LLM(precision="q", kv_tokens=4096, kv_dtype="int8", runtime="vm")
    assert native.cache.dtype == "int8" and native.cache.bytes < 0.55 * llm.cache.bytes
    tokens = native.encode("The capital of France is")
    np.testing.assert_array_equal(native.score(tokens), vm.score(tokens))
    prompts = ["Hi!", "Name three colors of the rainbow."]
    together = native.generate(prompts, GREEDY)
    for prompt, got in zip(prompts, together):
        assert got.token_ids == native.generate(prompt, GREEDY)[0].token_ids == vm.generate(prompt, GREEDY)[0].token_ids, prompt
    # teacher forcing on the bfloat16 cache's continuation: the same greedy picks nearly everywhere
    ids = llm.generate("Name three colors of the rainbow.", SamplingParams(temperature=0, max_tokens=24))[0]
    prompt = llm.encode(llm.prompt_text("Name three colors of the rainbow."))
    picks = native.score(prompt + ids.token_ids)[len(prompt) - 1 : -1].argmax(axis=1)
    assert (picks == np.asarray(ids.token_ids)).mean() >= 0.75


def test_a_prompt_starts_on_the_pages_of_an_earlier_one_with_the_same_bits(llm: LLM) -> None:
    """The prefix cache: a prompt that begins with an earlier prompt's full pages prefills only
    the rest, and its logits are those of prefilling it whole, bit for bit (on the quantized
    path, where a decode step's keys differ from prefill's enough to flip near ties)."""
    page = llm.cache.page
    base = [int(t) for t in np.random.default_rng(7).integers(3, llm.config.vocab, 3 * page + 22)]
    # (prompt, tokens found): its own pages for the first; at most the pages short of the last token
    cases = [(base[: 2 * page + 13], 0), (base, 2 * page), (base[: 4 * page], 3 * page), (base[: 2 * page + 1] + [5, 6], 2 * page), (base[:page], 0)]

    def first_logits(tokens: list[int]) -> tuple[np.ndarray, int]:
        llm.stats = type(llm.stats)()
        a = llm._start(tokens, GREEDY, 0)
        llm.cache.remove(a.sid)
        assert a.logits is not None
        return a.logits, llm.stats.cached_tokens

    llm.cache.forget_prefixes()
    llm.prefix_cache = False
    try:
        alone = [first_logits(tokens) for tokens, _ in cases]
    finally:
        llm.prefix_cache = True
    assert llm.cache.published_pages == 0 and all(found == 0 for _, found in alone)
    for (tokens, found), (want, _) in zip(cases, alone):
        got, cached = first_logits(tokens)
        assert cached == found, len(tokens)
        np.testing.assert_array_equal(got, want)
    first = llm.generate("Name a color.", GREEDY)[0]
    again = llm.generate("Name a color.", GREEDY)[0]
    assert llm.stats.cached_tokens == (first.prompt_tokens - 1) // page * page > 0
    assert again.token_ids == first.token_ids and again.prompt_tokens == first.prompt_tokens
    assert "from the prefix cache" in llm.stats.line()


def test_perplexity_scores_every_token_once_in_half_overlapping_windows(llm: LLM) -> None:
    """70 tokens, windows of 32: [0, 32) predicts tokens 1..31, [16, 48) 32..47, [32, 64)
    48..63, [48, 70) 64..69, each from its own window's score."""
    tokens = [int(t) for t in np.random.default_rng(4).integers(3, llm.config.vocab, 70)]
    nll = 0.0
    for begin, first, end in ((0, 1, 32), (16, 32, 48), (32, 48, 64), (48, 64, 70)):
        lp = llm.score(tokens[begin:end])
        nll -= sum(float(lp[t - 1 - begin, tokens[t]]) for t in range(first, end))
    seen: list[tuple[int, int]] = []
    ppl, count = llm.perplexity(tokens, 32, lambda i, n: seen.append((i, n)))
    assert count == 69 and seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert ppl == pytest.approx(float(np.exp(nll / 69)), rel=1e-5)
    whole = llm.score(tokens[:20])
    assert llm.perplexity(tokens[:20])[0] == pytest.approx(float(np.exp(-np.mean([whole[i, tokens[i + 1]] for i in range(19)]))), rel=1e-5)
    for bad, message in (([5], "needs 2 tokens at least"), (tokens, "context must be an int in \\[2, ")):
        with pytest.raises(TileworkError, match=message):
            llm.perplexity(bad, 1 if len(bad) > 1 else None)

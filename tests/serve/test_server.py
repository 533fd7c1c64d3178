"""``tilework serve``'s API through the official ``openai`` client, on a free loopback port:
chat and completions, streamed and not, equal ``LLM.generate``; 16 concurrent clients get
their own tokens; clients that go away mid-stream leave no KV pages behind (the metrics show
it); bad requests get OpenAI error bodies with a 4xx status and the server goes on."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import numpy as np
import pytest

from tests.llm.models import needs_smollm2

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

pytestmark = needs_smollm2

import tilework.serve.app as app_module  # noqa: E402
from tilework.errors import TileworkError  # noqa: E402
from tilework.llm import LLM, SamplingParams  # noqa: E402
from tilework.llm.completion import Completion  # noqa: E402
from tilework.serve.scheduler import INTERNAL_ERROR  # noqa: E402
from tilework.serve.metrics import parse_metrics  # noqa: E402
from tilework.serve.server import BackgroundServer  # noqa: E402

PROMPTS = ["The capital of France is", "1, 2, 3,", "Hi", "My favourite colour is"]


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with BackgroundServer(LLM(precision="q", kv_tokens=4096)) as s:
        yield s


@pytest.fixture(scope="module")
def ref() -> LLM:
    """The references, computed by an engine of their own (the server's belongs to its thread)."""
    return LLM(precision="q", kv_tokens=4096)


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> Any:
    return openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120)


def http(server: BackgroundServer, path: str, body: bytes | None = None, method: str | None = None, timeout: float = 60) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{server.host}:{server.port}{path}", data=body, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metrics(server: BackgroundServer) -> dict[str, float]:
    return parse_metrics(http(server, "/metrics")[1])


def test_chat_and_completions_streamed_or_not_equal_generate(server: BackgroundServer, client: Any, ref: LLM) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=4)
    question = "What is the capital of Italy?"
    want_chat = ref.generate(question, greedy)[0]
    want_text = ref.generate(PROMPTS[0], greedy, chat=False)[0]
    chat = client.chat.completions.create(model=server.name, messages=[{"role": "user", "content": question}], max_tokens=4, temperature=0)
    assert chat.choices[0].message.content == want_chat.text and chat.choices[0].finish_reason == want_chat.finish_reason
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (want_chat.prompt_tokens, len(want_chat.token_ids))
    chunks = list(client.chat.completions.create(model=server.name, messages=[{"role": "user", "content": question}], max_tokens=4,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want_chat.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == want_chat.finish_reason
    assert chunks[-1].usage.completion_tokens == len(want_chat.token_ids) and not chunks[-1].choices
    # the same prompt again: its full pages but the last token's from the prefix cache (OpenAI's usage field)
    cached = (want_chat.prompt_tokens - 1) // 16 * 16
    assert (chat.usage.prompt_tokens_details.cached_tokens, chunks[-1].usage.prompt_tokens_details.cached_tokens) == (0, cached) and cached > 0
    assert metrics(server)["tilework_prefix_cache_tokens_total"] >= cached

    done = client.completions.create(model=server.name, prompt=PROMPTS[0], max_tokens=4, temperature=0)
    assert done.choices[0].text == want_text.text and done.usage.completion_tokens == len(want_text.token_ids)
    streamed = list(client.completions.create(model=server.name, prompt=PROMPTS[0], max_tokens=4, temperature=0, stream=True))
    assert len(streamed) > 2 and "".join(c.choices[0].text for c in streamed) == want_text.text
    assert streamed[-1].choices[0].finish_reason == "length"
    ids = client.completions.create(model=server.name, prompt=ref.encode(PROMPTS[0]), max_tokens=4, temperature=0)
    assert ids.choices[0].text == want_text.text  # a prompt of token ids
    assert [m.id for m in client.models.list().data] == [server.name]


def test_log_probabilities_of_chat_and_completions_streamed_or_not_equal_generate(server: BackgroundServer, client: Any, ref: LLM) -> None:
    """``logprobs``: the tokens' log-probabilities and the most likely alternatives, as
    ``LLM.generate(logprobs=k)`` gives them, in OpenAI's two layouts, whole or chunk by chunk."""
    greedy = SamplingParams(temperature=0, max_tokens=6)
    question = "Name a color."
    want_chat = ref.generate(question, greedy, logprobs=3)[0].logprobs
    want_text = ref.generate(PROMPTS[1], greedy, chat=False, logprobs=2)[0].logprobs
    assert want_chat and want_text
    messages = [{"role": "user", "content": question}]
    chat = client.chat.completions.create(model=server.name, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    streamed = list(client.chat.completions.create(model=server.name, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, stream=True))
    for content in (chat.choices[0].logprobs.content, [c for chunk in streamed if chunk.choices and chunk.choices[0].logprobs for c in chunk.choices[0].logprobs.content]):
        assert [(c.token, c.logprob, c.bytes) for c in content] == [(e.text, e.logprob, list(e.text.encode())) for e in want_chat]
        assert [[(t.token, t.logprob) for t in c.top_logprobs] for c in content] == [[(t, lp) for _, t, lp in e.top] for e in want_chat]
    assert "".join(c.token for c in chat.choices[0].logprobs.content) == chat.choices[0].message.content
    plain = client.chat.completions.create(model=server.name, messages=messages, max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None
    # OpenAI's penalties, as the sampler applies them: greedy with a presence penalty changes the reply
    penalized = SamplingParams(temperature=0, max_tokens=12, presence_penalty=2.0, frequency_penalty=0.5)
    want = ref.generate(PROMPTS[2], penalized, chat=False)[0]
    assert want.token_ids != ref.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=12), chat=False)[0].token_ids
    got = client.completions.create(model=server.name, prompt=PROMPTS[2], max_tokens=12, temperature=0, presence_penalty=2.0, frequency_penalty=0.5)
    assert got.choices[0].text == want.text

    done = client.completions.create(model=server.name, prompt=PROMPTS[1], max_tokens=6, temperature=0, logprobs=2)
    lp = done.choices[0].logprobs
    assert lp.tokens == [e.text for e in want_text] and lp.token_logprobs == [e.logprob for e in want_text]
    assert lp.top_logprobs == [{t: p for _, t, p in e.top} for e in want_text]
    assert lp.text_offset == [len("".join(e.text for e in want_text[:i])) for i in range(len(want_text))]
    chunks = list(client.completions.create(model=server.name, prompt=PROMPTS[1], max_tokens=6, temperature=0, logprobs=2, stream=True))
    pieces = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
    assert [t for p in pieces for t in p.tokens] == lp.tokens and [o for p in pieces for o in p.text_offset] == lp.text_offset


def test_echo_gives_the_prompt_back_with_its_log_probabilities(server: BackgroundServer, client: Any, ref: LLM) -> None:
    """Completions' ``echo`` (what evaluation harnesses score a text with: ``echo``,
    ``logprobs``, ``max_tokens`` 1): the prompt's text and tokens before the completion's, the
    first token without a log-probability, the others' as ``LLM.score`` gives them."""
    text = "The capital of France is Paris, and the capital of Italy is Rome."
    ids = ref.encode(text, False)
    scores = ref.score(ids)
    want = [None] + [float(scores[i, t]) for i, t in enumerate(ids[1:])]
    for prompt in (text, ids):
        done = client.completions.create(model=server.name, prompt=prompt, max_tokens=1, temperature=0, logprobs=1, echo=True)
        lp = done.choices[0].logprobs
        assert done.choices[0].text.startswith(text) and len(lp.tokens) == len(ids) + 1
        assert "".join(lp.tokens) == done.choices[0].text and lp.tokens[: len(ids)] == [ref.tokenizer.decode(ids[:1])] + [
            ref.tokenizer.decode(ids[i : i + 2])[len(ref.tokenizer.decode(ids[i : i + 1])) :] for i in range(len(ids) - 1)]
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        np.testing.assert_allclose(lp.token_logprobs[1 : len(ids)], want[1:], rtol=0, atol=1e-4)
        assert all(len(top) == 1 for top in lp.top_logprobs[1:])
    streamed = list(client.completions.create(model=server.name, prompt=text, max_tokens=3, temperature=0, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in streamed).startswith(text) and streamed[0].choices[0].text == text


def test_n_completions_are_the_prompt_generated_n_times_with_seeds_in_turn(server: BackgroundServer, client: Any, ref: LLM) -> None:
    """``n``: choice ``i`` is what ``LLM.generate`` gives prompt ``i`` of a batch of the same
    prompt (seeded ``seed + i``), streamed or not; usage counts the prompt once, every choice's
    tokens."""
    params = SamplingParams(temperature=0.9, max_tokens=8, seed=11)
    question = "Tell me a word."
    want = ref.generate([question] * 3, params)
    assert len({w.text for w in want}) > 1  # the seeds differ
    messages = [{"role": "user", "content": question}]
    reply = client.chat.completions.create(model=server.name, messages=messages, max_tokens=8, temperature=0.9, seed=11, n=3)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [(c.message.content, c.finish_reason) for c in reply.choices] == [(w.text, w.finish_reason) for w in want]
    assert reply.usage.prompt_tokens == want[0].prompt_tokens and reply.usage.completion_tokens == sum(len(w.token_ids) for w in want)
    chunks = list(client.completions.create(model=server.name, prompt=PROMPTS[3], max_tokens=6, temperature=0.9, seed=11, n=2, stream=True,
                                            stream_options={"include_usage": True}))
    alone = ref.generate([PROMPTS[3]] * 2, SamplingParams(temperature=0.9, max_tokens=6, seed=11), chat=False)
    for i in range(2):
        assert "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) == alone[i].text
    assert chunks[-1].usage.completion_tokens == sum(len(a.token_ids) for a in alone)


def test_a_batch_of_prompts_gives_each_prompt_its_choices_in_order(server: BackgroundServer, client: Any, ref: LLM) -> None:
    """A completions ``prompt`` list (lm-evaluation-harness's batches): strings and token ids
    mixed; prompt ``p``'s completion ``i`` is choice ``p * n + i``, seeded ``seed + p * n + i``,
    so with ``n = 1`` the choices are ``LLM.generate``'s batch; streamed or not; usage counts
    every prompt once; echo gives each its own prompt; a bad prompt is named by its place."""
    params = SamplingParams(temperature=0.9, max_tokens=5, seed=3)
    want = ref.generate(PROMPTS[:3], params, chat=False)
    batch = [PROMPTS[0], ref.encode(PROMPTS[1]), PROMPTS[2]]
    done = client.completions.create(model=server.name, prompt=batch, max_tokens=5, temperature=0.9, seed=3)
    assert [(c.index, c.text, c.finish_reason) for c in done.choices] == [(i, w.text, w.finish_reason) for i, w in enumerate(want)]
    assert done.usage.prompt_tokens == sum(w.prompt_tokens for w in want)
    assert done.usage.completion_tokens == sum(len(w.token_ids) for w in want)
    # n = 2 of each of two prompts: choice 2 * p + i is prompt p generated with seed 3 + 2 * p + i
    chunks = list(client.completions.create(model=server.name, prompt=PROMPTS[2:4], max_tokens=4, temperature=0.9, seed=3, n=2, stream=True,
                                            stream_options={"include_usage": True}))
    four = SamplingParams(temperature=0.9, max_tokens=4, seed=3)
    alone = ref.generate([PROMPTS[2], PROMPTS[2], PROMPTS[3], PROMPTS[3]], four, chat=False)
    assert ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in range(4)] == [a.text for a in alone]
    assert chunks[-1].usage.prompt_tokens == alone[0].prompt_tokens + alone[2].prompt_tokens
    echoed = client.completions.create(model=server.name, prompt=PROMPTS[:2], max_tokens=1, temperature=0, echo=True, logprobs=0)
    assert [c.text.startswith(p) and c.logprobs.token_logprobs[0] is None for c, p in zip(echoed.choices, PROMPTS)] == [True, True]
    for prompt, where in (([PROMPTS[0], ""], "prompt[1] is empty"), ([PROMPTS[0], [1, "x"]], "prompt[1] must be"), ([PROMPTS[0], [1] * 8200], "prompt[1]: the prompt has 8200")):
        code, text = http(server, "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": 2}).encode())
        assert code == 400 and where in json.loads(text)["error"]["message"] and json.loads(text)["error"]["param"] == "prompt"


def test_response_format_json_object_and_json_schema(server: BackgroundServer, client: Any) -> None:
    """Structured output: OpenAI's ``response_format`` in chat and completions gives JSON that
    parses (and fits the schema); what does not compile, or another type, is a 400 naming it."""
    pytest.importorskip("llguidance")
    messages = [{"role": "user", "content": "Describe a dog in JSON."}]
    reply = client.chat.completions.create(model=server.name, messages=messages, max_tokens=96, seed=2, response_format={"type": "json_object"})
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:
        assert reply.choices[0].message.content.startswith("{")
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["color", "count"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}}
    for temperature in (0, 1):
        picked = client.chat.completions.create(model=server.name, messages=messages, max_tokens=40, temperature=temperature, seed=2, response_format=fmt)
        got = json.loads(picked.choices[0].message.content)
        assert picked.choices[0].finish_reason == "stop" and got["color"] in ("red", "green", "blue") and 1 <= got["count"] <= 9
    done = client.completions.create(model=server.name, prompt="A color as JSON:", max_tokens=40, seed=3, extra_body={"response_format": fmt})
    assert set(json.loads(done.choices[0].text)) == {"color", "count"}
    for bad, message in (({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}, "does not compile: Invalid type: objectx"),
                         ({"type": "json_schema"}, "response_format json_schema needs"), ({"type": "xml"}, 'type "xml" is not one of')):
        code, text = http(server, "/v1/chat/completions", json.dumps({"messages": messages, "response_format": bad}).encode())
        error = json.loads(text)["error"]
        assert code == 400 and message in error["message"] and error["param"] == "response_format", text


def test_tool_calls_required_or_named_streamed_or_not(server: BackgroundServer, client: Any, ref: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tools: ``tool_choice`` required or a named function makes the reply tool calls (a
    grammar of the tools' names and parameters: whatever SmolLM2 would say), in
    ``message.tool_calls`` or streamed ``tool_calls`` deltas, ``finish_reason`` "tool_calls";
    a history with a call and its result renders; auto is refused for a template without a
    tool-call format, and read from Hermes' ``<tool_call>`` where the template has it."""
    pytest.importorskip("llguidance")
    weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"],
        "additionalProperties": False}}}
    clock = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(model=server.name, messages=messages, tools=[weather, clock], tool_choice="required", max_tokens=80, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in ("get_weather", "get_time")
        args = json.loads(call.function.arguments)
        assert set(args) == ({"city", "unit"} if call.function.name == "get_weather" else set())
    named = {"type": "function", "function": {"name": "get_weather"}}
    chunks = list(client.chat.completions.create(model=server.name, messages=messages, tools=[weather, clock], tool_choice=named, max_tokens=80, seed=4, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and deltas[0].index == 0 and deltas[0].function.name == "get_weather"
    assert set(json.loads(deltas[0].function.arguments)) == {"city", "unit"} and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)
    history = messages + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}}]},
                          {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    answer = client.chat.completions.create(model=server.name, messages=history, tools=[weather], tool_choice="none", max_tokens=8, temperature=0)
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].finish_reason in ("stop", "length")
    for body, param, message in (({"messages": messages, "tools": [weather]}, "tool_choice", "tool_choice auto: this model's chat template has no tool-call format"),
                                 ({"prompt": "Hi", "tools": [weather]}, "tools", "tools is a field of /v1/chat/completions"),
                                 ({"messages": messages, "tools": [weather], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format", "give one")):
        code, text = http(server, "/v1/completions" if "prompt" in body else "/v1/chat/completions", json.dumps(body).encode())
        error = json.loads(text)["error"]
        assert code == 400 and error["param"] == param and message in error["message"], text
    # auto, where the template writes Hermes' format: the tools reach the prompt through the template
    from tilework.llm.chat import ChatTemplate
    from tilework.serve.protocol import parse_request

    hermes = "{% for t in tools %}<tools>{{ t.function.name }}</tools>{% endfor %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}(calls: <tool_call>{json}</tool_call>)\n"
    monkeypatch.setattr(ref, "template", ChatTemplate(hermes))
    parsed = parse_request(json.dumps({"messages": messages, "tools": [weather]}).encode(), "chat", ref, "m", 16)
    assert parsed.tools is not None and parsed.tools.choice == "auto" and parsed.params.grammar is None
    assert ref.tokenizer.decode(parsed.prompts[0].tokens).startswith("<tools>get_weather</tools>user: What is the weather in Paris?")


def test_logit_bias_min_tokens_and_ignore_eos(server: BackgroundServer, client: Any, ref: LLM) -> None:
    """OpenAI's ``logit_bias`` (token ids as strings): banning the greedy reply's first token
    changes the reply to what ``LLM.generate`` gives with the same bias; bad ones are 400s.
    ``ignore_eos`` and ``min_tokens`` (vLLM's) make a short reply run on."""
    greedy = SamplingParams(temperature=0, max_tokens=6)
    first = ref.generate(PROMPTS[0], greedy, chat=False)[0].token_ids[0]
    want = ref.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, logit_bias={first: -100}), chat=False)[0]
    assert want.token_ids[0] != first
    got = client.completions.create(model=server.name, prompt=PROMPTS[0], max_tokens=6, temperature=0, logit_bias={str(first): -100})
    assert got.choices[0].text == want.text
    # ignore_eos / min_tokens: a reply that would end early runs to max_tokens / at least min_tokens
    messages = [{"role": "user", "content": "Say hi."}]
    short = client.chat.completions.create(model=server.name, messages=messages, max_tokens=48, temperature=0)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 40
    full = client.chat.completions.create(model=server.name, messages=messages, max_tokens=48, temperature=0, extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 48
    longer = client.chat.completions.create(model=server.name, messages=messages, max_tokens=48, temperature=0, extra_body={"min_tokens": 40})
    assert longer.usage.completion_tokens >= 40 and longer.choices[0].message.content.startswith(short.choices[0].message.content)
    for bias, message in (({"x": 1}, 'keys are token ids, got "x"'), ({"5": 101}, "logit_bias[5]=101 must be a number in [-100, 100]"),
                          ({"99999999": 1}, "token id 99999999 is outside the vocabulary of 49152 tokens"), ([1], "logit_bias must be an object")):
        code, text = http(server, "/v1/completions", json.dumps({"prompt": "Hi", "logit_bias": bias}).encode())
        error = json.loads(text)["error"]
        assert code == 400 and error["param"] == "logit_bias" and message in error["message"], text


def test_tokenize_and_detokenize(server: BackgroundServer, ref: LLM) -> None:
    """``/tokenize`` gives the ids a completion (``prompt``) or a chat (``messages``) request
    feeds; ``/detokenize`` the text of ids; bad bodies are 400s naming the field."""
    code, text = http(server, "/tokenize", json.dumps({"prompt": PROMPTS[0]}).encode())
    assert code == 200 and json.loads(text) == {"count": len(ref.encode(PROMPTS[0])), "max_model_len": ref.config.context_length, "tokens": ref.encode(PROMPTS[0])}
    messages = [{"role": "user", "content": "Name a color."}]
    code, text = http(server, "/tokenize", json.dumps({"messages": messages}).encode())
    assert code == 200 and json.loads(text)["tokens"] == ref.encode(ref.prompt_text("Name a color."))
    code, text = http(server, "/tokenize", json.dumps({"messages": messages, "add_generation_prompt": False}).encode())
    assert code == 200 and ref.tokenizer.decode(json.loads(text)["tokens"]).rstrip().endswith("Name a color.<|im_end|>")
    code, text = http(server, "/detokenize", json.dumps({"tokens": ref.encode(PROMPTS[3])}).encode())
    assert code == 200 and json.loads(text) == {"prompt": ref.tokenizer.decode(ref.encode(PROMPTS[3]))}
    for path, body, param in (("/tokenize", {"prompt": ""}, "prompt"), ("/tokenize", {"prompt": "x", "model": "gpt-4"}, "model"),
                              ("/detokenize", {"tokens": [1, 99999999]}, "tokens"), ("/detokenize", {"tokens": "12"}, "tokens")):
        code, text = http(server, path, json.dumps(body).encode())
        assert code in (400, 404) and json.loads(text)["error"]["param"] == param, text


def test_a_model_is_retrieved_by_its_id(server: BackgroundServer, client: Any) -> None:
    """``GET /v1/models/{id}`` (the openai client's ``models.retrieve``): the card of the list, or
    OpenAI's 404 for another id."""
    assert client.models.retrieve(server.name).model_dump() == client.models.list().data[0].model_dump()
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    code, text = http(server, "/v1/models/org/gpt-4")
    assert code == 404 and json.loads(text)["error"] == {"message": f"the model 'org/gpt-4' does not exist: this server has {server.name!r}",
                                                          "type": "invalid_request_error", "param": "model", "code": "model_not_found"}


def test_16_concurrent_clients_get_the_tokens_they_get_alone(server: BackgroundServer, client: Any, ref: LLM) -> None:
    """Requests 0-7 greedy, 8-15 sampled with seed 100 + i; half streamed. The references are
    ``LLM.generate`` on the same prompts (tests/llm/test_engine.py shows a batch there decodes
    like each prompt alone; its i-th sequence draws with seed + i)."""
    n, sampled = 16, SamplingParams(temperature=0.9, top_p=0.95, max_tokens=6, seed=108)
    greedy = ref.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6), chat=False)
    seeded = ref.generate([PROMPTS[i % 4] for i in range(8, n)], sampled, chat=False)
    want = [greedy[i % 4] for i in range(8)] + seeded

    def ask(i: int) -> tuple[str, int, str]:
        kw: dict[str, Any] = dict(model=server.name, prompt=PROMPTS[i % 4], max_tokens=6)
        kw.update(temperature=0) if i < 8 else kw.update(temperature=0.9, top_p=0.95, seed=100 + i)
        if i % 2:
            r = client.completions.create(**kw)
            return r.choices[0].text, r.usage.completion_tokens, r.choices[0].finish_reason
        chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
        return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage.completion_tokens, chunks[-2].choices[0].finish_reason

    before = metrics(server)["tilework_decode_steps_total"]
    with ThreadPoolExecutor(n) as pool:
        got = list(pool.map(ask, range(n)))
    assert got == [(w.text, len(w.token_ids), w.finish_reason) for w in want]
    assert [ask(i) for i in (2, 9)] == [got[2], got[9]]  # and through the server alone
    assert metrics(server)["tilework_decode_steps_total"] - before < sum(len(w.token_ids) for w in want) / 2  # batched


def test_clients_that_disconnect_mid_stream_leave_no_pages(server: BackgroundServer, client: Any, ref: LLM) -> None:
    rng = random.Random(7)
    # the requests that stay finish as the engine's greedy 8 tokens of their prompts do
    stays = [g.finish_reason for g in ref.generate([PROMPTS[i % 4] for i in range(10, 14)], SamplingParams(temperature=0, max_tokens=8), chat=False)]
    before = metrics(server)

    def leave(i: int) -> str | None:  # prompts whose greedy answers run past 20 tokens: every leaver leaves
        stream = client.completions.create(model=server.name, prompt=PROMPTS[i % 3], max_tokens=60, temperature=0, stream=True)
        for k, _ in enumerate(stream):
            if k >= rng.randint(0, 4):
                break
        stream.close()
        return None

    def stay(i: int) -> str | None:
        r = client.completions.create(model=server.name, prompt=PROMPTS[i % 4], max_tokens=8, temperature=0)
        return r.choices[0].finish_reason

    def give_up(_i: int) -> str | None:  # a plain request whose client times out
        # greedy: the count runs on past 1000 tokens (seconds); a sampled answer could end early
        try:
            http(server, "/v1/completions", json.dumps({"prompt": "1, 2, 3,", "max_tokens": 1000, "temperature": 0}).encode(), timeout=0.5)
        except (TimeoutError, urllib.error.URLError):
            return None
        return "finished"

    jobs = [leave] * 10 + [stay] * 4 + [give_up]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outcomes = list(pool.map(lambda ij: ij[1](ij[0]), enumerate(jobs)))
    assert outcomes == [None] * 10 + stays + [None]
    deadline = time.monotonic() + 60
    while (m := metrics(server))["tilework_running_sequences"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert m["tilework_running_sequences"] == m["tilework_queue_depth"] == 0
    assert m["tilework_kv_pages_used"] == m["tilework_kv_pages_reserved"] == 0
    assert m['tilework_requests_finished_total{reason="cancelled"}'] - before.get('tilework_requests_finished_total{reason="cancelled"}', 0) == 11
    gone = 'tilework_http_requests_total{endpoint="/v1/completions",status="499"}'
    assert m[gone] - before.get(gone, 0) == 1  # the plain request whose client left: not a 200
    assert http(server, "/health") == (200, '{"status":"ok"}')


def sse(text: str) -> list[Any]:
    """The events of a server-sent event stream, ``[DONE]`` as a string."""
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_a_request_that_fails_inside_the_server_gets_a_clean_500_and_the_others_go_on(
        server: BackgroundServer, client: Any, ref: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampling raises for the requests with seed 666 (as a tiny temperature made the sampler
    do), and parsing raises for the prompt "boom": each of those gets OpenAI's error body with
    500 and no Python text, while a stream running beside them gets all its tokens."""
    add, parse = Completion.add, app_module.parse_request

    def failing_add(self: Completion, logits: Any, room: bool = True) -> str:
        if self.params.seed == 666:
            raise IndexError("index -1 is out of bounds for axis 0 with size 0")
        return add(self, logits, room)

    def failing_parse(raw: bytes, *args: Any, **kw: Any) -> Any:
        if b'"boom"' in raw:
            raise RuntimeError("secret internals")
        return parse(raw, *args, **kw)

    monkeypatch.setattr(Completion, "add", failing_add)
    monkeypatch.setattr(app_module, "parse_request", failing_parse)
    want = ref.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=24), chat=False)[0]
    clean = {"error": {"message": INTERNAL_ERROR, "type": "server_error", "param": None, "code": None}}
    bad = {"prompt": "Hi", "max_tokens": 8, "temperature": 0.5, "seed": 666}
    before = metrics(server)
    stream = client.completions.create(model=server.name, prompt=PROMPTS[1], max_tokens=24, temperature=0, stream=True)
    pieces = [next(stream).choices[0].text]  # running
    code, text = http(server, "/v1/completions", json.dumps(bad).encode())
    assert (code, json.loads(text)) == (500, clean)
    code, text = http(server, "/v1/completions", json.dumps({**bad, "stream": True}).encode())
    assert code == 200 and sse(text) == [clean, "[DONE]"]
    code, text = http(server, "/v1/completions", json.dumps({"prompt": "boom"}).encode())
    assert (code, json.loads(text)) == (500, clean)
    pieces += [c.choices[0].text for c in stream]
    assert "".join(pieces) == want.text
    assert http(server, "/health") == (200, '{"status":"ok"}') and server.scheduler.alive
    again = client.completions.create(model=server.name, prompt=PROMPTS[1], max_tokens=24, temperature=0)
    assert again.choices[0].text == want.text
    # each request counted once, with the status its client got (the failing stream's is 200)
    after = metrics(server)
    count = [after.get(k, 0) - before.get(k, 0) for k in (f'tilework_http_requests_total{{endpoint="/v1/completions",status="{s}"}}' for s in (200, 500))]
    assert count == [3, 2]


def test_a_client_gone_while_sending_its_body_is_a_499(server: BackgroundServer) -> None:
    """Starlette raises ClientDisconnect from ``request.body()``: counted as 499, not a 500."""
    app = server.server.config.app
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", server.port)}
    key = 'tilework_http_requests_total{endpoint="/v1/completions",status="499"}'
    before = metrics(server).get(key, 0)
    asyncio.run(app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    assert metrics(server)[key] - before == 1


def test_an_empty_name_is_refused() -> None:
    with pytest.raises(TileworkError, match="the model's name must not be empty, got ''"):
        BackgroundServer(None, name="")


def test_the_default_max_tokens_is_capped_by_the_kv_pool() -> None:
    """48 tokens of KV cache (3 pages) and a default of 1000: a request that gives no max_tokens
    gets the 40 tokens left after its 8-token prompt, not a refusal over max_tokens=1000; one
    that asks for more is told the most that fits, and a prompt that fills the pool is refused
    over the prompt."""
    with BackgroundServer(LLM(precision="q", kv_tokens=48), default_max_tokens=1000) as small:
        code, text = http(small, "/v1/completions", json.dumps({"prompt": "1, 2, 3,", "temperature": 0}).encode())
        assert code == 200, text
        reply = json.loads(text)
        assert (reply["usage"]["prompt_tokens"], reply["usage"]["completion_tokens"], reply["choices"][0]["finish_reason"]) == (8, 40, "length")
        code, text = http(small, "/v1/completions", json.dumps({"prompt": "1, 2, 3,", "max_tokens": 41}).encode())
        assert code == 400 and "at most max_tokens=40 for this prompt" in json.loads(text)["error"]["message"]
        code, text = http(small, "/v1/completions", json.dumps({"prompt": list(range(1, 49))}).encode())
        error = json.loads(text)["error"]
        assert code == 400 and error["param"] == "prompt", error
        assert error["message"] == "the prompt has 48 tokens; the server's KV cache holds at most 48 tokens for a sequence (3 pages of 16; prompt and completion)"


BAD = [
    (b"{not json", 400, None, "not valid JSON"),
    (b"[1, 2]", 400, None, "must be a JSON object"),
    (b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400, None, "nests arrays or objects too deeply"),
    (b'{"max_tokens": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400, None, "nests arrays or objects too deeply"),
    (b'{"prompt": "hi", "stop": ' + b'{"a":' * 100000 + b"1" + b"}" * 100000 + b"}", 400, None, "nests arrays or objects too deeply"),
    (json.dumps({"model": "gpt-4", "prompt": "hi"}), 404, "model", "does not exist"),
    (json.dumps({"prompt": "hi " * 9000}), 400, "prompt", "the model's context is 8192"),
    (json.dumps({"prompt": "hi", "max_tokens": 9000}), 400, "max_tokens", "exceed the model's context"),
    (json.dumps({"prompt": "hi", "max_tokens": 5000}), 400, "max_tokens", "KV-cache pages"),
    (json.dumps({"prompt": "hi", "max_tokens": 0}), 400, "max_tokens", "max_tokens=0"),
    (json.dumps({"prompt": "hi", "max_tokens": "ten"}), 400, "max_tokens", "must be an integer"),
    (json.dumps({"prompt": "hi", "temperature": -1}), 400, "temperature", "in \\[0, 2\\]"),
    (json.dumps({"prompt": "hi", "temperature": True}), 400, "temperature", "must be a number"),
    (json.dumps({"prompt": "hi", "top_p": 0}), 400, "top_p", "top_p=0"),
    (json.dumps({"prompt": "hi", "top_k": -3}), 400, "top_k", "top_k=-3"),
    (json.dumps({"prompt": "hi", "seed": -1}), 400, "seed", "seed=-1"),
    (json.dumps({"prompt": "hi", "stop": 5}), 400, "stop", "stop must be"),
    (json.dumps({"prompt": "hi", "stop": [""]}), 400, "stop", "non-empty strings"),
    (json.dumps({"prompt": "hi", "n": 17}), 400, "n", r"n=17 must be in \[1, 16\]"),
    (json.dumps({"prompt": "hi", "n": 2, "best_of": 3}), 400, "best_of", "best_of must equal n"),
    (json.dumps({"prompt": "hi", "n": 16, "max_tokens": 1000}), 400, "n", "need 1008; the server has 256"),
    (json.dumps({"prompt": "hi", "logprobs": 21}), 400, "logprobs", r"logprobs=21 must be in \[0, 20\]"),
    (json.dumps({"prompt": "hi", "logprobs": True}), 400, "logprobs", "must be an integer"),
    (json.dumps({"prompt": "hi", "echo": "yes"}), 400, "echo", "true or false"),
    (json.dumps({"prompt": "hi", "presence_penalty": 2.5}), 400, "presence_penalty", r"must be a number in \[-2, 2\]"),
    (json.dumps({"prompt": "hi", "frequency_penalty": "1"}), 400, "frequency_penalty", "must be a number"),
    (json.dumps({"prompt": ""}), 400, "prompt", "prompt is empty"),
    (json.dumps({"prompt": [1, 999999]}), 400, "prompt", "outside the vocabulary"),
    (json.dumps({"max_tokens": 3}), 400, "prompt", "prompt is required"),
    (json.dumps({"prompt": "caf\ud800", "max_tokens": 3}), 400, "prompt", r"prompt holds a lone UTF-16 surrogate \(\\ud800 at character 3\)"),
    (json.dumps({"prompt": ["caf\ud800"]}), 400, "prompt", "lone UTF-16 surrogate"),
    (json.dumps({"prompt": "hi", "stop": ["a", "\udfff"]}), 400, "stop", r"stop\[1\] holds a lone UTF-16 surrogate"),
    (b'{"prompt": "hi", "seed": ' + b"7" * 5000 + b"}", 400, None, "holds a number too long to read"),
    (json.dumps({"prompt": "hi", "logit_bias": {"1" * 5000: 1}}), 400, "logit_bias", "keys are token ids"),
    (json.dumps({"prompt": ["hi", ["x"]]}), 400, "prompt", r"prompt\[1\] must be a string or a list of token ids"),
    (json.dumps({"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "("}}}}), 400,
     "response_format", "does not compile"),
]
BAD_CHAT = [
    (json.dumps({"messages": []}), 400, "messages", "non-empty list"),
    (json.dumps({"messages": [{"content": "hi"}]}), 400, "messages", "string role"),
    (json.dumps({"messages": [{"role": "asistant", "content": "hi"}]}), 400, "messages", "'asistant' is not one of system"),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), 400, "messages", "only text parts"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}), 400, "stream", "true or false"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}), 400, "top_logprobs", "needs logprobs: true"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "echo": True}), 400, "echo", "a field of /v1/completions"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": -1}), 400, "top_logprobs", "must be in"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}), 400, "logprobs", "true or false"),
    (json.dumps({"messages": [{"role": "user", "content": "hi \udfff"}], "max_tokens": 3}), 400, "messages",
     r"messages\[0\]\.content holds a lone UTF-16 surrogate \(\\udfff"),
    (json.dumps({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}),
     400, "messages", r"messages\[1\]\.content holds a lone"),
    (json.dumps({"messages": [{"role": "assistant", "content": None, "tool_calls": "call it"}, {"role": "user", "content": "hi"}]}), 400, "messages",
     r"messages\[0\]\.tool_calls must be a list"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/x"}}}],
                 "tool_choice": "required"}), 400, "tools", "does not compile"),
]


@pytest.mark.parametrize("path, body, status, param, message", [("/v1/completions", *b) for b in BAD] + [("/v1/chat/completions", *b) for b in BAD_CHAT])
def test_bad_requests_get_openai_errors(server: BackgroundServer, path: str, body: str | bytes, status: int, param: str | None, message: str) -> None:
    code, text = http(server, path, body if isinstance(body, bytes) else body.encode())
    error = json.loads(text)["error"]
    assert code == status and error["param"] == param and error["type"] == "invalid_request_error"
    assert re.search(message, error["message"]), error["message"]


def test_unknown_routes_and_methods_and_the_client_errors(server: BackgroundServer, client: Any) -> None:
    assert http(server, "/v1/nothing")[0] == 404 and json.loads(http(server, "/v1/nothing")[1])["error"]["message"] == "Not Found"
    assert http(server, "/v1/completions", method="GET")[0] == 405
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=server.name, messages=[{"role": "user", "content": "hi"}], temperature=5)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="hi")
    m = metrics(server)
    assert m['tilework_http_requests_total{endpoint="/v1/chat/completions",status="400"}'] >= 1
    assert http(server, "/health") == (200, '{"status":"ok"}')

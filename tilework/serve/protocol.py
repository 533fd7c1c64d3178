"""OpenAI request bodies in, tilework requests out; and the response and error bodies.

``parse_request(body, kind, ...)`` reads a ``/v1/completions`` (``kind="completion"``) or
``/v1/chat/completions`` (``kind="chat"``) body and gives the prompt's token ids and the
``SamplingParams``, or raises ``RequestError`` naming the field at fault. Supported fields:
``model`` (optional; another name than the served model is a 404), ``prompt`` (a string, token
ids, or a batch: a list of up to ``MAX_PROMPTS`` strings or lists of ids, each a prompt of its
own) or ``messages`` (rendered through the model's chat template), ``max_tokens``
(``max_completion_tokens`` for chat), ``temperature``
(0..2), ``top_p``, ``seed``, ``stop`` (a string or a list), ``presence_penalty`` and
``frequency_penalty`` (-2..2), ``stream``, ``stream_options.include_usage``, ``n`` (1..16
completions of the prompt; ``best_of`` only equal to it), the extensions ``top_k`` and
``repetition_penalty`` (as vLLM and llama.cpp take them), the generated tokens'
log-probabilities (chat's ``logprobs: true`` with ``top_logprobs`` 0..20, completions'
``logprobs`` 0..20; ``Parsed.logprobs``: how many alternatives, None when not asked; the bodies:
:func:`logprobs_body`), and completions' ``echo`` (the prompt given back before each
completion, with its tokens' log-probabilities when ``logprobs`` asks), and structured output:
``response_format`` ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema":
{"schema": ...}}`` (``tilework.llm.grammar``; in chat and completions), chat's ``tools``,
``tool_choice`` and ``parallel_tool_calls`` (``tilework.serve.tools``; ``Parsed.tools``),
OpenAI's ``logit_bias`` (token ids -> -100..100, added to the logits), and vLLM's and
llama.cpp's ``min_tokens`` and ``ignore_eos``. Fields the server cannot honour (``suffix``,
``functions``) are refused with a 400 rather than ignored; other unknown fields are ignored, as
OpenAI's server does with fields it does not know. :func:`parse_tokenize` and
:func:`parse_detokenize` read the bodies of ``/tokenize`` and ``/detokenize``.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from tilework.errors import TileworkError
from tilework.llm.completion import MAX_TOP_LOGPROBS, TokenLogprob
from tilework.llm.grammar import Constraint, Grammar, GrammarError
from tilework.llm.sampling import SamplingParams, SamplingParamsError
from tilework.llm.tokenizer import lone_surrogate
from tilework.serve.scheduler import RequestError
from tilework.serve.tools import ToolSpec, parse_tools

__all__ = ["Parsed", "Prompt", "Choice", "parse_request", "parse_tokenize", "parse_detokenize", "error_body", "completion_body", "chunk_body", "logprobs_body", "new_id"]

MAX_STOP = 16
MAX_N = 16  # completions of one request (each a sequence of the decode batch)
MAX_PROMPTS = 256  # prompts of one completions request (a batch: its sequences queue like requests)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt of a request: its token ids, and its text when it came as text."""

    tokens: list[int]
    text: str | None = None


@dataclass(frozen=True, slots=True)
class Parsed:
    prompts: list[Prompt]  # one, or a completions request's batch
    params: SamplingParams
    stream: bool
    include_usage: bool
    logprobs: int | None = None  # alternatives a token (0..20); None: no log-probabilities
    n: int = 1  # completions (choices) of each prompt
    echo: bool = False  # completions' echo: the prompt given back before the completion
    tools: ToolSpec | None = None  # chat's tools and tool_choice (tilework.serve.tools)

    @property
    def choices(self) -> int:
        """The response's choices: ``n`` of each prompt, prompt by prompt."""
        return len(self.prompts) * self.n


def _field(body: dict[str, Any], name: str, kinds: tuple[type, ...], what: str, default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise RequestError(f"{name} must be {what}, got {json.dumps(value)[:80]}", name)
    return value


def _text(text: str, where: str, param: str) -> str:
    """``text``, if it is Unicode that UTF-8 can carry: JSON's ``\\ud800`` escapes give lone
    surrogates, which no tokenizer takes (``tokenizer.lone_surrogate``)."""
    at = lone_surrogate(text)
    if at is not None:
        raise RequestError(f"{where} holds a lone UTF-16 surrogate (\\u{ord(text[at]):04x} at character {at}): it is not valid Unicode text", param)
    return text


def _encode(llm: Any, text: str, param: str) -> list[int]:
    try:
        return list(llm.encode(text, True))
    except TileworkError as exc:
        raise RequestError(f"{param}: {exc}", param) from None


def _unsupported(body: dict[str, Any], kind: str) -> None:
    refused = {
        "suffix": lambda v: v not in (None, ""),
        "functions": lambda v: v not in (None, []),  # (the API's old form of tools)
    }
    for name, bad in refused.items():
        if name in body and bad(body[name]):
            raise RequestError(f"{name}={json.dumps(body[name])[:80]} is not supported by this server", name)
    if body.get("echo") not in (None, False) and kind == "chat":
        raise RequestError("echo is a field of /v1/completions, not of chat", "echo")
    if body.get("tools") not in (None, []) and kind != "chat":
        raise RequestError("tools is a field of /v1/chat/completions, not of completions", "tools")


def _choices(body: dict[str, Any]) -> int:
    """``n``, the completions of the prompt (``best_of`` may only say the same)."""
    n = _field(body, "n", (int,), "an integer", 1)
    if not 1 <= n <= MAX_N:
        raise RequestError(f"n={n} must be in [1, {MAX_N}]", "n")
    best_of = _field(body, "best_of", (int,), "an integer", n)
    if best_of != n:
        raise RequestError(f"best_of={best_of}: this server returns every completion it makes (best_of must equal n, {n})", "best_of")
    return int(n)


def _prompts(body: dict[str, Any], llm: Any) -> list[Prompt]:
    """A completion request's prompts: one (a string or token ids), or a batch (a list of
    strings or of lists of ids), each named by its place in errors (``prompt[2]``)."""
    prompt = body.get("prompt")
    if prompt is None:
        raise RequestError("prompt is required", "prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise RequestError(f"prompt is a batch of {len(prompt)} prompts; at most {MAX_PROMPTS} a request", "prompt")
        return [_prompt(p, llm, f"prompt[{i}]") for i, p in enumerate(prompt)]
    return [_prompt(prompt, llm, "prompt")]


def _prompt(prompt: Any, llm: Any, where: str) -> Prompt:
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError(f"{where} is empty", "prompt")
        return Prompt(_encode(llm, _text(prompt, where, "prompt"), "prompt"), prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return Prompt(list(prompt))
    if prompt == []:
        raise RequestError(f"{where} is empty", "prompt")
    raise RequestError(f"{where} must be a string or a list of token ids (or prompt a list of them: a batch)", "prompt")


def _content(message: dict[str, Any], i: int) -> str | None:
    content = message.get("content")
    if content is None:
        return content
    if isinstance(content, str):
        return _text(content, f"messages[{i}].content", "messages")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise RequestError(f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported", "messages")
            parts.append(_text(part["text"], f"messages[{i}].content", "messages"))
        return "".join(parts)
    raise RequestError(f"messages[{i}].content must be a string or a list of text parts", "messages")


ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # the OpenAI API's message roles


def _tool_calls(m: dict[str, Any], i: int) -> list[dict[str, Any]] | None:
    """An assistant message's ``tool_calls`` for the template, each call's ``arguments`` as an
    object where its JSON text parses (templates write them with ``tojson``)."""
    calls = m.get("tool_calls")
    if calls in (None, []):
        return None
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls):
        raise RequestError(f"messages[{i}].tool_calls must be a list of {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}", "messages")
    out = []
    for c in calls:
        fn = dict(c["function"])
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"])
            except json.JSONDecodeError:
                pass
        out.append({**c, "function": fn})
    return out


def _chat_tokens(body: dict[str, Any], llm: Any, tools: ToolSpec | None = None, add_generation_prompt: bool = True) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
    if llm.template is None:
        raise RequestError("the model has no chat template: use /v1/completions", "messages")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string role", "messages")
        if m["role"] not in ROLES:
            raise RequestError(f"messages[{i}].role {m['role']!r} is not one of {', '.join(ROLES)}", "messages")
        content = _content(m, i)
        if content is None and m["role"] != "assistant":
            raise RequestError(f"messages[{i}] ({m['role']}) has no content", "messages")
        message: dict[str, Any] = {"role": m["role"], "content": content or ""}
        calls = _tool_calls(m, i) if m["role"] == "assistant" else None
        if calls:
            message["tool_calls"] = calls
        for key in ("tool_call_id", "name"):  # a tool result's
            if isinstance(m.get(key), str):
                message[key] = m[key]
        plain.append(message)
    try:
        text = llm.template.render(plain, add_generation_prompt=add_generation_prompt, tools=tools.tools if tools is not None else None)
    except TileworkError as exc:
        raise RequestError(f"messages: {exc}", "messages") from exc
    return _encode(llm, text, "messages")


def parse_request(raw: bytes, kind: str, llm: Any, model_name: str, default_max_tokens: int, max_sequence: int | None = None) -> Parsed:
    """See the module docstring; ``default_max_tokens`` applies when the body gives none, capped
    by the room left after the prompt in ``max_sequence`` tokens (``Scheduler.max_sequence``: the
    context, or what the KV pool holds for one sequence; default the context), so a client is
    never refused over a value it did not send."""
    try:
        return _parse(raw, kind, llm, model_name, default_max_tokens, max_sequence)
    except RecursionError:  # json's reader (or writer, quoting a value) on arrays within arrays 100000 deep
        raise RequestError("the request body nests arrays or objects too deeply to be read") from None


def _body(raw: bytes, model_name: str) -> dict[str, Any]:
    """A request's JSON object, its ``model`` (if given) the served one."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise RequestError(f"the request body holds a number too long to read: {exc}") from None
    except RecursionError:  # json's reader on arrays within arrays 100000 deep
        raise RequestError("the request body nests arrays or objects too deeply to be read") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = _field(body, "model", (str,), "a string", model_name)
    if model != model_name:
        raise RequestError(f"the model {model!r} does not exist: this server has {model_name!r}", "model", status=404, code="model_not_found")
    return body


def parse_tokenize(raw: bytes, llm: Any, model_name: str) -> list[int]:
    """``POST /tokenize`` (vLLM's and llama.cpp's): the ids of ``prompt`` (a string) as a
    completion's prompt would be fed, or of ``messages`` through the chat template (with the
    assistant's opening, as a chat request's, unless ``add_generation_prompt`` is false)."""
    body = _body(raw, model_name)
    if body.get("messages") is not None:
        return _chat_tokens(body, llm, add_generation_prompt=_field(body, "add_generation_prompt", (bool,), "true or false", True))
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("prompt must be a non-empty string (or give messages)", "prompt")
    return _prompt(prompt, llm, "prompt").tokens


def parse_detokenize(raw: bytes, llm: Any, model_name: str) -> str:
    """``POST /detokenize``: the text of ``tokens`` (ids of the vocabulary)."""
    tokens = _body(raw, model_name).get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise RequestError("tokens must be a list of token ids", "tokens")
    bad = next((t for t in tokens if not 0 <= t < llm.config.vocab), None)
    if bad is not None:
        raise RequestError(f"token id {bad} is outside the vocabulary of {llm.config.vocab} tokens", "tokens")
    return str(llm.tokenizer.decode(tokens))


def _parse(raw: bytes, kind: str, llm: Any, model_name: str, default_max_tokens: int, max_sequence: int | None) -> Parsed:
    body = _body(raw, model_name)
    _unsupported(body, kind)
    n = _choices(body)
    stream = _field(body, "stream", (bool,), "true or false", False)
    options = _field(body, "stream_options", (dict,), "an object", {})
    include_usage = options.get("include_usage", False) is True
    max_name = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _field(body, max_name, (int,), "an integer >= 1")
    temperature = _field(body, "temperature", (int, float), "a number in [0, 2]", 1.0)
    if not (math.isfinite(temperature) and 0 <= temperature <= 2):
        raise RequestError(f"temperature={temperature} must be in [0, 2]", "temperature")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, (str, list)):
        raise RequestError("stop must be a string or a list of strings", "stop")
    if isinstance(stop, list) and len(stop) > MAX_STOP:
        raise RequestError(f"stop has {len(stop)} strings; at most {MAX_STOP}", "stop")
    for i, text in enumerate([stop] if isinstance(stop, str) else stop or ()):
        if isinstance(text, str):
            _text(text, "stop" if isinstance(stop, str) else f"stop[{i}]", "stop")
    logprobs = _logprobs(body, kind)
    tools = parse_tools(body, llm.template.source) if kind == "chat" and llm.template is not None else None  # (no template: _chat_tokens says so)
    prompts = [Prompt(_chat_tokens(body, llm, tools))] if kind == "chat" else _prompts(body, llm)
    if max_tokens is None:
        room = (llm.config.context_length if max_sequence is None else max_sequence) - max(len(p.tokens) for p in prompts)
        max_tokens = max(1, min(default_max_tokens, room))  # no room: the scheduler refuses the prompt
    try:
        params = SamplingParams(
            temperature=float(temperature),
            top_k=_field(body, "top_k", (int,), "an integer >= 0 (0: off)", 0),
            top_p=_field(body, "top_p", (int, float), "a number in (0, 1]", 1.0),
            repetition_penalty=_field(body, "repetition_penalty", (int, float), "a number > 0", 1.0),
            presence_penalty=_field(body, "presence_penalty", (int, float), "a number in [-2, 2]", 0.0),
            frequency_penalty=_field(body, "frequency_penalty", (int, float), "a number in [-2, 2]", 0.0),
            max_tokens=max_tokens,
            stop=() if stop is None else stop,
            seed=_field(body, "seed", (int,), "an integer >= 0"),
            grammar=_grammar(body, tools),
            logit_bias=_logit_bias(body, llm.config.vocab),
            min_tokens=_field(body, "min_tokens", (int,), "an integer >= 0", 0),
            ignore_eos=_field(body, "ignore_eos", (bool,), "true or false", False),
        )
    except SamplingParamsError as exc:
        raise RequestError(str(exc), max_name if exc.field == "max_tokens" else exc.field) from None
    if params.grammar is not None:  # the grammar against the model's tokenizer: a failure is this request's 400, naming its field
        field = "tools" if tools is not None and params.grammar is tools.grammar else "response_format"
        try:
            Constraint(params.grammar, llm.tokenizer, llm.config.vocab, llm.eos)
        except GrammarError as exc:
            raise RequestError(f"{field}: {exc}", field) from None
    echo = _field(body, "echo", (bool,), "true or false", False)
    return Parsed(prompts, params, stream, include_usage, logprobs, n, echo, tools if tools is not None and tools.choice != "none" else None)


def _logit_bias(body: dict[str, Any], vocab: int) -> dict[int, float]:
    """OpenAI's ``logit_bias``: token ids (as JSON object keys, so strings of digits) of the
    model's vocabulary -> biases."""
    bias = _field(body, "logit_bias", (dict,), 'an object of token id -> bias, such as {"50256": -100}', {})
    out = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isdigit() and key.isascii() and len(key) <= 18):
            raise RequestError(f"logit_bias keys are token ids, got {json.dumps(key)[:40]}", "logit_bias")
        if int(key) >= vocab:
            raise RequestError(f"logit_bias: token id {key[:40]} is outside the vocabulary of {vocab} tokens", "logit_bias")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not -100 <= value <= 100:
            raise RequestError(f"logit_bias[{key}]={json.dumps(value)[:40]} must be a number in [-100, 100]", "logit_bias")
        out[int(key)] = float(value)
    return out


def _grammar(body: dict[str, Any], tools: ToolSpec | None) -> Grammar | None:
    """The reply's grammar: ``response_format``'s, or required tool calls' (not both)."""
    fmt = _response_format(body)
    if tools is None or tools.grammar is None:
        return fmt
    if fmt is not None:
        raise RequestError("response_format and tool_choice required (or a named function) both shape the reply: give one", "response_format")
    return tools.grammar


def _response_format(body: dict[str, Any]) -> Grammar | None:
    """The grammar of ``response_format``: None for text (or none given), any JSON object for
    ``json_object``, a value that fits ``json_schema.schema`` for ``json_schema``."""
    fmt = _field(body, "response_format", (dict,), 'an object such as {"type": "json_object"}')
    kind = None if fmt is None else fmt.get("type")
    try:
        if kind in (None, "text"):
            return None
        if kind == "json_object":
            return Grammar.json()
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise RequestError('response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}', "response_format")
            return Grammar.json_schema(spec["schema"])
    except GrammarError as exc:
        raise RequestError(f"response_format: {exc}", "response_format") from None
    raise RequestError(f"response_format type {json.dumps(kind)[:40]} is not one of text, json_object, json_schema", "response_format")


def _logprobs(body: dict[str, Any], kind: str) -> int | None:
    """How many alternatives a generated token's log-probability comes with (None: none asked):
    chat's ``logprobs`` (true or false) and ``top_logprobs``, completions' ``logprobs`` (an int)."""
    what = f"an integer in [0, {MAX_TOP_LOGPROBS}]"
    if kind == "chat":
        wanted = _field(body, "logprobs", (bool,), "true or false", False)
        top = _field(body, "top_logprobs", (int,), what)
        if top is not None and not wanted:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        name, count = "top_logprobs", (top or 0) if wanted else None
    else:
        name, count = "logprobs", _field(body, "logprobs", (int,), what)
    if count is not None and not 0 <= count <= MAX_TOP_LOGPROBS:
        raise RequestError(f"{name}={count} must be in [0, {MAX_TOP_LOGPROBS}]", name)
    return count


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        kind = "rate_limit_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; ``cached``: the prompt tokens found in the prefix cache."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def logprobs_body(kind: str, entries: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """A choice's ``logprobs`` for the generated tokens ``entries``: chat's ``content`` list
    (token, logprob, UTF-8 bytes, ``top_logprobs``), or completions' parallel lists (``tokens``,
    ``token_logprobs``, ``top_logprobs`` as token -> logprob, ``text_offset``: where each token's
    text starts in the completion, counting from ``offset``)."""
    if kind == "chat":
        def item(text: str, logprob: float | None) -> dict[str, Any]:
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return {"content": [{**item(e.text, e.logprob), "top_logprobs": [item(t, lp) for _, t, lp in e.top]} for e in entries], "refusal": None}
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.text)
    return {"tokens": [e.text for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.logprob is None else {t: lp for _, t, lp in e.top} for e in entries], "text_offset": offsets}


@dataclass(frozen=True, slots=True)
class Choice:
    """One completion of a non-streamed response: its text, finish reason and ``logprobs``
    (:func:`logprobs_body`, or None)."""

    text: str | None
    finish: str
    logprobs: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # chat's message.tool_calls (``ToolCall.body``)


def completion_body(kind: str, rid: str, model: str, choices: Sequence[Choice], prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    """The whole (non-streamed) response: ``choices`` in their order (index 0, 1, ...);
    ``completion``: the tokens of all of them."""
    out = []
    for i, c in enumerate(choices):
        if kind == "chat":
            message = {"role": "assistant", "content": c.text, **({"tool_calls": c.tool_calls} if c.tool_calls else {})}
            out.append({"index": i, "message": message, "logprobs": c.logprobs, "finish_reason": c.finish})
        else:
            out.append({"index": i, "text": c.text, "logprobs": c.logprobs, "finish_reason": c.finish})
    obj = "chat.completion" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": out, "usage": usage(prompt, completion, cached)}


def chunk_body(kind: str, rid: str, model: str, text: str | None, finish: str | None, *, role: bool = False,
               usage_of: tuple[int, int, int] | None = None, logprobs: dict[str, Any] | None = None, index: int = 0,
               tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One streamed chunk of choice ``index``: a piece of text (with its tokens' ``logprobs``,
    :func:`logprobs_body`), the finish reason, or (``usage_of``) the usage chunk with no
    choices that ``stream_options.include_usage`` asks for."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    out: dict[str, Any] = {"id": rid, "object": obj, "created": int(time.time()), "model": model}
    if usage_of is not None:
        out["choices"] = []
        out["usage"] = usage(*usage_of)
        return out
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
        if tool_calls:
            delta["tool_calls"] = tool_calls
        out["choices"] = [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
    else:
        out["choices"] = [{"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}]
    return out

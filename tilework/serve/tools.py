"""Tool calls (OpenAI's function calling) in chat completions.

A request's ``tools`` (``[{"type": "function", "function": {"name", "description", "parameters"}}]``)
go to the model's chat template as its ``tools`` variable (the Hugging Face convention: a
template that knows tools describes them to the model), and the messages keep their
``tool_calls`` (assistant) and ``tool_call_id`` / ``name`` (tool results) for the template.
What the model may answer is ``tool_choice``'s:

- ``"none"``: text, as without tools;
- ``"required"``, or a named function (``{"type": "function", "function": {"name": ...}}``):
  tool calls only, whatever the model: the reply is generated under a JSON Schema grammar
  (``tilework.llm.grammar``) for a JSON array of ``{"name", "arguments"}`` objects, each
  ``arguments`` fitting its function's ``parameters`` (one call when ``parallel_tool_calls`` is
  false or a function is named). The reply becomes ``message.tool_calls`` and the finish reason
  ``"tool_calls"``;
- ``"auto"`` (the default with tools): the model chooses, in its own format, which tilework
  reads from the template (``FORMATS``): Hermes' (Hermes, Qwen2.5, Qwen3: each call a JSON
  object ``{"name", "arguments"}`` between ``<tool_call>`` and ``</tool_call>``, the text around
  them the message's content), Llama 3.1-3.3's (the whole reply one or more JSON objects
  ``{"name", "parameters"}``, separated by ``;``, perhaps after ``<|python_tag|>``) and
  Mistral's (the whole reply a JSON array of ``{"name", "arguments"}`` after ``[TOOL_CALLS]``,
  a special token the text does not show). A model whose template has none of these is refused
  ``"auto"`` (400, naming ``tool_choice``) rather than having its tools silently ignored. A
  call of a function that is not one of the tools is left as text.

Streamed, a required call's JSON is held and sent whole at the end, as one ``tool_calls``
delta per call; with ``"auto"`` the text streams until a call may be starting (a
``<tool_call>``; in the whole-reply formats, a reply that starts as JSON), and the calls follow
at the end (:class:`ToolStream`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from tilework.llm.grammar import Grammar, GrammarError
from tilework.serve.scheduler import RequestError

__all__ = ["ToolSpec", "parse_tools", "ToolCall", "tool_calls_of", "ToolStream", "HERMES_OPEN", "FORMATS", "tool_format"]

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
# the tool-call formats "auto" reads, and what in a chat template says its model writes one
FORMATS = {
    "hermes": (HERMES_OPEN,),
    "mistral": ("[TOOL_CALLS]",),
    "llama3_json": ("<|python_tag|>", '"parameters": dictionary of argument name'),
}
_PYTHON_TAG = "<|python_tag|>"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
_HERMES = re.compile(re.escape(HERMES_OPEN) + r"\s*(.*?)\s*" + re.escape(HERMES_CLOSE), re.S)


@dataclass(frozen=True)
class ToolSpec:
    """A request's tools: the ``tools`` list for the template, the choice (``"none"``,
    ``"auto"`` or ``"required"``; a named function is ``"required"`` with ``names`` that one),
    for ``"required"`` the grammar of the reply, for ``"auto"`` the model's format."""

    tools: list[dict[str, Any]]
    choice: str
    names: tuple[str, ...]
    grammar: Grammar | None = None
    format: str | None = None  # a key of FORMATS


def tool_format(template_source: str | None) -> str | None:
    """The tool-call format (``FORMATS``) a chat template says its model writes, or None."""
    return next((name for name, marks in FORMATS.items() if any(m in (template_source or "") for m in marks)), None)


def parse_tools(body: dict[str, Any], template_source: str | None) -> ToolSpec | None:
    """The ``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a chat request (None: no
    tools, or ``tool_choice`` none without them); ``RequestError`` naming the field at fault."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise RequestError("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of {\"type\": \"function\", \"function\": {...}} objects", "tools")
    specs, schemas = [], {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict):
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}}", "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise RequestError(f"tools[{i}].function.name must be 1 to 64 letters, digits, '_' or '-', got {json.dumps(name)[:80]}", "tools")
        if name in schemas:
            raise RequestError(f"tools[{i}]: a second function named {name!r}", "tools")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON Schema object", "tools")
        schemas[name] = params or {"type": "object"}
        specs.append({"type": "function", "function": {k: v for k, v in fn.items() if k in ("name", "description", "parameters", "strict")}})
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise RequestError("parallel_tool_calls must be true or false", "parallel_tool_calls")
    names = tuple(schemas)
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        named = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(named, str) or named not in schemas:
            raise RequestError(f"tool_choice names {json.dumps(named)[:80]}, which is not one of the tools ({', '.join(names)})", "tool_choice")
        names, choice, parallel = (named,), "required", False
    if choice not in ("none", "auto", "required"):
        raise RequestError(f"tool_choice must be none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {json.dumps(choice)[:80]}", "tool_choice")
    fmt = tool_format(template_source) if choice == "auto" else None
    if choice == "auto" and fmt is None:
        raise RequestError("tool_choice auto: this model's chat template has no tool-call format tilework reads (Hermes' and Qwen's"
                           " <tool_call>, Llama 3's JSON, Mistral's [TOOL_CALLS]); ask for tool_choice required, a named function, or none", "tool_choice")
    grammar = None
    if choice == "required":
        calls = [{"type": "object", "properties": {"name": {"const": n}, "arguments": schemas[n]}, "required": ["name", "arguments"],
                  "additionalProperties": False} for n in names]
        item = calls[0] if len(calls) == 1 else {"anyOf": calls}
        try:
            grammar = Grammar.json_schema({"type": "array", "items": item, "minItems": 1, **({} if parallel else {"maxItems": 1})})
        except GrammarError as exc:
            raise RequestError(f"tools (the parameters of tool_choice's functions): {exc}", "tools") from None
    return ToolSpec(specs, choice, names, grammar, fmt)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI gives it
    id: str

    def body(self, index: int | None = None) -> dict[str, Any]:
        """The call as a message's ``tool_calls`` entry (with ``index``: a stream delta's)."""
        out: dict[str, Any] = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def _call(obj: Any) -> ToolCall | None:
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(obj["name"], text, "call_" + uuid.uuid4().hex[:24])


def _json_values(text: str) -> list[Any]:
    """The JSON values ``text`` is made of, one after another (a list's items spread), with
    whitespace or ``;`` between them; ValueError where it is not that."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        value, i = decoder.raw_decode(text, i)
        out.extend(value if isinstance(value, list) else [value])
        while i < len(text) and (text[i].isspace() or text[i] == ";"):
            i += 1
    return out


def _whole_reply_calls(spec: ToolSpec, text: str) -> list[ToolCall]:
    """Llama 3's and Mistral's format: the whole reply (less a leading marker) the calls, each
    of one of the tools; else none (the reply is text)."""
    body = text.strip()
    for mark in (_PYTHON_TAG, "[TOOL_CALLS]"):
        body = body.removeprefix(mark).strip()
    if not body.startswith(("{", "[")):
        return []
    try:
        calls = [_call(v) for v in _json_values(body)]
    except (ValueError, RecursionError):
        return []
    return [c for c in calls if c is not None] if calls and all(c is not None and c.name in spec.names for c in calls) else []


def tool_calls_of(spec: ToolSpec, text: str) -> tuple[str | None, list[ToolCall]]:
    """The content and the tool calls of a finished reply ``text``: a required reply's JSON
    array; an auto reply's calls in the model's format (a Hermes block that is not a call of
    one of the tools, in JSON, stays in the content; a whole-reply format's reply is all calls
    or all text)."""
    if spec.choice == "required":
        try:
            made = [_call(c) for c in json.loads(text)]
        except (ValueError, TypeError, RecursionError):
            return text, []  # cut short by max_tokens
        return None, [c for c in made if c is not None]
    if spec.format != "hermes":
        whole = _whole_reply_calls(spec, text)
        return (None, whole) if whole else (text, [])
    calls: list[ToolCall] = []
    kept, last = [], 0
    for m in _HERMES.finditer(text):
        try:
            call = _call(json.loads(m.group(1)))
        except json.JSONDecodeError:
            call = None
        if call is None or call.name not in spec.names:  # not a call of one of the tools: left in the content
            continue
        kept.append(text[last : m.start()])
        last = m.end()
        calls.append(call)
    content = ("".join(kept) + text[last:]).strip() if calls else text
    return (content or None), calls


class ToolStream:
    """What a stream may send of an auto reply as it comes: in Hermes' format the text before a
    ``<tool_call>`` (a piece that may be the start of one held back); in a whole-reply format
    all of a reply that does not start as JSON (or the marker), none of one that does; a
    required reply's text is all held."""

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec
        self.text = ""  # the reply so far
        self.sent = 0  # of it, sent as content
        self.held = spec.choice == "required"
        self.plain = False  # a whole-reply format's reply that is text

    def push(self, piece: str) -> str:
        self.text += piece
        if self.held:
            return ""
        if self.spec.format != "hermes" and not self.plain:
            start = self.text.lstrip()
            if not start or _PYTHON_TAG.startswith(start[: len(_PYTHON_TAG)]) and len(start) < len(_PYTHON_TAG):
                return ""  # not known yet
            self.held = start.startswith(("{", "[", _PYTHON_TAG))
            self.plain = not self.held
            if self.held:
                return ""
        if self.plain:
            out, self.sent = self.text[self.sent :], len(self.text)
            return out
        at = self.text.find(HERMES_OPEN, self.sent)
        if at >= 0:
            self.held = True
            out, self.sent = self.text[self.sent : at], at
            return out
        end = len(self.text)
        for k in range(min(len(HERMES_OPEN) - 1, end - self.sent), 0, -1):  # a tag maybe starting at the end
            if HERMES_OPEN.startswith(self.text[end - k :]):
                end -= k
                break
        out, self.sent = self.text[self.sent : end], end
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The content not sent yet and the calls, at the end of the reply."""
        content, calls = tool_calls_of(self.spec, self.text)
        if not calls:
            return self.text[self.sent :], []
        rest = (content or "")[self.sent :] if content and content.startswith(self.text[: self.sent]) else ""
        return rest, calls

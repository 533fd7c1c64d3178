"""Tool calls' parsing (``tilework.serve.tools``), without a model: ``tools`` and ``tool_choice``
checked and named in errors; a required choice's grammar; the calls read back from a reply
(a required JSON array, Hermes' ``<tool_call>`` blocks); a stream holds back a tag as it
forms and never loses text."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("llguidance")

from tilework.serve.scheduler import RequestError  # noqa: E402
from tilework.serve.tools import HERMES_OPEN, ToolStream, parse_tools, tool_calls_of, tool_format  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
HERMES = "{% for m in messages %}{{ m.content }}{% endfor %}" + HERMES_OPEN  # a template in Hermes' format (what matters: the tag)


def test_no_tools_and_none() -> None:
    assert parse_tools({}, None) is None and parse_tools({"tools": [], "tool_choice": "auto"}, None) is None
    spec = parse_tools({"tools": [WEATHER], "tool_choice": "none"}, None)
    assert spec is not None and spec.choice == "none" and spec.grammar is None and spec.tools == [WEATHER]


def test_required_and_named_choices_have_a_grammar_of_calls() -> None:
    spec = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required"}, None)
    assert spec is not None and spec.choice == "required" and spec.names == ("get_weather", "get_time") and spec.grammar is not None
    schema = json.loads(spec.grammar.source)
    assert schema["minItems"] == 1 and "maxItems" not in schema and len(schema["items"]["anyOf"]) == 2
    assert schema["items"]["anyOf"][1]["properties"] == {"name": {"const": "get_time"}, "arguments": {"type": "object"}}
    named = parse_tools({"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, None)
    assert named is not None and named.names == ("get_weather",) and json.loads(named.grammar.source)["maxItems"] == 1
    one = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False}, None)
    assert one is not None and json.loads(one.grammar.source)["maxItems"] == 1
    assert parse_tools({"tools": [WEATHER]}, HERMES).choice == "auto"  # the default, where the template has a format


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"tools": {"a": 1}}, "tools", "tools must be a list"),
        ({"tools": [{"type": "retrieval"}]}, "tools", "tools[0] must be"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools", "tools[0].function.name must be"),
        ({"tools": [WEATHER, WEATHER]}, "tools", "tools[1]: a second function named 'get_weather'"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools", "parameters must be a JSON Schema object"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}], "tool_choice": "required"}, "tools", "the json schema does not compile"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be none, auto, required"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice", "which is not one of the tools (get_weather)"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": ["get_weather"]}}}, "tool_choice", "which is not one of the tools"),
        ({"tool_choice": "required"}, "tool_choice", "tool_choice needs tools"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "parallel_tool_calls must be true or false"),
        ({"tools": [WEATHER]}, "tool_choice", "tool_choice auto: this model's chat template has no tool-call format"),
    ],
)
def test_bad_tools_are_named(body: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_tools(body, "{{ messages }}")
    assert info.value.param == param and message in str(info.value)


def test_calls_are_read_from_required_and_auto_replies() -> None:
    required = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required"}, None)
    content, calls = tool_calls_of(required, '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]')
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    assert tool_calls_of(required, '[{"name": "get_wea') == ('[{"name": "get_wea', [])  # cut by max_tokens: the text
    auto = parse_tools({"tools": [WEATHER, TIME]}, HERMES)
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    content, calls = tool_calls_of(auto, text)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Oslo"}')]
    assert content == 'Let me look.\n\n<tool_call>{"name": "nope", "arguments": {}}</tool_call>'  # not one of the tools: left as text
    assert tool_calls_of(auto, "No call here.") == ("No call here.", [])
    assert tool_calls_of(auto, '<tool_call>{"name": "get_time"}</tool_call>')[0] is None
    assert calls[0].body(3) == {"index": 3, "id": calls[0].id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


@pytest.mark.parametrize("step", [1, 2, 5, 100])
def test_a_stream_sends_the_text_before_a_call_and_holds_a_tag_as_it_forms(step: int) -> None:
    auto = parse_tools({"tools": [WEATHER]}, HERMES)
    for text, shown, calls in (
        ('Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>', "Sure. ", 1),
        ("A <tool, not a call; <tool_call", "A <tool, not a call; <tool_call", 0),
        ("Plain text < with an angle.", "Plain text < with an angle.", 0),
    ):
        stream, sent = ToolStream(auto), ""
        for i in range(0, len(text), step):
            sent += stream.push(text[i : i + step])
        rest, got = stream.finish()
        assert sent + rest == shown and len(got) == calls and not sent.endswith("<")
    required = ToolStream(parse_tools({"tools": [WEATHER], "tool_choice": "required"}, None))
    assert required.push('[{"name": "get_weather", "arguments": {"city": "X"}}]') == "" and len(required.finish()[1]) == 1


LLAMA3 = 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. {{ messages }}'
MISTRAL = "{% if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}{{ messages }}[TOOL_CALLS]"


def test_the_format_auto_reads_is_the_templates() -> None:
    assert [tool_format(t) for t in (HERMES, LLAMA3, MISTRAL, "{{ messages }} <|python_tag|>", "{{ messages }}", None)] == [
        "hermes", "llama3_json", "mistral", "llama3_json", None, None]
    assert parse_tools({"tools": [WEATHER]}, MISTRAL).format == "mistral" and parse_tools({"tools": [WEATHER], "tool_choice": "required"}, MISTRAL).format is None


@pytest.mark.parametrize(
    "template, text, calls",
    [
        (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Lima"}}', [("get_weather", {"city": "Lima"})]),
        (LLAMA3, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "a;b"}}; {"name": "get_time", "parameters": {}}',
         [("get_weather", {"city": "a;b"}), ("get_time", {})]),
        (LLAMA3, ' {"name": "get_weather", "parameters": {"city": "Lima"}} and then', []),  # not JSON alone: text
        (LLAMA3, '{"name": "send_mail", "parameters": {}}', []),  # not one of the tools: text
        (LLAMA3, "It is sunny in Lima.", []),
        (MISTRAL, ' [{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]', [("get_time", {}), ("get_weather", {"city": "Oslo"})]),
        (MISTRAL, '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]', [("get_time", {})]),
        (MISTRAL, "[1] is a citation, not a call.", []),
    ],
)
def test_whole_reply_formats_are_all_calls_or_all_text(template: str, text: str, calls: list[tuple[str, Any]]) -> None:
    spec = parse_tools({"tools": [WEATHER, TIME]}, template)
    content, got = tool_calls_of(spec, text)
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls and content == (None if calls else text)
    for step in (1, 4, 100):
        stream, sent = ToolStream(spec), ""
        for i in range(0, len(text), step):
            sent += stream.push(text[i : i + step])
        rest, streamed = stream.finish()
        assert len(streamed) == len(calls) and (sent + rest == ("" if calls else text))
        if not calls and not text.lstrip().startswith(("{", "[", "<")):
            assert sent == text[: len(sent)] and len(sent) >= len(text) - step  # plain text streams as it comes

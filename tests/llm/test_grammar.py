"""Structured output (``tilework.llm.grammar``): JSON mode, JSON schemas and regular
expressions constrain SmolLM2's sampled and greedy text; the token picked is the model's most
likely one the grammar allows; a grammar that allows everything changes nothing; bad grammars
are ``TileworkError``s naming the problem."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.llm.models import needs_smollm2

pytest.importorskip("llguidance")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from tilework.errors import TileworkError  # noqa: E402
from tilework.llm import LLM, Grammar, SamplingParams  # noqa: E402
from tilework.llm.completion import Completion  # noqa: E402
from tilework.llm.grammar import Constraint, GrammarError  # noqa: E402
from tilework.llm.sampling import SamplingParamsError  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(precision="q", kv_tokens=2048)


@needs_smollm2
def test_sampled_json_object_schema_and_regex_outputs_fit_their_grammar(llm: LLM) -> None:
    """Four seeds each at temperature 1 (where unconstrained text is rarely JSON): every reply
    that ends by itself parses, and a schema's has its keys, in order, with their types."""
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=160, seed=5)
    for out in llm.generate(["Describe a cat in JSON."] * 4, _with(params, Grammar.json())):
        if out.finish_reason == "stop":
            assert isinstance(json.loads(out.text), dict), out.text
    people = llm.generate(["Make up a person as JSON."] * 4, _with(params, Grammar.json_schema(PERSON)))
    assert sum(o.finish_reason == "stop" for o in people) >= 3
    for out in people:
        if out.finish_reason == "stop":
            person = json.loads(out.text)
            assert list(person) == ["name", "age", "pets"] and isinstance(person["name"], str) and len(person["name"]) <= 16
            assert isinstance(person["age"], int) and 0 <= person["age"] <= 120 and set(person["pets"]) <= {"cat", "dog", "fish"}
    for out in llm.generate(["Write a phone number."] * 4, _with(params, Grammar.regex(r"[0-9]{3}-[0-9]{4}"))):
        assert out.finish_reason == "stop" and re.fullmatch(r"[0-9]{3}-[0-9]{4}", out.text), out.text


def _with(params: SamplingParams, grammar: Grammar) -> SamplingParams:
    import dataclasses

    return dataclasses.replace(params, grammar=grammar)


@needs_smollm2
def test_greedy_picks_the_most_likely_token_the_grammar_allows(llm: LLM) -> None:
    """``Completion.add`` under JSON mode, fed random logits (the most likely token mostly one
    JSON does not allow): each token taken is the argmax of the logits over the tokens a
    constraint stepped beside it allows, and the log-probabilities stay the model's. And on the
    model, a grammar that allows any text gives the
    unconstrained greedy tokens."""
    rng = np.random.default_rng(0)
    prompt = llm.encode("Hi")
    greedy = SamplingParams(temperature=0, max_tokens=64, grammar=Grammar.json())
    out = Completion(greedy, llm.config.vocab, llm.eos, llm.tokenizer.stream_decoder(skip_special_tokens=True, context=prompt[-1:]), prompt, logprobs=0)
    beside = Constraint(Grammar.json(), llm.tokenizer, llm.config.vocab, llm.eos)
    overruled = 0
    while out.finish is None:
        logits = rng.standard_normal(llm.config.vocab).astype(np.float32) * 4
        allowed = beside.allowed()
        want = int(np.argmax(np.where(allowed, logits, -np.inf)))
        overruled += not allowed[int(np.argmax(logits))]
        out.add(logits.copy())
        if out.finish == "stop" and want in llm.eos:
            break
        assert out.ids[-1] == want
        assert out.token_logprobs[-1].logprob == pytest.approx(float(logits[want] - np.log(np.exp(logits.astype(np.float64)).sum())), abs=1e-5)
        beside.advance(want)
    assert overruled >= 1 and out.text.startswith("{")  # (random tokens mostly make a long string: "length")
    question = "Give the three primary colors."
    anything = llm.generate(question, SamplingParams(temperature=0, max_tokens=24, grammar=Grammar.regex(r"(.|\n)*")))[0]
    assert anything.token_ids == llm.generate(question, SamplingParams(temperature=0, max_tokens=24))[0].token_ids


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Grammar.json_schema("{not json"), "the JSON schema is not valid JSON"),
        (lambda: Grammar.json_schema([1, 2]), "a JSON schema is a JSON object, got list"),
        (lambda: Grammar.json_schema({"type": "objectx"}), "the json schema does not compile: Invalid type: objectx"),
        (lambda: Grammar.json_schema({"$ref": "#/defs/x"}), "the json schema does not compile: Pointer '/defs/x' does not exist"),
        (lambda: Grammar.regex("[0-9"), "the regex does not compile"),
        (lambda: Grammar.lark("start: nothing_here"), "the lark does not compile"),
        (lambda: SamplingParams(grammar="json"), "grammar='json' is invalid: it must be None or a tilework.llm.grammar.Grammar"),
    ],
)
def test_bad_grammars_are_errors_that_name_the_problem(make: object, message: str) -> None:
    with pytest.raises(TileworkError) as info:
        make()  # type: ignore[operator]
    assert message in str(info.value) and isinstance(info.value, (GrammarError, SamplingParamsError))


def test_equal_grammars_are_equal_params() -> None:
    a = SamplingParams(grammar=Grammar.json_schema(PERSON))
    assert a == SamplingParams(grammar=Grammar.json_schema(json.dumps(PERSON))) and hash(a) == hash(SamplingParams(grammar=Grammar.json_schema(PERSON)))
    assert a != SamplingParams(grammar=Grammar.json())

"""Structured output: a grammar the generated text must follow, token by token.

    params = SamplingParams(max_tokens=128, grammar=Grammar.json_schema({"type": "object", ...}))
    llm.generate("Describe a cat as JSON.", params)     # the text parses, and fits the schema

A :class:`Grammar` is what the text must be: a JSON value (``Grammar.json()``: any JSON object,
or ``Grammar.json_schema(schema)``: one that fits a JSON Schema), a regular expression
(``Grammar.regex``) or a Lark grammar (``Grammar.lark``). Each sequence that samples under one
holds a :class:`Constraint`: before each token is sampled, every token that cannot continue the
text within the grammar gets a logit of -inf (so temperature, top-k, top-p and the penalties
work on the tokens the grammar allows, and greedy picks the most likely of them); the token
sampled advances it. The end-of-sequence tokens are allowed only where the text is complete;
once nothing but the end may follow (a JSON value closed), the sequence ends ("stop") without
sampling it. ``max_tokens`` may still cut the text short ("length"), as OpenAI's structured
output does.

The grammars are compiled and matched by llguidance (the Rust library behind the structured
output of vLLM, SGLang and llama.cpp's optional path): the optional dependency
``pip install 'tilework[structured]'``. It reads the model's own tokenizer (its vocabulary and
merges, ``tokenizers``' JSON); a mask over SmolLM2's 49152 tokens, computed and applied, takes
0.13-0.17 ms a step (median; at most 1.5 ms) under a JSON schema: a few percent of a decode
step. A grammar that does not compile (an unknown type in a schema, a dangling ``$ref``, a bad
regex) is a ``GrammarError`` (a ``TileworkError``) naming what is wrong, raised when the grammar
is made, before any generation.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilework.errors import TileworkError

__all__ = ["Grammar", "Constraint", "GrammarError"]

KINDS = ("json_schema", "regex", "lark")


class GrammarError(TileworkError, ValueError):
    """A grammar that cannot be compiled, or structured output without llguidance."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise GrammarError("structured output (a grammar, a JSON schema, JSON mode) needs llguidance: pip install 'tilework[structured]'") from None
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """What the generated text must be; made by :meth:`json`, :meth:`json_schema`, :meth:`regex`
    or :meth:`lark` (checked there). ``kind`` and ``source`` say it (the schema as JSON text);
    equal grammars are equal (``SamplingParams`` stays hashable)."""

    kind: str
    source: str
    compiled: str = field(default="", compare=False, repr=False)  # llguidance's grammar text

    def __post_init__(self) -> None:
        if self.kind not in KINDS or not isinstance(self.source, str):
            raise GrammarError(f"a grammar's kind is one of {', '.join(KINDS)} with a string source, got {self.kind!r}")
        if not self.compiled:
            object.__setattr__(self, "compiled", _compile(self.kind, self.source))

    @staticmethod
    def json() -> "Grammar":
        """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return Grammar.json_schema({"type": "object"})

    @staticmethod
    def json_schema(schema: dict[str, Any] | str) -> "Grammar":
        """A JSON value that fits ``schema`` (a JSON Schema, as a dict or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError) as exc:  # (ValueError: also a number of more than 4300 digits)
                raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise GrammarError(f"a JSON schema is a JSON object, got {type(schema).__name__}")
        try:
            text = json.dumps(schema)  # (key order kept: a schema's properties come in its order)
        except (TypeError, ValueError, RecursionError) as exc:
            raise GrammarError(f"the JSON schema is not JSON data: {exc}") from None
        return Grammar("json_schema", text)

    @staticmethod
    def regex(pattern: str) -> "Grammar":
        """Text that matches ``pattern`` whole (Rust ``regex`` syntax, close to Python's)."""
        return Grammar("regex", pattern)

    @staticmethod
    def lark(text: str) -> "Grammar":
        """Text of a Lark grammar (llguidance's dialect: ``start`` is the root rule)."""
        return Grammar("lark", text)


def _compile(kind: str, source: str) -> str:
    G = _llguidance()
    try:
        if kind == "json_schema":
            text = G.LLMatcher.grammar_from_json_schema(source)
        elif kind == "regex":
            text = G.LLMatcher.grammar_from_regex(source)
        else:
            text = G.LLMatcher.grammar_from_lark(source)
    except ValueError as exc:
        raise GrammarError(f"the {kind.replace('_', ' ')} does not compile: {exc}") from None
    failed, messages = G.LLMatcher.validate_grammar_with_warnings(text)  # (warnings: keywords it does not enforce)
    if failed:
        raise GrammarError(f"the {kind.replace('_', ' ')} does not compile: {_first_line(messages[0])}")
    return str(text)


def _first_line(message: str) -> str:
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    return "; ".join(lines[:4])


_TOKENIZERS: "weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], Any]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _ll_tokenizer(tokenizer: Any, vocab: int, eos: Collection[int]) -> Any:
    """llguidance's view of ``tokenizer`` (a ``tilework.llm.tokenizer.Tokenizer``; about 0.2 s
    for a vocabulary of 49152 tokens, so kept while the tokenizer lives)."""
    G = _llguidance()
    key = (vocab, tuple(sorted(eos)))
    with _LOCK:
        made = _TOKENIZERS.setdefault(tokenizer, {})
        if key not in made:
            made[key] = G.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab, eos_token=list(key[1]))
        return made[key]


class Constraint:
    """One sequence's place in ``grammar`` (see the module docstring): :meth:`mask` the logits
    before sampling, :meth:`advance` with the token sampled; :attr:`complete` once only an end
    of sequence may follow."""

    def __init__(self, grammar: Grammar, tokenizer: Any, vocab: int, eos: Collection[int]) -> None:
        G = _llguidance()
        self.vocab = vocab
        self.matcher = G.LLMatcher(_ll_tokenizer(tokenizer, vocab, eos), grammar.compiled, log_level=0)
        self._check()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise GrammarError(f"structured output failed: {_first_line(self.matcher.get_error())}")

    def allowed(self) -> np.ndarray:
        """Which tokens may come next (bool, one a vocabulary entry)."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), np.uint8)
        self._check()
        return np.unpackbits(bits, bitorder="little")[: self.vocab].view(bool)

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits of the tokens the grammar does not allow next to -inf, in place."""
        logits[~self.allowed()] = -np.inf

    def advance(self, token: int) -> None:
        """The token sampled (one :meth:`allowed` gave)."""
        self.matcher.consume_token(int(token))
        self._check()

    @property
    def complete(self) -> bool:
        """Only an end of sequence may follow: the text is whole."""
        return bool(self.matcher.is_stopped())

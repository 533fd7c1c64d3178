"""Chat templates: a model's Jinja template rendered into the prompt text of a conversation.

A template comes from the model file (``tokenizer.chat_template`` in a GGUF, ``chat_template`` in
``tokenizer_config.json``), so it is untrusted: it is rendered in Jinja's
``ImmutableSandboxedEnvironment`` (no attribute starting with ``_``, no mutation of the values
passed in, no unsafe callables) and sees only plain copies of the messages.

The environment is the one transformers' ``apply_chat_template`` renders with, so the text is the
same: ``trim_blocks`` and ``lstrip_blocks`` on, the ``loopcontrols`` extension, a ``tojson`` filter
that does not escape HTML or non-ASCII, and the globals ``raise_exception(msg)`` (raises
:class:`ChatTemplateError`), ``strftime_now(fmt)``, ``namespace`` and ``dict``. A
``{% generation %}`` block (used by training code to mark assistant text) renders its body.
Keys whose value is None are dropped from messages, as transformers does.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tilework.errors import TileworkError

if TYPE_CHECKING:
    import jinja2

    from tilework.llm.tokenizer import Tokenizer

__all__ = ["ChatTemplate", "ChatTemplateError", "Conversation", "Prompt", "render_chat"]

Message = Mapping[str, Any]


class ChatTemplateError(TileworkError):
    """A chat template does not parse, fails while rendering, or called ``raise_exception``."""


def _plain(value: Any) -> Any:
    """A copy made of plain JSON types only, so a template cannot reach methods of rich objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (enums, ...) are cut back to the base type
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def _environment() -> jinja2.Environment:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body unchanged."""

        tags = {"generation"}

        def parse(self, parser: Any) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    class Namespace(jinja2.utils.Namespace):
        """``namespace(...)`` that refuses attribute names starting with ``_``."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a template may not set namespace attribute {name!r}")

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(fmt)

    def make_dict(*args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, namespace=Namespace, dict=make_dict)
    return env


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may refer to."""

    def __init__(self, source: str, *, bos_token: str | None = None, eos_token: str | None = None,
                 **special_tokens: str | None) -> None:
        import jinja2

        self.source = source
        self.special_tokens: dict[str, str | None] = {"bos_token": bos_token, "eos_token": eos_token, **special_tokens}
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not parse: {exc.message} (line {exc.lineno})") from exc

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> ChatTemplate:
        if tokenizer.chat_template is None:
            raise ChatTemplateError("the tokenizer has no chat template (no tokenizer.chat_template in the model)")
        unk = tokenizer.id_to_token(tokenizer.unk_id) if tokenizer.unk_id is not None else None
        pad = tokenizer.id_to_token(tokenizer.pad_id) if tokenizer.pad_id is not None else None
        return cls(tokenizer.chat_template, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                   unk_token=unk, pad_token=pad)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False, **kwargs: Any) -> str:
        """The prompt text of ``messages``; ``kwargs`` become template variables (``tools``, ...).

        Any failure inside the template (``raise_exception``, a sandbox refusal, a type error on
        odd message contents) is a :class:`ChatTemplateError`.
        """
        import jinja2

        chat = [{k: v for k, v in _plain(dict(m)).items() if v is not None} for m in messages]
        variables: dict[str, Any] = {"tools": None, "documents": None}
        variables.update({k: v for k, v in self.special_tokens.items() if v is not None})
        variables.update(_plain(kwargs))
        try:
            return str(self._template.render(messages=chat, add_generation_prompt=add_generation_prompt, **variables))
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
        except Exception as exc:  # a template is data: '+' on a number, a bad index, ... all end here
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc


def render_chat(template: str, messages: Sequence[Message], add_generation_prompt: bool = False,
                *, bos_token: str | None = None, eos_token: str | None = None, **kwargs: Any) -> str:
    """Render ``template`` once (compile a :class:`ChatTemplate` to render it repeatedly)."""
    return ChatTemplate(template, bos_token=bos_token, eos_token=eos_token).render(
        messages, add_generation_prompt=add_generation_prompt, **kwargs
    )


@dataclass(frozen=True, slots=True)
class Prompt:
    """The text to feed the model for a new turn.

    ``incremental`` True: ``text`` continues what the model has already seen (keep the KV cache and
    append). False: the template rewrote earlier turns, ``text`` is the whole conversation and the
    caller must start from an empty cache.
    """

    text: str
    incremental: bool


class Conversation:
    """A chat history that gives the prompt text of each new turn only.

    How the new text is found. The conversation keeps ``seen``: the exact text the model has been
    given or has generated, i.e. every prompt text returned by :meth:`prompt` followed by the
    assistant replies passed to :meth:`add_assistant` (the reply as the user saw it, cut before a stop
    string; the caller's KV cache must hold exactly its tokens, *without* the end-of-turn token that
    stopped it: generation stops when that token is sampled, before it is fed. ``ChatSession`` feeds
    the last token of a reply cut by ``max_tokens``, and drops the tokens of a stop string).
    :meth:`prompt` renders the whole history with ``add_generation_prompt=True``; when
    ``seen`` is a prefix of that rendering, the new text is the rest (for ChatML:
    ``"<|im_end|>\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n"``, which closes the
    reply with the end-of-turn token the model stopped on). When it is not a prefix (a template that
    drops or rewrites earlier turns, e.g. strips reasoning, or a reply edited after generation), the
    full rendering is returned with ``incremental=False``.

    Tokenizing the pieces separately gives the tokens of the whole only when each piece starts at a
    pre-token boundary; with chat templates it starts at a special token (``<|im_end|>``), which is one.
    """

    def __init__(self, template: ChatTemplate, system: str | None = None) -> None:
        self.template = template
        self.messages: list[dict[str, Any]] = []
        self.seen = ""
        if system is not None:
            self.messages.append({"role": "system", "content": system})

    def add_user(self, content: str) -> None:
        self.messages.append({"role": "user", "content": content})

    def add_assistant(self, content: str) -> None:
        """Record the reply the model generated after the last :meth:`prompt`."""
        self.messages.append({"role": "assistant", "content": content})
        self.seen += content

    def render(self, add_generation_prompt: bool = True) -> str:
        """The whole history as prompt text."""
        return self.template.render(self.messages, add_generation_prompt=add_generation_prompt)

    def prompt(self) -> Prompt:
        """The text to feed for the new turn (see the class docstring); marks it as seen."""
        full = self.render(add_generation_prompt=True)
        incremental = full.startswith(self.seen)
        text = full[len(self.seen) :] if incremental else full
        self.seen = full
        return Prompt(text=text, incremental=incremental)

    def reset(self) -> None:
        """Forget what the model has seen (after the caller cleared its KV cache)."""
        self.seen = ""

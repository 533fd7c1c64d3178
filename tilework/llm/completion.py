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
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from tilework.errors import TileworkError
from tilework.llm.sampling import Sampler, SamplingParams, StopChecker, StopStream
from tilework.llm.tokenizer import StreamDecoder

__all__ = ["Completion", "TokenLogprob", "MAX_TOP_LOGPROBS"]

MAX_TOP_LOGPROBS = 20  # the most alternatives a position reports (OpenAI's limit)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token (``id``, ``text``), its log-probability, and the ``top`` most likely
    tokens at its position as ``(id, text, logprob)``, the most likely first."""

    id: int
    text: str
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()


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

    @property
    def text(self) -> str:
        """The output so far (cut before a stop string)."""
        return self.stream.text

    def add(self, logits: np.ndarray, room: bool = True) -> str:
        """Sample the next token from ``logits``; the text to show now (may be empty)."""
        if self.logprobs is not None:  # before sampling: the sampler may reshape the logits in place
            logp = logits.astype(np.float64)
            logp -= logp.max()
            logp -= np.log(np.exp(logp).sum())
        token = self.sampler.sample(logits, self.history, self.ids)
        piece = ""
        if token in self.eos:
            self.finish = "stop"
        else:
            if self.logprobs is not None:
                self.token_logprobs.append(self._entry(token, logp))
            self.ids.append(token)
            self.history.append(token)
            piece, stopped = self.stream.push(self.decoder.feed(token))
            if stopped:
                self.finish = "stop"
            elif len(self.ids) >= self.params.max_tokens or not room:
                self.finish = "length"
        if self.finish is not None and not self.stream.stopped:
            piece += self.stream.push(self.decoder.flush())[0] + self.stream.finish()
        return piece

    def _entry(self, token: int, logp: np.ndarray) -> TokenLogprob:
        """``token``'s log-probability and the ``logprobs`` most likely tokens (``logp``: the
        log-softmax of the logits), each with the text it adds after the token before it."""
        before = self.history[-1:]
        tokenizer = self.decoder.tokenizer
        start = len(tokenizer.decode(before))

        def text(t: int) -> str:
            return tokenizer.decode([*before, t])[start:]

        k = self.logprobs or 0
        top = np.argpartition(-logp, k - 1)[:k] if k else np.zeros(0, np.int64)
        top = top[np.lexsort((top, -logp[top]))]  # most likely first (ties: the lower id)
        return TokenLogprob(token, text(token), float(logp[token]), tuple((int(t), text(int(t)), float(logp[t])) for t in top))

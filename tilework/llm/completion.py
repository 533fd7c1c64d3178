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
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from tilework.llm.sampling import Sampler, SamplingParams, StopChecker, StopStream
from tilework.llm.tokenizer import StreamDecoder

__all__ = ["Completion"]


class Completion:
    """See the module docstring; ``history`` (prompt and output ids) feeds the repetition penalty."""

    def __init__(self, params: SamplingParams, vocab: int, eos: Collection[int], decoder: StreamDecoder, prompt: Sequence[int]) -> None:
        self.params = params
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
        token = self.sampler.sample(logits, self.history)
        piece = ""
        if token in self.eos:
            self.finish = "stop"
        else:
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

"""Continuous batching: one thread owns an ``LLM`` and runs every request through it.

    sched = Scheduler(llm, max_seqs=16)
    sched.start()
    ticket = sched.submit(llm.encode("Hi!"), SamplingParams(temperature=0, max_tokens=32), on_event)
    ...                                   # on_event(Event) is called from the scheduler's thread
    ticket.cancel()                       # or let it finish; sched.stop() at the end

Requests wait in a FIFO queue and are *admitted* when the running set has room: fewer than
``max_seqs`` sequences (at most the batch the decoder was compiled for) and enough free pages
for the request's worst case, ``ceil((prompt + max_tokens) / page)`` pages, reserved at
admission. So a running sequence never meets a full KV cache, and nothing is preempted. At
most ``max_queue`` requests may wait that cannot start at the next step (those that can do not
count); ``submit`` refuses more (429).

Each iteration of the loop is one *step*:

1. drop the cancelled requests (a client went away): their sequences and pages are freed;
2. admit waiting requests (FIFO) while the limits allow;
3. **chunked prefill**: prompts are fed in chunks of ``prefill_chunk`` tokens, oldest request
   first, as many chunks as fit in ``step_tokens`` prompt tokens (at least one). A sequence
   whose last chunk went in samples its first token;
4. one **decode step** for every sequence that has a token to feed, all in one batch: sequences
   join the batch the step after their prompt is in and leave it the step they finish.

So a long prompt never stalls the running sequences for more than one step's prompt budget:
they get a decode step after every ``step_tokens`` prompt tokens. Chunk boundaries depend on the
prompt only (chunk ``i`` is ``prompt[i * prefill_chunk : (i + 1) * prefill_chunk]``), never on the
load, and the decode kernels give a row the same bits whatever the batch, so a request's tokens
do not depend on what else runs (with a seed, sampling draws from the request's own generator).

**Prefix caching** (``prefix_cache=True``, the default): a request starts on the KV-cache pages
of an earlier prompt that its own begins with (``PagedKVCache.add(prefix=...)``: whole pages,
found by the tokens they hold; looked up when its first chunk is due, so the chunks of requests
before it in the same steps count) and feeds only the rest; a prompt's full pages are published
as its chunks go in, and stay findable after the request until the pool needs them (least
recently freed first). A shared system prompt, or a chat client sending the conversation again each turn,
is prefilled once. The reused pages hold the bits this request's prefill would have written, so
its tokens are the same with or without a hit (tested). A response's usage says how many prompt
tokens came from the cache (``prompt_tokens_details.cached_tokens``, as OpenAI reports it).

Sampling and stopping are ``LLM.generate``'s (``tilework.llm.completion``): the request's ``Sampler``, end of sequence or end
of turn, stop strings (held back while they may still be forming), ``max_tokens``, the context.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tilework.errors import TileworkError
from tilework.llm.engine import logit_rows, token_ids
from tilework.llm.completion import Completion, TokenLogprob, prompt_logprobs
from tilework.llm.sampling import SamplingParams
from tilework.serve.metrics import ServeMetrics

__all__ = ["Scheduler", "Ticket", "Event", "RequestError", "INTERNAL_ERROR", "failure_message"]

log = logging.getLogger("tilework.serve")

INTERNAL_ERROR = "internal error (the server's log has the details)"


def failure_message(exc: BaseException) -> str:
    """What a client is told when its request fails inside the server: a ``TileworkError``'s own
    message (written for users), else only ``INTERNAL_ERROR``: a Python exception's text names
    the server's internals and is for its log."""
    return str(exc) if isinstance(exc, TileworkError) else INTERNAL_ERROR


class RequestError(TileworkError):
    """A request the server refuses: ``status`` is the HTTP status, ``param`` the field at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


@dataclass(frozen=True, slots=True)
class Event:
    """What a request receives: a piece of ``text`` (may be empty), and at the end a
    ``finish_reason`` ("stop", "length", or "error" with ``error`` set) and the token counts."""

    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache
    index: int = 0  # the completion (choice) of the request: 0 .. n - 1, prompt p's p * n .. (p + 1) * n - 1 in a batch
    logprobs: tuple[TokenLogprob, ...] = ()  # the tokens this text completes, when the request asked for them


OnEvent = Callable[[Event], None]


class Ticket:
    """A submitted request; ``cancel()`` frees its sequence at the next step (thread-safe)."""

    _ids = itertools.count()

    def __init__(self, scheduler: "Scheduler") -> None:
        self.id = next(Ticket._ids)
        self.cancelled = False
        self._scheduler = scheduler

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._scheduler._wake()


@dataclass(eq=False)
class _Seq:
    ticket: Ticket
    tokens: list[int]
    out: Completion
    on_event: OnEvent
    pages: int  # reserved at admission
    submitted: float
    sid: int | None = None
    fed: int = 0  # prompt tokens in the cache
    cached: int = 0  # of them, found in the prefix cache
    logprobs_sent: int = 0  # out.token_logprobs given out in events
    finish: str | None = None  # the completion's, or "cancelled" / "error"
    first_token_at: float | None = None
    index: int = 0  # which of the request's completions
    echo: str | None = None  # the prompt's text, given back before the completion (completions' echo)
    prompt_logprobs: list[TokenLogprob] = dataclasses.field(default_factory=list)  # of the prompt's tokens, with echo and logprobs

    @property
    def scores_prompt(self) -> bool:
        """Echo with log-probabilities: every prompt position's logits are needed (no prefix-cache start)."""
        return self.echo is not None and self.out.logprobs is not None

    @property
    def prefilled(self) -> bool:
        return self.fed == len(self.tokens)


class Scheduler:
    """See the module docstring."""

    def __init__(
        self,
        llm: Any,
        *,
        max_seqs: int | None = None,
        max_pages: int | None = None,
        prefill_chunk: int = 256,
        step_tokens: int = 512,
        max_queue: int = 1024,
        prefix_cache: bool = True,
    ) -> None:
        cache = llm.cache
        max_seqs = llm.max_batch if max_seqs is None else max_seqs
        if not 1 <= max_seqs <= llm.max_batch:
            raise TileworkError(f"max_seqs={max_seqs}: it must be in [1, {llm.max_batch}] (the batch the decoder was compiled for)")
        max_pages = cache.num_pages if max_pages is None else max_pages
        if not 1 <= max_pages <= cache.num_pages:
            raise TileworkError(f"max_pages={max_pages}: it must be in [1, {cache.num_pages}] (the KV cache's pages)")
        if min(prefill_chunk, step_tokens, max_queue) < 1:
            raise TileworkError(f"prefill_chunk={prefill_chunk}, step_tokens={step_tokens} and max_queue={max_queue} must be >= 1")
        if cache.sequences():
            raise TileworkError("the LLM's KV cache is in use: the scheduler owns the cache (close chat sessions first)")
        self.llm, self.cache = llm, cache
        self.max_seqs, self.max_pages = max_seqs, max_pages
        self.prefill_chunk, self.step_tokens, self.max_queue = prefill_chunk, step_tokens, max_queue
        self.prefix_cache = prefix_cache and llm.config.prefill_boundary is None  # (longrope: LlmConfig.prefill_boundary)
        self.context = llm.config.context_length
        self.metrics = ServeMetrics(cache.num_pages)
        self._cond = threading.Condition()
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._running: list[_Seq] = []
        self._reserved = 0  # pages reserved by the running sequences
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None  # what stopped the loop, if it died

    # -- the client side (any thread) -------------------------------------------------------------

    def check(self, tokens: Sequence[int], params: SamplingParams) -> None:
        """Raise ``RequestError`` when the request can never run here."""
        if not tokens:
            raise RequestError("the prompt is empty", "prompt")
        if len(tokens) >= self.context:
            raise RequestError(f"the prompt has {len(tokens)} tokens; the model's context is {self.context} (prompt and completion)", "prompt")
        if len(tokens) + params.max_tokens > self.context:
            raise RequestError(
                f"max_tokens={params.max_tokens} and the prompt's {len(tokens)} tokens exceed the model's context of {self.context}"
                f" (at most {self.context - len(tokens)} for this prompt)", "max_tokens")
        if len(tokens) >= self.max_sequence:
            raise RequestError(
                f"the prompt has {len(tokens)} tokens; the server's KV cache holds at most {self.max_sequence} tokens for a sequence"
                f" ({self.max_pages} pages of {self.cache.page}; prompt and completion)", "prompt")
        need = self._pages(len(tokens), params.max_tokens)
        if need > self.max_pages:
            most = self.max_pages * self.cache.page - len(tokens)
            raise RequestError(
                f"the prompt ({len(tokens)} tokens) and max_tokens={params.max_tokens} need {need} KV-cache pages; the server has"
                f" {self.max_pages} (at most max_tokens={max(most, 0)} for this prompt)", "max_tokens")
        try:
            token_ids(tokens, self.llm.config.vocab)
        except TileworkError as exc:
            raise RequestError(str(exc), "prompt") from None

    def submit(self, tokens: Sequence[int], params: SamplingParams, on_event: OnEvent, logprobs: int | None = None, n: int = 1,
               echo: bool = False, text: str | None = None) -> Ticket:
        """Queue a request; ``on_event`` gets its events, from the scheduler's thread. With
        ``logprobs=k`` each event carries the log-probabilities of the tokens its text completes
        and the ``k`` most likely tokens at each (``Completion``). ``n`` completions of the prompt
        are ``n`` sequences (events say which: ``Event.index``), each reserving its own pages;
        completion ``i`` samples with ``seed + i`` (as prompt ``i`` of ``LLM.generate``), and
        the prefix cache gives the later ones the first one's pages. ``echo``: each completion's
        first event gives the prompt back (``text``, or its tokens decoded), with its tokens'
        log-probabilities (the first one's None) when ``logprobs`` asks for them."""
        return self.submit_batch([tokens], params, on_event, logprobs, n, echo, [text])

    def submit_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams, on_event: OnEvent, logprobs: int | None = None,
                     n: int = 1, echo: bool = False, texts: Sequence[str | None] | None = None) -> Ticket:
        """``submit`` for a batch of prompts in one request (a completions ``prompt`` list): ``n``
        completions of each, the choices numbered prompt by prompt (prompt ``p``'s completion
        ``i`` is ``Event.index`` ``p * n + i``, sampled with ``seed + p * n + i``: with ``n = 1``
        prompt ``p`` of ``LLM.generate``'s batch). Every prompt is checked before any is queued,
        and the request is queued whole or refused whole; its sequences are admitted as room
        frees, like requests of their own, and ``cancel`` ends them all. ``texts``: the prompts'
        texts for ``echo`` (None: decoded)."""
        ids = [[int(t) for t in tokens] for tokens in prompts]
        texts = list(texts) if texts is not None else [None] * len(ids)
        if len(texts) != len(ids) or not ids:
            raise TileworkError(f"submit_batch takes at least one prompt and one text (or None) a prompt: {len(ids)} prompts, {len(texts)} texts")
        if not 1 <= n <= self.max_seqs:
            raise RequestError(f"n={n}: the server decodes at most {self.max_seqs} sequences together (max_seqs)", "n")
        ticket = Ticket(self)
        seqs = []
        for p, (tokens, text) in enumerate(zip(ids, texts)):
            try:
                self.check(tokens, params)
            except RequestError as exc:
                raise exc if len(ids) == 1 else RequestError(f"prompt[{p}]: {exc}", exc.param, exc.status, exc.code) from None
            echo_text = (text if text is not None else self.llm.tokenizer.decode(tokens)) if echo else None
            pages = self._pages(len(tokens), params.max_tokens)
            if n * pages > self.max_pages:
                raise RequestError(f"n={n} completions of {pages} KV-cache pages each (the prompt and max_tokens) need {n * pages}; the server has {self.max_pages}", "n")
            for i in range(p * n, (p + 1) * n):
                own = params if params.seed is None else dataclasses.replace(params, seed=params.seed + i)
                decoder = self.llm.tokenizer.stream_decoder(skip_special_tokens=True, context=tokens[-1:])
                out = Completion(own, self.llm.config.vocab, self.llm.eos, decoder, tokens, logprobs)
                seqs.append(_Seq(ticket, tokens, out, on_event, pages, time.perf_counter(), index=i, echo=echo_text))
        with self._cond:
            if self._stopping or (self._thread is not None and not self._thread.is_alive()):
                raise RequestError("the server is shutting down", status=503)
            if self._blocked(seqs) > self.max_queue:
                raise RequestError(f"the server is busy: the queue of requests waiting for room is full (max_queue={self.max_queue});"
                                   " retry later", status=429)
            self._waiting.extend(seqs)
            for tokens in ids:
                self.metrics.submitted(len(tokens), n)
            self._cond.notify()
        return ticket

    def start(self) -> "Scheduler":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tilework-scheduler", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 30) -> None:
        """End the loop; requests still queued or running end with an error event."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def max_sequence(self) -> int:
        """The most tokens one sequence may hold, prompt and completion: the model's context, or
        less when the KV pages (``max_pages``) hold less."""
        return min(self.context, self.max_pages * self.cache.page)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def snapshot(self) -> dict[str, int]:
        """Queue and cache figures of this moment (for the metrics)."""
        with self._cond:
            return {"waiting": len(self._waiting), "running": len(self._running), "reserved_pages": self._reserved,
                    "used_pages": self.cache.num_pages - self.cache.free_pages, "published_pages": self.cache.published_pages}

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _blocked(self, new: list[_Seq]) -> int:
        """How many of the waiting sequences and ``new`` cannot start at the next step (FIFO:
        those from the first that finds no sequence slot or not enough free pages); the ones that
        can start at once do not count against ``max_queue``. Called under the lock."""
        running, reserved = len(self._running), self._reserved
        queue = [*self._waiting, *new]
        for i, s in enumerate(queue):
            if running >= self.max_seqs or reserved + s.pages > self.max_pages:
                return len(queue) - i
            running, reserved = running + 1, reserved + s.pages
        return 0

    def _pages(self, prompt: int, max_tokens: int) -> int:
        return -(-(prompt + max_tokens) // self.cache.page)

    # -- the loop (the scheduler's thread) --------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self._running and not self._waiting:
                        self._cond.wait()
                    if self._stopping:
                        break
                    self._drop_cancelled()
                    self._admit()
                self._step()
        except BaseException as exc:  # a bug: fail every request rather than hang them
            self.failure = exc
            raise
        finally:
            with self._cond:
                self._stopping = True
                waiting = list(self._waiting)
                self._waiting.clear()
            why = "the server is shutting down" if self.failure is None else INTERNAL_ERROR
            for s in waiting:
                self._send(s, Event(finish_reason="error", error=why, prompt_tokens=len(s.tokens)))
                self.metrics.finished("error")
            for s in self._running:
                self._finish(s, "error", why)
            self._sweep()

    def _drop_cancelled(self) -> None:
        for s in [s for s in self._waiting if s.ticket.cancelled]:
            self._waiting.remove(s)
            self.metrics.finished("cancelled")
        for s in self._running:
            if s.ticket.cancelled and s.finish is None:
                s.finish = "cancelled"

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_seqs and self._reserved + self._waiting[0].pages <= self.max_pages:
            s = self._waiting.popleft()
            s.sid = self.cache.add()  # started on the prefix cache's pages at its first chunk
            self._reserved += s.pages
            self._running.append(s)

    def _step(self) -> None:
        budget = self.step_tokens
        for s in self._running:
            if s.prefilled or s.finish is not None:
                continue
            if self.prefix_cache and s.fed == s.cached and not s.scores_prompt:  # none of its own chunks in yet
                self._start_on_prefix(s)
            n = min(self.prefill_chunk - s.fed % self.prefill_chunk, len(s.tokens) - s.fed)  # (chunk boundaries at multiples of prefill_chunk after a prefix-cache hit too)
            if budget < self.step_tokens and n > budget:
                break
            budget -= n
            self._guard(s, self._prefill_chunk, s, n)
        batch = [s for s in self._running if s.prefilled and s.finish is None]
        if batch:
            try:
                self._decode(batch)
            except Exception as exc:
                log.exception("a decode step of %d sequences failed", len(batch))
                for s in batch:
                    self._finish(s, "error", failure_message(exc))
        self._sweep()

    def _guard(self, s: _Seq, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # this request fails; the others go on
            log.exception("request %d failed in %s", s.ticket.id, getattr(fn, "__name__", fn))
            self._finish(s, "error", failure_message(exc))

    def _start_on_prefix(self, s: _Seq) -> None:
        """Start ``s`` on the published pages its prompt begins with, looked up again each step
        until its first chunk goes in (not once at admission): so it finds the pages of the
        requests prefilled before it in the same steps (a system prompt shared by requests that
        arrive together is prefilled once)."""
        assert s.sid is not None
        self.cache.remove(s.sid)
        s.sid = self.cache.add(s.tokens)
        s.fed = s.cached = self.cache.length(s.sid)

    def _prefill_chunk(self, s: _Seq, n: int) -> None:
        assert s.sid is not None
        if s.fed == s.cached:  # its first chunk: what it found is settled
            self.metrics.cached(s.cached)
        start, chunk = s.fed, s.tokens[s.fed : s.fed + n]
        t0 = time.perf_counter()
        kv_len, table = self.cache.step_inputs([s.sid], n)
        logits = self.llm._prefill(np.asarray([chunk], np.int32), logit_rows(n, s.scores_prompt), kv_len, table, *self.llm.kv_args)
        self.cache.advance([s.sid], n)
        s.fed += n
        self.metrics.prefilled(n, time.perf_counter() - t0)
        if self.prefix_cache:  # the full pages fed so far, for the requests after it
            self.cache.publish(s.sid, s.tokens[: s.fed])
        if s.scores_prompt:
            assert s.out.logprobs is not None
            s.prompt_logprobs += prompt_logprobs(self.llm.tokenizer, logits, s.tokens, start, s.out.logprobs)
        if s.prefilled:
            if s.echo is not None:
                self._send(s, Event(s.echo, logprobs=tuple(s.prompt_logprobs)))
            self._pick(s, logits[-1])

    def _decode(self, batch: list[_Seq]) -> None:
        sids = [s.sid for s in batch if s.sid is not None]
        t0 = time.perf_counter()
        kv_len, table = self.cache.step_inputs(sids, 1)
        tokens = np.fromiter((s.out.ids[-1] for s in batch), np.int32, len(batch))
        logits = self.llm._decode(tokens, kv_len, table, *self.llm.kv_args)
        self.cache.advance(sids, 1)
        self.metrics.decoded(len(batch), time.perf_counter() - t0)
        for s, row in zip(batch, logits):
            self._guard(s, self._pick, s, row)

    def _pick(self, s: _Seq, logits: np.ndarray) -> None:
        """Sample ``s``'s next token (``Completion``: the rules of ``LLM.generate``) and send its text."""
        assert s.sid is not None
        made = len(s.out.ids)
        piece = s.out.add(logits, room=self.cache.length(s.sid) + 1 < self.context)  # as the engine: prompt + reply within the context
        if s.first_token_at is None:
            s.first_token_at = time.perf_counter()
            self.metrics.first_token(s.first_token_at - s.submitted)
        self.metrics.generated(len(s.out.ids) - made)
        if s.out.finish is None:
            if piece:  # (the tokens of text held back go with the piece that shows it)
                self._send(s, Event(piece, logprobs=self._logprobs(s)))
            return
        s.finish = s.out.finish
        self._send(s, Event(piece, s.finish, prompt_tokens=len(s.tokens), completion_tokens=len(s.out.ids), cached_tokens=s.cached, logprobs=self._logprobs(s)))

    @staticmethod
    def _logprobs(s: _Seq) -> tuple[TokenLogprob, ...]:
        new = tuple(s.out.token_logprobs[s.logprobs_sent :])
        s.logprobs_sent += len(new)
        return new

    def _send(self, s: _Seq, event: Event) -> None:
        if not event.text and event.finish_reason is None:
            return
        if s.index:
            event = dataclasses.replace(event, index=s.index)
        try:
            s.on_event(event)
        except Exception:  # the receiver is gone: treat it as a cancel
            s.ticket.cancelled = True
            if s.finish is None:
                s.finish = "cancelled"

    def _finish(self, s: _Seq, reason: str, error: str | None = None) -> None:
        s.finish = reason
        self._send(s, Event(finish_reason=reason, error=error, prompt_tokens=len(s.tokens), completion_tokens=len(s.out.ids), cached_tokens=s.cached))

    def _sweep(self) -> None:
        """Free the sequences that finished (or were cancelled) this step."""
        done = [s for s in self._running if s.finish is not None]
        if not done:
            return
        with self._cond:
            for s in done:
                self._running.remove(s)
                self._reserved -= s.pages
                if s.sid is not None:
                    self.cache.remove(s.sid)
                    s.sid = None
                self.metrics.finished(s.finish or "error")

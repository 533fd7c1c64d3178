"""The OpenAI-compatible HTTP API on a ``Scheduler``: a Starlette application.

    POST /v1/chat/completions   POST /v1/completions   (streamed as server-sent events with
                                                        "stream": true, ending in "data: [DONE]")
    GET  /v1/models             GET  /v1/models/{id}   GET  /health   GET  /metrics  (Prometheus text)
    POST /tokenize              POST /detokenize       (vLLM's and llama.cpp's: text <-> the model's token ids)

A request is parsed and tokenized off the event loop (``tilework.serve.protocol``), handed to the
scheduler, and its events come back through an ``asyncio.Queue`` (the scheduler's thread puts
them with ``call_soon_threadsafe``). Every refusal is an OpenAI error body with a 4xx status;
an unexpected failure is a 500 with the same body ("internal error ...": the exception goes to
the log, not to the client), and the server goes on. A client that goes away cancels its
request: a stream notices when it can no longer send (or, with servers that report it, at
once), a plain request polls for the disconnect while it waits.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tilework.serve.protocol import Choice, chunk_body, completion_body, error_body, logprobs_body, new_id, parse_detokenize, parse_request, parse_tokenize
from tilework.serve.scheduler import INTERNAL_ERROR, Event, RequestError, Scheduler, Ticket, failure_message, log
from tilework.serve.tools import ToolSpec, ToolStream, tool_calls_of

__all__ = ["create_app"]

POLL_S = 0.25  # how often a non-streamed request checks for its client's disconnect


def _error(message: str, status: int, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param, code), status_code=status)


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _Stream(StreamingResponse):
    """An event stream whose request is cancelled however the response ends."""

    def __init__(self, body: AsyncIterator[str], ticket: Ticket) -> None:
        super().__init__(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.ticket = ticket
        self.events = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.ticket.cancel()
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                await aclose()


def create_app(scheduler: Scheduler, model_name: str, *, default_max_tokens: int = 256) -> Starlette:
    """The application; the caller starts and stops ``scheduler``."""
    llm = scheduler.llm
    metrics = scheduler.metrics
    started = int(time.time())

    async def generate(request: Request, kind: str) -> Response:
        """``_generate``, counted once in the metrics with the status the client gets (a stream's
        is 200, whatever its events say; 499: the client left first)."""
        status = 500
        try:
            response = await _generate(request, kind)
            status = response.status_code
            return response
        except ClientDisconnect:  # gone while sending its body
            status = 499
            return Response(status_code=499)
        except Exception as exc:  # a bug, not the request's fault: this request fails, the server goes on
            log.exception("%s failed", request.url.path)
            return _error(failure_message(exc), 500)
        finally:
            metrics.request(request.url.path, status)

    async def _generate(request: Request, kind: str) -> Response:
        try:
            raw = await request.body()
            parsed = await run_in_threadpool(parse_request, raw, kind, llm, model_name, default_max_tokens, scheduler.max_sequence)
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue[Event] = asyncio.Queue()

            def deliver(ev: Event) -> None:  # from the scheduler's thread
                loop.call_soon_threadsafe(queue.put_nowait, ev)

            # (in the thread pool too: a batch of prompts makes a sampler, and a grammar's matcher, for each of its sequences)
            ticket = await run_in_threadpool(scheduler.submit_batch, [p.tokens for p in parsed.prompts], parsed.params, deliver, parsed.logprobs,
                                             parsed.n, parsed.echo, [p.text for p in parsed.prompts])
        except RequestError as exc:
            return _error(str(exc), exc.status, exc.param, exc.code)
        rid = new_id(kind)
        if parsed.stream:
            return _Stream(_events(kind, rid, queue, parsed.include_usage, parsed.logprobs is not None, parsed.choices, parsed.n, parsed.tools), ticket)
        try:
            events = await _collect(request, queue, parsed.choices)
        finally:
            ticket.cancel()  # a no-op when it finished; frees the sequences when the client left
        if not events:
            return Response(status_code=499)  # the client is gone; nobody reads this
        failed = next((ev for ev in events if ev.error is not None), None)
        if failed is not None:
            assert failed.error is not None
            return _error(failed.error, 500)
        choices, ends = [], [ev for ev in events if ev.finish_reason is not None]
        for i in range(parsed.choices):
            mine = [ev for ev in events if ev.index == i]
            lp = logprobs_body(kind, [e for ev in mine for e in ev.logprobs]) if parsed.logprobs is not None else None
            text, finish = "".join(ev.text for ev in mine), mine[-1].finish_reason or "stop"
            if parsed.tools is None:
                choices.append(Choice(text, finish, lp))
                continue
            content, calls = tool_calls_of(parsed.tools, text)
            choices.append(Choice(content, "tool_calls" if calls and finish == "stop" else finish, lp, [c.body() for c in calls] or None))
        return JSONResponse(completion_body(kind, rid, model_name, choices, *_usage(ends, parsed.n)))

    async def _events(kind: str, rid: str, queue: asyncio.Queue[Event], include_usage: bool, logprobs: bool, choices: int, n: int,
                      tools: ToolSpec | None = None) -> AsyncIterator[str]:
        if kind == "chat":
            for i in range(choices):
                yield _sse(chunk_body(kind, rid, model_name, None, None, role=True, index=i))
        held = [ToolStream(tools) for _ in range(choices)] if tools is not None else None  # (the text of tool calls held to the end)
        offsets = [0] * choices  # of each choice's chunk text in its completion (completions' text_offset)
        ends: list[Event] = []
        while len(ends) < choices:
            ev = await queue.get()
            if ev.error is not None:
                yield _sse(error_body(ev.error, 500))
                break
            i = ev.index
            text = ev.text if held is None else held[i].push(ev.text)
            if text or ev.logprobs:
                yield _sse(chunk_body(kind, rid, model_name, text, None, logprobs=logprobs_body(kind, ev.logprobs, offsets[i]) if logprobs else None, index=i))
                offsets[i] += sum(len(e.text) for e in ev.logprobs)
            if ev.finish_reason is not None:
                ends.append(ev)
                finish = ev.finish_reason
                if held is not None:
                    rest, calls = held[i].finish()
                    if rest:
                        yield _sse(chunk_body(kind, rid, model_name, rest, None, index=i))
                    if calls:
                        yield _sse(chunk_body(kind, rid, model_name, None, None, index=i, tool_calls=[c.body(j) for j, c in enumerate(calls)]))
                        finish = "tool_calls" if finish == "stop" else finish
                yield _sse(chunk_body(kind, rid, model_name, None if kind == "chat" else "", finish, index=i))
        else:
            if include_usage:
                yield _sse(chunk_body(kind, rid, model_name, None, None, usage_of=_usage(ends, n)))
        yield "data: [DONE]\n\n"

    async def tokenize(request: Request) -> Response:
        try:
            tokens = await run_in_threadpool(parse_tokenize, await request.body(), llm, model_name)
        except RequestError as exc:
            return _error(str(exc), exc.status, exc.param, exc.code)
        return JSONResponse({"count": len(tokens), "max_model_len": llm.config.context_length, "tokens": tokens})

    async def detokenize(request: Request) -> Response:
        try:
            text = await run_in_threadpool(parse_detokenize, await request.body(), llm, model_name)
        except RequestError as exc:
            return _error(str(exc), exc.status, exc.param, exc.code)
        return JSONResponse({"prompt": text})

    async def chat(request: Request) -> Response:
        return await generate(request, "chat")

    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    card = {"id": model_name, "object": "model", "created": started, "owned_by": "tilework", "max_model_len": llm.config.context_length}

    async def models(_request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [card]})

    async def model(request: Request) -> Response:
        asked = request.path_params["model"]
        if asked != model_name:
            return _error(f"the model {asked!r} does not exist: this server has {model_name!r}", 404, "model", "model_not_found")
        return JSONResponse(card)

    async def health(_request: Request) -> Response:
        if not scheduler.alive:
            return _error("the scheduler is not running", 503)
        return JSONResponse({"status": "ok"})

    async def prometheus(_request: Request) -> Response:
        return PlainTextResponse(metrics.render(scheduler.snapshot()), media_type="text/plain; version=0.0.4")

    async def http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(str(exc.detail), exc.status_code)

    async def server_error(_request: Request, exc: Exception) -> Response:
        return _error(INTERNAL_ERROR, 500)  # Starlette then re-raises it, and uvicorn logs it

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})


def _usage(ends: list[Event], n: int) -> tuple[int, int, int]:
    """``(prompt, completion, cached)`` tokens of a request of ``n`` completions a prompt whose
    completions ended with the events ``ends``: each prompt once (its first completion's), every
    completion's tokens."""
    firsts = [ev for ev in ends if ev.index % n == 0]
    return sum(ev.prompt_tokens for ev in firsts), sum(ev.completion_tokens for ev in ends), sum(ev.cached_tokens for ev in firsts)


async def _collect(request: Request, queue: asyncio.Queue[Event], n: int = 1) -> list[Event]:
    """Every event of the request's ``n`` completions (of all its prompts), up to the last
    finish reason or the first error; none when the client disconnected first (checked every
    ``POLL_S``, tokens arriving or not)."""
    events, ended = [], 0
    loop = asyncio.get_running_loop()
    check_at = loop.time() + POLL_S
    while True:
        try:
            ev = await asyncio.wait_for(queue.get(), max(check_at - loop.time(), 0.001))
        except asyncio.TimeoutError:
            ev = None
        if ev is not None:
            events.append(ev)
            ended += ev.finish_reason is not None
            if ended == n or ev.error is not None:
                return events
        if loop.time() >= check_at:
            if await request.is_disconnected():
                return []
            check_at = loop.time() + POLL_S

"""``tilework.serve.scheduler.Scheduler`` without HTTP, on the embedded SmolLM2 (quantized):
requests join a running decode batch, limits queue the rest, chunked prefill gives the tokens of
one prefill, cancels and failures give their pages back, refusals name the field."""

from __future__ import annotations

import json
import queue
import threading
from typing import Iterator

import pytest

from tests.llm.models import needs_smollm2
from tests.long import long_only

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

pytestmark = needs_smollm2

from tilework.llm import LLM, SamplingParams  # noqa: E402
from tilework.serve.protocol import parse_request  # noqa: E402
from tilework.serve.scheduler import Event, RequestError, Scheduler  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=8)
STORY = "Write a short story about a robot who learns to paint. It should be happy and end well, and mention colors."


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(precision="q", kv_tokens=4096)


@pytest.fixture
def make(llm: LLM) -> Iterator[list[Scheduler]]:
    made: list[Scheduler] = []
    yield made
    for s in made:
        s.stop()
    assert llm.cache.sequences() == [] and llm.cache.free_pages == llm.cache.num_pages


def start(made: list[Scheduler], llm: LLM, **kw: int) -> Scheduler:
    s = Scheduler(llm, **kw).start()
    made.append(s)
    return s


class Inbox:
    """Collects a request's events; ``wait()`` gives the text and the last event."""

    def __init__(self, log: list[tuple[int, Event]] | None = None, key: int = 0) -> None:
        self.q: queue.Queue[Event] = queue.Queue()
        self.log, self.key = log, key

    def __call__(self, ev: Event) -> None:
        if self.log is not None:
            self.log.append((self.key, ev))
        self.q.put(ev)

    def wait(self) -> tuple[str, Event]:
        text = ""
        while True:
            ev = self.q.get(timeout=120)
            text += ev.text
            if ev.finish_reason is not None:
                return text, ev


def test_requests_join_the_running_batch_and_queue_beyond_the_limits(llm: LLM, make: list[Scheduler]) -> None:
    """Two sequences at most: the third request waits, joins when the second leaves while the
    first goes on, and each gets the tokens ``LLM.generate`` gives it alone."""
    prompts = ["The capital of France is", "1, 2, 3,", "Hi"]
    params = [GREEDY, SamplingParams(temperature=0, max_tokens=4), SamplingParams(temperature=0, max_tokens=2)]
    want = [llm.generate(p, q, chat=False)[0] for p, q in zip(prompts, params)]
    s = start(make, llm, max_seqs=2)
    log: list[tuple[int, int]] = []  # (request, running sequences) at each event

    def inbox(i: int) -> Inbox:
        box = Inbox()
        s.submit(llm.encode(prompts[i]), params[i], lambda ev: (log.append((i, s.snapshot()["running"])), box(ev)))
        return box

    boxes = [inbox(i) for i in range(3)]
    for i, box in enumerate(boxes):
        text, last = box.wait()
        assert (text, last.completion_tokens, last.finish_reason) == (want[i].text, len(want[i].token_ids), want[i].finish_reason)
    order = [i for i, _ in log]
    assert max(n for _, n in log) == 2
    assert order.index(2) > len(order) - 1 - order[::-1].index(1)  # the third waited for the second
    assert order.index(2) < len(order) - 1 - order[::-1].index(0)  # and joined the first's batch
    assert s.metrics.decode_steps < sum(len(w.token_ids) for w in want)  # steps were shared
    assert s.metrics.outcomes["length"] == 3


def test_chunked_prefill_gives_the_tokens_of_one_prefill(llm: LLM, make: list[Scheduler]) -> None:
    short = SamplingParams(temperature=0, max_tokens=4)
    want = llm.generate(STORY, short)[0]
    llm.cache.forget_prefixes()  # (generate published the prompt's pages)
    s = start(make, llm, prefill_chunk=16, step_tokens=16)
    inbox = Inbox()
    s.submit(llm.encode(llm.prompt_text(STORY)), short, inbox)
    text, last = inbox.wait()
    assert text == want.text and last.prompt_tokens == want.prompt_tokens > 48
    assert s.metrics.prefill_tokens == want.prompt_tokens and last.cached_tokens == 0


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_a_prompt_seen_before_prefills_only_its_new_pages(llm: LLM, make: list[Scheduler], prefix_cache: bool) -> None:
    """The second request starts on the first's published pages (prefilling the rest in chunks
    at the same boundaries) and gets the same tokens; off, it prefills everything again."""
    short = SamplingParams(temperature=0, max_tokens=4)
    llm.cache.forget_prefixes()
    tokens = llm.encode(llm.prompt_text(STORY))
    s = start(make, llm, prefill_chunk=32, step_tokens=32, prefix_cache=prefix_cache)
    got = []
    for prompt in (tokens, tokens, tokens[:40] + tokens[:9]):
        inbox = Inbox()
        s.submit(prompt, short, inbox)
        got.append(inbox.wait())
    (first, a), (second, b), (_, c) = got
    found = (len(tokens) - 1) // llm.cache.page * llm.cache.page if prefix_cache else 0
    assert second == first and (a.cached_tokens, b.cached_tokens, c.cached_tokens) == (0, found, 32 if prefix_cache else 0)
    assert s.metrics.prefill_tokens == len(tokens) + (len(tokens) - b.cached_tokens) + (49 - c.cached_tokens)
    assert s.metrics.cached_tokens == b.cached_tokens + c.cached_tokens
    assert (llm.cache.published_pages > 0) == prefix_cache
    # two requests arriving together: the second finds the pages the first's chunks published
    together = [Inbox(), Inbox()]
    for inbox in together:
        s.submit(tokens[::-1], short, inbox)
    (x, d), (y, e) = (inbox.wait() for inbox in together)
    assert x == y and (d.cached_tokens, e.cached_tokens) == (0, found)


def test_page_limit_queues_and_cancel_frees(llm: LLM, make: list[Scheduler]) -> None:
    """max_pages 3: a request reserving 2 pages runs, the next waits; cancelling both (one
    running, one waiting) frees everything and the next request runs."""
    s = start(make, llm, max_pages=3)
    long = SamplingParams(temperature=0, max_tokens=24)  # 1 + 24 tokens: 2 pages
    first, second = Inbox(), Inbox()
    t1 = s.submit([1], long, first)
    first.q.get(timeout=60)  # running
    t2 = s.submit([2], long, second)
    assert s.snapshot()["waiting"] == 1 and s.snapshot()["reserved_pages"] == 2
    t1.cancel()
    t2.cancel()
    third = Inbox()
    s.submit([3], GREEDY, third)
    assert third.wait()[1].finish_reason == "length"
    assert s.metrics.outcomes["cancelled"] == 2
    snap = s.snapshot()
    assert snap["running"] == snap["reserved_pages"] == snap["used_pages"] == 0


def test_a_receiver_that_fails_cancels_its_request_only(llm: LLM, make: list[Scheduler]) -> None:
    s = start(make, llm)

    def broken(_ev: Event) -> None:
        raise RuntimeError("the client went away")

    s.submit([1, 2], SamplingParams(temperature=0, max_tokens=50), broken)
    ok = Inbox()
    s.submit(llm.encode("Hi"), GREEDY, ok)
    assert ok.wait()[1].finish_reason == "length"
    while s.snapshot()["running"]:
        threading.Event().wait(0.01)
    assert s.metrics.outcomes["cancelled"] == 1


@pytest.mark.parametrize(
    "tokens, params, param, message",
    [
        ([], GREEDY, "prompt", "the prompt is empty"),
        ([1] * 8192, GREEDY, "prompt", "the model's context is 8192"),
        ([1] * 8000, SamplingParams(max_tokens=500), "max_tokens", "at most 192 for this prompt"),
        ([1], SamplingParams(max_tokens=5000), "max_tokens", "need 313 KV-cache pages; the server has 256"),
        ([1, 10**6], GREEDY, "prompt", r"token id 1000000 \(token 1\) is outside the vocabulary"),
    ],
)
def test_refusals_name_the_field(llm: LLM, make: list[Scheduler], tokens: list[int], params: SamplingParams, param: str, message: str) -> None:
    s = start(make, llm)
    with pytest.raises(RequestError, match=message) as info:
        s.submit(tokens, params, Inbox())
    assert info.value.param == param and info.value.status == 400


@pytest.fixture(scope="module")
def full() -> LLM:
    """An engine whose KV pool holds a whole context (8192 tokens) for one sequence."""
    return LLM(precision="q", kv_tokens=8192)


def test_a_request_may_fill_the_context_exactly(full: LLM) -> None:
    """The server's cap on max_tokens is exactly ``context - prompt``: an 8190-token prompt may
    ask for 2 tokens and not 3, and gets 2 when it gives no max_tokens."""
    s = Scheduler(full)  # not started: the checks only
    assert s.max_sequence == s.context == 8192
    s.submit([1] * 8190, SamplingParams(max_tokens=2), Inbox())
    with pytest.raises(RequestError, match="exceed the model's context of 8192 \\(at most 2 for this prompt\\)"):
        s.submit([1] * 8190, SamplingParams(max_tokens=3), Inbox())
    with pytest.raises(RequestError, match="the prompt has 8192 tokens"):
        s.submit([1] * 8192, SamplingParams(max_tokens=1), Inbox())
    body = json.dumps({"prompt": [1] * 8190}).encode()
    assert parse_request(body, "completion", full, "m", 256, s.max_sequence).params.max_tokens == 2
    s.stop()


@long_only("prefills 8190 tokens (about 40 s on two cores)")
def test_a_request_at_the_context_edge_generates_context_minus_prompt_tokens(full: LLM, make: list[Scheduler]) -> None:
    s = Scheduler(full).start()
    make.append(s)
    params = parse_request(json.dumps({"prompt": [1] * 8190, "temperature": 0}).encode(), "completion", full, "m", 256, s.max_sequence).params
    inbox = Inbox()
    s.submit([1] * 8190, params, inbox)
    last = inbox.wait()[1]
    assert (last.completion_tokens, last.finish_reason) == (2, "length")
    s.stop()
    assert full.cache.sequences() == []


@pytest.mark.parametrize("limits, params", [(dict(max_seqs=2), GREEDY), (dict(max_pages=3), SamplingParams(temperature=0, max_tokens=24))])
def test_a_full_queue_refuses_with_429_counting_only_requests_that_cannot_start(llm: LLM, limits: dict[str, int], params: SamplingParams) -> None:
    """max_queue 1 beside room for two requests (two sequences, or 3 pages where each reserves 2):
    the requests that can start at once do not count against the queue, even when they arrive
    before the scheduler's next step (not started here: every request stays where it is)."""
    s = Scheduler(llm, max_queue=1, **limits)
    starts = 2 if "max_seqs" in limits else 1
    for _ in range(starts + 1):
        s.submit([1], params, Inbox())
    with pytest.raises(RequestError, match=r"the queue of requests waiting for room is full \(max_queue=1\)") as info:
        s.submit([1], params, Inbox())
    assert info.value.status == 429
    s.stop()
    assert llm.cache.sequences() == []


def test_limits_are_checked(llm: LLM) -> None:
    with pytest.raises(Exception, match="max_seqs=17"):
        Scheduler(llm, max_seqs=17)
    with pytest.raises(Exception, match="max_pages=0"):
        Scheduler(llm, max_pages=0)
    with pytest.raises(Exception, match="max_queue=0"):
        Scheduler(llm, max_queue=0)

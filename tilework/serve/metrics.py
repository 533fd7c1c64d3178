"""The server's figures in the Prometheus text format (``GET /metrics``).

Counters only grow (``_total``); gauges are the value of the moment; the time to first token is
a histogram (cumulative ``_bucket{le=...}``, ``_sum``, ``_count``), measured from the request's
arrival at the scheduler to its first sampled token, so it includes the time spent queued.
``tilework_decode_tokens_per_second`` is the decode throughput of the last
``WINDOW_S`` seconds: tokens the decode steps produced over the time they took.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Mapping

__all__ = ["ServeMetrics", "parse_metrics", "TTFT_BUCKETS", "WINDOW_S"]

TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WINDOW_S = 10.0


class ServeMetrics:
    """Thread-safe counters of a server; ``render`` writes them out."""

    def __init__(self, kv_pages: int) -> None:
        self.kv_pages = kv_pages
        self._lock = threading.Lock()
        self.http: collections.Counter[tuple[str, int]] = collections.Counter()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.requests = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefill_tokens = 0
        self.cached_tokens = 0
        self.prefill_s = 0.0
        self.decode_steps = 0
        self.decode_tokens = 0
        self.decode_s = 0.0
        self.ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0
        self._window: collections.deque[tuple[float, int, float]] = collections.deque()

    # -- updates -----------------------------------------------------------------------------------

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.http[endpoint, status] += 1

    def submitted(self, prompt_tokens: int, n: int = 1) -> None:
        """A request of ``n`` completions: ``n`` sequences, each counted as a request (and
        finished on its own), its prompt tokens once."""
        with self._lock:
            self.requests += n
            self.prompt_tokens += prompt_tokens

    def cached(self, tokens: int) -> None:
        with self._lock:
            self.cached_tokens += tokens

    def prefilled(self, tokens: int, seconds: float) -> None:
        with self._lock:
            self.prefill_tokens += tokens
            self.prefill_s += seconds

    def decoded(self, tokens: int, seconds: float) -> None:
        now = time.monotonic()
        with self._lock:
            self.decode_steps += 1
            self.decode_tokens += tokens
            self.decode_s += seconds
            self._window.append((now, tokens, seconds))
            self._trim(now)

    def generated(self, tokens: int) -> None:
        with self._lock:
            self.generation_tokens += tokens

    def first_token(self, seconds: float) -> None:
        with self._lock:
            i = next((i for i, le in enumerate(TTFT_BUCKETS) if seconds <= le), len(TTFT_BUCKETS))
            self.ttft_counts[i] += 1
            self.ttft_sum += seconds

    def finished(self, reason: str) -> None:
        with self._lock:
            self.outcomes[reason] += 1

    def _trim(self, now: float) -> None:
        while self._window and self._window[0][0] < now - WINDOW_S:
            self._window.popleft()

    def decode_tokens_per_s(self) -> float:
        with self._lock:
            self._trim(time.monotonic())
            seconds = sum(w[2] for w in self._window)
            return sum(w[1] for w in self._window) / seconds if seconds > 0 else 0.0

    # -- output ------------------------------------------------------------------------------------

    def render(self, live: Mapping[str, int]) -> str:
        """The text of ``/metrics``; ``live`` is ``Scheduler.snapshot()``."""
        rate = self.decode_tokens_per_s()
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{name}{labels} {_num(value)}" for labels, value in samples)

        with self._lock:
            http = sorted(self.http.items())
            metric("tilework_http_requests_total", "counter", "HTTP requests by endpoint and status code.",
                   [(f'{{endpoint="{e}",status="{s}"}}', n) for (e, s), n in http])
            metric("tilework_requests_total", "counter", "Generation requests accepted by the scheduler (a request of n completions counts n).", [("", self.requests)])
            metric("tilework_requests_finished_total", "counter", "Generation requests that ended, by reason (stop, length, cancelled, error).",
                   [(f'{{reason="{r}"}}', n) for r, n in sorted(self.outcomes.items())])
            metric("tilework_prompt_tokens_total", "counter", "Prompt tokens of the accepted requests (tokens in).", [("", self.prompt_tokens)])
            metric("tilework_generation_tokens_total", "counter", "Tokens generated (tokens out).", [("", self.generation_tokens)])
            metric("tilework_prefill_tokens_total", "counter", "Prompt tokens fed to the model.", [("", self.prefill_tokens)])
            metric("tilework_prefix_cache_tokens_total", "counter", "Prompt tokens found in the prefix cache (not fed again).", [("", self.cached_tokens)])
            metric("tilework_prefill_seconds_total", "counter", "Time spent in prefill calls.", [("", self.prefill_s)])
            metric("tilework_decode_steps_total", "counter", "Batched decode steps.", [("", self.decode_steps)])
            metric("tilework_decode_tokens_total", "counter", "Tokens computed by the decode steps (batch size summed over steps).", [("", self.decode_tokens)])
            metric("tilework_decode_seconds_total", "counter", "Time spent in decode steps.", [("", self.decode_s)])
            cumulative, samples = 0, list[tuple[str, float]]()
            for le, n in zip((*map(str, TTFT_BUCKETS), "+Inf"), self.ttft_counts):
                cumulative += n
                samples.append((f'_bucket{{le="{le}"}}', cumulative))
            samples += [("_sum", self.ttft_sum), ("_count", cumulative)]
            out.append("# HELP tilework_time_to_first_token_seconds From a request's arrival to its first token (queueing included).")
            out.append("# TYPE tilework_time_to_first_token_seconds histogram")
            out.extend(f"tilework_time_to_first_token_seconds{labels} {_num(v)}" for labels, v in samples)
        metric("tilework_decode_tokens_per_second", "gauge", f"Decode throughput over the last {WINDOW_S:g} s.", [("", rate)])
        metric("tilework_queue_depth", "gauge", "Requests waiting for admission.", [("", live["waiting"])])
        metric("tilework_running_sequences", "gauge", "Sequences being prefilled or decoded.", [("", live["running"])])
        metric("tilework_kv_pages_used", "gauge", "KV-cache pages holding tokens.", [("", live["used_pages"])])
        metric("tilework_kv_pages_published", "gauge", "KV-cache pages findable by the prefix cache (in use or kept among the free).", [("", live["published_pages"])])
        metric("tilework_kv_pages_reserved", "gauge", "KV-cache pages reserved by running sequences (their worst case).", [("", live["reserved_pages"])])
        metric("tilework_kv_pages_total", "gauge", "KV-cache pages in the pool.", [("", self.kv_pages)])
        return "\n".join(out) + "\n"


def _num(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def parse_metrics(text: str) -> dict[str, float]:
    """``name{labels} -> value`` of a ``/metrics`` text (for tests and the benchmark)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out

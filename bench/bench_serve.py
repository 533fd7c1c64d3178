"""A bounded load test of ``tilework serve`` on loopback, side by side with llama-cpp-python's
server on the same GGUF (the embedded SmolLM2-135M-Instruct, Q4_1).

Each server runs as its own process (``python -m tilework serve``, ``python -m llama_cpp.server``,
2 threads each), and this script is the clients: for each concurrency level (default 1, 4, 16)
that many threads each send ``--requests`` streaming ``/v1/completions`` requests one after the
other (greedy, ``max_tokens`` = ``--max-tokens``, prompts that continue for long) with the
official ``openai`` client, and time every streamed chunk. Reported per level:

- throughput: completion tokens of all requests / wall time of the level (tokens/s);
- TTFT p50/p99: from sending a request to its first text chunk;
- ITL p50/p99: gaps between consecutive text chunks of a request (inter-token latency);
- ok / failed: every request either completes or fails with an error (nothing hangs: each has a
  timeout), so ok + failed = the requests sent; and the tokens received against those asked for
  (fewer when a request meets end of text, or is cut short by the server).

Then the 16-client throughput over the 1-client one, and for tilework also the aggregate decode
throughput (tokens the decode steps produced over their time, from its ``/metrics``) at 16
clients over 1. The run stops by itself: a fixed number of
requests, and both servers are stopped at the end (also on Ctrl-C or an error).

    python bench/bench_serve.py [--levels 1,4,16] [--requests 2] [--max-tokens 32]
                                [--threads 2] [--no-llama-cpp] [--json out.json]

The machine may be shared with other work: compare the two servers within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from report import emit

THREADS = 2
PROMPTS = [
    "1, 2, 3, 4, 5,",
    "Once upon a time, in a small village by the sea,",
    "The history of the Roman Empire begins",
    "Here is a list of fruits: apple, banana,",
    "def fibonacci(n):",
    "The best way to learn a new language is",
    "In physics, energy is",
    "Monday, Tuesday, Wednesday,",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    threads: int = THREADS
    proc: subprocess.Popen[bytes] | None = None
    log: Any = None
    model: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float) -> None:
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads))
        self.log = tempfile.TemporaryFile()  # not a pipe: a server that logs much would block on a full one
        self.proc = subprocess.Popen(self.argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log.read().decode(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2) as r:
                    self.model = json.loads(r.read())["data"][0]["id"]
                    return
            except OSError:
                time.sleep(0.25)
        raise RuntimeError(f"{self.name} did not answer within {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Result:
    ok: int = 0
    failed: int = 0
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def one_request(client: Any, model: str, prompt: str, max_tokens: int, out: Result) -> None:
    t0 = time.perf_counter()
    times: list[float] = []
    tokens = None
    try:
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                times.append(time.perf_counter())
            if getattr(chunk, "usage", None) is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as exc:  # counted, never lost
        with out.lock:
            out.failed += 1
            out.errors.append(f"{type(exc).__name__}: {exc}"[:200])
        return
    with out.lock:
        out.ok += 1
        out.tokens += tokens if tokens is not None else len(times)
        if times:
            out.ttft.append(times[0] - t0)
            out.itl.extend(b - a for a, b in zip(times, times[1:]))


def run_level(server: Server, clients: int, requests: int, max_tokens: int, timeout: float) -> Result:
    import openai

    out = Result()
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=timeout)

    def worker(i: int) -> None:
        for k in range(requests):
            one_request(client, server.model, PROMPTS[(i + k) % len(PROMPTS)], max_tokens, out)

    out.wall = run_clients(clients, worker)
    return out


def llama_cpp_server(model: str, threads: int, context: int) -> list[Server]:
    """llama-cpp-python's server on ``model`` (a list of one), or none where it is not installed
    (said on stderr)."""
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as exc:
        print(f"llama-cpp-python's server is not available ({exc}): pip install 'tilework[bench]'", file=sys.stderr)
        return []
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_threads", str(threads), "--n_threads_batch", str(threads),
            "--n_ctx", str(context), "--host", "127.0.0.1", "--interrupt_requests", "False"]  # else a new request cuts the running one short
    return [Server("llama.cpp", argv, free_port(), threads)]


def run_clients(clients: int, work: Callable[[int], None]) -> float:
    """``work(i)`` for every client ``i``, each in a thread, all at once; the wall seconds until
    the last is done."""
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def server_metrics(server: Server) -> dict[str, float]:
    """The values of the server's ``/metrics`` (``tilework.serve.metrics.parse_metrics``); empty
    for a server without them."""
    from tilework.serve.metrics import parse_metrics

    try:
        with urllib.request.urlopen(server.url.replace("/v1", "/metrics"), timeout=10) as r:
            return parse_metrics(r.read().decode())
    except OSError:
        return {}


def decode_counters(server: Server) -> tuple[float, float] | None:
    """tilework's ``(decode tokens, decode seconds)`` counters from ``/metrics`` (None for a
    server without them)."""
    values = server_metrics(server)
    if "tilework_decode_tokens_total" not in values:
        return None
    return values["tilework_decode_tokens_total"], values["tilework_decode_seconds_total"]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(98, max(0, round(q) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,4,16", help="concurrent clients per level (default 1,4,16)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per level (default 2)")
    ap.add_argument("--max-tokens", type=int, default=32, help="max_tokens of each request (default 32)")
    ap.add_argument("--model", help="a GGUF file (default: the embedded SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="only tilework's server")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for a server to start and for one request (default 600)")
    ap.add_argument("--threads", type=int, default=THREADS, help=f"threads of each server (default {THREADS})")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.model is None:
        from tilework.llm.engine import default_model_path

        args.model = default_model_path()
    kv_tokens = max(4096, max(levels) * (64 + args.max_tokens) * 2)
    seqs = min(max(levels), 16)
    servers = [Server("tilework", [sys.executable, "-m", "tilework", "serve", args.model, "--max-seqs", str(seqs), "--kv-tokens", str(kv_tokens)], free_port(), args.threads)]
    if not args.no_llama_cpp:
        servers += llama_cpp_server(args.model, args.threads, 4096)
    figures: dict[str, dict[int, dict[str, float]]] = {}
    for server in servers:
        server.argv += ["--port", str(server.port)]
        print(f"starting {server.name} ...", file=sys.stderr, flush=True)
        try:
            server.start(args.timeout)
            run_level(server, 1, 1, 4, args.timeout)  # warm-up
            figures[server.name] = {}
            for n in levels:
                before = decode_counters(server)
                r = run_level(server, n, args.requests, args.max_tokens, args.timeout)
                after = decode_counters(server)
                row = {"throughput": r.tokens / r.wall, "ttft_p50": pct(r.ttft, 50), "ttft_p99": pct(r.ttft, 99), "itl_p50": pct(r.itl, 50),
                       "itl_p99": pct(r.itl, 99), "ok": r.ok, "failed": r.failed, "sent": n * args.requests, "tokens": r.tokens, "wall_s": r.wall,
                       "decode_tok_s": (after[0] - before[0]) / (after[1] - before[1]) if before and after and after[1] > before[1] else float("nan")}
                figures[server.name][n] = row
                print(f"{server.name:9s} {n:3d} clients: {row['throughput']:7.1f} tok/s, TTFT p50 {1e3 * row['ttft_p50']:7.0f} ms p99 {1e3 * row['ttft_p99']:7.0f} ms,"
                      f" ITL p50 {1e3 * row['itl_p50']:6.1f} ms p99 {1e3 * row['itl_p99']:6.1f} ms, ok {r.ok}/{n * args.requests}"
                      + (f" ({r.errors[0]})" if r.errors else ""), file=sys.stderr, flush=True)
        finally:
            server.stop()
    out = [f"{args.max_tokens} tokens per request, {args.requests} request(s) per client, greedy, {args.threads} thread(s) per server; {os.path.basename(args.model)}", ""]
    out.append("| server | clients | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | ok / sent | tokens / asked |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, rows in figures.items():
        for n, row in rows.items():
            out.append(f"| {name} | {n} | {row['throughput']:.1f} | {1e3 * row['ttft_p50']:.0f} | {1e3 * row['ttft_p99']:.0f} | {1e3 * row['itl_p50']:.1f}"
                       f" | {1e3 * row['itl_p99']:.1f} | {row['ok']} / {row['sent']} | {row['tokens']} / {row['sent'] * args.max_tokens} |")
    out.append("")
    for name, rows in figures.items():
        if 1 in rows and max(levels) in rows and max(levels) > 1 and rows[1]["throughput"] > 0:
            out.append(f"- {name}: {max(levels)} clients / 1 client throughput = {rows[max(levels)]['throughput'] / rows[1]['throughput']:.2f}x")
            top, one = rows[max(levels)]["decode_tok_s"], rows[1]["decode_tok_s"]
            if top == top and one == one:  # not NaN: the server reports its decode steps
                out.append(f"- {name}: decode tokens/s during decode steps (its /metrics): {one:.1f} at 1 client, {top:.1f} at {max(levels)} = {top / one:.2f}x")
    if "tilework" in figures and "llama.cpp" in figures:
        for n in levels:
            a, b = figures["tilework"].get(n), figures["llama.cpp"].get(n)
            if a and b and b["throughput"] > 0:
                out.append(f"- {n} clients: tilework / llama.cpp throughput = {a['throughput'] / b['throughput']:.2f}x")
    print("\n" + "\n".join(out))
    emit("serve", "\n".join(out))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=1)
    lost = sum(row["sent"] - row["ok"] - row["failed"] for rows in figures.values() for row in rows.values())
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())

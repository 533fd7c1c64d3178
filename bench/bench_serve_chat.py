"""Multi-turn chats against ``tilework serve`` with its prefix cache on and off, side by side with
llama-cpp-python's server on the same GGUF (the embedded SmolLM2-135M-Instruct, Q4_1).

Each of ``C`` clients (the levels, default 1 and 4) holds a conversation of ``--turns`` turns
through ``/v1/chat/completions`` (streamed, greedy, ``max_tokens`` = ``--max-tokens``): one long
system prompt for all of them (an assistant's instructions, about ``--system-tokens`` tokens:
what a deployment behind an API shares between its users), then questions of its own. Each turn
sends the whole conversation so far, as OpenAI clients do, and appends the reply. Reported per
server and level: the time to first token (TTFT) of the first turns and of the later ones (p50,
p99), the level's wall time, and for tilework the prompt tokens it prefilled and those it found
in its prefix cache (from ``/metrics``).

The servers, each a process of its own with ``--threads`` threads: tilework (prefix cache on:
the default), tilework ``--no-prefix-cache`` (every prompt prefilled whole), and llama-cpp-python's
server (one sequence at a time; its model reuses the keys and values of the longest common
prefix with the prompt it ran before).

    python bench/bench_serve_chat.py [--levels 1,4] [--turns 4] [--max-tokens 24]
                                     [--system-tokens 600] [--threads 2] [--no-llama-cpp]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench_serve import THREADS, Server, free_port, llama_cpp_server, pct, run_clients, server_metrics
from report import emit

ITEMS = ["apples", "bananas", "carrots", "dates", "eggs", "flour", "grapes", "honey", "ice cream", "jam", "kale", "lemons",
         "mangoes", "noodles", "oats", "pears", "quinoa", "rice", "spinach", "tomatoes", "yogurt", "walnuts", "zucchini", "bread"]
TOPICS = ["a fruit salad", "a soup for a cold day", "a breakfast for two", "a cake for a birthday", "a picnic", "a quick lunch",
          "a vegetarian dinner", "a snack for children"]
FOLLOW_UPS = ["Which of those is the cheapest?", "How long does it take to prepare?", "Can you make it without sugar?",
              "What should I buy first?", "Thank you. Anything else I need?"]


def system_prompt(tokens: int, store: int) -> str:
    """An assistant's instructions of about ``tokens`` tokens (SmolLM2's tokenizer: ~27 a rule),
    for store number ``store`` (its first tokens: each level's prompts share nothing with the
    levels before it)."""
    lines = [f"Store {store}. You are the helpful assistant of a small grocery store. Answer in one or two short sentences and stay friendly."]
    k = 0
    while 27 * len(lines) < tokens:
        item = ITEMS[k % len(ITEMS)]
        lines.append(f"Rule {k + 1}: when a customer asks about {item}, say that {item} are in aisle {k % 9 + 1} and cost {k % 7 + 2} dollars.")
        k += 1
    return "\n".join(lines)


@dataclass
class Level:
    first: list[float] = field(default_factory=list)  # TTFT of the first turns, s
    later: list[float] = field(default_factory=list)  # of the later turns
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def conversation(client: Any, model: str, system: str, i: int, turns: int, max_tokens: int, out: Level) -> None:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": f"I would like to make {TOPICS[i % len(TOPICS)]}. What do I need?"}]
    for turn in range(turns):
        t0 = time.perf_counter()
        first, reply = None, ""
        try:
            for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    first = first or time.perf_counter()
                    reply += chunk.choices[0].delta.content
        except Exception as exc:  # counted, never lost
            with out.lock:
                out.failed += turns - turn
                out.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        with out.lock:
            out.ok += 1
            if first is not None:
                (out.first if turn == 0 else out.later).append(first - t0)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": FOLLOW_UPS[(i + turn) % len(FOLLOW_UPS)]}]


def run_level(server: Server, clients: int, system: str, turns: int, max_tokens: int, timeout: float) -> Level:
    import openai

    out = Level()
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=timeout)
    out.wall = run_clients(clients, lambda i: conversation(client, server.model, system, i, turns, max_tokens, out))
    return out


def counters(server: Server) -> dict[str, float]:
    """tilework's prompt counters from ``/metrics`` (empty for a server without them)."""
    values = server_metrics(server)
    return {k: values[f"tilework_{k}_total"] for k in ("prompt_tokens", "prefill_tokens", "prefix_cache_tokens") if f"tilework_{k}_total" in values}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,4", help="concurrent conversations per level (default 1,4)")
    ap.add_argument("--turns", type=int, default=4, help="turns of each conversation (default 4)")
    ap.add_argument("--max-tokens", type=int, default=24, help="max_tokens of each turn (default 24)")
    ap.add_argument("--system-tokens", type=int, default=600, help="about how many tokens the shared system prompt has (default 600)")
    ap.add_argument("--model", help="a GGUF file (default: the embedded SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="only tilework's servers")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for a server to start and for one request (default 600)")
    ap.add_argument("--threads", type=int, default=THREADS, help=f"threads of each server (default {THREADS})")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.model is None:
        from tilework.llm.engine import default_model_path

        args.model = default_model_path()
    context = args.system_tokens + 30 + args.turns * (args.max_tokens + 40) + 256
    kv_tokens = max(8192, max(levels) * context * 2)
    seqs = str(min(max(levels), 16))
    tilework = [sys.executable, "-m", "tilework", "serve", args.model, "--max-seqs", seqs, "--kv-tokens", str(kv_tokens)]
    servers = [Server("tilework", tilework, free_port(), args.threads), Server("tilework, no prefix cache", [*tilework, "--no-prefix-cache"], free_port(), args.threads)]
    if not args.no_llama_cpp:
        servers += llama_cpp_server(args.model, args.threads, max(4096, context))
    rows: list[tuple[str, int, Level, dict[str, float]]] = []
    for server in servers:
        server.argv += ["--port", str(server.port)]
        print(f"starting {server.name} ...", file=sys.stderr, flush=True)
        try:
            server.start(args.timeout)
            run_level(server, 1, "Be brief.", 1, 4, args.timeout)  # warm-up: another system prompt, nothing of the runs cached
            for n in levels:
                before = counters(server)
                r = run_level(server, n, system_prompt(args.system_tokens, n), args.turns, args.max_tokens, args.timeout)
                after = counters(server)
                fed = {k: after[k] - before.get(k, 0.0) for k in after}
                rows.append((server.name, n, r, fed))
                print(f"{server.name:26s} {n:2d} clients: TTFT first turns p50 {1e3 * pct(r.first, 50):6.0f} ms, later p50 {1e3 * pct(r.later, 50):6.0f}"
                      f" ms p99 {1e3 * pct(r.later, 99):6.0f} ms, wall {r.wall:.1f} s, ok {r.ok}/{n * args.turns} {fed}"
                      + (f" ({r.errors[0]})" if r.errors else ""), file=sys.stderr, flush=True)
        finally:
            server.stop()
    out = [f"{args.turns} turns per conversation, a shared system prompt of {args.system_tokens} tokens or so, {args.max_tokens} tokens a reply,"
           f" greedy, streamed; {args.threads} thread(s) per server; {os.path.basename(args.model)}; the server's level runs start with its"
           " prefix cache holding none of them", ""]
    out.append("| server | clients | TTFT p50 ms, first turns | TTFT p50 ms, later turns | TTFT p99 ms, later turns | wall s | ok / sent | prompt tokens: sent / prefilled / from the prefix cache |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, n, r, fed in rows:
        tokens = f"{fed['prompt_tokens']:.0f} / {fed['prefill_tokens']:.0f} / {fed.get('prefix_cache_tokens', 0):.0f}" if "prefill_tokens" in fed else "-"
        out.append(f"| {name} | {n} | {1e3 * pct(r.first, 50):.0f} | {1e3 * pct(r.later, 50):.0f} | {1e3 * pct(r.later, 99):.0f} | {r.wall:.1f}"
                   f" | {r.ok} / {n * args.turns} | {tokens} |")
    out.append("")
    by = {(name, n): r for name, n, r, _ in rows}
    for n in levels:
        on, off, cpp = by.get(("tilework", n)), by.get(("tilework, no prefix cache", n)), by.get(("llama.cpp", n))
        if on and off and on.later:
            out.append(f"- {n} client(s): later turns' TTFT p50 without / with the prefix cache = {pct(off.later, 50) / pct(on.later, 50):.2f}x;"
                       f" wall {off.wall / on.wall:.2f}x")
        if on and cpp and on.later and cpp.later:
            out.append(f"- {n} client(s): later turns' TTFT p50 llama.cpp / tilework = {pct(cpp.later, 50) / pct(on.later, 50):.2f}x; wall {cpp.wall / on.wall:.2f}x")
    print("\n" + "\n".join(out))
    emit("serve-chat", "\n".join(out))
    lost = sum(n * args.turns - r.ok - r.failed for _, n, r, _ in rows)
    return 1 if lost or any(r.failed for _, _, r, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

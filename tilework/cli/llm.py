"""``tilework generate``, ``tilework chat``, ``tilework perplexity`` and ``tilework serve``: the
embedded LLM (or a GGUF / transformers model) from the command line, and as an
OpenAI-compatible server (tilework.serve).

The generated text goes to stdout as it is made; progress (the first start compiles the model
once for this machine) and the statistics line (prefill time, decode tokens/s) go to stderr.
"""

from __future__ import annotations

import argparse
import io
import sys
import threading
import time
from typing import Any, Callable, TextIO

from tilework.errors import TileworkError

PRECISION_NAMES = {"q": "q", "bf16": "bf16", "fp32": "fp32"}
KV_DTYPE_CHOICES = ("bfloat16", "float16", "float32", "int8")  # tilework.llm.kv_cache.KV_DTYPES
KV_DTYPE_HELP = "the KV cache's keys and values (default: bfloat16 for q and bf16, float32 for fp32; int8: quantized, a scale a key and a value, half bfloat16's memory)"
RUNTIMES = ("native", "vm")  # tilework.llm.engine.RUNTIMES
RUNTIME_HELP = "native: prefill and decode as compiled graph code (default; built once, ~2 s); vm: on the Python VM (same results)"


def add_parsers(sub: Any) -> None:
    g = sub.add_parser("generate", help="complete a prompt with an LLM (default: the embedded SmolLM2-135M-Instruct)", description="Stream an LLM's completion of PROMPT to stdout; the statistics line goes to stderr.")
    g.add_argument("prompt", help="the prompt (a chat model gets it as a user message through its chat template unless --raw)")
    _model_args(g)
    g.add_argument("--max-tokens", type=int, default=256, metavar="N", help="most tokens to generate (default 256)")
    g.add_argument("--raw", action="store_true", help="send the prompt as it is, without the chat template (and so without --system)")

    c = sub.add_parser("chat", help="an interactive chat with an LLM (history kept in the KV cache)", description="Chat on stdin/stdout: type a message and Enter; /reset starts over, /exit or /quit (or end of input) quits, /help lists the commands (a line that is one word starting with / is a command, in any case). A message that fails (past the context, a full KV cache) gets an error line and is left out of the history; the chat goes on.")
    _model_args(c)
    c.add_argument("--max-tokens", type=int, default=512, metavar="N", help="most tokens per reply (default 512)")

    x = sub.add_parser("perplexity", help="an LLM's perplexity on a text file (how well it predicts the text; lower is better)",
                       description="Print the perplexity of FILE's text under the model (exp of the mean negative log-likelihood of each token after the first), scored in windows of --context tokens overlapping by half; progress goes to stderr.")
    x.add_argument("file", metavar="FILE", help="a UTF-8 text file ('-': standard input)")
    _model_only_args(x)
    x.add_argument("--context", type=int, metavar="N", help="tokens per window (default: the model's context, at most 2048)")
    x.add_argument("--no-cache", action="store_true", help="compile the model again instead of loading it from the cache")
    x.add_argument("--runtime", choices=RUNTIMES, default="native", help=RUNTIME_HELP)

    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching (default: the embedded SmolLM2-135M-Instruct)",
                       description="Serve POST /v1/chat/completions and /v1/completions (streamed or not), GET /v1/models, /health and /metrics (Prometheus). See docs/serve.md.")
    s.add_argument("model", nargs="?", metavar="MODEL", help="a .gguf file, or a transformers checkpoint directory (default: the embedded SmolLM2-135M-Instruct)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    s.add_argument("--precision", choices=tuple(PRECISION_NAMES), default="q", help="q: the file's quantized blocks (default); bf16; fp32")
    s.add_argument("--kv-dtype", choices=KV_DTYPE_CHOICES, help=KV_DTYPE_HELP)
    s.add_argument("--name", metavar="ID", help="the model id the API shows and expects (default: the file name without .gguf)")
    s.add_argument("--max-seqs", type=int, default=16, metavar="N", help="most sequences decoded together; more requests wait in the queue (default 16)")
    s.add_argument("--kv-tokens", type=int, default=32768, metavar="N", help="KV-cache size in tokens, all sequences together; a request reserves prompt + max_tokens (default 32768)")
    s.add_argument("--max-tokens", type=int, default=256, metavar="N", help="max_tokens of a request that gives none, capped by the room its prompt leaves in the context and the KV cache (default 256)")
    s.add_argument("--prefill-chunk", type=int, default=256, metavar="N", help="prompts are fed in chunks of N tokens between decode steps (default 256)")
    s.add_argument("--max-queue", type=int, default=1024, metavar="N", help="most requests waiting for room (a sequence or KV pages; those that can start at once do not count); more get 429 (default 1024)")
    s.add_argument("--no-prefix-cache", action="store_true", help="prefill every prompt whole (by default a prompt starts on the KV pages of an earlier one it begins with: the same tokens, less prefill)")
    s.add_argument("--no-cache", action="store_true", help="compile the model again instead of loading it from the cache")
    s.add_argument("--runtime", choices=RUNTIMES, default="native", help=RUNTIME_HELP)


def _model_only_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", help="a .gguf file, or a transformers checkpoint directory (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--precision", choices=tuple(PRECISION_NAMES), default="q", help="q: the file's quantized blocks, dequantized inside the kernels (default; a float checkpoint's matrices stay in its float format: q quantizes nothing); bf16; fp32")
    p.add_argument("--kv-dtype", choices=KV_DTYPE_CHOICES, help=KV_DTYPE_HELP)


def _model_args(p: argparse.ArgumentParser) -> None:
    _model_only_args(p)
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature; 0 is greedy (default 0.7)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the K most likely tokens (0: off)")
    p.add_argument("--top-p", type=float, default=0.9, help="sample in the smallest set of tokens whose probability reaches P (1: off; default 0.9)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="penalize tokens already in the text (1: off)")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="lower the logits of tokens already generated by this (-2 to 2; 0: off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="lower the logits of generated tokens by this times their count (-2 to 2; 0: off)")
    p.add_argument("--seed", type=int, help="random seed (the same seed gives the same text)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop when the text contains TEXT (repeatable)")
    p.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS", help="add BIAS (-100 to 100) to token ID's logit (repeatable; -100 all but bans it)")
    p.add_argument("--min-tokens", type=int, default=0, metavar="N", help="generate at least N tokens before an end of sequence may be sampled (default 0)")
    p.add_argument("--ignore-eos", action="store_true", help="never sample an end of sequence: generate --max-tokens tokens (or to a stop string)")
    p.add_argument("--system", metavar="TEXT", help="a system message for the chat template")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="structured output: the text is a JSON object (needs tilework[structured])")
    shape.add_argument("--json-schema", metavar="FILE", help="structured output: the text is JSON that fits the JSON Schema in FILE")
    shape.add_argument("--regex", metavar="PATTERN", help="structured output: the text matches PATTERN whole")
    p.add_argument("--no-cache", action="store_true", help="compile the model again instead of loading it from the cache")
    p.add_argument("--runtime", choices=RUNTIMES, default="native", help=RUNTIME_HELP)


def _params(args: argparse.Namespace) -> Any:
    from tilework.llm.grammar import Grammar
    from tilework.llm.sampling import SamplingParams

    grammar = None
    if args.json:
        grammar = Grammar.json()
    elif args.json_schema is not None:
        grammar = Grammar.json_schema(_read_text(args.json_schema))
    elif args.regex is not None:
        grammar = Grammar.regex(args.regex)
    bias = {}
    for item in args.logit_bias:
        token, _, value = item.partition("=")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise TileworkError(f"--logit-bias takes ID=BIAS (a token id and a number), got {item!r}") from None
    return SamplingParams(args.temperature, args.top_k, args.top_p, args.repetition_penalty, args.max_tokens, tuple(args.stop), args.seed,
                          args.presence_penalty, args.frequency_penalty, grammar, bias, args.min_tokens, args.ignore_eos)


def _read_text(path: str) -> str:
    """The UTF-8 text of the file ``path`` ("-": stdin)."""
    try:
        if path == "-":
            return sys.stdin.buffer.read().decode("utf-8")
        with open(path, "rb") as f:
            return f.read().decode("utf-8")
    except OSError as e:
        raise TileworkError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TileworkError(f"{path} is not UTF-8 text: {e}") from None


class _Progress:
    """Stage lines on stderr with the elapsed time; on a terminal, a live bar (tqdm)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.t0 = time.perf_counter()
        self.bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, message: str) -> None:
        if self.stream.isatty():
            from tqdm import tqdm

            if self.bar is None:
                self.bar = tqdm(total=None, file=self.stream, bar_format="{desc} [{elapsed}]", leave=False)
                self._thread = threading.Thread(target=self._tick, daemon=True)
                self._thread.start()
            self.bar.set_description_str(message)
        else:
            print(f"[{time.perf_counter() - self.t0:5.1f}s] {message}", file=self.stream, flush=True)

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            if self.bar is not None:
                self.bar.refresh()

    def close(self) -> None:
        self._stop.set()
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _load(args: argparse.Namespace) -> Any:
    from tilework.llm.engine import LLM

    progress = _Progress(sys.stderr)
    try:
        return LLM(args.model, PRECISION_NAMES[args.precision], kv_dtype=args.kv_dtype, use_cache=not args.no_cache, progress=progress, runtime=args.runtime)
    finally:
        progress.close()


def generate(args: argparse.Namespace) -> int:
    if args.raw and args.system is not None:
        raise TileworkError("--system goes into the chat template, which --raw leaves out: give one or the other")
    params = _params(args)
    llm = _load(args)
    out = sys.stdout

    def show(_i: int, piece: str) -> None:
        out.write(piece)
        out.flush()

    llm.generate(args.prompt, params, chat=not args.raw, system=args.system, on_text=show)
    out.write("\n")
    out.flush()
    print(llm.stats.line(), file=sys.stderr)
    return 0


CHAT_COMMANDS = "commands: /reset starts over, /exit or /quit quits (or end of input), /help lists them"


def chat(args: argparse.Namespace, read: Callable[[], str] = input) -> int:
    params = _params(args)
    llm = _load(args)
    session = llm.chat(args.system, params)
    if isinstance(sys.stdin, io.TextIOWrapper):  # bytes that are not UTF-8 reach the tokenizer, which names them
        sys.stdin.reconfigure(errors="surrogateescape")
    interactive = sys.stdin.isatty()
    print("chat with the model: /reset starts over, /exit quits, /help lists the commands", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        try:
            line = read()
        except EOFError:
            break
        text = line.strip()
        if not text:
            continue
        command = text.lower() if text.startswith("/") and len(text.split()) == 1 else None  # a message is never one /word
        if command in ("/exit", "/quit"):
            break
        if command == "/reset":
            session.close()
            session = llm.chat(args.system, params)
            print("(history cleared)", file=sys.stderr)
            continue
        if command is not None:
            print(("" if command == "/help" else f"unknown command {text}; ") + CHAT_COMMANDS, file=sys.stderr)
            continue
        shown: list[str] = []

        def show(piece: str) -> None:
            shown.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()

        try:
            session.send(text, on_text=show)
        except TileworkError as e:  # the turn is undone; the session goes on
            if shown:
                sys.stdout.write("\n")
                sys.stdout.flush()
            print(f"error: {e}\n(this message is not in the history; /reset starts over)", file=sys.stderr)
            continue
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(llm.stats.line(), file=sys.stderr)
    session.close()
    return 0


def serve(args: argparse.Namespace) -> int:
    from tilework.serve.server import listen
    from tilework.serve.server import serve as run_server

    if not 0 <= args.port <= 65535:
        raise TileworkError(f"--port must be in 0..65535, got {args.port}")
    if args.name is not None and not args.name.strip():
        raise TileworkError(f"--name must not be empty, got {args.name!r} (leave it out to use the file's name)")
    for flag in ("max_seqs", "kv_tokens", "prefill_chunk", "max_queue"):
        if getattr(args, flag) < 1:
            raise TileworkError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    sock = listen(args.host, args.port)  # a taken port or a wrong --host fails now, not after the model loads
    try:
        from tilework.llm.engine import LLM

        progress = _Progress(sys.stderr)
        try:
            llm = LLM(args.model, PRECISION_NAMES[args.precision], max_batch=max(16, args.max_seqs), kv_tokens=args.kv_tokens, kv_dtype=args.kv_dtype, use_cache=not args.no_cache, progress=progress, runtime=args.runtime)
        finally:
            progress.close()
        run_server(llm, name=args.name, default_max_tokens=args.max_tokens, sock=sock,
                   max_seqs=args.max_seqs, prefill_chunk=args.prefill_chunk, max_queue=args.max_queue, prefix_cache=not args.no_prefix_cache)
    finally:
        sock.close()
    return 0


def perplexity(args: argparse.Namespace) -> int:
    if args.context is not None and args.context < 2:
        raise TileworkError(f"--context must be at least 2, got {args.context}")
    text = _read_text(args.file)
    llm = _load(args)
    tokens = llm.encode(text)
    t0 = time.perf_counter()
    progress = _Progress(sys.stderr)
    try:
        ppl, count = llm.perplexity(tokens, args.context, lambda i, n: progress(f"window {i} of {n}"))
    finally:
        progress.close()
    from tilework.llm.engine import PERPLEXITY_CONTEXT

    context = args.context or min(llm.config.context_length, PERPLEXITY_CONTEXT)
    print(f"perplexity {ppl:.4f}")
    print(f"{count} tokens predicted, windows of {context} tokens, {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.command == "perplexity":
        return perplexity(args)
    if args.max_tokens < 1:
        raise TileworkError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.command == "serve":
        return serve(args)
    return generate(args) if args.command == "generate" else chat(args)


__all__ = ["add_parsers", "run"]

"""Regenerate every table of docs/benchmarks.md: run each benchmark script, take the tables it
prints (``bench/report.py``'s markers) and put each in place of the block of the same name,
with the command that made it and the machine it ran on.

    python bench/run_all.py [--only KEY,KEY] [--list] [--dry-run] [--timeout S]

Every script runs in its own process with ``OMP_NUM_THREADS=2`` and without the
``OPENBLAS_CORETYPE``/``OPENBLAS_L2_SIZE`` overrides (they slow NumPy's BLAS); the MiniLM
benchmark gets an empty kernel cache (its compile times are cold). A script that fails or
times out leaves its old tables as they were and makes the exit status 1. Run it on a quiet
machine: nothing else should be using the cores.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from report import blocks, cpu_features, cpu_model, read_bandwidth, replace_block

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
THREADS = "2"


@dataclass(frozen=True)
class Bench:
    keys: tuple[str, ...]  # the tables it prints
    args: tuple[str, ...]  # after ``python``
    cold_cache: bool = False  # an empty TILEWORK_CACHE_DIR of its own

    @property
    def command(self) -> str:
        env = f"OMP_NUM_THREADS={THREADS} " + ("TILEWORK_CACHE_DIR=$(mktemp -d) " if self.cold_cache else "")
        return env + "python " + " ".join(self.args)


BENCHES = [
    Bench(("graph-build",), ("bench/bench_graph_build.py",)),
    Bench(("codegen-matmul", "codegen-compile", "codegen-mlp"), ("bench/bench_codegen.py", "--threads", THREADS)),
    Bench(("kernels-rows-2t", "kernels-attention-2t"), ("bench/bench_kernels.py", "--threads", "2")),
    Bench(("kernels-rows-1t", "kernels-attention-1t"), ("bench/bench_kernels.py", "--threads", "1")),
    Bench(("vm",), ("bench/bench_vm.py",)),
    Bench(("memory", "fusion"), ("bench/bench_memory.py",)),
    Bench(("minilm", "minilm-bf16", "minilm-trace"), ("bench/bench_minilm.py", "--precision", "bf16"), cold_cache=True),
    Bench(("vision",), ("bench/bench_vision.py",)),
    Bench(("vision-torchvision",), ("bench/bench_vision.py", "--torchvision", "default")),  # torchvision from TORCHVISION_PATH
    Bench(("onnx-twin",), ("bench/bench_onnx_twin.py",)),
    Bench(("backends",), ("bench/bench_backends.py",)),
    Bench(("placement",), ("bench/bench_placement.py", "--fresh", "--repeat", "15")),
    Bench(("quant",), ("bench/bench_quant.py", "--threads", THREADS)),
    Bench(("llm", "llm-aims"), ("bench/bench_llm.py", "--kv-dtypes", "q:int8")),
    Bench(("llm-q4km",), ("bench/bench_llm.py", "--random-llama", "Q4_K_M", "--precisions", "q,fp32", "--shapes", "1x32,8x32", "--no-hf")),
    Bench(("llm-moe-q4km",), ("bench/bench_llm.py", "--random-llama", "Q4_K_M", "--moe", "--precisions", "q", "--shapes", "1x32,8x32,1x512", "--no-hf", "--no-rss")),
    Bench(("llm-start",), ("bench/bench_start.py",)),
    Bench(("serve",), ("bench/bench_serve.py",)),
    Bench(("serve-chat",), ("bench/bench_serve_chat.py",)),
    Bench(("compile",), ("bench/bench_compile.py",)),
    Bench(("aot.overhead", "aot.minilm", "aot.llama"), ("bench/bench_aot.py",)),
]


def machine_block(bandwidth: str) -> str:
    import numpy

    versions = [f"Python {platform.python_version()}", f"NumPy {numpy.__version__}"]
    for dist in ("torch", "onnxruntime", "llama-cpp-python"):
        try:
            from importlib.metadata import version

            versions.append(f"{dist} {version(dist)}")
        except Exception:  # noqa: BLE001  (not installed)
            pass
    from tilework.codegen.c.toolchain import compiler_command, compiler_flags

    cc = subprocess.run([*compiler_command(), "--version"], capture_output=True, text=True, check=False).stdout.splitlines()

    return (
        f"- CPU: {cpu_model()} ({os.cpu_count()} cores visible; {cpu_features()})\n"
        f"- memory-read bandwidth at the start of the run: {bandwidth}\n"
        f"- {', '.join(versions)}; {cc[0] if cc else 'no cc'}\n"
        f"- kernels compiled with `{' '.join(compiler_flags())}` (`-march=native` is {native_arch()} here)\n"
        f"- date: {datetime.date.today()}"
    )


def native_arch() -> str:
    """What the kernels' compiler (``$CC``, else ``cc``) takes ``-march=native`` for (e.g.
    ``znver4``; gcc says it), or ``unknown``."""
    from tilework.codegen.c.toolchain import compiler_command

    out = subprocess.run([*compiler_command(), "-march=native", "-Q", "--help=target"], capture_output=True, text=True, check=False).stdout
    return next((line.split()[-1] for line in out.splitlines() if line.strip().startswith("-march=")), "unknown")


def run(bench: Bench, timeout: float) -> tuple[dict[str, str], str]:
    """The tables a script printed, and an error ('' if none)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env["OMP_NUM_THREADS"] = THREADS
    with tempfile.TemporaryDirectory() as cache:
        if bench.cold_cache:
            env["TILEWORK_CACHE_DIR"] = cache
        try:
            p = subprocess.run([sys.executable, *bench.args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {}, f"timed out after {timeout:.0f} s"
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        return {}, f"exit status {p.returncode}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}"
    got = blocks(p.stdout)
    missing = [k for k in bench.keys if k not in got]
    return got, f"printed no table {', '.join(missing)}" if missing else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated table keys (default: all): the scripts that make them run, and every table they make is rewritten")
    ap.add_argument("--list", action="store_true", help="list the tables and their commands")
    ap.add_argument("--dry-run", action="store_true", help="run, but do not write docs/benchmarks.md")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per script")
    args = ap.parse_args()
    if args.list:
        for b in BENCHES:
            print(f"{', '.join(b.keys):<40} {b.command}")
        return 0
    only = {k for k in args.only.split(",") if k}
    unknown = only - {k for b in BENCHES for k in b.keys}
    if unknown:
        print(f"run_all: unknown table(s) {', '.join(sorted(unknown))}; --list shows them", file=sys.stderr)
        return 2
    todo = [b for b in BENCHES if not only or only & set(b.keys)]
    cpu = f"{cpu_model()} ({cpu_features()})"  # the features: two machines may share a model name
    bw, how = read_bandwidth()
    doc = replace_block(DOC.read_text(), "machine", machine_block(f"{bw:.1f} GB/s ({how})"))
    failed = []
    for b in todo:
        print(f"\n=== {b.command}", flush=True)
        t = time.perf_counter()
        got, err = run(b, args.timeout)
        stamp = f"_`{b.command}` — {datetime.date.today()}, {cpu}, {time.perf_counter() - t:.0f} s_"
        for key in b.keys:
            if key in got:  # every table of the run: tables of one run cite each other
                doc = replace_block(doc, key, f"{stamp}\n\n{got[key]}")
        if err:
            failed.append(f"{b.command}: {err}")
    if not args.dry_run:
        DOC.write_text(doc)
    for f in failed:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

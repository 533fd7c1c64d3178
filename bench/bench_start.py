"""First and cached starts of the main job: ``tilework generate`` on the embedded
SmolLM2-135M-Instruct in a fresh process, each precision, and llama.cpp's one-shot equivalent
on the same GGUF (llama-cpp-python: load it, one chat completion), where that is installed.

    python bench/bench_start.py [--repeat 5] [--max-tokens 8]

Each system gets an empty cache directory of its own (``TILEWORK_CACHE_DIR``: no compiled
model, kernels or GGUF index) and an empty bytecode cache (``PYTHONPYCACHEPREFIX``, as an
editable install starts): its first start is timed as such (tilework compiles the model for
the machine; llama.cpp has nothing to compile), then ``--repeat`` cached starts in rounds over
the systems, 2 threads each. Python caches the modules' bytecode as it does for an installed
package (a ``PYTHONDONTWRITEBYTECODE`` in the environment, as on the machines this project is
developed on, would have every start compile tilework's ~250 modules again: 0.3 s more). The
table gives the wall time of the whole process (Python's start, imports, loading the weights,
the chat template, prefill, ``--max-tokens`` greedy tokens, exit): the first start, the
minimum and the median of the cached ones, and the peak resident memory of a cached start
(``wait4``'s ``ru_maxrss``). The LLM issue's aim: a cached start under 2 s. One table
(``llm-start``)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")

from report import cpu_features, cpu_model, emit, table  # noqa: E402

PROMPT = "Name a color."
PRECISIONS = ("q", "bf16", "fp32")


def gguf_path() -> str:
    from tilework.llm.engine import default_model_path

    return default_model_path()


def commands(max_tokens: int) -> dict[str, list[str]]:
    out = {f"tilework {p}": [sys.executable, "-m", "tilework", "generate", PROMPT, "--max-tokens", str(max_tokens), "--temperature", "0", "--precision", p] for p in PRECISIONS}
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama-cpp-python is not installed: tilework alone")
        return out
    code = (
        "from llama_cpp import Llama\n"
        f"m = Llama(model_path={gguf_path()!r}, n_threads=2, n_threads_batch=2, n_ctx=2048, verbose=False)\n"
        f"r = m.create_chat_completion(messages=[{{'role': 'user', 'content': {PROMPT!r}}}], max_tokens={max_tokens}, temperature=0)\n"
        "print(r['choices'][0]['message']['content'])\n"
    )
    out["llama.cpp Q4_1"] = [sys.executable, "-c", code]
    return out


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of ``cmd`` in a process of its own; raises on failure."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode() if p.stderr is not None else ""
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({p.returncode}): {err[-500:]}")
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=8)
    args = ap.parse_args()
    cmds = commands(args.max_tokens)
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "TILEWORK_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="tw-start-") as scratch:
        envs = {name: base | {"TILEWORK_CACHE_DIR": os.path.join(scratch, f"cache{i}"), "PYTHONPYCACHEPREFIX": os.path.join(scratch, f"pycache{i}")} for i, name in enumerate(cmds)}
        first: dict[str, float] = {}
        for name, cmd in cmds.items():  # first starts: each system's caches empty
            first[name], _ = run(cmd, envs[name])
            print(f"{name}: first start {first[name]:.2f} s (empty caches)", flush=True)
        walls: dict[str, list[float]] = {n: [] for n in cmds}
        rss: dict[str, float] = {}
        for _ in range(args.repeat):
            for name, cmd in cmds.items():
                wall, peak = run(cmd, envs[name])
                walls[name].append(wall)
                rss[name] = max(rss.get(name, 0.0), peak)
    rows = []
    for name in cmds:
        lo, med = min(walls[name]), statistics.median(walls[name])
        aim = ("met" if med < 2 else "**not met**") if name.startswith("tilework") else ""
        rows.append((name, f"{first[name]:.2f}", f"{lo:.2f}", f"{med:.2f}", f"{rss[name]:.0f}", aim))
        print(f"{name}: first {first[name]:.2f} s, cached min {lo:.2f} s, median {med:.2f} s, peak RSS {rss[name]:.0f} MiB")
    emit(
        "llm-start",
        f"`python bench/bench_start.py --repeat {args.repeat} --max-tokens {args.max_tokens}`: {cpu_model()} ({cpu_features()}), 2 threads; "
        f"a fresh process per start, each system with caches of its own: its first start with them empty (tilework compiles the model for the machine; llama.cpp compiles nothing), then cached starts (module bytecode cached, as for an installed package); "
        f"`tilework generate {PROMPT!r} --max-tokens {args.max_tokens} --temperature 0 --precision P` "
        f"(the embedded SmolLM2-135M-Instruct, its chat template) and llama-cpp-python loading the same GGUF and answering the same chat message; "
        f"seconds of the whole process, {args.repeat} cached starts each in rounds; aim: a cached start under 2 s (by the median):\n\n"
        + table(("system", "first start s", "cached min s", "cached median s", "peak RSS MiB", "cached under 2 s"), rows),
    )


if __name__ == "__main__":
    main()

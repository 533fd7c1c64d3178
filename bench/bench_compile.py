"""Compile time of MiniLM and SmolLM2, split into import, passes and C code, cold and warm.

all-MiniLM-L6-v2 through torch.export and SmolLM2-135M's decoder (fp32 and the GGUF's
quantization), each compiled first with an empty kernel cache (cold: the C compiler runs) and
then again with its kernels in the cache (warm: only Python runs).

    python bench/bench_compile.py [--models minilm,smollm2-fp32,smollm2-q] [--repeat 2]

Columns: the whole compile (MiniLM: ``tilework.compile``; SmolLM2: building its decoder
executable, ``compiled_decoder(use_cache=False)``, without reading the weights), the model's
import (torch.export; SmolLM2: building its graph), the passes (legalize, fusion, scheduling,
lowering), and the C code (emitting it and, cold, compiling it). Warm: the minimum of
``--repeat`` compiles. One table (``compile``)."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Callable

os.environ.setdefault("OMP_NUM_THREADS", "2")

from report import cpu_features, cpu_model, emit, table  # noqa: E402

MODELS = ("minilm", "smollm2-fp32", "smollm2-q")


def minilm() -> Callable[[], dict[str, float]]:
    import bench_minilm as bm

    model = bm.load_model()

    def run() -> dict[str, float]:
        t = time.perf_counter()
        cm = bm.compile_tilework(model, 1)
        total = time.perf_counter() - t
        meta = cm.executable.meta
        return {"total": total, "import": cm.report["seconds"]["import"], "passes": meta["passes_s"], "c": meta["codegen_s"]}

    return run


def smollm2(precision: str) -> Callable[[], dict[str, float]]:
    from tilework.llm.compile import KV_DTYPE_OF, compiled_decoder, prepare_weights
    from tilework.llm.engine import default_model_path
    from tilework.llm.gguf import read_gguf
    from tilework.llm.weights import load_weights

    path = default_model_path()
    config, tensors = load_weights(path, read_gguf(path))  # read once, outside the timing
    formats, _ = prepare_weights(config, tensors, precision)

    def run() -> dict[str, float]:
        t = time.perf_counter()
        exe = compiled_decoder(config, formats, kv_dtype=KV_DTYPE_OF[precision], use_cache=False)
        total = time.perf_counter() - t
        meta = exe.meta
        built = meta["passes_s"] + meta["codegen_s"]
        return {"total": total, "import": max(0.0, meta["llm"]["compile_s"] - built), "passes": meta["passes_s"], "c": meta["codegen_s"]}

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--repeat", type=int, default=2, help="warm compiles per model (the minimum is reported)")
    args = ap.parse_args()
    names = [m for m in args.models.split(",") if m]
    bad = [m for m in names if m not in MODELS]
    if bad:
        ap.error(f"unknown model(s) {', '.join(bad)}; choose from {', '.join(MODELS)}")
    import tilework  # noqa: F401  (registers the compilers)

    print(f"CPU {cpu_model()} ({cpu_features()}), OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    rows = []
    for name in names:
        os.environ["TILEWORK_CACHE_DIR"] = tempfile.mkdtemp(prefix="tw-compile-")  # cold: an empty kernel cache
        run = minilm() if name == "minilm" else smollm2(name.split("-")[1])
        cold = run()
        warm = min((run() for _ in range(max(1, args.repeat))), key=lambda r: r["total"])
        for state, r in (("cold", cold), ("warm", warm)):
            print(f"{name} {state}: " + ", ".join(f"{k} {v:.2f} s" for k, v in r.items()), flush=True)
            rows.append([name, state, *(f"{r[k]:.2f}" for k in ("total", "import", "passes", "c"))])
    text = "Seconds; cold: an empty kernel cache, warm: the kernels in it (the minimum of the repeats):\n\n"
    text += table(["model", "kernel cache", "compile", "import", "passes", "C code"], rows)
    emit("compile", text)


if __name__ == "__main__":
    main()

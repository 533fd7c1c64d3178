"""GGUF files as llama.cpp's quantizer writes them, read by tilework and by llama.cpp side by side.

A user's GGUF is rarely one block format: llama.cpp's ``Q4_K_M`` mix keeps most matrices in
Q4_K, some in Q6_K, and where a row is not a multiple of 256 weights (SmolLM2's 576) falls back
to Q5_0 / Q8_0; ``Q3_K_M`` mixes Q3_K, Q4_K, Q5_K, Q4_0 and Q5_0. This script makes each of
llama.cpp's file types from one set of weights (the embedded SmolLM2-135M-Instruct's Q4_1 file,
dequantized to an F32 GGUF as ``bench_llm.py`` does, then requantized by llama-cpp-python's
``llama_model_quantize``), and for each file reports the block formats it holds and, over the
same ~260 tokens of plain English (``tests/llm/test_smollm2.py``'s ``TEXT``), teacher-forced:

- tilework's perplexity with the file's blocks kept (``precision="q"``) and with the file
  dequantized (``precision="fp32"``): their gap is what tilework's integer and float kernels
  add (the integer path rounds activations to 8 bits, as llama.cpp does);
- llama.cpp's perplexity on the same file and token ids (``logits_all``);
- how often tilework's ``q`` and llama.cpp's next-token argmax agree.

llama-cpp-python is an optional bench dependency (it builds llama.cpp from source: ``CMAKE_ARGS=
"-DGGML_NATIVE=ON" pip install llama-cpp-python``). The quantized files are made once under the
temp directory (``tilework-bench/``, ``bench/gguf_files.py``).

    python bench/conformance_gguf.py [--types Q4_K_M,Q5_0,...] [--write]

``--write`` puts the table into docs/conformance.md's ``gguf-files`` block.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf_files import block_formats, f32_gguf, llama_cpp_scores, quantized  # noqa: E402
from report import emit, table, write_block  # noqa: E402

from tests.llm.test_smollm2 import TEXT  # noqa: E402
from tilework.llm import LLM  # noqa: E402
from tilework.llm.engine import default_model_path  # noqa: E402

KEY = "gguf-files"
DOC = Path(__file__).resolve().parents[1] / "docs" / "conformance.md"
# llama.cpp file types (llama_cpp.LLAMA_FTYPE_MOSTLY_<name>), in the order of the table
TYPES = ("F32", "Q8_0", "Q6_K", "Q5_K_M", "Q5_1", "Q5_0", "Q4_K_M", "Q4_1", "Q4_0", "IQ4_NL", "IQ4_XS", "Q3_K_M", "Q2_K")
HEADERS = ("file type", "block formats (tensors)", "tilework q ppl", "tilework fp32 ppl", "llama.cpp ppl", "q vs llama.cpp argmax", "tilework load + compile s")


def log_probs(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def perplexity(lp: np.ndarray, tokens: list[int]) -> float:
    return float(np.exp(-lp[np.arange(len(tokens) - 1), tokens[1:]].mean()))


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__


def row(ftype: str, path: str, tokens: list[int]) -> list[str]:
    formats = block_formats(path)
    lc = log_probs(llama_cpp_scores(path, tokens))
    cells: dict[str, str] = {}
    q_lp: np.ndarray | None = None
    seconds = ""
    for precision in ("q", "fp32"):
        try:
            t = time.perf_counter()
            llm = LLM(path, precision=precision)
            if precision == "q":
                seconds = f"{time.perf_counter() - t:.1f}"
            lp = llm.score(tokens)
            cells[precision] = f"{perplexity(lp, tokens):.3f}"
            if precision == "q":
                q_lp = lp
        except Exception as e:  # a row of the table, not the end of the run
            traceback.print_exc()
            cells[precision] = f"FAIL: {_short(e)}"
    agree = "" if q_lp is None else f"{100 * float((q_lp[:-1].argmax(1) == lc[:-1].argmax(1)).mean()):.1f}%"
    out = [ftype, formats, cells["q"], cells["fp32"], f"{perplexity(lc, tokens):.3f}", agree, seconds]
    print(" | ".join(out), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(TYPES), help=f"llama.cpp file types, comma-separated (default: {','.join(TYPES)})")
    ap.add_argument("--write", action="store_true", help=f"put the table into docs/conformance.md's {KEY} block")
    args = ap.parse_args()
    types = [t for t in args.types.split(",") if t]
    unknown = [t for t in types if t not in TYPES]
    if unknown:
        print(f"unknown file type(s) {', '.join(unknown)}; known: {', '.join(TYPES)}", file=sys.stderr)
        return 2
    try:
        import llama_cpp
    except ImportError:
        print("llama-cpp-python is not installed (an optional bench dependency; see the docstring)", file=sys.stderr)
        return 2
    src = default_model_path()
    f32 = f32_gguf(src)
    tokens = LLM(src, precision="q").encode(TEXT)
    print(f"llama-cpp-python {llama_cpp.__version__}; {len(tokens)} tokens; weights of {Path(src).name}", flush=True)
    rows = [row(t, quantized(f32, t), tokens) for t in types]
    text = (
        f"_`OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} python bench/conformance_gguf.py` — {time.strftime('%Y-%m-%d')}, "
        f"llama-cpp-python {llama_cpp.__version__}, {len(tokens)} tokens_\n\n" + table(HEADERS, rows)
    )
    if args.write:
        write_block(DOC, KEY, text)
    emit(KEY, text)
    return 1 if any("FAIL" in c for r in rows for c in r) else 0


if __name__ == "__main__":
    raise SystemExit(main())

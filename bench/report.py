"""What the benchmark scripts share: the machine they ran on, and the markdown tables that
``bench/run_all.py`` copies into ``docs/benchmarks.md``.

A script prints each of its tables between two marker lines::

    <!-- table:minilm -->
    | (batch, seq) | tilework | ... |
    ...
    <!-- /table:minilm -->

and ``run_all.py`` replaces the block of the same name in ``docs/benchmarks.md`` with it, so
the document only ever holds what a script printed. Scripts import this module as a sibling
(``python bench/x.py`` puts ``bench/`` on ``sys.path``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Callable

BLOCK = re.compile(r"^<!-- table:(?P<key>[\w.-]+) -->\n(?P<body>.*?)^<!-- /table:(?P=key) -->\n?", re.M | re.S)
# Pause before timing a system right after another one in the same process: the worker
# threads of the one before spin on for a while (OpenBLAS's ~0.1 s of a core, onnxruntime's
# ~0.04 s, OpenMP's up to GOMP_SPINCOUNT), and on 2 cores a static split of the next system
# waits for its descheduled thread (tilework's MLP at n = 32: 8 ms right after a NumPy
# matmul, 4 ms 0.3 s later).
SETTLE_S = 0.3


def threads_from_argv(default: int) -> int:
    """The ``--threads N`` (or ``--threads=N``) of the command line, ``default`` without one:
    for a script that must set ``OMP_NUM_THREADS`` before NumPy or OpenMP start, that is
    before ``argparse`` runs (a malformed value is argparse's to report later)."""
    for i, a in enumerate(sys.argv):
        value = sys.argv[i + 1] if a == "--threads" and i + 1 < len(sys.argv) else a.split("=", 1)[1] if a.startswith("--threads=") else None
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return default
    return default


def median_ms_in_rounds(fns: dict[str, Callable[[], Any]], repeat: int, rounds: int = 3, settle_s: float = SETTLE_S, budget_s: float | None = None, warm_s: float | None = None) -> dict[str, float]:
    """Median ms of each of ``fns`` over about ``repeat`` timed calls, taken in ``rounds``
    rounds: each round times a block of calls of every system in turn (the order rotating). A
    change of the machine's state between minutes (its memory bandwidth, another tenant) then
    falls on every system alike. With ``settle_s`` each block starts after that pause and one
    untimed call (no system is timed while the one before still spins); without, each system
    is called twice first and the rounds follow one another. ``budget_s``: no new round once
    the rounds took that long per system (at least 3 rounds). ``warm``: each block follows an
    untimed call of the same system, also without ``settle_s`` (a model called in a loop finds
    its own weights and code in the caches, not the system's before it)."""
    names = list(fns)
    per = max(1, -(-repeat // rounds))
    if not settle_s:
        for n in names:
            fns[n]()
            fns[n]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    for r in range(rounds):
        if budget_s is not None and r >= 3 and time.perf_counter() - start > budget_s * len(names):
            break
        for n in names[r % len(names):] + names[: r % len(names)]:
            if settle_s:
                time.sleep(settle_s)
            if settle_s or warm_s is not None:
                t = time.perf_counter()
                fns[n]()
                while warm_s and time.perf_counter() - t < warm_s:
                    fns[n]()
            for _ in range(per):
                t = time.perf_counter()
                fns[n]()
                samples[n].append(time.perf_counter() - t)
    return {n: 1e3 * statistics.median(v) for n, v in samples.items()}


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table; floats keep the text they were formatted to (pass strings)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def emit(key: str, text: str) -> None:
    """Print ``text`` (markdown) as the block ``key`` for ``run_all.py``."""
    print(f"<!-- table:{key} -->\n{text.rstrip()}\n<!-- /table:{key} -->", flush=True)


def blocks(text: str) -> dict[str, str]:
    """The blocks a script printed: key -> markdown (without the markers)."""
    return {m["key"]: m["body"] for m in BLOCK.finditer(text)}


def replace_block(doc: str, key: str, body: str) -> str:
    """``doc`` with its block ``key`` holding ``body``; a block it lacks is appended under a
    heading of its own (to be moved by hand)."""
    new = f"<!-- table:{key} -->\n{body.rstrip()}\n<!-- /table:{key} -->\n"
    for m in BLOCK.finditer(doc):
        if m["key"] == key:
            return doc[: m.start()] + new + doc[m.end() :]
    return doc.rstrip() + f"\n\n## {key}\n\n{new}"


def write_block(path: "os.PathLike[str] | str", key: str, body: str) -> None:
    """Put ``body`` into the block ``key`` of the markdown file ``path``, which must have one."""
    from pathlib import Path

    doc = Path(path).read_text(encoding="utf-8")
    if key not in blocks(doc):
        raise SystemExit(f"{path} has no {key} block to replace")
    Path(path).write_text(replace_block(doc, key, body), encoding="utf-8")


def cpu_model() -> str:
    """The CPU's model name as ``lscpu`` says it, with its family and model numbers where it
    gives them: the development machines' "AMD EPYC" has been two generations with the same
    vector features (family 25 model 17, Zen 4, about 100 float32 GFLOP/s a core; and one about
    2.5x that), whose timings do not compare."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
        name = fields["Model name"]
    except (OSError, KeyError):
        return platform.processor() or "unknown"
    family, model = fields.get("CPU family"), fields.get("Model")
    return f"{name} (family {family} model {model})" if family and model else name


def cpu_features() -> str:
    """The vector features that decide which kernels run (from ``/proc/cpuinfo``)."""
    try:
        flags = set(next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return "unknown"
    names = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"]
    return " ".join(n for n in names if n in flags) or "no AVX2"


_READ_KERNEL = r"""
float read_sum(const float *x, long n) {
    float total = 0.0f;
    #pragma omp parallel for reduction(+:total) schedule(static)
    for (long b = 0; b < n / 4096; b++) {
        float acc[64] = {0};
        const float *p = x + b * 4096;
        for (int i = 0; i < 4096; i += 64)
            for (int j = 0; j < 64; j++) acc[j] += p[i + j];
        for (int j = 0; j < 64; j++) total += acc[j];
    }
    return total;
}
"""


class BandwidthMeter:
    """Memory-read GB/s, measured as often as a benchmark needs it: a C/OpenMP sum over ``gib``
    GiB of float32 with ``OMP_NUM_THREADS`` threads (NumPy's single-threaded ``sum`` if no C
    compiler works), compiled and allocated once; each call is the best of ``repeat`` sums
    after a warm-up. ``how`` says how it measures."""

    def __init__(self, gib: float = 1.0) -> None:
        import numpy as np  # here, not at import: a script sets OMP_NUM_THREADS before NumPy starts

        self.x = np.ones(int(gib * 2**30) // 4, np.float32)
        threads = os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))
        self.how = f"NumPy float32 sum over {gib:g} GiB, 1 thread"
        self.fn: Any = self.x.sum
        with tempfile.TemporaryDirectory() as d:
            src, lib = os.path.join(d, "read.c"), os.path.join(d, "read.so")
            Path(src).write_text(_READ_KERNEL)
            cc = shutil.which(os.environ.get("CC", "cc"))
            try:
                if cc is None:
                    raise OSError("no C compiler")
                subprocess.run([cc, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", src, "-o", lib], check=True, capture_output=True)
                so = ctypes.CDLL(lib)  # stays mapped after its file goes
                so.read_sum.restype, so.read_sum.argtypes = ctypes.c_float, [ctypes.c_void_p, ctypes.c_long]
                self.fn = lambda: so.read_sum(self.x.ctypes.data, self.x.size)
                self.how = f"C/OpenMP float32 sum over {gib:g} GiB, {threads} threads"
            except (OSError, subprocess.CalledProcessError):
                pass

    def __call__(self, repeat: int = 5) -> float:
        self.fn()
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            self.fn()
            best = min(best, time.perf_counter() - t)
        return self.x.nbytes / best / 1e9


def read_bandwidth(gib: float = 1.0, repeat: int = 5) -> tuple[float, str]:
    """Memory-read GB/s measured once (``BandwidthMeter``) and how it was measured."""
    meter = BandwidthMeter(gib)
    return meter(repeat), meter.how

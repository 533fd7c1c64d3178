"""The quant backend's library against the memory bandwidth and OpenBLAS, in one run.

    python bench/bench_quant.py [--threads 2] [--repeat 5] [--formats q4_1,q8_0,...] [--rows 1,8]

q4_0, q4_1, q5_0, q5_1, q8_0 and the k-quants (q4_k, q6_k, q5_k, q3_k, q2_k) run the integer path
(each call quantizes x to 8-bit blocks of 32 and takes exact int8 block dot products with AVX-512
VNNI, as llama.cpp does); bf16 and f16 multiply in float32 with the weights decoded in registers.

For each format (q4_0x16, q4_1x16, q5_0x16, q5_1x16, q8_0x16, q4_kx16, q5_kx16, q6_kx16, q3_kx16,
q2_kx16 are the same blocks with 16 rows interleaved, as
tilework.llm keeps its projections; bf16x16 the bf16 rows interleaved by pairs, as its bf16
precision keeps them where the CPU has AVX-512 BF16), the matrix shapes of SmolLM2-135M's decoder (N x K = out x
in; q/k/v and gate/up are one matrix each: 960x576 qkv, 576x576 o, 3072x576 gate/up, 576x1536
down; the 49152x576 head in q8_0 and q8_0x16; k-quants only where K is a multiple of 256):

- GEMV at M = 1 and 8 rows, weights cold: the call cycles through copies of the matrix that
  fill 128 MiB (4x the L3), as in decoding, where every matrix comes from memory once per token.
  GB/s is weight bytes over time; % is that over the memory read bandwidth measured in the same
  run (all threads summing 1 GiB of float32 in C).
- GEMM at M = 128 and 512 (prefill), weights warm: GFLOP/s = 2 M N K / time (a multiply-add of
  int8 counts as two operations, like a float one).
- np fp32: NumPy's OpenBLAS ``x @ W.T`` on the dequantized float32 weights (4 bytes a weight;
  cold the same way for GEMV), measured after all of ours so the two thread pools never spin
  against each other.

Times are per call through the extern the VM calls (Python overhead and the quantization of x
included): the best of ``--repeat`` passes over the cold copies (GEMV), the best of
4 x ``--repeat`` single calls (GEMM; on a shared machine short passes are the ones that see no
other load). The last lines estimate one SmolLM2 decoding step (30 layers' q4_1 matrices and
the q8_0 head at M = 1, and 8 sequences at M = 8; as the file stores them and as tilework.llm
runs them, interleaved) from the table.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Callable


from report import threads_from_argv  # noqa: E402  (report imports no NumPy: OMP_NUM_THREADS is still set before it starts)

_THREADS = threads_from_argv(2)
os.environ["OMP_NUM_THREADS"] = str(_THREADS)  # before OpenMP and OpenBLAS start
os.environ["OPENBLAS_NUM_THREADS"] = str(_THREADS)

import numpy as np  # noqa: E402
from report import emit, table  # noqa: E402

import tilework  # noqa: E402,F401  (registers the externs)
from tilework.backend import quant as Q  # noqa: E402
from tilework.op.quant import INTERLEAVED_FORMATS, interleave_rows, quant_format  # noqa: E402
from tilework.runtime.extern import lookup_extern  # noqa: E402

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
HEAD = (49152, 576)
COLD_BYTES = 128 << 20
GEMV_ROWS = (1, 8)
GEMM_ROWS = (128, 512)
# SmolLM2-135M per layer, as tilework.llm calls them: qkv, o, gate/up, down (N x K)
LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS = 30


@dataclass
class Row:
    fmt: str
    n: int
    k: int
    m: int
    seconds: float
    weight_bytes: int
    numpy_seconds: float = float("nan")

    @property
    def cold(self) -> bool:
        return self.m in GEMV_ROWS


def make_blocks(rng: np.random.Generator, fmt: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Realistic blocks (gguf's quantizer; k-quants and iq4, which it does not quantize: random
    bytes with sane scales) and their dequantized float32 weights."""
    import gguf
    from gguf.quants import dequantize, quantize

    if fmt in INTERLEAVED_FORMATS:  # the plain format's blocks, 16 rows interleaved
        base = fmt[: -len("x16")]
        b, wf = make_blocks(rng, base, n, k)
        return interleave_rows(b, base), wf
    t = getattr(gguf.GGMLQuantizationType, fmt.upper())
    if fmt in RANDOM_BYTES:
        b = rng.integers(0, 256, (n, Q.row_bytes(fmt, k)), dtype=np.uint8)
        for at in RANDOM_BYTES[fmt]:  # finite fp16 scales; any other bytes are valid
            b.reshape(n, k // quant_format(fmt).block, -1)[:, :, at : at + 2] = (rng.standard_normal((n, k // quant_format(fmt).block, 1)) * 0.01).astype(np.float16).view(np.uint8)
        return b, dequantize(b, t).reshape(n, k).astype(np.float32)
    raw = quantize(rng.standard_normal((n, k)).astype(np.float32), t)
    return np.ascontiguousarray(raw.view(np.uint8).reshape(n, -1)), dequantize(raw, t).reshape(n, k).astype(np.float32)


# formats made of random bytes, and the offsets of their blocks' fp16 d (and dmin)
RANDOM_BYTES = {"q4_k": (0, 2), "q6_k": (208,), "q5_k": (0, 2), "q3_k": (108,), "q2_k": (80, 82), "iq4_nl": (0,), "iq4_xs": (0,)}


def best_of(repeat: int, fn: Callable[[], object], calls: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best


def copies_of(a: np.ndarray, count: int) -> list[np.ndarray]:
    return [a.copy() for _ in range(count)]


def time_ours(fmt: str, b: np.ndarray, n: int, k: int, m: int, repeat: int, rng: np.random.Generator) -> float:
    extern = lookup_extern(Q.extern_symbol(fmt))
    assert extern is not None
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = np.empty((m, n), np.float32)
    dims = (m, n, k)
    if m not in GEMV_ROWS:  # one call per pass, more passes: short passes dodge other load
        extern(x, b, dims, out)
        return best_of(4 * repeat, lambda: extern(x, b, dims, out), 1)
    ws = copies_of(b, max(2, COLD_BYTES // b.nbytes))

    def run() -> None:
        for w in ws:
            extern(x, w, dims, out)

    run()
    return best_of(repeat, run, len(ws))


def time_numpy(wf: np.ndarray, m: int, repeat: int, rng: np.random.Generator) -> float:
    n, k = wf.shape
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = np.empty((m, n), np.float32)
    if m not in GEMV_ROWS:
        np.matmul(x, wf.T, out=out)
        return best_of(4 * repeat, lambda: np.matmul(x, wf.T, out=out), 1)
    ws = copies_of(wf, max(2, COLD_BYTES // wf.nbytes))

    def run() -> None:
        for w in ws:
            np.matmul(x, w.T, out=out)

    run()
    return best_of(repeat, run, len(ws))


def read_bandwidth(lib: Q.QuantLibrary, repeat: int) -> float:
    big = np.ones(256 << 20, np.float32)  # 1 GiB
    lib.read_sum(big)
    seconds = best_of(repeat, lambda: lib.read_sum(big), 1)
    return big.nbytes / seconds / 1e9


def call_overhead(repeat: int) -> tuple[float, float]:
    """Seconds per extern call that returns at once (M = 0: Python, ctypes and argument checks
    only), and per call of a tiny product (1 x 32 by 4 x 32, q4_1, one thread's work)."""
    extern = lookup_extern(Q.extern_symbol("q4_1"))
    assert extern is not None
    x = np.ones((1, 32), np.float32)
    w = np.zeros((4, 20), np.uint8)
    out = np.empty((1, 4), np.float32)
    calls = 20000
    empty = best_of(repeat, lambda: [extern(x, w, (0, 4, 32), out) for _ in range(calls)], calls)
    tiny = best_of(repeat, lambda: [extern(x, w, (1, 4, 32), out) for _ in range(calls)], calls)
    return empty, tiny


def shapes_for(fmt: str) -> list[tuple[int, int]]:
    out = [s for s in SHAPES if s[1] % quant_format(fmt).block == 0]
    return out + ([HEAD] if fmt in ("q8_0", "q8_0x16") else [])


def print_table(rows: list[Row], bw: float) -> list[tuple[str, ...]]:
    md: list[tuple[str, ...]] = []
    print(f"{'fmt':5} {'N x K':>11} {'M':>4} {'time us':>9} {'GB/s':>6} {'%bw':>4} {'GFLOP/s':>8} | {'np fp32 us':>10} {'GFLOP/s':>8} {'speedup':>7}")
    last = None
    for r in rows:
        if last is not None and (r.fmt, r.n, r.k) != last:
            print()
        last = (r.fmt, r.n, r.k)
        gbs = r.weight_bytes / r.seconds / 1e9
        flops = 2 * r.m * r.n * r.k
        pct = f"{100 * gbs / bw:3.0f}%" if r.cold else "    "
        print(
            f"{r.fmt:5} {f'{r.n}x{r.k}':>11} {r.m:>4} {r.seconds * 1e6:9.1f} {gbs:6.1f} {pct} {flops / r.seconds / 1e9:8.1f} | "
            f"{r.numpy_seconds * 1e6:10.1f} {flops / r.numpy_seconds / 1e9:8.1f} {r.numpy_seconds / r.seconds:6.2f}x"
        )
        md.append((r.fmt, f"{r.n}×{r.k}", str(r.m), f"{r.seconds * 1e6:.1f}", f"{gbs:.1f}", pct.strip(), f"{flops / r.seconds / 1e9:.1f}", f"{r.numpy_seconds * 1e6:.1f}", f"{r.numpy_seconds / r.seconds:.2f}x"))
    return md


def decode_estimate(rows: list[Row], overhead: float) -> list[str]:
    """The matmuls of a decode step from the table: the layers and the q8_0 head (the tied token
    table) as the file stores them (q4_1, q8_0), and as tilework.llm runs them (q4_1x16,
    q8_0x16)."""
    t = {(r.fmt, r.n, r.k, r.m): r for r in rows}
    lines = []
    for lf, hf in (("q4_1", "q8_0"), ("q4_1x16", "q8_0x16")):
        need = [(lf, n, k, 1) for n, k in LAYER] + [(hf, *HEAD, 1)]
        if any(key not in t for key in need):
            print(f"\n(a decode estimate with {lf} layers needs {lf} and {hf} in --formats)")
            continue
        lines += _estimate(t, lf, hf)
    weights = sum(Q.row_bytes("q4_1", k) * n for n, k in LAYER) * LAYERS + Q.row_bytes("q8_0", HEAD[1]) * HEAD[0]
    print(f"  ({weights / 2**20:.1f} MiB of weights per token; the extern's own overhead is {overhead * 1e6:.2f} us of each call)")
    return lines


def _estimate(t: dict[tuple[str, int, int, int], Row], lf: str, hf: str) -> list[str]:
    lines = []
    for m in GEMV_ROWS:
        layer = sum(t[(lf, n, k, m)].seconds for n, k in LAYER)
        head = t[(hf, *HEAD, m)].seconds
        ours = LAYERS * layer + head
        np_layer = sum(t[(lf, n, k, m)].numpy_seconds for n, k in LAYER)
        theirs = LAYERS * np_layer + t[(hf, *HEAD, m)].numpy_seconds
        line = (
            f"SmolLM2 decode step, matmuls only (int8 activations), M={m}: {ours * 1e3:.2f} ms = {LAYERS} x {layer * 1e6:.0f} us ({lf} layer) "
            f"+ {head * 1e6:.0f} us ({hf} head), {LAYERS * len(LAYER) + 1} calls "
            f"-> {m / ours:.0f} tokens/s (numpy fp32 on dequantized weights: {theirs * 1e3:.2f} ms, {m / theirs:.0f} tokens/s)"
        )
        print(line)
        lines.append(line)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=_THREADS)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--formats", default=",".join(Q.FORMATS))
    ap.add_argument("--rows", default=",".join(str(m) for m in GEMV_ROWS + GEMM_ROWS), help="the M to measure (of 1, 8, 128, 512)")
    args = ap.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    wanted = {int(m) for m in args.rows.split(",") if m.strip()}
    rng = np.random.default_rng(0)

    lib = Q.library()
    lib.set_threads(args.threads)
    dots = "VNNI" if lib.vnni else "AVX-512BW" if lib.simd else "C"
    print(f"quant library: {'AVX-512' if lib.simd else 'portable'} kernels, int8 dots ({', '.join(Q.INT8_FORMATS)}) by {dots}, {lib.max_threads()} thread(s), {lib.path}")
    bw = read_bandwidth(lib, args.repeat)
    empty, tiny = call_overhead(args.repeat)
    print(f"memory read bandwidth: {bw:.1f} GB/s (C read of 1 GiB, {args.threads} threads)")
    print(f"extern call: {empty * 1e6:.2f} us returning at once (M=0), {tiny * 1e6:.2f} us for 1x32 @ 4x32")

    rows: list[Row] = []
    dequantized: dict[tuple[str, int, int], np.ndarray] = {}
    for fmt in formats:
        for n, k in shapes_for(fmt):
            b, wf = make_blocks(rng, fmt, n, k)
            dequantized[(fmt, n, k)] = wf
            for m in GEMV_ROWS + GEMM_ROWS:
                if m not in wanted or ((n, k) == HEAD and m in GEMM_ROWS[1:]):
                    continue
                rows.append(Row(fmt, n, k, m, time_ours(fmt, b, n, k, m, args.repeat, rng), b.nbytes))
    bw_after = read_bandwidth(lib, args.repeat)
    time.sleep(0.2)  # let our OpenMP workers go to sleep before OpenBLAS runs
    for r in rows:
        r.numpy_seconds = time_numpy(dequantized[(r.fmt, r.n, r.k)], r.m, args.repeat, rng)
    print(f"memory read bandwidth after our runs: {bw_after:.1f} GB/s (the %bw column uses {bw:.1f})\n")
    md = print_table(rows, bw)
    print()
    estimate = decode_estimate(rows, empty)
    emit(
        "quant",
        f"The quant backend's kernels at SmolLM2-135M's matrix shapes, {args.threads} threads; GEMV (M = 1, 8) with cold weights, GEMM (M = 128, 512) warm; "
        f"memory-read bandwidth {bw:.1f} GB/s before, {bw_after:.1f} GB/s after (%bw uses the first); np fp32 = OpenBLAS on the dequantized weights:\n\n"
        + table(["format", "N × K", "M", "µs", "GB/s", "%bw", "GFLOP/s", "np fp32 µs", "speedup"], md)
        + "".join(f"\n\n{line}" for line in estimate),
    )


if __name__ == "__main__":
    main()

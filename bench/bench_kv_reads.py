"""How fast a decode step's paged KV cache can be read, in the paged-attention kernel's order.

    python bench/bench_kv_reads.py [--batch 8] [--cached 512] [--threads 2] [--repeat 40]

The floor under ``paged_attention``'s decode kernel from memory (``tilework.op.paged_attention_decode``):
a C/OpenMP loop that only reads, as the kernel does, every layer's slice of a bfloat16 pool of
SmolLM2-135M's shape (30 layers, 3 kv heads of 64, pages of ``--page`` tokens): tasks of a
sequence's pages (split like the kernel's at this batch), each page's keys then its values
(contiguous blocks of ``3 * 64 * page * 2`` bytes each), summed with vector adds, nothing else.
Printed: GB/s with the pages in address order and shuffled (as a pool in use gives them),
without software prefetch and with the next page's (or the page ``--ahead`` further) lines
hinted into L2 as the kernel does; then the read bandwidth of a plain sum over 1 GiB
(``report.BandwidthMeter``) in the same run. The kernel's own time is
``bench/bench_paged_attention.py``'s.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


from report import threads_from_argv  # noqa: E402  (report imports no NumPy: OMP_NUM_THREADS is still set before it starts)

os.environ["OMP_NUM_THREADS"] = str(threads_from_argv(2))  # before OpenMP starts

import numpy as np  # noqa: E402

from report import BandwidthMeter  # noqa: E402

LAYERS, NKV, HD = 30, 3, 64

_KERNEL = r"""
#include <immintrin.h>
#include <stdint.h>
/* every layer's pages of nseq sequences (table[nseq][width] of pool pages), split tasks as the
   decode kernel does; the next page `ahead` pages on is hinted into L2 while a page is read
   (ahead 0: no hints) */
float kv_reads(const char* k, const char* v, const int32_t* table, int64_t layers, int64_t pool, int64_t nseq,
               int64_t width, int64_t page_bytes, int64_t splits, int64_t ahead) {
    float sink = 0.0f;
    const int64_t per = (width + splits - 1) / splits;
    for (int64_t layer = 0; layer < layers; ++layer) {
        #pragma omp parallel for schedule(static) reduction(+:sink)
        for (int64_t task = 0; task < nseq * splits; ++task) {
            const int64_t b = task / splits, sp = task % splits;
            __m256 acc = _mm256_setzero_ps();
            for (int64_t p = sp * per; p < (sp + 1) * per && p < width; ++p) {
                const int64_t at = (layer * pool + table[b * width + p]) * page_bytes;
                const int64_t pn = p + ahead < width ? p + ahead : width - 1;
                const int64_t next = (layer * pool + table[b * width + pn]) * page_bytes;
                for (int64_t l = 0; l < page_bytes; l += 64) {
                    if (ahead) {
                        __builtin_prefetch(k + next + l, 0, 2);
                        __builtin_prefetch(v + next + l, 0, 2);
                    }
                    acc = _mm256_add_ps(acc, _mm256_loadu_ps((const float*)(k + at + l)));
                }
                for (int64_t l = 0; l < page_bytes; l += 64) acc = _mm256_add_ps(acc, _mm256_loadu_ps((const float*)(v + at + l)));
            }
            float lanes[8];
            _mm256_storeu_ps(lanes, acc);
            for (int i = 0; i < 8; ++i) sink += lanes[i];
        }
    }
    return sink;
}
"""


def build() -> ctypes.CDLL:
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        raise SystemExit("bench_kv_reads: no C compiler (set CC)")
    d = tempfile.mkdtemp(prefix="tw-kv-reads-")
    src, lib = Path(d, "kv_reads.c"), Path(d, "kv_reads.so")
    src.write_text(_KERNEL)
    subprocess.run([cc, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    so = ctypes.CDLL(str(lib))
    so.kv_reads.restype = ctypes.c_float
    so.kv_reads.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 7
    return so


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cached", type=int, default=512, help="tokens in each sequence's cache")
    ap.add_argument("--page", type=int, default=16, help="tokens a page (the engine's: 16)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--ahead", type=int, default=2, help="hint distances tried: 1 .. AHEAD pages")
    args = ap.parse_args()
    so = build()
    width = -(-(args.cached + 1) // args.page)
    pool = args.batch * width
    page_bytes = NKV * HD * args.page * 2  # bfloat16 keys (or values) of one page
    # the decode kernel's splits of a sequence's pages (tilework.op.paged_attention_decode)
    splits = max(1, min(16, width // 4, -(-32 // args.batch)))
    k = np.ones(LAYERS * pool * page_bytes, np.uint8)  # NumPy asks for huge pages at this size
    v = np.ones_like(k)
    rng = np.random.default_rng(0)
    tables = {"address order": np.arange(pool, dtype=np.int32), "shuffled": rng.permutation(pool).astype(np.int32)}
    read = 2 * LAYERS * pool * page_bytes
    print(f"{args.threads} threads; batch {args.batch}, {args.cached} cached tokens, pages of {args.page} tokens "
          f"({page_bytes} bytes of keys, as many of values), {splits} split(s) a sequence; {read / 1e6:.0f} MB a step")
    print(f"{'pages':<15}{'hints':<22}{'best ms':>9}{'GB/s':>8}")
    for name, table in tables.items():
        for ahead in range(0, args.ahead + 1):
            best = float("inf")
            for _ in range(args.repeat):
                t = time.perf_counter()
                so.kv_reads(k.ctypes.data, v.ctypes.data, table.ctypes.data, LAYERS, pool, args.batch, width, page_bytes, splits, ahead)
                best = min(best, time.perf_counter() - t)
            hints = "none" if ahead == 0 else f"the page {ahead} ahead"
            print(f"{name:<15}{hints:<22}{1e3 * best:9.2f}{read / best / 1e9:8.1f}", flush=True)
    meter = BandwidthMeter()
    print(f"read bandwidth: {meter():.1f} GB/s ({meter.how})")


if __name__ == "__main__":
    main()

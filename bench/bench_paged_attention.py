"""The paged-attention kernels by KV-cache dtype: float32 against bfloat16 and float16 pages.

    python bench/bench_paged_attention.py [--shapes 1x512,8x512] [--repeat 30] [--threads 2] [--layers 30] [--in-order]

SmolLM2-135M's attention (9 query heads, 3 kv heads of 64, 30 layers, pages of 16 tokens):
for each (batch, cached tokens) shape, the ``paged_attention`` calls of one decode step, one
per layer (each appends its new key and value and attends over every cached token of its own
slice of the pool: a step reads the whole pool, as the model's does), with the pool of each
dtype, the dtypes interleaved run by run so they see the same machine load. Printed per dtype:
the best and median ms of a step's 30 calls, the best per call (us/layer) and the KV bytes they read per second, then the
ratio of float32's time to each 16-bit dtype's (> 1: the 16-bit pool is faster). Pages are
given to the sequences in a shuffled order, as a pool in use would (``--in-order``: each
sequence's pages one after another, as a prompt's prefill leaves them). ``--layers 3`` keeps
the pool of a short step in the last-level cache (at batch 8 and 512 tokens, 9 MB of bf16):
the time per layer against the 30 layers' tells how much of it is waiting for memory.
"""

from __future__ import annotations

import argparse
import os
import time


from report import threads_from_argv  # noqa: E402  (report imports no NumPy: OMP_NUM_THREADS is still set before it starts)

os.environ["OMP_NUM_THREADS"] = str(threads_from_argv(2))  # before OpenMP starts

import numpy as np  # noqa: E402

import tilework as tw  # noqa: E402
from tilework.ir.builder import BlockBuilder  # noqa: E402
from tilework.ir.dtype import np_dtype  # noqa: E402
from tilework.ir.graph import Var  # noqa: E402
from tilework.ir.info import TensorInfo  # noqa: E402
from tilework.llm.kv_cache import kv_shapes  # noqa: E402
from tilework.op import paged_attention  # noqa: E402

LAYERS, NH, NKV, HD, PAGE, THETA = 30, 9, 3, 64, 16, 100000.0
DTYPES = ("float32", "bfloat16", "float16")


def decode_vm(kv: str, layers: int = LAYERS) -> tw.VM:
    b, pages, width = tw.dim("b", max=64), tw.dim("pages"), tw.dim("width", max=512)
    qkv = Var("qkv", TensorInfo((b, 1, NH + 2 * NKV, HD), "float32"))
    k_shape, v_shape = kv_shapes(layers, pages, NKV, HD, PAGE, kv)
    kc, vc = Var("kc", TensorInfo(k_shape, kv)), Var("vc", TensorInfo(v_shape, kv))
    kl, pt = Var("kl", TensorInfo((b,), "int32")), Var("pt", TensorInfo((b, width), "int32"))
    bb = BlockBuilder()
    with bb.function("main", [qkv, kc, vc, kl, pt]):
        with bb.dataflow():
            outs = [bb.emit(paged_attention(qkv, kc, vc, kl, pt, layer=i, kv_heads=NKV, rope_theta=THETA)) for i in range(layers)]
            out = bb.emit_output(tw.op.concat(outs, axis=0))
        bb.emit_func_output(out)
    return tw.VM(tw.build(bb.get()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x512,8x512", help="BATCHxCACHED, comma-separated")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--layers", type=int, default=LAYERS, help="layers a step attends over (3: the pool of 8 x 512 tokens fits the L3)")
    ap.add_argument("--in-order", action="store_true", help="each sequence's pages in order (default: shuffled)")
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    layers = args.layers
    vms = {kv: decode_vm(kv, layers)["main"] for kv in dtypes}
    print(f"{args.threads} threads; load average {os.getloadavg()[0]:.1f} at the start")
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        batch, cached = (int(x) for x in shape.split("x"))
        width = -(-(cached + 1) // PAGE)
        pool = batch * width
        table = (np.arange(pool) if args.in_order else rng.permutation(pool)).astype(np.int32).reshape(batch, width)
        qkv = rng.standard_normal((batch, 1, NH + 2 * NKV, HD)).astype(np.float32)
        kv_len = np.full(batch, cached, np.int32)
        pools = {}
        for kv in dtypes:
            k_shape, v_shape = kv_shapes(layers, pool, NKV, HD, PAGE, kv)  # the pool's layout (pairs for bfloat16)
            k = rng.standard_normal(k_shape).astype(np_dtype(kv))
            v = rng.standard_normal(v_shape).astype(np_dtype(kv))
            pools[kv] = (k, v)
        times: dict[str, list[float]] = {kv: [] for kv in dtypes}
        for i in range(args.repeat + 2):
            for kv in dtypes:
                k, v = pools[kv]
                t = time.perf_counter()
                vms[kv](qkv, k, v, kv_len, table)
                if i >= 2:
                    times[kv].append(time.perf_counter() - t)
        print(f"\n== decode, batch {batch}, {cached} cached tokens, {layers} layers, pages {'in order' if args.in_order else 'shuffled'} ==")
        print(f"{'KV dtype':<10}{'best ms':>9}{'median ms':>11}{'us/layer':>10}{'KV GB/s':>9}")
        for kv in dtypes:
            best, med = min(times[kv]), float(np.median(times[kv]))
            read = 2 * layers * batch * (cached + 1) * NKV * HD * np_dtype(kv).itemsize
            print(f"{kv:<10}{1e3 * best:9.2f}{1e3 * med:11.2f}{1e6 * best / layers:10.1f}{read / best / 1e9:9.1f}")
        if "float32" in times:
            ratios = [f"{kv} {min(times['float32']) / min(times[kv]):.2f}x (median {np.median(times['float32']) / np.median(times[kv]):.2f}x)" for kv in dtypes if kv != "float32"]
            print("float32 time / 16-bit time: " + ", ".join(ratios))
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()

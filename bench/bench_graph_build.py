"""Build and verify a 30-layer Llama-shaped graph with a symbolic seq (issue: Foundation).

Prints the number of bindings and the time to build (BlockBuilder with inference at every
emit), verify, print to text and parse back. Aim: build + verify under 2 s.

    python bench/bench_graph_build.py [--layers 30] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from tilework.ir.structural import structural_equal
from tilework.ir.verify import verify
from tilework.models.reference import LlamaConfig, llama_graph
from tilework.text import parse

from report import emit, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cfg = LlamaConfig(layers=args.layers)
    build_t, verify_t, print_t, parse_t = [], [], [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        mod = llama_graph(cfg)
        t1 = time.perf_counter()
        verify(mod)
        t2 = time.perf_counter()
        text = str(mod)
        t3 = time.perf_counter()
        back = parse(text)
        t4 = time.perf_counter()
        build_t.append(t1 - t0)
        verify_t.append(t2 - t1)
        print_t.append(t3 - t2)
        parse_t.append(t4 - t3)
    assert structural_equal(back, mod)
    main_fn = mod["main"]
    n = sum(len(b.bindings) for b in main_fn.body.blocks)  # type: ignore[union-attr]
    med = statistics.median
    print(f"{args.layers}-layer Llama-shaped graph, symbolic seq: {n} bindings, {len(main_fn.params)} params")  # type: ignore[union-attr]
    print(f"  build (builder + inference): {med(build_t) * 1e3:8.1f} ms")
    print(f"  verify:                      {med(verify_t) * 1e3:8.1f} ms")
    print(f"  build + verify:              {(med(build_t) + med(verify_t)) * 1e3:8.1f} ms   (aim: < 2000 ms)")
    print(f"  print to text:               {med(print_t) * 1e3:8.1f} ms ({len(text) / 1024:.0f} KiB)")
    print(f"  parse back:                  {med(parse_t) * 1e3:8.1f} ms")
    print(f"  output: {main_fn.ret_info}")  # type: ignore[union-attr]
    ms = lambda v: f"{v * 1e3:.1f}"  # noqa: E731
    rows = [
        ("build (BlockBuilder, inference at every emit)", ms(med(build_t))),
        ("verify", ms(med(verify_t))),
        ("**build + verify** (aim < 2000 ms)", f"**{ms(med(build_t) + med(verify_t))}**"),
        (f"print to text ({len(text) / 1024:.0f} KiB)", ms(med(print_t))),
        ("parse back", ms(med(parse_t))),
    ]
    emit("graph-build", f"{args.layers}-layer Llama-shaped graph, {n} bindings, {len(main_fn.params)} params, median of {args.repeat}:\n\n" + table(["step", "ms"], rows))  # type: ignore[union-attr]


if __name__ == "__main__":
    main()

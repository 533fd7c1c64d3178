"""Memory planning: intermediate memory with and without ``plan_memory`` (issue: dynamic-shape
aware cross-level optimizations, item 5).

Models: the 2-layer transformer block (hidden 64, ffn 256; batch and seq unbounded, so its plan
is a pooled arena sized per call) and the 6-layer MiniLM-shaped encoder (hidden 384, ffn 1536;
batch <= 64 and seq <= 512, so its plan is a static arena allocated once per VM), each compiled
once, at (batch, seq) = (1, 128) and (8, 256).

Without planning every intermediate is its own NumPy array, dropped after its last use
(kill_after_last_use): we report the arrays and bytes allocated per call, the peak of live bytes
measured at run time (weak references; the output included) and the peak of live intermediates
alone (from their lifetimes). With planning: the arena bytes this shape uses (offsets are
symbolic, so a smaller shape uses a compact prefix), the arena's bytes for the upper bounds
(static: obtained on the first call and kept), the memory a steady-state call obtains (only its
output, which the caller owns) and the peak (arena + output). Planning lowers the peak below
what freeing after the last use reaches because elementwise kernels write over an input they
are the last reader of (gelu over its matmul, a residual add over the projection).

Also the kernel launches per forward of three models (the block, the MiniLM-shaped encoder, the
30-layer Llama-shaped graph) after legalization, unfused and fused: distinct kernels / calls.

    python bench/bench_memory.py [--views]

``--views`` also runs rewrite_reshape_to_view (reshapes become zero-copy views).
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import numpy as np

import tilework as tw
from tilework.transform.pipeline import lowering_through
from tilework.ir import sym_walk
from tilework.ir.graph import GraphFunc
from tilework.ir.info import TensorInfo
from tilework.models.reference import EncoderConfig, TransformerConfig, encoder, random_weights, transformer_block
from tilework.transform.pipeline import Pass, Pipeline
from tilework.transform.plan_memory import FunctionPlan, plan_function

from report import emit, table

SHAPES = [(1, 128), (8, 256)]
MB = 1 << 20


def mb(n: float) -> str:
    return f"{n / MB:7.2f}"


def lowered_plan(mod: tw.IRModule, extra: list[Pass]) -> FunctionPlan:
    """The plan of ``main`` (its placements carry each intermediate's lifetime and size)."""
    return plan_function(Pipeline(lowering_through("lower_calls", kernel=extra))(mod), "main")


def intermediate_peak(plan: FunctionPlan, env: dict[Any, int]) -> int:
    """Peak bytes of live intermediates when each is its own allocation freed after its last
    use: the largest sum of sizes over the lifetimes that contain one binding."""
    events = [(pl.start, pl.end, sym_walk.evaluate(pl.nbytes, env)) for pl in plan.placements]
    return max((sum(n for s, e, n in events if s <= t <= e) for t, _, _ in events), default=0)


def measure(name: str, mod: tw.IRModule, n_inputs: int, make_inputs: Callable[[int, int], list[np.ndarray]], extra: list[Pass]) -> list[dict[str, Any]]:
    main_fn = mod["main"]
    assert isinstance(main_fn, GraphFunc)
    x_info = main_fn.params[0].info
    assert isinstance(x_info, TensorInfo) and x_info.shape is not None
    batch, seq = x_info.shape[:2]
    weights = random_weights(list(main_fn.params[n_inputs:]))
    plain_exe = tw.build(mod, plan_memory=False, post_legalize_passes=extra)
    plan_exe = tw.build(mod, post_legalize_passes=extra)
    plain_vm = tw.VM(plain_exe, track_live=True)
    plan_vm = tw.VM(plan_exe, track_live=True)
    plan = lowered_plan(mod, extra)
    rows = []
    for b, s in SHAPES:
        args = [*make_inputs(b, s), *weights]
        plain, planned = plain_vm["main"], plan_vm["main"]
        ref = plain(*args)  # warm up, then measure with the previous output released
        del ref
        s0 = plain_vm.memory_stats()
        plain_vm.memory.reset_peaks()
        ref = plain(*args)
        s1 = plain_vm.memory_stats()
        first = planned(*args).copy()  # the first call obtains the arena
        p0 = plan_vm.memory_stats()
        out = planned(*args)
        p1 = plan_vm.memory_stats()
        assert np.allclose(out, ref, rtol=1e-5, atol=1e-5) and np.array_equal(first, out)
        arena_used = p1["static_used_bytes"] + p1["pooled_peak_bytes"]
        rows.append(
            {
                "model": name,
                "shape": (b, s),
                "plain_allocs": s1["allocations"] - s0["allocations"],
                "plain_bytes": s1["allocated_bytes"] - s0["allocated_bytes"],
                "plain_peak": s1["peak_live_bytes"],
                "plain_inter": intermediate_peak(plan, {batch: b, seq: s}),
                "plan_allocs": p1["allocations"] - p0["allocations"],
                "plan_bytes": p1["allocated_bytes"] - p0["allocated_bytes"],
                "arena_used": arena_used,
                "arena_bound": p1["static_bytes"] if p1["static_bytes"] else p1["pooled_bytes"],
                "plan_peak": arena_used + out.nbytes,
                "plain_ins": plain_exe.stats()["instructions"],
                "plan_ins": plan_exe.stats()["instructions"],
            }
        )
    return rows


def launches(mod: tw.IRModule) -> tuple[int, int]:
    """(distinct kernels, kernel calls per run of ``main``) of a legalized module."""
    from tilework.ir.graph import Call, OpRef, bindings_of

    main_fn = mod["main"]
    assert isinstance(main_fn, GraphFunc)
    calls = [b.value for b in bindings_of(main_fn) if isinstance(b.value, Call) and isinstance(b.value.callee, OpRef) and b.value.callee.name == "call_tensor"]
    return len(list(mod.tensor_funcs())), len(calls)


def fusion_table() -> str:
    from tilework.models.reference import LlamaConfig, llama_graph
    from tilework.transform.fuse_tensor import fusion_passes
    from tilework.transform.legalize import Legalize

    rows = []
    for name, mod in (("transformer block, 2 layers", transformer_block(TransformerConfig())), ("MiniLM-shaped encoder, 6 layers", encoder(EncoderConfig())), ("Llama-shaped graph, 30 layers", llama_graph(LlamaConfig()))):
        legal = Legalize()(mod)
        (k0, c0), (k1, c1) = launches(legal), launches(Pipeline(fusion_passes())(legal))
        rows.append((name, f"{k0} / {c0}", f"{k1} / {c1}", f"{100 * (1 - c1 / c0):.1f}%"))
    return table(["model", "unfused", "fused", "cut in calls"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--views", action="store_true", help="also rewrite reshapes to views")
    a = ap.parse_args()
    extra: list[Pass] = []
    if a.views:
        from tilework.transform.rewrite_reshape_to_view import RewriteReshapeToView

        extra = [RewriteReshapeToView()]
    rng = np.random.default_rng(0)
    block_cfg, enc_cfg = TransformerConfig(), EncoderConfig()

    def block_inputs(b: int, s: int) -> list[np.ndarray]:
        return [rng.standard_normal((b, s, block_cfg.hidden)).astype(np.float32)]

    def enc_inputs(b: int, s: int) -> list[np.ndarray]:
        return [rng.standard_normal((b, s, enc_cfg.hidden)).astype(np.float32), np.zeros((b, 1, 1, s), np.float32)]

    rows = measure("block-2L (unbounded)", transformer_block(block_cfg), 1, block_inputs, extra)
    rows += measure("encoder-6L (b<=64,s<=512)", encoder(enc_cfg), 2, enc_inputs, extra)

    print(f"memory planning{' (reshapes as views)' if a.views else ''}; MiB")
    head = (
        f"{'model':26} {'shape':9} | {'no plan: allocs/call':>20} {'MiB/call':>8} {'peak':>7} {'interm.':>7} | "
        f"{'plan: allocs/call':>17} {'MiB/call':>8} {'arena':>7} {'bound':>7} {'peak':>7} | "
        f"{'cut: peak':>9} {'interm.':>7} {'MiB/call':>8} | {'instructions':>12}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        cuts = [1 - r["plan_peak"] / r["plain_peak"], 1 - r["arena_used"] / r["plain_inter"], 1 - r["plan_bytes"] / r["plain_bytes"]]
        print(
            f"{r['model']:26} {str(r['shape']):9} | {r['plain_allocs']:20d} {mb(r['plain_bytes'])} {mb(r['plain_peak'])} {mb(r['plain_inter'])} | "
            f"{r['plan_allocs']:17d} {mb(r['plan_bytes'])} {mb(r['arena_used'])} {mb(r['arena_bound'])} {mb(r['plan_peak'])} | "
            f"{100 * cuts[0]:8.1f}% {100 * cuts[1]:6.1f}% {100 * cuts[2]:7.1f}% | {r['plain_ins']:5d} -> {r['plan_ins']:4d}"
        )
    print(
        "\nno plan: each intermediate is a new array freed after its last use. peak: live bytes measured at the"
        "\nworst moment (the output included); interm.: the same for intermediates only, from their lifetimes."
        "\nplan: arena = planned bytes this shape uses (offsets are dims: a compact prefix), bound = the arena's"
        "\nbytes for the upper bounds (static, obtained once per VM) or the size-class block held (pooled);"
        "\npeak = arena + output. Steady-state calls obtain only their output. instructions: VM bytecode."
    )
    md = []
    for r in rows:
        cuts = [1 - r["plan_peak"] / r["plain_peak"], 1 - r["arena_used"] / r["plain_inter"], 1 - r["plan_bytes"] / r["plain_bytes"]]
        md.append((f"{r['model']} {r['shape']}", f"{r['plain_allocs']}, {r['plain_bytes'] / MB:.2f}", f"{r['plain_inter'] / MB:.2f}", f"{r['arena_used'] / MB:.2f}", f"{100 * cuts[1]:.1f}%", f"{100 * cuts[2]:.1f}%"))
    emit("memory", "Intermediate memory (MiB), without planning (every intermediate its own array, freed after its last use) vs planned (symbolic-offset arenas; static for bounded dims):\n\n" + table(["model, (b, s)", "no plan: arrays/call, MiB/call", "no plan: peak intermediates", "plan: arena", "cut: peak intermediates", "cut: MiB obtained per call"], md))
    fusion = fusion_table()
    print("\nkernel launches per forward (distinct kernels / calls), unfused vs fused:\n" + fusion)
    emit("fusion", "Kernel launches per forward (distinct kernels / calls), legalized, unfused vs fused:\n\n" + fusion)

if __name__ == "__main__":
    main()

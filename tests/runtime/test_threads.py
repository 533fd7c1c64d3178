"""Many Python threads calling one compiled model at once: every output equals the one a
single thread computes for the same input (per-call state, no shared argument buffers).

The model is a small transformer block with dynamic batch and sequence length, once with
unbounded dims (pooled memory) and once with bounded dims (static arenas); threads run the
shapes in different orders, so calls with different shapes overlap in the same kernels."""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import pytest

import tilework as tw
from tilework.ir.sym import SymVar
from tilework.models.reference import TransformerConfig, random_weights, transformer_block

CFG = TransformerConfig(layers=2, hidden=32, heads=4, ffn=64)
SHAPES = [(1, 1), (1, 7), (2, 16), (3, 5), (1, 33), (2, 64), (4, 9), (1, 2)]
THREADS = 6
ROUNDS = 4


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal((b, s, CFG.hidden)).astype(np.float32) for b, s in SHAPES]


@pytest.fixture(scope="module", params=["unbounded", "bounded"])
def built(request: pytest.FixtureRequest) -> tuple[tw.Executable, list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    if request.param == "bounded":
        mod = transformer_block(CFG, SymVar("batch", 1, 4), SymVar("seq", 1, 64))
    else:
        mod = transformer_block(CFG)
    exe = tw.build(mod)
    weights = random_weights(list(mod["main"].params[1:]))
    xs = _inputs()
    ref_vm = tw.VM(exe)
    refs = [ref_vm["main"](x, *weights).copy() for x in xs]  # one thread, one call at a time
    return exe, weights, xs, refs


def _hammer(worker: Callable[[int], Callable[..., Any]], xs: list[np.ndarray], refs: list[np.ndarray]) -> list[str]:
    """Run every shape ROUNDS times in each of THREADS threads (each thread its own order,
    all starting together); the mismatches and errors, described."""
    problems: list[str] = []
    start = threading.Barrier(THREADS)

    def run(t: int) -> None:
        f = worker(t)
        order = np.random.default_rng(t).permutation(len(xs) * ROUNDS) % len(xs)
        start.wait()
        for i in order:
            try:
                out = f(xs[i])
            except Exception as e:  # noqa: BLE001 - every failure is reported by the test
                problems.append(f"thread {t} shape {SHAPES[i]}: {type(e).__name__}: {e}")
                continue
            if out.shape != refs[i].shape or not np.allclose(out, refs[i], rtol=1e-5, atol=1e-6):
                err = float(np.max(np.abs(out - refs[i]))) if out.shape == refs[i].shape else float("inf")
                problems.append(f"thread {t} shape {SHAPES[i]}: max error {err}")

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return problems


def test_one_vm_many_threads(built: tuple) -> None:
    exe, weights, xs, refs = built
    vm = tw.VM(exe)
    main = vm["main"]
    problems = _hammer(lambda t: lambda x: main(x, *weights), xs, refs)
    assert not problems, "\n".join(problems[:10])
    # still right afterwards, on the VM's own memory
    np.testing.assert_allclose(main(xs[5], *weights), refs[5], rtol=1e-5, atol=1e-6)


def test_one_bound_function_many_threads(built: tuple) -> None:
    exe, weights, xs, refs = built
    step = tw.VM(exe).bind("main", *weights)
    assert not (problems := _hammer(lambda t: step, xs, refs)), "\n".join(problems[:10])


def test_one_executable_a_vm_per_thread(built: tuple) -> None:
    exe, weights, xs, refs = built

    def worker(t: int) -> Callable[..., Any]:
        main = tw.VM(exe)["main"]
        return lambda x: main(x, *weights)

    assert not (problems := _hammer(worker, xs, refs)), "\n".join(problems[:10])


def test_a_failing_call_does_not_disturb_the_others(built: tuple) -> None:
    exe, weights, xs, refs = built
    main = tw.VM(exe)["main"]
    bad = np.zeros((1, 3, CFG.hidden + 1), np.float32)

    def worker(t: int) -> Callable[..., Any]:
        if t % 2:
            return lambda x: main(x, *weights)

        def with_errors(x: np.ndarray) -> np.ndarray:
            with pytest.raises(tw.TileworkError):
                main(bad, *weights)
            return main(x, *weights)

        return with_errors

    assert not (problems := _hammer(worker, xs, refs)), "\n".join(problems[:10])

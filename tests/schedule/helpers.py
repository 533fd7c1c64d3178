"""Checks the schedule tests share: numerics against NumPy through the reference interpreter
(or the compiled C kernels), well-formedness, and the text round trip."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from tests.schedule.kernels import KERNELS
from tilework.codegen.interp import run
from tilework.ir.loop import TensorFunc
from tilework.ir.module import IRModule
from tilework.ir.structural import assert_structural_equal
from tilework.ir.verify import verify
from tilework.text.parser import parse
from tilework.text.printer import print_module

# Sizes every numeric check runs: all ones, small odd ones, and ones past a vector or tile.
SIZES = [dict(n=1, m=1, k=1), dict(n=5, m=7, k=3), dict(n=19, m=37, k=70)]


def outputs_for(func: TensorFunc, inputs: Sequence[np.ndarray], ref: np.ndarray) -> list[np.ndarray]:
    return [np.full(ref.shape, np.nan, dtype=b.dtype) for b in func.outputs]


def check_kernel(
    func: TensorFunc,
    kernel: str,
    sizes: Sequence[dict[str, int]] = SIZES,
    runner: Callable[..., None] = run,
    seed: int = 0,
) -> None:
    """Run ``func`` (a schedule of kernel ``kernel`` from ``KERNELS``) at every size and
    compare with the NumPy reference."""
    _, make_args, reference = KERNELS[kernel]
    rng = np.random.default_rng(seed)
    for s in sizes:
        ins = make_args(rng, s)
        want = reference(*ins)
        (out,) = outputs_for(func, ins, want)
        runner(func, [*ins, out])
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5, err_msg=f"{kernel} at sizes {s}")


def well_formed(func: TensorFunc) -> None:
    """``func`` passes the verifier and prints and parses back to an equal function."""
    mod = IRModule({"f": func})
    verify(mod)
    assert_structural_equal(parse(print_module(mod)), mod)

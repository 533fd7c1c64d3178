"""Helpers for pass tests written as text: the IR before, the pass, the IR expected.

``check_pass`` parses both texts, verifies the input, runs the pass, verifies its output and
compares it with the expected module structurally (names of vars and sym vars do not matter);
on a mismatch the failure shows the first differing path and a diff of the printed IR.
``same_numerics`` verifies the passes' output, compiles the module with and without them and
compares the results.
"""

from __future__ import annotations

import difflib
import textwrap
from typing import Any, Sequence

import numpy as np

import tilework as tw
import tilework.op.vm  # noqa: F401  (registers the vm_* ops and assert_dims for the parser)
from tilework.ir.module import IRModule
from tilework.ir.structural import assert_structural_equal
from tilework.ir.verify import verify
from tilework.text import parse
from tilework.transform.pipeline import Pass


def ir(text: str) -> IRModule:
    """The module written in ``text`` (indentation removed), verified."""
    mod = parse(textwrap.dedent(text))
    verify(mod)
    return mod


def check_pass(pass_: Pass, before: str | IRModule, expected: str | IRModule) -> IRModule:
    """Run ``pass_`` on ``before``; the verified result must equal ``expected``."""
    mod = before if isinstance(before, IRModule) else ir(before)
    after = pass_(mod)
    verify(after)
    want = expected if isinstance(expected, IRModule) else ir(expected)
    try:
        assert_structural_equal(after, want)
    except AssertionError as e:
        diff = "\n".join(
            difflib.unified_diff(str(want).splitlines(), str(after).splitlines(), "expected", f"after {pass_.name}", lineterm="")
        )
        raise AssertionError(f"{e}\n--- diff of the printed IR (names may differ where structure agrees) ---\n{diff}") from None
    return after


def check_unchanged(pass_: Pass, before: str) -> IRModule:
    return check_pass(pass_, before, before)


def run(mod: IRModule, args: Sequence[np.ndarray], **build: Any) -> Any:
    exe = tw.build(mod, **build)
    return tw.VM(exe)["main"](*args)


def assert_same_results(got: Any, want: Any, rtol: float = 1e-6) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_results(g, w, rtol)
        return
    g, w = np.asarray(got), np.asarray(want)
    assert g.shape == w.shape and g.dtype == w.dtype, f"{g.shape} {g.dtype} vs {w.shape} {w.dtype}"
    np.testing.assert_allclose(g.astype("float64"), w.astype("float64"), rtol=rtol, atol=rtol)


def same_numerics(mod: IRModule, passes: Sequence[Pass], args: Sequence[np.ndarray], post_legalize: bool = False, rtol: float = 1e-6) -> Any:
    """Compile ``mod`` without and with ``passes`` (before lowering, or right after legalize)
    and check that both give the same results on ``args``; returns the results with them."""
    from tilework.transform.legalize import Legalize
    from tilework.transform.pipeline import Pipeline

    verify(Pipeline([*([Legalize()] if post_legalize else []), *passes])(mod))
    want = run(mod, args)
    extra = {"post_legalize_passes": passes} if post_legalize else {"passes": passes}
    got = run(mod, args, **extra)
    assert_same_results(got, want, rtol)
    return got

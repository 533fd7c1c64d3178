"""The elementwise rule splits a nest at a concat's pieces (``rules.pieces``): one nest per
piece, no select left, the same values as NumPy through the interpreter and the C kernels."""

from __future__ import annotations

import numpy as np
import pytest

import tilework as tw
from tests.schedule.helpers import well_formed
from tilework import te
from tilework.codegen import build_library
from tilework.codegen.interp import run
from tilework.ir.loop import For, Select, TensorFunc
from tilework.schedule import default_schedule
from tilework.schedule.rules.common import top_nests
from tilework.schedule.tree import map_stmt_scalars, walk

F32 = "float32"
CHANNELS = (5, 4, 2)  # the pieces' channels; 11 in all


def _concat_scale_relu(batch: object, axis: int, channels: tuple[int, ...] = CHANNELS) -> TensorFunc:
    """``relu(concat(a, b, c, axis) * s)``, ``s`` per position along ``axis`` (a batch norm's
    scale), the pieces ``[batch, C_k, 3, 7]`` (axis 1) or ``[batch, 3, 7, C_k]`` (axis 3)."""
    def shape(c: int) -> tuple:
        return (batch, c, 3, 7) if axis == 1 else (batch, 3, 7, c)

    xs = [te.placeholder(shape(c), F32, name) for c, name in zip(channels, "abc")]
    total = sum(channels)
    s = te.placeholder((total,), F32, "s")

    def pick(*i: object) -> object:
        offsets = np.cumsum((0, *channels))
        value = None
        for k in reversed(range(len(xs))):
            idx = list(i)
            idx[axis] = i[axis] - int(offsets[k])  # type: ignore[operator]
            at = xs[k][tuple(idx)]
            value = at if value is None else te.if_then_else(te.lt(i[axis], int(offsets[k + 1])), at, value)
        return value

    cat = te.compute(shape(total), pick, "cat")
    out = te.compute(shape(total), lambda *i: te.maximum(cat[i] * s[i[axis]], 0.0), "out")
    return te.create_func([*xs, s, out])


def _selects(f: TensorFunc) -> int:
    found = []
    map_stmt_scalars(f.body, lambda e: found.append(e) if isinstance(e, Select) else None)
    return len(found)


def _reference(arrays: list[np.ndarray], axis: int) -> np.ndarray:
    *xs, s = arrays
    shape = [1, 1, 1, 1]
    shape[axis] = -1
    return np.maximum(np.concatenate(xs, axis=axis) * s.reshape(shape), 0.0)


def _inputs(batch: int, axis: int, rng: np.random.Generator, channels: tuple[int, ...] = CHANNELS) -> list[np.ndarray]:
    shapes = [(batch, c, 3, 7) if axis == 1 else (batch, 3, 7, c) for c in channels]
    return [rng.standard_normal(sh).astype(np.float32) for sh in shapes] + [rng.standard_normal(sum(channels)).astype(np.float32)]


@pytest.mark.parametrize("batch", [1, 3, "n"])
def test_a_concat_along_an_outer_axis_runs_as_one_nest_a_piece(batch: object) -> None:
    f = _concat_scale_relu(tw.dim("n") if batch == "n" else batch, 1)
    assert _selects(f) == 2
    g = default_schedule(f, strict=True)
    assert g.attrs["schedule_rule"] == "elementwise"
    assert len(top_nests(g)) == len(CHANNELS) and _selects(g) == 0
    well_formed(g)
    rng = np.random.default_rng(0)
    lib = build_library({"k": g})
    for n in ([1, 2, 5] if batch == "n" else [batch]):
        ins = _inputs(int(n), 1, rng)  # type: ignore[arg-type]
        want = _reference(ins, 1)
        for runner in (lambda arrays: run(g, arrays), lib["k"].run):
            out = np.full(want.shape, np.nan, np.float32)
            runner([*ins, out])
            np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


WIDE = (20, 16, 33)  # channel-last pieces of a vector (16 floats) or more


def test_a_concat_along_the_innermost_axis_runs_a_loop_a_piece_inside_the_others() -> None:
    """A channel-last concat: the outer loops stay outside (fused, parallel), the pieces'
    loops inside them, each vectorized and reading one input."""
    f = _concat_scale_relu(tw.dim("n"), 3, WIDE)
    g = default_schedule(f, strict=True)
    assert len(top_nests(g)) == 1 and _selects(g) == 0
    kinds = [s.kind for _, s in walk(g.body) if isinstance(s, For)]
    assert kinds == ["parallel"] + ["vectorized"] * len(WIDE), kinds
    well_formed(g)
    lib = build_library({"k": g})
    rng = np.random.default_rng(1)
    for n in (1, 2, 5):
        ins = _inputs(n, 3, rng, WIDE)
        want = _reference(ins, 3)
        for runner in (lambda arrays: run(g, arrays), lib["k"].run):
            out = np.full(want.shape, np.nan, np.float32)
            runner([*ins, out])
            np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


def test_channel_last_pieces_shorter_than_a_vector_stay_one_nest() -> None:
    """Loops of a few lanes inside the fused outer loops would pay an index decode every few
    elements: the nest stays whole, its selects in place."""
    g = default_schedule(_concat_scale_relu(2, 3), strict=True)
    assert len(top_nests(g)) == 1 and _selects(g) == 2
    ins = _inputs(2, 3, np.random.default_rng(2))
    want = _reference(ins, 3)
    out = np.full(want.shape, np.nan, np.float32)
    build_library({"k": g})["k"].run([*ins, out])
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)

"""Padding, tiling and resizing (``tilework.op.pad``): symbolic inference, and legalized kernels
compiled to C and run at several values of their sym vars against NumPy references."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tilework as tw
import tilework.op as op
from tests.op.helpers import R, T, holds, infer, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, random_array, shape_at
from tilework.errors import InferenceError, ShapeError
from tilework.ir import sym
from tilework.ir.sym import SymVar

n, m = tw.dim("n"), tw.dim("m")
S = T(dtype="float32")  # a 0-d float tensor (the pad value)


def test_pad_inference() -> None:
    assert info_of(lambda x, v: op.pad.pad(x, v, (1, 0, 2, 3)), T(n, m), S) == T(n + 3, m + 3)
    assert info_of(lambda x, v: op.pad.pad(x, v, (0, -1, 0, -1), "edge"), T(4, 5), S) == T(4, 3)
    info, checks = infer(lambda x, v: op.pad.pad(x, v, (0, -2)), T(n), S)
    assert info == T(n - 2) and [c.kind for c in checks] == ["ge"]
    assert holds(checks, {n: 2}) and not holds(checks, {n: 1})
    assert info_of(lambda x, v: op.pad.pad(x, v, (1, 1)), R(1), S) == R(1)
    with pytest.raises(InferenceError, match="pads needs 4 entries"):
        infer(lambda x, v: op.pad.pad(x, v, (1, 1)), T(n, m), S)
    with pytest.raises(InferenceError, match="mode must be one of constant, reflect, edge, wrap"):
        infer(lambda x, v: op.pad.pad(x, v, (1, 1), "mirror"), T(n), S)
    with pytest.raises(ShapeError, match="reflect padding 4 must be smaller than dim 0"):
        infer(lambda x, v: op.pad.pad(x, v, (4, 0), "reflect"), T(4), S)
    with pytest.raises(InferenceError, match="dtypes disagree"):
        infer(lambda x, v: op.pad.pad(x, v, (1, 1)), T(n, dtype="int32"), S)


def test_tile_and_resize_inference() -> None:
    assert info_of(lambda x: op.pad.tile(x, (2, 1)), T(n, m)) == T(2 * n, m)
    assert info_of(lambda x: op.pad.tile(x, (n, 3)), T(2, m)) == T(2 * n, 3 * m)
    with pytest.raises(InferenceError, match="repeats needs one entry per dim"):
        infer(lambda x: op.pad.tile(x, (2,)), T(n, m))
    assert info_of(lambda x: op.pad.resize(x, (1, 3, 2 * n, 8), mode="linear"), T(1, 3, n, 4)) == T(1, 3, 2 * n, 8)
    with pytest.raises(InferenceError, match="linear interpolation needs a floating-point tensor"):
        infer(lambda x: op.pad.resize(x, (4,), mode="linear"), T(2, dtype="int32"))
    with pytest.raises(InferenceError, match="coord must be one of"):
        infer(lambda x: op.pad.resize(x, (4,), coord="center"), T(2))


# -- NumPy references ----------------------------------------------------------------------------


def _np_pad(x: np.ndarray, v: np.ndarray, pads: tuple[int, ...], mode: str) -> np.ndarray:
    """NumPy pads only outward: crop the negative amounts first."""
    r = x.ndim
    crop = tuple(slice(max(0, -pads[k]), x.shape[k] - max(0, -pads[r + k])) for k in range(r))
    widths = [(max(0, pads[k]), max(0, pads[r + k])) for k in range(r)]
    y = x[crop]
    if mode == "constant":
        return np.pad(y, widths, mode="constant", constant_values=v.item())
    np_mode: Any = mode
    return np.pad(y, widths, mode=np_mode)


def _resize_ref(x: np.ndarray, sizes: tuple[int, ...], mode: str, coord: str) -> np.ndarray:
    """Separable 1-D resampling along each dim (float64)."""
    out = x.astype(np.float64)
    for axis, size in enumerate(sizes):
        d = out.shape[axis]
        if d == size:
            continue
        scale = size / d
        i = np.arange(size, dtype=np.float64)
        src = {"asymmetric": i / scale, "half_pixel": (i + 0.5) / scale - 0.5, "align_corners": i * (d - 1) / (size - 1) if size > 1 else 0 * i}[coord]
        if mode == "nearest":
            frac = src - np.floor(src)
            idx = np.clip(np.where(frac <= 0.5, np.floor(src), np.ceil(src)).astype(np.int64), 0, d - 1)
            out = np.take(out, idx, axis=axis)
            continue
        lo = np.floor(src)
        w = src - lo
        i0, i1 = np.clip(lo.astype(np.int64), 0, d - 1), np.clip(lo.astype(np.int64) + 1, 0, d - 1)
        shape = [1] * out.ndim
        shape[axis] = size
        out = np.take(out, i0, axis=axis) * (1 - w).reshape(shape) + np.take(out, i1, axis=axis) * w.reshape(shape)
    return out.astype(x.dtype)


ENVS = envs({n: 3, m: 4}, {n: 6, m: 5}, {n: 9, m: 7})


def _with_value(shape: tuple, dtype: str = "float32") -> Any:
    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        return [random_array(shape_at(shape, env), dtype, rng), np.asarray(2.5 if dtype == "float32" else 7, dtype=dtype)]

    return make


def _cases() -> list[Case]:
    c = []
    for mode in ("constant", "reflect", "edge", "wrap"):
        pads = (1, 2, 2, 1)
        c.append(Case(f"pad_{mode}", lambda x, v, mode=mode: op.pad.pad(x, v, pads, mode), [T(n, m), S], lambda x, v, mode=mode: _np_pad(x, v, pads, mode), ENVS, inputs=_with_value((n, m))))
    c.append(Case("pad_crop", lambda x, v: op.pad.pad(x, v, (-1, 2, 0, -2)), [T(n, m), S], lambda x, v: _np_pad(x, v, (-1, 2, 0, -2), "constant"), ENVS, inputs=_with_value((n, m))))
    c.append(Case("tile", lambda x: op.pad.tile(x, (2, 3)), [T(n, m)], lambda x: np.tile(x, (2, 3)), ENVS))
    c.append(Case("tile_bool", lambda x: op.pad.tile(x, (1, 2, 2)), [T(2, n, 3, dtype="bool")], lambda x: np.tile(x, (1, 2, 2)), ENVS))
    for mode in ("nearest", "linear"):
        for coord in ("asymmetric", "half_pixel", "align_corners"):
            sizes = (1, 2, 2 * n, 7)
            c.append(Case(f"resize_{mode}_{coord}", lambda x, mode=mode, coord=coord: op.pad.resize(x, sizes, mode=mode, coord=coord), [T(1, 2, n, m)], lambda x, mode=mode, coord=coord: _resize_ref(x, (1, 2, 2 * x.shape[2], 7), mode, coord), ENVS, tol=1e-5))
    return c + [_pad_int_sym()]


def _pad_int_sym() -> Case:
    """Pads that are dims: (0, 1) before and (m - 3, 0) after a (2, n) int tensor."""

    def make(env: dict[SymVar, int], rng: np.random.Generator) -> list[np.ndarray]:
        return [random_array((2, env[n]), "int32", rng), np.asarray(7, np.int32), np.zeros(env[m], np.float32)]

    return Case(
        "pad_int_sym",
        lambda x, v, _: op.pad.pad(x, v, (0, 1, sym.sub(m, 3), 0)),
        [T(2, n, dtype="int32"), T(dtype="int32"), T(m)],
        lambda x, v, y: np.pad(x, [(0, y.shape[0] - 3), (1, 0)], constant_values=7),
        ENVS,
        inputs=make,
    )


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


def test_resize_reference_matches_torch() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra; the NumPy reference is checked against it when present")
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 4)).astype(np.float32)
    got = _resize_ref(x, (1, 2, 10, 7), "linear", "half_pixel")
    want = torch.nn.functional.interpolate(torch.from_numpy(x), size=(10, 7), mode="bilinear", align_corners=False).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got = _resize_ref(x, (1, 2, 10, 7), "linear", "align_corners")
    want = torch.nn.functional.interpolate(torch.from_numpy(x), size=(10, 7), mode="bilinear", align_corners=True).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

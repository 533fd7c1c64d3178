"""``conv_transpose``, ``adaptive_max_pool2d``, ``grid_sample`` and ``rnn``: symbolic inference,
and legalized kernels run at several values of the symbolic dims (0, 1 and odd sizes among
them) against float64 NumPy references, which are checked against torch where it is installed.
A few cases whose kernels are slow to compile run only with TILEWORK_LONG_TESTS=1."""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import numpy as np
import pytest

import tilework as tw
from tests.op.helpers import T, info_of
from tests.op.legalize_harness import Built, Case, assert_round_trips, build, check, envs, shape_at
from tests.op.test_conv import adaptive_ref
from tilework.errors import InferenceError
from tilework.op import conv, pad, rnn
from tests.long import LONG

n, h, w, t = tw.dim("n", min=0), tw.dim("h"), tw.dim("w"), tw.dim("t", min=0)  # batch and time may be 0

# -- inference ------------------------------------------------------------------------------------


def test_conv_transpose_infers_symbolic_lengths() -> None:
    out = info_of(lambda x, k: conv.conv_transpose(x, k, strides=2, padding=1, output_padding=1), T(n, 4, h, w), T(4, 3, 3, 3))
    assert out == T(n, 3, (h - 1) * 2 - 2 + 2 + 1 + 1, (w - 1) * 2 - 2 + 2 + 1 + 1)
    out = info_of(lambda x, k: conv.conv_transpose(x, k, strides=3, dilation=2, groups=2, ndim=1), T(n, 4, w), T(4, 5, 2))
    assert out == T(n, 10, (w - 1) * 3 + 3)


def test_grid_sample_and_rnn_inference() -> None:
    assert info_of(lambda x, g: pad.grid_sample(x, g), T(n, 3, h, w), T(n, 5, t, 2)) == T(n, 3, 5, t)
    with pytest.raises(InferenceError, match="cubic grid sampling needs a 2-D input"):
        info_of(lambda x, g: pad.grid_sample(x, g, mode="cubic"), T(n, 3, 4, h, w), T(n, 5, 2, t, 3))
    got = info_of(lambda xw, r, rb, h0, lens: rnn.rnn(xw, r, rb, h0, lens, "gru"), T(t, n, 12), T(12, 4), T(12), T(n, 4), T(n, dtype="int64"))
    assert str(got) == str(tw.ir.info.TupleInfo((T(t, n, 4), T(n, 4))))
    with pytest.raises(Exception, match="must hold 3 gates of the hidden size 4"):
        info_of(lambda xw, r, rb, h0, lens: rnn.rnn(xw, r, rb, h0, lens, "gru"), T(t, n, 8), T(12, 4), T(12), T(n, 4), T(n, dtype="int64"))


# -- NumPy references -----------------------------------------------------------------------------


def conv_transpose_ref(x: np.ndarray, k: np.ndarray, b: np.ndarray | None, strides: Sequence[int], padding: Sequence[int], out_pad: Sequence[int], dil: Sequence[int], groups: int) -> np.ndarray:
    x, k = x.astype(np.float64), k.astype(np.float64)
    nsp = x.ndim - 2
    dims, ks = x.shape[2:], k.shape[2:]
    full = [(d - 1) * s + dl * (kk - 1) + 1 + op_ for d, s, dl, kk, op_ in zip(dims, strides, dil, ks, out_pad)]
    cg, og = k.shape[0] // groups, k.shape[1]
    y = np.zeros((x.shape[0], og * groups, *full))
    for g in range(groups):
        xs, ws = x[:, g * cg : (g + 1) * cg], k[g * cg : (g + 1) * cg]
        for tap in itertools.product(*(range(s) for s in ks)):
            sl = tuple(slice(tp * dil[i], tp * dil[i] + strides[i] * (dims[i] - 1) + 1, strides[i]) for i, tp in enumerate(tap))
            y[(slice(None), slice(g * og, (g + 1) * og), *sl)] += np.einsum("nc...,co->no...", xs, ws[(slice(None), slice(None), *tap)])
    crop = tuple(slice(padding[i], full[i] - padding[nsp + i]) for i in range(nsp))
    y = y[(slice(None), slice(None), *crop)]
    if b is not None:
        y = y + b.astype(np.float64).reshape((1, -1) + (1,) * nsp)
    return y


def adaptive_max_ref(x: np.ndarray, size: Sequence[int]) -> np.ndarray:
    H, W = x.shape[2:]
    out = np.zeros(x.shape[:2] + tuple(size), x.dtype)
    for i, j in itertools.product(range(size[0]), range(size[1])):
        r0, r1 = i * H // size[0], -(-(i + 1) * H // size[0])
        c0, c1 = j * W // size[1], -(-(j + 1) * W // size[1])
        out[:, :, i, j] = x[:, :, r0:r1, c0:c1].max(axis=(2, 3))
    return out


def _reflect(c: float, lo2: float, hi2: float) -> float:
    if lo2 == hi2:
        return 0.0
    lo, span = lo2 / 2, (hi2 - lo2) / 2
    c = abs(c - lo)
    flips = math.floor(c / span)
    extra = c - flips * span
    return extra + lo if flips % 2 == 0 else span - extra + lo


def _pad_coord(c: float, size: int, padding: str, align: bool) -> float:
    if padding == "zeros":
        return c
    if padding == "reflection":
        c = _reflect(c, 0, 2 * (size - 1)) if align else _reflect(c, -1, 2 * size - 1)
    return min(max(c, 0.0), size - 1.0)


def _cubic(r: float, a: float = -0.75) -> list[float]:
    def far(v: float) -> float:
        return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a

    def near(v: float) -> float:
        return ((a + 2) * v - (a + 3)) * v * v + 1

    return [far(r + 1), near(r), near(1 - r), far(2 - r)]


def grid_sample_ref(x: np.ndarray, grid: np.ndarray, mode: str, padding: str, align: bool) -> np.ndarray:
    """torch's grid_sample, one output point at a time."""
    x = x.astype(np.float64)
    nsp = x.ndim - 2
    dims = x.shape[2:]
    out = np.zeros(x.shape[:2] + grid.shape[1:-1])

    def tap(b: int, idx: Sequence[int]) -> np.ndarray:
        if all(0 <= i < d for i, d in zip(idx, dims)):
            return x[(b, slice(None), *idx)]
        return np.zeros(x.shape[1])

    for b in range(x.shape[0]):
        for o in itertools.product(*(range(s) for s in grid.shape[1:-1])):
            g = grid[(b, *o)].astype(np.float64)
            raw = [((g[nsp - 1 - k] + 1) / 2 * (dims[k] - 1)) if align else (((g[nsp - 1 - k] + 1) * dims[k] - 1) / 2) for k in range(nsp)]
            if mode == "cubic":
                base = [math.floor(v) for v in raw]
                ws = [_cubic(v - bb) for v, bb in zip(raw, base)]
                acc = np.zeros(x.shape[1])
                for (dy, wy), (dx, wx) in itertools.product(zip(range(-1, 3), ws[0]), zip(range(-1, 3), ws[1])):
                    pos = [int(_pad_coord(base[0] + dy, dims[0], padding, align)), int(_pad_coord(base[1] + dx, dims[1], padding, align))]
                    acc += wy * wx * tap(b, pos)
                out[(b, slice(None), *o)] = acc
                continue
            c = [_pad_coord(v, d, padding, align) for v, d in zip(raw, dims)]
            if mode == "nearest":
                out[(b, slice(None), *o)] = tap(b, [int(np.rint(v)) for v in c])
                continue
            base = [math.floor(v) for v in c]
            acc = np.zeros(x.shape[1])
            for corner in itertools.product((0, 1), repeat=nsp):
                wgt = math.prod((v - bb) if bit else 1 - (v - bb) for v, bb, bit in zip(c, base, corner))
                acc += wgt * tap(b, [bb + bit for bb, bit in zip(base, corner)])
            out[(b, slice(None), *o)] = acc
    return out


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-v))


def rnn_ref(cell: str, xw: np.ndarray, r: np.ndarray, rb: np.ndarray, h0: np.ndarray, lens: np.ndarray, c0: np.ndarray | None = None, peep: np.ndarray | None = None, reverse: bool = False, lbr: bool = True) -> tuple[np.ndarray, ...]:
    steps, batch, _ = xw.shape
    hid = r.shape[1]
    y = np.zeros((steps, batch, hid))
    hs, cs = h0.astype(np.float64).copy(), (c0.astype(np.float64).copy() if c0 is not None else None)
    for b in range(batch):
        length = int(lens[b])
        for step in range(length):
            tt = length - 1 - step if reverse else step
            hb = hs[b]
            g = r @ hb + rb
            x = xw[tt, b]
            if cell == "lstm":
                assert cs is not None and peep is not None
                cb = cs[b]
                i = _sigmoid(x[:hid] + g[:hid] + peep[:hid] * cb)
                f = _sigmoid(x[hid : 2 * hid] + g[hid : 2 * hid] + peep[hid : 2 * hid] * cb)
                cand = np.tanh(x[2 * hid : 3 * hid] + g[2 * hid : 3 * hid])
                cs[b] = f * cb + i * cand
                o = _sigmoid(x[3 * hid :] + g[3 * hid :] + peep[2 * hid :] * cs[b])
                hs[b] = o * np.tanh(cs[b])
            elif cell == "gru":
                rg = _sigmoid(x[:hid] + g[:hid])
                z = _sigmoid(x[hid : 2 * hid] + g[hid : 2 * hid])
                if lbr:
                    nn = np.tanh(x[2 * hid :] + rg * g[2 * hid :])
                else:
                    nn = np.tanh(x[2 * hid :] + r[2 * hid :] @ (rg * hb) + rb[2 * hid :])
                hs[b] = (1 - z) * nn + z * hb
            else:
                v = x + g
                hs[b] = np.tanh(v) if cell == "rnn_tanh" else np.maximum(v, 0)
            y[tt, b] = hs[b]
    return (y, hs) if cs is None else (y, hs, cs)


# -- legalized kernels ----------------------------------------------------------------------------

ENVS = envs({n: 0, h: 2, w: 3}, {n: 1, h: 5, w: 1}, {n: 2, h: 3, w: 4})


def _ct_case(name: str, x: Any, k: Any, bias: bool, **attrs: Any) -> Case:
    nsp = len(x) - 2
    infos = [T(*x), T(*k)] + ([T(k[1] * attrs.get("groups", 1))] if bias else [])
    per = {a: attrs.get(a, d) for a, d in (("strides", 1), ("padding", 0), ("output_padding", 0), ("dilation", 1))}
    expand = {a: (v,) * (2 * nsp if a == "padding" else nsp) if isinstance(v, int) else tuple(v) for a, v in per.items()}

    def make(*args: Any) -> Any:
        return conv.conv_transpose(args[0], args[1], args[2] if bias else None, ndim=nsp, **attrs)

    def ref(*a: np.ndarray) -> np.ndarray:
        return conv_transpose_ref(a[0], a[1], a[2] if bias else None, expand["strides"], expand["padding"], expand["output_padding"], expand["dilation"], attrs.get("groups", 1))

    return Case(f"conv_transpose_{name}", make, infos, ref, ENVS, tol=1e-4)


def _grid_inputs(shape_x: Sequence[Any], shape_g: Sequence[Any]) -> Any:
    def make(env: Any, rng: np.random.Generator) -> list[np.ndarray]:
        sx, sg = shape_at(shape_x, env), shape_at(shape_g, env)
        return [rng.standard_normal(sx).astype(np.float32), (rng.random(sg) * 2.8 - 1.4).astype(np.float32)]

    return make


def _grid_case(name: str, mode: str, padding: str, align: bool, nsp: int = 2) -> Case:
    sx = (n, 2, h, w) if nsp == 2 else (n, 2, h, 3, w)
    sg = (n, 3, w, 2) if nsp == 2 else (n, 2, 3, w, 3)
    return Case(
        f"grid_sample_{name}",
        lambda x, g: pad.grid_sample(x, g, mode, padding, align),
        [T(*sx), T(*sg)],
        lambda x, g: grid_sample_ref(x, g, mode, padding, align),
        ENVS,
        inputs=_grid_inputs(sx, sg),
        tol=1e-4,
    )


def _rnn_inputs(cell: str, hid: int, full: bool) -> Any:
    gates = rnn.CELLS[cell]

    def make(env: Any, rng: np.random.Generator) -> list[np.ndarray]:
        steps, batch = env[t], env[n]
        f = lambda *s: (rng.standard_normal(s) * 0.6).astype(np.float32)  # noqa: E731
        lens = np.full(batch, steps, np.int64) if full else rng.integers(0, steps + 1, batch).astype(np.int64)
        arrays = [f(steps, batch, gates * hid), f(gates * hid, hid), f(gates * hid), f(batch, hid)]
        if cell == "lstm":
            arrays += [f(batch, hid), f(3 * hid)]
        return arrays + [lens]

    return make


def _rnn_case(name: str, cell: str, reverse: bool = False, lbr: bool = True, full: bool = True) -> Case:
    hid = 3
    gates = rnn.CELLS[cell]
    infos = [T(t, n, gates * hid), T(gates * hid, hid), T(gates * hid), T(n, hid)]
    if cell == "lstm":
        infos += [T(n, hid), T(3 * hid)]
    infos.append(T(n, dtype="int64"))

    def make(*a: Any) -> Any:
        if cell == "lstm":
            return rnn.rnn(a[0], a[1], a[2], a[3], a[6], cell, c0=a[4], peep=a[5], reverse=reverse)
        return rnn.rnn(a[0], a[1], a[2], a[3], a[4], cell, reverse=reverse, linear_before_reset=lbr)

    def ref(*a: np.ndarray) -> Any:
        a64 = [v.astype(np.float64) if v.dtype.kind == "f" else v for v in a]
        if cell == "lstm":
            return rnn_ref(cell, *a64[:4], a64[6], c0=a64[4], peep=a64[5], reverse=reverse)
        return rnn_ref(cell, *a64[:4], a64[4], reverse=reverse, lbr=lbr)

    rnn_envs = envs({t: 0, n: 2}, {t: 1, n: 1}, {t: 5, n: 3})
    return Case(f"rnn_{name}", make, infos, ref, rnn_envs, inputs=_rnn_inputs(cell, hid, full), tol=1e-4)


# kernels slow to compile (16-tap bicubic, 3-D, the second variants of the recurrences): long runs only
LONG_CASES = {"grid_sample_cubic_reflection", "grid_sample_3d_linear_border", "rnn_lstm_reverse_lens", "conv_transpose_3d"}


def _cases() -> list[Case]:
    cases = [
        _ct_case("2d", (n, 4, h, w), (4, 3, 3, 3), bias=True, strides=2, padding=1, output_padding=1),
        _ct_case("2d_groups_dilation", (n, 4, h, w), (4, 2, 2, 3), bias=True, groups=2, dilation=(2, 1), padding=(0, 1, 1, 0)),
        _ct_case("1d", (n, 3, w), (3, 2, 4), bias=False, strides=3, dilation=2),
        _ct_case("3d", (n, 2, h, 2, w), (2, 2, 2, 2, 2), bias=True, strides=(2, 1, 2)),
        Case("adaptive_max_2_3", lambda x: conv.adaptive_max_pool2d(x, (2, 3)), [T(n, 2, h, w)], lambda x: adaptive_max_ref(x, (2, 3)), ENVS),
        Case("adaptive_max_int32", lambda x: conv.adaptive_max_pool2d(x, 2), [T(n, 2, h, w, dtype="int32")], lambda x: adaptive_max_ref(x, (2, 2)), ENVS),
        _grid_case("linear_zeros", "linear", "zeros", False),
        _grid_case("nearest_border_align", "nearest", "border", True),
        _grid_case("cubic_reflection", "cubic", "reflection", False),
        _grid_case("linear_reflection_align", "linear", "reflection", True),
        _grid_case("3d_linear_border", "linear", "border", False, nsp=3),
        _rnn_case("lstm", "lstm"),
        _rnn_case("lstm_reverse_lens", "lstm", reverse=True, full=False),
        _rnn_case("gru", "gru"),
        _rnn_case("gru_reset_first_lens", "gru", lbr=False, full=False),
        _rnn_case("relu_reverse", "rnn_relu", reverse=True),
    ]
    return [c for c in cases if LONG or c.name not in LONG_CASES]


CASES = _cases()


@pytest.fixture(scope="module")
def built() -> Built:
    return build(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reference(built: Built, name: str) -> None:
    check(built, name)


def test_legalized_module_round_trips(built: Built) -> None:
    assert_round_trips(built)


def test_references_match_torch() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra; the NumPy references are checked against it when present")
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    tt = torch.from_numpy
    x, k, b = rng.standard_normal((2, 4, 5, 3)), rng.standard_normal((4, 3, 3, 2)), rng.standard_normal(6)
    want = F.conv_transpose2d(tt(x), tt(k), tt(b), stride=(2, 1), padding=(1, 0), output_padding=(1, 0), groups=2, dilation=(1, 2)).numpy()
    np.testing.assert_allclose(conv_transpose_ref(x, k, b, (2, 1), (1, 0, 1, 0), (1, 0), (1, 2), 2), want, atol=1e-10)
    np.testing.assert_allclose(adaptive_max_ref(x, (2, 3)), F.adaptive_max_pool2d(tt(x), (2, 3)).numpy())
    np.testing.assert_allclose(adaptive_ref(x, (2, 3)), F.adaptive_avg_pool2d(tt(x), (2, 3)).numpy(), atol=1e-12)
    grid = rng.random((2, 2, 2, 2)) * 2.8 - 1.4
    for k, (mode, padding) in enumerate(itertools.product(("linear", "nearest", "cubic"), ("zeros", "border", "reflection"))):
        align = k % 2 == 1
        tm = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}[mode]
        want = F.grid_sample(tt(x), tt(grid), mode=tm, padding_mode=padding, align_corners=align).numpy()
        np.testing.assert_allclose(grid_sample_ref(x, grid, mode, padding, align), want, atol=1e-9, err_msg=f"{mode} {padding} {align}")
    lstm, gru = torch.nn.LSTM(4, 3).double(), torch.nn.GRU(4, 3).double()
    xs = rng.standard_normal((5, 2, 4))
    with torch.no_grad():
        for layer, cell in ((lstm, "lstm"), (gru, "gru")):
            p = {name: v.numpy() for name, v in layer.named_parameters()}
            xw = xs @ p["weight_ih_l0"].T + p["bias_ih_l0"]
            zeros = np.zeros((2, 3))
            extra = {"c0": zeros, "peep": np.zeros(9)} if cell == "lstm" else {}
            got = rnn_ref(cell, xw, p["weight_hh_l0"], p["bias_hh_l0"], zeros, np.full(2, 5), **extra)
            want_y, _ = layer(tt(xs))
            np.testing.assert_allclose(got[0], want_y.numpy(), atol=1e-10)

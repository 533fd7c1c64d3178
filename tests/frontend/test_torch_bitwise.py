"""torch's bitwise ops on integer tensors (``&``, ``|``, ``^``, ``~``, ``bitwise_*`` with scalars)
through torch.export, at dynamic sizes, against torch eager."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="the torch frontend needs torch (an optional extra)")
import torch  # noqa: E402

import tilework  # noqa: E402


class Bits(torch.nn.Module):
    def forward(self, a: Any, b: Any, c: Any) -> Any:
        return a & b, a | 0x0F0F, a ^ b, ~a, torch.bitwise_xor(c, 3), ~(c > 2), (c > 0) & (c < 5)


def test_bitwise_ops_match_torch() -> None:
    n = torch.export.Dim("n", min=1, max=64)
    g = torch.Generator().manual_seed(0)

    def inputs(k: int) -> tuple[Any, ...]:
        big = torch.randint(-(2**62), 2**62, (k, 3), generator=g)
        return big, torch.randint(-(2**62), 2**62, (3,), generator=g), torch.randint(0, 255, (k,), generator=g).to(torch.uint8)

    cm = tilework.compile(Bits(), example_args=inputs(4), dynamic_shapes=({0: n}, None, {0: n}))
    for k in (1, 4, 7):
        xs = inputs(k)
        want = Bits()(*xs)
        got = cm(*[x.numpy() for x in xs])
        for w, o in zip(want, got):
            np.testing.assert_array_equal(np.asarray(o), w.numpy())


class Shifts(torch.nn.Module):
    def forward(self, a: Any, s: Any, c: Any) -> Any:
        return a << 3, a >> 2, a << s, a >> s, torch.bitwise_left_shift(c, 5), c >> s.to(torch.int32), 5 << s


def test_shifts_match_torch() -> None:
    """``<<`` and ``>>`` (they were unsupported ATen ops), shift amounts 0 to past the width: a
    right shift of a negative int64 by 63 is -1 (it gave 0: 2**63 overflowed)."""
    n = torch.export.Dim("n", min=0, max=64)
    g = torch.Generator().manual_seed(0)

    def inputs(k: int) -> tuple[Any, ...]:
        s = torch.randint(0, 70, (k, 4), generator=g)
        s[:, 0] = 63
        return torch.randint(-(2**62), 2**62, (k, 4), generator=g), s, torch.randint(-1000, 1000, (k, 4), generator=g).to(torch.int32)

    cm = tilework.compile(Shifts(), example_args=inputs(4), dynamic_shapes=({0: n}, {0: n}, {0: n}))
    for k in (0, 1, 7):
        xs = inputs(k)
        for w, o in zip(Shifts()(*xs), cm(*xs)):
            assert o.dtype == w.dtype
            np.testing.assert_array_equal(o.numpy(), w.numpy())

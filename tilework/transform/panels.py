"""Column panels: the layout of a weight that the matmul kernels stream (``linear_io`` and
``batch_linear_io`` take it; ``layout_weights`` and ``conv_gemm`` lay weights out in it at
compile time). ``[out, in]`` becomes ``[ceil(out / PANEL), in, PANEL]``: a register tile reads
``PANEL`` columns for every ``k``, and its whole ``K x PANEL`` block is one contiguous stream."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

_In = TypeVar("_In")
PANEL = 16  # columns per panel: a register tile spans one (AVX2: 2 x 8 floats) or two (AVX-512)


def lay_out(w: np.ndarray, panel: int = PANEL, out: np.ndarray | None = None) -> np.ndarray:
    """A ``[out, in]`` weight as ``linear_io`` takes it: ``[ceil(out / panel), in, panel]``,
    ``[p, k, c] = w[p * panel + c, k]``, zero past ``out``, contiguous; written into ``out``
    (of that shape and ``w``'s dtype) where it is given."""
    out_f, in_f = w.shape
    panels = -(-out_f // panel)
    if out is None:
        out = np.empty((panels, in_f, panel), w.dtype)
    whole = out_f // panel
    out[:whole] = w[: whole * panel].reshape(whole, panel, in_f).transpose(0, 2, 1)
    if whole < panels:  # the last panel's columns past ``out_f`` are zero
        out[whole:] = 0
        out[whole, :, : out_f - whole * panel] = w[whole * panel :].T
    return out


def packed_shape(out_f: int, in_f: _In, panel: int = PANEL) -> tuple[int, _In, int]:
    """The shape ``lay_out`` gives an ``[out_f, in_f]`` weight (``in_f`` may be symbolic)."""
    return (-(-out_f // panel), in_f, panel)


__all__ = ["PANEL", "lay_out", "packed_shape"]

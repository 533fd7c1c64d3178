"""The default schedule rules, one per pattern, tried in order; the first that applies wins.

Each rule module has ``NAME`` and ``apply(func) -> TensorFunc | None`` (None: it declines).
The fallback applies to every function.
"""

from __future__ import annotations

from tilework.schedule.rules import attention, elementwise, fallback, gemv, matmul, reduction, stencil, winograd_images

RULES = (attention, winograd_images, matmul, gemv, reduction, stencil, elementwise)
winograd_images.STEP_RULES = (matmul, gemv, reduction, stencil, elementwise, fallback)  # a step of one image

__all__ = ["RULES", "attention", "elementwise", "fallback", "gemv", "matmul", "reduction", "stencil", "winograd_images"]

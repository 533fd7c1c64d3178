"""annotate_op_pattern: label every TensorFunc with how it composes under fusion.

Each TensorFunc gets the attr ``op_pattern``: one of ``elementwise``, ``broadcast``,
``injective``, ``reduction``, ``out_ewise_fusable`` or ``opaque`` (``PATTERN_NAMES``), computed
by ``func_pattern`` from its blocks: ``tilework.schedule.analysis.op_pattern`` (each block
labelled from its store, loads and iter vars; a masked reduction counts as a reduction; the
function takes the highest label), except that a kernel with several reduction blocks
(softmax, layer_norm, attention) is a ``reduction``: only a kernel whose one reduction is a
matmul is ``out_ewise_fusable``. Hand-written kernels are labelled the same way; a kernel that
already carries a valid label keeps it (a user's override). Requires nothing; guarantees every
TensorFunc has the attr, and changes nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilework.ir.loop import TensorFunc
from tilework.ir.module import IRModule
from tilework.op.base import OpPattern
from tilework.schedule.analysis import is_reduction, op_pattern
from tilework.schedule.tree import blocks_of
from tilework.transform.base import Pass

PATTERN_ATTR = "op_pattern"

PATTERN_NAMES: dict[OpPattern, str] = {
    OpPattern.ELEMWISE: "elementwise",
    OpPattern.BROADCAST: "broadcast",
    OpPattern.INJECTIVE: "injective",
    OpPattern.REDUCTION: "reduction",
    OpPattern.OUT_EWISE_FUSABLE: "out_ewise_fusable",
    OpPattern.OPAQUE: "opaque",
}
_BY_NAME = {v: k for k, v in PATTERN_NAMES.items()}


def pattern_name(p: OpPattern) -> str:
    """The attr value for ``p`` (a tuple pattern has no kernel of its own: opaque)."""
    return PATTERN_NAMES.get(p, "opaque")


def parse_pattern(value: object) -> OpPattern | None:
    """The pattern an ``op_pattern`` attr value names (a name or an ``OpPattern`` number)."""
    if isinstance(value, str):
        return _BY_NAME.get(value)
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return OpPattern(value)
        except ValueError:
            return None
    return None


def func_pattern(func: TensorFunc) -> OpPattern:
    """The fusion label of ``func`` computed from its blocks (see the module doc)."""
    top = op_pattern(func)
    if top != OpPattern.OUT_EWISE_FUSABLE:
        return top
    n_reductions = sum(1 for b in blocks_of(func) if is_reduction(b))
    return OpPattern.REDUCTION if n_reductions > 1 else top


def pattern_of(func: TensorFunc) -> OpPattern:
    """The label in ``func``'s attrs when it has a valid one, else ``func_pattern(func)``."""
    given = parse_pattern(func.attrs.get(PATTERN_ATTR))
    return given if given is not None else func_pattern(func)


@dataclass(frozen=True)
class AnnotateOpPattern(Pass):
    name: str = "annotate_op_pattern"

    def run(self, mod: IRModule) -> IRModule:
        out = mod
        for name, f in mod.tensor_funcs():
            label = pattern_name(pattern_of(f))
            if f.attrs.get(PATTERN_ATTR) == label:
                continue
            out = out.with_func(name, f.replace(attrs=f.attrs.with_(**{PATTERN_ATTR: label})))
        return out


__all__ = [
    "AnnotateOpPattern",
    "PATTERN_ATTR",
    "PATTERN_NAMES",
    "func_pattern",
    "parse_pattern",
    "pattern_name",
    "pattern_of",
]

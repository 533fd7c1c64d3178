"""What the well-formedness checker (``tilework.ir.verify``) reports and how: the rules
(``RULES``), a ``Diagnostic``, and ``Checker``, the base of the graph and loop walkers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from tilework.ir import sym_walk
from tilework.ir.module import Function
from tilework.ir.sym import SymExpr, SymVar
from tilework.ir.verify_render import Where, _render

RULES = {
    "var-def": "rule 1: vars are defined once, before use, in their own function",
    "sym-def": "rule 2: sym vars are defined before use",
    "dataflow": "rule 3: dataflow vars live only inside their dataflow block",
    "anf": "rule 4: A-normal form",
    "purity": "rule 5: no impure calls in dataflow blocks or pure functions",
    "struct-info": "rule 6: struct info is present and consistent",
    "global": "rule 7: global names and callee kinds are consistent",
    "ret-info": "rule 8: the return info covers the body",
    "loop": "rule 9: loop-level scoping and forms",
}


@dataclass(frozen=True)
class Diagnostic:
    """One broken rule: ``rule`` (a key of ``RULES``), the function ``func``, the binding or
    statement ``where`` (None for the signature), what is wrong and what to do (``message``), and
    ``context``: the function rendered with ``where`` marked."""

    rule: str
    func: str
    message: str
    context: str
    where: Where = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"error[{self.rule}] in @{self.func}: {self.message}\n{self.context}"


def dims_syms(dims: Iterable[object]) -> tuple[SymVar, ...]:
    out: dict[SymVar, None] = {}
    for d in dims:
        if isinstance(d, SymExpr):
            out.update(dict.fromkeys(sym_walk.free_vars(d)))
    return tuple(out)


class Checker:
    """Collects one function's diagnostics, each reported once per ``once`` key."""

    def __init__(self, name: str, func: Function, out: list[Diagnostic]) -> None:
        self.name, self.func, self.out = name, func, out
        self.reported: set[object] = set()

    def emit(self, rule: str, message: str, where: Where, once: object = None) -> None:
        if once is not None:
            if once in self.reported:
                return
            self.reported.add(once)
        ctx = _render(self.name, self.func, where, RULES[rule])
        self.out.append(Diagnostic(rule, self.name, message, ctx, where))


__all__ = ["Checker", "Diagnostic", "RULES", "dims_syms"]

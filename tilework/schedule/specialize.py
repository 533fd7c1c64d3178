"""Specializing a kernel at run time: two schedules of one function in one body, chosen by a
condition on its sym vars (``rows < 8``: a matrix-vector schedule for decoding, a tiled one
for a prompt), so the kernel is still compiled once for every shape."""

from __future__ import annotations

from typing import Sequence

from tilework.errors import ScheduleError
from tilework.ir import sym_walk
from tilework.ir.loop import IfThenElse, Scalar, TensorFunc
from tilework.ir.sym import SymVar
from tilework.schedule.tree import rebind, scalar_vars, used_names


def branch(cond: Scalar, then_func: TensorFunc, else_func: TensorFunc) -> TensorFunc:
    """The function that runs ``then_func``'s body when ``cond`` holds and ``else_func``'s
    otherwise, with ``then_func``'s attrs. Both must have the same params (schedules of one
    function); ``cond`` may use only the sym vars the params supply. The loop vars, iter vars
    and scratch buffers of the else body are renamed apart (each var is bound once)."""
    return select([(cond, then_func)], else_func)


def select(cases: Sequence[tuple[Scalar, TensorFunc]], default: TensorFunc) -> TensorFunc:
    """``branch`` over several cases: the body of the first function whose condition holds,
    else ``default``'s, with the first function's attrs; every body after the first renamed
    apart once (a chain of ``branch`` calls renamed the growing else side at each link: the
    seven few-rows schedules of a matmul were a third of the time of scheduling a model)."""
    funcs = [f for _, f in cases] + [default]
    first = funcs[0]
    what, these = ("branch", "the two functions") if len(funcs) == 2 else ("select", "the functions")
    for f in funcs[1:]:
        if len(f.params) != len(first.params) or any(a is not b for a, b in zip(first.params, f.params)):
            raise ScheduleError(f"{what}: {these} do not have the same params")
        if f.num_outputs != first.num_outputs:
            raise ScheduleError(f"{what}: {these} have different numbers of outputs")
    known: set[SymVar] = set(first.sym_params)
    for b in first.buffers:
        for d in b.shape:
            known.update(() if isinstance(d, int) else sym_walk.free_vars(d))
    for cond, _ in cases:
        extra = scalar_vars(cond) - known
        if extra:
            raise ScheduleError(f"{what}: the condition uses {sorted(v.name for v in extra)}, which no param supplies")
    used = used_names(first)
    bodies = [first.body, *(rebind(f.body, used) for f in funcs[1:])]  # ``used`` grows with each
    body = bodies[-1]
    for (cond, _), then in zip(reversed(cases), reversed(bodies[:-1])):
        body = IfThenElse(cond, then, body)
    return first.replace(body=body)

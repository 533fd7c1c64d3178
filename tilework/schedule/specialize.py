"""Specializing a kernel at run time: two schedules of one function in one body, chosen by a
condition on its sym vars (``rows < 8``: a matrix-vector schedule for decoding, a tiled one
for a prompt), so the kernel is still compiled once for every shape."""

from __future__ import annotations

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
    if len(then_func.params) != len(else_func.params) or any(
        a is not b for a, b in zip(then_func.params, else_func.params)
    ):
        raise ScheduleError("branch: the two functions do not have the same params")
    if then_func.num_outputs != else_func.num_outputs:
        raise ScheduleError("branch: the two functions have different numbers of outputs")
    known: set[SymVar] = set(then_func.sym_params)
    for b in then_func.buffers:
        for d in b.shape:
            known.update(() if isinstance(d, int) else sym_walk.free_vars(d))
    extra = scalar_vars(cond) - known
    if extra:
        raise ScheduleError(f"branch: the condition uses {sorted(v.name for v in extra)}, which no param supplies")
    other = rebind(else_func.body, used_names(then_func))
    return then_func.replace(body=IfThenElse(cond, then_func.body, other))

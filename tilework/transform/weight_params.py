"""What the compile-time weight passes (``layout_weights``, ``bf16_weights``) share: finding
``main``'s trailing weight params that only rewritable linears read, and giving them the type
of their new storage (the list of retyped params is kept in an attr of ``main``, for the code
that converts the weights passed at run time).

A function's weight params are its trailing params from its attr ``num_inputs`` on, or the
params its attr ``weight_params`` lists (``WEIGHTS``: a region of a model built on its own,
whose weights are not trailing)."""

from __future__ import annotations

from typing import Callable

from tilework.ir.graph import AnyBinding, Binding, Call, GraphFunc, Var, bindings_of, used_vars
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule

WEIGHTS = "weight_params"


def weight_candidates(f: GraphFunc) -> list[int]:
    """The indices of ``f``'s params that hold weights (see the module docstring)."""
    if WEIGHTS in f.attrs:
        return [int(i) for i in f.attrs[WEIGHTS]]
    if "num_inputs" in f.attrs:
        return list(range(int(f.attrs["num_inputs"]), len(f.params)))
    return []


def weight_params(f: GraphFunc, param_ok: Callable[[Var], bool], linear_ok: Callable[[Call], bool]) -> list[int]:
    """Indices of ``f``'s weight params (``weight_candidates``) that ``param_ok`` accepts, that
    are read at least once, each time once, as the weight (``args[1]``) of a call ``linear_ok``
    accepts, and never returned."""
    candidates = [i for i in weight_candidates(f) if param_ok(f.params[i])]
    if not candidates:
        return []
    wanted = {id(f.params[i]) for i in candidates}
    users: dict[int, list[tuple[AnyBinding, int]]] = {}  # param -> (binding, its reads there)
    for b in bindings_of(f):  # one walk for all params (a walk a param: DenseNet-121's 360 x 2,600)
        reads: dict[int, int] = {}
        for v in used_vars(b.value):
            if id(v) in wanted:
                reads[id(v)] = reads.get(id(v), 0) + 1
        for key, n in reads.items():
            users.setdefault(key, []).append((b, n))
    returned = {id(v) for v in used_vars(f.body.body)}
    found = []
    for i in candidates:
        p = f.params[i]
        uses = users.get(id(p), [])
        only_weight = all(isinstance(b, Binding) and isinstance(b.value, Call) and linear_ok(b.value) and b.value.args[1] is p and n == 1 for b, n in uses)
        if uses and only_weight and id(p) not in returned:
            found.append(i)
    return found


def retype_weight_params(mod: IRModule, attr: str, find: Callable[[GraphFunc], list[int]], new_info: Callable[[TensorInfo], TensorInfo], func: str = "main") -> tuple[IRModule, dict[Var, Var]]:
    """``mod`` with the params ``find`` picks in ``func`` retyped by ``new_info`` and listed in
    ``func``'s attr ``attr``, and the map from each old param to its new one. Nothing changes
    when ``func`` has no weight params or already has ``attr`` (the pass ran before)."""
    main = mod.get(func)
    mapping: dict[Var, Var] = {}
    if not (isinstance(main, GraphFunc) and ("num_inputs" in main.attrs or WEIGHTS in main.attrs) and attr not in main.attrs):
        return mod, mapping
    idx = find(main)
    if not idx:
        return mod, mapping
    params = list(main.params)
    for i in idx:
        p = params[i]
        assert isinstance(p.info, TensorInfo) and p.info.shape is not None
        params[i] = Var(p.name, new_info(p.info))
        mapping[p] = params[i]
    return mod.with_func(func, main.replace(params=tuple(params), attrs=main.attrs.with_(**{attr: tuple(idx)}))), mapping

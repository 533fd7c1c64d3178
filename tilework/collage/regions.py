"""Regions as standalone functions: what the estimator builds and runs, and what the cost
cache hashes.

``region_function(g, nodes)`` makes a graph function of the bindings ``nodes`` of block ``g``:
its params are the vars the bindings read from outside, and the floating-point constants of at
least ``LIFT_ELEMENTS`` elements they read (weights baked in as constants: a cost does not
depend on their values, so the layers of a model with constant weights share one measurement,
and the cache key does not hash megabytes); its result the values the bindings provide outside
(one, or a tuple). Binding vars keep their names, so a ``RegionSpec`` naming the original vars
names the same bindings in the new function. The lifted constants and the inputs among
``weights`` (the model's weight params) are listed in the function's attr ``weight_params``:
``LayoutWeights`` lays them out as in the whole model, so a codegen region is measured with the
packed weights the model's kernels will read.

``null_function(f)`` has ``f``'s params and does nothing: timed beside ``f``, what the call
itself costs (param checks, sym var bindings), which the estimator subtracts.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

import numpy as np

from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.builder import BlockBuilder
from tilework.ir.dtype import np_dtype
from tilework.ir import info as I
from tilework.ir.graph import Binding, Constant, Expr, GraphFunc, MatchCast, PrimValue, ShapeExpr, Var
from tilework.ir.info import ShapeInfo, TensorInfo
from tilework.ir.sym import SymVar
from tilework.ir.visitor import ExprMutator, ExprVisitor
from tilework.pattern.graph import BlockGraph
from tilework.transform.weight_params import WEIGHTS


LIFT_ELEMENTS = 64


class _Rebind(ExprMutator):
    """Vars per ``var_map``, lifted constants (by identity) per ``lifted``; the rebuilt nodes'
    struct info is inferred again by the builder."""

    keep_info = False

    def __init__(self, var_map: dict[Var, Expr], lifted: dict[int, Var]) -> None:
        super().__init__(var_map)
        self.lifted = lifted

    def mutate_constant(self, e: Constant) -> Expr:
        return self.lifted.get(id(e), e)


def region_function(g: BlockGraph, nodes: Sequence[int], weights: Collection[Var] = ()) -> GraphFunc:
    """See the module docstring."""
    inputs, outputs = g.region_io(sorted(nodes))
    mapping: dict[Var, Expr] = {}
    lifted: dict[int, Var] = {}
    params: list[Var] = []
    weight_params: list[int] = []
    for e in inputs:
        if isinstance(e, Var):
            p = Var(e.name, e.info)
            mapping[e] = p
            weight_params += [len(params)] if e in weights else []
            params.append(p)
        elif isinstance(e, Constant) and e.data.dtype.kind == "f" and e.data.size >= LIFT_ELEMENTS:
            p = Var(f"tw_weight{len(lifted)}", e.info)
            lifted[id(e)] = p
            weight_params.append(len(params))
            params.append(p)
    missing = _unbound_sym_vars(g, sorted(nodes), params)
    if missing:  # dims the bindings use that no input's shape gives: passed as a shape
        params.append(Var("tw_dims", ShapeInfo(tuple(missing))))
    out_set = set(outputs)
    bb = BlockBuilder()
    with bb.function("region", params, attrs={WEIGHTS: tuple(weight_params)} if weight_params else None):
        with bb.dataflow():
            for i in sorted(nodes):
                b = g.bindings[i]
                value = _Rebind(mapping, lifted).mutate(b.value)
                if isinstance(b, MatchCast):
                    v = bb.match_cast(value, b.cast_info, name=b.var.name, output=b.var in out_set)
                elif b.var in out_set:
                    v = bb.emit_output(value, name=b.var.name)
                else:
                    assert isinstance(b, Binding)
                    v = bb.emit(value, name=b.var.name)
                mapping[b.var] = v
        result = [mapping[v] for v in outputs]
        bb.emit_func_output(result[0] if len(result) == 1 else result)
    f = bb.get()["region"]
    assert isinstance(f, GraphFunc)
    return f


def null_function(f: GraphFunc) -> GraphFunc | None:
    """A function with ``f``'s params (the same struct info: the same checks and sym var
    bindings at entry) that does no work and returns its first param: what calling ``f`` costs
    beyond its work, which the whole model, running the region's kernels inline, does not pay.
    None when ``f`` has no params."""
    if not f.params:
        return None
    params = [Var(p.name, p.info) for p in f.params]
    bb = BlockBuilder()
    with bb.function("null", params):
        bb.emit_func_output(params[0])
    out = bb.get()["null"]
    assert isinstance(out, GraphFunc)
    return out


class _SymUses(ExprVisitor):
    def __init__(self) -> None:
        self.vars: dict[SymVar, None] = {}

    def visit_shape_expr(self, e: ShapeExpr) -> None:
        for d in e.values:
            self.vars.update(dict.fromkeys(sym_walk.free_vars(d)))

    def visit_prim_value(self, e: PrimValue) -> None:
        if isinstance(e.value, sym.SymExpr):
            self.vars.update(dict.fromkeys(sym_walk.free_vars(e.value)))


def _unbound_sym_vars(g: BlockGraph, nodes: Sequence[int], params: Sequence[Var]) -> list[SymVar]:
    """The sym vars the bindings mention (in their values' shapes and prims, and their results'
    struct info) that neither a param's shape nor a match_cast among them defines."""
    uses = _SymUses()
    defined: set[SymVar] = set()
    for p in params:
        defined.update(I.defined_vars(p.info))
    for i in nodes:
        b = g.bindings[i]
        uses.visit(b.value)
        uses.vars.update(dict.fromkeys(I.free_vars(b.var.info)))
        if isinstance(b, MatchCast):
            defined.update(I.defined_vars(b.cast_info))
    return [v for v in uses.vars if v not in defined]


def input_shapes(f: GraphFunc, env: Mapping[SymVar, int]) -> list[tuple[int, ...]]:
    """The shapes of ``f``'s params at the dims ``env`` (see ``input_arrays``); for a shape
    param, its values."""
    out = []
    for p in f.params:
        info = p.info
        if isinstance(info, ShapeInfo) and info.values is not None:
            full = {v: env.get(v, max(1, v.lo or 0)) for d in info.values for v in sym_walk.free_vars(d)}
            out.append(tuple(sym_walk.evaluate(d, full) for d in info.values))
            continue
        if not isinstance(info, TensorInfo) or info.shape is None or info.dtype is None:
            raise ValueError(f"param %{p.name} is not a tensor of known shape and dtype ({info})")
        full = dict(env)
        for d in info.shape:
            for v in sym_walk.free_vars(d):
                full.setdefault(v, max(1, v.lo or 0))
        out.append(tuple(sym_walk.evaluate(d, full) for d in info.shape))
    return out


def input_arrays(f: GraphFunc, env: Mapping[SymVar, int], seed: int = 0) -> list[Any]:
    """Inputs for ``f`` at the dims ``env`` (a var missing from ``env`` takes its lower bound,
    at least 1): floats drawn from a normal distribution, integers and booleans zero (always a
    valid index)."""
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for p, shape in zip(f.params, input_shapes(f, env)):
        if isinstance(p.info, ShapeInfo):
            out.append(shape)  # a shape param takes a tuple of ints
            continue
        assert isinstance(p.info, TensorInfo) and p.info.dtype is not None
        dtype = np_dtype(p.info.dtype)
        if np.issubdtype(dtype, np.floating):
            out.append((rng.standard_normal(shape) * 0.5).astype(dtype))
        else:
            out.append(np.zeros(shape, dtype))
    return out


__all__ = ["region_function", "null_function", "input_arrays", "input_shapes"]

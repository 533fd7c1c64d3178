"""Shape buckets: placement per range of the dynamic dims, and the dispatch between them.

Costs depend on the dims (a matmul with one row wants GEMV, with 256 rows a GEMM). The dims of
the placed function's params are split into *buckets*, each measured at one representative
point; the search runs per bucket. One executable then holds every distinct placement as a
function of its own (``main__p0``, ``main__p1``, ...) and ``main`` dispatches on the run-time
values of the dims: still one compilation, no recompiling when a dim changes.

Default points per dim: its lower bound, 8, 64, 512 and its upper bound (those within the
bounds); or the user's (``buckets={"n": [1, 32, 256]}``). Consecutive points split at their
geometric mean, so bucket ``k`` of a dim covers ``(split(k-1), split(k)]``. The grid over
several dims is capped (``max_buckets``) by thinning the points of the dims with the most.

The dispatch condition of a bucket is one integer expression of the dims: a product of 0/1
indicators ``[n >= lo]`` and ``[n <= hi]`` made of ``min``/``max``, evaluated on the VM's
shape heap and read by an ``If``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tilework.errors import UnsupportedError
from tilework.ir import info as I
from tilework.ir import sym
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Call, DataflowVar, GraphFunc, PrimValue, Var
from tilework.ir.module import IRModule
from tilework.ir.sym import Dim, SymVar
from tilework.ir.visitor import ExprMutator
from tilework.transform.layout_weights import VARIANTS

DEFAULT_POINTS = (8, 64, 512)


@dataclass(frozen=True)
class Bucket:
    """``ranges``: per dim ``(name, lo, hi)`` (inclusive; ``hi`` None: unbounded); ``point``:
    the values it is measured at."""

    ranges: tuple[tuple[str, int, int | None], ...]
    point: tuple[tuple[str, int], ...]

    def env(self, vars_: Mapping[str, SymVar]) -> dict[SymVar, int]:
        return {vars_[name]: value for name, value in self.point if name in vars_}

    def contains(self, values: Mapping[str, int]) -> bool:
        return all(lo <= values[n] and (hi is None or values[n] <= hi) for n, lo, hi in self.ranges if n in values)

    def label(self) -> str:
        if not self.ranges:
            return "all shapes (static)"
        parts = [f"{n} in [{lo}, {'inf' if hi is None else hi}]" for n, lo, hi in self.ranges]
        at = ", ".join(f"{n}={v}" for n, v in self.point)
        return f"{', '.join(parts)} (measured at {at})"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of a placement plan's bucket; ``PlacementPlan.from_dict`` reads it
        back, checking each field (``collage.place``)."""
        return {"ranges": [list(r) for r in self.ranges], "point": [list(p) for p in self.point]}


def bucket_vars(f: GraphFunc) -> list[SymVar]:
    """The sym vars ``f``'s params define, in first-occurrence order."""
    seen: dict[SymVar, None] = {}
    for p in f.params:
        for v in I.defined_vars(p.info):
            seen[v] = None
    return list(seen)


def _points(v: SymVar, given: Sequence[int] | None) -> list[int]:
    lo = max(v.lo, 1)
    if given is not None:
        pts = sorted({int(p) for p in given})
        bad = [p for p in pts if p < v.lo or (v.hi is not None and p > v.hi)]
        if bad or not pts:
            raise UnsupportedError(f"buckets for dim {v.name!r}: points {bad or pts} are outside its range [{v.lo}, {'inf' if v.hi is None else v.hi}]")
        return pts
    chosen = {lo, *(p for p in DEFAULT_POINTS if p > lo and (v.hi is None or p < v.hi))}
    if v.hi is not None:
        chosen.add(v.hi)
    return sorted(chosen)


def make_buckets(vars_: Sequence[SymVar], given: Mapping[str, Sequence[int]] | None = None, max_buckets: int = 8) -> list[Bucket]:
    """The bucket grid over ``vars_`` (see the module docstring)."""
    given = dict(given or {})
    names = {v.name for v in vars_}
    unknown = [k for k in given if k not in names]
    if unknown:
        raise UnsupportedError(f"buckets name dim(s) {', '.join(unknown)}, which the function's inputs do not have (its dims: {', '.join(sorted(names)) or 'none'})")
    points = {v.name: _points(v, given.get(v.name)) for v in vars_}
    while math.prod(len(p) for p in points.values()) > max_buckets:
        name = max((n for n in points if n not in given), key=lambda n: len(points[n]), default=None)
        if name is None or len(points[name]) <= 2:
            break
        pts = points[name]
        del pts[len(pts) // 2]  # keep both ends
    per_var = []
    for v in vars_:
        pts = points[v.name]
        splits = [math.isqrt(a * b) for a, b in zip(pts, pts[1:])]
        los = [v.lo] + [s + 1 for s in splits]
        his: list[int | None] = [*splits, v.hi]
        per_var.append([(v.name, lo, hi, p) for lo, hi, p in zip(los, his, pts)])
    out = []
    for combo in itertools.product(*per_var):
        out.append(Bucket(tuple((n, lo, hi) for n, lo, hi, _ in combo), tuple((n, p) for n, _, _, p in combo)))
    return out or [Bucket((), ())]


def _indicator(v: SymVar, lo: int, hi: int | None) -> Dim:
    """1 when ``lo <= v <= hi``, else 0."""
    out: Dim = 1
    if lo > v.lo:
        out = sym.mul(out, sym.min_(sym.max_(sym.add(sym.sub(v, lo), 1), 0), 1))
    if hi is not None and (v.hi is None or hi < v.hi):
        out = sym.mul(out, sym.min_(sym.max_(sym.sub(hi + 1, v), 0), 1))
    return out


class _Renew(ExprMutator):
    """Every var bound anew (same name, kind and info): a module binds each var once."""

    def mutate_var_def(self, v: Var) -> Var:
        new = (DataflowVar if isinstance(v, DataflowVar) else Var)(v.name, v.info)
        self.var_map[v] = new
        return new


def fresh_copy(f: GraphFunc) -> GraphFunc:
    """``f`` with every param and binding var replaced by a new one."""
    renew = _Renew()
    params = tuple(renew.mutate_var_def(p) for p in f.params)
    return f.replace(params=params, body=renew.mutate_seq_expr(f.body))


def dispatch_module(mod: IRModule, func: str, choice: Sequence[tuple[Bucket, int]], n_variants: int) -> IRModule:
    """``mod`` with ``func`` copied to ``func__p0..`` (one per placement variant; the caller
    offloads each) and ``func`` replaced by a dispatcher calling the variant of the bucket the
    dims fall in (the last bucket takes what no other does). A dispatching ``main`` names its
    variants in its attr ``placement_variants``: ``LayoutWeights`` lays out each variant's
    weight params and passes each the weights as it takes them."""
    f = mod[func]
    if not isinstance(f, GraphFunc):
        raise UnsupportedError(f"@{func} is not a graph function")
    funcs = dict(mod.items())
    for k in range(n_variants):
        funcs[f"{func}__p{k}"] = fresh_copy(f)
    by_name = {v.name: v for v in bucket_vars(f)}
    params = [Var(p.name, p.info) for p in f.params]
    bb = BlockBuilder(IRModule(funcs, mod.attrs))

    def call(k: int) -> Call:
        return Call(bb.global_var(f"{func}__p{k}"), tuple(params))

    def chain(rest: Sequence[tuple[Bucket, int]]) -> Any:
        bucket, k = rest[0]
        if all(j == k for _, j in rest):  # the rest run one variant: no more tests
            return bb.emit(call(k), name="out")
        cond: Dim = 1
        for name, lo, hi in bucket.ranges:
            cond = sym.mul(cond, _indicator(by_name[name], lo, hi))
        flag = bb.emit(PrimValue.of(cond), name="in_bucket")
        return bb.emit_if(flag, lambda: bb.emit(call(k), name="out"), lambda: chain(rest[1:]), name="out")

    attrs = {**dict(f.attrs), VARIANTS: tuple(f"{func}__p{k}" for k in range(n_variants))}
    with bb.function(func, params, attrs=attrs, pure=f.pure):
        out = chain(list(choice))
        bb.emit_func_output(out, ret_info=f.ret_info)
    return bb.get()


__all__ = ["Bucket", "bucket_vars", "make_buckets", "dispatch_module", "DEFAULT_POINTS"]

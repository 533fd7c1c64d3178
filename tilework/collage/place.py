"""Automatic placement: candidates, costs, the cheapest cover, per shape bucket.

``place(mod, backends)`` returns a ``PlacementPlan``: for each shape bucket of ``main``'s
dynamic dims (``tilework.collage.buckets``), a ``Placement`` of every dataflow block of every
graph function, found as follows:

1. the candidates of each block (``tilework.collage.candidates``: the backends' patterns,
   validity, pins, the codegen fallback);
2. their costs at the bucket's dims (``tilework.collage.cost``: measured on this machine, from
   the persistent cache when known; codegen's linears with their weights laid out, as the
   compiled model runs them): first the fallback (every binding alone on codegen; a
   binding that is not an op call costs nothing) and the candidates that run a pinned binding
   on its backend, then the rest while ``budget_s`` lasts;
3. the transition costs between backends, then the cheapest exact cover
   (``tilework.collage.search``);
4. *end-to-end validation* (``refine=True``, ``tilework.collage.validate``): the cover found,
   every single-backend plan, and the cheapest cover over codegen and each one other backend,
   are built whole and timed at the bucket's dims; the fastest measured is kept (so the error
   of adding up region costs never makes the result slower than a single backend, as far as
   the measurement can tell), and every plan's time goes into the bucket's plan.

``apply_plan(mod, plan)`` gives the module to compile: offloaded by the one placement, or, when
buckets chose differently, one copy of ``main`` per distinct placement and a ``main`` that
dispatches on the dims. A plan is JSON data: ``to_json``/``from_json``, ``save``/``load``;
compiled executables carry it in their metadata, and ``table()`` explains it.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tilework.backend.base import Backend, availability, backend_names, resolve_backends
from tilework.backend.offload import Offload
from tilework.backend.partition import Placement, RegionSpec, partition_by_rules
from tilework.collage.buckets import Bucket, bucket_vars, dispatch_module, make_buckets
from tilework.collage.candidates import FALLBACK, Candidate, block_candidates, is_op_binding, pinned_backend
from tilework.collage.cost import CostModel, MeasuredCostModel, ops_of
from tilework.collage.search import exact_cover
from tilework.collage.validate import Alternative, Option, pin_conflict, validate
from tilework.errors import FileFormatError, UnsupportedError
from tilework.ir.graph import Call, GraphFunc, OpRef
from tilework.ir.module import IRModule
from tilework.pattern.graph import BlockGraph, graphs_of
from tilework.transform.base import Pass
from tilework.transform.weight_params import weight_candidates

FORMAT = "tilework.placement"
FAILED_FALLBACK_S = 1.0  # the cost given to a codegen singleton that failed alone (any alternative wins)


@dataclass(frozen=True)
class Row:
    """One chosen region, for the explanation: where, what, on which backend at what cost, and
    the best alternative for the same bindings (another backend's candidate, or codegen op by
    op)."""

    func: str
    block: int
    vars: tuple[str, ...]
    ops: tuple[str, ...]
    backend: str
    cost_s: float
    alternative: str | None = None
    alternative_s: float | None = None


@dataclass(frozen=True)
class BucketPlan:
    """A bucket's placement; ``rows``: its regions when it is a cover (the search's), with
    ``estimate_s`` its cost by the search's sum (None for a plan that is not a cover);
    ``measured_s``: its end-to-end time; ``alternatives``: every plan timed end to end for the
    bucket (``tilework.collage.validate``); ``chosen_by``: which plan it is and why."""

    bucket: Bucket
    placement: Placement
    rows: tuple[Row, ...] = ()
    estimate_s: float | None = 0.0
    measured_s: float | None = None
    chosen_by: str = "search"
    alternatives: tuple[Alternative, ...] = ()


@dataclass(frozen=True)
class PlacementPlan:
    """Per bucket, the placement chosen; ``func``: the function dispatched on the buckets'
    dims; ``stats``: search time, candidates, measurements, cache hits."""

    buckets: tuple[BucketPlan, ...]
    backends: tuple[str, ...]
    func: str = "main"
    stats: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def variants(self) -> tuple[list[Placement], list[int]]:
        """The distinct placements and, per bucket, the index of its own."""
        distinct: list[Placement] = []
        index: list[int] = []
        for b in self.buckets:
            key = b.placement.to_json()
            for k, p in enumerate(distinct):
                if p.to_json() == key:
                    index.append(k)
                    break
            else:
                index.append(len(distinct))
                distinct.append(b.placement)
        return distinct, index

    # -- persistence ----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": FORMAT,
            "version": 1,
            "func": self.func,
            "backends": list(self.backends),
            "stats": dict(self.stats),
            "notes": list(self.notes),
            "buckets": [
                {
                    "bucket": b.bucket.to_dict(),
                    "placement": json.loads(b.placement.to_json()),
                    "rows": [[r.func, r.block, list(r.vars), list(r.ops), r.backend, _num(r.cost_s), r.alternative, _num(r.alternative_s)] for r in b.rows],
                    "estimate_s": _num(b.estimate_s),
                    "measured_s": _num(b.measured_s),
                    "chosen_by": b.chosen_by,
                    "alternatives": [[a.label, _num(a.seconds), a.detail] for a in b.alternatives],
                }
                for b in self.buckets
            ],
        }

    @staticmethod
    def from_dict(d: Any, where: str = "placement") -> "PlacementPlan":
        """The plan of ``to_dict``'s data; anything else (another kind or version, a field
        missing or of the wrong type, bucket ranges reversed or overlapping) is a
        ``FileFormatError`` naming ``where`` and the field."""
        r = _Reader(where)
        if not isinstance(d, Mapping) or d.get("kind") != FORMAT:
            raise FileFormatError(f"{where}: not a tilework placement (kind {d.get('kind') if isinstance(d, Mapping) else type(d).__name__!r})")
        if d.get("version") != 1:
            raise FileFormatError(f"{where}: placement version {d.get('version')!r}, but this tilework reads version 1 (made by another tilework? place the model again)")
        buckets = []
        for i, b in enumerate(r.items(d, "buckets")):
            at = f"buckets[{i}]"
            r.obj(b, at)
            bucket, placement = r.bucket(b, at), r.placement(b, at)
            rows = []
            for j, x in enumerate(r.items(b, "rows", at, default=[])):
                f = r.tuple_(x, f"{at}.rows[{j}]", 8, "[func, block, vars, ops, backend, cost_s, alternative, alternative_s]")
                rows.append(Row(r.str_(x, 0, f), r.int_(x, 1, f), r.strs(x, 2, f), r.strs(x, 3, f), r.str_(x, 4, f), r.secs(x, 5, f), r.str_(x, 6, f, none=True), r.secs(x, 7, f, none=True)))
            alts = []
            for j, a in enumerate(r.items(b, "alternatives", at, default=[])):
                f = r.tuple_(a, f"{at}.alternatives[{j}]", 3, "[label, seconds, detail]")
                alts.append(Alternative(r.str_(a, 0, f), r.secs(a, 1, f), r.str_(a, 2, f, none=True) or ""))
            buckets.append(BucketPlan(bucket, placement, tuple(rows), r.secs(b, "estimate_s", at, none=True), r.secs(b, "measured_s", at, none=True), r.str_(b, "chosen_by", at, default="search"), tuple(alts)))
        _check_ranges(buckets, where)
        stats = r.obj(d.get("stats") or {}, "stats")
        for k, v in stats.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise r.fail(f"stats.{k}", "a number", v)
        given = r.items(d, "notes", default=[])
        notes = tuple(r.str_(given, j, "notes") for j in range(len(given)))
        return PlacementPlan(tuple(buckets), r.strs(d, "backends"), r.str_(d, "func", default="main"), dict(stats), notes)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @staticmethod
    def from_json(text: str, where: str = "placement") -> "PlacementPlan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise FileFormatError(f"{where}: not JSON ({e})") from None
        return PlacementPlan.from_dict(data, where)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as JSON through the one writer of user-named files
        (``tilework.runtime.atomic``: atomic, a device node or FIFO refused, a full disk named)."""
        from tilework.runtime.atomic import write_bytes_atomic

        write_bytes_atomic(path, self.to_json().encode())

    @staticmethod
    def load(path: str | os.PathLike[str]) -> "PlacementPlan":
        """The plan saved at ``path``; a file that is missing, unreadable or not a plan is a
        ``FileFormatError`` naming it."""
        where = os.fspath(path)
        try:
            with open(where, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            raise FileFormatError(f"no such file: {where}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise FileFormatError(f"{where}: cannot read the placement ({getattr(e, 'strerror', None) or e})") from None
        return PlacementPlan.from_json(text, where)

    def table(self) -> str:
        from tilework.collage.report import plan_table

        return plan_table(self)


def _num(x: float | None) -> float | str | None:
    if x is None:
        return None
    return x if math.isfinite(x) else "inf"


def _check_ranges(buckets: Sequence[BucketPlan], where: str) -> None:
    """Each bucket's ranges run upwards, and no two buckets share a point (a dispatch would
    take the first that matches, whatever the plan meant)."""
    for i, b in enumerate(buckets):
        for name, lo, hi in b.bucket.ranges:
            if hi is not None and hi < lo:
                raise FileFormatError(f"{where}: field buckets[{i}].bucket.ranges: {name} in [{lo}, {hi}] is reversed")
    for i, a in enumerate(buckets):
        for j in range(i):
            other: dict[str, tuple[float, float]] = {n: (lo, math.inf if hi is None else hi) for n, lo, hi in buckets[j].bucket.ranges}
            mine: dict[str, tuple[float, float]] = {n: (lo, math.inf if hi is None else hi) for n, lo, hi in a.bucket.ranges}
            if set(mine) != set(other):
                raise FileFormatError(f"{where}: field buckets[{i}].bucket.ranges: over dims {sorted(mine)}, buckets[{j}] over {sorted(other)}")
            if all(lo <= other[n][1] and other[n][0] <= hi for n, (lo, hi) in mine.items()):
                raise FileFormatError(f"{where}: buckets[{j}] ({buckets[j].bucket.label()}) and buckets[{i}] ({a.bucket.label()}) overlap")


class _Reader:
    """Typed reads from a plan's JSON data; a field missing or of the wrong type is a
    ``FileFormatError`` naming the file and the field (``buckets[0].rows[2][5]``)."""

    _MISSING = object()

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, want: str, got: Any) -> FileFormatError:
        shown = "missing" if got is self._MISSING else f"got {type(got).__name__} {json.dumps(got, default=str)[:60]}"
        return FileFormatError(f"{self.where}: field {field} must be {want} ({shown})")

    def get(self, d: Any, key: str | int, at: str | None, default: Any) -> tuple[Any, str]:
        field = key if at is None else f"{at}[{key}]" if isinstance(key, int) else f"{at}.{key}"
        if isinstance(key, int):
            value = d[key] if isinstance(d, list) and key < len(d) else self._MISSING
        else:
            value = d.get(key, self._MISSING) if isinstance(d, Mapping) else self._MISSING
        if value is self._MISSING and default is not self._MISSING:
            value = default
        return value, str(field)

    def tuple_(self, value: Any, field: str, n: int, shape: str) -> str:
        """``field`` when ``value`` is a list of ``n`` items."""
        if not isinstance(value, list) or len(value) != n:
            raise self.fail(field, f"a list of {n} items {shape}", value)
        return field

    def obj(self, value: Any, field: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(field, "an object", value)
        return value

    def items(self, d: Any, key: str | int, at: str | None = None, default: Any = _MISSING) -> list[Any]:
        value, field = self.get(d, key, at, default)
        if not isinstance(value, list):
            raise self.fail(field, "a list", value)
        return value

    def str_(self, d: Any, key: str | int, at: str | None = None, *, none: bool = False, default: Any = _MISSING) -> Any:
        value, field = self.get(d, key, at, default)
        if not (isinstance(value, str) or (none and value is None)):
            raise self.fail(field, "a string" + (" or null" if none else ""), value)
        return value

    def int_(self, d: Any, key: str | int, at: str | None = None, *, none: bool = False, default: Any = _MISSING) -> Any:
        value, field = self.get(d, key, at, default)
        if not ((isinstance(value, int) and not isinstance(value, bool)) or (none and value is None)):
            raise self.fail(field, "an integer" + (" or null" if none else ""), value)
        return value

    def strs(self, d: Any, key: str | int, at: str | None = None) -> tuple[str, ...]:
        value, field = self.get(d, key, at, self._MISSING)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(field, "a list of strings", value)
        return tuple(value)

    def secs(self, d: Any, key: str | int, at: str | None = None, *, none: bool = False) -> Any:
        value, field = self.get(d, key, at, None if none else self._MISSING)
        if none and value is None:
            return None
        if value == "inf":
            return math.inf
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(field, "a number of seconds or \"inf\"" + (" or null" if none else ""), value)
        return float(value)

    def bucket(self, b: Any, at: str) -> Bucket:
        d = self.obj(self.get(b, "bucket", at, self._MISSING)[0], f"{at}.bucket")
        ranges = []
        for j, x in enumerate(self.items(d, "ranges", f"{at}.bucket")):
            f = self.tuple_(x, f"{at}.bucket.ranges[{j}]", 3, "[dim, lo, hi]")
            ranges.append((self.str_(x, 0, f), self.int_(x, 1, f), self.int_(x, 2, f, none=True)))
        point = []
        for j, x in enumerate(self.items(d, "point", f"{at}.bucket")):
            f = self.tuple_(x, f"{at}.bucket.point[{j}]", 2, "[dim, value]")
            point.append((self.str_(x, 0, f), self.int_(x, 1, f)))
        return Bucket(tuple(ranges), tuple(point))

    def placement(self, b: Any, at: str) -> Placement:
        f = f"{at}.placement"
        d = self.obj(self.get(b, "placement", at, self._MISSING)[0], f)
        regions = []
        for j, x in enumerate(self.items(d, "regions", f)):
            rf = f"{f}.regions[{j}]"
            self.obj(x, rf)
            regions.append(RegionSpec(self.str_(x, "backend", rf), self.str_(x, "capability", rf, none=True), self.strs(x, "vars", rf), self.str_(x, "func", rf, default="main"), self.int_(x, "block", rf, default=0)))
        return Placement(tuple(regions), self.strs(d, "backends", f))


# -- the search over a module ---------------------------------------------------------------------


def default_backends() -> list[str]:
    """Every registered backend that is available here (codegen included)."""
    return [n for n in backend_names() if availability(n)[0]]


def place(
    mod: IRModule,
    backends: str | Sequence[str | Backend] | None = None,
    *,
    cost_model: CostModel | None = None,
    budget_s: float | None = None,
    buckets: Mapping[str, Sequence[int]] | None = None,
    pins: Mapping[str, str] | None = None,
    max_size: int = 6,
    refine: bool | str = True,
    func: str = "main",
    progress: bool | None = None,
) -> PlacementPlan:
    """See the module docstring. ``backends``: the backends to place over (default: every
    available one; codegen is always added); ``cost_model``: default the estimator with the
    persistent cache; ``budget_s``: the search's time, counted from the end of the setup
    (resolving the backends, which imports their libraries, and making the candidates: its
    time is ``stats["setup_s"]``), shared by the buckets in equal parts: past its part a
    bucket measures no new candidate (its fallback and its pinned candidates always are) and
    times end to end only its cover and codegen alone, and once the whole budget is spent a
    bucket not yet begun (never the first) takes codegen alone with the pinned regions,
    unmeasured; ``buckets``: points per dim name; ``pins``: op name or ``%var`` -> backend
    (a pin that matches no binding of a placed block is an error; the search's arguments are
    checked by ``check_options``); ``max_size``: the largest interval candidate; ``refine``:
    True (end-to-end validation: the cover, the single-backend plans and the covers over
    codegen and one other backend, timed whole, the fastest kept; ``tilework.collage.validate``),
    ``"evolve"`` (then an evolutionary search over the fastest plan's regions,
    ``tilework.collage.evolve``, within the bucket's part of ``budget_s``, or a minute per
    bucket) or False."""
    t0 = time.perf_counter()
    if refine not in (True, False, "evolve"):
        raise UnsupportedError(f"refine must be True, False or 'evolve', got {refine!r}")
    check_options(budget_s=budget_s, buckets=buckets, pins=pins)
    resolved = resolve_backends(list(backends) if backends is not None and not isinstance(backends, str) else (backends or default_backends()))
    if FALLBACK not in [b.name for b in resolved]:
        resolved += resolve_backends([FALLBACK])
    names = tuple(b.name for b in resolved)
    model = cost_model if cost_model is not None else MeasuredCostModel(progress=progress)
    if isinstance(model, MeasuredCostModel):  # codegen regions read these laid out, as the model will
        model.weights = frozenset(fn.params[i] for _, fn in mod.graph_funcs() for i in weight_candidates(fn))
    f = mod.get(func)
    if not isinstance(f, GraphFunc):
        raise UnsupportedError(f"placement: the module has no graph function @{func} to place")
    vars_ = bucket_vars(f)
    by_name = {v.name: v for v in vars_}
    grid = make_buckets(vars_, buckets)
    blocks = [g for name, fn in mod.graph_funcs() for g in graphs_of(name, fn)]
    check_pins_match(blocks, pins)
    cands = {(g.func_name, g.block_index): block_candidates(g, resolved, max_size=max_size, pins=pins) for g in blocks}
    notes: list[str] = []
    plans = []
    n_cands = sum(len(c) for c in cands.values())
    singles = _single_backend_plans(mod, names) if refine else []
    # the budget counts from here: the setup above (resolving the backends, which imports their
    # libraries, the candidates, the single-backend plans) measures nothing; stats["setup_s"]
    started = time.perf_counter()
    for i, bucket in enumerate(grid):
        # each bucket's share of the budget ends at its own deadline (a bucket that overruns
        # shortens the next ones' shares); once the whole budget is spent, the rest take codegen
        # (and their pinned regions); the first bucket always begins
        share = None if budget_s is None else started + budget_s * (i + 1) / len(grid)
        spent = time.perf_counter() - started
        if budget_s is not None and i > 0 and spent >= budget_s:
            alone = "tilework's kernels alone" + (" and the pinned regions" if pins else "")
            notes.append(f"the budget ({budget_s:g} s, counted after a setup of {started - t0:.2f} s) was spent before bucket {bucket.label()}: the {i} bucket(s) before it took {spent:.2f} s; {alone} there, not measured")
            plans.append(BucketPlan(bucket, _pinned_only(blocks, cands, names, pins), (), None, None, f"default (the budget was spent before this bucket: {alone}, not measured)"))
            continue
        env = bucket.env(by_name)
        solved: list[Solved] = []
        for g in blocks:
            cs = cands[(g.func_name, g.block_index)]
            costs = _costs(model, g, cs, env, share, notes, pins)
            trans = model.transition_costs(g, cs, costs, env)
            solved.append((g, cs, costs, trans))
        searched = _solve(solved, names, None)
        assert searched is not None
        evolve_deadline = share if share is not None else started + 60.0 * (i + 1)
        plans.append(_validate(mod, model, bucket, env, searched, solved, names, blocks, pins, refine, share, evolve_deadline, notes, singles))
    stats = {"search_s": round(time.perf_counter() - t0, 3), "setup_s": round(started - t0, 3), "candidates": n_cands, "buckets": len(grid)}
    if isinstance(model, MeasuredCostModel):
        s = model.stats.as_dict()
        stats.update(s)
        hits = s["cache_hits"] + s["e2e_cache_hits"]
        stats["cache_share"] = round(hits / max(1, hits + s["measured"] + s["e2e_measured"]), 3)
    return PlacementPlan(tuple(plans), names, func, stats, tuple(dict.fromkeys(notes)))


def check_options(*, budget_s: Any = None, buckets: Any = None, pins: Any = None) -> None:
    """The search's arguments, checked before anything is searched: ``budget_s`` a positive
    number of seconds (as the command line's ``--budget``), ``buckets`` dim name -> integer
    points, ``pins`` op name or ``%var`` -> backend name."""
    if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not (budget_s > 0 and math.isfinite(budget_s))):
        raise UnsupportedError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    if buckets is not None:
        if not isinstance(buckets, Mapping):
            raise UnsupportedError(f"buckets must map dim names to their points, e.g. {{'n': [1, 32, 256]}}, got {type(buckets).__name__} {buckets!r}")
        for dim, points in buckets.items():
            if not isinstance(dim, str) or isinstance(points, (str, bytes)) or not isinstance(points, Sequence) or not points or not all(isinstance(p, int) and not isinstance(p, bool) for p in points):
                raise UnsupportedError(f"buckets[{dim!r}] must be a non-empty list of integer points of the dim (a str key), got {points!r}")
    if pins is not None:
        if not isinstance(pins, Mapping):
            raise UnsupportedError(f"pins must map op names or %vars to backends, e.g. {{'linear': 'blas', '%lv3': 'onnxruntime'}}, got {type(pins).__name__} {pins!r}")
        for key, backend in pins.items():
            if not isinstance(key, str) or not key or not isinstance(backend, str) or not backend:
                raise UnsupportedError(f"pins: {key!r}: {backend!r} is not an op name or %var mapped to a backend name (both non-empty strings)")


# ops that do one job under two names: the torch frontend makes nn.Linear a linear, the ONNX
# frontend makes MatMul and Gemm a matmul (a pin of the one on a model of the other is a hint)
_SAME_WORK = {"matmul": ("linear",), "linear": ("matmul",)}


def check_pins_match(blocks: Sequence[BlockGraph], pins: Mapping[str, str] | None) -> None:
    """Every pin names an op or a binding (``%var``) of a placed block: a pin that matches
    nothing (a typo; ``matmul`` where the torch frontend made ``linear``) is an error that
    lists what there is."""
    if not pins:
        return
    ops: dict[str, None] = {}
    bindings: dict[str, None] = {}
    for g in blocks:
        for b in g.bindings:
            bindings[f"%{b.var.name}"] = None
            if is_op_binding(b):
                assert isinstance(b.value, Call) and isinstance(b.value.callee, OpRef)
                ops[b.value.callee.name] = None
    funcs = ", ".join(dict.fromkeys(f"@{g.func_name}" for g in blocks)) or "the module (it has no dataflow block)"
    for key, backend in pins.items():
        known = bindings if key.startswith("%") else ops
        if key in known:
            continue
        if key.startswith("%"):
            shown = list(bindings)
            listed = ", ".join(shown[:12]) + (f", ... ({len(shown)} in all)" if len(shown) > 12 else "")
            raise UnsupportedError(f"pin {key}={backend} matches no binding of {funcs} (its bindings: {listed or 'none'})")
        close = [k for k in _SAME_WORK.get(key, ()) if k in ops] or difflib.get_close_matches(key, list(ops), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UnsupportedError(f"pin {key}={backend} matches no binding of {funcs} (its ops: {', '.join(ops) or 'none'}; a binding is pinned by its name, %name){hint}")


def _pinned_only(blocks: Sequence[BlockGraph], cands: Mapping[tuple[str, int], list[Candidate]], names: tuple[str, ...], pins: Mapping[str, str] | None) -> Placement:
    """Tilework's kernels for everything but the pinned bindings, which run on their backends
    (the candidates that cover the fewest bindings not pinned there): the plan of a bucket the
    budget left unmeasured."""
    if not pins:
        return Placement((), names)
    solved: list[Solved] = []
    for g in blocks:
        cs = cands[(g.func_name, g.block_index)]
        costs = []
        for c in cs:
            if c.backend == FALLBACK:
                costs.append(1.0 if c.origin == "fallback" else math.inf)
                continue
            pinned = sum(1 for i in c.nodes if pinned_backend(g, i, pins) == c.backend)
            costs.append(math.inf if not pinned else len(c.nodes) + 1000.0 * (len(c.nodes) - pinned))
        solved.append((g, cs, costs, {}))
    found = _solve(solved, names, None)
    assert found is not None
    return found[0]


def _costs(model: CostModel, g: BlockGraph, cs: Sequence[Candidate], env: Mapping[Any, int], deadline: float | None, notes: list[str], pins: Mapping[str, str] | None = None) -> list[float]:
    """Fallback singletons and the candidates that run a pinned binding on its backend first
    (never cut by the budget: a pin holds in every plan), then the rest until ``deadline``."""
    costs = [math.inf] * len(cs)
    free = [k for k, c in enumerate(cs) if c.origin == "fallback" and not is_op_binding(g.bindings[c.first])]
    for k in free:
        costs[k] = 0.0
    held = {k for k, c in enumerate(cs) if c.backend != FALLBACK and pins and any(pinned_backend(g, i, pins) == c.backend for i in c.nodes)}
    first = [k for k, c in enumerate(cs) if (c.origin == "fallback" and k not in set(free)) or k in held]
    rest = [k for k, c in enumerate(cs) if c.origin != "fallback" and k not in held]
    for k, cost in zip(first, model.region_costs(g, [cs[k] for k in first], env)):
        if not math.isfinite(cost) and k not in held:
            notes.append(f"@{g.func_name}: codegen failed to run %{g.bindings[cs[k].first].var.name} alone; costed at {FAILED_FALLBACK_S} s")
            cost = FAILED_FALLBACK_S
        costs[k] = cost
    if isinstance(model, MeasuredCostModel):
        model.deadline = deadline
    try:
        for k, cost in zip(rest, model.region_costs(g, [cs[k] for k in rest], env)):
            costs[k] = cost
    finally:
        if isinstance(model, MeasuredCostModel):
            model.deadline = None
    return costs


def _row(g: BlockGraph, cs: Sequence[Candidate], costs: Sequence[float], k: int) -> Row:
    c = cs[k]
    alt, alt_cost = None, None
    for j, other in enumerate(cs):
        if j != k and other.nodes == c.nodes and other.backend != c.backend and math.isfinite(costs[j]) and (alt_cost is None or costs[j] < alt_cost):
            alt, alt_cost = other.backend, costs[j]
    if alt is None and (c.backend != FALLBACK or len(c.nodes) > 1):
        singles = {cs[j].first: costs[j] for j in range(len(cs)) if cs[j].origin == "fallback"}
        if all(i in singles for i in c.nodes):
            alt, alt_cost = "codegen op by op", sum(singles[i] for i in c.nodes)
    return Row(g.func_name, g.block_index, tuple(g.bindings[i].var.name for i in c.nodes), ops_of(g, c.nodes), c.backend, costs[k], alt, alt_cost)


Solved = tuple[BlockGraph, list[Candidate], list[float], dict[tuple[str, str], float]]  # a block, its candidates, their costs, the transitions


def _solve(solved: Sequence[Solved], names: tuple[str, ...], allowed: frozenset[str] | None) -> tuple[Placement, tuple[Row, ...], float] | None:
    """The cheapest cover of every block (over the ``allowed`` backends only, when given; None
    when they cannot cover a block): the placement, its rows and its estimated cost."""
    specs: list[RegionSpec] = []
    rows: list[Row] = []
    estimate = 0.0
    for g, cs, all_costs, trans in solved:
        costs = all_costs if allowed is None else [x if c.backend in allowed else math.inf for c, x in zip(cs, all_costs)]
        edges = [(u, v) for u in range(len(g)) for v in g.succ[u]]
        try:
            cover = exact_cover(len(g), cs, costs, edges, lambda a, b: trans.get((a, b), 0.0), lambda i: f"%{g.bindings[i].var.name} in @{g.func_name}")
        except UnsupportedError:
            if allowed is None:
                raise
            return None
        estimate += cover.cost
        for k in cover.chosen:
            c = cs[k]
            if c.backend != FALLBACK:
                specs.append(RegionSpec(c.backend, c.capability, tuple(g.bindings[i].var.name for i in c.nodes), g.func_name, g.block_index))
            rows.append(_row(g, cs, costs, k))
    return Placement(tuple(specs), names), tuple(rows), estimate


def _single_backend_plans(mod: IRModule, names: tuple[str, ...]) -> list[tuple[str, Placement]]:
    """Codegen alone, and each other backend by its rules with codegen for the rest (what
    ``backends=[b, "codegen"]`` compiles), when it claims anything."""
    out = []
    for b in names:
        single = Placement((), names) if b == FALLBACK else Placement(partition_by_rules(mod, [b, FALLBACK]).regions, names)
        if b == FALLBACK or single.regions:
            out.append((b if b == FALLBACK else f"{b} by rules", single))
    return out


def _validate(
    mod: IRModule, model: CostModel, bucket: Bucket, env: Mapping[Any, int], searched: tuple[Placement, tuple[Row, ...], float], solved: Sequence[Solved],
    names: tuple[str, ...], blocks: Sequence[BlockGraph], pins: Mapping[str, str] | None, refine: bool | str, deadline: float | None, evolve_deadline: float, notes: list[str],
    singles: Sequence[tuple[str, Placement]],
) -> BucketPlan:  # fmt: skip
    """The bucket's plan: the searched cover, or the plan that is fastest end to end
    (``tilework.collage.validate``)."""
    cover, rows, estimate = searched
    if not refine:
        return BucketPlan(bucket, cover, rows, estimate)
    options = [Option("search", cover)]
    known: list[tuple[Placement, tuple[Row, ...], float | None]] = [(cover, rows, estimate)]
    spent = deadline is not None and time.perf_counter() >= deadline  # then only the cover and tilework alone must be timed
    for label, single in singles:
        conflict = pin_conflict(single, blocks, pins)
        if conflict is not None:
            notes.append(f"the single-backend plan {label} is not timed end to end: it breaks the pin {conflict}")
            continue
        options.append(Option(label, single, required=not spent or not single.regions))
        known.append((single, (), None))
    pinned = frozenset((pins or {}).values())
    for b in names:
        if b == FALLBACK or not any(c.backend == b and math.isfinite(x) for _, cs, costs, _ in solved for c, x in zip(cs, costs)):
            continue  # codegen's own cover, or a backend that can run nothing here
        mixed = _solve(solved, names, frozenset({FALLBACK, b}) | pinned)
        if mixed is not None:
            options.append(Option(f"cover over {'+'.join(sorted({FALLBACK, b} | pinned))}", mixed[0], required=False))
            known.append(mixed)
    v = validate(mod, model, env, options, deadline=deadline, evolve=refine == "evolve", evolve_deadline=evolve_deadline, blocks=blocks, pins=pins)
    notes.extend(v.notes)
    if v.seconds is None:
        return BucketPlan(bucket, cover, rows, estimate, None, "search" + (" (every plan failed end to end)" if v.alternatives else ""), v.alternatives)
    how = f"{v.label.split(' = ')[0]}: the fastest of {len(v.alternatives)} plan(s) timed end to end"
    if v.chosen is not None:
        placement, kept, est = known[v.chosen]
        return BucketPlan(bucket, placement, kept, est, v.seconds, how, v.alternatives)
    # evolved from a plan: its rows (a cover's) for what stayed offloaded (the rest runs on codegen)
    base_rows = known[v.evolved_from][1] if v.evolved_from is not None else ()
    kept = tuple(r for r in base_rows if r.backend == FALLBACK or any(spec.vars == r.vars for spec in v.placement.regions))
    return BucketPlan(bucket, v.placement, kept, None, v.seconds, how, v.alternatives)


OPTIONS = ("budget_s", "buckets", "pins", "refine", "max_size", "progress", "cost_model", "func")


def plan_for(mod: IRModule, placement: Any, backends: Any = None, **options: Any) -> PlacementPlan:
    """The plan ``placement`` stands for: ``"auto"`` (searched now, with ``options``), a
    ``PlacementPlan``, or the path of a saved one."""
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        raise UnsupportedError(f"unknown placement option(s) {', '.join(unknown)}; the options are: {', '.join(OPTIONS)}")
    if isinstance(placement, PlacementPlan):
        return placement
    if placement == "auto":
        return place(mod, backends, **options)
    if isinstance(placement, (str, os.PathLike)):
        if not os.path.exists(placement):
            raise UnsupportedError(f"placement={str(placement)!r}: not 'auto' and no such placement file")
        return PlacementPlan.load(os.fspath(placement))
    raise UnsupportedError(f"placement must be 'auto', a PlacementPlan or the path of a saved one, got {type(placement).__name__}")


# -- applying a plan ----------------------------------------------------------------------------


def apply_plan(mod: IRModule, plan: PlacementPlan) -> IRModule:
    """The module to compile (see the module docstring)."""
    distinct, index = plan.variants()
    if len(distinct) == 1:
        return Offload(distinct[0]).run(mod)
    out = dispatch_module(mod, plan.func, [(b.bucket, k) for b, k in zip(plan.buckets, index)], len(distinct))
    specs = []
    for k, p in enumerate(distinct):
        for r in p.regions:
            if r.func == plan.func:
                specs.append(RegionSpec(r.backend, r.capability, r.vars, f"{r.func}__p{k}", r.block))
            elif k == 0:  # other functions are not dispatched: the first variant places them
                specs.append(r)
    return Offload(Placement(tuple(specs), plan.backends)).run(out)


@dataclass(frozen=True)
class ApplyPlacement(Pass):
    """The pass form of ``apply_plan`` (the pipeline's placement stage)."""

    plan: PlacementPlan
    name: str = "apply_placement"

    def run(self, mod: IRModule) -> IRModule:
        return apply_plan(mod, self.plan)


__all__ = ["Row", "BucketPlan", "PlacementPlan", "place", "plan_for", "apply_plan", "ApplyPlacement", "default_backends", "FORMAT"]

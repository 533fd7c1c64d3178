"""Cost models: what a candidate, a backend transition and a whole placement cost.

``CostModel`` is the interface the search asks; two implementations:

- ``MockCostModel``: costs from a function (tests; no building, no timing);
- ``MeasuredCostModel``: the estimator. It builds each candidate region as a function of its
  own (``tilework.collage.regions``) offloaded to its backend, many candidates per build (one
  C compiler run for all their kernels; a failing build is bisected to find the culprits), runs
  it on this machine with inputs at the bucket's dims, and times it: warm-up calls, then the
  median of repeats, repeated while the spread between repeats stays high, within a time limit
  per candidate. A candidate that fails to build or run costs infinity (never an error). The
  cost of the call itself is subtracted, so costs add up along a cover: a *null function* with
  the region function's params (the same checks and sym var bindings at entry, no work;
  ``regions.null_function``) is built into the same module and timed beside it, once per
  distinct signature (a region of many symbolic inputs pays more for its call than an empty
  function does, and the whole model, running the region's kernels inline, pays neither).
  A region is built as the model will run it: after offload, the linears left to codegen read
  their weights laid out (``LayoutWeights``; the region's lifted constants and the model's
  weight params in ``weights``), so codegen is not judged by kernels the model never runs.

  *Transitions*: when consecutive kernels come from different runtimes, their thread pools
  hand the cores over (OpenMP workers spinning, torch's or ONNX Runtime's pools waking up).
  The estimator measures it in place: for each ordered pair of backends ``A -> B`` it takes an
  edge of the model where ``A`` can run the producer and ``B`` the consumer, times the two
  regions together and subtracts their separate costs (at least zero, at most
  ``MAX_TRANSITION_S``).

  *Whole placements* (``end_to_end``, the search's end-to-end validation): each placement of
  the whole module is built and timed at the bucket's dims, round-robin over the placements,
  but every timed repeat of a placement follows untimed calls of the same placement for
  ``BURST_WARM_S``, at least one (*bursts*), so each is timed as a model called in a loop runs: its
  weights and code warm, not evicted by the other placements' (each built with its codegen
  linears' weights laid out, as ``tilework.compile`` builds it). A plan of tilework's kernels
  alone, timed right after one that loads another runtime, first waits ``POOL_SETTLE_S`` for
  that runtime's workers to stop spinning (OpenBLAS's on 2 threads took a core from the
  codegen plan of a Llama graph at one token for the 70 ms they wait: 5.1 ms measured for its
  0.96, and the BLAS plan was kept). ``WholeTimes`` keys these by the module's structural hash, the dims, the
  placement, backend versions, the machine and the measuring protocol (the mock shares it).
  Plans whose times come within a few percent of each other are timed *again*
  (``end_to_end(..., again=True)``): together, head to head, with ``AGAIN_REPEAT`` times the
  repeats, kept under keys of their own.

  Every measurement goes through the persistent cost cache (``tilework.collage.cache``), so a
  model placed twice, or a model whose layers repeat, is measured once. A progress bar (tqdm,
  when installed and the output is a terminal, or when asked) shows candidates done/total,
  cache hits and the elapsed time.

Builds use ``tilework.build``, registered by the driver above this layer (``register_builder``).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from tilework.backend.base import availability
from tilework.backend.offload import Offload
from tilework.backend.partition import Placement, RegionSpec
from tilework.collage.cache import CostCache, Entry, machine_fingerprint, make_key
from tilework.collage.candidates import FALLBACK, BlockShape, Candidate
from tilework.collage.regions import input_arrays, input_shapes, null_function, region_function
from tilework.errors import TileworkError
from tilework.ir.graph import Binding, Call, GraphFunc, OpRef, Var
from tilework.ir.info import TensorInfo
from tilework.ir.module import IRModule
from tilework.ir.structural import structural_hash
from tilework.ir.sym import SymVar
from tilework.pattern.graph import BlockGraph
from tilework.transform.layout_weights import LayoutWeights

ESTIMATOR_VERSION = 3  # 2: region rows are net of their own call (null functions); 3: codegen linears read packed weights
FIRST_CALL_LIMITS = 10  # a first call (sessions created, caches filled) may take this many time limits
BURST_WARM_S = 5e-3  # a burst's untimed calls last at least this long, at least one call (a few calls: one call of a
# model whose weights fill the last-level cache leaves them half cold after the other plans)
BURST_WARM_CALLS = 8  # and are at most this many
POOL_SETTLE_S = 0.1  # before a whole plan that loads no other runtime is timed after one that did: the other's
# worker threads may still spin (OpenBLAS's wait about 2**28 cycles, 70 ms at 3.7 GHz, before they sleep)
MAX_KEPT_BUILDS = 8  # whole-placement executables kept for the next bucket (each may hold the weights)
MAX_TRANSITION_S = 1e-3  # pools hand over in microseconds to a millisecond; more is noise of the pair's timing
_BUILDER: list[Callable[..., Any]] = []


def register_builder(build: Callable[..., Any]) -> None:
    """Make the estimator build with ``build`` (``tilework.build``: the driver registers it)."""
    _BUILDER[:] = [build]


def _build(mod: IRModule) -> Any:
    if not _BUILDER:
        raise TileworkError("no builder registered for placement measurements (import tilework)")
    return _BUILDER[0](mod, passes=[])


class CostModel(Protocol):
    def region_costs(self, g: BlockGraph, cands: Sequence[Candidate], env: Mapping[SymVar, int]) -> list[float]: ...

    def transition_costs(self, g: BlockGraph, cands: Sequence[Candidate], costs: Sequence[float], env: Mapping[SymVar, int]) -> dict[tuple[str, str], float]: ...

    def end_to_end(self, mod: IRModule, placements: Sequence[Placement], env: Mapping[SymVar, int], again: bool = False) -> list[float] | None: ...


def ops_of(g: BlockGraph, nodes: Sequence[int]) -> tuple[str, ...]:
    """The op names of ``nodes`` (other bindings as their kind)."""
    out = []
    for i in nodes:
        v = g.bindings[i].value
        out.append(v.callee.name if isinstance(v, Call) and isinstance(v.callee, OpRef) else type(v).__name__.lower())
    return tuple(out)


E2E_PROTOCOL = "e2e-burst-5"  # what an end-to-end time means (in its cache key): bursts, see the module docstring; 2: codegen's weights laid out; 3: warm calls for BURST_WARM_S; 4: bursts at every length; 5: other runtimes settle before own plans (POOL_SETTLE_S)
AGAIN_REPEAT = 3  # a head-to-head timing again (``end_to_end(..., again=True)``) takes this many times the repeats
Timer = Callable[[IRModule, Sequence[Placement], Mapping[SymVar, int], bool], list[Entry]]


class WholeTimes:
    """End-to-end times of whole placements through the persistent cost cache: ``timer``
    measures the placements the cache does not hold (an ``Entry`` each; infinite seconds: it
    failed to build or run) and every result is stored. ``protocol``: the measuring settings
    (part of every key); ``cache`` None: nothing is kept between calls."""

    def __init__(self, cache: CostCache | None, timer: Timer, protocol: Any) -> None:
        self.cache = cache
        self.timer = timer
        self.protocol = protocol
        self.hits = 0
        self.measured = 0
        self.failed = 0
        self.details: dict[str, str] = {}  # placement JSON -> why it failed (the latest)
        self._hashed: tuple[IRModule, int] | None = None  # the last module hashed (hashing a big module is not free)

    def _module_hash(self, mod: IRModule) -> int:
        if self._hashed is None or self._hashed[0] is not mod:
            self._hashed = (mod, structural_hash(mod))
        return self._hashed[1]

    def key(self, mod: IRModule, placement: Placement, env: Mapping[SymVar, int], again: bool = False) -> str:
        return make_key({
            "what": "e2e again" if again else "e2e",
            "module": self._module_hash(mod),
            "placement": placement.to_json(),
            "env": sorted((v.name, n) for v, n in env.items()),
            "machine": machine_fingerprint(),
            "versions": _versions(placement.backends),
            "protocol": self.protocol,
        })

    def times(self, mod: IRModule, placements: Sequence[Placement], env: Mapping[SymVar, int], again: bool = False) -> list[float]:
        """The placements' times; ``again``: the times of a second timing of these placements
        together, head to head (kept under keys of their own: a second compile decides alike)."""
        keys = [self.key(mod, p, env, again) if self.cache is not None else "" for p in placements]
        out: list[Entry | None] = [self.cache.get(k) if self.cache is not None else None for k in keys]
        self.hits += sum(e is not None for e in out)
        todo = [i for i, e in enumerate(out) if e is None]
        if todo:
            for i, entry in zip(todo, self.timer(mod, [placements[i] for i in todo], env, again)):
                out[i] = entry
                self.measured += 1
                if not math.isfinite(entry.seconds):
                    self.failed += 1
                if self.cache is not None:
                    self.cache.put(keys[i], "e2e", entry)
        for p, e in zip(placements, out):
            if e is not None and not math.isfinite(e.seconds):
                self.details[p.to_json()] = e.detail
        return [math.inf if e is None else e.seconds for e in out]


@dataclass
class MockCostModel:
    """Costs from ``cost(candidate, ops, dims)`` (``dims``: the bucket's values by dim name;
    ``math.inf``: the backend fails); transitions from a table; end-to-end times from
    ``e2e(placement, dims)`` (None: not timed, the search's cover stands; raising or
    ``math.inf``: the placement fails to build), through ``cache`` when given (keyed as the
    estimator's, with ``protocol`` "mock"). ``calls``/``e2e_calls`` count what was asked."""

    cost: Callable[[Candidate, tuple[str, ...], dict[str, int]], float]
    transitions: Mapping[tuple[str, str], float] = field(default_factory=dict)
    e2e: Callable[[Placement, dict[str, int]], float] | None = None
    cache: CostCache | None = None
    calls: int = 0
    e2e_calls: int = 0
    whole: WholeTimes | None = field(default=None, init=False, repr=False)

    def region_costs(self, g: BlockGraph, cands: Sequence[Candidate], env: Mapping[SymVar, int]) -> list[float]:
        self.calls += len(cands)
        dims = {v.name: n for v, n in env.items()}
        return [float(self.cost(c, ops_of(g, c.nodes), dims)) for c in cands]

    def transition_costs(self, g: BlockGraph, cands: Sequence[Candidate], costs: Sequence[float], env: Mapping[SymVar, int]) -> dict[tuple[str, str], float]:
        return dict(self.transitions)

    def end_to_end(self, mod: IRModule, placements: Sequence[Placement], env: Mapping[SymVar, int], again: bool = False) -> list[float] | None:
        if self.e2e is None:
            return None
        if self.whole is None:
            self.whole = WholeTimes(self.cache, self._time, "mock")
        return self.whole.times(mod, placements, env, again)

    def _time(self, mod: IRModule, placements: Sequence[Placement], env: Mapping[SymVar, int], again: bool = False) -> list[Entry]:
        assert self.e2e is not None
        dims = {v.name: n for v, n in env.items()}
        out = []
        for p in placements:
            self.e2e_calls += 1
            try:
                out.append(Entry(float(self.e2e(p, dims)), 0.0, 1, ""))
            except Exception as e:  # noqa: BLE001 - a placement that fails costs infinity
                out.append(Entry(math.inf, 0.0, 0, f"build: {type(e).__name__}: {e}"[:300]))
        return out


# -- the estimator ------------------------------------------------------------------------------


@dataclass
class _Request:
    """One timing: the ``regions`` of block ``g`` (candidates) built as one function."""

    g: BlockGraph
    regions: tuple[Candidate, ...]
    key: str = ""
    func: GraphFunc | None = None
    result: Entry | None = None


@dataclass
class Stats:
    requested: int = 0
    measured: int = 0
    cache_hits: int = 0
    failed: int = 0
    builds: int = 0
    seconds: float = 0.0
    e2e_measured: int = 0  # whole placements timed (``end_to_end``)
    e2e_cache_hits: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested, "measured": self.measured, "cache_hits": self.cache_hits, "failed": self.failed, "builds": self.builds,
            "seconds": round(self.seconds, 3), "e2e_measured": self.e2e_measured, "e2e_cache_hits": self.e2e_cache_hits,
        }  # fmt: skip


class _Progress:
    def __init__(self, total: int, enabled: bool | None, desc: str) -> None:
        self.bar: Any = None
        self.total = total
        show = sys.stderr.isatty() if enabled is None else enabled
        if show and total:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="cand", file=sys.stderr, leave=False)
            except ImportError:
                self.bar = None

    def update(self, n: int, hits: int) -> None:
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix(cache_hits=hits, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class MeasuredCostModel:
    """See the module docstring. ``repeat``: repeats per candidate (medians of them);
    ``max_spread``: re-measure while (max - min) / median of the repeats exceeds it, at most
    ``max_rounds`` times; ``time_limit_s``: the wall time one candidate may take;
    ``batch``: candidates per build; ``progress``: None = a bar on a terminal."""

    def __init__(self, cache: CostCache | None = None, *, repeat: int = 5, max_spread: float = 0.15, max_rounds: int = 4, time_limit_s: float = 0.5, min_repeat_s: float = 2e-4, batch: int = 48, progress: bool | None = None) -> None:
        self.cache = cache if cache is not None else CostCache()
        self.repeat = repeat
        self.max_spread = max_spread
        self.max_rounds = max_rounds
        self.time_limit_s = time_limit_s
        self.min_repeat_s = min_repeat_s
        self.batch = batch
        self.progress = progress
        self.stats = Stats()
        self._overhead: float | None = None
        # (id of block, nodes) -> (function, its structural hash, the block: kept alive so its id stays its own)
        self._regions: dict[tuple[int, tuple[int, ...]], tuple[GraphFunc, int, BlockGraph]] = {}
        self.deadline: float | None = None  # time.perf_counter() after which nothing new is measured
        self.weights: frozenset[Var] = frozenset()  # the model's weight params (laid out where codegen reads them)
        self.whole = WholeTimes(self.cache, self._time_whole, [E2E_PROTOCOL, self.repeat, self.max_spread, self.max_rounds])
        self._built: dict[tuple[int, str], tuple[Callable[..., Any], GraphFunc]] = {}  # (id of module, placement) -> its main and main as built, for the buckets after the first
        self._built_for: IRModule | None = None

    # -- the interface ---------------------------------------------------------------------

    def region_costs(self, g: BlockGraph, cands: Sequence[Candidate], env: Mapping[SymVar, int]) -> list[float]:
        reqs = [_Request(g, (c,)) for c in cands]
        self._run(reqs, env, "placement: measuring candidates")
        return [self._cost(r, c) for r, c in zip(reqs, cands)]

    def transition_costs(self, g: BlockGraph, cands: Sequence[Candidate], costs: Sequence[float], env: Mapping[SymVar, int]) -> dict[tuple[str, str], float]:
        pairs = _transition_samples(g, cands, costs)
        reqs = [_Request(g, (cands[a], cands[b])) for (_, _), (a, b) in pairs]
        self._run(reqs, env, "placement: measuring transitions")
        out: dict[tuple[str, str], float] = {}
        for ((ba, bb), (a, b)), r in zip(pairs, reqs):
            if r.result is None or not math.isfinite(r.result.seconds):
                continue
            out[(ba, bb)] = min(MAX_TRANSITION_S, max(0.0, r.result.seconds - costs[a] - costs[b]))
        return out

    def end_to_end(self, mod: IRModule, placements: Sequence[Placement], env: Mapping[SymVar, int], again: bool = False) -> list[float] | None:
        """The whole ``main`` under each of ``placements``, timed at ``env`` side by side in
        bursts (see the module docstring; cached); ``again``: timed once more, head to head,
        with ``AGAIN_REPEAT`` times the repeats."""
        if not isinstance(mod.get("main"), GraphFunc):
            return None
        hits, measured = self.whole.hits, self.whole.measured
        out = self.whole.times(mod, placements, env, again)
        self.stats.e2e_cache_hits += self.whole.hits - hits
        self.stats.e2e_measured += self.whole.measured - measured
        return out

    def _time_whole(self, mod: IRModule, placements: Sequence[Placement], env: Mapping[SymVar, int], again: bool = False) -> list[Entry]:
        """Build each placement of ``mod`` (once for all buckets) and time its ``main``."""
        t0 = time.perf_counter()
        from tilework.runtime.vm import VM

        main = mod["main"]
        assert isinstance(main, GraphFunc)
        if self._built_for is not mod:  # another module: the executables kept are not its
            self._built, self._built_for = {}, mod
        pool: dict[tuple[int, str], Any] = {}  # inputs by param and struct info: shared by the placements
        calls: list[Callable[[], Any] | None] = []
        entries: list[Entry | None] = []
        bar = _Progress(len(placements), self.progress, "placement: building whole plans")
        for p in placements:
            key = (id(mod), p.to_json())
            try:
                built = self._built.pop(key, None)  # kept most recently used last (evicted least recently used first)
                if built is not None:
                    self._built[key] = built
                else:
                    with warnings.catch_warnings():
                        warnings.simplefilter("error", UserWarning)  # a lowering that gives up: this placement fails
                        laid = LayoutWeights(params=True)(Offload(p).run(mod))
                        exe = _build(laid)
                    self.stats.builds += 1
                    laid_main = laid["main"]
                    assert isinstance(laid_main, GraphFunc)
                    built = self._built[key] = (VM(exe)["main"], laid_main)
                    while len(self._built) > MAX_KEPT_BUILDS:
                        del self._built[next(iter(self._built))]
                calls.append(_bind(built[0], _shared_inputs(built[1], env, pool)))
                entries.append(None)
            except Exception as e:  # noqa: BLE001 - a placement that fails to build costs infinity
                calls.append(None)
                entries.append(Entry(math.inf, 0.0, 0, f"build: {type(e).__name__}: {e}"[:300]))
            bar.update(1, self.stats.e2e_cache_hits)
        bar.close()
        live = [i for i, c in enumerate(calls) if c is not None]
        scale = AGAIN_REPEAT if again else 1
        own = [not placements[i].regions for i in live]  # only tilework's kernels: no other runtime's pool
        timed = self._time_many([c for c in calls if c is not None], limit=max(self.time_limit_s, 1.0) * scale, burst=True, repeat=self.repeat * scale, own=own)
        for i, entry in zip(live, timed):
            entries[i] = entry
        self.stats.seconds += time.perf_counter() - t0
        return [e if e is not None else Entry(math.inf, 0.0, 0, "not timed") for e in entries]

    # -- measuring ---------------------------------------------------------------------------

    def overhead(self) -> float:
        """Seconds of calling a function through the VM that does nothing (subtracted from a
        measurement whose null function could not be timed)."""
        key = make_key({"what": "overhead", "machine": machine_fingerprint(), "estimator": ESTIMATOR_VERSION})
        if self._overhead is None:
            hit = self.cache.get(key)  # cached, so that a second search subtracts the same amount
            if hit is not None:
                self._overhead = hit.seconds
                return hit.seconds
            from tilework.ir.builder import BlockBuilder
            from tilework.runtime.vm import VM
            import numpy as np

            x = Var("x", TensorInfo((4,), "float32"))
            bb = BlockBuilder()
            with bb.function("main", [x]):
                bb.emit_func_output(x)
            fn = VM(_build(bb.get()))["main"]
            a = np.zeros(4, "float32")
            entry = self._time_many([lambda: fn(a)], limit=0.2)[0]
            self.cache.put(key, "overhead", entry)
            self._overhead = entry.seconds
        return self._overhead

    def _cost(self, r: _Request, c: Candidate) -> float:
        if r.result is None:
            return math.inf
        return r.result.seconds  # stored net of the call (see _measure); infinite when it failed

    def _key(self, r: _Request, env: Mapping[SymVar, int]) -> str:
        f = r.func
        assert f is not None
        union = sorted(set().union(*[c.nodes for c in r.regions]))
        shapes = [list(shape) for shape in input_shapes(f, env)]
        dtypes = [getattr(p.info, "dtype", None) for p in f.params]
        return make_key({
            "what": "region",
            "region": self._regions[(id(r.g), tuple(union))][1],
            "regions": [(c.backend, c.capability, [pos for pos, i in enumerate(union) if i in c.nodes]) for c in r.regions],
            "shapes": shapes,
            "dtypes": dtypes,
            "versions": _versions(tuple(c.backend for c in r.regions)),
            "machine": machine_fingerprint(),
            "estimator": [ESTIMATOR_VERSION, self.repeat, self.max_spread],
        })

    def _run(self, reqs: list[_Request], env: Mapping[SymVar, int], desc: str) -> None:
        todo: dict[str, list[_Request]] = {}
        for r in reqs:
            self.stats.requested += 1
            nodes = sorted(set().union(*[c.nodes for c in r.regions]))
            try:
                made = self._regions.get((id(r.g), tuple(nodes)))
                if made is None:  # the same for every bucket: made and hashed once
                    f = region_function(r.g, nodes, self.weights)
                    made = self._regions[(id(r.g), tuple(nodes))] = (f, structural_hash(f), r.g)
                r.func = made[0]
                r.key = self._key(r, env)
            except Exception as e:  # noqa: BLE001 - a region that cannot stand alone cannot be measured
                r.result = Entry(math.inf, 0.0, 0, f"{type(e).__name__}: {e}"[:300])
                self.stats.failed += 1
                continue
            hit = self.cache.get(r.key)
            if hit is not None:
                r.result = hit
                self.stats.cache_hits += 1
                continue
            todo.setdefault(r.key, []).append(r)
        bar = _Progress(len(reqs), self.progress, desc)
        bar.update(len(reqs) - sum(len(v) for v in todo.values()), self.stats.cache_hits)
        groups = list(todo.values())
        try:
            for start in range(0, len(groups), self.batch):
                chunk = groups[start : start + self.batch]
                if self.deadline is not None and time.perf_counter() > self.deadline:
                    for same in chunk:
                        for r in same:
                            r.result = None  # not measured: the budget is spent
                    bar.update(sum(len(s) for s in chunk), self.stats.cache_hits)
                    continue
                self._measure([s[0] for s in chunk], env)
                for same in chunk:
                    for r in same[1:]:
                        r.result = same[0].result
                bar.update(sum(len(s) for s in chunk), self.stats.cache_hits)
        finally:
            bar.close()

    def _measure(self, reqs: list[_Request], env: Mapping[SymVar, int]) -> None:
        """Build ``reqs`` as one module (bisecting on a build failure), time each, store each."""
        t0 = time.perf_counter()
        try:
            built = self._build_batch(reqs)
        except Exception as e:  # noqa: BLE001 - isolate the candidate that breaks the build
            if len(reqs) == 1:
                self._store(reqs[0], Entry(math.inf, 0.0, 0, f"build: {type(e).__name__}: {e}"[:300]))
                return
            half = len(reqs) // 2
            self._measure(reqs[:half], env)
            self._measure(reqs[half:], env)
            return
        fns, nulls, null_of, laid = built
        calls: list[Callable[[], Any]] = []
        null_calls: dict[int, Callable[[], Any]] = {}
        for k, fn in enumerate(fns):
            args = input_arrays(laid[k], env)
            calls.append(_bind(fn, args))
            j = null_of[k]
            if j is not None and j not in null_calls:
                null_calls[j] = _bind(nulls[j], args)
        order = sorted(null_calls)
        entries = self._time_many(calls + [null_calls[j] for j in order], limit=self.time_limit_s)
        null_s = {j: e.seconds for j, e in zip(order, entries[len(calls):])}
        for k, (r, entry) in enumerate(zip(reqs, entries)):
            j = null_of[k]
            call = null_s.get(j, math.inf) if j is not None else math.inf
            if not math.isfinite(call):
                call = self.overhead()
            self._store(r, entry if not math.isfinite(entry.seconds) else Entry(max(0.0, entry.seconds - call), entry.spread, entry.repeats, entry.detail))
        self.stats.seconds += time.perf_counter() - t0

    def _store(self, r: _Request, entry: Entry) -> None:
        r.result = entry
        self.stats.measured += 1
        if not math.isfinite(entry.seconds):
            self.stats.failed += 1
        self.cache.put(r.key, "+".join(sorted({c.backend for c in r.regions})), entry)

    def _build_batch(self, reqs: list[_Request]) -> tuple[list[Callable[..., Any]], list[Callable[..., Any]], list[int | None], list[GraphFunc]]:
        """One module of ``reqs``' functions, offloaded and their weights laid out, and, per
        distinct signature among them, a null function (``regions.null_function``: what the
        call alone costs); their VM functions, per request the index of its null one (None: it
        has no params), and the functions as built (whose params the inputs must fit)."""
        from tilework.runtime.vm import VM

        funcs: dict[str, GraphFunc] = {}
        specs: list[RegionSpec] = []
        for k, r in enumerate(reqs):
            assert r.func is not None
            name = f"c{k}"
            funcs[name] = r.func
            for c in r.regions:
                if c.backend == FALLBACK:
                    continue
                vars_ = tuple(r.g.bindings[i].var.name for i in c.nodes)
                specs.append(RegionSpec(c.backend, c.capability, vars_, name, 0))
        placement = Placement(tuple(specs), tuple(sorted({c.backend for r in reqs for c in r.regions})))
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # a lowering that gives up = a failed candidate
            mod = LayoutWeights(params=True)(Offload(placement).run(IRModule(funcs)))
        laid: list[GraphFunc] = []
        for k in range(len(reqs)):
            f = mod[f"c{k}"]
            assert isinstance(f, GraphFunc)
            laid.append(f)
        sigs: dict[tuple[str, ...], int] = {}
        null_of: list[int | None] = []
        for f in laid:
            sig = tuple(repr(p.info) for p in f.params)
            null = null_function(f) if sig not in sigs else None
            if null is not None:
                sigs[sig] = len(sigs)
                mod = mod.with_func(f"z{sigs[sig]}", null)
            null_of.append(sigs.get(sig))
        exe = _build(mod)
        self.stats.builds += 1
        vm = VM(exe)
        return [vm[f"c{k}"] for k in range(len(reqs))], [vm[f"z{j}"] for j in range(len(sigs))], null_of, laid

    def _time_many(self, fns: Sequence[Callable[[], Any]], limit: float, burst: bool = False, repeat: int | None = None, own: Sequence[bool] | None = None) -> list[Entry]:
        """Each of ``fns`` timed: a first call (sessions created, caches filled: it may take up
        to ``FIRST_CALL_LIMITS`` limits; a second call over ``limit`` ends the timing with its
        time) and warm-up calls, then repeats taken round-robin over all of them (a change in the machine's load
        hits every candidate alike), each repeat ``number`` calls long enough to time (with
        ``burst``, after untimed calls for ``BURST_WARM_S``, at least one and at most
        ``BURST_WARM_CALLS``: what the function left in the caches is what it finds, not what the
        others left; a model of 30 ms may still have its weights in the last-level cache); the median per function, more rounds while its
        spread ((max - min) / median) is above ``max_spread``, within ``limit`` seconds per
        function (``repeat``: repeats a round, default ``self.repeat``). A call that raises: infinity.
        ``own[i]``: function ``i`` runs tilework's kernels alone; timed right after one that
        does not, it waits ``POOL_SETTLE_S`` first, so that no other runtime's workers, still
        spinning from that call, take its cores (a Llama graph's codegen plan at one token,
        after the BLAS plan with OpenBLAS on 2 threads, timed 5.1 ms for its 0.96)."""
        entries: list[Entry | None] = [None] * len(fns)
        live: list[tuple[int, Callable[[], Any], int, int]] = []  # (index, fn, calls a repeat, untimed calls before it)
        for i, fn in enumerate(fns):
            try:
                t = time.perf_counter()
                fn()
                first = time.perf_counter() - t
                if first > FIRST_CALL_LIMITS * limit:
                    entries[i] = Entry(first, 0.0, 1, "the first call exceeded the time limit many times over")
                    continue
                t = time.perf_counter()
                fn()
                second = time.perf_counter() - t
                if second > limit:  # not judged by the first call: it may be a session's creation
                    entries[i] = Entry(second, 0.0, 1, "one call exceeded the time limit")
                    continue
                t = time.perf_counter()
                fn()
                one = max(time.perf_counter() - t, 1e-7)
                warm = min(BURST_WARM_CALLS, math.ceil(BURST_WARM_S / one)) if burst else 0  # at least 1: one > 0
                live.append((i, fn, max(1, int(self.min_repeat_s / one)), warm))
            except Exception as e:  # noqa: BLE001 - a candidate that fails to run costs infinity
                entries[i] = Entry(math.inf, 0.0, 0, f"run: {type(e).__name__}: {e}"[:300])
        samples: dict[int, list[float]] = {i: [] for i, _, _, _ in live}
        deadline = time.perf_counter() + limit * max(1, len(live))
        active = list(live)
        last: int | None = None  # the function timed last
        for _ in range(self.max_rounds):
            for _ in range(repeat or self.repeat):
                for i, fn, number, warm in active:
                    if entries[i] is not None:
                        continue
                    if own is not None and last is not None and own[i] and not own[last]:
                        time.sleep(POOL_SETTLE_S)
                    last = i
                    try:
                        for _ in range(warm):
                            fn()
                        t = time.perf_counter()
                        for _ in range(number):
                            fn()
                        samples[i].append((time.perf_counter() - t) / number)
                    except Exception as e:  # noqa: BLE001
                        entries[i] = Entry(math.inf, 0.0, 0, f"run: {type(e).__name__}: {e}"[:300])
            active = [a for a in active if entries[a[0]] is None and _spread(samples[a[0]]) > self.max_spread]
            if not active or time.perf_counter() > deadline:
                break
        for i, _, _, _ in live:
            if entries[i] is None:
                entries[i] = Entry(statistics.median(samples[i]), _spread(samples[i]), len(samples[i]), "")
        return [e if e is not None else Entry(math.inf, 0.0, 0, "not timed") for e in entries]


def _shared_inputs(f: GraphFunc, env: Mapping[SymVar, int], pool: dict[tuple[int, str], Any]) -> list[Any]:
    """``input_arrays(f, env)``, each array shared through ``pool`` with the functions whose
    param at the same place has the same struct info (plans differ in which weights they lay
    out, not in the rest: one copy of each weight per layout)."""
    keys = [(i, repr(p.info)) for i, p in enumerate(f.params)]
    if any(k not in pool for k in keys):
        for k, a in zip(keys, input_arrays(f, env)):
            pool.setdefault(k, a)
    return [pool[k] for k in keys]


def _bind(fn: Callable[..., Any], args: Sequence[Any]) -> Callable[[], Any]:
    return lambda: fn(*args)


def _spread(samples: Sequence[float]) -> float:
    if len(samples) < 2:
        return math.inf
    med = statistics.median(samples)
    return (max(samples) - min(samples)) / med if med > 0 else 0.0


def _versions(backends: Sequence[str]) -> list[tuple[str, str]]:
    return sorted({(b, availability(b)[1]) for b in backends})


def _transition_samples(g: BlockGraph, cands: Sequence[Candidate], costs: Sequence[float]) -> list[tuple[tuple[str, str], tuple[int, int]]]:
    """For each ordered pair of backends, one edge of ``g`` whose producer the first can run
    and whose consumer the second can (the smallest finite candidates), taken together valid."""
    shape = BlockShape(g)
    smallest: dict[tuple[int, str], int] = {}
    for k, c in enumerate(cands):
        if not math.isfinite(costs[k]):
            continue
        for i in c.nodes:
            cur = smallest.get((i, c.backend))
            if cur is None or len(cands[cur].nodes) > len(c.nodes):
                smallest[(i, c.backend)] = k
    backends = sorted({c.backend for c in cands})
    out = []
    for a in backends:
        for b in backends:
            if a == b:
                continue
            found = None
            for u in range(len(g)):
                if not isinstance(g.bindings[u], Binding) or (u, a) not in smallest:
                    continue
                for v in g.succ[u]:
                    if (v, b) not in smallest:
                        continue
                    ka, kb = smallest[(u, a)], smallest[(v, b)]
                    ca, cb = cands[ka], cands[kb]
                    if ca.mask & cb.mask or not shape.convex(ca.mask | cb.mask):
                        continue
                    if ca.backend == FALLBACK and cb.backend == FALLBACK:
                        continue
                    found = (ka, kb)
                    break
                if found:
                    break
            if found:
                out.append(((a, b), found))
    return out


__all__ = ["CostModel", "MockCostModel", "MeasuredCostModel", "Stats", "WholeTimes", "E2E_PROTOCOL", "register_builder", "ops_of", "ESTIMATOR_VERSION"]

"""The placement side of the command line: ``build --placement auto`` and its options,
``tilework explain FILE`` and ``tilework cache stats|clear``."""

from __future__ import annotations

import argparse
import math
from typing import Any

from tilework.errors import TileworkError


def add_build_args(b: argparse.ArgumentParser) -> None:
    b.add_argument("--placement", metavar="auto|PLAN.json", help="choose the backend of every part by measuring candidates on this machine, per shape bucket (auto; over --backends when given, else every available backend), or apply a saved plan (docs/placement.md)")
    b.add_argument("--budget", type=float, metavar="SECONDS", help="with --placement auto: the search's time limit, counted after its setup (loading the backends, making the candidates); measuring stops after it and the shape buckets not yet begun take tilework's kernels alone with the pinned regions (docs/placement.md)")
    b.add_argument("--bucket", action="append", default=[], metavar="DIM=P1,P2,...", help="with --placement auto: the points a dim's buckets are measured at, e.g. n=1,32,256 (repeat per dim)")
    b.add_argument("--pin", action="append", default=[], metavar="OP=BACKEND", help="with --placement auto: run an op or a binding on this backend, e.g. linear=blas (a .pt2 model's nn.Linear), matmul=blas (an ONNX model's MatMul or Gemm), %%lv3=onnxruntime; one that matches no op or binding of the model is an error listing its ops")


def build_options(args: argparse.Namespace) -> dict[str, Any]:
    """``placement`` and ``placement_options`` for ``tilework.build`` from the arguments."""
    if args.placement is None:
        if args.budget is not None or args.bucket or args.pin:
            raise TileworkError("--budget, --bucket and --pin need --placement auto")
        return {}
    buckets: dict[str, list[int]] = {}
    for spec in args.bucket:
        name, sep, points = spec.partition("=")
        try:
            values = [int(p) for p in points.split(",") if p.strip()]
        except ValueError:
            values = []
        if not sep or not name or not values:
            raise TileworkError(f"--bucket expects DIM=P1,P2,... (integers), got {spec!r}")
        buckets[name.strip()] = values
    pins: dict[str, str] = {}
    for spec in args.pin:
        key, sep, backend = spec.partition("=")
        if not sep or not key or not backend:
            raise TileworkError(f"--pin expects OP=BACKEND or %VAR=BACKEND, got {spec!r}")
        pins[key.strip()] = backend.strip()
    if args.budget is not None and not (args.budget > 0 and math.isfinite(args.budget)):
        raise TileworkError(f"--budget must be a positive number of seconds, got {args.budget}")
    options = {"budget_s": args.budget, "buckets": buckets or None, "pins": pins or None}
    return {"placement": args.placement, "placement_options": options}


def add_parsers(sub: Any) -> None:
    e = sub.add_parser("explain", help="explain a compiled model or executable (inputs, dims, kernels, the placement table) or a saved placement plan (.json)")
    e.add_argument("file", help="a file written by `tilework build`, CompiledModel.save or PlacementPlan.save")
    c = sub.add_parser("cache", help="inspect or empty the placement cost cache (measured costs, per backend)")
    c.add_argument("action", choices=("stats", "clear"), help="stats: entries per backend, size, path; clear: delete every entry")


def run(args: argparse.Namespace) -> int:
    if args.command == "cache":
        return _cache(args.action)
    return _explain(args.file)


def _cache(action: str) -> int:
    from tilework.collage.cache import CostCache, cache_path

    where = cache_path(create=False)
    for d in (where.parent.parent, where.parent):
        if d.exists() and not d.is_dir():
            what = f"the cache directory {d} (TILEWORK_CACHE_DIR)" if d == where.parent.parent else f"{d}, where the placement cost cache would be,"
            raise TileworkError(f"{what} is not a directory; no placement cost cache can be there")
    if not where.exists():  # a read of the cache writes nothing: an empty cache is reported, not made
        print(f"cleared 0 entries: no placement cost cache at {where}" if action == "clear" else f"placement cost cache: {where} (not created yet)\n  0 entries, 0.0 KiB")
        return 0
    cache = CostCache()
    if action == "clear":
        n = cache.clear()
        print(f"cleared {n} entr{'y' if n == 1 else 'ies'} from {cache.path}")
        return 0
    s = cache.stats()
    print(f"placement cost cache: {s['path']}")
    print(f"  {s['entries']} entries, {s['bytes'] / 1024:.1f} KiB")
    for backend, row in s["backends"].items():
        print(f"  {backend:<24} {row['entries']:>6} entries, {row['failed']} failed")
    return 0


def _explain(path: str) -> int:
    import os

    if not os.path.exists(path):
        raise TileworkError(f"no such file: {path}")
    if path.endswith(".json"):
        from tilework.collage.place import PlacementPlan

        print(PlacementPlan.load(path).table())
        return 0
    from tilework.compiled import CompiledModel, is_compiled_model
    from tilework.runtime.executable import load_file

    loaded = load_file(path)
    if is_compiled_model(loaded):
        print(CompiledModel.load(path).explain())
        return 0
    exe = loaded.executable
    print(f"{path}: {exe!r}")
    meta = exe.meta
    for name, sig in (meta.get("signature") or {}).items():  # absent from files of before 2026-12-06
        params = ", ".join(f"{p}: {info}" for p, info in sig["params"])
        print(f"  {name}({params}) -> {sig['returns']}")
        for dim, (lo, hi) in sig["dims"].items():
            print(f"    {lo} <= {dim}" + (f" <= {hi}" if hi is not None else "  (no upper bound)"))
    kernels = [k for m in exe.modules for k in m.functions]
    if kernels:
        print(f"  kernels: {', '.join(kernels)}")
    print(f"  target {meta.get('target', '?')}, pipeline {meta.get('pipeline', '?')}")
    if meta.get("backends"):
        print(f"  backends by priority: {', '.join(meta['backends'])}")
    if meta.get("placement") is not None:
        from tilework.collage.place import PlacementPlan

        for line in PlacementPlan.from_dict(meta["placement"], path).table().splitlines():
            print("  " + line)
    elif not meta.get("backends"):
        print("  every op on tilework's kernels")
    return 0


__all__ = ["add_build_args", "build_options", "add_parsers", "run"]

"""The explanation of a placement: per bucket, how the plan was chosen, every plan timed end
to end with its time, then one line per chosen region with its ops, the backend, the measured
cost and the best alternative with its cost; then the totals and how the search went."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tilework.collage.place import PlacementPlan


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return "failed" if not math.isfinite(x) else f"{1e3 * x:.3f}"


def _ops(ops: tuple[str, ...], limit: int = 40) -> str:
    text = ", ".join(ops)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plan_table(plan: "PlacementPlan") -> str:
    """See the module docstring."""
    distinct, index = plan.variants()
    lines = [f"placement of @{plan.func} over {', '.join(plan.backends)}: {len(plan.buckets)} bucket(s), {len(distinct)} distinct placement(s)"]
    for b, k in zip(plan.buckets, index):
        measured = f", end to end {_ms(b.measured_s)} ms" if b.measured_s is not None else ""
        lines.append(f"  bucket {b.bucket.label()}: variant {k}, estimated {_ms(b.estimate_s)} ms{measured}; chosen by {b.chosen_by}")
        if b.alternatives:
            lines.append("    end to end, ms: " + "; ".join(f"{a.label} {_ms(a.seconds)}" + (f" ({a.detail[:60]})" if a.detail else "") for a in b.alternatives))
        counts = b.placement.counts()
        if b.rows:
            lines.append(f"    {'region':<22} {'ops':<40} {'backend':<12} {'cost ms':>9}  best alternative")
            for r in b.rows:
                where = f"%{r.vars[0]}" if len(r.vars) == 1 else f"%{r.vars[0]}..%{r.vars[-1]}"
                alt = f"{r.alternative} {_ms(r.alternative_s)} ms" if r.alternative else "-"
                lines.append(f"    {where:<22} {_ops(r.ops):<40} {r.backend:<12} {_ms(r.cost_s):>9}  {alt}")
        else:
            lines.append(f"    regions: {len(b.placement.regions)}, bindings per backend: {counts or 'all codegen'}")
    s = plan.stats
    if s:
        setup = f" (setup {s['setup_s']:.2f} s: backends, candidates)" if isinstance(s.get("setup_s"), (int, float)) else ""
        parts = [f"search {s.get('search_s', 0):.2f} s{setup}", f"{s.get('candidates', 0)} candidates"]
        if "measured" in s:
            parts.append(f"{s['measured']} measured, {s.get('cache_hits', 0)} from the cache, {s.get('failed', 0)} failed, {s.get('builds', 0)} builds")
            if s.get("e2e_measured") or s.get("e2e_cache_hits"):
                parts.append(f"{s.get('e2e_measured', 0)} plan(s) timed end to end, {s.get('e2e_cache_hits', 0)} from the cache")
            parts.append(f"{100 * s.get('cache_share', 0):.0f}% of all from the cache")
        lines.append("  " + "; ".join(parts))
    lines.extend(f"  note: {n}" for n in plan.notes)
    return "\n".join(lines)


__all__ = ["plan_table"]

"""Automatic backend placement (Collage): for every part of a model, the backend that makes
the whole run fastest on this machine, per shape bucket of the dynamic dims.

``candidates`` (what each backend could run, valid regions, pins, the codegen fallback),
``cost`` (the estimator and a mock), ``cache`` (the persistent SQLite cost cache), ``search``
(the cheapest exact cover), ``validate`` (the fastest plan end to end), ``evolve`` (the
evolutionary refinement), ``buckets`` (shape buckets and dispatch), ``place`` (the whole
search, plans, applying them) and ``report`` (the explanation). See ``docs/placement.md``.
"""

from tilework.collage.cache import CostCache, cache_path
from tilework.collage.candidates import Candidate, block_candidates
from tilework.collage.cost import MeasuredCostModel, MockCostModel, register_builder
from tilework.collage.place import ApplyPlacement, PlacementPlan, apply_plan, place, plan_for
from tilework.collage.search import exact_cover

__all__ = [
    "Candidate",
    "CostCache",
    "MeasuredCostModel",
    "MockCostModel",
    "PlacementPlan",
    "ApplyPlacement",
    "apply_plan",
    "block_candidates",
    "cache_path",
    "exact_cover",
    "place",
    "plan_for",
    "register_builder",
]

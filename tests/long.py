"""The long tier of the tests: ``TILEWORK_LONG_TESTS=1`` runs it as well.

The default run (the README's test command, CI) keeps every behaviour checked at least once
and takes under ten minutes on two cores; the long tier adds the acceptance runs (whole models
against their references, many fuzz examples) and the rest of the grids whose first points the
default run checks (other shapes, dtypes, layouts, register files). Run it (the full ONNX node
suite has its own switch, ``TILEWORK_ONNX_FULL=1``: tests/frontend/test_onnx_conformance.py):

    TILEWORK_LONG_TESTS=1 python -m pytest -n 2
"""

from __future__ import annotations

import os
from typing import Any

import pytest

LONG = os.environ.get("TILEWORK_LONG_TESTS", "") == "1"


def long_only(why: str = "a long test") -> pytest.MarkDecorator:
    """Skips the test (or param) outside the long tier, saying ``why`` it is there."""
    return pytest.mark.skipif(not LONG, reason=f"{why}: set TILEWORK_LONG_TESTS=1")


def long_param(*values: Any, why: str = "another point of the grid", **kwargs: Any) -> Any:
    """``pytest.param(*values)`` run in the long tier only."""
    return pytest.param(*values, marks=long_only(why), **kwargs)

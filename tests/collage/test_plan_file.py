"""A saved placement plan read back: a field of the wrong type, an unknown version, bucket
ranges reversed or overlapping, a missing file are each a ``FileFormatError`` naming the file
and the field, from ``PlacementPlan.load``, ``tilework.build(placement=...)``, ``tilework
explain`` and ``tilework build --placement`` (an AttributeError, "this is a bug", before)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import pytest

import tilework as tw
from tilework.cli import main
from tilework.collage import MockCostModel, place
from tilework.collage.place import PlacementPlan
from tilework.errors import FileFormatError

from tests.collage.helpers import mlp


def _plan() -> dict[str, Any]:
    cost = lambda c, ops, dims: len(ops) * (1.0 if c.backend == "codegen" else 0.5 if dims["n"] > 8 else 2.0)  # noqa: E731
    return place(mlp(), ["blas", "codegen"], cost_model=MockCostModel(cost), buckets={"n": [1, 64]}).to_dict()


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value

    return edit


CASES = [
    (_set(("buckets",), "x"), "field buckets must be a list (got str \"x\")"),
    (_set(("buckets", 0), 3), "field buckets[0] must be an object"),
    (_set(("buckets", 0, "rows", 0), "row"), "field buckets[0].rows[0] must be a list of 8 items"),
    (_set(("buckets", 0, "rows", 0, 1), "0"), "field buckets[0].rows[0][1] must be an integer (got str \"0\")"),
    (_set(("buckets", 0, "rows", 0, 5), "0.5"), "field buckets[0].rows[0][5] must be a number of seconds"),
    (_set(("buckets", 0, "measured_s"), "12"), "field buckets[0].measured_s must be a number of seconds"),
    (_set(("buckets", 1, "bucket", "point", 0, 1), "64"), "field buckets[1].bucket.point[0][1] must be an integer"),
    (_set(("buckets", 1, "bucket", "ranges"), {"n": [9, 256]}), "field buckets[1].bucket.ranges must be a list"),
    (_set(("buckets", 1, "placement", "regions", 0, "vars"), "lv0"), "field buckets[1].placement.regions[0].vars must be a list of strings"),
    (_set(("buckets", 1, "placement", "regions", 0, "block"), None), "field buckets[1].placement.regions[0].block must be an integer"),
    (_set(("buckets", 0, "alternatives"), {"search": 1}), "field buckets[0].alternatives must be a list"),
    (_set(("backends",), "blas"), "field backends must be a list of strings"),
    (_set(("notes",), [1]), "field notes[0] must be a string"),
    (_set(("stats", "search_s"), "fast"), "field stats.search_s must be a number"),
    (_set(("version",), 99), "placement version 99, but this tilework reads version 1"),
    (_set(("buckets", 1, "bucket", "ranges", 0), ["n", 256, 9]), "buckets[1].bucket.ranges: n in [256, 9] is reversed"),
    (_set(("buckets", 1, "bucket", "ranges", 0), ["n", 4, 256]), "buckets[0] (n in [1, 8] (measured at n=1)) and buckets[1] (n in [4, 256] (measured at n=64)) overlap"),
]


@pytest.mark.parametrize("edit, message", CASES)
def test_a_malformed_plan_names_the_file_and_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Callable[[dict[str, Any]], None], message: str) -> None:
    data = copy.deepcopy(_plan())
    assert data["buckets"][0]["rows"] and data["buckets"][1]["placement"]["regions"]  # the fields edited exist
    edit(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FileFormatError, match=f"^{path}: .*"):
        PlacementPlan.load(str(path))
    try:
        PlacementPlan.load(path)
    except FileFormatError as e:
        assert message in str(e)
    with pytest.raises(FileFormatError) as caught:
        tw.build(mlp(), placement=str(path))
    assert message in str(caught.value)
    src = tmp_path / "mlp.txt"
    src.write_text(str(mlp()))
    for argv in (["explain", str(path)], ["build", str(src), "-o", str(tmp_path / "m.tw"), "--placement", str(path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}: ") and message in err and "bug" not in err


def test_the_plan_as_saved_still_reads(tmp_path: Path) -> None:
    data = _plan()
    (tmp_path / "plan.json").write_text(json.dumps(data))
    assert PlacementPlan.load(tmp_path / "plan.json").to_dict() == data


def test_a_missing_plan_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(FileFormatError, match=f"no such file: {missing}"):
        PlacementPlan.load(str(missing))


def test_save_refuses_a_target_that_is_not_a_regular_file(tmp_path: Path) -> None:
    """``PlacementPlan.save`` goes through the atomic writer: a directory (or a device node, a
    FIFO) at the path is refused by name, not replaced; a saved plan loads back equal."""
    plan = PlacementPlan.from_dict(_plan())
    (tmp_path / "d.json").mkdir()
    with pytest.raises(tw.TileworkError, match=r"cannot write '.*d\.json': not a regular file \(a directory\)"):
        plan.save(tmp_path / "d.json")
    plan.save(tmp_path / "p.json")
    assert PlacementPlan.load(tmp_path / "p.json").to_dict() == plan.to_dict()

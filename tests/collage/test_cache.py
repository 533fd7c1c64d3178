"""The persistent cost cache: concurrent writers, corruption, the private directory, stats."""

from __future__ import annotations

import math
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilework.collage.cache import CostCache, Entry, cache_path, make_key

WRITER = textwrap.dedent(
    """
    import importlib.util, sys, time
    # the cache module alone (it needs only the standard library), not all of tilework
    spec = importlib.util.spec_from_file_location("twcache", sys.argv[5])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["twcache"] = mod
    spec.loader.exec_module(mod)
    CostCache, Entry = mod.CostCache, mod.Entry
    path, tag, n, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    cache = CostCache(path)
    while time.time() < start:
        time.sleep(0.001)
    for i in range(n):
        cache.put(f"{tag}-{i}", tag, Entry(i * 1e-6, 0.0, 5, ""))
    print(len(cache))
    """
)


def test_two_processes_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    import time

    path = str(tmp_path / "costs.sqlite")
    CostCache(path).close()  # created (and in WAL mode) before the race
    import tilework.collage.cache as cache_module

    start = time.time() + 0.5
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, path, tag, "300", str(start), cache_module.__file__], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for tag in ("a", "b")]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    cache = CostCache(path)
    assert len(cache) == 600
    assert cache.get("a-299") == Entry(299e-6, 0.0, 5, "")
    assert cache.get("b-0") is not None
    stats = cache.stats()
    assert stats["backends"] == {"a": {"entries": 300, "failed": 0}, "b": {"entries": 300, "failed": 0}}


def test_a_corrupt_file_is_set_aside_and_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "costs.sqlite"
    path.write_bytes(b"this is not an sqlite database" * 100)
    with pytest.warns(UserWarning, match="unreadable"):
        cache = CostCache(str(path))
    cache.put("k", "codegen", Entry(1e-3, 0.1, 5, ""))
    assert cache.get("k") is not None
    aside = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")


def test_failures_round_trip_as_infinity_and_clear_empties(tmp_path: Path) -> None:
    cache = CostCache(str(tmp_path / "c.sqlite"))
    cache.put("bad", "torch", Entry(math.inf, 0.0, 0, "build: error"))
    cache.put("good", "torch", Entry(2e-3, 0.05, 5, ""))
    got = cache.get("bad")
    assert got is not None and got.seconds == math.inf and got.detail == "build: error"
    assert cache.stats()["backends"]["torch"] == {"entries": 2, "failed": 1}
    assert cache.get("missing") is None and cache.hits == 1 and cache.misses == 1
    assert cache.clear() == 2 and len(cache) == 0


def test_the_default_directory_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(tmp_path / "tw"))
    p = cache_path()
    assert p.parent == tmp_path / "tw" / "placement"
    assert stat.S_IMODE(os.stat(p.parent).st_mode) == 0o700
    assert make_key({"a": 1, "b": [2]}) == make_key({"b": [2], "a": 1})

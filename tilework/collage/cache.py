"""The persistent cost cache: measured costs in an SQLite database (the standard library's).

One row per measurement, keyed by a digest of everything the cost depends on: the region's
structural hash (``tilework.ir.structural``: names do not matter, constants do), its input
shapes and dtypes, the backend and its capability, the backend's version, the machine's
fingerprint (CPU model and flags, usable cores, thread settings, library versions) and the
estimator's settings. Identical regions (the layers of a transformer) share a row.

- **Concurrent writers**: the database runs in WAL mode with a busy timeout; each write is
  one short transaction (``INSERT OR REPLACE``), so processes that place models at the same
  time lose nothing and never see a half-written row.
- **Corruption**: a file that is not a readable database (or fails SQLite's ``quick_check``)
  is renamed to ``costs.sqlite.corrupt-<time>`` with a warning (the kernel cache's
  ``CacheWarning``: the command line shows it as one ``warning:`` line), and a fresh one is built.
- **Where**: ``<tilework cache dir>/placement/costs.sqlite`` (``TILEWORK_CACHE_DIR`` moves the
  cache dir); the directory is private (mode 0700). ``tilework cache stats|clear`` inspect it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from tilework.codegen.cache import CacheWarning

SCHEMA = 1
_TABLE = """CREATE TABLE IF NOT EXISTS costs (
    key TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    seconds REAL,            -- NULL: the candidate failed (infinite cost)
    spread REAL,
    repeats INTEGER,
    detail TEXT,
    created REAL NOT NULL
)"""


def cache_path(create: bool = True) -> Path:
    """``<cache dir>/placement/costs.sqlite``; the directory is created private (0700) unless
    ``create`` is False (a read that must write nothing)."""
    from tilework.codegen.cache import cache_location
    from tilework.codegen.c.toolchain import cache_dir

    if not create:
        return cache_location() / "placement" / "costs.sqlite"
    d = cache_dir() / "placement"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    return d / "costs.sqlite"


@functools.lru_cache(maxsize=1)
def machine_fingerprint() -> str:
    """What makes a measurement on this machine differ from one on another: the CPU model and
    flags, the cores this process may use, thread settings, and the versions of the libraries
    that run kernels."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features"))]
        cpu = "".join(sorted(set(lines)))
    except OSError:
        cpu = platform.processor()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    env = {k: os.environ.get(k, "") for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE")}
    import numpy

    blob = json.dumps([platform.machine(), cpu, cores, env, numpy.__version__, platform.python_version()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def make_key(parts: Mapping[str, Any]) -> str:
    """The digest of ``parts`` (JSON data) that keys a row."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    seconds: float  # math.inf: failed
    spread: float
    repeats: int
    detail: str


class CostCache:
    """See the module docstring. ``path=None``: the default location; ``":memory:"``: a private
    in-memory database (tests)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = str(cache_path() if path is None else path)
        self.hits = 0
        self.misses = 0
        self._conn = self._open()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 30000")
        if self.path != ":memory:":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(_TABLE)
        conn.execute("CREATE TABLE IF NOT EXISTS info (name TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT OR IGNORE INTO info VALUES ('schema', ?)", (str(SCHEMA),))
        row = conn.execute("PRAGMA quick_check").fetchone()
        if row is None or row[0] != "ok":
            conn.close()
            raise sqlite3.DatabaseError(f"quick_check: {row[0] if row else 'no answer'}")
        return conn

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as e:
            if self.path == ":memory:":
                raise
            aside = f"{self.path}.corrupt-{int(time.time())}"
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(self.path + suffix):
                    os.replace(self.path + suffix, aside + suffix)
            warnings.warn(f"tilework: the placement cost cache {self.path} was unreadable ({e}); it was moved to {aside} and a new one started", CacheWarning, stacklevel=3)
            return self._connect()

    def close(self) -> None:
        self._conn.close()

    # -- rows -------------------------------------------------------------------------------

    def get(self, key: str) -> Entry | None:
        row = self._conn.execute("SELECT seconds, spread, repeats, detail FROM costs WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        seconds = math.inf if row[0] is None else float(row[0])
        return Entry(seconds, float(row[1] or 0.0), int(row[2] or 0), str(row[3] or ""))

    def put(self, key: str, backend: str, entry: Entry) -> None:
        seconds = None if not math.isfinite(entry.seconds) else entry.seconds
        self.put_many([(key, backend, seconds, entry.spread, entry.repeats, entry.detail)])

    def put_many(self, rows: Iterable[tuple[str, str, float | None, float, int, str]]) -> None:
        """One transaction for all ``rows``."""
        now = time.time()
        data = [(k, b, s, sp, r, d, now) for k, b, s, sp, r, d in rows]
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.executemany("INSERT OR REPLACE INTO costs VALUES (?, ?, ?, ?, ?, ?, ?)", data)

    # -- inspection -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Rows in total and per backend (with failures), the file's size, this process's
        hits and misses."""
        per: dict[str, dict[str, int]] = {}
        for backend, n, failed in self._conn.execute("SELECT backend, COUNT(*), SUM(seconds IS NULL) FROM costs GROUP BY backend ORDER BY backend"):
            per[backend] = {"entries": int(n), "failed": int(failed or 0)}
        size = sum(os.path.getsize(self.path + s) for s in ("", "-wal") if self.path != ":memory:" and os.path.exists(self.path + s))
        return {"path": self.path, "entries": sum(v["entries"] for v in per.values()), "backends": per, "bytes": size, "hits": self.hits, "misses": self.misses}

    def clear(self) -> int:
        """Delete every row; the number deleted."""
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            n = self._conn.execute("DELETE FROM costs").rowcount
        self._conn.execute("VACUUM")
        return int(n)

    def __len__(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM costs").fetchone()[0])


__all__ = ["CostCache", "Entry", "cache_path", "machine_fingerprint", "make_key", "SCHEMA"]

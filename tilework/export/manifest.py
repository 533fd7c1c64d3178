"""The manifest of an export directory, ``.tilework-export``: what the last export into it wrote,
so that the next one replaces those files and no other, and removes those it no longer writes.

It is JSON, ``{"written_by": "tilework export", "note": ..., "files": {NAME: ENTRY}}``. An entry
is the file's SHA-256 and its stat when the export had written it (``{"sha256": HEX, "size": N,
"mtime_ns": N, "ctime_ns": N, "ino": N}``), or null while the export writes it (an export cut
short leaves files that are its own); a bare digest, as earlier exports wrote, is an entry
without a stat.

A file is *unchanged* when it is a regular file (not a link) whose size, mtime, ctime and inode
are the recorded ones, without reading a byte (an LLM's ``model.twb`` is hundreds of MB), or
else whose SHA-256 is. Writing, truncating or replacing a file changes its ctime, which no
call sets back (``touch -r`` and ``cp -p`` set the mtime only), so a file changed since is
hashed and refused; as for ``make``, only a write within the same clock tick as the export's
own, of the same size, would go unseen.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from tilework.errors import TileworkError, TileworkWarning
from tilework.export.externs import ExportError
from tilework.runtime.atomic import write_bytes_atomic

MANIFEST = ".tilework-export"
"""The file in which an export lists what it wrote, with each file's SHA-256 and stat: a later
export replaces those files (unchanged since) and refuses to replace any other unless forced."""

_STAT = ("size", "mtime_ns", "ctime_ns", "ino")


@dataclass(frozen=True)
class Entry:
    """What the manifest records of one file: its SHA-256 and, when known, its stat at the time
    the export wrote it."""

    sha256: str
    size: int | None = None
    mtime_ns: int | None = None
    ctime_ns: int | None = None
    ino: int | None = None

    @staticmethod
    def written(path: Path, sha256: str) -> "Entry":
        """The entry of the file the export has just written at ``path`` with digest ``sha256``."""
        st = os.lstat(path)
        return Entry(sha256, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def unchanged(self, path: Path) -> bool:
        """Whether ``path`` is still the regular file that this entry records (see the module
        docstring: its stat when that is the recorded one, else its digest)."""
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode):
            return False
        if self.size is not None and (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) == (self.size, self.mtime_ns, self.ctime_ns, self.ino):
            return True
        return digest(path) == self.sha256

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, **{k: getattr(self, k) for k in _STAT if getattr(self, k) is not None}}

    @staticmethod
    def from_json(v: Any) -> "Entry | None":
        """The entry of a manifest's value; None for one that is not an entry."""
        if isinstance(v, str):
            return Entry(v)
        if not isinstance(v, dict) or not isinstance(v.get("sha256"), str):
            return None
        stats = [v.get(k) for k in _STAT]
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in stats):
            return Entry(v["sha256"])  # a partial stat is no stat: the digest decides
        return Entry(v["sha256"], *stats)


def digest(path: Path) -> str | None:
    """The SHA-256 of a regular file (not following a link); None for anything else."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def read_manifest(out: Path) -> dict[str, Entry | None] | None:
    """The files the manifest in ``out`` lists (name -> entry, None while being written); None
    when there is no readable manifest."""
    try:
        blob = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = blob.get("files") if isinstance(blob, dict) and blob.get("written_by") == "tilework export" else None
    if not isinstance(files, dict) or not all(isinstance(k, str) for k in files):
        return None
    entries = {k: None if v is None else Entry.from_json(v) for k, v in files.items()}
    if any(e is None and files[k] is not None for k, e in entries.items()):
        return None  # a value that is no entry: not a manifest an export wrote
    return entries


def write_manifest(out: Path, files: Mapping[str, Entry | None]) -> None:
    blob = {
        "written_by": "tilework export",
        "note": "the files the last export into this directory wrote; the next export replaces them",
        "files": {name: None if e is None else e.to_json() for name, e in files.items()},
    }
    write_bytes_atomic(out / MANIFEST, (json.dumps(blob, indent=1) + "\n").encode())


def check_overwrite(out: Path, names: Sequence[str], *, force: bool = False) -> dict[str, Entry | None]:
    """Refuse (``ExportError`` naming them) when ``out`` holds any of ``names`` (or a manifest)
    that a tilework export did not write, or that changed since; ``force`` allows it. Returns
    what the directory's manifest records."""
    recorded = read_manifest(out)
    if force:
        return recorded or {}
    foreign = []
    for name in [*names, MANIFEST]:
        path = out / name
        if not os.path.lexists(path):
            continue
        if name == MANIFEST:
            if recorded is None:
                foreign.append(name)
            continue
        if recorded is None or name not in recorded:
            foreign.append(name)
        elif (entry := recorded[name]) is not None and not entry.unchanged(path):
            foreign.append(name)
    if foreign:
        raise ExportError(
            f"{out} holds {', '.join(foreign)}, which the export would replace and which a tilework export did not write "
            "(or which changed since): export into another directory, or pass --force (force=True) to replace them"
        )
    return recorded or {}


def remove_stale(out: Path, recorded: Mapping[str, Entry | None], written: Collection[str], known: Collection[str]) -> list[str]:
    """Remove the files an earlier export into ``out`` wrote (listed in ``recorded``, named like
    a file an export writes: one of ``known``) that this export did not write (``written``), each
    only when it is unchanged since; return those left (changed since, or never recorded whole:
    that export was cut short), after one ``TileworkWarning`` naming them."""
    kept = []
    for name, entry in recorded.items():
        path = out / name
        if name in written or name == MANIFEST or name not in known or not os.path.lexists(path):
            continue
        if entry is None or not entry.unchanged(path):
            kept.append(name)
            continue
        try:
            os.unlink(path)
        except OSError as e:
            raise TileworkError(f"cannot remove {os.fspath(path)!r}, which an earlier export wrote and this one does not: {e.strerror or e}") from None
    if kept:
        it, is_ = ("it", "it is") if len(kept) == 1 else ("them", "they are")
        warnings.warn(
            f"tilework: left {', '.join(kept)} in {out}: an earlier export wrote {it} and this one does not, "
            f"but {is_} not what that export wrote (changed since, or that export was cut short); remove {it} if nothing needs {it}",
            TileworkWarning,
            stacklevel=3,
        )
    return kept


__all__ = ["MANIFEST", "Entry", "digest", "read_manifest", "write_manifest", "check_overwrite", "remove_stale"]

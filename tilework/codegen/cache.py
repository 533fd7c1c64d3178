"""The local cache directory and the rules every cached artifact follows: trust nothing in it.

- Where: ``$TILEWORK_CACHE_DIR``, else ``$XDG_CACHE_HOME/tilework``, else ``~/.cache/tilework``.
  It is created private (0700). A directory that another user could write (owned by someone
  other than us or root, or writable by group or others) is refused with ``BuildError``: what
  it holds could have been put there by anyone.
- Entries are written atomically (a private temporary file moved into place) and each has a
  *record*: JSON naming the key the entry was made for and the SHA-256 and size of its bytes.
  ``read_verified`` reads an entry only when it is a regular file of ours and its bytes have
  the recorded digest under the record of the key asked for; a truncated, swapped, planted or
  garbage entry is *set aside* (moved to ``bad/`` in the cache, with a ``CacheWarning``) and
  the caller rebuilds it. Records are checked the same way (a malformed record is no record).
- One builder per entry: ``building(root, key)`` holds an exclusive lock (``flock`` on
  ``locks/<key>.lock``) while an entry is made, so processes that want the same entry at once
  (two starts of the same model, test workers) build it once: the others wait, then find it.
- A cache directory we cannot write is used read-only: verified entries are used, nothing is
  written there, and new artifacts go to a private scratch directory of this process
  (``scratch_dir``), with one warning.
- That scratch directory (``tilework-scratch-PID-TAG-XXXXXXXX`` in the temporary directory,
  0700) also holds the private copies shared objects are loaded from (each removed once
  loaded). It is removed when the process exits; one left by a process killed before its exit
  handlers ran is removed by the next process that makes its own (``sweep_scratch``: this
  user's, this machine's and PID namespace's, of a PID no process has).

Users of the cache (kernels: ``tilework.codegen.c.toolchain``; placement costs; LLM
executables) build on these helpers rather than on paths of their own.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import itertools
import json
import os
import re
import shutil
import stat
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

from tilework.errors import BuildError, TileworkWarning


class CacheWarning(TileworkWarning):
    """A cache entry was set aside (and will be rebuilt), or the cache is read-only."""


def cache_location() -> Path:
    """Where the cache directory is (``TILEWORK_CACHE_DIR``, else the XDG cache home's
    ``tilework``); nothing is created (``cache_dir`` creates it)."""
    env = os.environ.get("TILEWORK_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tilework"


def cache_dir() -> Path:
    """The cache directory: created 0700 on demand, refused when another user can write it."""
    path = cache_location()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as e:
        raise BuildError(f"cannot use the cache directory {path} ({e}); set TILEWORK_CACHE_DIR to a writable directory") from e
    check_private(path, st)
    return path


def check_private(path: Path, st: os.stat_result | None = None) -> None:
    """Raise ``BuildError`` unless ``path`` is a directory that only we (or root) can write."""
    st = st or path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise BuildError(f"the cache directory {path} is not a directory; set TILEWORK_CACHE_DIR to a directory of your own")
    owner_ok = st.st_uid in (os.geteuid(), 0)
    if not owner_ok or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "is owned by another user" if not owner_ok else f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
        raise BuildError(
            f"refusing the cache directory {path}: it {who}, so its contents could have been put there by anyone. "
            f"Use a private one (`chmod 700 {path}`, or set TILEWORK_CACHE_DIR to a directory of your own)"
        )


def writable(root: Path) -> bool:
    """Whether entries can be added to ``root`` (a read-only cache is used read-only)."""
    return os.access(root, os.W_OK | os.X_OK)


_warned_read_only: set[str] = set()


SCRATCH_PREFIX = "tilework-scratch-"
_SCRATCH_NAME = re.compile(r"tilework-scratch-(\d+)-([0-9a-f]{12})-")


@functools.lru_cache(maxsize=1)
def _scratch() -> Path:
    """This process's scratch directory, ``tilework-scratch-PID-TAG-XXXXXXXX`` in the temporary
    directory (0700), made on first use (first sweeping those of dead processes:
    ``sweep_scratch``) and removed when this process exits; a forked child makes its own."""
    sweep_scratch()
    pid = os.getpid()
    path = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{pid}-{_host_tag() or 'unknown'}-"))
    atexit.register(_remove_scratch, path, pid)
    return path


def _remove_scratch(path: Path, pid: int) -> None:
    if os.getpid() == pid:  # not from a forked child: the directory is its parent's
        shutil.rmtree(path, ignore_errors=True)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_scratch.cache_clear)


@functools.lru_cache(maxsize=1)
def _host_tag() -> str | None:
    """What tells this machine's processes from others' that may share the temporary directory:
    a digest of the boot id and of the PID namespace, within which a PID names one process; None
    where Linux's ``/proc`` cannot tell them (then no directory is swept)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return hashlib.sha256(f"{boot} {namespace}".encode()).hexdigest()[:12]


def sweep_scratch(tmp: Path | None = None) -> list[Path]:
    """Remove the scratch directories (in ``tmp``, default the temporary directory) that
    processes of this user, on this machine and in this PID namespace, made and left when they
    died without running their exit handlers (killed by a signal, ``os._exit``, a test's
    timeout); return them. A directory is removed only when it is one (not a link), its owner is
    this user, its name carries this machine's tag and the PID of a process that no longer
    exists; a directory of another user, of a live process, or of an older name (without a PID)
    is never touched."""
    tag = _host_tag()
    if tag is None:
        return []
    root = Path(tmp or tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        m = _SCRATCH_NAME.match(entry.name)
        if m is None or m.group(2) != tag or int(m.group(1)) == os.getpid():
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or _alive(int(m.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's (or not a PID we can ask about: kept)
    return True


def scratch_dir(root: Path) -> Path:
    """Where this process puts what it builds when the cache ``root`` is read-only: a private
    temporary directory removed at exit (warns once per cache)."""
    if str(root) not in _warned_read_only:
        _warned_read_only.add(str(root))
        warnings.warn(f"tilework: the cache directory {root} is read-only; what is built now is not cached", CacheWarning, stacklevel=3)
    return _scratch()


def private_copy(data: bytes, suffix: str = ".so", own: bool = False) -> Path:
    """``data`` in a file of this process's private scratch directory, named by its digest:
    what native code is loaded from, so that the bytes loaded are the bytes verified and a
    later change to the cache (truncating a file that is mapped would kill the process with
    SIGBUS) cannot reach a running process. ``own``: a name no other copy has (see
    ``load_shared_object``)."""
    name = digest(data)[:32] + (f"-{next(_COPIES)}" if own else "")
    path = _scratch() / f"{name}{suffix}"
    write_atomic(path, data)
    return path


_COPIES = itertools.count()


def load_shared_object(path: Path, data: bytes | None, own: bool = False) -> ctypes.CDLL:
    """Load the shared object ``path`` whose verified bytes are ``data``: from a private copy of
    those bytes (removed once loaded, the mapping stays), so that what runs is what was
    verified and no later change to the cache file can reach this process; from ``path``
    itself where the scratch directory cannot hold code (a ``noexec`` /tmp) or without
    ``data``. Raises OSError when the object does not load.

    The loader hands out one handle per file name: loading the same bytes again gives the
    object already loaded, with its globals as the first load left them. ``own=True`` loads a
    copy of its own (its own globals: a native model's table of imported kernels), except on
    the fallback from ``path``, where ``load_shared_object`` cannot tell."""
    if data is None:
        return ctypes.CDLL(str(path))
    copy = private_copy(data, own=own)
    try:
        return ctypes.CDLL(str(copy))
    except OSError:
        return ctypes.CDLL(str(path))
    finally:
        copy.unlink(missing_ok=True)


@contextlib.contextmanager
def building(root: Path, key: str) -> Iterator[None]:
    """Hold the cache's lock for the entry ``key`` while it is built: another process building
    the same entry waits here until this one is done (then finds the entry, and builds nothing).
    Without ``fcntl`` (not POSIX) or in a read-only cache there is no lock: each builds its own."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    if not writable(root):
        yield
        return
    locks = root / "locks"
    locks.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(locks / f"{key[:64]}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd is closed, also if the process dies
        yield
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a private temporary file in the same directory."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_path(entry: Path) -> Path:
    return entry.with_name(entry.name + ".json")


def write_entry(entry: Path, data: bytes, key: str, **extra: Any) -> None:
    """Store ``data`` at ``entry`` with its record (the key, digest and size, and ``extra``)."""
    write_atomic(entry, data)
    write_record(entry, key, data, **extra)


def write_record(entry: Path, key: str, data: bytes, **extra: Any) -> None:
    rec = {"key": key, "sha256": digest(data), "size": len(data), **extra}
    write_atomic(record_path(entry), json.dumps(rec).encode())


def read_json(path: Path) -> dict[str, Any] | None:
    """A small JSON object from a regular file of ours, or None (missing, foreign, malformed)."""
    data = _read_own_file(path, limit=1 << 20)
    if data is None:
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def read_verified(entry: Path, key: str) -> bytes | None:
    """The bytes of ``entry`` when its record names ``key`` and their digest and size; None
    when there is no such entry. An entry that fails the check is set aside (with a warning)."""
    if not entry.exists() and not entry.is_symlink():
        return None
    rec = read_json(record_path(entry))
    why = _mismatch(entry, rec, key)
    if why is None:
        data = _read_own_file(entry)
        assert rec is not None
        if data is not None and len(data) == rec["size"] and digest(data) == rec["sha256"]:
            return data
        why = "its bytes do not have the recorded SHA-256 (truncated, replaced or corrupt)"
    set_aside(entry, why)
    return None


def _mismatch(entry: Path, rec: Mapping[str, Any] | None, key: str) -> str | None:
    if rec is None:
        return "it has no valid record (planted, or left by an interrupted build)"
    if rec.get("key") != key:
        return f"its record is for another key ({str(rec.get('key'))[:40]!r}): a foreign entry"
    if not isinstance(rec.get("sha256"), str) or not isinstance(rec.get("size"), int):
        return "its record is malformed"
    return None


def _read_own_file(path: Path, limit: int | None = None) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not a link) owned by us or root that
    nobody else can write; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None
        if limit is not None and st.st_size > limit:
            return None
        return f.read()


def set_aside(entry: Path, why: str) -> None:
    """Move ``entry`` and its record out of the way (into ``bad/`` of its directory, when it can
    be written) and warn; the caller rebuilds what it needed."""
    warnings.warn(f"tilework: set aside the cache entry {entry}: {why}; rebuilding it", CacheWarning, stacklevel=3)
    if not writable(entry.parent):
        return
    bad = entry.parent / "bad"
    stamp = time.time_ns()
    for path in (entry, record_path(entry)):
        try:
            bad.mkdir(mode=0o700, exist_ok=True)
            os.replace(path, bad / f"{path.name}.{stamp}")
        except OSError:
            pass  # already gone (another process set it aside), or not ours to move


__all__ = ["CacheWarning", "cache_dir", "cache_location", "private_copy", "load_shared_object", "check_private", "writable", "scratch_dir", "sweep_scratch", "write_atomic", "write_entry", "write_record", "read_json", "read_verified", "set_aside", "digest", "record_path"]

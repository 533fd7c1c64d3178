"""Writing a file the user named, atomically: the one writer of ``.tw`` files (``Executable.save``,
``CompiledModel.save``, ``tilework build -o``) and of ``tilework export``'s files.

``write_atomic(path, write)`` calls ``write(fh)`` on a new temporary file in the directory of
the target, then renames it over the target (``os.replace``): a reader sees the old file or the
new one, never half of one, and a failed write leaves the old file as it was and no temporary
file behind. What the target may be:

- a missing path or a regular file: written (replaced);
- a symbolic link: the file it points to is written and the link is kept (as ``open(path,
  "w")`` would; the link's target directory receives the temporary file);
- anything else (a directory, a device node such as ``/dev/null``, a FIFO, a socket) is refused
  with ``cannot write 'PATH': not a regular file (...)``: replacing it would destroy it.

Mode: a new file gets the mode a file created by ``open`` gets under the process's umask
(``0o666 & ~umask``; the temporary file is created with that mode, not ``mkstemp``'s 0600); a
replaced file keeps its permission bits, as it would when written in place. Any ``OSError``
(no space left, no permission, a missing directory) raises ``TileworkError("cannot write
'PATH': REASON")`` naming the path as given.

The kernel cache and the placement cost cache write private files with their own writers
(``tilework.codegen.cache``): their 0700/0600 modes are by design and do not go through here.
"""

from __future__ import annotations

import os
import secrets
import stat
from typing import BinaryIO, Callable

from tilework.errors import TileworkError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def write_target(path: str | os.PathLike[str]) -> str:
    """The file that writing ``path`` replaces: ``path`` with symbolic links resolved. Raises
    ``TileworkError`` when it exists and is not a regular file (see the module docstring)."""
    target = os.path.realpath(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target
    except OSError as e:
        raise TileworkError(f"cannot write {os.fspath(path)!r}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise TileworkError(f"cannot write {os.fspath(path)!r}: not a regular file ({_kind(st.st_mode)})")
    return target


def _open(fd: int, tmp: str) -> BinaryIO:
    """The writer of the temporary file ``tmp`` (a seam for the tests' full disk)."""
    return os.fdopen(fd, "wb")


def write_atomic(path: str | os.PathLike[str], write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` through ``write(fh)`` atomically (see the module docstring)."""
    name = os.fspath(path)
    target = write_target(name)
    directory, base = os.path.split(target)
    try:
        keep = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        keep = None
    except OSError as e:
        raise TileworkError(f"cannot write {name!r}: {e.strerror or e}") from None
    tmp = ""
    try:
        for _ in range(100):
            tmp = os.path.join(directory, f".{base}.{secrets.token_hex(4)}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)  # the umask applies
                break
            except FileExistsError:
                continue
        else:
            tmp = ""
            raise FileExistsError(f"no free temporary name in {directory}")
        with _open(fd, tmp) as fh:
            write(fh)
            if keep is not None:
                os.fchmod(fh.fileno(), keep)
        os.replace(tmp, target)
        tmp = ""
    except OSError as e:
        raise TileworkError(f"cannot write {name!r}: {e.strerror or e}") from None
    finally:
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """``write_atomic`` of one byte string."""

    def put(fh: BinaryIO) -> None:
        fh.write(data)

    write_atomic(path, put)


__all__ = ["write_atomic", "write_bytes_atomic", "write_target"]

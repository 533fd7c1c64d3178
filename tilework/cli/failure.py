"""How the command line reports a failure: the one place where an exception becomes a message
on stderr and an exit status, so that every subcommand reports the same way.

- A user error (a ``TileworkError``: bad input, a file that is not what it should be; an
  ``OSError``: a missing file, a permission) is one ``error: ...`` message, exit status 2.
- Ctrl-C ends quietly with 130; a closed pipe (``tilework run ... | head``) with 141.
- Anything else is a bug in tilework: ``internal error: ...`` and a request to report it, exit
  status 1.

No traceback is printed unless ``--debug`` asks for it (then before the message, for any kind).
tilework's own warnings (``TileworkWarning``: a cache's ``CacheWarning``, files an export left)
are one ``warning: ...`` line each (no category, no source line).
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from typing import Any, Callable

from tilework.errors import TileworkError, TileworkWarning

USER_ERROR = 2
INTERNAL_ERROR = 1
INTERRUPTED = 130
BROKEN_PIPE = 141


def guarded(command: Callable[[Any], int], args: Any, *, debug: bool = False) -> int:
    """Run ``command(args)``; an exception becomes a message on stderr and an exit status, and
    tilework's own warnings one ``warning: ...`` line each (``show_warning``)."""
    with warnings.catch_warnings():
        warnings.showwarning = show_warning(warnings.showwarning)
        return _guarded(command, args, debug)


def show_warning(previous: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints tilework's own warnings (``TileworkWarning``: the
    caches' ``CacheWarning`` for an entry set aside, a corrupt cost cache moved away, a read-only
    cache; files an export left) as one ``warning: ...`` line on stderr, without Python's
    category and source line; any other warning as ``previous``."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: str | None = None) -> None:
        if issubclass(category, TileworkWarning):
            print(f"warning: {str(message).removeprefix('tilework: ')}", file=sys.stderr if file is None else file)
        else:
            previous(message, category, filename, lineno, file, line)

    return show


def _guarded(command: Callable[[Any], int], args: Any, debug: bool) -> int:
    try:
        return command(args)
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        _detach_stdout()
        return BROKEN_PIPE
    except Exception as e:
        if debug:
            traceback.print_exc()
        text, status = describe(e)
        print(text, file=sys.stderr)
        return status


def describe(e: BaseException) -> tuple[str, int]:
    """The message and exit status for ``e``."""
    if isinstance(e, TileworkError):
        return f"error: {e}", USER_ERROR
    if isinstance(e, OSError):
        return f"error: {os_error(e)}", USER_ERROR
    if isinstance(e, MemoryError):
        return "error: out of memory (are the inputs or the --dim bounds far larger than intended?)", INTERNAL_ERROR
    head = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
    return (
        f"internal error: {head}\n"
        "this is a bug in tilework: please report it with the output of the same command run with --debug",
        INTERNAL_ERROR,
    )


def os_error(e: OSError) -> str:
    """``PATH: reason`` for an OSError (``m.tw: Permission denied``)."""
    reason = e.strerror or str(e)
    if e.filename is None:
        return reason
    where = os.fsdecode(e.filename)
    if e.filename2 is not None:
        where += f" -> {os.fsdecode(e.filename2)}"
    return f"{where}: {reason}"


def _detach_stdout() -> None:
    """Point stdout at /dev/null so that Python's flush at exit does not complain again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


__all__ = ["guarded", "describe", "os_error", "USER_ERROR", "INTERNAL_ERROR"]

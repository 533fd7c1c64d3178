"""Library functions the VM can call by symbol (``call_lib`` / ``call_packed`` targets).

Backends register their entry points here (``register_extern("blas.matmul", fn)``); the VM
resolves symbols once, when it loads an executable, so an executable that needs a library
which is not installed fails at load with a message naming the symbol. The built-in backends
register when ``tilework`` is imported; an executable file never brings functions of its own.
"""

from __future__ import annotations

from typing import Any, Callable

_EXTERNS: dict[str, Callable[..., Any]] = {}
_CHECKS: dict[str, Callable[..., None]] = {}


def register_extern(symbol: str, fn: Callable[..., Any], override: bool = False) -> None:
    if symbol in _EXTERNS and not override:
        raise ValueError(f"extern function {symbol!r} is registered twice")
    _EXTERNS[symbol] = fn


def lookup_extern(symbol: str) -> Callable[..., Any] | None:
    """The function registered as ``symbol``, or None."""
    return _EXTERNS.get(symbol)


def register_extern_check(symbol: str, check: Callable[..., None]) -> None:
    """``check(symbol, *args)`` raises ``RuntimeCheckError`` unless ``args`` are a call of
    ``symbol`` that stays inside its arrays (dtypes, layout, sizes against the dims it is
    given). A VM runs it before each call of an executable read from a file; a function that
    reaches memory by raw pointers (ctypes, C) needs one to be safe there."""
    _CHECKS[symbol] = check


def lookup_extern_check(symbol: str) -> Callable[..., None] | None:
    return _CHECKS.get(symbol)

"""Library functions the VM can call by symbol (``call_lib`` / ``call_packed`` targets).

Backends register their entry points here (``register_extern("blas.matmul", fn)``); the VM
resolves symbols once, when it loads an executable, so an executable that needs a library
which is not installed fails at load with a message naming the symbol. The built-in backends
register when ``tilework`` is imported; an executable file never brings functions of its own.
"""

from __future__ import annotations

from typing import Any, Callable

_EXTERNS: dict[str, Callable[..., Any]] = {}


def register_extern(symbol: str, fn: Callable[..., Any], override: bool = False) -> None:
    if symbol in _EXTERNS and not override:
        raise ValueError(f"extern function {symbol!r} is registered twice")
    _EXTERNS[symbol] = fn


def lookup_extern(symbol: str) -> Callable[..., Any] | None:
    """The function registered as ``symbol``, or None."""
    return _EXTERNS.get(symbol)

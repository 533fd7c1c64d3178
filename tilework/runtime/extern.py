"""Library functions the VM can call by symbol (``call_lib`` / ``call_packed`` targets).

Backends register their entry points here (``register_extern("blas.matmul", fn)``); the VM
resolves symbols once, when it loads an executable, so an executable that needs a library
which is not installed fails at load with a message naming the symbol.
"""

from __future__ import annotations

from typing import Any, Callable

_EXTERNS: dict[str, Callable[..., Any]] = {}


def register_extern(symbol: str, fn: Callable[..., Any], override: bool = False) -> None:
    if symbol in _EXTERNS and not override:
        raise ValueError(f"extern function {symbol!r} is registered twice")
    _EXTERNS[symbol] = fn


def lookup_extern(symbol: str) -> Callable[..., Any] | None:
    """The function registered as ``symbol``. On a miss, the built-in backends
    (``tilework.backend``, which registers their externs) are imported once, so an executable
    saved with offloaded calls loads in a fresh process."""
    fn = _EXTERNS.get(symbol)
    if fn is None and not _BUILTINS_LOADED:
        _load_builtin_backends()
        fn = _EXTERNS.get(symbol)
    return fn


_BUILTINS_LOADED = False


def _load_builtin_backends() -> None:
    global _BUILTINS_LOADED
    _BUILTINS_LOADED = True
    import tilework.backend  # noqa: F401  (registers the built-in backends' externs)


def extern_symbols() -> list[str]:
    return sorted(_EXTERNS)

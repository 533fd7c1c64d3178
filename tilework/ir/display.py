"""How the IR shows itself in ``repr`` and in messages: through the text printer.

The printer lives in a higher layer (``tilework.text``) and registers itself here when it is
imported (``import tilework`` does that), so the IR never imports it. Until one is registered,
``show_*`` fall back to compact forms.
"""

from __future__ import annotations

from typing import Any, Protocol


class Printer(Protocol):
    def print_module(self, mod: Any) -> str: ...

    def print_func(self, name: str, func: Any, highlight: Any = None, note: str = "") -> str: ...

    def print_expr(self, e: Any) -> str: ...

    def print_info(self, info: Any) -> str: ...


_PRINTER: Printer | None = None


def register_printer(printer: Printer) -> None:
    global _PRINTER
    _PRINTER = printer


def printer() -> Printer | None:
    """The registered text printer, or None."""
    return _PRINTER


def show_module(mod: Any) -> str:
    if _PRINTER is not None:
        return _PRINTER.print_module(mod)
    return f"IRModule({', '.join(mod)})"


def show_expr(e: Any) -> str:
    return _PRINTER.print_expr(e) if _PRINTER is not None else repr(e)


def show_info(info: Any) -> str:
    return _PRINTER.print_info(info) if _PRINTER is not None else repr(info)

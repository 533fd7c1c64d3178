"""Reading a transformers ``config.json`` dict: one home for the two lookups every model
family's reader makes (:meth:`tilework.llm.config.LlmConfig.from_hf_config`,
:func:`tilework.llm.gemma.hf_fields`)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from tilework.errors import TileworkError


def key_reader(d: Mapping[str, Any], defaults: Mapping[str, Any], where: str) -> tuple[Callable[[str], Any], Callable[[str], Any]]:
    """``(get, need)`` over config ``d``: ``get(key)`` is its value, or the class default in
    ``defaults`` where the key is absent or null; ``need(key)`` its value, a
    :class:`~tilework.errors.TileworkError` naming the key and ``where`` when there is none."""

    def get(key: str) -> Any:
        v = d.get(key)
        return defaults.get(key) if v is None else v

    def need(key: str) -> Any:
        if d.get(key) is None:
            raise TileworkError(f"{where}: config has no {key!r}")
        return d[key]

    return get, need

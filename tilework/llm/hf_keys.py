"""Reading a transformers ``config.json`` dict: one home for what every model family's reader
does (:meth:`tilework.llm.config.LlmConfig.from_hf_config`, :func:`tilework.llm.gemma.hf_fields`):
the two key lookups, and the sliding layers of a ``layer_types`` list."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from tilework.errors import TileworkError, UnsupportedError


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


def sliding_layers(types: Sequence[str], layers: int | None, where: str) -> tuple[int, ...]:
    """The layers a transformers config's ``layer_types`` makes ``sliding_attention`` ones; a
    type other than that and ``full_attention`` (or, ``layers`` given, not one type a layer) is
    an :class:`~tilework.errors.UnsupportedError` naming the key and ``where``."""
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown or (layers is not None and len(types) != layers):
        raise UnsupportedError(f"{where}: layer types {unknown or list(types)} (layer_types) are not supported; supported: full_attention, sliding_attention, one a layer")
    return tuple(i for i, t in enumerate(types) if t == "sliding_attention")

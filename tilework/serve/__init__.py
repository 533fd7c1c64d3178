"""``tilework serve``: an OpenAI-compatible HTTP API with continuous batching on ``tilework.llm``.

``scheduler`` (``Scheduler``: one thread owns the LLM; requests join and leave the decode batch
at every step; chunked prefill; limits on sequences and KV pages), ``protocol`` (OpenAI request
and response bodies), ``app`` (the Starlette application), ``metrics`` (Prometheus text),
``server`` (``serve`` and ``BackgroundServer`` on uvicorn). docs/serve.md tells the whole story.
Importing this package imports neither starlette nor uvicorn.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Scheduler": "scheduler",
    "Event": "scheduler",
    "RequestError": "scheduler",
    "BackgroundServer": "server",
    "serve": "server",
    "create_app": "app",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tilework.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tilework.serve.{module}"), name)


__all__ = list(_EXPORTS)

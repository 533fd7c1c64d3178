"""The LLM flow: GGUF and transformers models, the Llama-family decoder compiled once over a
paged KV cache, tokenizer, chat template, sampling and generation.

    from tilework.llm import LLM, SamplingParams
    llm = LLM()                                   # the embedded SmolLM2-135M-Instruct
    print(llm.generate("Hi!", SamplingParams(temperature=0))[0].text)

``engine`` (``LLM``, ``ChatSession``), ``compile`` (the compiled decoder and its cache),
``model`` (the decoder), ``kv_cache``, ``weights``/``gguf``/``quant``/``config`` (loading),
``tokenizer``, ``chat``, ``sampling``, ``grammar`` (structured output). Importing this package imports none of gguf,
tokenizers or jinja2; the names below load their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": "engine",
    "ChatSession": "engine",
    "Generation": "engine",
    "Stats": "engine",
    "default_model_path": "engine",
    "SamplingParams": "sampling",
    "Sampler": "sampling",
    "Grammar": "grammar",
    "Tokenizer": "tokenizer",
    "ChatTemplate": "chat",
    "Conversation": "chat",
    "PagedKVCache": "kv_cache",
    "LlmConfig": "config",
    "load_weights": "weights",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tilework.llm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tilework.llm.{module}"), name)


__all__ = list(_EXPORTS)

"""``tilework serve``: an OpenAI-compatible HTTP API with continuous batching on ``tilework.llm``.

``scheduler`` (``Scheduler``: one thread owns the LLM; requests join and leave the decode batch
at every step; chunked prefill; limits on sequences and KV pages), ``protocol`` (OpenAI request
and response bodies), ``app`` (the Starlette application), ``metrics`` (Prometheus text),
``server`` (``serve`` and ``BackgroundServer`` on uvicorn). docs/serve.md tells the whole story.
Importing this package imports neither starlette nor uvicorn.
"""

"""Running the API: ``serve`` (what ``tilework serve`` calls) and ``BackgroundServer`` (a server
on a loopback port in a thread, for tests, benchmarks and notebooks).

    with BackgroundServer(LLM()) as server:       # a free port on 127.0.0.1
        client = openai.OpenAI(base_url=server.url, api_key="none")
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Any, Callable

from tilework.errors import TileworkError
from tilework.serve.app import create_app
from tilework.serve.scheduler import Scheduler

__all__ = ["serve", "BackgroundServer", "listen", "model_name"]


def _uvicorn() -> Any:
    try:
        import uvicorn
    except ImportError:
        raise TileworkError("the server needs uvicorn and starlette: pip install 'tilework[serve]'") from None
    return uvicorn


def model_name(path: str) -> str:
    """The id the API gives a model file: its file name without the extension."""
    base = os.path.basename(os.path.normpath(path))
    return base[: -len(".gguf")] if base.endswith(".gguf") else base


def _build(llm: Any, name: str | None, default_max_tokens: int, **limits: Any) -> tuple[Scheduler, Any, str]:
    if name is not None and not name.strip():
        raise TileworkError(f"the model's name must not be empty, got {name!r} (None: the file's name)")
    scheduler = Scheduler(llm, **limits)
    name = name or model_name(llm.path)
    return scheduler, create_app(scheduler, name, default_max_tokens=default_max_tokens), name


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (0: a free port), for ``serve`` and
    ``BackgroundServer``: binding first tells a taken port or a wrong address at once (``tilework
    serve`` binds before it loads the model), as a ``TileworkError`` naming the address."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise TileworkError(f"port must be an int in 0..65535, got {port!r}")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except (OSError, UnicodeError) as e:
        raise TileworkError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise TileworkError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def serve(llm: Any, host: str = "127.0.0.1", port: int = 8000, *, name: str | None = None, default_max_tokens: int = 256,
          log_level: str = "info", say: Callable[[str], None] | None = None, sock: socket.socket | None = None, **limits: Any) -> None:
    """Serve ``llm`` until interrupted (Ctrl-C) on ``sock`` (else on ``listen(host, port)``);
    ``limits`` go to ``Scheduler``."""
    uvicorn = _uvicorn()
    sock = sock if sock is not None else listen(host, port)
    host, port = sock.getsockname()[:2]
    scheduler, app, name = _build(llm, name, default_max_tokens, **limits)
    scheduler.start()
    (say or (lambda m: print(m, file=sys.stderr, flush=True)))(
        f"serving {name} at http://{host}:{port}/v1 (up to {scheduler.max_seqs} sequences, {scheduler.max_pages} KV pages of {llm.cache.page} tokens)")
    try:
        uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5)).run(sockets=[sock])
    finally:
        scheduler.stop()
        sock.close()


class BackgroundServer:
    """The API on ``host`` at a free port (or ``port``), run by uvicorn in a daemon thread."""

    def __init__(self, llm: Any, host: str = "127.0.0.1", port: int = 0, *, name: str | None = None,
                 default_max_tokens: int = 256, **limits: Any) -> None:
        uvicorn = _uvicorn()
        self.scheduler, app, self.name = _build(llm, name, default_max_tokens, **limits)
        self._socket = listen(host, port)
        self.host, self.port = host, self._socket.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]}, name="tilework-http", daemon=True)

    @property
    def url(self) -> str:
        """The API's base URL (``.../v1``), what OpenAI clients take as ``base_url``."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 30) -> "BackgroundServer":
        self.scheduler.start()
        self._thread.start()
        ready = threading.Event()
        while not self.server.started and self._thread.is_alive() and not ready.wait(0.02):
            timeout -= 0.02
            if timeout <= 0:
                raise TileworkError(f"the server did not start on {self.host}:{self.port}")
        if not self.server.started:
            raise TileworkError(f"the server failed to start on {self.host}:{self.port}")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)
        self.scheduler.stop()
        self._socket.close()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""``tilework serve`` from the command line: its refusals (in process), and as a user runs it
(a subprocess on a free port, answering like ``tilework generate``; behind TILEWORK_LONG_TESTS=1)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.llm.models import needs_smollm2
from tilework.cli import main
from tests.long import long_only

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")
pytest.importorskip("uvicorn")



@pytest.mark.parametrize(
    "args, message",
    [
        (["serve", "/nonexistent/model.gguf"], "/nonexistent/model.gguf"),
        (["serve", "--max-seqs", "0"], "--max-seqs must be at least 1"),
        (["serve", "--kv-tokens", "0"], "--kv-tokens must be at least 1"),
        (["serve", "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["serve", "/nonexistent/model.gguf", "--name", ""], "--name must not be empty, got ''"),  # before the model loads
        (["serve", "/nonexistent/model.gguf", "--name", " "], "--name must not be empty, got ' '"),
        (["serve", "--port", "99999"], "--port must be in 0..65535, got 99999"),
        (["serve", "--port", "-1"], "--port must be in 0..65535, got -1"),
        (["serve", "--host", "no.such.host.invalid"], "cannot listen on no.such.host.invalid:8000"),
    ],
)
def test_serve_refuses_bad_arguments_with_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: ") and message in err and "Traceback" not in err


def test_serve_refuses_a_taken_port_before_loading_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    """The port is bound first: a taken one is an error at once, not after a model's first compile."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "/nonexistent/model.gguf", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert "/nonexistent/model.gguf" not in err  # the model was never opened


@needs_smollm2
@long_only("starts two CLI processes")
def test_tilework_serve_answers_like_tilework_generate() -> None:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    question = "What is the capital of Italy?"
    gen = subprocess.run([sys.executable, "-m", "tilework", "generate", question, "--temperature", "0", "--max-tokens", "12"],
                         capture_output=True, text=True, timeout=900, env=env)
    assert gen.returncode == 0, gen.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tilework", "serve", "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 900
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2).read()
                break
            except OSError:
                time.sleep(0.2)
        body = json.dumps({"messages": [{"role": "user", "content": question}], "max_tokens": 12, "temperature": 0}).encode()
        req = urllib.request.Request(f"{base}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        reply = json.loads(urllib.request.urlopen(req, timeout=300).read())
        assert reply["choices"][0]["message"]["content"] + "\n" == gen.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, 130) and "serving" in err and "Traceback" not in err  # 130: Ctrl-C, as uvicorn re-raises it

"""``tilework generate`` and ``tilework chat`` as a user runs them: the CLI in a subprocess on
the embedded SmolLM2 (quantized, greedy), the chat driven through stdin; and the errors (these
through ``tilework.cli.main`` in this process: the exit status and stderr are the same, without
a Python start-up each)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.llm.models import needs_smollm2 as needs_model

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")


def tilework(*args: str, stdin: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "tilework", *args], input=stdin, capture_output=True, text=True, timeout=timeout, env=env)


def tilework_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``python -m tilework ARGS`` in this process: the exit status and stderr."""
    from tilework.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's usage errors
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().err


@needs_model
def test_generate_streams_the_answer_to_stdout_and_the_statistics_to_stderr() -> None:
    from tilework.llm import LLM, SamplingParams

    r = tilework("generate", "What is the capital of Italy?", "--temperature", "0", "--max-tokens", "12")
    assert r.returncode == 0, r.stderr
    want = LLM().generate("What is the capital of Italy?", SamplingParams(temperature=0, max_tokens=12))[0].text
    assert r.stdout == want + "\n"  # the text and nothing else (greedy: the API's text)
    assert "prefill" in r.stderr and "tok/s" in r.stderr


@needs_model
def test_raw_prompt_and_stop_string() -> None:
    """(On the Python VM: --runtime vm; the other tests run the default native code.)"""
    r = tilework("generate", "1, 2, 3, 4,", "--raw", "--temperature", "0", "--max-tokens", "16", "--stop", "7", "--runtime", "vm")
    assert r.returncode == 0, r.stderr
    text = r.stdout.rstrip("\n")
    assert "5" in text and "7" not in text  # it counts on and stops before the stop string


@needs_model
def test_chat_answers_each_line_of_stdin_until_exit() -> None:
    """Three turns, a /reset between the second and third, /exit before the last line; that the
    history stays in the KV cache is checked token for token in test_engine.py. (Replies of up
    to 8 tokens: their length is not what this is about.)"""
    script = "What is the capital of Italy?\nAnd of Spain?\n/reset\nName a color.\n/exit\nnever read\n"
    r = tilework("chat", "--temperature", "0", "--max-tokens", "8", stdin=script)
    assert r.returncode == 0, r.stderr
    assert len([line for line in r.stdout.split("\n") if line.strip()]) >= 3, r.stdout
    assert "(history cleared)" in r.stderr
    assert sum(line.startswith("prefill ") for line in r.stderr.splitlines()) == 3  # one statistics line per reply, none after /exit


@needs_model
def test_chat_goes_on_after_a_message_that_fails() -> None:
    """A message past the context, and one with bytes that are not UTF-8, are refused with
    an error line each; the session keeps reading and the next message is answered (the
    failed ones are not in the history)."""
    script = ("word " * 8300 + "\n").encode() + b"caf\xe9 au lait\nName a color.\n/exit\n"
    env = dict(os.environ, PYTHONIOENCODING="utf-8")  # strict: the chat decodes stdin with surrogateescape itself
    r = subprocess.run([sys.executable, "-m", "tilework", "chat", "--temperature", "0", "--max-tokens", "8"], input=script, capture_output=True, timeout=900, env=env)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "error: the prompt needs" in err and "/reset starts over" in err and "Traceback" not in err
    assert "error: the message is not valid Unicode: character 3 is a lone surrogate U+DCE9 (the byte 0xE9, which is not UTF-8)" in err
    assert sum(line.startswith("prefill ") for line in err.splitlines()) == 1 and r.stdout.strip()


@needs_model
def test_chat_commands_in_any_case_and_unknown_ones_list_the_commands(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """/help and an unknown /command were sent to the model as messages; /EXIT was too."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("/help\n/bogus\n/Reset\nName a color.\n/EXIT\nnever read\n"))
    code, err = tilework_here(capsys, "chat", "--temperature", "0", "--max-tokens", "4")
    assert code == 0, err
    assert err.count("commands: /reset starts over") == 2 and "unknown command /bogus; commands:" in err
    assert "(history cleared)" in err and sum(line.startswith("prefill ") for line in err.splitlines()) == 1


@needs_model
def test_a_prompt_that_is_not_utf8_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Python decodes argv with surrogateescape: the byte 0xE9 arrives as U+DCE9."""
    code, err = tilework_here(capsys, "generate", b"caf\xe9".decode("utf-8", "surrogateescape"), "--max-tokens", "2")
    assert code == 2 and "error: the prompt is not valid Unicode: character 3 is a lone surrogate U+DCE9 (the byte 0xE9, which is not UTF-8)" in err, err


@needs_model
def test_perplexity_of_a_file_and_of_stdin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``tilework perplexity``: the value ``LLM.perplexity`` gives the file's text, on stdout."""
    from tilework.llm import LLM

    text = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid.\n"
    (tmp_path / "t.txt").write_text(text)
    llm = LLM()
    want = llm.perplexity(llm.encode(text), 16)[0]
    code, err = tilework_here(capsys, "perplexity", str(tmp_path / "t.txt"), "--context", "16")
    assert code == 0, err
    assert "windows of 16 tokens" in err
    r = tilework("perplexity", "-", "--context", "16", stdin=text)
    assert r.returncode == 0 and r.stdout == f"perplexity {want:.4f}\n", r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "hi", "--model", "/nonexistent/model.gguf"], "/nonexistent/model.gguf: no such file"),
        (["generate", "hi", "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["generate", "hi", "--temperature", "-1"], "temperature"),
        (["perplexity", "/nonexistent/text.txt"], "cannot read /nonexistent/text.txt: No such file or directory"),
        (["perplexity", "-", "--context", "1"], "--context must be at least 2, got 1"),
        (["generate", "hi", "--json-schema", "/nonexistent/schema.json"], "cannot read /nonexistent/schema.json: No such file or directory"),
        (["generate", "hi", "--regex", "[0-9"], "the regex does not compile"),
        (["generate", "hi", "--json", "--regex", "a"], "not allowed with argument"),
        (["generate", "hi", "--logit-bias", "5"], "--logit-bias takes ID=BIAS (a token id and a number), got '5'"),
    ],
)
def test_errors_name_the_problem(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = tilework_here(capsys, *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


@needs_model
def test_generate_json_that_fits_a_schema_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--json-schema FILE``: structured output from the command line (stdout parses)."""
    pytest.importorskip("llguidance")
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"], "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    from tilework.cli import main

    capsys.readouterr()
    code = main(["generate", "Name a color as JSON.", "--json-schema", str(tmp_path / "s.json"), "--max-tokens", "32", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["color"] in ("red", "green", "blue"), out


def test_not_a_model_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"this is not a model")
    code, err = tilework_here(capsys, "generate", "hi", "--model", str(bad))
    assert code == 2
    assert "not a GGUF file" in err and "Traceback" not in err

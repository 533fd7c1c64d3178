"""Fixtures of the codegen tests: a private kernel cache, and a C compiler that logs its calls."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tilework.codegen.c import team, toolchain


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty kernel cache of the test's own."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TILEWORK_CACHE_DIR", str(d))
    return d


@pytest.fixture
def cc_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """CC set to a wrapper that logs each invocation's arguments (a line each), then runs the
    real compiler. The team library that the first kernel library loaded builds
    (``tilework.codegen.c.team``) is built before, with the real compiler: not logged."""
    team.install()
    real = toolchain.compiler_command()[0]
    log = tmp_path / "cc.log"
    wrapper = tmp_path / "cc-wrapper"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", str(wrapper))
    return log

"""The OpenMP team held for a call after a pause (tilework.runtime.team, tilework.codegen.c.team)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from tilework.runtime import team


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A C side that records what it is asked."""
    log: list[str] = []
    monkeypatch.setattr(team, "_hold", lambda: log.append("hold") or 1)
    monkeypatch.setattr(team, "_release", lambda: log.append("release"))
    monkeypatch.setattr(team, "_last", 0.0)
    return log


def test_a_call_after_a_pause_holds_the_team_and_gives_it_back(fake: list[str]) -> None:
    held = team.enter()  # the first call: long after _last
    assert held and fake == ["hold"]
    team.leave(held)
    assert fake == ["hold", "release"]


def test_back_to_back_calls_hold_nothing(fake: list[str]) -> None:
    team.leave(team.enter())
    fake.clear()
    for _ in range(5):
        held = team.enter()
        assert not held
        team.leave(held)
    assert fake == []
    time.sleep(2 * team.IDLE_S)
    held = team.enter()
    team.leave(held)
    assert held and fake == ["hold", "release"]


def test_a_call_inside_a_call_or_beside_another_holds_nothing(fake: list[str]) -> None:
    outer = team.enter()
    inner = team.enter()  # a nested call, or another thread's while the first runs
    assert outer and not inner
    team.leave(inner)
    team.leave(outer)
    assert fake == ["hold", "release"] and not team._holding.locked()


def test_a_team_the_c_side_cannot_hold_is_not_released(monkeypatch: pytest.MonkeyPatch, fake: list[str]) -> None:
    monkeypatch.setattr(team, "_hold", lambda: fake.append("hold") or 0)
    held = team.enter()
    team.leave(held)
    assert not held and fake == ["hold"]


def test_without_a_c_side_calls_run_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(team, "_hold", None)
    monkeypatch.setattr(team, "_last", 0.0)
    assert team.enter() is False
    team.leave(False)


def test_the_user_can_turn_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(team, "_hold", None)
    monkeypatch.setattr(team, "_release", None)
    monkeypatch.setenv("TILEWORK_HOLD_TEAM", "0")
    team.install(lambda: 1, lambda: None)
    assert team._hold is None


@pytest.mark.parametrize(
    "env, binds",
    [
        ({}, False),
        ({"OMP_PROC_BIND": "false"}, False),
        ({"OMP_PROC_BIND": "FALSE", "OMP_PLACES": "cores"}, False),
        ({"OMP_PROC_BIND": "close"}, True),
        ({"OMP_PROC_BIND": "spread,close"}, True),
        ({"OMP_PROC_BIND": "true"}, True),
        ({"OMP_PLACES": "cores"}, True),
        ({"GOMP_CPU_AFFINITY": "0-1"}, True),
        ({"OMP_PLACES": " "}, False),
    ],
)
def test_threads_the_user_binds_are_left_where_they_are(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], binds: bool) -> None:
    for k in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "TILEWORK_HOLD_TEAM"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(team, "_hold", None)
    monkeypatch.setattr(team, "_release", None)
    assert team.user_binds() is binds and team.enabled() is not binds
    team.install(lambda: 1, lambda: None)
    assert (team._hold is None) is binds


def test_a_failed_call_gives_the_team_back(fake: list[str]) -> None:
    with pytest.raises(ZeroDivisionError):
        held = team.enter()
        try:
            1 / 0
        finally:
            team.leave(held)
    assert fake == ["hold", "release"]


SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import tilework as tw
    from tilework import op
    from tilework.ir.builder import BlockBuilder
    from tilework.ir.graph import Var
    from tilework.ir.info import TensorInfo
    from tilework.codegen.c import team as c_team
    from tilework.runtime import team

    n = tw.dim("n")
    x = Var("x", TensorInfo((n, 4096), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit_output(op.exp(x))
        bb.emit_func_output(r)
    vm = tw.VM(tw.build(bb.get()))
    assert c_team.install(), "the team library did not build"
    a = np.linspace(-3, 3, 64 * 4096, dtype=np.float32).reshape(64, 4096)
    before = os.sched_getaffinity(0)
    seen = []
    hold = team._hold
    def spy():
        got = hold()
        seen.append((got, os.sched_getaffinity(0)))
        return got
    team._hold = spy
    for _ in range(3):
        time.sleep(0.05)
        np.testing.assert_allclose(vm["main"](a), np.exp(a), rtol=1e-6)
        assert os.sched_getaffinity(0) == before, "the caller's mask was not given back"
    # the first call records the team (nothing held), the later ones hold the caller on one CPU
    assert seen[0][0] == 0, seen
    assert all(got == 1 and len(mask) == 1 and mask <= before for got, mask in seen[1:]), seen
    print("ok")
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2, reason="needs Linux and two CPUs")
def test_the_c_side_holds_the_caller_on_one_cpu_and_gives_its_mask_back() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")}  # (threads the user binds are not held)
    env.update(OMP_NUM_THREADS="2", TILEWORK_HOLD_TEAM="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
